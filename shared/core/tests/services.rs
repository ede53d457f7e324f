//! The services end to end on in-memory ports: ingest, deliver, retry, schedule, dead
//! letter, replay.

use chrono::Duration;
use hookwise_core::circuit::CircuitBreaker;
use hookwise_core::model::*;
use hookwise_core::policy::{Jitter, RetryPolicy};
use hookwise_core::ports::{Clock, DeliveryQuery, DeliveryTask, SendOutcome, Store};
use hookwise_core::services::{
    Config, DeliverOutcome, KeyRef, NewEvent, NewSubscription, Services, TenantPatch, DISABLE_NOTICE_CLAIM,
    EARLY_COPY_LAG, EARLY_SKEW,
};
use hookwise_core::signing;
use hookwise_core::testing::memory::{run_until_waiting, status_outcome, Harness, ScriptedSender};
use hookwise_core::Error;

fn new_sub(url: &str, types: &[&str], schedule: Option<Vec<u64>>) -> NewSubscription {
    NewSubscription {
        url: EndpointUrl::parse(url).unwrap(),
        event_types: types.iter().map(|t| EventTypeFilter::parse(t).unwrap()).collect(),
        owner_email: None,
        retry_policy: schedule.map(|s| RetryPolicy::custom(s, Jitter::None, false).unwrap()),
        timeout_ms: None,
        rate_limit_per_second: None,
        auto_disable_after_hours: None,
        circuit_breaker: None,
        description: None,
        filter: None,
        headers: None,
    }
}

/// `new` with its circuit breaker off: for tests of what many failing attempts to one
/// endpoint do without it.
fn without_breaker(new: NewSubscription) -> NewSubscription {
    NewSubscription {
        circuit_breaker: Some(CircuitBreaker::off()),
        ..new
    }
}

/// A tenant of `owner@example.com` with one subscription to every event type.
async fn subscribed(h: &Harness, url: &str, schedule: Option<Vec<u64>>) -> (Tenant, Subscription) {
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(&tenant, new_sub(url, &["*"], schedule))
        .await
        .unwrap()
        .subscription;
    (tenant, sub)
}

fn event(t: &str) -> NewEvent {
    NewEvent {
        event_type: EventType::parse(t).unwrap(),
        payload: serde_json::json!({"amount": 42}),
    }
}

#[tokio::test]
async fn given_three_subscriptions_when_an_event_arrives_then_it_fans_out_to_the_matching_ones() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let all = h
        .services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], None))
        .await
        .unwrap()
        .subscription;
    let invoices = h
        .services
        .create_subscription(&tenant, new_sub("https://b.example.com/", &["invoice.*"], None))
        .await
        .unwrap()
        .subscription;
    h.services
        .create_subscription(&tenant, new_sub("https://c.example.com/", &["user.created"], None))
        .await
        .unwrap();

    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let mut subs: Vec<_> = ingested.deliveries.iter().map(|d| d.subscription_id.clone()).collect();
    subs.sort();
    let mut expected = vec![all.id, invoices.id];
    expected.sort();
    assert_eq!(subs, expected);
    h.drain_now().await;
    assert_eq!(h.sender.requests.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn given_an_idempotency_key_when_sent_twice_then_one_event_and_one_delivery_per_subscription() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], None))
        .await
        .unwrap();
    let first = h
        .services
        .ingest(&tenant, event("invoice.paid"), Some("key-1".into()))
        .await
        .unwrap();
    let second = h
        .services
        .ingest(&tenant, event("invoice.paid"), Some("key-1".into()))
        .await
        .unwrap();
    assert!(first.created && !second.created);
    assert_eq!(first.event.id, second.event.id);
    assert_eq!(second.deliveries.len(), 1);
    // The repeat creates nothing. Its first attempt not made yet, the repeat queues it a copy
    // for 90 s after its creation, in case the first request's message was lost.
    let log = h.queue.log.lock().unwrap();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!((log[0].1, log[1].1), (0, 90), "{log:?}");
}

/// A keyed retry answered from the store queues, for each first attempt still waiting for
/// its message, a copy to arrive 90 s after the delivery's creation: where the first try's
/// message was lost, the attempt is made then (not at the audit's horizon, an hour); where it
/// got through, the copy finds the attempt made and costs no POST.
#[tokio::test]
async fn given_a_keyed_retry_then_a_first_attempt_whose_message_was_lost_is_made_90_s_on_and_one_whose_message_came_is_not_made_twice(
) {
    for lost in [true, false] {
        let h = Harness::new(ScriptedSender::always(200));
        let (tenant, _) = h.tenant("owner@example.com").await;
        h.services
            .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], None))
            .await
            .unwrap();
        let created = h.clock.now();
        let first = h
            .services
            .ingest(&tenant, event("invoice.paid"), Some("key-1".into()))
            .await
            .unwrap();
        let message = h.queue.take_visible();
        assert_eq!(message.len(), 1);

        h.clock.advance(Duration::seconds(3));
        let again = h
            .services
            .ingest(&tenant, event("invoice.paid"), Some("key-1".into()))
            .await
            .unwrap();
        assert!(!again.created);
        if !lost {
            // The first message comes, late, after the retry.
            h.services.deliver_batch(&message).await;
        }
        let posts = |h: &Harness| h.sender.requests.lock().unwrap().len();
        assert_eq!(posts(&h), usize::from(!lost));
        h.clock.set(created + EARLY_COPY_LAG);
        h.drain_now().await;
        assert_eq!(posts(&h), 1, "lost: {lost}: made once");
        let (delivery, _) = h.services.get_delivery(&tenant, &first.deliveries[0].id).await.unwrap();
        assert_eq!(delivery.status, DeliveryStatus::Delivered, "lost: {lost}");
        // A retry once it is delivered queues nothing more.
        h.services
            .ingest(&tenant, event("invoice.paid"), Some("key-1".into()))
            .await
            .unwrap();
        assert!(h.queue.messages().is_empty());
    }
}

#[tokio::test]
async fn given_an_endpoint_failing_twice_then_it_is_delivered_on_the_third_attempt_with_each_attempt_recorded() {
    let h = Harness::new(ScriptedSender::new(|_, n| {
        status_outcome(if n < 2 { 500 } else { 200 })
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![1, 1, 1])))
        .await
        .unwrap();
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.run_for(Duration::seconds(10), Duration::seconds(1)).await;

    let (delivery, attempts) = h
        .services
        .get_delivery(&tenant, &ingested.deliveries[0].id)
        .await
        .unwrap();
    assert_eq!(delivery.status, DeliveryStatus::Delivered);
    assert_eq!(delivery.attempts, 3);
    let codes: Vec<_> = attempts.iter().map(|a| (a.attempt, a.status_code)).collect();
    assert_eq!(codes, [(1, Some(500)), (2, Some(500)), (3, Some(200))]);
    assert!(attempts[0].next_attempt_at.is_some() && attempts[2].next_attempt_at.is_none());
    assert!(h.mailer.sent.lock().unwrap().is_empty());
}

#[tokio::test]
async fn given_an_always_failing_endpoint_then_it_dies_after_the_schedule_and_the_owner_gets_one_email() {
    let h = Harness::new(ScriptedSender::always(503));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(
            &tenant,
            new_sub("https://down.example.com/hook", &["*"], Some(vec![1, 2])),
        )
        .await
        .unwrap()
        .subscription;
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.run_for(Duration::seconds(20), Duration::seconds(1)).await;

    let (delivery, attempts) = h
        .services
        .get_delivery(&tenant, &ingested.deliveries[0].id)
        .await
        .unwrap();
    assert_eq!(delivery.status, DeliveryStatus::Dead);
    assert_eq!(attempts.len(), 3);
    let sent = h.mailer.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "exactly one email");
    let mail = &sent[0];
    assert_eq!(mail.to.as_str(), "owner@example.com");
    for needle in [
        ingested.event.id.as_str(),
        "invoice.paid",
        sub.url.as_str(),
        "HTTP 503",
        "/replay",
    ] {
        assert!(mail.text.contains(needle), "email lacks {needle}:\n{}", mail.text);
    }

    // The same dead letter again tells no one twice.
    let again = DeliveryTask {
        delivery_id: delivery.id.clone(),
        round: 0,
        attempt: 3,
        queued_at: None,
        slot: None,
        tenant_id: None,
        held_until: None,
        redrives: 0,
    };
    h.services.handle_dead_letters(&[again]).await.unwrap();
    assert_eq!(h.mailer.sent.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn given_a_dead_delivery_when_replayed_then_a_fresh_attempt_1_delivers_it() {
    let h = Harness::new(ScriptedSender::new(|_, n| {
        status_outcome(if n < 1 { 500 } else { 200 })
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![])))
        .await
        .unwrap();
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let id = &ingested.deliveries[0].id;
    assert_eq!(
        h.services.get_delivery(&tenant, id).await.unwrap().0.status,
        DeliveryStatus::Dead
    );

    let replayed = h.services.replay_delivery(&tenant, id).await.unwrap();
    assert_eq!(
        (replayed.status, replayed.round, replayed.attempts),
        (DeliveryStatus::Pending, 1, 0)
    );
    h.drain_now().await;
    let (delivery, attempts) = h.services.get_delivery(&tenant, id).await.unwrap();
    assert_eq!(delivery.status, DeliveryStatus::Delivered);
    let rounds: Vec<_> = attempts.iter().map(|a| (a.round, a.attempt)).collect();
    assert_eq!(rounds, [(0, 1), (1, 1)]);

    let err = h.services.replay_delivery(&tenant, id).await.unwrap_err();
    assert!(
        matches!(err, Error::Conflict(_)),
        "a delivered delivery is not replayed: {err}"
    );
}

#[tokio::test]
async fn given_dead_deliveries_when_the_event_or_subscription_is_recovered_then_they_are_replayed() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![])))
        .await
        .unwrap()
        .subscription;
    let start = h.clock.now();
    let e1 = h.services.ingest(&tenant, event("a.one"), None).await.unwrap();
    h.services.ingest(&tenant, event("a.two"), None).await.unwrap();
    h.drain_now().await;

    assert_eq!(h.services.replay_event(&tenant, &e1.event.id).await.unwrap().len(), 1);
    h.drain_now().await;
    let recovered = h.services.recover_subscription(&tenant, &sub.id, start).await.unwrap();
    assert_eq!(recovered.len(), 2);
    let later = h.clock.now() + Duration::hours(1);
    h.drain_now().await;
    assert!(h
        .services
        .recover_subscription(&tenant, &sub.id, later)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn given_a_retry_beyond_the_queue_delay_limit_then_it_waits_in_the_scheduler_table() {
    let h = Harness::with_config(
        ScriptedSender::new(|_, n| status_outcome(if n < 1 { 500 } else { 200 })),
        Config::default(),
        900,
    );
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![3_600])))
        .await
        .unwrap();
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    assert_eq!(
        h.scheduler.items.lock().unwrap().len(),
        1,
        "an hour is past SQS's 900 s"
    );
    assert_eq!(h.queue.pending(), 0);

    h.clock.advance(Duration::minutes(44));
    h.services.run_scheduler().await.unwrap();
    assert_eq!(h.scheduler.items.lock().unwrap().len(), 1, "not yet within 15 minutes");
    h.clock.advance(Duration::minutes(2));
    assert_eq!(h.services.run_scheduler().await.unwrap().moved, 1);
    assert!(h.scheduler.items.lock().unwrap().is_empty());
    let (task, delay) = h.queue.log.lock().unwrap().last().cloned().unwrap();
    assert_eq!((task.attempt, delay), (2, 14 * 60), "queued with the residual delay");

    h.run_for(Duration::minutes(15), Duration::minutes(1)).await;
    assert_eq!(
        h.services
            .get_delivery(&tenant, &ingested.deliveries[0].id)
            .await
            .unwrap()
            .0
            .status,
        DeliveryStatus::Delivered
    );
}

#[tokio::test]
async fn given_a_queue_delay_limit_below_the_horizon_then_a_retry_is_moved_no_earlier_than_the_queue_can_hold_it() {
    // A lowered limit (tests, `--max-queue-delay`): a 10-minute retry on a 2-minute queue.
    let h = Harness::with_config(
        ScriptedSender::new(|_, n| status_outcome(if n < 1 { 500 } else { 200 })),
        Config::default(),
        120,
    );
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![600])))
        .await
        .unwrap();
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    assert_eq!(
        h.scheduler.items.lock().unwrap().len(),
        1,
        "ten minutes is past the queue's two"
    );

    h.clock.advance(Duration::minutes(7));
    assert_eq!(
        h.services.run_scheduler().await.unwrap().moved,
        0,
        "three minutes to go is more than the queue holds"
    );
    h.clock.advance(Duration::minutes(1) + Duration::seconds(30));
    assert_eq!(h.services.run_scheduler().await.unwrap().moved, 1);
    let (task, delay) = h.queue.log.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        (task.attempt, delay),
        (2, 90),
        "queued with the whole residual delay, so it comes on time"
    );
}

#[tokio::test]
async fn given_a_duplicated_message_then_no_second_attempt_is_made_or_recorded() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![60])))
        .await
        .unwrap();
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let task = h.queue.take_visible().pop().unwrap();
    assert!(matches!(
        h.services.deliver(&task).await.unwrap(),
        DeliverOutcome::Retrying { .. }
    ));
    assert_eq!(h.services.deliver(&task).await.unwrap(), DeliverOutcome::Stale);
    let (_, attempts) = h
        .services
        .get_delivery(&tenant, &ingested.deliveries[0].id)
        .await
        .unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(h.sender.requests.lock().unwrap().len(), 1);
}

/// A copy of a retry's message that comes before the retry's time (sent again at once, or an
/// operator's redrive of the dead-letter queue) makes no attempt: it goes back to arrive then,
/// and the attempt is made then, once.
#[tokio::test]
async fn given_a_retrys_message_before_its_time_then_it_goes_back_until_then_and_the_attempt_waits() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![60])))
        .await
        .unwrap();
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let first = h.queue.take_visible().pop().unwrap();
    let started = h.clock.now();
    let DeliverOutcome::Retrying { at } = h.services.deliver(&first).await.unwrap() else {
        panic!("the first attempt fails");
    };
    assert_eq!(at, started + Duration::seconds(60));
    let retry = h.queue.messages().pop().unwrap().0;

    // The retry's message, 20 s after the failure, 40 s early.
    h.clock.advance(Duration::seconds(20));
    assert_eq!(h.services.deliver(&retry).await.unwrap(), DeliverOutcome::Early { at });
    assert_eq!(h.sender.requests.lock().unwrap().len(), 1, "no attempt before its time");
    let mut back = h.queue.messages();
    back.sort_by_key(|(_, visible)| *visible);
    assert_eq!(back.len(), 2, "the copy went back beside the message meant for then");
    assert!(back.iter().all(|(task, _)| *task == retry), "{back:?}");
    // Not side by side with the message meant for then: two workers would POST it at once.
    assert_eq!(back[0].1, at, "{back:?}");
    assert!(
        back[1].1 >= at + EARLY_COPY_LAG,
        "the copy comes after the lag: {back:?}"
    );

    // Then: one attempt, on time, by the message meant for then; the copy, after it, is stale.
    h.clock.set(at);
    let outcomes = h.services.deliver_batch(&h.queue.take_visible()).await;
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert_eq!(h.sender.requests.lock().unwrap().len(), 2, "{outcomes:?}");
    h.clock.set(at + EARLY_COPY_LAG);
    let outcomes = h.services.deliver_batch(&h.queue.take_visible()).await;
    assert!(matches!(outcomes[..], [Ok(DeliverOutcome::Stale)]), "{outcomes:?}");
    assert_eq!(h.sender.requests.lock().unwrap().len(), 2);
    let (_, attempts) = h
        .services
        .get_delivery(&tenant, &ingested.deliveries[0].id)
        .await
        .unwrap();
    assert_eq!(attempts[1].started_at, at);
}

/// The message meant for a retry's time, come a moment early (its host's clock behind the
/// one that queued it), is the only one: it goes back to arrive seconds after that time (after
/// the attempt of the message meant for then, were it a copy), and the attempt is made then,
/// not a lag later.
#[tokio::test]
async fn given_a_retrys_only_message_a_moment_before_its_time_then_the_attempt_is_made_seconds_after_it() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![60])))
        .await
        .unwrap();
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let first = h.queue.take_visible().pop().unwrap();
    let DeliverOutcome::Retrying { at } = h.services.deliver(&first).await.unwrap() else {
        panic!("the first attempt fails");
    };
    // The retry's one message, handed over 1.5 s before its time.
    assert_eq!(h.queue.messages().len(), 1);
    let (retry, _) = h.queue.take_at(0);
    h.clock.set(at - Duration::milliseconds(1_500));

    assert_eq!(h.services.deliver(&retry).await.unwrap(), DeliverOutcome::Early { at });
    let back = h.queue.messages();
    assert_eq!(back.len(), 1, "{back:?}");
    // (A queue's delay is whole seconds, rounded up.)
    let late = back[0].1 - at;
    assert!(
        late >= EARLY_SKEW && late <= EARLY_SKEW + Duration::seconds(1),
        "seconds after its time, not a lag later: {late}"
    );
    h.clock.set(back[0].1);
    h.services.deliver_batch(&h.queue.take_visible()).await;
    assert_eq!(h.sender.requests.lock().unwrap().len(), 2, "attempted at its time");
}

/// Answers 200, but only once `go` is notified: a second worker's POST of the same attempt,
/// held until the first worker has written its outcome.
struct TwoHundredAfter {
    go: std::sync::Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl hookwise_core::ports::Sender for TwoHundredAfter {
    async fn send(&self, _request: hookwise_core::ports::WebhookRequest) -> SendOutcome {
        self.go.notified().await;
        status_outcome(200)
    }
}

/// Two workers handle two copies of one attempt at once: one's POST gets 503 and is recorded
/// first (dead, with retries off; retrying with a schedule), the other's gets 200 and its write
/// loses. The 2xx is final: the delivery ends delivered, both POSTs are in its log, the
/// success counts in the endpoint's health, and the dead-letter handler tells no one.
async fn two_workers_one_attempt(schedule: Option<Vec<u64>>, retries_on: bool) {
    let h = Harness::new(ScriptedSender::always(503));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", schedule).await;
    if !retries_on {
        h.services
            .set_tenant_retries(&tenant.id, RetriesSetting::Off)
            .await
            .unwrap();
    }
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let d = &ingested.deliveries[0];
    let task = h.queue.take_visible().remove(0);
    let go = std::sync::Arc::new(tokio::sync::Notify::new());
    let ports = hookwise_core::services::Ports {
        sender: std::sync::Arc::new(TwoHundredAfter { go: go.clone() }),
        ..h.services.ports().clone()
    };
    let second = Services::new(ports, Config::default(), rand::SeedableRng::seed_from_u64(7));

    // The second worker reads the delivery first and waits at its POST; the first makes the
    // attempt (503) and records it; then the second's POST gets 200.
    let (late, early) = tokio::join!(second.deliver(&task), async {
        let outcome = h.services.deliver(&task).await;
        go.notify_one();
        outcome
    });
    assert!(
        matches!(early, Ok(DeliverOutcome::Dead | DeliverOutcome::Retrying { .. })),
        "{early:?}"
    );
    assert_eq!(late.unwrap(), DeliverOutcome::Delivered);

    let stored = h.store.get_delivery(&d.id).await.unwrap().unwrap();
    assert_eq!(stored.status, DeliveryStatus::Delivered, "{stored:?}");
    let attempts = h.store.attempts(&d.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| (a.attempt, a.status_code)).collect::<Vec<_>>(),
        vec![(1, Some(503)), (2, Some(200))],
        "each POST logged once, the success last"
    );
    assert_eq!(stored.attempts, 2);
    let health = h.store.endpoint_health(&d.subscription_id).await.unwrap();
    assert!(
        health.last_success_at.is_some(),
        "the 2xx is in the endpoint's health: {health:?}"
    );

    // Whatever the first worker queued (its retry, or the dead letter) finds it delivered.
    h.clock.advance(Duration::hours(1));
    h.run_for(Duration::seconds(120), Duration::seconds(10)).await;
    let after = h.store.get_delivery(&d.id).await.unwrap().unwrap();
    assert_eq!(after.status, DeliveryStatus::Delivered);
    assert!(h.mailer.sent.lock().unwrap().is_empty(), "no one is told of a death");
}

#[tokio::test]
async fn given_two_copies_of_a_last_attempt_at_once_when_one_gets_503_and_one_200_then_it_is_delivered_not_dead() {
    two_workers_one_attempt(None, false).await;
}

#[tokio::test]
async fn given_two_copies_of_an_attempt_at_once_when_one_gets_503_and_one_200_then_it_is_delivered_not_retried() {
    two_workers_one_attempt(Some(vec![60, 600]), true).await;
}

#[tokio::test]
async fn given_retries_switched_off_for_the_tenant_then_the_first_failure_is_final() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let tenant = h
        .services
        .set_tenant_retries(&tenant.id, RetriesSetting::Off)
        .await
        .unwrap();
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], None))
        .await
        .unwrap();
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let (delivery, attempts) = h
        .services
        .get_delivery(&tenant, &ingested.deliveries[0].id)
        .await
        .unwrap();
    assert_eq!((delivery.status, attempts.len()), (DeliveryStatus::Dead, 1));
}

#[tokio::test]
async fn given_an_endpoint_answering_410_then_the_delivery_dies_and_the_subscription_is_disabled() {
    let h = Harness::new(ScriptedSender::always(410));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(&tenant, new_sub("https://gone.example.com/", &["*"], None))
        .await
        .unwrap()
        .subscription;
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let sub = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert_eq!(sub.status, SubscriptionStatus::Disabled);
    assert!(h
        .services
        .ingest(&tenant, event("invoice.paid"), None)
        .await
        .unwrap()
        .deliveries
        .is_empty());
}

#[tokio::test]
async fn given_many_deaths_for_one_owner_in_a_batch_then_one_digest_email() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![])))
        .await
        .unwrap();
    for _ in 0..5 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    h.drain_now().await;
    let sent = h.mailer.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].subject.contains("5 webhook deliveries failed"),
        "{}",
        sent[0].subject
    );
}

#[tokio::test]
async fn given_two_tenants_then_neither_reads_or_replays_the_others_deliveries() {
    let h = Harness::new(ScriptedSender::always(500));
    let (alice, _) = h.tenant("alice@example.com").await;
    let (bob, _) = h.tenant("bob@example.com").await;
    h.services
        .create_subscription(&alice, new_sub("https://a.example.com/", &["*"], Some(vec![])))
        .await
        .unwrap();
    let ingested = h.services.ingest(&alice, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let id = &ingested.deliveries[0].id;
    assert!(matches!(
        h.services.get_delivery(&bob, id).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        h.services.replay_delivery(&bob, id).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        h.services.get_event(&bob, &ingested.event.id).await,
        Err(Error::NotFound { .. })
    ));
    let page = h
        .services
        .list_deliveries(&bob, DeliveryQuery::default())
        .await
        .unwrap();
    assert!(page.items.is_empty());
}

#[tokio::test]
async fn given_a_key_not_of_the_api_key_form_then_it_is_refused_without_a_lookup() {
    use std::sync::atomic::Ordering::SeqCst;
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, key) = h.tenant("owner@example.com").await;
    let reads = || h.store.api_key_reads.load(SeqCst);
    let before = reads();
    for junk in [
        "",
        "hwk_wrong",
        "Bearer",
        &key[4..],
        &format!("{key}+"),
        &format!("{key}{key}"),
    ] {
        assert!(
            matches!(h.services.authenticate(junk).await, Err(Error::Unauthorized)),
            "{junk:?}"
        );
    }
    assert_eq!(reads(), before, "a malformed key reached the store");
    // A key of the right form that no tenant holds is looked up, and refused.
    let unknown = hookwise_core::auth::generate_api_key(&mut rand::rng());
    assert!(matches!(
        h.services.authenticate(&unknown).await,
        Err(Error::Unauthorized)
    ));
    assert_eq!(reads(), before + 1);
    assert_eq!(h.services.authenticate(&key).await.unwrap().id, tenant.id);
}

#[tokio::test]
async fn given_a_webhook_then_it_carries_standard_webhooks_headers_that_verify() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, key) = h.tenant("owner@example.com").await;
    assert_eq!(h.services.authenticate(&key).await.unwrap().id, tenant.id);
    assert!(matches!(
        h.services.authenticate("hwk_wrong").await,
        Err(Error::Unauthorized)
    ));
    let made = h
        .services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], None))
        .await
        .unwrap();
    let sub = made.subscription;
    assert_eq!(sub.secret.plain(), None, "stored sealed");
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let req = h.sender.requests.lock().unwrap()[0].clone();
    let header = |req: &hookwise_core::ports::WebhookRequest, name: &str| {
        req.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(header(&req, "webhook-id"), ingested.event.id.as_str());
    assert_eq!(header(&req, "idempotency-key"), ingested.event.id.as_str());
    let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(body["type"], "invoice.paid");
    assert_eq!(body["data"], serde_json::json!({"amount": 42}));
    let verifies = |req: &hookwise_core::ports::WebhookRequest, secret: &Secret| {
        signing::verify(
            secret,
            &header(req, "webhook-id"),
            &header(req, "webhook-timestamp"),
            &header(req, "webhook-signature"),
            &req.body,
            h.clock.now().timestamp(),
            300,
        )
        .is_ok()
    };
    assert!(verifies(&req, &made.secret));

    // A rotation moves the sealed secret aside without opening it; both sign during the grace
    // period, the new one alone after it.
    let opens = h.secrets.opens.load(std::sync::atomic::Ordering::SeqCst);
    let rotated = h.services.rotate_secret(&tenant, &sub.id).await.unwrap();
    assert_eq!(
        h.secrets.opens.load(std::sync::atomic::Ordering::SeqCst),
        opens,
        "rotation opened a secret"
    );
    assert_ne!(rotated.secret, made.secret);
    assert_eq!(rotated.subscription.previous_secret.as_ref(), Some(&sub.secret));
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let req = h.sender.requests.lock().unwrap()[1].clone();
    assert!(verifies(&req, &made.secret) && verifies(&req, &rotated.secret));
    h.clock.advance(Duration::hours(25));
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let req = h.sender.requests.lock().unwrap()[2].clone();
    assert!(!verifies(&req, &made.secret) && verifies(&req, &rotated.secret));
}

#[tokio::test]
async fn given_a_deployment_that_reveals_secrets_then_the_current_secret_is_shown_again_else_refused() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let made = h
        .services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], None))
        .await
        .unwrap();
    let err = h
        .services
        .reveal_secret(&tenant, &made.subscription.id)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Forbidden { code: "secrets_not_revealed", message } if message.contains("rotate")),
        "{err:?}"
    );

    let config = Config {
        reveal_secrets: true,
        ..Config::default()
    };
    let h = Harness::with_config(ScriptedSender::always(200), config, 900);
    let (tenant, _) = h.tenant("owner@example.com").await;
    let (other, _) = h.tenant("other@example.com").await;
    let made = h
        .services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], None))
        .await
        .unwrap();
    let id = made.subscription.id.clone();
    let opens = h.secrets.opens.load(std::sync::atomic::Ordering::SeqCst);
    let shown = h.services.reveal_secret(&tenant, &id).await.unwrap();
    assert_eq!(shown.secret, made.secret);
    assert_eq!(
        h.secrets.opens.load(std::sync::atomic::Ordering::SeqCst),
        opens + 1,
        "opened by the keeper"
    );
    let rotated = h.services.rotate_secret(&tenant, &id).await.unwrap();
    assert_eq!(
        h.services.reveal_secret(&tenant, &id).await.unwrap().secret,
        rotated.secret,
        "the current one"
    );
    assert!(matches!(
        h.services.reveal_secret(&other, &id).await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn given_a_test_send_then_only_that_subscription_gets_it_flagged_as_a_test_through_the_pipeline() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let orders = h
        .services
        .create_subscription(&tenant, new_sub("https://orders.example.com/", &["order.*"], None))
        .await
        .unwrap()
        .subscription;
    h.services
        .create_subscription(&tenant, new_sub("https://all.example.com/", &["*"], None))
        .await
        .unwrap();

    // A ping, though the subscription wants only order.* and another wants everything.
    let sent = h.services.send_test(&tenant, &orders.id, None, None).await.unwrap();
    assert!(sent.event.test);
    assert_eq!(sent.event.event_type.as_str(), hookwise_core::services::PING);
    assert_eq!(sent.deliveries.len(), 1);
    assert_eq!(sent.deliveries[0].subscription_id, orders.id);
    assert!(sent.deliveries[0].test);
    h.drain_now().await;
    let requests = h.sender.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "to that subscription alone");
    assert_eq!(requests[0].url.as_str(), "https://orders.example.com/");
    let body: serde_json::Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(body["test"], true);
    assert_eq!(body["type"], "hookwise.ping");
    assert_eq!(body["data"]["subscription_id"], orders.id.as_str());
    let delivered = h.services.get_delivery(&tenant, &sent.deliveries[0].id).await.unwrap();
    assert_eq!(delivered.0.status, DeliveryStatus::Delivered);

    // An event of the caller's choosing; an ordinary event's envelope carries no flag.
    let invoice = event("invoice.paid");
    let chosen = h
        .services
        .send_test(&tenant, &orders.id, Some(invoice.event_type), Some(invoice.payload))
        .await
        .unwrap();
    assert_eq!(chosen.event.event_type.as_str(), "invoice.paid");
    h.services.ingest(&tenant, event("order.created"), None).await.unwrap();
    h.drain_now().await;
    let bodies: Vec<serde_json::Value> = h.sender.requests.lock().unwrap()[1..]
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert_eq!(bodies.len(), 3, "the chosen test, and the event to both subscriptions");
    assert_eq!(bodies.iter().filter(|b| b.get("test").is_some()).count(), 1);

    // A paused subscription is not sent a test; another tenant's is not found.
    let patch = hookwise_core::services::SubscriptionPatch {
        status: Some(SubscriptionStatus::Disabled),
        ..Default::default()
    };
    h.services
        .update_subscription(&tenant, &orders.id, patch)
        .await
        .unwrap();
    assert!(matches!(
        h.services.send_test(&tenant, &orders.id, None, None).await,
        Err(Error::Conflict(_))
    ));
    let (other, _) = h.tenant("other@example.com").await;
    assert!(matches!(
        h.services.send_test(&other, &orders.id, None, None).await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn given_a_content_filter_then_an_event_it_does_not_match_creates_no_delivery_for_it() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let mut euro = new_sub("https://euro.example.com/", &["invoice.*"], None);
    euro.filter = Some(
        hookwise_core::filter::ContentFilter::parse(serde_json::json!({
            "data": {"currency": ["EUR"], "amount": [{"numeric": [">=", 100]}]}
        }))
        .unwrap(),
    );
    let euro = h
        .services
        .create_subscription(&tenant, euro)
        .await
        .unwrap()
        .subscription;
    h.services
        .create_subscription(&tenant, new_sub("https://all.example.com/", &["*"], None))
        .await
        .unwrap();
    let invoice = |currency: &str, amount: u32| NewEvent {
        event_type: EventType::parse("invoice.paid").unwrap(),
        payload: serde_json::json!({"currency": currency, "amount": amount}),
    };
    let to_euro = |ingested: &hookwise_core::services::Ingested| {
        ingested
            .deliveries
            .iter()
            .filter(|d| d.subscription_id == euro.id)
            .count()
    };
    let big = h.services.ingest(&tenant, invoice("EUR", 150), None).await.unwrap();
    assert_eq!((to_euro(&big), big.deliveries.len()), (1, 2));
    let small = h.services.ingest(&tenant, invoice("EUR", 99), None).await.unwrap();
    assert_eq!(
        (to_euro(&small), small.deliveries.len()),
        (0, 1),
        "no delivery is made for it"
    );
    let dollars = h.services.ingest(&tenant, invoice("USD", 500), None).await.unwrap();
    assert_eq!(to_euro(&dollars), 0);

    // Removed with `null`: every invoice again.
    let patch: hookwise_core::services::SubscriptionPatch =
        serde_json::from_value(serde_json::json!({"filter": null})).unwrap();
    h.services.update_subscription(&tenant, &euro.id, patch).await.unwrap();
    let after = h.services.ingest(&tenant, invoice("USD", 5), None).await.unwrap();
    assert_eq!(to_euro(&after), 1);
}

#[tokio::test]
async fn given_custom_headers_then_every_post_carries_them_and_a_sensitive_one_is_stored_sealed() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let mut new = new_sub("https://a.example.com/", &["*"], None);
    new.headers = Some(
        serde_json::from_value(serde_json::json!({
            "X-Env": "prod",
            "Authorization": {"value": "Bearer s3cr3t-token", "sensitive": true}
        }))
        .unwrap(),
    );
    let sub = h.services.create_subscription(&tenant, new).await.unwrap().subscription;
    let stored = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert!(
        !serde_json::to_string(&stored).unwrap().contains("s3cr3t"),
        "sealed at rest"
    );
    assert_eq!(stored.headers.iter().filter(|h| h.is_sensitive()).count(), 1);

    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let sent = h.sender.requests.lock().unwrap()[0].clone();
    let header = |name: &str| sent.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(header("x-env").as_deref(), Some("prod"));
    assert_eq!(
        header("authorization").as_deref(),
        Some("Bearer s3cr3t-token"),
        "opened to send"
    );
    assert_eq!(
        header("content-type").as_deref(),
        Some("application/json"),
        "Hookwise's own stay"
    );

    // The headers a customer reads back for that attempt: the sensitive value masked.
    let (delivery, attempts) = h
        .services
        .get_delivery(&tenant, &ingested.deliveries[0].id)
        .await
        .unwrap();
    let shown = h.services.attempt_headers(&delivery, &attempts).await.unwrap().unwrap();
    let shown: Vec<_> = shown[0].iter().filter(|(n, _)| n == "authorization").collect();
    assert_eq!(
        shown,
        [&("authorization".to_owned(), hookwise_core::model::MASKED.to_owned())]
    );

    // A PATCH that names the sensitive header without a value keeps it; a header left out goes.
    let patch: hookwise_core::services::SubscriptionPatch = serde_json::from_value(
        serde_json::json!({"headers": {"authorization": {"sensitive": true}, "x-region": "eu"}}),
    )
    .unwrap();
    let changed = h.services.update_subscription(&tenant, &sub.id, patch).await.unwrap();
    let names: Vec<&str> = changed.headers.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["authorization", "x-region"]);
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let sent = h.sender.requests.lock().unwrap()[1].clone();
    assert!(sent
        .headers
        .contains(&("authorization".into(), "Bearer s3cr3t-token".into())));
    assert!(!sent.headers.iter().any(|(n, _)| n == "x-env"));

    // A new value for a sensitive header stays sealed, unless the caller says otherwise.
    let patch: hookwise_core::services::SubscriptionPatch =
        serde_json::from_value(serde_json::json!({"headers": {"authorization": "Bearer rotated", "x-region": "eu"}}))
            .unwrap();
    let changed = h.services.update_subscription(&tenant, &sub.id, patch).await.unwrap();
    assert!(changed
        .headers
        .iter()
        .any(|h| h.name.as_str() == "authorization" && h.is_sensitive()));
    assert!(!serde_json::to_string(&changed).unwrap().contains("rotated"));

    // Moving the endpoint to another host needs each sensitive value given again: else its
    // holder could read it at a host of its own.
    let moved: hookwise_core::services::SubscriptionPatch =
        serde_json::from_value(serde_json::json!({"url": "https://elsewhere.example.net/"})).unwrap();
    let err = h
        .services
        .update_subscription(&tenant, &sub.id, moved)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Validation(v) if v.code == "sensitive_header_needs_value"),
        "{err:?}"
    );
    let same_host: hookwise_core::services::SubscriptionPatch =
        serde_json::from_value(serde_json::json!({"url": "https://a.example.com/other-path"})).unwrap();
    h.services
        .update_subscription(&tenant, &sub.id, same_host)
        .await
        .unwrap();
    let moved_with_value: hookwise_core::services::SubscriptionPatch = serde_json::from_value(serde_json::json!({
        "url": "https://elsewhere.example.net/",
        "headers": {"authorization": {"value": "Bearer for-elsewhere"}, "x-region": "eu"}
    }))
    .unwrap();
    let moved = h
        .services
        .update_subscription(&tenant, &sub.id, moved_with_value)
        .await
        .unwrap();
    assert!(moved
        .headers
        .iter()
        .all(|h| h.name.as_str() != "authorization" || h.is_sensitive()));

    // Refused: Hookwise's own names, a value without one to keep, too many, a line break.
    for bad in [
        serde_json::json!({"Content-Type": "text/plain"}),
        serde_json::json!({"webhook-id": "x"}),
        serde_json::json!({"x-new": {"sensitive": true}}),
        serde_json::json!({"x-a": "1\r\nx-injected: 1"}),
        serde_json::json!({"X-A": "1", "x-a": "2"}),
        serde_json::Value::Object((0..21).map(|i| (format!("x-{i}"), serde_json::json!("v"))).collect()),
    ] {
        let patch: hookwise_core::services::SubscriptionPatch =
            serde_json::from_value(serde_json::json!({ "headers": bad })).unwrap();
        let err = h
            .services
            .update_subscription(&tenant, &sub.id, patch)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Validation(v) if v.code == "invalid_header"),
            "{bad}: {err:?}"
        );
    }
}

#[tokio::test]
async fn given_bad_input_then_validation_errors_name_the_problem() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let not_object = NewEvent {
        event_type: EventType::parse("a.b").unwrap(),
        payload: serde_json::json!([1]),
    };
    assert!(
        matches!(h.services.ingest(&tenant, not_object, None).await, Err(Error::Validation(v)) if v.code == "invalid_payload")
    );
    let mut bad = new_sub("https://a.example.com/", &["*"], None);
    bad.timeout_ms = Some(0);
    assert!(
        matches!(h.services.create_subscription(&tenant, bad).await, Err(Error::Validation(v)) if v.code == "invalid_timeout")
    );
    let none = new_sub("https://a.example.com/", &[], None);
    assert!(
        matches!(h.services.create_subscription(&tenant, none).await, Err(Error::Validation(v)) if v.code == "invalid_event_types")
    );
    let parsed = serde_json::from_value::<NewSubscription>(serde_json::json!({"url": "not a url"}));
    assert!(parsed.unwrap_err().to_string().contains("not a valid endpoint URL"));
}

#[tokio::test]
async fn given_a_429_with_retry_after_then_the_retry_waits_as_asked() {
    let h = Harness::new(ScriptedSender::new(|_, _| SendOutcome {
        retry_after: Some(120.0),
        ..status_outcome(429)
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], Some(vec![10, 600])))
        .await
        .unwrap();
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let start = h.clock.now();
    h.drain_now().await;
    let (delivery, _) = h
        .services
        .get_delivery(&tenant, &ingested.deliveries[0].id)
        .await
        .unwrap();
    assert_eq!(delivery.next_attempt_at, Some(start + Duration::seconds(120)));
}

#[tokio::test]
async fn given_the_dead_letter_hand_off_fails_once_then_the_redelivered_message_hands_it_on() {
    use std::sync::atomic::Ordering;
    // Once after an attempt (the schedule ran out), once without one (the subscription is gone).
    for abandon in [false, true] {
        let h = Harness::new(ScriptedSender::always(500));
        let (tenant, sub) = subscribed(&h, "https://down.example.com/", Some(vec![])).await;
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
        if abandon {
            h.services.delete_subscription(&tenant, &sub.id).await.unwrap();
        }
        let task = h.queue.take_visible().remove(0);
        h.queue.failing_dead_letters.store(1, Ordering::SeqCst);
        assert!(
            h.services.deliver(&task).await.is_err(),
            "the failed hand-off redelivers the message"
        );
        assert!(h.queue.take_dead().is_empty());

        // The queue sends the message again: the delivery is dead already, the hand-off is not.
        assert_eq!(h.services.deliver(&task).await.unwrap(), DeliverOutcome::Stale);
        assert_eq!(h.queue.take_dead().len(), 1, "handed on at last (abandoned: {abandon})");
    }
}

#[tokio::test]
async fn given_a_410_whose_disabling_fails_once_then_the_redelivered_message_disables_the_subscription() {
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::always(410));
    let (tenant, sub) = subscribed(&h, "https://gone.example.com/", None).await;
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let task = h.queue.take_visible().remove(0);
    h.store.failing_subscription_writes.store(1, Ordering::SeqCst);
    assert!(h.services.deliver(&task).await.is_err());
    assert_eq!(
        h.services.get_subscription(&tenant, &sub.id).await.unwrap().status,
        SubscriptionStatus::Active
    );

    assert_eq!(h.services.deliver(&task).await.unwrap(), DeliverOutcome::Stale);
    assert_eq!(
        h.services.get_subscription(&tenant, &sub.id).await.unwrap().status,
        SubscriptionStatus::Disabled
    );
    assert_eq!(
        h.sender.requests.lock().unwrap().len(),
        1,
        "one POST: the redelivery only finishes the job"
    );
    assert_eq!(h.queue.take_dead().len(), 1);
}

#[tokio::test]
async fn given_a_retention_shorter_than_a_policy_can_retry_then_the_policy_is_refused_on_create_and_patch() {
    let config = Config {
        retention: Some(std::time::Duration::from_secs(30 * 86_400)),
        ..Config::default()
    };
    let h = Harness::with_config(ScriptedSender::always(200), config, 900);
    let (tenant, _) = h.tenant("owner@example.com").await;
    // 20 days, then 15 that Retry-After can raise to the policy's longest, 20: 40 days > 30.
    let err = h
        .services
        .create_subscription(
            &tenant,
            new_sub("https://a.example.com/", &["*"], Some(vec![20 * 86_400, 15 * 86_400])),
        )
        .await
        .unwrap_err();
    let Error::Validation(v) = err else { panic!("{err:?}") };
    assert_eq!(v.code, "retry_policy_exceeds_retention");
    assert!(
        v.message.contains("40.0 days") && v.message.contains("30.0 days"),
        "{}",
        v.message
    );

    let sub = h
        .services
        .create_subscription(&tenant, new_sub("https://a.example.com/", &["*"], None))
        .await
        .unwrap()
        .subscription;
    let patch = serde_json::from_value(serde_json::json!({"retry_policy": {"schedule_seconds": [2_592_000]}})).unwrap();
    let err = h
        .services
        .update_subscription(&tenant, &sub.id, patch)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Validation(ref v) if v.code == "retry_policy_exceeds_retention"),
        "{err:?}"
    );
}

#[tokio::test]
async fn given_the_same_task_twice_in_one_batch_then_one_post_is_made() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", None).await;
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let task = h.queue.take_visible().remove(0);

    /// Answers 200 after a pause, so the batch's deliveries run side by side.
    #[derive(Default)]
    struct SlowSender(std::sync::atomic::AtomicUsize);
    #[async_trait::async_trait]
    impl hookwise_core::ports::Sender for SlowSender {
        async fn send(&self, _request: hookwise_core::ports::WebhookRequest) -> SendOutcome {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            status_outcome(200)
        }
    }
    let sender = std::sync::Arc::new(SlowSender::default());
    let ports = hookwise_core::services::Ports {
        sender: sender.clone(),
        ..h.services.ports().clone()
    };
    let services =
        hookwise_core::services::Services::new(ports, Config::default(), rand::SeedableRng::seed_from_u64(1));
    let results = services.deliver_batch(&[task.clone(), task]).await;
    assert!(
        matches!(results[..], [Ok(DeliverOutcome::Delivered), Ok(DeliverOutcome::Stale)]),
        "{results:?}"
    );
    assert_eq!(sender.0.load(std::sync::atomic::Ordering::SeqCst), 1, "one POST");
}

#[tokio::test]
async fn given_one_owners_email_is_refused_then_the_others_are_told_and_it_is_told_on_the_retry_once() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    for owner in ["a@example.com", "b@example.com"] {
        let mut sub = new_sub("https://down.example.com/", &["*"], Some(vec![]));
        sub.owner_email = Some(Email::parse(owner).unwrap());
        h.services.create_subscription(&tenant, sub).await.unwrap();
    }
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let tasks = h.queue.take_visible();
    h.services.deliver_batch(&tasks).await.into_iter().for_each(|r| {
        r.unwrap();
    });
    let dead = h.queue.take_dead();
    assert_eq!(dead.len(), 2);

    h.mailer.refusing_once.lock().unwrap().insert("a@example.com".into());
    let report = h.services.handle_dead_letters(&dead).await.unwrap();
    assert_eq!(
        (report.queued, report.emails),
        (2, 1),
        "both notices are kept, whatever became of the emails"
    );
    let to = |h: &Harness| {
        h.mailer
            .sent
            .lock()
            .unwrap()
            .iter()
            .map(|m| m.to.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(to(&h), ["b@example.com"], "b is told although a's email failed");

    // a's email is tried again after a window (so owners whose emails keep failing do not
    // take the others' places tick after tick); then a is told, and b not twice; nor does
    // the same batch again.
    assert_eq!(h.services.run_scheduler().await.unwrap().emails, 0, "held back");
    h.clock.advance(Duration::minutes(5));
    let tick = h.services.run_scheduler().await.unwrap();
    assert_eq!(tick.emails, 1);
    assert_eq!(to(&h), ["b@example.com", "a@example.com"]);
    let report = h.services.handle_dead_letters(&dead).await.unwrap();
    assert_eq!((report.queued, report.emails), (0, 0));
    h.clock.advance(Duration::minutes(10));
    assert_eq!(h.services.run_scheduler().await.unwrap().emails, 0);
    assert_eq!(to(&h).len(), 2);
}

/// A delivery whose attempt 1 failed and whose retry could not be queued (its queueing,
/// before the attempt's write, failed): the attempt is recorded all the same, left to the
/// sweep, and its message (`m-1`, received once) is to come back. The harness, the delivery
/// and that message's task.
async fn retry_not_queued() -> (Harness, Delivery, DeliveryTask) {
    use hookwise_core::services::{Disposition, QueueRole};
    use std::sync::atomic::Ordering;
    let h = Harness::new(first_fails());
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![10])).await;
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let d = ingested.deliveries[0].clone();
    let task = h.queue.take_visible().remove(0);
    h.queue.failing_enqueues.store(1, Ordering::SeqCst);
    assert_eq!(
        h.services
            .handle_messages(QueueRole::Delivery, &[received(&task, 1)], None)
            .await,
        vec![Disposition::Redeliver]
    );
    assert_eq!(h.store.attempts(&d.id).await.unwrap().len(), 1);
    assert_eq!(h.queue.pending(), 0, "the retry was not queued");
    (h, d, task)
}

/// `task`'s message, received for the `receive_count`-th time.
fn received(task: &DeliveryTask, receive_count: u32) -> hookwise_core::ports::QueueMessage {
    hookwise_core::ports::QueueMessage {
        message_id: "m-1".into(),
        task: Ok(task.clone()),
        redriven: false,
        receive_count,
    }
}

/// Attempts 1 (500) and 2 (200) made, one POST each.
async fn made_once_each(h: &Harness, d: &Delivery) {
    let attempts = h.store.attempts(&d.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| (a.attempt, a.status_code)).collect::<Vec<_>>(),
        vec![(1, Some(500)), (2, Some(200))]
    );
    assert_eq!(h.sender.requests.lock().unwrap().len(), 2, "one POST an attempt");
}

#[tokio::test]
async fn given_a_retry_that_could_not_be_queued_then_its_attempt_is_recorded_once_and_its_message_queues_it() {
    use hookwise_core::services::{Disposition, QueueRole};
    let (h, d, task) = retry_not_queued().await;
    let stored = h.store.get_delivery(&d.id).await.unwrap().unwrap();
    assert!(stored.is_swept(), "the sweep looks after it meanwhile: {stored:?}");

    // Back: stale, it queues the retry; attempt 1 is not made again.
    assert_eq!(
        h.services
            .handle_messages(QueueRole::Delivery, &[received(&task, 2)], None)
            .await,
        vec![Disposition::Done]
    );
    h.clock.advance(Duration::seconds(11));
    assert_eq!(h.drain_now().await, 1);
    made_once_each(&h, &d).await;
}

#[tokio::test]
async fn given_a_retry_that_could_not_be_queued_and_its_attempts_message_given_up_on_then_the_dead_letter_queues_the_retry(
) {
    // The message that was to queue the retry (above) never comes back: its receives failed
    // until the queue moved it to the dead-letter queue. The retry still goes at its time,
    // not once the sweep finds it overdue minutes later.
    let (h, d, task) = retry_not_queued().await;
    let report = h.services.handle_dead_letters(&[task]).await.unwrap();
    assert_eq!(report.rescheduled, 1);
    assert_eq!(h.queue.pending(), 1, "the retry is queued");
    h.clock.advance(Duration::seconds(9));
    assert_eq!(h.drain_now().await, 0, "not before its time");
    h.clock.advance(Duration::seconds(2));
    assert_eq!(h.drain_now().await, 1);
    made_once_each(&h, &d).await;
}

#[tokio::test]
async fn given_a_retry_queued_by_its_attempts_message_come_back_then_neither_another_copy_nor_the_dead_letter_queues_it_again(
) {
    // The message that queued the retry is received again (its ack failed), or given up on
    // by the queue: the retry is on its way, and a second would be two workers POSTing it.
    use hookwise_core::services::{Disposition, QueueRole};
    let (h, d, task) = retry_not_queued().await;
    assert_eq!(
        h.services
            .handle_messages(QueueRole::Delivery, &[received(&task, 2)], None)
            .await,
        vec![Disposition::Done]
    );
    assert_eq!(h.queue.pending(), 1, "the retry is queued");
    let stored = h.store.get_delivery(&d.id).await.unwrap().unwrap();
    assert!(!stored.is_swept(), "and recorded queued: {stored:?}");

    h.services
        .handle_messages(QueueRole::Delivery, &[received(&task, 3)], None)
        .await;
    let report = h
        .services
        .handle_dead_letters(std::slice::from_ref(&task))
        .await
        .unwrap();
    assert_eq!(report.rescheduled, 0);
    assert_eq!(h.queue.pending(), 1, "queued once");
    h.clock.advance(Duration::seconds(11));
    assert_eq!(h.drain_now().await, 1);
    made_once_each(&h, &d).await;
}

#[tokio::test]
async fn given_a_dead_letter_batch_with_a_retrys_message_ahead_of_its_attempts_then_the_attempts_own_is_rescheduled() {
    // A retry's message is queued before its attempt's write; when that write never landed,
    // both may reach the dead-letter queue together, the retry's first. It must not hide the
    // attempt's own message, the one that makes the attempt again.
    use std::sync::atomic::Ordering;
    let h = Harness::new(first_fails());
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![1])).await;
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let d = &ingested.deliveries[0];
    let first = h.queue.take_visible();
    h.store.failing_delivery_writes.store(1, Ordering::SeqCst);
    assert!(h.services.deliver_batch(&first).await[0].is_err());
    h.clock.advance(Duration::seconds(2));
    let ahead = h.queue.take_visible();
    assert_eq!(ahead.iter().map(|t| t.attempt).collect::<Vec<_>>(), vec![2]);
    h.services
        .handle_dead_letters(&[ahead[0].clone(), first[0].clone()])
        .await
        .unwrap();
    assert_eq!(h.drain_now().await, 1, "attempt 1's message, back on its schedule");
    h.clock.advance(Duration::seconds(5));
    h.drain_now().await;
    let stored = h.store.get_delivery(&d.id).await.unwrap().unwrap();
    assert_eq!(stored.status, DeliveryStatus::Delivered);
}

#[tokio::test]
async fn given_a_retrys_message_ahead_of_its_attempts_write_past_the_window_then_the_queue_redelivers_it() {
    // The write that would record the attempt before it never lands (its worker died), and
    // the retry's message keeps coming back: after WRITE_WINDOW it is an error, which the
    // queue redelivers until the dead-letter handler decides (no copy queued for ever).
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![1])).await;
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let first = h.queue.take_visible();
    h.store.failing_delivery_writes.store(1, Ordering::SeqCst);
    assert!(h.services.deliver_batch(&first).await[0].is_err());
    let mut copies = 0;
    let mut last = None;
    for _ in 0..60 {
        h.clock.advance(Duration::seconds(2));
        let tasks = h.queue.take_visible();
        if tasks.is_empty() {
            continue;
        }
        let results = h.services.deliver_batch(&tasks).await;
        match &results[..] {
            [Ok(DeliverOutcome::NotStoredYet)] => copies += 1,
            [result] => {
                last = Some(result.is_err());
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(copies >= 1, "it looked again first");
    assert_eq!(last, Some(true), "then an error, for the queue to redeliver");
}

#[tokio::test]
async fn given_a_retrys_message_that_comes_before_its_attempts_write_then_it_looks_again_and_the_retry_is_made_once() {
    // The retry is queued before the write that records the attempt deciding it. Here that
    // write fails: the attempt's own message comes back (and is made again, queueing its
    // retry anew), while the first retry's message, come before any write, looks again a
    // few times and is then dropped. Each attempt is recorded once, on schedule.
    use std::sync::atomic::Ordering;
    // Attempt 1 fails both times it is made; attempt 2 succeeds.
    let h = Harness::new(ScriptedSender::new(|_, n| {
        status_outcome(if n < 2 { 500 } else { 200 })
    }));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![1])).await;
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let d = &ingested.deliveries[0];
    let first = h.queue.take_visible();
    h.store.failing_delivery_writes.store(1, Ordering::SeqCst);
    let results = h.services.deliver_batch(&first).await;
    assert!(results[0].is_err(), "the attempt's write failed: {results:?}");
    assert_eq!(h.store.attempts(&d.id).await.unwrap().len(), 0);

    // The retry's message, before any write: it goes back to look again.
    h.clock.advance(Duration::seconds(2));
    let early = h.queue.take_visible();
    assert_eq!(early.iter().map(|t| t.attempt).collect::<Vec<_>>(), vec![2]);
    assert!(matches!(
        h.services.deliver_batch(&early).await[..],
        [Ok(DeliverOutcome::NotStoredYet)]
    ));
    // The attempt's own message, back: attempt 1 is made again and recorded, its retry queued.
    assert!(matches!(
        h.services.deliver_batch(&first).await[..],
        [Ok(DeliverOutcome::Retrying { .. })]
    ));
    // Both retry messages come: one makes attempt 2, the other is stale.
    h.clock.advance(Duration::seconds(5));
    assert_eq!(h.drain_now().await, 2);
    let attempts = h.store.attempts(&d.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| (a.attempt, a.status_code)).collect::<Vec<_>>(),
        vec![(1, Some(500)), (2, Some(200))]
    );
    assert_eq!(
        h.sender.requests.lock().unwrap().len(),
        3,
        "attempt 1 twice, attempt 2 once"
    );
    let stored = h.store.get_delivery(&d.id).await.unwrap().unwrap();
    assert_eq!(stored.status, DeliveryStatus::Delivered);
}

#[tokio::test]
async fn given_an_early_retrys_message_the_queue_lost_then_the_audit_queues_it_again_not_the_sweep() {
    let h = Harness::new(first_fails());
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![60])).await;
    assert_eq!(h.services.run_scheduler().await.unwrap().requeued, 0);
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let first = h.queue.take_visible();
    assert!(matches!(
        h.services.deliver_batch(&first).await[..],
        [Ok(DeliverOutcome::Retrying { .. })]
    ));
    // A purge: the retry's message, queued before the attempt's write, is gone. The delivery
    // has no entry for the sweep (it would only duplicate the message in a backlog).
    h.clock.advance(Duration::seconds(61));
    assert_eq!(h.queue.take_visible().len(), 1);
    let mut found = 0;
    for minute in 2..=80 {
        h.clock.advance(Duration::minutes(1));
        let report = h.services.run_scheduler().await.unwrap();
        assert_eq!(report.requeued, 0, "swept at minute {minute}");
        assert!(
            report.audited == 0 || minute >= 60,
            "audited at minute {minute}, before the hour"
        );
        found += report.audited;
    }
    assert_eq!(found, 1, "the lost retry queued again by the audit, once");
    h.drain_now().await;
    let d = &deliveries(&h, &tenant).await[0];
    assert_eq!(d.status, DeliveryStatus::Delivered);
}

#[tokio::test]
async fn given_a_handler_that_died_between_claiming_an_email_and_sending_it_then_a_later_tick_sends_it_once() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = subscribed(&h, "https://down.example.com/", Some(vec![])).await;
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let tasks = h.queue.take_visible();
    h.services.deliver_batch(&tasks).await.into_iter().for_each(|r| {
        r.unwrap();
    });
    let dead = h.queue.take_dead();
    // The first handler recorded the notice, claimed the owner's email, then died.
    h.mailer
        .refusing_once
        .lock()
        .unwrap()
        .insert("owner@example.com".into());
    h.services.handle_dead_letters(&dead).await.unwrap();
    h.clock.advance(Duration::minutes(5));
    let owner = Email::parse("owner@example.com").unwrap();
    let now = h.clock.now();
    let claim = h
        .store
        .claim_digest(&owner, now, now - Duration::minutes(5), now - Duration::minutes(1))
        .await
        .unwrap();
    assert!(claim.is_some(), "claimed by the handler that dies");

    // Soon after, the claim may still be sent by its holder: no email yet.
    h.clock.advance(Duration::seconds(10));
    assert_eq!(h.services.run_scheduler().await.unwrap().emails, 0);
    // Once the claim is stale it is taken over and the email goes, once.
    h.clock.advance(Duration::seconds(60));
    assert_eq!(h.services.run_scheduler().await.unwrap().emails, 1);
    h.clock.advance(Duration::minutes(10));
    assert_eq!(h.services.run_scheduler().await.unwrap().emails, 0, "sent: never again");
    h.services.handle_dead_letters(&dead).await.unwrap();
    assert_eq!(h.mailer.sent.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn given_deaths_through_a_storm_then_an_owner_gets_at_most_one_email_per_window_naming_them_all() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let storm = h
        .services
        .create_subscription(
            &tenant,
            new_sub("https://down.example.com/", &["invoice.*"], Some(vec![])),
        )
        .await
        .unwrap()
        .subscription;
    let mut other = new_sub("https://other.example.com/", &["other.*"], Some(vec![]));
    other.owner_email = Some(Email::parse("other@example.com").unwrap());
    h.services.create_subscription(&tenant, other).await.unwrap();
    let sent = |h: &Harness| h.mailer.sent.lock().unwrap().clone();
    let to = |h: &Harness, who: &str| sent(h).into_iter().filter(|m| m.to.as_str() == who).collect::<Vec<_>>();

    // The first death after a quiet spell is told at once.
    let first = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    assert_eq!(to(&h, "owner@example.com").len(), 1);
    assert!(to(&h, "owner@example.com")[0]
        .text
        .contains(first.deliveries[0].id.as_str()));

    // The deaths of the next minutes wait for the window; another owner's do not.
    let mut storm_ids = Vec::new();
    let storm_start = h.clock.now() + Duration::minutes(1);
    for minute in 1..=4 {
        h.clock.advance(Duration::minutes(1));
        for _ in 0..15 {
            let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
            storm_ids.push(ingested.deliveries[0].id.clone());
        }
        if minute == 2 {
            h.services.ingest(&tenant, event("other.thing"), None).await.unwrap();
        }
        h.drain_now().await;
        assert_eq!(
            to(&h, "owner@example.com").len(),
            1,
            "within the window at minute {minute}"
        );
    }
    assert_eq!(
        to(&h, "other@example.com").len(),
        1,
        "another owner's window is their own"
    );

    // Five minutes after the first email, one digest tells of all sixty.
    h.clock.advance(Duration::minutes(1));
    h.drain_now().await;
    let owner_emails = to(&h, "owner@example.com");
    assert_eq!(owner_emails.len(), 2);
    let digest = &owner_emails[1];
    assert!(
        digest.subject.contains("60 webhook deliveries failed"),
        "{}",
        digest.subject
    );
    let listed = storm_ids.iter().filter(|id| digest.text.contains(id.as_str())).count();
    assert_eq!(
        listed,
        hookwise_core::services::DIGEST_LISTED,
        "the first ones, one by one"
    );
    assert!(digest.text.contains("and 10 more"), "{}", digest.text);
    let recover = format!("/v1/subscriptions/{}/recover", storm.id);
    assert!(
        digest.text.contains(&recover),
        "how to replay them all:\n{}",
        digest.text
    );

    // The recover the email names replays every one of them.
    let since = digest
        .text
        .split("\"since\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a since in the recover command");
    let since = chrono::DateTime::parse_from_rfc3339(since)
        .unwrap()
        .with_timezone(&chrono::Utc);
    assert!(
        since <= storm_start,
        "{since} is after the storm began at {storm_start}"
    );
    let replayed = h
        .services
        .recover_subscription(&tenant, &storm.id, since)
        .await
        .unwrap();
    assert_eq!(replayed.len(), 60, "the storm's deaths, not the one told before");
}

/// The memory queue, with the `n`th enqueue failing, and how many deliveries were stored when
/// each enqueue came.
struct NthEnqueueFails {
    queue: std::sync::Arc<dyn hookwise_core::ports::DeliveryQueue>,
    store: std::sync::Arc<dyn Store>,
    tenant: TenantId,
    n: usize,
    stored_at_each: std::sync::Mutex<Vec<usize>>,
}

#[async_trait::async_trait]
impl hookwise_core::ports::DeliveryQueue for NthEnqueueFails {
    fn max_delay_seconds(&self) -> u32 {
        self.queue.max_delay_seconds()
    }
    async fn enqueue(&self, tasks: &[(DeliveryTask, u32)]) -> hookwise_core::ports::PortResult<()> {
        let stored = self
            .store
            .list_deliveries(
                &self.tenant,
                &DeliveryQuery {
                    limit: 100,
                    ..Default::default()
                },
            )
            .await?
            .items
            .len();
        let calls = {
            let mut seen = self.stored_at_each.lock().unwrap();
            seen.push(stored);
            seen.len()
        };
        if calls == self.n {
            return Err(hookwise_core::error::PortError::retryable("enqueue", "unavailable"));
        }
        self.queue.enqueue(tasks).await
    }
    async fn dead_letter(&self, tasks: &[DeliveryTask]) -> hookwise_core::ports::PortResult<()> {
        self.queue.dead_letter(tasks).await
    }
}

#[tokio::test]
async fn given_a_batch_of_25_then_its_first_attempts_are_queued_ten_at_a_time_each_ten_before_it_is_stored_and_a_failed_enqueue_stores_nothing_after_it(
) {
    // A message waits for its own event's write, not the whole batch's: the first ten are
    // queued, then stored, then the next ten queued... The second enqueue fails: the first
    // ten are stored and delivered, the other fifteen get the error, stored not at all.
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", None).await;
    let mut ports = h.services.ports().clone();
    let queue = std::sync::Arc::new(NthEnqueueFails {
        queue: ports.queue.clone(),
        store: ports.store.clone(),
        tenant: tenant.id.clone(),
        n: 2,
        stored_at_each: Default::default(),
    });
    ports.queue = queue.clone();
    let services =
        hookwise_core::services::Services::new(ports, Default::default(), rand::SeedableRng::seed_from_u64(3));
    let batch = (0..25)
        .map(|n| (event("invoice.paid"), Some(format!("k-{n}"))))
        .collect();
    let results = services.ingest_batch(&tenant, batch).await.unwrap();

    assert_eq!(
        *queue.stored_at_each.lock().unwrap(),
        vec![0, 10],
        "each ten queued before it is stored"
    );
    assert!(
        results[..10].iter().all(|r| r.as_ref().is_ok_and(|i| i.created)),
        "{results:?}"
    );
    assert!(
        results[10..]
            .iter()
            .all(|r| r.as_ref().is_err_and(|e| e.is_retryable())),
        "{results:?}"
    );
    let stored = h
        .store
        .list_deliveries(
            &tenant.id,
            &DeliveryQuery {
                limit: 100,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(stored.items.len(), 10, "nothing after the failed enqueue is stored");
    assert_eq!(h.drain_now().await, 10);
}

#[tokio::test]
async fn given_a_batch_whose_enqueue_fails_then_nothing_is_stored_and_every_valid_event_gets_the_error() {
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", None).await;
    h.queue.failing_enqueues.store(1, Ordering::SeqCst);
    let results = h
        .services
        .ingest_batch(
            &tenant,
            vec![
                (event("invoice.paid"), Some("k-1".into())),
                (event("invoice.paid"), None),
                (
                    NewEvent {
                        event_type: EventType::parse("invoice.paid").unwrap(),
                        payload: serde_json::json!([1, 2]),
                    },
                    None,
                ),
            ],
        )
        .await
        .unwrap();
    // Queued before stored: a failed enqueue stores nothing, so a retry, keyed or not, is safe.
    assert!(results[0].as_ref().unwrap_err().is_retryable(), "{:?}", results[0]);
    assert!(results[1].as_ref().unwrap_err().is_retryable(), "{:?}", results[1]);
    let Err(Error::Validation(v)) = &results[2] else {
        panic!("{:?}", results[2])
    };
    assert_eq!(v.code, "invalid_payload", "an invalid event fails alone");
    assert_eq!(h.queue.pending(), 0, "nothing queued");
    let listed = h
        .services
        .list_deliveries(&tenant, DeliveryQuery::default())
        .await
        .unwrap();
    assert!(listed.items.is_empty(), "nothing stored: {listed:?}");

    let retry = h
        .services
        .ingest_batch(&tenant, vec![(event("invoice.paid"), Some("k-1".into()))])
        .await
        .unwrap();
    assert!(retry[0].as_ref().unwrap().created);
    assert_eq!(h.drain_now().await, 1);

    // An empty or oversized batch is refused whole.
    for n in [0, hookwise_core::services::MAX_BATCH + 1] {
        let batch = (0..n).map(|_| (event("invoice.paid"), None)).collect();
        let Err(Error::Validation(v)) = h.services.ingest_batch(&tenant, batch).await else {
            panic!("{n} events")
        };
        assert_eq!(v.code, "invalid_batch");
    }
}

#[tokio::test]
async fn given_a_subscription_deleted_by_another_process_then_it_receives_for_at_most_the_lookup_time_to_live() {
    use rand::SeedableRng;
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, sub) = subscribed(&h, "https://a.example.com/", None).await;
    let other = hookwise_core::services::Services::new(
        h.services.ports().clone(),
        Config::default(),
        rand::rngs::StdRng::seed_from_u64(9),
    );
    let posts = |h: &Harness| h.sender.requests.lock().unwrap().len();
    // This process has looked the subscription up; then another process deletes it.
    h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
    h.drain_now().await;
    assert_eq!(posts(&h), 1);
    other.delete_subscription(&tenant, &sub.id).await.unwrap();

    // Within the time to live this process still sends to it, as documented...
    h.clock.advance(Duration::seconds(29));
    let stale = h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
    assert_eq!(stale.deliveries.len(), 1);
    h.drain_now().await;
    assert_eq!(posts(&h), 2);
    // ...and not after it.
    h.clock.advance(Duration::seconds(2));
    let fresh = h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
    assert!(fresh.deliveries.is_empty(), "{:?}", fresh.deliveries);

    // What this process writes itself it sees at once.
    let mine = h
        .services
        .create_subscription(&tenant, new_sub("https://b.example.com/", &["*"], None))
        .await
        .unwrap()
        .subscription;
    assert_eq!(
        h.services
            .ingest(&tenant, event("a.b"), None)
            .await
            .unwrap()
            .deliveries
            .len(),
        1
    );
    h.services.delete_subscription(&tenant, &mine.id).await.unwrap();
    assert!(h
        .services
        .ingest(&tenant, event("a.b"), None)
        .await
        .unwrap()
        .deliveries
        .is_empty());
    h.drain_now().await;
    assert_eq!(
        posts(&h),
        2,
        "the delivery to the deleted subscription is abandoned, not sent"
    );
}

#[tokio::test]
async fn given_a_burst_of_attempts_then_endpoint_health_is_saved_every_few_seconds_with_every_sample() {
    use hookwise_core::services::HEALTH_SAVE_EVERY;
    use rand::SeedableRng;
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, sub) = subscribed(&h, "https://a.example.com/", None).await;
    let stored = |h: &Harness| {
        let store = h.store.clone();
        let id = sub.id.clone();
        async move { store.endpoint_health(&id).await.unwrap().samples.len() }
    };
    for _ in 0..10 {
        h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
    }
    h.drain_now().await;
    assert_eq!(stored(&h).await, 1, "the first sample is saved at once, the rest wait");
    let overview = h.services.subscription_overview(&tenant, &sub.id).await.unwrap();
    assert_eq!(overview.health, Some(1.0), "this process sees its own samples");

    // The next attempt after the interval saves them all.
    h.clock.advance(Duration::from_std(HEALTH_SAVE_EVERY).unwrap());
    h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
    h.drain_now().await;
    assert_eq!(stored(&h).await, 11);

    // Another process adds its samples to the stored ones rather than replacing them.
    let other = hookwise_core::services::Services::new(
        h.services.ports().clone(),
        Config::default(),
        rand::rngs::StdRng::seed_from_u64(9),
    );
    let task_for_other = {
        h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
        h.queue.take_visible()
    };
    for r in other.deliver_batch(&task_for_other).await {
        r.unwrap();
    }
    assert_eq!(stored(&h).await, 12);
}

/// A retry due later than `Delivery::QUEUED_RETRY_HORIZON` after its delivery's creation: the
/// sweep looks after it (an earlier one is the audit's).
const LATE_RETRY: u64 = 25 * 60;

/// One subscription with a retry after [`LATE_RETRY`], whose first attempt fails and whose
/// retry's message is then lost (it waits in the scheduler table, the queue's delays being
/// shorter), the clock moved to its due time.
async fn a_late_retry_whose_message_is_lost(h: &Harness, tenant: &Tenant, events: usize) {
    for _ in 0..events {
        h.services.ingest(tenant, event("invoice.paid"), None).await.unwrap();
    }
    let first = h.queue.take_visible();
    for r in h.services.deliver_batch(&first).await {
        assert!(matches!(r.unwrap(), DeliverOutcome::Retrying { .. }));
    }
    let lost = std::mem::take(&mut *h.scheduler.items.lock().unwrap());
    assert_eq!(lost.len(), first.len(), "each retry scheduled, then lost");
    h.clock.advance(Duration::seconds(LATE_RETRY as i64));
}

fn first_fails() -> ScriptedSender {
    ScriptedSender::new(|_, n| status_outcome(if n == 0 { 500 } else { 200 }))
}

#[tokio::test]
async fn given_a_backlog_older_than_the_grace_then_the_sweep_requeues_a_retry_once_until_its_message_had_time() {
    let h = Harness::new(first_fails());
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![LATE_RETRY])).await;
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let first = h.queue.take_visible();
    h.services.deliver_batch(&first).await.into_iter().for_each(|r| {
        r.unwrap();
    });
    // The retry's message waits behind a backlog: nobody takes it.
    h.clock
        .advance(Duration::seconds(LATE_RETRY as i64) + Duration::minutes(7));
    assert_eq!(h.services.run_scheduler().await.unwrap().requeued, 1);
    for _ in 0..6 {
        h.clock.advance(Duration::minutes(5));
        assert_eq!(
            h.services.run_scheduler().await.unwrap().requeued,
            0,
            "re-queued again before its message could have been handled"
        );
    }
    h.clock.advance(Duration::minutes(6));
    assert_eq!(
        h.services.run_scheduler().await.unwrap().requeued,
        1,
        "and again once it could have"
    );
    assert_eq!(h.queue.take_visible().len(), 3);
}

#[tokio::test]
async fn given_more_stranded_retries_than_a_page_then_one_tick_requeues_them_all() {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    for i in 0..12 {
        h.services
            .create_subscription(
                &tenant,
                without_breaker(new_sub(
                    &format!("https://a{i}.example.com/"),
                    &["*"],
                    Some(vec![LATE_RETRY]),
                )),
            )
            .await
            .unwrap();
    }
    a_late_retry_whose_message_is_lost(&h, &tenant, 100).await;
    h.clock.advance(Duration::minutes(6));
    assert_eq!(h.services.run_scheduler().await.unwrap().requeued, 1200);
    assert_eq!(h.queue.take_visible().len(), 1200);
    assert_eq!(h.services.run_scheduler().await.unwrap().requeued, 0);
}

#[tokio::test]
async fn given_a_late_retrys_lost_message_then_the_sweep_queues_it() {
    let h = Harness::new(first_fails());
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![LATE_RETRY])).await;
    a_late_retry_whose_message_is_lost(&h, &tenant, 1).await;
    let delivery = deliveries(&h, &tenant).await[0].clone();
    h.clock.advance(Duration::minutes(6));
    assert_eq!(h.services.run_scheduler().await.unwrap().requeued, 1);
    assert_eq!(
        h.services.run_scheduler().await.unwrap().requeued,
        0,
        "not again until overdue again"
    );
    h.drain_now().await;
    assert_eq!(
        h.services.get_delivery(&tenant, &delivery.id).await.unwrap().0.status,
        DeliveryStatus::Delivered
    );
}

#[tokio::test]
async fn given_first_attempts_whose_messages_the_queue_lost_then_the_audit_queues_them_again_once_an_hour_on() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", None).await;
    // The scheduler ticks as it does, every minute, from before the ingest.
    assert_eq!(h.services.run_scheduler().await.unwrap().requeued, 0);
    for _ in 0..3 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    // A Deliver outage longer than the queue's retention, or a purge: the messages are gone.
    assert_eq!(h.queue.take_visible().len(), 3);
    let mut requeued = 0;
    for minute in 1..=80 {
        h.clock.advance(Duration::minutes(1));
        let report = h.services.run_scheduler().await.unwrap();
        assert!(
            report.audited == 0 || minute > 60,
            "queued again at minute {minute}, before the audit's hour: a backlog would get duplicates"
        );
        requeued += report.audited + report.requeued;
    }
    assert_eq!(requeued, 3, "each lost first attempt queued again, once");
    assert_eq!(h.drain_now().await, 3);
    let deliveries = deliveries(&h, &tenant).await;
    assert!(deliveries.iter().all(|d| d.status == DeliveryStatus::Delivered));
    assert_eq!(h.sender.requests.lock().unwrap().len(), 3, "one POST each");
}

#[tokio::test]
async fn given_deliveries_stored_an_hour_before_the_audits_first_tick_then_they_are_not_audited() {
    // An older build's: it held and deferred first attempts without moving them, so the audit
    // starts at its first tick, an hour back, and leaves what came before alone.
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", None).await;
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    assert_eq!(h.queue.take_visible().len(), 1);
    h.clock.advance(Duration::minutes(61));
    for _ in 0..90 {
        assert_eq!(h.services.run_scheduler().await.unwrap().audited, 0);
        h.clock.advance(Duration::minutes(1));
    }
}

#[tokio::test]
async fn given_the_audit_failing_then_the_tick_goes_on_sends_the_digests_and_the_next_tick_audits() {
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![])).await;
    assert_eq!(h.services.run_scheduler().await.unwrap().audited, 0);
    for _ in 0..3 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    // Two die (the first is told at once, the second waits for the digest), and the third's
    // message is lost.
    let tasks = h.queue.take_visible();
    for task in &tasks[..2] {
        h.services.deliver(task).await.unwrap();
        let dead = h.queue.take_dead();
        h.services.handle_dead_letters(&dead).await.unwrap();
    }
    let emails = || h.mailer.sent.lock().unwrap().len();
    assert_eq!(emails(), 1);
    h.clock.advance(Duration::minutes(71));
    h.store.failing_audits.store(1, Ordering::SeqCst);
    let report = h.services.run_scheduler().await.unwrap();
    assert_eq!(report.audited, 0, "the audit failed");
    assert_eq!(emails(), 2, "the digest went out all the same");
    h.clock.advance(Duration::minutes(1));
    assert_eq!(
        h.services.run_scheduler().await.unwrap().audited,
        1,
        "and the next tick audits"
    );
}

#[tokio::test]
async fn given_first_attempts_deferred_to_slots_past_the_audits_hour_then_the_audit_leaves_them_be() {
    let (h, clock) = Harness::stepped(ScriptedSender::always(200), Config::default());
    let (tenant, _) = h.tenant("owner@example.com").await;
    let mut new = without_breaker(new_sub("https://a.example.com/", &["*"], None));
    new.rate_limit_per_second = Some(1);
    h.services.create_subscription(&tenant, new).await.unwrap();
    assert_eq!(h.services.run_scheduler().await.unwrap().requeued, 0);
    // A backlog of 80 minutes at one a second: the last first attempts wait for their slots
    // past the audit's hour, their messages in the queue all along.
    for _ in 0..48 {
        let batch = (0..100).map(|_| (event("invoice.paid"), None)).collect();
        h.services.ingest_batch(&tenant, batch).await.unwrap();
    }
    // The audit takes on the range holding them 70 minutes on (its hour, and its ten).
    let audited_at = h.clock.now() + Duration::minutes(70);
    let posts = || h.sender.requests.lock().unwrap().len();
    let (mut requeued, mut waiting_when_audited) = (0, None);
    let mut workers = futures::stream::FuturesUnordered::new();
    while posts() < 4_800 && h.clock.now() < audited_at + Duration::minutes(30) {
        if h.clock.now().timestamp() % 60 == 0 {
            let report = h.services.run_scheduler().await.unwrap();
            requeued += report.audited + report.requeued;
            if h.clock.now() >= audited_at && waiting_when_audited.is_none() {
                waiting_when_audited = Some(4_800 - posts());
            }
        }
        for task in h.queue.take_visible() {
            let services = &h.services;
            workers.push(async move { services.deliver(&task).await.unwrap() });
        }
        run_until_waiting(&mut workers).await;
        clock.advance(Duration::seconds(1));
    }
    let waiting = waiting_when_audited.unwrap_or(0);
    assert!(waiting > 300, "{waiting} waiting for their slots when audited");
    assert_eq!(
        requeued, 0,
        "first attempts waiting for their slots were taken for lost"
    );
    assert_eq!(posts(), 4_800);
}

#[tokio::test]
async fn given_first_attempts_held_by_an_open_breaker_past_the_audits_hour_then_the_audit_leaves_them_be() {
    let h = Harness::new(ScriptedSender::always(503));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let new = NewSubscription {
        circuit_breaker: Some(CircuitBreaker {
            enabled: true,
            failure_threshold: 3,
            probe_interval_seconds: 600,
        }),
        ..new_sub("https://a.example.com/", &["*"], Some(vec![7200, 7200]))
    };
    h.services.create_subscription(&tenant, new).await.unwrap();
    assert_eq!(h.services.run_scheduler().await.unwrap().audited, 0);
    for _ in 0..40 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    let (mut audited, end) = (0, h.clock.now() + Duration::minutes(80));
    while h.clock.now() < end {
        audited += h.services.run_scheduler().await.unwrap().audited;
        let tasks = h.queue.take_visible();
        for r in h.services.deliver_batch(&tasks).await {
            r.unwrap();
        }
        h.clock.advance(Duration::seconds(30));
    }
    let deliveries = deliveries(&h, &tenant).await;
    let never_tried = deliveries.iter().filter(|d| d.attempts == 0).count();
    assert!(never_tried > 20, "{never_tried} first attempts held all along");
    assert_eq!(audited, 0, "first attempts the breaker holds were taken for lost");
}

#[tokio::test]
async fn given_a_first_delivery_that_is_stored_after_its_message_then_the_message_looks_again_until_it_is() {
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", None).await;
    // Queued, then the write fails (as a crash between the two would leave it): the client
    // hears of it, and retries with its key.
    h.store.failing_event_writes.store(1, Ordering::SeqCst);
    let err = h
        .services
        .ingest(&tenant, event("invoice.paid"), Some("k-1".into()))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let early = h.queue.take_visible();
    assert_eq!(early.len(), 1, "queued before the write");
    // The worker finds no delivery yet: the message is queued again for a second later.
    let results = h.services.deliver_batch(&early).await;
    assert!(matches!(results[..], [Ok(DeliverOutcome::NotStoredYet)]), "{results:?}");
    assert_eq!(h.queue.log.lock().unwrap().last().map(|(_, delay)| *delay), Some(1));

    // The retry stores it, naming the same delivery, which its queued message finds.
    let retry = h
        .services
        .ingest(&tenant, event("invoice.paid"), Some("k-1".into()))
        .await
        .unwrap();
    assert!(retry.created);
    assert_eq!(retry.deliveries[0].id, early[0].delivery_id);
    h.clock.advance(Duration::seconds(1));
    let queued = h.queue.take_visible();
    assert_eq!(queued.len(), 2, "the early message again, and the retry's");
    let results = h.services.deliver_batch(&queued).await;
    assert!(
        matches!(results[..], [Ok(DeliverOutcome::Delivered), Ok(DeliverOutcome::Stale)]),
        "delivered once: {results:?}"
    );

    // A repeat after that is answered from the store: nothing queued.
    let repeat = h
        .services
        .ingest(&tenant, event("invoice.paid"), Some("k-1".into()))
        .await
        .unwrap();
    assert!(!repeat.created);
    assert_eq!(h.drain_now().await, 0);
    assert_eq!(h.sender.requests.lock().unwrap().len(), 1);

    // The same key with another payload is refused, naming the first event.
    let other = NewEvent {
        event_type: EventType::parse("invoice.paid").unwrap(),
        payload: serde_json::json!({"n": 2}),
    };
    let err = h.services.ingest(&tenant, other, Some("k-1".into())).await.unwrap_err();
    let Error::Validation(v) = err else { panic!("{err:?}") };
    assert_eq!(v.code, "idempotency_key_reused");
    assert!(v.message.contains(retry.event.id.as_str()), "{}", v.message);
}

#[tokio::test]
async fn given_a_first_message_received_seconds_after_it_was_queued_and_before_its_slow_ingest_stored_it_then_it_is_looked_at_again_and_delivered(
) {
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", None).await;
    h.store.failing_event_writes.store(1, Ordering::SeqCst);
    assert!(h
        .services
        .ingest(&tenant, event("invoice.paid"), Some("k-1".into()))
        .await
        .is_err());
    let early = h.queue.take_visible();
    // The worker gets it 3 s after it was queued (a busy queue, a slow batch): still within
    // the window an ingest may take, so it looks again 3 s later, not after the queue's
    // visibility timeout.
    h.clock.advance(Duration::seconds(3));
    let results = h.services.deliver_batch(&early).await;
    assert!(matches!(results[..], [Ok(DeliverOutcome::NotStoredYet)]), "{results:?}");
    assert_eq!(h.queue.log.lock().unwrap().last().map(|(_, delay)| *delay), Some(3));
    // The ingest (its client's retry) stores it meanwhile; the copy delivers it.
    assert!(
        h.services
            .ingest(&tenant, event("invoice.paid"), Some("k-1".into()))
            .await
            .unwrap()
            .created
    );
    h.clock.advance(Duration::seconds(3));
    let queued = h.queue.take_visible();
    let results = h.services.deliver_batch(&queued).await;
    assert!(
        results.iter().any(|r| matches!(r, Ok(DeliverOutcome::Delivered))),
        "{results:?}"
    );
    assert_eq!(h.sender.requests.lock().unwrap().len(), 1, "delivered once");
}

#[tokio::test]
async fn given_an_ingest_that_failed_after_queueing_then_its_message_costs_six_copies_and_the_dead_letter_handler_drops_it(
) {
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", None).await;
    h.store.failing_event_writes.store(1, Ordering::SeqCst);
    assert!(h.services.ingest(&tenant, event("invoice.paid"), None).await.is_err());
    let first = h.queue.take_visible();
    // Each copy waits as long as the message's age so far, until the ingest window is over.
    let mut delays = Vec::new();
    let mut batch = first.clone();
    let results = loop {
        let results = h.services.deliver_batch(&batch).await;
        if !matches!(results[..], [Ok(DeliverOutcome::NotStoredYet)]) {
            break results;
        }
        let delay = h.queue.log.lock().unwrap().last().unwrap().1;
        delays.push(delay);
        h.clock.advance(Duration::seconds(delay.into()));
        batch = h.queue.take_visible();
        assert_eq!(batch, first, "the same task, its first-queued time kept");
    };
    assert_eq!(delays, [1, 1, 2, 4, 8, 16]);
    // After the window it is an error, which the queue redelivers until its
    // maxReceiveCount, then hands to the dead-letter handler. No more copies.
    assert!(matches!(&results[..], [Err(e)] if e.is_retryable()), "{results:?}");
    assert_eq!(h.queue.pending(), 0, "six copies, no more");
    let report = h.services.handle_dead_letters(&batch).await.unwrap();
    assert_eq!((report.rescheduled, report.queued), (0, 0), "dropped: {report:?}");
    assert!(h.sender.requests.lock().unwrap().is_empty());
    assert!(h.mailer.sent.lock().unwrap().is_empty(), "nobody is told of it");
}

#[tokio::test]
async fn given_a_subscription_with_a_long_history_then_its_overview_counts_its_latest_page_and_says_so() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, sub) = subscribed(&h, "https://a.example.com/", None).await;
    let counted = hookwise_core::services::Services::COUNTED_DELIVERIES as usize;
    for _ in 0..counted {
        h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
    }
    h.drain_now().await;
    let overview = h.services.subscription_overview(&tenant, &sub.id).await.unwrap();
    assert_eq!(overview.counts, [0, 0, counted as u64, 0]);
    assert!(overview.counts_complete, "exactly one page: all of them");

    // One more, still pending: the latest page counts it, and the oldest falls out.
    h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
    let overview = h.services.subscription_overview(&tenant, &sub.id).await.unwrap();
    assert_eq!(overview.counts, [1, 0, counted as u64 - 1, 0]);
    assert!(!overview.counts_complete, "an older one is not counted");
}

#[tokio::test]
async fn given_more_subscriptions_than_a_page_then_they_are_listed_page_by_page_oldest_first() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let mut created = Vec::new();
    // One more than the page the fan-out reads its subscriptions in.
    for i in 0..=hookwise_core::services::Services::MAX_PAGE {
        let url = format!("https://s{i}.example.com/");
        created.push(
            h.services
                .create_subscription(&tenant, new_sub(&url, &["*"], None))
                .await
                .unwrap()
                .subscription,
        );
        h.clock.advance(Duration::milliseconds(1));
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = h
            .services
            .list_subscriptions(&tenant, 30, cursor.as_deref())
            .await
            .unwrap();
        assert!(page.items.len() <= 30);
        seen.extend(page.items.into_iter().map(|s| s.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, created.iter().map(|s| s.id.clone()).collect::<Vec<_>>());
    // Every subscription still fans out, past the first page.
    let ingested = h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
    assert_eq!(ingested.deliveries.len(), created.len());

    let err = h.services.list_subscriptions(&tenant, 101, None).await.unwrap_err();
    let Error::Validation(v) = err else { panic!("{err:?}") };
    assert_eq!(v.code, "invalid_limit");
    let err = h
        .services
        .list_subscriptions(&tenant, 0, Some("nonsense"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Port(hookwise_core::PortError::InvalidCursor(_))),
        "{err:?}"
    );
}

#[tokio::test]
async fn given_a_breaker_write_failing_then_the_delivery_goes_on_and_the_failure_is_counted() {
    let (h, recorded) = Harness::new(ScriptedSender::always(500)).recording();
    let (tenant, _) = h.tenant("owner@example.com").await;
    let mut sub = new_sub("https://down.example.com/", &["*"], None);
    sub.circuit_breaker = Some(hookwise_core::circuit::CircuitBreaker {
        failure_threshold: 1,
        ..hookwise_core::circuit::CircuitBreaker::on()
    });
    h.services.create_subscription(&tenant, sub).await.unwrap();
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    // The failed attempt opens the breaker (threshold 1): that write fails.
    h.store
        .failing_circuit_writes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    for r in h.services.deliver_batch(&h.queue.take_visible()).await {
        r.expect("the attempt is recorded whatever the breaker's write did");
    }
    let (delivery, _) = h
        .services
        .get_delivery(&tenant, &ingested.deliveries[0].id)
        .await
        .unwrap();
    assert_eq!(delivery.attempts, 1, "{delivery:?}");
    let counts = recorded.counts.lock().unwrap().clone();
    assert_eq!(
        counts.get(hookwise_core::metrics::BEST_EFFORT_FAILURES),
        Some(&1),
        "{counts:?}"
    );
}

#[tokio::test]
async fn given_ses_refusing_an_owners_email_then_the_failure_is_counted_and_the_next_try_sends_it() {
    let (h, recorded) = Harness::new(ScriptedSender::always(500)).recording();
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.mailer
        .refusing_once
        .lock()
        .unwrap()
        .insert("owner@example.com".into());
    h.services
        .create_subscription(&tenant, new_sub("https://down.example.com/", &["*"], Some(vec![])))
        .await
        .unwrap();
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let failures = || {
        recorded
            .counts
            .lock()
            .unwrap()
            .get(hookwise_core::metrics::EMAIL_FAILURES)
            .copied()
    };
    assert_eq!(failures(), Some(1));
    assert!(h.mailer.sent.lock().unwrap().is_empty());
    // Tried again by the scheduler once the retry time has come.
    h.run_for(chrono::Duration::minutes(6), chrono::Duration::minutes(1))
        .await;
    assert_eq!(h.mailer.sent.lock().unwrap().len(), 1);
    assert_eq!(failures(), Some(1));
}

#[tokio::test]
async fn given_a_recorder_then_deliveries_by_outcome_their_latency_queue_lag_and_dead_letters_are_recorded() {
    use hookwise_core::metrics::*;
    let (h, recorded) = Harness::recording(Harness::new(ScriptedSender::new(|url, _| {
        status_outcome(if url.contains("down") { 500 } else { 200 })
    })));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://up.example.com/", &["*"], None))
        .await
        .unwrap();
    h.services
        .create_subscription(&tenant, new_sub("https://down.example.com/", &["*"], Some(vec![])))
        .await
        .unwrap();
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    // As the hosts do: each queue's batch through `handle_messages`.
    let messages = |tasks: Vec<DeliveryTask>| -> Vec<hookwise_core::ports::QueueMessage> {
        tasks
            .into_iter()
            .enumerate()
            .map(|(i, task)| hookwise_core::ports::QueueMessage {
                message_id: i.to_string(),
                task: Ok(task),
                redriven: false,
                receive_count: 1,
            })
            .collect()
    };
    use hookwise_core::services::QueueRole;
    let first = messages(h.queue.take_visible());
    assert_eq!(first.len(), 2);
    h.services.handle_messages(QueueRole::Delivery, &first, None).await;
    let dead = messages(h.queue.take_dead());
    h.services.handle_messages(QueueRole::DeadLetter, &dead, None).await;

    let counts = recorded.counts.lock().unwrap().clone();
    assert_eq!(counts.get(DELIVERED), Some(&1), "{counts:?}");
    assert_eq!(counts.get(DEAD), Some(&1), "{counts:?}");
    assert_eq!(counts.get(DEAD_LETTERS), Some(&1), "{counts:?}");
    assert_eq!(counts.get(NOTICES), Some(&1), "{counts:?}");
    assert_eq!(counts.get(EMAILS), Some(&1), "{counts:?}");
    let times = recorded.times.lock().unwrap().clone();
    assert_eq!(times.get(ATTEMPT_LATENCY), Some(&2), "{times:?}");
    assert_eq!(times.get(QUEUE_LAG), Some(&2), "both were first attempts: {times:?}");
    // Flushing is the host's (the Lambda handlers flush after each invocation).
    h.services.flush_metrics();
    assert_eq!(recorded.flushes.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Services of another process on the same ports: the operator's `hookwise tenant`.
fn operator(h: &Harness) -> Services {
    Services::new(
        h.services.ports().clone(),
        Config::default(),
        rand::SeedableRng::seed_from_u64(7),
    )
}

#[tokio::test]
async fn given_a_rotation_then_both_keys_work_until_one_is_revoked_and_a_warm_process_refuses_it_within_the_cache_time()
{
    let h = Harness::new(ScriptedSender::always(200));
    let admin = operator(&h);
    let (tenant, old_key) = h.tenant("owner@example.com").await;
    // The warm process has used the old key: it keeps its tenant for the lookup's lifetime.
    assert_eq!(h.services.authenticate(&old_key).await.unwrap().id, tenant.id);

    let (rotated, new_key) = admin.rotate_api_key(&tenant.id).await.unwrap();
    assert_eq!(rotated.api_keys.len(), 2);
    assert_eq!(h.services.authenticate(&old_key).await.unwrap().id, tenant.id);
    assert_eq!(h.services.authenticate(&new_key).await.unwrap().id, tenant.id);
    // Two at most: a third waits for a revocation.
    assert!(matches!(
        admin.rotate_api_key(&tenant.id).await,
        Err(Error::Conflict(_))
    ));

    let old_id = rotated.api_keys[0].id().to_owned();
    let unknown = KeyRef::Id("0123456789ab".into());
    assert!(matches!(
        admin.revoke_api_key(&tenant.id, &unknown).await,
        Err(Error::NotFound { .. })
    ));
    let revoked = admin.revoke_api_key(&tenant.id, &KeyRef::Id(old_id)).await.unwrap();
    assert_eq!(revoked.api_keys.len(), 1);
    // Refused at once by a process that never used it; by the warm one, once its entry is
    // as old as the lookup's time to live, and not before.
    assert!(matches!(admin.authenticate(&old_key).await, Err(Error::Unauthorized)));
    h.clock.advance(Duration::seconds(29));
    assert_eq!(h.services.authenticate(&old_key).await.unwrap().id, tenant.id);
    h.clock.advance(Duration::seconds(2));
    assert!(matches!(
        h.services.authenticate(&old_key).await,
        Err(Error::Unauthorized)
    ));
    assert_eq!(h.services.authenticate(&new_key).await.unwrap().id, tenant.id);

    // Named by the key itself, the last one goes too: the tenant is locked out.
    let none = admin
        .revoke_api_key(&tenant.id, &KeyRef::Key(new_key.clone()))
        .await
        .unwrap();
    assert!(none.api_keys.is_empty());
    assert!(matches!(admin.authenticate(&new_key).await, Err(Error::Unauthorized)));
}

#[tokio::test]
async fn given_a_tenant_change_then_it_is_stored_listed_and_validated() {
    let h = Harness::new(ScriptedSender::always(200));
    let (a, _) = h.tenant("a@example.com").await;
    let (b, _) = h.tenant("b@example.com").await;
    let patch = TenantPatch {
        name: Some("  Renamed ".into()),
        owner_email: Some(Email::parse("new@example.com").unwrap()),
        retries: Some(RetriesSetting::Off),
        status: None,
    };
    let changed = h.services.update_tenant(&a.id, &patch).await.unwrap();
    assert_eq!(
        (changed.name.as_str(), changed.owner_email.as_str(), changed.retries),
        ("Renamed", "new@example.com", RetriesSetting::Off)
    );
    assert_eq!(changed.version, a.version + 1);
    assert_eq!(h.services.tenant(&a.id).await.unwrap(), changed);
    let ids: Vec<TenantId> = h
        .services
        .all_tenants()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    let mut want = vec![a.id.clone(), b.id.clone()];
    want.sort();
    assert_eq!(ids, want);

    let blank = TenantPatch {
        name: Some(" ".into()),
        ..TenantPatch::default()
    };
    assert!(matches!(
        h.services.update_tenant(&b.id, &blank).await,
        Err(Error::Validation(e)) if e.code == "invalid_name"
    ));
    let ghost = TenantId::generate(h.clock.now(), &mut rand::rng());
    assert!(matches!(
        h.services.set_tenant_retries(&ghost, RetriesSetting::On).await,
        Err(Error::NotFound { what: "tenant", .. })
    ));
}

#[tokio::test]
async fn given_a_rate_limit_then_an_attempt_past_the_next_second_is_deferred_once_to_its_slot_uncounted() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let new = NewSubscription {
        rate_limit_per_second: Some(1),
        ..new_sub("https://a.example.com/", &["*"], None)
    };
    let sub = h.services.create_subscription(&tenant, new).await.unwrap().subscription;
    let t0 = h.clock.now();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
        ids.push(ingested.deliveries[0].id.clone());
    }
    let tasks = h.queue.take_visible();
    assert_eq!(tasks.len(), 4);
    // The first goes at once; the second's slot is a second away: waited for in the worker.
    for task in &tasks[..2] {
        assert_eq!(h.services.deliver(task).await.unwrap(), DeliverOutcome::Delivered);
    }
    assert_eq!(
        h.clock.now(),
        t0 + Duration::seconds(1),
        "the worker waited for the slot"
    );
    // Back at t0 (a second worker, say): the third's slot is two seconds away. Deferred,
    // not attempted, not counted.
    h.clock.set(t0);
    let third = h.services.deliver(&tasks[2]).await.unwrap();
    assert_eq!(
        third,
        DeliverOutcome::RateLimited {
            slot: t0 + Duration::seconds(2)
        }
    );
    assert_eq!(h.sender.requests.lock().unwrap().len(), 2);
    let (d, attempts) = h.services.get_delivery(&tenant, &ids[2]).await.unwrap();
    assert_eq!((d.status, d.attempts, attempts.len()), (DeliveryStatus::Pending, 0, 0));
    // Queued to arrive a second before its slot, carrying it.
    let (deferred, delay) = h.queue.log.lock().unwrap().last().cloned().unwrap();
    assert_eq!((deferred.slot, delay), (Some(t0 + Duration::seconds(2)), 1));

    // It arrives, waits the last second and goes, without reserving another slot: the
    // fourth's is the one after it.
    h.clock.advance(Duration::seconds(1));
    let arrived = h.queue.take_visible();
    assert_eq!(arrived, vec![deferred]);
    assert_eq!(
        h.services.deliver(&arrived[0]).await.unwrap(),
        DeliverOutcome::Delivered
    );
    assert_eq!(h.clock.now(), t0 + Duration::seconds(2));
    let fourth = h.services.deliver(&tasks[3]).await.unwrap();
    assert_eq!(
        fourth,
        DeliverOutcome::Delivered,
        "its slot, t0 + 3 s, was within the second"
    );
    assert_eq!(h.clock.now(), t0 + Duration::seconds(3));
    let (d, attempts) = h.services.get_delivery(&tenant, &ids[2]).await.unwrap();
    assert_eq!((d.status, attempts.len()), (DeliveryStatus::Delivered, 1));
    assert_eq!(sub.rate_limit_per_second, Some(1));
}

#[tokio::test]
async fn given_a_deferred_attempt_arriving_after_its_slot_went_by_then_it_takes_the_next_turn_rather_than_burst() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let new = NewSubscription {
        rate_limit_per_second: Some(1),
        ..new_sub("https://a.example.com/", &["*"], None)
    };
    h.services.create_subscription(&tenant, new).await.unwrap();
    let t0 = h.clock.now();
    for _ in 0..4 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    let tasks = h.queue.take_visible();
    // Slots t0 and t0 + 1 s are taken; the third's, t0 + 2 s, is deferred to.
    for task in &tasks[..2] {
        h.clock.set(t0);
        assert_eq!(h.services.deliver(task).await.unwrap(), DeliverOutcome::Delivered);
    }
    h.clock.set(t0);
    let DeliverOutcome::RateLimited { slot } = h.services.deliver(&tasks[2]).await.unwrap() else {
        panic!("the third is deferred");
    };
    assert_eq!(slot, t0 + Duration::seconds(2));
    let (deferred, _) = h.queue.log.lock().unwrap().last().cloned().unwrap();
    // Its workers were busy: it comes back 10 s after its slot, just after the fourth took
    // the limiter's turn of that second.
    h.clock.set(t0 + Duration::seconds(12));
    h.services.deliver(&tasks[3]).await.unwrap();
    let sent_before = h.sender.requests.lock().unwrap().len();
    let late = h.services.deliver(&deferred).await.unwrap();
    assert_eq!(
        late,
        DeliverOutcome::Delivered,
        "the next turn, a second after the one just used"
    );
    assert_eq!(
        h.clock.now(),
        t0 + Duration::seconds(13),
        "sent in its turn, not at once"
    );
    assert_eq!(h.sender.requests.lock().unwrap().len(), sent_before + 1);
}

#[tokio::test]
async fn given_a_backlog_its_workers_pick_up_late_then_the_endpoint_still_gets_nine_tenths_of_its_rate_and_no_more() {
    // Every message is handled 1 to 5 s after it becomes visible (the workers busy with
    // another tenant's slow endpoint), each by its own worker, side by side: a late attempt
    // used to go to the back of the line, and come back late again, and the endpoint got
    // nothing. At a low limit, late ones bunched up must not leave turns unused either.
    for (rate, events) in [(10, 300), (1, 60), (2, 100)] {
        late_pickup_run(rate, events).await;
    }
}

/// `events` to an endpoint limited to `rate` a second, each message picked up late.
async fn late_pickup_run(rate: u32, events: usize) {
    let sent_at = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let time = std::sync::Arc::new(std::sync::OnceLock::<std::sync::Arc<dyn Clock>>::new());
    let (record, now) = (sent_at.clone(), time.clone());
    let (h, clock) = Harness::stepped(
        ScriptedSender::new(move |_, _| {
            record.lock().unwrap().push(now.get().unwrap().now());
            status_outcome(200)
        }),
        Config::default(),
    );
    assert!(time.set(h.clock.clone()).is_ok());
    let (tenant, _) = h.tenant("owner@example.com").await;
    let new = NewSubscription {
        rate_limit_per_second: Some(rate),
        ..new_sub("https://a.example.com/", &["*"], None)
    };
    h.services.create_subscription(&tenant, new).await.unwrap();
    for _ in 0..events {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    let received = || h.sender.requests.lock().unwrap().len();
    let end = h.clock.now() + Duration::seconds(2 * events as i64 / i64::from(rate) + 60);
    let mut picked_up: Vec<(chrono::DateTime<chrono::Utc>, DeliveryTask)> = Vec::new();
    let mut workers = futures::stream::FuturesUnordered::new();
    let mut n = 0i64;
    while h.clock.now() < end && received() < events {
        clock.advance(Duration::milliseconds(10));
        for task in h.queue.take_visible() {
            n += 1;
            picked_up.push((h.clock.now() + Duration::milliseconds(1_000 + n * 1_237 % 4_000), task));
        }
        picked_up.sort_by_key(|(at, _)| *at);
        let due = picked_up.iter().take_while(|(at, _)| *at <= h.clock.now()).count();
        for (_, task) in picked_up.drain(..due) {
            let services = &h.services;
            workers.push(async move { services.deliver(&task).await.unwrap() });
        }
        // Each worker runs until it waits for time to move, or is done.
        run_until_waiting(&mut workers).await;
    }

    // Judged by what the endpoint received.
    let ids: std::collections::HashSet<_> = h
        .sender
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.headers.iter().find(|(k, _)| k == "webhook-id").unwrap().1.clone())
        .collect();
    assert_eq!(
        (received(), ids.len()),
        (events, events),
        "each event once, all of them"
    );
    let mut times = sent_at.lock().unwrap().clone();
    times.sort();
    let span = (*times.last().unwrap() - times[0]).as_seconds_f64();
    let per_second = events as f64 / span;
    assert!(
        per_second >= 0.9 * f64::from(rate),
        "{per_second:.1}/s while the backlog lasted"
    );
    let most = (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t - times[i] <= Duration::seconds(1))
                .count()
        })
        .max()
        .unwrap();
    assert!(most as f64 <= f64::from(rate) * 1.1 + 1.0, "{most} in one second");
}

#[tokio::test]
async fn given_a_rate_limit_out_of_range_then_the_subscription_is_refused_and_null_removes_it() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    for bad in [0, 10_001] {
        let new = NewSubscription {
            rate_limit_per_second: Some(bad),
            ..new_sub("https://a.example.com/", &["*"], None)
        };
        assert!(matches!(
            h.services.create_subscription(&tenant, new).await,
            Err(Error::Validation(e)) if e.code == "invalid_rate_limit"
        ));
    }
    let new = NewSubscription {
        rate_limit_per_second: Some(10_000),
        ..new_sub("https://a.example.com/", &["*"], None)
    };
    let sub = h.services.create_subscription(&tenant, new).await.unwrap().subscription;
    let patch: hookwise_core::services::SubscriptionPatch =
        serde_json::from_value(serde_json::json!({"rate_limit_per_second": null})).unwrap();
    let changed = h.services.update_subscription(&tenant, &sub.id, patch).await.unwrap();
    assert_eq!(changed.rate_limit_per_second, None);
    let patch: hookwise_core::services::SubscriptionPatch =
        serde_json::from_value(serde_json::json!({"timeout_ms": 5000})).unwrap();
    let kept = h.services.update_subscription(&tenant, &sub.id, patch).await.unwrap();
    assert_eq!(kept.rate_limit_per_second, None, "absent leaves it");
}

#[tokio::test]
async fn given_an_endpoint_without_a_success_for_its_auto_disable_hours_then_the_subscription_is_disabled_and_its_owner_told_once(
) {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = disabled_after_an_hour(&h, &tenant).await;
    // Failing, but not for an hour yet: still active.
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let active = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert_eq!(active.status, SubscriptionStatus::Active);

    // An hour of failures: the next failure disables it, and one email says so.
    h.clock.advance(Duration::minutes(61));
    for _ in 0..3 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    h.drain_now().await;
    let disabled = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert_eq!(
        (disabled.status, disabled.disabled_reason.as_deref()),
        (SubscriptionStatus::Disabled, Some(DISABLED_FAILING))
    );
    let told: Vec<_> = h
        .mailer
        .sent
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m.subject.contains("disabled"))
        .cloned()
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].to.as_str(), "owner@example.com");
    assert!(told[0].text.contains("\"status\":\"active\"") && told[0].text.contains("/recover"));
    // Events for it now create no deliveries.
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    assert!(ingested.deliveries.is_empty());

    // Re-enabled: its failures count afresh, so the next one does not disable it again.
    let patch: hookwise_core::services::SubscriptionPatch =
        serde_json::from_value(serde_json::json!({"status": "active"})).unwrap();
    h.services.update_subscription(&tenant, &sub.id, patch).await.unwrap();
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let again = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert_eq!(again.status, SubscriptionStatus::Active);
}

#[tokio::test]
async fn given_a_success_within_the_auto_disable_hours_or_none_set_then_the_subscription_stays_active() {
    // The first POST succeeds, the rest fail.
    let h = Harness::new(ScriptedSender::new(|_, n| {
        status_outcome(if n == 0 { 200 } else { 500 })
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = disabled_after_an_hour(&h, &tenant).await;
    h.clock.advance(Duration::minutes(50));
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await; // a success at 50 min
    h.clock.advance(Duration::minutes(50));
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await; // a failure 50 min after it
    let s = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert_eq!(s.status, SubscriptionStatus::Active, "the success reset the clock");

    let never = NewSubscription {
        auto_disable_after_hours: Some(None),
        circuit_breaker: None,
        ..new_sub("https://b.example.com/", &["*"], Some(vec![]))
    };
    let never = h
        .services
        .create_subscription(&tenant, never)
        .await
        .unwrap()
        .subscription;
    assert_eq!(never.auto_disable_after_hours, None);
    let default = h
        .services
        .create_subscription(&tenant, new_sub("https://c.example.com/", &["*"], None))
        .await
        .unwrap()
        .subscription;
    assert_eq!(default.auto_disable_after_hours, Some(DEFAULT_AUTO_DISABLE_HOURS));
}

#[tokio::test]
async fn given_the_auto_disable_email_failing_then_the_message_comes_back_and_its_return_tells_the_owner_once() {
    let (h, tenant, sub, task) = failing_for_an_hour().await;
    h.mailer
        .refusing_once
        .lock()
        .unwrap()
        .insert("owner@example.com".into());
    assert!(h.services.deliver(&task).await.is_err(), "the message must come back");
    let pending = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert_eq!(
        (pending.status, pending.disable_notice_pending),
        (SubscriptionStatus::Disabled, true)
    );
    assert_eq!(disable_emails(&h), 0);
    // A copy arriving at once leaves the email to the call that took it on (which may yet
    // send it), and comes back later itself.
    assert!(h.services.deliver(&task).await.is_err());
    assert_eq!(disable_emails(&h), 0);
    // It comes back after the queue's visibility timeout: its attempt is recorded (stale),
    // the email is free again, and the owner is told.
    h.clock.advance(Duration::seconds(120));
    assert_eq!(h.services.deliver(&task).await.unwrap(), DeliverOutcome::Stale);
    assert_eq!(disable_emails(&h), 1);
    let done = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert!(!done.disable_notice_pending);
    h.clock.advance(Duration::seconds(31)); // past the lookups' time to live
    assert_eq!(h.services.deliver(&task).await.unwrap(), DeliverOutcome::Stale);
    assert_eq!(disable_emails(&h), 1, "once");
}

#[tokio::test]
async fn given_another_process_keeping_a_copy_of_the_subscription_with_its_email_pending_then_the_owner_is_told_once() {
    let h = Harness::new(ScriptedSender::always(500));
    let other = operator(&h);
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = disabled_after_an_hour(&h, &tenant).await;
    h.clock.advance(Duration::minutes(61));
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let tasks = h.queue.take_visible();
    h.mailer
        .refusing_once
        .lock()
        .unwrap()
        .insert("owner@example.com".into());
    // This process disables it; the email fails, and its message will come back.
    assert!(h.services.deliver(&tasks[0]).await.is_err());
    h.clock.advance(DISABLE_NOTICE_CLAIM + Duration::seconds(1));
    // The other process handles the second event's delivery, keeping the disabled copy.
    assert_eq!(other.deliver(&tasks[1]).await.unwrap(), DeliverOutcome::Dead);
    // The first message comes back here, and the owner is told.
    assert_eq!(h.services.deliver(&tasks[0]).await.unwrap(), DeliverOutcome::Stale);
    assert_eq!(disable_emails(&h), 1);
    // A copy of it reaches the other process, whose copy still says pending: not again.
    assert_eq!(other.deliver(&tasks[0]).await.unwrap(), DeliverOutcome::Stale);
    assert_eq!(disable_emails(&h), 1, "once");
    let done = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert_eq!(
        (done.disable_notice_pending, done.disable_notice_claimed_at),
        (false, None)
    );
}

#[tokio::test]
async fn given_the_answers_of_the_disabling_and_told_writes_lost_then_the_owner_is_told_once_all_the_same() {
    let (h, tenant, sub, task) = failing_for_an_hour().await;
    // The disabling lands, and so does the "told" write, but each answers as a retry of a
    // write whose answer was lost: "changed since it was read".
    h.store
        .lost_subscription_answers
        .store(2, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(h.services.deliver(&task).await.unwrap(), DeliverOutcome::Dead);
    assert_eq!(disable_emails(&h), 1, "the call that disabled it knew its own write");
    let done = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert_eq!(
        (done.status, done.disable_notice_pending, done.disable_notice_claimed_at),
        (SubscriptionStatus::Disabled, false, None),
        "and marked it told"
    );
    h.clock.advance(DISABLE_NOTICE_CLAIM + Duration::seconds(1));
    assert_eq!(h.services.deliver(&task).await.unwrap(), DeliverOutcome::Stale);
    assert_eq!(disable_emails(&h), 1, "once");
}

#[tokio::test]
async fn given_an_edit_just_before_the_told_write_then_it_is_marked_told_on_the_fresh_copy_and_not_sent_again() {
    let (h, tenant, sub, task) = failing_for_an_hour().await;
    // The disabling goes through; the owner edits the subscription just before the "told"
    // write.
    *h.store.edit_before_subscription_write.lock().unwrap() = Some(1);
    assert_eq!(h.services.deliver(&task).await.unwrap(), DeliverOutcome::Dead);
    let done = h.services.get_subscription(&tenant, &sub.id).await.unwrap();
    assert_eq!(
        (done.disable_notice_pending, done.disable_notice_claimed_at),
        (false, None)
    );
    h.clock.advance(DISABLE_NOTICE_CLAIM + Duration::seconds(1));
    assert_eq!(h.services.deliver(&task).await.unwrap(), DeliverOutcome::Stale);
    assert_eq!(disable_emails(&h), 1, "once");
}

/// An endpoint failing for an hour, its subscription due to be disabled (no retries), and
/// the message of an event's delivery whose attempt will disable it.
async fn failing_for_an_hour() -> (Harness, Tenant, Subscription, DeliveryTask) {
    let h = Harness::new(ScriptedSender::always(500));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = disabled_after_an_hour(&h, &tenant).await;
    h.clock.advance(Duration::minutes(61));
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let task = h.queue.take_visible().pop().unwrap();
    (h, tenant, sub, task)
}

/// The emails telling an owner their subscription was disabled.
fn disable_emails(h: &Harness) -> usize {
    let sent = h.mailer.sent.lock().unwrap();
    sent.iter().filter(|m| m.subject.contains("disabled")).count()
}

/// A subscription of `tenant` with no retries, disabled after an hour without a success.
async fn disabled_after_an_hour(h: &Harness, tenant: &Tenant) -> Subscription {
    let new = NewSubscription {
        auto_disable_after_hours: Some(Some(1)),
        circuit_breaker: None,
        ..new_sub("https://a.example.com/", &["*"], Some(vec![]))
    };
    h.services.create_subscription(tenant, new).await.unwrap().subscription
}

#[tokio::test]
async fn given_another_tick_holding_the_lease_then_a_tick_does_nothing_until_the_lease_expires() {
    use hookwise_core::ports::SchedulerTable;
    let (h, recorded) = Harness::with_config(ScriptedSender::always(500), Config::default(), 60).recording();
    let ticks = || {
        recorded
            .counts
            .lock()
            .unwrap()
            .get(hookwise_core::metrics::TICKS)
            .copied()
    };
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(&tenant, new_sub("https://down.example.com/", &["*"], Some(vec![300])))
        .await
        .unwrap();
    h.services.ingest(&tenant, event("a.b"), None).await.unwrap();
    for r in h.services.deliver_batch(&h.queue.take_visible()).await {
        r.unwrap();
    }
    // The retry waits in the scheduler table (the queue holds 60 s); it comes near.
    h.clock.advance(Duration::seconds(250));
    let now = h.clock.now();
    assert!(h
        .scheduler
        .take_lease("another tick", now, now + Duration::seconds(90))
        .await
        .unwrap());
    let report = h.services.run_scheduler().await.unwrap();
    assert!(report.skipped, "{report:?}");
    assert_eq!(report.moved, 0);
    assert!(
        h.queue.take_visible().is_empty(),
        "nothing moved while the lease was held"
    );
    assert_eq!(ticks(), None, "a skipped tick is not a tick");

    // That tick died holding it: once the lease expires, the next tick runs.
    h.clock.advance(Duration::seconds(91));
    let report = h.services.run_scheduler().await.unwrap();
    assert!(!report.skipped);
    assert_eq!(report.moved, 1, "{report:?}");
    // And gave it back: the tick after it runs too.
    assert!(!h.services.run_scheduler().await.unwrap().skipped);
    assert_eq!(ticks(), Some(2));
}

#[tokio::test]
async fn given_a_named_holder_then_a_restarted_process_takes_back_the_lease_its_last_run_held() {
    use hookwise_core::ports::SchedulerTable;
    let config = Config {
        scheduler_holder: Some("hookwise dev".into()),
        ..Config::default()
    };
    let h = Harness::with_config(ScriptedSender::always(200), config, 900);
    let now = h.clock.now();
    // The last run died in a tick, holding the lease.
    assert!(h
        .scheduler
        .take_lease("hookwise dev", now, now + Duration::seconds(90))
        .await
        .unwrap());
    assert!(!h.services.run_scheduler().await.unwrap().skipped);
}

/// `sub` stored again as an older build stored it: both secrets in plain text.
async fn stored_in_plain_text(h: &Harness, sub: &Subscription, current: &Secret, previous: &Secret) {
    let old = Subscription {
        secret: SealedSecret::unsealed(current),
        previous_secret: Some(SealedSecret::unsealed(previous)),
        previous_secret_expires_at: Some(h.clock.now() + Duration::hours(24)),
        updated_at: sub.updated_at + Duration::milliseconds(1),
        ..sub.clone()
    };
    h.store.replace_subscription(&old, sub.updated_at).await.unwrap();
}

#[tokio::test]
async fn given_secrets_an_older_build_stored_in_plain_text_then_they_sign_and_the_next_write_even_the_deliver_paths_seals_both(
) {
    let h = Harness::new(ScriptedSender::always(410));
    let (tenant, sub) = subscribed(&h, "https://a.example.com/", None).await;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(5);
    let (current, previous) = (Secret::generate(&mut rng), Secret::generate(&mut rng));
    stored_in_plain_text(&h, &sub, &current, &previous).await;

    // The 410 disables the subscription: a write on the deliver path.
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let req = h.sender.requests.lock().unwrap()[0].clone();
    let signatures = req
        .headers
        .iter()
        .find(|(k, _)| k == "webhook-signature")
        .unwrap()
        .1
        .clone();
    let header = |name: &str| req.headers.iter().find(|(k, _)| k == name).unwrap().1.clone();
    for secret in [&current, &previous] {
        let one = signing::sign(
            secret,
            &header("webhook-id"),
            header("webhook-timestamp").parse().unwrap(),
            &req.body,
        );
        assert!(signatures.contains(&one), "not signed with a plain secret");
    }
    let stored = h.store.get_subscription(&tenant.id, &sub.id).await.unwrap().unwrap();
    assert_eq!(stored.status, SubscriptionStatus::Disabled);
    assert!(
        stored.secret.plain().is_none() && stored.previous_secret.as_ref().is_some_and(|p| p.plain().is_none()),
        "a secret still in plain text after the deliver path's write: {stored:?}"
    );
}

#[tokio::test]
async fn given_a_current_secret_that_will_never_open_then_its_delivery_dies_unattempted_and_a_previous_one_is_left_out()
{
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, sub) = subscribed(&h, "https://a.example.com/", None).await;
    let other = subscribed(&h, "https://b.example.com/", None).await.1;

    // The previous secret is another subscription's envelope (it opens for no other): the
    // current one alone signs.
    let rotated = h.services.rotate_secret(&tenant, &sub.id).await.unwrap();
    let stored = h.store.get_subscription(&tenant.id, &sub.id).await.unwrap().unwrap();
    let swapped = Subscription {
        previous_secret: Some(other.secret.clone()),
        updated_at: stored.updated_at + Duration::milliseconds(1),
        ..stored.clone()
    };
    h.store.replace_subscription(&swapped, stored.updated_at).await.unwrap();
    h.clock.advance(Duration::seconds(31)); // past the warm copy of the subscription
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    let req = h.sender.requests.lock().unwrap()[0].clone();
    let header = |name: &str| req.headers.iter().find(|(k, _)| k == name).unwrap().1.clone();
    let signed = signing::sign(
        &rotated.secret,
        &header("webhook-id"),
        header("webhook-timestamp").parse().unwrap(),
        &req.body,
    );
    assert_eq!(
        header("webhook-signature"),
        signed,
        "signed with the current secret alone"
    );

    // Now the current one opens for no one: no POST, the delivery dead with the reason.
    let stored = h.store.get_subscription(&tenant.id, &sub.id).await.unwrap().unwrap();
    let broken = Subscription {
        secret: other.secret.clone(),
        updated_at: stored.updated_at + Duration::milliseconds(1),
        ..stored.clone()
    };
    h.store.replace_subscription(&broken, stored.updated_at).await.unwrap();
    h.clock.advance(Duration::seconds(31));
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.drain_now().await;
    assert_eq!(h.sender.requests.lock().unwrap().len(), 1, "a POST it could not sign");
    let d = h.store.get_delivery(&ingested.deliveries[0].id).await.unwrap().unwrap();
    assert_eq!(d.status, DeliveryStatus::Dead);
    assert!(
        d.last_error
            .as_deref()
            .is_some_and(|e| e.contains("signing secret cannot be opened")),
        "{d:?}"
    );
}

#[tokio::test]
async fn given_plain_secrets_in_several_tenants_then_seal_stored_secrets_seals_them_all_once_and_they_still_sign() {
    let h = Harness::new(ScriptedSender::always(200));
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(8);
    let mut plain = Vec::new();
    for url in ["https://a.example.com/", "https://b.example.com/"] {
        let (tenant, sub) = subscribed(&h, url, None).await;
        let (current, previous) = (Secret::generate(&mut rng), Secret::generate(&mut rng));
        stored_in_plain_text(&h, &sub, &current, &previous).await;
        plain.push((tenant, sub, current));
    }
    let sealed_already = subscribed(&h, "https://c.example.com/", None).await.1;

    let report = |sealed, changed_meanwhile| hookwise_core::services::SealReport {
        sealed,
        changed_meanwhile,
    };
    assert_eq!(h.services.seal_stored_secrets().await.unwrap(), report(2, 0));
    assert_eq!(
        h.services.seal_stored_secrets().await.unwrap(),
        report(0, 0),
        "nothing left to seal"
    );
    for (tenant, sub, current) in &plain {
        let stored = h.store.get_subscription(&tenant.id, &sub.id).await.unwrap().unwrap();
        assert!(stored.secret.plain().is_none() && stored.previous_secret.unwrap().plain().is_none());
        h.services.ingest(tenant, event("invoice.paid"), None).await.unwrap();
        h.drain_now().await;
        let req = h.sender.requests.lock().unwrap().last().unwrap().clone();
        let header = |name: &str| req.headers.iter().find(|(k, _)| k == name).unwrap().1.clone();
        let one = signing::sign(
            current,
            &header("webhook-id"),
            header("webhook-timestamp").parse().unwrap(),
            &req.body,
        );
        assert!(
            header("webhook-signature").contains(&one),
            "the same secret signs, sealed"
        );
    }
    let untouched = h
        .store
        .get_subscription(&sealed_already.tenant_id, &sealed_already.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        untouched.updated_at, sealed_already.updated_at,
        "a sealed one is not written"
    );
}

#[tokio::test]
async fn given_the_queue_giving_up_on_an_attempts_messages_again_and_again_then_it_counts_as_failed_and_the_cycle_ends()
{
    // A worker that never finishes (its messages go to the dead-letter queue each time): the
    // third time for one attempt, the attempt counts as failed, and the schedule (one retry)
    // decides: a retry, then dead, told once. Not put back for ever.
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![1])).await;
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let id = &ingested.deliveries[0].id;
    let mut redriven = h.queue.take_visible();
    let (mut counted, mut queued) = (0, 0);
    for _ in 0..6 {
        assert_eq!(redriven.len(), 1, "{redriven:?}");
        let report = h.services.handle_dead_letters(&redriven).await.unwrap();
        counted += report.counted;
        queued += report.queued;
        h.clock.advance(Duration::seconds(2));
        redriven = h.queue.take_visible();
    }
    assert_eq!(counted, 2, "each attempt counted once, the third time");
    let (delivery, attempts) = h.services.get_delivery(&tenant, id).await.unwrap();
    assert_eq!(
        (delivery.status, delivery.attempts),
        (DeliveryStatus::Dead, 2),
        "{delivery:?}"
    );
    assert!(
        attempts.iter().all(|a| a.status_code.is_none() && a.error.is_some()),
        "{attempts:?}"
    );
    assert!(h.sender.requests.lock().unwrap().is_empty());
    // Its death is handled where it happened, its owner told: not sent to the dead-letter
    // queue, which the DeadLetter function reads and, on AWS, may not send to.
    assert_eq!(queued, 1);
    assert!(h.queue.take_dead().is_empty(), "nothing sent to the dead-letter queue");
    assert_eq!(h.mailer.sent.lock().unwrap().len(), 1, "the owner's email");
}

#[tokio::test]
async fn given_the_record_of_a_sent_email_failing_once_then_it_is_tried_again_and_the_owner_gets_one_email() {
    // The email goes out, then its record (`finish_digest`) is throttled once: tried again,
    // it lands, rather than leaving the notice unsent for the next tick to email again.
    let h = Harness::new(ScriptedSender::always(503));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_subscription(
            &tenant,
            new_sub("https://down.example.com/hook", &["*"], Some(vec![1, 2])),
        )
        .await
        .unwrap();
    h.store
        .failing_digest_finishes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.run_for(Duration::minutes(30), Duration::seconds(1)).await;
    assert_eq!(h.mailer.sent.lock().unwrap().len(), 1, "exactly one email");
}

/// The tenant's deliveries, the first page.
async fn deliveries(h: &Harness, tenant: &Tenant) -> Vec<Delivery> {
    h.services
        .list_deliveries(tenant, DeliveryQuery::default())
        .await
        .unwrap()
        .items
}

#[tokio::test]
async fn given_a_first_attempts_message_that_comes_before_its_ingest_has_stored_the_delivery_then_it_is_looked_at_again_in_milliseconds(
) {
    // A fast queue hands the message over while the ingest still writes (its message goes
    // first): two reads find nothing, the third finds it. Delivered at once, not sent back
    // with the queue's shortest delay, a second.
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = subscribed(&h, "https://a.example.com/", Some(vec![1])).await;
    let started = h.clock.now();
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let task = h.queue.take_visible().remove(0);
    h.store
        .unseen_delivery_reads
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let outcome = h.services.deliver(&task).await.unwrap();
    assert_eq!(outcome, DeliverOutcome::Delivered);
    assert_eq!(h.queue.pending(), 0, "no copy sent back");
    assert!(
        h.clock.now() - started < Duration::milliseconds(100),
        "{}",
        h.clock.now() - started
    );
}
