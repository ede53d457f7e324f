//! Seeds a `hookwise dev` data dir with a stored history: N deliveries, spread evenly over
//! the last DAYS days (30: the retention default), as `hookwise dev` would have stored them,
//! for the growth bench (`tests/benches/growth.rs`, `scripts/bench-growth.sh`).
//!
//! It writes only through the embedded backend's own write path, never its SQL: the tenant
//! and its key as `hookwise dev` makes them (the key in `<data-dir>/dev-api-key`, so `hookwise
//! dev --data-dir DIR` serves that tenant) and two subscriptions through `Services` (secrets
//! sealed under the data dir's key); then the events and their deliveries through
//! `StoreWithQueue::create_events_queued` (a few thousand events per call, with no message:
//! they were all handled long ago), and each delivery's attempts through `Store::apply_change`
//! with the changes the state machine builds (`state::decide`, `state::after_attempt`), many
//! calls at once so the database thread commits them in large transactions.
//!
//! The history: subscription A (all event types, the one the bench sends to) and B
//! (`invoice.paid` only); one event in five is an `invoice.paid`, delivered to both, the rest
//! to A alone (so A holds 5/6 of the deliveries). Half of the events carry an idempotency key.
//! Payloads are order-like JSON of about 0.5 to 1 KB. Of the deliveries, about 97 % succeed at
//! once, 2.5 % after one to three failed attempts on the standard schedule, and 0.5 % (of
//! those older than the schedule's span) die after its eight attempts.
//!
//! The store runs with `synchronous=NORMAL` while seeding (the file is a fixture, built once
//! and copied for each run); the last connection's close checkpoints the WAL into the file.
//!
//! Usage: seed_history DATA_DIR DELIVERIES [DAYS]. DATA_DIR must not hold a database yet. It
//! prints, and writes to `DATA_DIR/seed-info.json`, what it stored and how long it took.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use chrono::{DateTime, Duration, Utc};
use hookwise_core::model::{Delivery, DeliveryId, DeliveryStatus, Email, Event, EventId, EventType, Subscription};
use hookwise_core::ports::{
    Clock, Created, DeliveryChange, EventWrite, NoSender, SendErrorKind, SendOutcome, Store, StoreWithQueue,
};
use hookwise_core::services::{Config, NewSubscription, NewTenant, Services};
use hookwise_core::state::{after_attempt, decide, AttemptContext, Decision};
use hookwise_local::{LocalBackend, LocalConfig, Synchronous, DB_FILE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::task::JoinSet;

/// Where `hookwise dev` keeps its default tenant's key (`functions/cli/src/dev.rs`).
const DEV_KEY_FILE: &str = "dev-api-key";
/// The seed's own record, beside the database.
const INFO_FILE: &str = "seed-info.json";
/// Events per `create_events_queued` call (one transaction).
const CHUNK: usize = 2_000;
/// The deliveries' types other than `invoice.paid`, in turn.
const TYPES: [&str; 4] = ["order.created", "order.paid", "order.shipped", "customer.updated"];

/// The time the services see while the tenant and subscriptions are made: before the history.
struct FixedClock(DateTime<Utc>);

#[async_trait::async_trait]
impl Clock for FixedClock {
    fn now(&self) -> DateTime<Utc> {
        self.0
    }

    async fn sleep_until(&self, _at: DateTime<Utc>) {}
}

/// What a delivery's endpoint does with its attempts.
#[derive(Clone, Copy)]
enum Fate {
    /// 2xx at once.
    Delivered,
    /// Fails this many times, then 2xx.
    Retried(u32),
    /// Fails until its schedule runs out.
    Dead,
}

#[derive(Default)]
struct Totals {
    events: u64,
    deliveries: u64,
    attempts: u64,
    retried: u64,
    dead: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: seed_history DATA_DIR DELIVERIES [DAYS]";
    let dir = PathBuf::from(args.get(1).context(usage)?);
    let wanted: u64 = args.get(2).context(usage)?.parse().context(usage)?;
    let days: i64 = args.get(3).map_or(Ok(30), |d| d.parse()).context(usage)?;
    if dir.join(DB_FILE).exists() {
        bail!("{} already holds a database", dir.display());
    }
    let started = Instant::now();
    let now = Utc::now();
    // The history ends a minute ago: nothing in it is due, or awaiting its first attempt.
    let (from, to) = (now - Duration::days(days), now - Duration::minutes(1));
    let backend = LocalBackend::open_with(
        &dir,
        LocalConfig {
            synchronous: Synchronous::Normal,
            ..LocalConfig::default()
        },
    )?;
    let mut rng = StdRng::seed_from_u64(34);
    let services = Services::new(
        backend.ports(Arc::new(NoSender), Arc::new(FixedClock(from - Duration::hours(1)))),
        Config::default(),
        StdRng::seed_from_u64(35),
    );
    let key = hookwise_core::auth::generate_api_key(&mut rng);
    let owner = Email::parse("owner@example.com").map_err(anyhow::Error::msg)?;
    let tenant = services
        .create_tenant_with_key(NewTenant::named("dev", owner), &key)
        .await
        .context("create the dev tenant")?;
    std::fs::write(dir.join(DEV_KEY_FILE), &key)?;
    let subscribe = |body: serde_json::Value| {
        let new: NewSubscription = serde_json::from_value(body).expect("a subscription");
        let (services, tenant) = (&services, &tenant);
        async move {
            services
                .create_subscription(tenant, new)
                .await
                .map(|s| s.subscription)
                .context("create a subscription")
        }
    };
    // Port 9 (discard): the bench points them at its receiver before it sends anything.
    let all = subscribe(json!({"url": "http://127.0.0.1:9/orders", "description": "every event"})).await?;
    let invoices = subscribe(json!({
        "url": "http://127.0.0.1:9/invoices", "event_types": ["invoice.paid"], "description": "invoices"
    }))
    .await?;

    // Five events make six deliveries (the fifth, an invoice, goes to both).
    let events = (wanted * 5).div_ceil(6);
    let span = (to - from).num_milliseconds().max(1);
    let at = |k: u64| from + Duration::milliseconds((span as f64 * k as f64 / events.max(1) as f64) as i64);
    let mut totals = Totals::default();
    let mut k = 0;
    while totals.deliveries < wanted {
        let mut batch: Vec<(Event, Vec<Delivery>)> = Vec::with_capacity(CHUNK);
        while batch.len() < CHUNK && totals.deliveries < wanted {
            let invoice = k % 5 == 4 && wanted - totals.deliveries >= 2;
            let event_type = if invoice {
                "invoice.paid"
            } else {
                TYPES[(k % 5) as usize % 4]
            };
            let event = event(&tenant.id, k, event_type, at(k), &mut rng)?;
            let subs: &[&Subscription] = if invoice { &[&all, &invoices] } else { &[&all] };
            let deliveries: Vec<Delivery> = subs
                .iter()
                .map(|s| Delivery::new(DeliveryId::for_event(&event.id, &s.id), &event, s.id.clone()))
                .collect();
            totals.deliveries += deliveries.len() as u64;
            totals.events += 1;
            batch.push((event, deliveries));
            k += 1;
        }
        let writes: Vec<EventWrite<'_>> = batch
            .iter()
            .map(|(event, deliveries)| EventWrite {
                event,
                deliveries,
                tasks: &[],
            })
            .collect();
        for result in backend.create_events_queued(&writes).await {
            if result.context("store an event")? != Created::New {
                bail!("an event was already stored");
            }
        }
        // Each delivery's attempts in order; the deliveries side by side, so the database
        // thread takes them many to a transaction.
        let mut attempts = JoinSet::new();
        for (_, deliveries) in &batch {
            for delivery in deliveries {
                let sub = if delivery.subscription_id == all.id {
                    &all
                } else {
                    &invoices
                };
                let fate = fate(delivery.created_at, now, &mut rng);
                let changes = history(delivery, sub, fate, &mut rng);
                totals.attempts += changes.len() as u64;
                match changes.last().map(|c| c.next.status) {
                    Some(DeliveryStatus::Dead) => totals.dead += 1,
                    _ if changes.len() > 1 => totals.retried += 1,
                    _ => {}
                }
                let backend = backend.clone();
                attempts.spawn(async move {
                    for change in &changes {
                        backend.apply_change(change).await?;
                    }
                    anyhow::Ok(())
                });
            }
        }
        while let Some(done) = attempts.join_next().await {
            done?.context("record an attempt")?;
        }
        if totals.events % (CHUNK as u64 * 50) < CHUNK as u64 {
            eprintln!(
                "{} deliveries, {:.0} s",
                totals.deliveries,
                started.elapsed().as_secs_f64()
            );
        }
    }
    drop(services);
    // The last clone: closing its connections checkpoints the WAL into the file.
    drop(backend);
    let seconds = started.elapsed().as_secs_f64();
    let info = json!({
        "deliveries": totals.deliveries,
        "events": totals.events,
        "attempts": totals.attempts,
        "retried": totals.retried,
        "dead": totals.dead,
        "days": days,
        "seconds": seconds,
        "db_bytes": db_bytes(&dir),
        "tenant": tenant.id,
        "subscription": all.id,
        "other_subscription": invoices.id,
    });
    std::fs::write(dir.join(INFO_FILE), serde_json::to_vec_pretty(&info)?)?;
    println!("{info}");
    Ok(())
}

/// The database file and its WAL, if any is left.
fn db_bytes(dir: &Path) -> u64 {
    ["", "-wal"]
        .iter()
        .filter_map(|suffix| std::fs::metadata(dir.join(format!("{DB_FILE}{suffix}"))).ok())
        .map(|m| m.len())
        .sum()
}

/// Event `k` of the history: an order-like payload; every other one keyed (its id then comes
/// from the key, as ingest makes it).
fn event(
    tenant: &hookwise_core::model::TenantId,
    k: u64,
    event_type: &str,
    created_at: DateTime<Utc>,
    rng: &mut StdRng,
) -> anyhow::Result<Event> {
    let idempotency_key = k.is_multiple_of(2).then(|| format!("{event_type}-{k}"));
    let id = match &idempotency_key {
        Some(key) => EventId::for_key(tenant, key),
        None => EventId::generate(created_at, rng),
    };
    let items: Vec<serde_json::Value> = (0..rng.random_range(1..=5))
        .map(|i| {
            json!({
                "sku": format!("SKU-{:06}", rng.random_range(0..1_000_000)),
                "name": format!("Item {i} of order {k}"),
                "quantity": rng.random_range(1..4),
                "unit_price": rng.random_range(100..20_000),
            })
        })
        .collect();
    let payload = json!({
        "order_id": format!("ord_{k:010}"),
        "customer": {
            "id": format!("cus_{:08}", rng.random_range(0..100_000_000)),
            "email": format!("customer{}@example.com", rng.random_range(0..1_000_000)),
            "name": "A. Customer",
        },
        "items": items,
        "currency": "EUR",
        "total": rng.random_range(100..100_000),
        "shipping": {"line1": "1 Example Street", "city": "Lyon", "postal_code": "69001", "country": "FR"},
        "metadata": {"channel": "web", "campaign": null},
    });
    Ok(Event {
        id,
        tenant_id: tenant.clone(),
        event_type: EventType::parse(event_type).map_err(anyhow::Error::msg)?,
        payload,
        created_at,
        idempotency_key,
        test: false,
    })
}

/// What happened to a delivery made at `created`: most succeed at once; a dead one needs its
/// whole schedule (the standard one's span is under four days) to be over by `now`.
fn fate(created: DateTime<Utc>, now: DateTime<Utc>, rng: &mut StdRng) -> Fate {
    let r: f64 = rng.random();
    if r < 0.97 {
        Fate::Delivered
    } else if r < 0.995 || created > now - Duration::days(5) {
        Fate::Retried(rng.random_range(1..=3))
    } else {
        Fate::Dead
    }
}

/// The changes a delivery went through: each attempt's outcome, and what the state machine
/// decided after it on the subscription's policy.
fn history(delivery: &Delivery, sub: &Subscription, fate: Fate, rng: &mut StdRng) -> Vec<DeliveryChange> {
    let mut current = delivery.clone();
    // Picked up a few milliseconds after its ingest.
    let mut at = delivery.created_at + Duration::milliseconds(rng.random_range(2..40));
    let mut changes = Vec::new();
    for attempt in 1.. {
        let fails = match fate {
            Fate::Delivered => false,
            Fate::Retried(n) => attempt <= n,
            Fate::Dead => true,
        };
        let outcome = outcome(fails, rng);
        let done = at + Duration::milliseconds(outcome.duration_ms as i64);
        let context = AttemptContext {
            attempt,
            previous_delay: current.last_delay_seconds,
            health: None,
            retries_enabled: true,
        };
        let decision = decide(&sub.retry_policy, &outcome, context, done, rng);
        let change = after_attempt(&current, attempt, at, &outcome, decision, done);
        current = change.next.clone();
        changes.push(change);
        match decision {
            Decision::Retry { at: next, .. } => at = next + Duration::milliseconds(rng.random_range(5..500)),
            Decision::Delivered | Decision::Dead => break,
        }
    }
    changes
}

/// A 200 with a small JSON answer, or a failure: a 503 with an HTML page, or a timeout.
fn outcome(fails: bool, rng: &mut StdRng) -> SendOutcome {
    if !fails {
        return SendOutcome {
            status_code: Some(200),
            error: None,
            response_excerpt: Some(r#"{"received":true}"#.into()),
            duration_ms: rng.random_range(20..400),
            retry_after: None,
        };
    }
    if rng.random_bool(0.7) {
        SendOutcome {
            status_code: Some(503),
            error: None,
            response_excerpt: Some(
                "<html><head><title>503 Service Temporarily Unavailable</title></head><body><h1>Service \
                 Temporarily Unavailable</h1><p>The server is down for maintenance.</p></body></html>"
                    .into(),
            ),
            duration_ms: rng.random_range(5..200),
            retry_after: None,
        }
    } else {
        SendOutcome {
            status_code: None,
            error: Some((SendErrorKind::Timeout, "no response within 10000 ms".into())),
            response_excerpt: None,
            duration_ms: 10_000,
            retry_after: None,
        }
    }
}
