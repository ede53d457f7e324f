//! Endpoint statistics on in-memory ports: attempts counted as the receiver saw them, written
//! every few seconds per endpoint and at a batch's end, read back by window.

use chrono::Duration;
use hookwise_core::circuit::CircuitBreaker;
use hookwise_core::model::*;
use hookwise_core::policy::{Jitter, RetryPolicy};
use hookwise_core::ports::{Clock, QueueMessage, SendOutcome, Store};
use hookwise_core::services::{NewEvent, NewSubscription, QueueRole};
use hookwise_core::stats::Window;
use hookwise_core::testing::memory::{status_outcome, Harness, ScriptedSender};
use hookwise_core::Error;

fn new_sub(url: &str, schedule: Vec<u64>) -> NewSubscription {
    NewSubscription {
        url: EndpointUrl::parse(url).unwrap(),
        event_types: vec![EventTypeFilter::all()],
        owner_email: None,
        retry_policy: Some(RetryPolicy::custom(schedule, Jitter::None, false).unwrap()),
        timeout_ms: None,
        rate_limit_per_second: None,
        auto_disable_after_hours: None,
        circuit_breaker: Some(CircuitBreaker::off()),
        description: None,
        filter: None,
        headers: None,
    }
}

fn event() -> NewEvent {
    NewEvent {
        event_type: EventType::parse("invoice.paid").unwrap(),
        payload: serde_json::json!({"amount": 42}),
    }
}

fn answer(status: u16, ms: u64) -> SendOutcome {
    SendOutcome {
        duration_ms: ms,
        ..status_outcome(status)
    }
}

#[tokio::test]
async fn given_attempts_and_a_death_then_the_window_counts_them_by_outcome_latency_and_dead() {
    // The second and fourth POSTs to `flaky` fail; `down` always does.
    let h = Harness::new(ScriptedSender::new(|url, n| match (url.contains("down"), n) {
        (true, _) => answer(503, 40),
        (false, 1 | 3) => answer(404, 300),
        (false, _) => answer(200, 20),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let flaky = h
        .services
        .create_subscription(&tenant, new_sub("https://flaky.example.com/", vec![1]))
        .await
        .unwrap()
        .subscription;
    let down = h
        .services
        .create_subscription(&tenant, new_sub("https://down.example.com/", vec![1]))
        .await
        .unwrap()
        .subscription;
    for _ in 0..4 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    h.run_for(Duration::seconds(20), Duration::seconds(1)).await;
    // The last counts are written by a tick a few seconds on.
    h.clock.advance(Duration::seconds(6));
    h.services.run_scheduler().await.unwrap();

    // What the receivers got, counted from outside.
    let posts = |host: &str| {
        h.sender
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.url.as_str().contains(host))
            .count() as u64
    };
    let stats = h
        .services
        .subscription_stats(&tenant, &flaky.id, Window::Hour)
        .await
        .unwrap();
    assert_eq!(stats.total.attempts(), posts("flaky"));
    assert_eq!(stats.total.succeeded, 4, "each event delivered once");
    assert_eq!(stats.total.http_4xx, posts("flaky") - 4);
    assert_eq!(stats.total.dead, 0);
    assert_eq!(stats.total.latency_percentile(0.5), Some(Some(25)));
    assert_eq!(stats.total.latency_percentile(0.99), Some(Some(500)));

    let stats = h
        .services
        .subscription_stats(&tenant, &down.id, Window::Day)
        .await
        .unwrap();
    assert_eq!(stats.total.attempts(), posts("down"));
    assert_eq!(
        (stats.total.http_5xx, stats.total.dead),
        (8, 4),
        "two attempts each, then dead"
    );
    assert_eq!(stats.success_rate(), Some(0.0));
    assert_eq!(stats.series.len(), 24);
    assert_eq!(stats.series.last().unwrap().1.attempts(), 8, "all in the current hour");

    // Another tenant's subscription is not found; a window ending later leaves them out.
    let (other, _) = h.tenant("other@example.com").await;
    assert!(matches!(
        h.services.subscription_stats(&other, &down.id, Window::Hour).await,
        Err(Error::NotFound { .. })
    ));
    h.clock.advance(Duration::hours(2));
    let later = h
        .services
        .subscription_stats(&tenant, &down.id, Window::Hour)
        .await
        .unwrap();
    assert_eq!(later.total.attempts(), 0);
}

#[tokio::test]
async fn given_a_burst_then_its_counts_are_written_every_few_seconds_and_at_the_batchs_end() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(&tenant, new_sub("https://ok.example.com/", vec![1]))
        .await
        .unwrap()
        .subscription;
    for _ in 0..10 {
        h.services.ingest(&tenant, event(), None).await.unwrap();
    }
    let stored = || async {
        let buckets = h
            .store
            .endpoint_stats(&sub.id, h.clock.now() - Duration::hours(1))
            .await
            .unwrap();
        buckets.iter().map(|(_, c)| c.attempts()).sum::<u64>()
    };
    // One attempt at a time, as a worker would take them: the first is written at once (no
    // write before it), the rest wait for a few seconds to pass.
    let tasks = h.queue.take_visible();
    for task in &tasks[..5] {
        h.services.deliver(task).await.unwrap();
    }
    assert_eq!(stored().await, 1, "one write, then counted in the process");
    h.clock.advance(Duration::seconds(6));
    h.services.deliver(&tasks[5]).await.unwrap();
    assert_eq!(stored().await, 6, "a few seconds on, the next attempt writes them all");

    // The rest as one batch, a few seconds on: its first attempt writes what was held, the
    // rest wait for a few seconds.
    h.clock.advance(Duration::seconds(6));
    let message = |task| QueueMessage {
        message_id: "m".into(),
        task: Ok(task),
        redriven: false,
        receive_count: 1,
    };
    let messages: Vec<QueueMessage> = tasks[6..].iter().cloned().map(message).collect();
    h.services.handle_messages(QueueRole::Delivery, &messages, None).await;
    assert_eq!(stored().await, 7, "the rest written a moment ago");

    // Any batch's end writes what is due, the endpoints it attempted or not: here one for
    // another endpoint, a few seconds on.
    let other = h
        .services
        .create_subscription(&tenant, new_sub("https://other.example.com/", vec![1]))
        .await
        .unwrap()
        .subscription;
    h.services.delete_subscription(&tenant, &sub.id).await.unwrap();
    h.services.ingest(&tenant, event(), None).await.unwrap();
    let for_other = h.queue.take_visible();
    assert_eq!(for_other.len(), 1);
    h.clock.advance(Duration::seconds(6));
    h.services
        .handle_messages(QueueRole::Delivery, &[message(for_other[0].clone())], None)
        .await;
    assert_eq!(stored().await, 10);
    let others = h
        .store
        .endpoint_stats(&other.id, h.clock.now() - Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(others.iter().map(|(_, c)| c.attempts()).sum::<u64>(), 1);
    assert_eq!(h.sender.requests.lock().unwrap().len(), 11);
}
