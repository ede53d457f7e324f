//! The circuit breaker on in-memory ports: it opens after the threshold, holds what comes
//! (not attempted, not counted), probes once per interval, closes on a success and releases
//! what it held; held to its retry schedule's end, a delivery makes its last attempt then.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::Duration;
use hookwise_core::circuit::{CircuitBreaker, CircuitState};
use hookwise_core::model::*;
use hookwise_core::policy::{Jitter, RetryPolicy};
use hookwise_core::ports::{Clock, DeliveryQuery, SchedulerTable, Store};
use hookwise_core::services::{NewEvent, NewSubscription};
use hookwise_core::testing::memory::{status_outcome, Harness, ScriptedSender};

/// An endpoint that answers 503 until `up` is set, then 200.
fn switchable() -> (ScriptedSender, Arc<AtomicBool>) {
    let up = Arc::new(AtomicBool::new(false));
    let flag = up.clone();
    let sender = ScriptedSender::new(move |_, _| status_outcome(if flag.load(Ordering::SeqCst) { 200 } else { 503 }));
    (sender, up)
}

fn subscription(schedule: Vec<u64>, rate_limit: Option<u32>, breaker: CircuitBreaker) -> NewSubscription {
    NewSubscription {
        url: EndpointUrl::parse("https://hooks.example.com/in").unwrap(),
        event_types: vec![EventTypeFilter::all()],
        owner_email: None,
        retry_policy: Some(RetryPolicy::custom(schedule, Jitter::None, false).unwrap()),
        timeout_ms: None,
        rate_limit_per_second: rate_limit,
        auto_disable_after_hours: None,
        circuit_breaker: Some(breaker),
        description: None,
    }
}

fn event() -> NewEvent {
    serde_json::from_value(serde_json::json!({"type": "order.paid", "payload": {"n": 1}})).unwrap()
}

async fn deliveries(h: &Harness, tenant: &Tenant) -> Vec<Delivery> {
    let query = DeliveryQuery {
        limit: 100,
        ..Default::default()
    };
    h.store.list_deliveries(&tenant.id, &query).await.unwrap().items
}

#[tokio::test]
async fn given_a_failing_endpoint_then_the_breaker_holds_its_attempts_probes_once_per_interval_and_releases_them_on_a_success(
) {
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(&tenant, subscription(vec![10; 20], None, CircuitBreaker::on()))
        .await
        .unwrap()
        .subscription;
    for _ in 0..40 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    h.drain_now().await;
    // Five failed attempts open it; the other 35 first attempts are held, unattempted.
    assert_eq!(h.sender.requests.lock().unwrap().len(), 5);
    let overview = h.services.subscription_overview(&tenant, &sub.id).await.unwrap();
    assert_eq!(overview.circuit.state, CircuitState::Open);
    let opened = overview.circuit.since;
    assert_eq!(overview.circuit.next_probe_at, Some(opened + Duration::seconds(30)));
    let all = deliveries(&h, &tenant).await;
    assert_eq!(
        all.iter().map(|d| d.attempts).sum::<u32>(),
        5,
        "held attempts are not counted"
    );

    // Two minutes down: one probe per 30 s, nothing else.
    h.run_for(Duration::seconds(120), Duration::seconds(1)).await;
    let made = h.sender.requests.lock().unwrap().len();
    assert_eq!(made, 5 + 4, "one probe each 30 s");

    // Up again: the next probe closes it, and everything held is delivered.
    up.store(true, Ordering::SeqCst);
    h.run_for(Duration::seconds(40), Duration::seconds(1)).await;
    let all = deliveries(&h, &tenant).await;
    assert!(
        all.iter().all(|d| d.status == DeliveryStatus::Delivered),
        "{:?}",
        all.iter().map(|d| d.status).collect::<Vec<_>>()
    );
    let overview = h.services.subscription_overview(&tenant, &sub.id).await.unwrap();
    assert_eq!(overview.circuit.state, CircuitState::Closed);
    assert!(
        h.scheduler.held(&sub.id, 100).await.unwrap().is_empty(),
        "nothing left parked"
    );
    // Every delivery POSTed once when up (the 40, not one twice).
    let after: usize = h.sender.requests.lock().unwrap().len() - made;
    assert_eq!(after, 40);
}

#[tokio::test]
async fn given_an_open_breaker_then_what_it_released_goes_out_on_a_ramp_without_a_rate_limit() {
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    let (tenant, _) = h.tenant("owner@example.com").await;
    let breaker = CircuitBreaker {
        failure_threshold: 1,
        ..CircuitBreaker::on()
    };
    h.services
        .create_subscription(&tenant, subscription(vec![600; 5], None, breaker))
        .await
        .unwrap();
    for _ in 0..100 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    h.drain_now().await;
    up.store(true, Ordering::SeqCst);
    h.queue.log.lock().unwrap().clear();
    h.run_for(Duration::seconds(31), Duration::seconds(1)).await;
    let log = h.queue.log.lock().unwrap().clone();
    let released: Vec<u32> = log
        .iter()
        .filter(|(t, _)| t.held_until.is_some())
        .map(|(_, d)| *d)
        .collect();
    assert!(released.len() >= 98, "{} released", released.len());
    let in_second = |s: u32| released.iter().filter(|d| **d == s).count();
    assert_eq!((in_second(0), in_second(1), in_second(2)), (10, 20, 40));
}

#[tokio::test]
async fn given_a_breaker_open_past_the_retry_schedule_then_its_held_deliveries_make_a_last_attempt_then_and_die_with_one_notice(
) {
    let h = Harness::new(ScriptedSender::always(503));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let breaker = CircuitBreaker {
        failure_threshold: 2,
        probe_interval_seconds: 60,
        ..CircuitBreaker::on()
    };
    h.services
        .create_subscription(&tenant, subscription(vec![30, 60, 120], None, breaker))
        .await
        .unwrap();
    for _ in 0..10 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    // The schedule spans 210 s; without the breaker they would all be dead by then, after 40
    // POSTs. Held, each makes its last attempt at its schedule's end (or, a probe, at its
    // next retry after it), and dies then: no sooner.
    let start = h.clock.now();
    h.run_for(Duration::seconds(400), Duration::seconds(1)).await;
    let all = deliveries(&h, &tenant).await;
    assert!(all.iter().all(|d| d.status == DeliveryStatus::Dead), "{all:?}");
    for d in &all {
        assert!(d.updated_at >= start + Duration::seconds(210), "died early: {d:?}");
        assert!(d.updated_at <= start + Duration::seconds(210 + 120), "died late: {d:?}");
        assert!((1..=4).contains(&d.attempts), "{d:?}");
    }
    let held_to_the_end = all.iter().filter(|d| d.attempts < 4).count();
    assert!(
        held_to_the_end >= 5,
        "{held_to_the_end} held until their schedule's end"
    );
    let posts = h.sender.requests.lock().unwrap().len();
    assert!(posts < 30, "{posts} POSTs");
    h.run_for(Duration::minutes(20), Duration::minutes(1)).await;
    let mails = h.mailer.sent.lock().unwrap().clone();
    assert_eq!(mails.len(), 1, "one digest for the owner: {mails:?}");
}

/// 20 events to an endpoint always answering `status`, on two attempts 10 s apart, with
/// `breaker`: every attempt is made (40 POSTs in 15 s) and the breaker stays closed.
async fn assert_every_attempt_made(status: u16, breaker: CircuitBreaker) {
    let h = Harness::new(ScriptedSender::always(status));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(&tenant, subscription(vec![10], None, breaker))
        .await
        .unwrap()
        .subscription;
    for _ in 0..20 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    h.run_for(Duration::seconds(15), Duration::seconds(1)).await;
    assert_eq!(h.sender.requests.lock().unwrap().len(), 40);
    let overview = h.services.subscription_overview(&tenant, &sub.id).await.unwrap();
    assert_eq!(overview.circuit.state, CircuitState::Closed);
}

#[tokio::test]
async fn given_the_breaker_off_then_every_attempt_is_made() {
    assert_every_attempt_made(503, CircuitBreaker::off()).await;
}

#[tokio::test]
async fn given_a_bad_breaker_setting_then_the_subscription_is_refused_with_its_code() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    for breaker in [
        CircuitBreaker {
            failure_threshold: 0,
            ..CircuitBreaker::on()
        },
        CircuitBreaker {
            probe_interval_seconds: 0,
            ..CircuitBreaker::on()
        },
    ] {
        let err = h
            .services
            .create_subscription(&tenant, subscription(vec![10], None, breaker))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("circuit_breaker"), "{err}");
    }
}

#[tokio::test]
async fn given_an_endpoint_answering_429_then_its_breaker_stays_closed() {
    // Up and pacing its callers: every attempt of the schedule is made, none held.
    assert_every_attempt_made(429, CircuitBreaker::on()).await;
}
