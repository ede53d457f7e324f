//! How fast the embedded backend moves events through the store and queue calls one
//! delivery makes (no HTTP): `cargo run --release -p hookwise-local --example throughput [N] [DIR] [WORKERS]`
//! (`IN_MEMORY=1` for an in-memory database)..

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use hookwise_core::health::HealthSample;
use hookwise_core::model::*;
use hookwise_core::policy::RetryPolicy;
use hookwise_core::ports::*;
use hookwise_local::LocalBackend;
use rand::rngs::StdRng;
use rand::SeedableRng;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let dir = std::env::args()
        .nth(2)
        .filter(|d| !d.is_empty() && d != "-")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("hookwise-throughput-{}", std::process::id())));
    let backend = if std::env::var_os("IN_MEMORY").is_some() {
        LocalBackend::open_in_memory().expect("open")
    } else {
        LocalBackend::open(&dir).expect("open")
    };
    let mut rng = StdRng::from_os_rng();
    let now = Utc::now();
    let tenant = Tenant {
        id: TenantId::generate(now, &mut rng),
        name: "bench".into(),
        owner_email: Email::parse("bench@example.com").unwrap(),
        retries: RetriesSetting::On,
        status: TenantStatus::Active,
        created_at: now,
        api_keys: Vec::new(),
        version: 0,
        portal_sessions_since: None,
    };
    backend.create_tenant(&tenant).await.unwrap();
    let sub = Subscription {
        id: SubscriptionId::generate(now, &mut rng),
        tenant_id: tenant.id.clone(),
        url: EndpointUrl::parse("http://127.0.0.1:9/").unwrap(),
        event_types: vec![EventTypeFilter::all()],
        secret: SealedSecret::unsealed(&Secret::generate(&mut rng)),
        previous_secret: None,
        previous_secret_expires_at: None,
        retry_policy: RetryPolicy::standard(),
        timeout_ms: DEFAULT_TIMEOUT_MS,
        status: SubscriptionStatus::Active,
        rate_limit_per_second: None,
        auto_disable_after_hours: None,
        circuit_breaker: Default::default(),
        active_since: None,
        disable_notice_pending: false,
        disable_notice_claimed_at: None,
        disabled_reason: None,
        owner_email: None,
        description: None,
        filter: None,
        headers: Vec::new(),
        created_at: now,
        updated_at: now,
    };
    backend.create_subscription(&sub).await.unwrap();

    let began = Instant::now();
    // Ingest: event + delivery in one transaction, then one queue message each, 32 at once.
    let ingest = ingest(&backend, &tenant, &sub, n, 32).await;
    // Workers: each receives batches of 10, then does per message what a delivery does.
    let workers: usize = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(4);
    let done = Arc::new(AtomicUsize::new(0));
    let mut loops = Vec::new();
    for _ in 0..workers {
        let (backend, done) = (backend.clone(), done.clone());
        let (tenant_id, sub_id) = (tenant.id.clone(), sub.id.clone());
        loops.push(tokio::spawn(async move {
            while done.load(Ordering::Relaxed) < n {
                let batch = backend.receive(10, Duration::from_secs(60)).await.unwrap();
                if batch.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let handles: Vec<_> = batch
                    .into_iter()
                    .map(|msg| tokio::spawn(deliver(backend.clone(), msg, tenant_id.clone(), sub_id.clone())))
                    .collect();
                for h in handles {
                    h.await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for l in loops {
        l.await.unwrap();
    }
    let total = began.elapsed();
    println!(
        "{n} events: ingest {:.0}/s, end to end {:.0} deliveries/s ({:.2} s)",
        n as f64 / ingest.as_secs_f64(),
        n as f64 / total.as_secs_f64(),
        total.as_secs_f64()
    );
    drop(backend);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn deliver(b: LocalBackend, msg: hookwise_local::Received, tenant_id: TenantId, sub_id: SubscriptionId) {
    let d = b.get_delivery(&msg.task.delivery_id).await.unwrap().unwrap();
    b.get_subscription(&tenant_id, &sub_id).await.unwrap().unwrap();
    let mut health = b.endpoint_health(&sub_id).await.unwrap();
    let at = Utc::now();
    let attempt = Attempt {
        delivery_id: d.id.clone(),
        round: 0,
        attempt: 1,
        started_at: at,
        duration_ms: 1,
        status_code: Some(200),
        error: None,
        response_excerpt: Some(String::new()),
        next_attempt_at: None,
    };
    let next = Delivery {
        status: DeliveryStatus::Delivered,
        attempts: 1,
        next_attempt_at: None,
        updated_at: at,
        ..d.clone()
    };
    b.apply_change(&DeliveryChange {
        expected: Expected::of(&d),
        next,
        attempt: Some(attempt),
    })
    .await
    .unwrap();
    // Saved over the version read, as `Services` saves it: another worker's save in between
    // makes it read and merge again.
    let sample = HealthSample { at, success: true };
    loop {
        health.merge(&[sample]);
        match b.save_endpoint_health(&sub_id, &health).await {
            Ok(()) => break,
            Err(hookwise_core::PortError::ConditionFailed(_)) => {
                health = b.endpoint_health(&sub_id).await.unwrap();
            }
            Err(e) => panic!("save endpoint health: {e}"),
        }
    }
    b.ack(&msg.receipt).await.unwrap();
}

async fn ingest(backend: &LocalBackend, tenant: &Tenant, sub: &Subscription, n: usize, concurrency: usize) -> Duration {
    let began = Instant::now();
    let per = n.div_ceil(concurrency);
    let mut handles = Vec::new();
    for c in 0..concurrency {
        let (b, tenant, sub) = (backend.clone(), tenant.clone(), sub.clone());
        handles.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(c as u64);
            for _ in 0..per.min(n.saturating_sub(c * per)) {
                let now = Utc::now();
                let event = Event {
                    id: EventId::generate(now, &mut rng),
                    tenant_id: tenant.id.clone(),
                    event_type: EventType::parse("bench.tick").unwrap(),
                    payload: serde_json::json!({"n": 1}),
                    created_at: now,
                    idempotency_key: None,
                    test: false,
                };
                let d = Delivery {
                    id: DeliveryId::generate(now, &mut rng),
                    tenant_id: tenant.id.clone(),
                    event_id: event.id.clone(),
                    subscription_id: sub.id.clone(),
                    event_type: event.event_type.clone(),
                    status: DeliveryStatus::Pending,
                    round: 0,
                    attempts: 0,
                    next_attempt_at: Some(now),
                    not_before: None,
                    last_delay_seconds: None,
                    held_until: None,
                    last_status_code: None,
                    last_error: None,
                    test: false,
                    created_at: now,
                    updated_at: now,
                };
                b.create_event(&event, std::slice::from_ref(&d)).await.unwrap();
                b.enqueue(&[(
                    DeliveryTask {
                        delivery_id: d.id,
                        round: 0,
                        attempt: 1,
                        queued_at: None,
                        slot: None,
                        tenant_id: None,
                        held_until: None,
                        redrives: 0,
                    },
                    0,
                )])
                .await
                .unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    began.elapsed()
}
