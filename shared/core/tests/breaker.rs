//! The circuit breaker on in-memory ports: it opens after the threshold, holds what comes
//! (not attempted, not counted), probes once per interval, closes on a success and releases
//! what it held; held to its retry schedule's end, a delivery goes on with the rest of it then.
//!
//! Then the ways it and the rate limiter used to stop making progress, each staged (a lost
//! message, a failed write, an operator's change) and judged by what the endpoint received.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use chrono::Duration;
use hookwise_core::circuit::{Circuit, CircuitBreaker, CircuitState};
use hookwise_core::model::*;
use hookwise_core::policy::{Jitter, RetryPolicy};
use hookwise_core::ports::{Clock, DeliveryQuery, DeliveryTask, SchedulerTable, Store};
use hookwise_core::rate_limit::Arrival;
use hookwise_core::services::{DeliverOutcome, NewEvent, NewSubscription, SubscriptionPatch};
use hookwise_core::testing::memory::{
    run_until_waiting, status_outcome, Harness, MemoryQueue, MemoryStore, ScriptedSender,
};

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
        filter: None,
        headers: None,
    }
}

fn event() -> NewEvent {
    serde_json::from_value(serde_json::json!({"type": "order.paid", "payload": {"n": 1}})).unwrap()
}

async fn deliveries(h: &Harness, tenant: &Tenant) -> Vec<Delivery> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let query = DeliveryQuery {
            limit: 100,
            cursor,
            ..Default::default()
        };
        let page = h.store.list_deliveries(&tenant.id, &query).await.unwrap();
        all.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return all,
        }
    }
}

/// An endpoint that answers 503 until `up` is set, then 200; `on_first_up` runs as the
/// first 200 is answered (after the breaker's probe claim, before the attempt's record).
fn switchable_with(on_first_up: impl Fn() + Send + Sync + 'static) -> (ScriptedSender, Arc<AtomicBool>) {
    let up = Arc::new(AtomicBool::new(false));
    let flag = up.clone();
    let once = AtomicBool::new(false);
    let sender = ScriptedSender::new(move |_, _| {
        if !flag.load(Ordering::SeqCst) {
            return status_outcome(503);
        }
        if !once.swap(true, Ordering::SeqCst) {
            on_first_up();
        }
        status_outcome(200)
    });
    (sender, up)
}

fn patch(json: serde_json::Value) -> SubscriptionPatch {
    serde_json::from_value(json).unwrap()
}

fn statuses(all: &[Delivery]) -> HashMap<&'static str, usize> {
    let mut counts = HashMap::new();
    for d in all {
        *counts.entry(d.status.as_str()).or_default() += 1;
    }
    counts
}

#[tokio::test]
async fn given_a_failing_endpoint_then_the_breaker_holds_its_attempts_probes_once_per_interval_and_releases_them_on_a_success(
) {
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    let (tenant, sub) = subscribed(&h, vec![10; 20], CircuitBreaker::on()).await;
    ingest(&h, &tenant, 40).await;
    h.drain_now().await;
    // Five failed attempts open it; the other 35 first attempts are held, unattempted.
    assert_eq!(h.sender.requests.lock().unwrap().len(), 5);
    let overview = h.services.subscription_overview(&tenant, &sub.id).await.unwrap();
    assert_eq!(overview.circuit.state, CircuitState::Open);
    let opened = overview.circuit.since;
    assert_eq!(overview.circuit.next_probe_at, Some(opened + Duration::seconds(30)));
    // The overview counts what it holds (the dashboard's "34 deliveries held").
    let parked = h.scheduler.held(&sub.id, 100).await.unwrap().len() as u32;
    assert!(parked >= 30, "{parked}");
    assert_eq!(overview.held, parked);
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
    assert_eq!((overview.circuit.state, overview.held), (CircuitState::Closed, 0));
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
    released_on_the_ramp(None).await;
}

/// The release a few milliseconds after the closing, as on any real clock (the scheduler
/// table's reads take time): each second still gets its share, none a second early.
#[tokio::test]
async fn given_a_release_a_moment_after_the_closing_then_no_second_of_the_ramp_comes_early() {
    released_on_the_ramp(Some(Duration::milliseconds(7))).await;
}

async fn released_on_the_ramp(scheduler_latency: Option<Duration>) {
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    if let Some(latency) = scheduler_latency {
        *h.scheduler.latency.lock().unwrap() = Some((h.clock.clone(), latency));
    }
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
async fn given_a_high_rate_limit_and_three_pages_held_then_the_pages_never_overlap_and_each_delivery_is_posted_once() {
    // Workers side by side (each message its own), the tick every second beside them, the
    // pages released at 1 000/s: the next page is due in 0.3 s, and two releasers interleave
    // inside a release (the scheduler table yields on each call), so only the page's claim
    // keeps the next page from overlapping it.
    let (sender, up) = switchable();
    let (h, clock) = Harness::stepped(sender, Default::default());
    *h.scheduler.latency.lock().unwrap() = Some((clock.clone(), Duration::milliseconds(400)));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let breaker = CircuitBreaker {
        failure_threshold: 1,
        ..CircuitBreaker::on()
    };
    h.services
        .create_subscription(&tenant, subscription(vec![60; 5], Some(1_000), breaker))
        .await
        .unwrap();
    let events = 1_200;
    for _ in 0..events {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    let mut workers = futures::stream::FuturesUnordered::new();
    let end = h.clock.now() + Duration::seconds(120);
    let (mut step, mut posted_before_up) = (0u64, 0);
    while h.clock.now() < end {
        if step == 500 {
            // The endpoint comes back after 5 s.
            posted_before_up = h.sender.requests.lock().unwrap().len();
            up.store(true, Ordering::SeqCst);
        }
        for task in h.queue.take_visible() {
            let services = &h.services;
            workers.push(Box::pin(async move {
                let _ = services.deliver(&task).await;
            })
                as std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>);
        }
        if step % 100 == 0 {
            if step > 500 && workers.is_empty() && count(&h, &tenant, "delivered").await == events {
                break;
            }
            let services = &h.services;
            workers.push(Box::pin(async move {
                let _ = services.run_scheduler().await;
            }));
        }
        run_until_waiting(&mut workers).await;
        clock.advance(Duration::milliseconds(10));
        step += 1;
    }
    assert_eq!(count(&h, &tenant, "delivered").await, events);
    // Judged at the endpoint: after it came back, each delivery POSTed once, no more.
    let mut posts: HashMap<String, usize> = HashMap::new();
    for r in h.sender.requests.lock().unwrap()[posted_before_up..].iter() {
        let id = r.headers.iter().find(|(k, _)| k == "webhook-id").unwrap().1.clone();
        *posts.entry(id).or_default() += 1;
    }
    let again: Vec<_> = posts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(again.is_empty(), "POSTed more than once once up: {again:?}");
    assert!(posts.len() >= events - 10, "{} POSTed once up", posts.len());
    // And released once: a page released over another queues its attempts twice. (Each
    // also has its copy due at its give-up time, 300 s on, queued by the tick.)
    let mut queued: HashMap<(String, u32), usize> = HashMap::new();
    let released = |(t, delay): &&(DeliveryTask, u32)| t.held_until.is_some() && *delay < 60;
    for (task, _) in h.queue.log.lock().unwrap().iter().filter(released) {
        *queued.entry((task.delivery_id.to_string(), task.attempt)).or_default() += 1;
    }
    let twice: Vec<_> = queued.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} held attempts queued twice: {:?}",
        twice.len(),
        twice.first()
    );
}

#[tokio::test]
async fn given_a_breaker_open_past_the_retry_schedule_then_its_held_deliveries_go_on_with_the_rest_of_it_and_die_with_every_attempt_and_one_notice(
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
    // The schedule spans 210 s. Held, a delivery makes its held attempt at its schedule's
    // end (or, a probe, sooner), then the rest of its schedule: the breaker costs it no
    // attempt, and it dies no sooner than it would have without the breaker.
    let start = h.clock.now();
    h.run_for(Duration::seconds(600), Duration::seconds(1)).await;
    let all = deliveries(&h, &tenant).await;
    assert!(all.iter().all(|d| d.status == DeliveryStatus::Dead), "{all:?}");
    for d in &all {
        assert!(d.updated_at >= start + Duration::seconds(210), "died early: {d:?}");
        assert_eq!(d.attempts, 4, "every attempt of its schedule: {d:?}");
    }
    let held_past_the_end = all
        .iter()
        .filter(|d| d.updated_at > start + Duration::seconds(210))
        .count();
    assert!(
        held_past_the_end >= 5,
        "{held_past_the_end} held past their schedule's end"
    );
    assert_eq!(h.sender.requests.lock().unwrap().len(), 40, "one POST an attempt");
    // Each told once: the first deaths at once, those after in the next digest window's.
    h.run_for(Duration::minutes(20), Duration::minutes(1)).await;
    let mails = h.mailer.sent.lock().unwrap().clone();
    assert!(mails.len() <= 2, "{} emails", mails.len());
    for d in &all {
        // Emails that name it (one alone names it twice: its line and its replay link).
        let told = mails.iter().filter(|m| m.text.contains(d.id.as_str())).count();
        assert_eq!(told, 1, "{} told {told} times: {mails:#?}", d.id);
    }
}

#[tokio::test]
async fn given_many_held_deliveries_giving_up_in_the_same_second_then_they_go_out_on_the_ramp_not_as_a_herd() {
    let clock: Arc<OnceLock<Arc<dyn Clock>>> = Arc::default();
    let posted_at = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (now, record) = (clock.clone(), posted_at.clone());
    let h = Harness::new(ScriptedSender::new(move |_, _| {
        record.lock().unwrap().push(now.get().unwrap().now());
        status_outcome(503)
    }));
    assert!(clock.set(h.clock.clone()).is_ok());
    let (tenant, _) = h.tenant("owner@example.com").await;
    let breaker = CircuitBreaker {
        failure_threshold: 2,
        probe_interval_seconds: 60,
        ..CircuitBreaker::on()
    };
    h.services
        .create_subscription(&tenant, subscription(vec![600, 600], None, breaker))
        .await
        .unwrap();
    for _ in 0..300 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    // The breaker opens at once; the rest are held, all giving up 1 200 s on, in one second:
    // further than the queue can delay (900 s), so the ramp outlasts the tick's horizon.
    h.run_for(Duration::seconds(1_300), Duration::seconds(1)).await;
    let start = *posted_at.lock().unwrap().first().unwrap();
    let mut by_second = std::collections::BTreeMap::<i64, usize>::new();
    for at in posted_at.lock().unwrap().iter() {
        *by_second.entry((*at - start).num_seconds()).or_default() += 1;
    }
    let busiest = by_second.values().max().copied().unwrap_or(0);
    // On the ramp: 10, 20, 40, 80, then the last 150.
    assert!(busiest <= 150, "{busiest} POSTs in one second: {by_second:?}");
    assert!(
        by_second.values().sum::<usize>() >= 290,
        "nearly all made their held attempt: {by_second:?}"
    );
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

/// A tenant, and its subscription with this schedule and breaker (no rate limit).
async fn subscribed(h: &Harness, schedule: Vec<u64>, breaker: CircuitBreaker) -> (Tenant, Subscription) {
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(&tenant, subscription(schedule, None, breaker))
        .await
        .unwrap()
        .subscription;
    (tenant, sub)
}

async fn ingest(h: &Harness, tenant: &Tenant, n: usize) {
    for _ in 0..n {
        h.services.ingest(tenant, event(), None).await.unwrap();
    }
}

async fn circuit_state(h: &Harness, tenant: &Tenant, sub: &Subscription) -> CircuitState {
    h.services
        .subscription_overview(tenant, &sub.id)
        .await
        .unwrap()
        .circuit
        .state
}

/// How many of the tenant's deliveries are `status` (all of them printed when that is 0).
async fn count(h: &Harness, tenant: &Tenant, status: &str) -> usize {
    let all = deliveries(h, tenant).await;
    let n = all.iter().filter(|d| d.status.as_str() == status).count();
    if n == 0 {
        eprintln!("no delivery {status}: {:?}", statuses(&all));
    }
    n
}

/// A tenant with one subscription (a schedule of 20 retries 10 minutes apart, so nothing
/// gives up during a test), 40 events to it, and its endpoint down: the breaker opens after
/// five failures and holds the other 35.
async fn open_breaker_holding(h: &Harness, breaker: CircuitBreaker) -> (Tenant, Subscription) {
    let (tenant, sub) = subscribed(h, vec![600; 20], breaker).await;
    ingest(h, &tenant, 40).await;
    h.drain_now().await;
    assert_eq!(circuit_state(h, &tenant, &sub).await, CircuitState::Open);
    assert_eq!(h.sender.requests.lock().unwrap().len(), 5);
    assert!(h.scheduler.held(&sub.id, 100).await.unwrap().len() >= 34);
    (tenant, sub)
}

#[tokio::test]
async fn given_an_open_breaker_then_the_attempts_it_holds_read_no_event() {
    // A storm's messages are mostly held: each read of its event would be wasted (on
    // DynamoDB, a read per message on the table the storm's writes already load).
    let (sender, _up) = switchable();
    let h = Harness::new(sender);
    let (_, sub) = open_breaker_holding(&h, CircuitBreaker::on()).await;
    let held = h.scheduler.held(&sub.id, 100).await.unwrap().len();
    assert_eq!(
        h.store.event_reads.load(Ordering::SeqCst),
        5,
        "one read for each of the 5 attempts made, none for the {held} held"
    );
}

#[tokio::test]
async fn given_a_probe_in_flight_then_another_attempt_failing_does_not_open_the_breaker_again() {
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    let (_, sub) = open_breaker_holding(&h, CircuitBreaker::on()).await;
    // A probe in flight: the breaker half open, naming one held delivery.
    let open = h.store.circuit(&sub.id).await.unwrap().unwrap();
    let held = h.scheduler.held(&sub.id, 2).await.unwrap();
    let (probe, other) = (held[0].task.clone(), held[1].task.clone());
    let half_open = hookwise_core::circuit::Circuit {
        state: CircuitState::HalfOpen,
        probe: Some(probe.delivery_id.clone()),
        next_probe_at: Some(h.clock.now() + Duration::seconds(30)),
        version: open.version + 1,
        ..open.clone()
    };
    h.store.put_circuit(&sub.id, &half_open, Some(&open)).await.unwrap();
    h.clock.advance(Duration::seconds(3)); // past what the process keeps of the breaker
                                           // Meanwhile another held delivery, given up, makes its attempt, and fails.
    let given_up = DeliveryTask {
        held_until: Some(h.clock.now() - Duration::seconds(1)),
        ..other
    };
    assert!(matches!(
        h.services.deliver(&given_up).await.unwrap(),
        DeliverOutcome::Retrying { .. }
    ));
    let now = h.store.circuit(&sub.id).await.unwrap().unwrap();
    assert_eq!(
        (now.state, now.version),
        (CircuitState::HalfOpen, half_open.version),
        "only the probe's own failure opens it again"
    );
    // The probe comes back a success: closed.
    up.store(true, Ordering::SeqCst);
    assert_eq!(h.services.deliver(&probe).await.unwrap(), DeliverOutcome::Delivered);
    assert_eq!(
        h.store.circuit(&sub.id).await.unwrap().unwrap().state,
        CircuitState::Closed
    );
}

#[tokio::test]
async fn given_an_open_breaker_turned_off_then_what_it_held_is_released_within_seconds() {
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    let (tenant, sub) = open_breaker_holding(&h, CircuitBreaker::on()).await;
    up.store(true, Ordering::SeqCst);
    h.services
        .update_subscription(
            &tenant,
            &sub.id,
            patch(serde_json::json!({"circuit_breaker": {"enabled": false}})),
        )
        .await
        .unwrap();
    // The change itself lets them go (on AWS the scheduler's tick is a minute away).
    assert!(h.scheduler.held(&sub.id, 100).await.unwrap().is_empty());
    // The ramp releases 10, then 20 a second: the 34 parked within five seconds, not at
    // their give-up time 3 hours away. (The five attempted retry on their schedule, and the
    // next probe, on its way, comes at the probe time.)
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    assert_eq!(count(&h, &tenant, "delivered").await, 34);
    assert!(h.scheduler.held(&sub.id, 100).await.unwrap().is_empty());
    h.run_for(Duration::seconds(30), Duration::seconds(1)).await;
    assert_eq!(count(&h, &tenant, "delivered").await, 35);
}

#[tokio::test]
async fn given_a_subscription_disabled_or_deleted_while_its_breaker_holds_then_the_held_are_settled_at_once() {
    for delete in [false, true] {
        let (sender, _up) = switchable();
        let h = Harness::new(sender);
        let (tenant, sub) = open_breaker_holding(&h, CircuitBreaker::on()).await;
        if delete {
            h.services.delete_subscription(&tenant, &sub.id).await.unwrap();
        } else {
            h.services
                .update_subscription(&tenant, &sub.id, patch(serde_json::json!({"status": "disabled"})))
                .await
                .unwrap();
        }
        // The change itself lets them go (on AWS the scheduler's tick is a minute away).
        assert!(h.scheduler.held(&sub.id, 100).await.unwrap().is_empty());
        h.run_for(Duration::seconds(2), Duration::seconds(1)).await;
        let all = deliveries(&h, &tenant).await;
        // The 34 parked die now, unattempted, with the reason. (The five attempted are
        // retrying: their next attempt, 10 minutes away, settles them; the next probe, on
        // its way, at the probe time.)
        let dead: Vec<_> = all.iter().filter(|d| d.status == DeliveryStatus::Dead).collect();
        assert_eq!(dead.len(), 34, "delete: {delete}, {:?}", statuses(&all));
        assert!(
            dead.iter().all(|d| d.attempts == 0 && d.last_error.is_some()),
            "{dead:?}"
        );
        assert_eq!(h.sender.requests.lock().unwrap().len(), 5, "no POST to settle them");
        assert!(h.scheduler.held(&sub.id, 100).await.unwrap().is_empty());
        h.run_for(Duration::seconds(30), Duration::seconds(1)).await;
        assert_eq!(count(&h, &tenant, "dead").await, 35);
    }
}

#[tokio::test]
async fn given_the_probes_message_lost_then_the_scheduler_queues_another_probe() {
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    let (tenant, sub) = open_breaker_holding(&h, CircuitBreaker::on()).await;
    up.store(true, Ordering::SeqCst);
    // The probe time: its message is lost (a purge, a consumer that died with it).
    h.clock.advance(Duration::seconds(30));
    let lost = h.queue.take_visible();
    assert_eq!(lost.len(), 1, "the probe's message: {lost:?}");
    // Within the probe's grace and a tick, another held attempt is queued to be the probe;
    // it closes the breaker, and the rest are released.
    h.run_for(Duration::seconds(20), Duration::seconds(1)).await;
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::Closed);
    let all = deliveries(&h, &tenant).await;
    // The one whose message was lost is retrying: its own retry (10 minutes) brings it.
    assert_eq!(statuses(&all).get("delivered"), Some(&34), "{:?}", statuses(&all));
}

#[tokio::test]
async fn given_a_successful_probe_whose_closing_write_failed_then_its_message_comes_back_and_closes_the_breaker() {
    // The first POST the endpoint accepts makes the breaker's next write fail: the probe's
    // own closing. (The same as a crash between the probe's record and the breaker's move.)
    // Its handler fails, so its message comes back (after the 30 s visibility timeout here),
    // stale, and the probe's outcome, recorded, moves the breaker then.
    let store: Arc<OnceLock<Arc<MemoryStore>>> = Arc::default();
    let cell = store.clone();
    let (sender, up) = switchable_with(move || cell.get().unwrap().failing_circuit_writes.store(1, Ordering::SeqCst));
    let h = Harness::new(sender);
    store.set(h.store.clone()).ok();
    let (tenant, sub) = open_breaker_holding(&h, CircuitBreaker::on()).await;
    up.store(true, Ordering::SeqCst);
    let (step, visibility) = (Duration::seconds(1), Duration::seconds(30));
    h.run_as_a_worker_for(Duration::seconds(31), step, visibility).await;
    assert_eq!(
        circuit_state(&h, &tenant, &sub).await,
        CircuitState::HalfOpen,
        "its closing was lost"
    );
    h.run_as_a_worker_for(Duration::seconds(31), step, visibility).await;
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::Closed);
    h.run_as_a_worker_for(Duration::seconds(10), step, visibility).await;
    assert_eq!(count(&h, &tenant, "delivered").await, 35);
}

#[tokio::test]
async fn given_the_answer_of_a_successful_probes_write_lost_then_its_retried_write_finds_it_landed_and_the_breaker_closes(
) {
    // The first POST the endpoint accepts (the probe's) has its record's answer lost: the
    // write landed, and its retry finds the delivery moved on, to what it wrote itself.
    let store: Arc<OnceLock<Arc<MemoryStore>>> = Arc::default();
    let cell = store.clone();
    let (sender, up) = switchable_with(move || cell.get().unwrap().lost_delivery_answers.store(1, Ordering::SeqCst));
    let h = Harness::new(sender);
    store.set(h.store.clone()).ok();
    let (tenant, sub) = open_breaker_holding(&h, CircuitBreaker::on()).await;
    up.store(true, Ordering::SeqCst);
    h.run_as_a_worker_for(Duration::seconds(31), Duration::seconds(1), Duration::seconds(30))
        .await;
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::Closed);
}

#[tokio::test]
async fn given_the_release_failing_to_queue_its_page_then_the_page_is_released_again() {
    // As the probe succeeds, the next enqueue fails: the closing's release of its page.
    let queue: Arc<OnceLock<Arc<MemoryQueue>>> = Arc::default();
    let cell = queue.clone();
    let (sender, up) = switchable_with(move || cell.get().unwrap().failing_enqueues.store(1, Ordering::SeqCst));
    let h = Harness::new(sender);
    queue.set(h.queue.clone()).ok();
    let (tenant, sub) = open_breaker_holding(&h, CircuitBreaker::on()).await;
    up.store(true, Ordering::SeqCst);
    h.run_for(Duration::seconds(31), Duration::seconds(1)).await;
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::Closed);
    assert_eq!(
        h.scheduler.held(&sub.id, 100).await.unwrap().len(),
        34,
        "the page is still held"
    );
    // Its claim runs out after a minute, and the scheduler's tick releases it again.
    h.run_for(Duration::seconds(70), Duration::seconds(1)).await;
    assert_eq!(count(&h, &tenant, "delivered").await, 35);
    assert!(h.scheduler.held(&sub.id, 100).await.unwrap().is_empty());
}

#[tokio::test]
async fn given_the_next_probe_arriving_early_then_it_is_queued_again_for_the_probe_time_not_parked() {
    let (sender, _up) = switchable();
    let h = Harness::new(sender);
    let (_tenant, sub) = open_breaker_holding(&h, CircuitBreaker::on()).await;
    // The one message queued for the probe time is the next probe's.
    let log = h.queue.log.lock().unwrap().clone();
    let (probe, _) = log
        .iter()
        .rev()
        .find(|(t, delay)| t.held_until.is_some() && *delay > 0)
        .cloned()
        .expect("the next probe is queued");
    // A copy of it arrives now, 30 s early.
    let outcome = h.services.deliver(&probe).await.unwrap();
    assert!(matches!(outcome, DeliverOutcome::Held { .. }), "{outcome:?}");
    let held = h.scheduler.held(&sub.id, 100).await.unwrap();
    assert!(
        held.iter().all(|i| i.task.delivery_id != probe.delivery_id),
        "the next probe is not parked"
    );
    let requeued = h.queue.log.lock().unwrap().last().cloned().unwrap();
    assert_eq!(requeued.0.delivery_id, probe.delivery_id);
    assert_eq!(requeued.1, 30, "queued again for the probe time");
}

#[tokio::test]
async fn given_a_schedule_shorter_than_the_probe_interval_then_the_breaker_costs_no_delivery_its_attempts() {
    // The new user: [1, 1, 1], an endpoint that fails each message's first POST and
    // accepts the second, 200 events. The breaker opens, but holding would outlast each
    // schedule (the probe is 30 s away), so nothing is held: all arrive on their second try.
    let h = Harness::new(ScriptedSender::per_message(|n| {
        status_outcome(if n == 0 { 500 } else { 200 })
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, subscription(vec![1, 1, 1], None, CircuitBreaker::on()))
        .await
        .unwrap();
    for _ in 0..200 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    h.run_for(Duration::seconds(10), Duration::seconds(1)).await;
    assert_eq!(count(&h, &tenant, "delivered").await, 200);
    assert_eq!(h.sender.requests.lock().unwrap().len(), 400, "each POSTed twice");
}

#[tokio::test]
async fn given_a_retry_waiting_long_for_its_rate_limit_slot_then_the_sweep_does_not_queue_it_again() {
    let h = Harness::new(ScriptedSender::per_message(|n| {
        status_outcome(if n == 0 { 500 } else { 200 })
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(&tenant, subscription(vec![1, 600], Some(1), CircuitBreaker::off()))
        .await
        .unwrap()
        .subscription;
    h.services.ingest(&tenant, event(), None).await.unwrap();
    h.drain_now().await;
    // A backlog: 400 turns and slots taken, one a second, by attempts on their way.
    for _ in 0..400 {
        h.store
            .limit_rate(&sub.id, std::time::Duration::from_secs(1), h.clock.now(), Arrival::New)
            .await
            .unwrap();
    }
    // The retry's slot is 400 s ahead, past the sweep's 5 minutes: it waits for it, once.
    h.run_for(Duration::seconds(420), Duration::seconds(1)).await;
    assert_eq!(count(&h, &tenant, "delivered").await, 1);
    let all = deliveries(&h, &tenant).await;
    assert!(
        all[0].updated_at - all[0].created_at > Duration::minutes(6),
        "{:?}",
        all[0]
    );
    let log = h.queue.log.lock().unwrap().clone();
    let retries: Vec<_> = log
        .iter()
        .filter(|(t, _)| t.attempt == 2)
        .map(|(t, d)| (t.slot.is_some(), *d))
        .collect();
    assert_eq!(
        retries.iter().filter(|(slotted, _)| !slotted).count(),
        1,
        "queued by its attempt, and not again by the sweep: {retries:?}"
    );
    assert_eq!(h.sender.requests.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn given_the_write_of_a_delivered_attempt_throttled_then_it_is_tried_again_and_the_delivery_is_delivered() {
    // The endpoint answers 200; the attempt's write is throttled three times.
    let store: Arc<OnceLock<Arc<MemoryStore>>> = Arc::default();
    let cell = store.clone();
    let (sender, up) = switchable_with(move || cell.get().unwrap().failing_delivery_writes.store(3, Ordering::SeqCst));
    let h = Harness::new(sender);
    store.set(h.store.clone()).ok();
    up.store(true, Ordering::SeqCst);
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, subscription(vec![60], None, CircuitBreaker::on()))
        .await
        .unwrap();
    h.services.ingest(&tenant, event(), None).await.unwrap();
    let tasks = h.queue.take_visible();
    let outcome = h.services.deliver(&tasks[0]).await.expect("recorded after its retries");
    assert_eq!(outcome, DeliverOutcome::Delivered);
    assert_eq!(h.sender.requests.lock().unwrap().len(), 1, "one POST");
    // A failed attempt's write is not tried again here: its message comes back instead.
    h.services.ingest(&tenant, event(), None).await.unwrap();
    up.store(false, Ordering::SeqCst);
    h.store.failing_delivery_writes.store(1, Ordering::SeqCst);
    let tasks = h.queue.take_visible();
    assert!(h.services.deliver(&tasks[0]).await.is_err());
}

#[tokio::test]
async fn given_a_subscription_disabled_while_its_breaker_holds_more_than_a_page_then_the_change_lets_go_of_one_and_the_tick_of_the_rest(
) {
    // The change's own time limit (an API request, a Lambda invocation) allows a page; the
    // scheduler's tick does the rest.
    let (sender, _up) = switchable();
    let h = Harness::new(sender);
    let (tenant, sub) = subscribed(&h, vec![600; 20], CircuitBreaker::on()).await;
    ingest(&h, &tenant, 600).await;
    h.drain_now().await;
    assert_eq!(h.scheduler.held(&sub.id, 1_000).await.unwrap().len(), 594);
    h.services
        .update_subscription(&tenant, &sub.id, patch(serde_json::json!({"status": "disabled"})))
        .await
        .unwrap();
    assert_eq!(
        h.scheduler.held(&sub.id, 1_000).await.unwrap().len(),
        94,
        "one page let go"
    );
    h.services.run_scheduler().await.unwrap();
    assert!(
        h.scheduler.held(&sub.id, 1_000).await.unwrap().is_empty(),
        "the tick lets go of the rest"
    );
}

#[tokio::test]
async fn given_a_held_delivery_that_gave_up_then_the_audits_copy_of_its_lost_retry_is_not_held_again() {
    // The breaker opens on the first two failures and probes once a minute, failing each
    // time, so deliveries are held to their give-up time (their schedule's 210 s span) and
    // attempted then, their retries made on schedule. One such retry's message is lost; the
    // audit of queued messages (its age here 400 s, past every retry of this schedule) queues
    // it again from the stored delivery, which must still say it gave up being held, or the
    // open breaker holds it again for what is left of its schedule (or till a probe picks it).
    let config = hookwise_core::services::Config {
        queued_message_audit_age: std::time::Duration::from_secs(400),
        ..Default::default()
    };
    let h = Harness::with_config(ScriptedSender::always(503), config, 900);
    let breaker = CircuitBreaker {
        failure_threshold: 2,
        probe_interval_seconds: 60,
        ..CircuitBreaker::on()
    };
    let (tenant, _) = subscribed(&h, vec![30, 60, 120], breaker).await;
    ingest(&h, &tenant, 4).await;
    h.run_for(Duration::seconds(215), Duration::seconds(1)).await;
    let now = h.clock.now();
    let mut lost = None;
    for (n, (task, due)) in h.queue.messages().into_iter().enumerate() {
        let d = h.store.get_delivery(&task.delivery_id).await.unwrap().unwrap();
        let waited_for = task.round == d.round && task.attempt == d.attempts + 1;
        let gave_up = task.held_until.is_some_and(|until| until <= now);
        if waited_for && gave_up && due > now {
            lost = Some(n);
            break;
        }
    }
    let (task, _) = h.queue.take_at(lost.expect("a retry after a held attempt gave up"));

    h.run_for(Duration::seconds(700), Duration::seconds(1)).await;
    let attempts = h.store.attempts(&task.delivery_id).await.unwrap();
    let made = attempts
        .iter()
        .find(|a| a.round == task.round && a.attempt == task.attempt)
        .expect("the lost attempt, made");
    // The audit takes on ten minutes of creation times at once: it queues this one again
    // 600 s after the first tick.
    let audited = h
        .store
        .get_delivery(&task.delivery_id)
        .await
        .unwrap()
        .unwrap()
        .created_at
        + Duration::seconds(600);
    assert!(
        made.started_at <= audited + Duration::seconds(70),
        "queued again by the audit at about {audited}, made at {} (held again by the open breaker)",
        made.started_at
    );
}

#[tokio::test]
async fn given_an_outage_at_a_rate_limited_endpoint_then_attempts_waiting_for_their_turn_ask_the_breaker_again() {
    // 40 events at once to an endpoint limited to 10 a second, down: the attempts whose turn
    // comes within the second wait for it in their workers, side by side. The first three
    // fail and open the breaker; the ones still waiting must find it open when their turn
    // comes, not POST a second's worth of the rate into the outage.
    let (h, clock) = Harness::stepped(ScriptedSender::always(503), Default::default());
    let (tenant, _) = h.tenant("owner@example.com").await;
    let breaker = CircuitBreaker {
        failure_threshold: 3,
        probe_interval_seconds: 30,
        ..CircuitBreaker::on()
    };
    let sub = h
        .services
        .create_subscription(&tenant, subscription(vec![60, 600], Some(10), breaker))
        .await
        .unwrap()
        .subscription
        .id;
    for _ in 0..40 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    let end = h.clock.now() + Duration::seconds(10);
    let mut workers = futures::stream::FuturesUnordered::new();
    while h.clock.now() < end {
        for task in h.queue.take_visible() {
            let services = &h.services;
            workers.push(async move { services.deliver(&task).await.unwrap() });
        }
        run_until_waiting(&mut workers).await;
        clock.advance(Duration::milliseconds(10));
    }
    let posts = h.sender.requests.lock().unwrap().len();
    let circuit = h.store.circuit(&sub).await.unwrap();
    assert_eq!(circuit.map(|c| c.state), Some(CircuitState::Open));
    assert!(
        posts <= 4,
        "{posts} POSTs in the outage's first 10 s, the breaker's threshold 3"
    );
}

#[tokio::test]
async fn given_two_copies_of_a_last_attempt_and_the_first_ones_hand_off_failing_then_the_second_hands_it_on() {
    // SQS hands one message out twice. Both copies read the delivery; the first POSTs,
    // records it dead (its schedule has no retry) and fails to hand it to the dead-letter
    // queue; the second, its turn half a second later under the rate limit, POSTs, loses the
    // conditional write, and acks: the message's last ack. The owner must still be told.
    let (h, clock) = Harness::stepped(ScriptedSender::always(500), Default::default());
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(&tenant, subscription(vec![], Some(2), CircuitBreaker::off()))
        .await
        .unwrap()
        .subscription;
    // A turn taken just before: both copies wait for theirs, having read the delivery.
    let interval = std::time::Duration::from_millis(500);
    h.store
        .limit_rate(&sub.id, interval, h.clock.now(), Arrival::New)
        .await
        .unwrap();
    h.services.ingest(&tenant, event(), None).await.unwrap();
    let task = h.queue.take_visible().pop().expect("the first attempt's message");
    h.queue.failing_dead_letters.store(1, Ordering::SeqCst);
    let mut workers = futures::stream::FuturesUnordered::new();
    for copy in [task.clone(), task] {
        let services = &h.services;
        workers.push(async move { services.deliver(&copy).await });
    }
    let end = h.clock.now() + Duration::seconds(5);
    while h.clock.now() < end {
        run_until_waiting(&mut workers).await;
        clock.advance(Duration::milliseconds(100));
    }
    assert_eq!(h.sender.requests.lock().unwrap().len(), 2, "both copies POSTed");
    assert_eq!(count(&h, &tenant, "dead").await, 1);
    assert_eq!(h.queue.dead_letters().len(), 1, "handed to the dead-letter queue");
}

#[tokio::test]
async fn given_a_breaker_opened_by_another_process_then_a_success_made_past_it_closes_it_and_one_failure_does_not_reopen_it(
) {
    // Process B's health, read a moment before the outage, shows no failures: for 30 s it
    // attempts without reading the breaker. Process A's five failures open it, holding
    // nothing (every delivery failed once and waits for its retry). The endpoint comes back,
    // and B's attempt succeeds: the save of B's health ends the stored run of failures, so no
    // attempt reads the breaker any more, and it must not stay open for the next failure to
    // find past its probe time, probe with, and re-open on one failure.
    let (h, b, up, tenant, sub) = another_process_delivered_once(None).await;
    h.clock.advance(Duration::seconds(1));
    up.store(false, Ordering::SeqCst);
    ingest(&h, &tenant, 5).await;
    h.drain_now().await;
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::Open);
    assert!(h.scheduler.held(&sub.id, 10).await.unwrap().is_empty(), "nothing held");

    h.clock.advance(Duration::seconds(10));
    up.store(true, Ordering::SeqCst);
    ingest(&h, &tenant, 1).await;
    for task in h.queue.take_visible() {
        assert_eq!(b.deliver(&task).await.unwrap(), DeliverOutcome::Delivered);
    }
    let stored = h.store.circuit(&sub.id).await.unwrap().unwrap();
    assert_eq!(
        stored.state,
        CircuitState::Closed,
        "the success that ended the stored run of failures closes it: {stored:?}"
    );

    // Past the probe time, the endpoint fails again: the threshold's failures open it, not one.
    h.clock.advance(Duration::seconds(30));
    up.store(false, Ordering::SeqCst);
    let posted = h.sender.requests.lock().unwrap().len();
    ingest(&h, &tenant, 3).await;
    h.drain_now().await;
    assert_eq!(
        h.sender.requests.lock().unwrap().len(),
        posted + 3,
        "each attempt made, none held"
    );
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::Closed);
}

#[tokio::test]
async fn given_a_half_open_breakers_probe_deferred_by_the_rate_limit_then_a_stale_copy_of_its_delivery_does_not_reopen_it_and_the_probe_decides(
) {
    // One delivery, to an endpoint limited to 1 a second whose breaker opens on one failure.
    // Its first attempt fails and opens the breaker; its retry, 10 s on, is queued to be the
    // probe at 30 s (held till 35 s, its schedule's last attempt). Then the probe waits for a
    // rate-limit slot 10 s ahead: the delivery's next attempt is moved to the slot (a write
    // since the probe began), unattempted. A copy of its first attempt's message comes back
    // (a handler that died after recording it): the delivery's last recorded outcome, a 503,
    // is not the probe's.
    use hookwise_core::ports::QueueMessage;
    use hookwise_core::services::QueueRole;
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    let (tenant, _) = h.tenant("owner@example.com").await;
    let breaker = CircuitBreaker {
        failure_threshold: 1,
        ..CircuitBreaker::on()
    };
    let sub = h
        .services
        .create_subscription(&tenant, subscription(vec![10, 25], Some(1), breaker))
        .await
        .unwrap()
        .subscription;
    ingest(&h, &tenant, 1).await;
    h.drain_now().await;
    let first = h.queue.log.lock().unwrap()[0].0.clone();
    assert_eq!((first.round, first.attempt), (0, 1));
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::Open);
    h.run_for(Duration::seconds(29), Duration::seconds(1)).await;
    assert_eq!(
        h.sender.requests.lock().unwrap().len(),
        1,
        "the retry waits to be the probe"
    );

    // The probe time: ten turns are taken first, and the probe is sent back for its slot.
    h.clock.advance(Duration::seconds(1));
    for _ in 0..10 {
        h.store
            .limit_rate(&sub.id, std::time::Duration::from_secs(1), h.clock.now(), Arrival::New)
            .await
            .unwrap();
    }
    let probe = h.queue.take_visible().pop().expect("the probe's message");
    assert!(matches!(
        h.services.deliver(&probe).await.unwrap(),
        DeliverOutcome::RateLimited { .. }
    ));
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::HalfOpen);

    let copy = QueueMessage {
        message_id: "first-again".into(),
        task: Ok(first),
        redriven: false,
        receive_count: 2,
    };
    h.services.handle_messages(QueueRole::Delivery, &[copy], None).await;
    assert_eq!(
        circuit_state(&h, &tenant, &sub).await,
        CircuitState::HalfOpen,
        "the probe's attempt is not made yet: a stale copy says nothing of it"
    );

    // The probe comes for its slot and decides (made as its schedule's last attempt, on the
    // breaker read fresh): the endpoint is up, and the breaker closes.
    up.store(true, Ordering::SeqCst);
    h.run_for(Duration::seconds(15), Duration::seconds(1)).await;
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::Closed);
    assert_eq!(count(&h, &tenant, "delivered").await, 1);
    assert_eq!(
        h.sender.requests.lock().unwrap().len(),
        2,
        "the first attempt and the probe"
    );
}

#[tokio::test]
async fn given_another_processs_later_success_stored_when_this_one_reaches_the_threshold_then_it_does_not_open_the_breaker(
) {
    // Process B's clock is 10 s ahead of A's. B's success is stored first; then A's
    // failures, made before that success in time, reach A's threshold. Saved before the
    // opening, they sort before B's success: the endpoint's run of failures is over, and an
    // opening now would go unread (no process's health shows failures) until a failure
    // found it past its probe time.
    let (h, _b, up, tenant, sub) = another_process_delivered_once(Some(Duration::seconds(10))).await;
    up.store(false, Ordering::SeqCst);
    // Six: A's first failure is saved at once (its first sample), and reads B's success.
    ingest(&h, &tenant, 6).await;
    for task in h.queue.take_visible() {
        h.services.deliver(&task).await.unwrap();
    }
    let stored = h.store.endpoint_health(&sub.id).await.unwrap();
    assert_eq!(
        stored.consecutive_failures(),
        0,
        "B's success is the latest: {stored:?}"
    );
    assert_eq!(
        h.store.circuit(&sub.id).await.unwrap().map(|c| c.state),
        None,
        "opened on a run of failures the stored health says is over"
    );
}

/// A harness (process A), a second process B on its ports (its clock `ahead` of A's, on a
/// clock of its own; else A's), and an endpoint with the default breaker and a long schedule,
/// up, to which B has delivered one event.
async fn another_process_delivered_once(
    ahead: Option<Duration>,
) -> (
    Harness,
    hookwise_core::services::Services,
    Arc<AtomicBool>,
    Tenant,
    Subscription,
) {
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    let mut ports = h.services.ports().clone();
    if let Some(by) = ahead {
        ports.clock = Arc::new(hookwise_core::testing::memory::ManualClock::new(h.clock.now() + by));
    }
    let b = hookwise_core::services::Services::new(ports, Default::default(), rand::SeedableRng::seed_from_u64(9));
    let (tenant, sub) = subscribed(&h, vec![600; 20], CircuitBreaker::on()).await;
    up.store(true, Ordering::SeqCst);
    ingest(&h, &tenant, 1).await;
    for task in h.queue.take_visible() {
        assert_eq!(b.deliver(&task).await.unwrap(), DeliverOutcome::Delivered);
    }
    (h, b, up, tenant, sub)
}

/// An endpoint failing (503), its breaker opened by the first of three deliveries (threshold
/// 1, probe every 5 s) and holding the other two; and a second `Services` on the same ports:
/// another process, with caches of its own.
async fn two_held_and_another_process() -> (Harness, Tenant, Subscription, hookwise_core::services::Services) {
    use rand::SeedableRng;
    let (sender, _up) = switchable();
    let h = Harness::new(sender);
    let (tenant, _) = h.tenant("owner@example.com").await;
    let breaker = CircuitBreaker {
        failure_threshold: 1,
        probe_interval_seconds: 5,
        ..CircuitBreaker::on()
    };
    let sub = h
        .services
        .create_subscription(&tenant, subscription(vec![600; 5], None, breaker))
        .await
        .unwrap()
        .subscription;
    for _ in 0..3 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    h.drain_now().await;
    let posts = h.sender.requests.lock().unwrap().len();
    assert_eq!(posts, 1, "the first failure opens the breaker; the rest are held");
    let other = hookwise_core::services::Services::new(
        h.services.ports().clone(),
        Default::default(),
        rand::rngs::StdRng::seed_from_u64(9),
    );
    (h, tenant, sub, other)
}

/// A subscription deleted by another process while its breaker holds attempts: this process,
/// its copy still within the lookup's time to live, neither probes the deleted endpoint nor
/// holds the attempts again; they die unattempted.
#[tokio::test]
async fn given_a_subscription_deleted_by_another_process_while_held_then_no_probe_is_posted_and_none_is_held_again() {
    let (h, tenant, sub, other) = two_held_and_another_process().await;
    let posts = |h: &Harness| h.sender.requests.lock().unwrap().len();
    other.delete_subscription(&tenant, &sub.id).await.unwrap();

    // Within the lookup's 30 s: the probe time (5 s) comes, and the tick lets go of the held.
    h.run_for(Duration::seconds(20), Duration::seconds(1)).await;
    assert_eq!(posts(&h), 1, "no POST to a deleted subscription's endpoint");
    assert!(h.scheduler.held.lock().unwrap().is_empty(), "nothing held again");
    let states = |all: Vec<Delivery>| {
        let mut states: Vec<_> = all.iter().map(|d| (d.status, d.attempts)).collect();
        states.sort_by_key(|(_, attempts)| *attempts);
        states
    };
    assert_eq!(
        states(deliveries(&h, &tenant).await),
        [
            (DeliveryStatus::Dead, 0),
            (DeliveryStatus::Dead, 0),
            (DeliveryStatus::Retrying, 1)
        ],
        "the held died unattempted; the one attempted waits for its retry"
    );
    // Its retry dies on arrival too.
    h.run_for(Duration::seconds(700), Duration::seconds(10)).await;
    assert_eq!(posts(&h), 1);
    assert_eq!(
        states(deliveries(&h, &tenant).await),
        [
            (DeliveryStatus::Dead, 0),
            (DeliveryStatus::Dead, 0),
            (DeliveryStatus::Dead, 1)
        ]
    );
}

/// Deleted subscriptions with large held sets used to fill every tending slot of a tick: each
/// was let go of until the tick's deadline. Now each tending lets go of two pages (1 000
/// attempts) at most, and the tick goes on to the next endpoint; the next tick, round the
/// list, lets go of more.
#[tokio::test]
async fn given_a_deleted_subscription_holding_thousands_then_a_tick_lets_go_of_two_pages_of_it_and_tends_the_next_endpoint(
) {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, big) = subscribed(&h, vec![600], CircuitBreaker::on()).await;
    h.clock.advance(Duration::seconds(1));
    let small = h
        .services
        .create_subscription(&tenant, subscription(vec![600], None, CircuitBreaker::on()))
        .await
        .unwrap()
        .subscription;
    assert!(big.id < small.id, "listed in id order: the large set first");
    let now = h.clock.now();
    let held = |n: usize| {
        (0..n)
            .map(|_| hookwise_core::ports::ScheduledTask {
                task: DeliveryTask {
                    delivery_id: DeliveryId::generate(now, &mut rand::rng()),
                    round: 0,
                    attempt: 2,
                    queued_at: None,
                    slot: None,
                    tenant_id: Some(tenant.id.clone()),
                    held_until: Some(now + Duration::hours(1)),
                    redrives: 0,
                },
                due: now + Duration::hours(1),
            })
            .collect::<Vec<_>>()
    };
    for (sub, n) in [(&big, 1_510), (&small, 3)] {
        for item in held(n) {
            h.scheduler.hold(&tenant.id, &sub.id, &item).await.unwrap();
        }
    }
    // Deleted by hand in the store, so nothing but the tick lets go of them.
    for sub in [&big, &small] {
        h.store.delete_subscription(&tenant.id, &sub.id).await.unwrap();
    }
    let left = |sub: &Subscription| {
        let id = sub.id.clone();
        let scheduler = h.scheduler.clone();
        async move { scheduler.held(&id, 10_000).await.unwrap().len() }
    };

    h.services.run_scheduler().await.unwrap();
    assert_eq!(
        left(&big).await,
        510,
        "two pages let go of, the rest left for later ticks"
    );
    assert_eq!(left(&small).await, 0, "the next endpoint tended in the same tick");
    assert_eq!(h.queue.log.lock().unwrap().len(), 1_003);
    h.services.run_scheduler().await.unwrap();
    assert_eq!(left(&big).await, 0, "the next tick lets go of the rest");
}

/// Released attempts pass the breaker as plain attempts. Released by another process (its
/// breaker turned off there), then the subscription deleted there too: this process, its copy
/// of the subscription still within the lookup's time to live, must not POST them to the
/// deleted subscription's endpoint; they die unattempted.
#[tokio::test]
async fn given_released_attempts_of_a_subscription_another_process_deleted_then_none_is_posted() {
    let (h, tenant, sub, other) = two_held_and_another_process().await;
    let posts = |h: &Harness| h.sender.requests.lock().unwrap().len();
    other
        .update_subscription(
            &tenant,
            &sub.id,
            patch(serde_json::json!({"circuit_breaker": {"enabled": false}})),
        )
        .await
        .unwrap();
    assert!(h.scheduler.held.lock().unwrap().is_empty(), "released there");
    other.delete_subscription(&tenant, &sub.id).await.unwrap();

    // Within the lookup's 30 s: the released attempt, and the probe queued when the breaker
    // opened (at the probe time, 5 s).
    h.run_for(Duration::seconds(20), Duration::seconds(1)).await;
    assert_eq!(posts(&h), 1, "no POST to a deleted subscription's endpoint");
    let mut states: Vec<_> = deliveries(&h, &tenant)
        .await
        .iter()
        .map(|d| (d.status, d.attempts))
        .collect();
    states.sort_by_key(|(_, attempts)| *attempts);
    assert_eq!(
        states,
        [
            (DeliveryStatus::Dead, 0),
            (DeliveryStatus::Dead, 0),
            (DeliveryStatus::Retrying, 1)
        ],
        "the held died unattempted"
    );
}

#[tokio::test]
async fn given_a_breaker_closed_by_another_process_then_attempts_are_held_on_a_copy_at_most_a_second_old() {
    // This process opened the breaker (five failures), holds the attempts after, and keeps
    // its copy. Another process closes it. Within a second of this process's read, its next
    // attempt is held on that copy: a storm's holds do not read the breaker one each. Later
    // it reads it again, and the attempt is made.
    let (sender, up) = switchable();
    let h = Harness::new(sender);
    let (tenant, sub) = subscribed(&h, vec![600; 20], CircuitBreaker::on()).await;
    ingest(&h, &tenant, 10).await;
    h.drain_now().await;
    assert_eq!(circuit_state(&h, &tenant, &sub).await, CircuitState::Open);
    // One more held, on a copy read now.
    h.clock.advance(Duration::milliseconds(100));
    ingest(&h, &tenant, 1).await;
    h.drain_now().await;
    let held = h.scheduler.held(&sub.id, 100).await.unwrap().len();
    assert_eq!(held, 5);
    let open = h.store.circuit(&sub.id).await.unwrap().expect("stored");
    let closed = Circuit {
        version: open.version + 1,
        ..Circuit::closed(h.clock.now())
    };
    h.store.put_circuit(&sub.id, &closed, Some(&open)).await.unwrap();
    up.store(true, Ordering::SeqCst);
    let posted = || h.sender.requests.lock().unwrap().len();
    assert_eq!(posted(), 5);

    // Each message handed to this process's worker alone (no scheduler tick between).
    let deliver_what_is_queued = || async {
        for task in h.queue.take_visible() {
            h.services.deliver(&task).await.unwrap();
        }
    };
    h.clock.advance(Duration::milliseconds(900));
    ingest(&h, &tenant, 1).await;
    deliver_what_is_queued().await;
    assert_eq!(posted(), 5, "held on the copy read 0.9 s ago");
    assert_eq!(h.scheduler.held(&sub.id, 100).await.unwrap().len(), held + 1);

    h.clock.advance(Duration::milliseconds(200));
    ingest(&h, &tenant, 1).await;
    deliver_what_is_queued().await;
    assert_eq!(posted(), 6, "the breaker read again, closed: the attempt is made");
}

#[tokio::test]
async fn given_a_rate_limit_turn_answered_after_it_passed_then_the_attempt_takes_the_next_turn_not_the_spent_one() {
    // One a second. The first attempt's turn is now, answered 300 ms late: sent then, it
    // would land 300 ms into the second the next turn begins, and two would share it. It
    // asks again and goes at the next turn, a second on.
    let (sender, up) = switchable();
    up.store(true, Ordering::SeqCst);
    let h = Harness::new(sender);
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, subscription(vec![60], Some(1), CircuitBreaker::on()))
        .await
        .unwrap();
    let t0 = h.clock.now();
    *h.store.late_rate_answers.lock().unwrap() = Some((h.clock.clone(), Duration::milliseconds(300), 1));
    ingest(&h, &tenant, 1).await;
    for task in h.queue.take_visible() {
        h.services.deliver(&task).await.unwrap();
    }
    let sent = h.sender.requests.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    let timestamp = |r: &hookwise_core::ports::WebhookRequest| {
        r.headers
            .iter()
            .find(|(n, _)| n == "webhook-timestamp")
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(
        timestamp(&sent[0]),
        (t0 + Duration::seconds(1)).timestamp().to_string(),
        "sent at the next turn"
    );
}
