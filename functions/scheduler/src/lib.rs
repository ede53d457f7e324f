//! The scheduler function: each EventBridge tick runs [`Services::run_scheduler`] — retries
//! due within 15 minutes move from the scheduler table to SQS with their residual delay,
//! then deliveries left pending past their due time are re-queued, and first attempts whose
//! message the queue lost (the audit), then the owners' emails whose digest window has passed
//! go out.
//!
//! The event's content is not used (an EventBridge Scheduler or rule event, or `{}` from a
//! manual invoke all mean "tick"). A failed tick is an error for Lambda to record; the next
//! tick takes up where it stopped (the scheduler table keeps the minutes it has not emptied).

use hookwise_core::services::Services;
use serde_json::Value;

/// One tick; answers what it did ([`hookwise_core::services::SchedulerReport`]), e.g.
/// `{"skipped": false, "moved": 3, "tended": 1, "requeued": 0, "audited": 0, "emails": 1,
/// "set_aside": 0, "failed": 0}` (`skipped`: another tick held the lease; `failed`: phases
/// that failed, logged, the tick going on past them).
pub async fn handle(services: &Services, event: &Value) -> Result<Value, hookwise_core::Error> {
    let report = services.run_scheduler().await.inspect_err(|err| {
        let tick = event.get("id").and_then(|v| v.as_str()).unwrap_or("-");
        tracing::error!(error = %err, retryable = err.is_retryable(), tick, "scheduler tick failed");
    });
    services.flush_metrics();
    Ok(serde_json::to_value(report?).expect("a report of counts is JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;
    use hookwise_core::model::*;
    use hookwise_core::policy::{Jitter, RetryPolicy};
    use hookwise_core::ports::Clock;
    use hookwise_core::services::{NewEvent, NewSubscription};
    use hookwise_core::testing::memory::{Harness, ScriptedSender};
    use serde_json::json;

    /// The answer of a tick that only moved `n` retries.
    fn moved(n: u64) -> Value {
        json!({"skipped": false, "moved": n, "tended": 0, "requeued": 0, "audited": 0,
            "emails": 0, "set_aside": 0, "failed": 0})
    }

    #[tokio::test]
    async fn given_a_retry_beyond_the_queue_delay_then_a_tick_after_it_is_near_moves_it_to_the_queue() {
        // The queue holds 60 s at most, so a 300 s retry waits in the scheduler table.
        let h = Harness::with_config(
            ScriptedSender::always(500),
            hookwise_core::services::Config::default(),
            60,
        );
        let (tenant, _) = h.tenant("owner@example.com").await;
        let sub = NewSubscription {
            url: EndpointUrl::parse("https://hooks.example.com/in").unwrap(),
            event_types: vec![EventTypeFilter::parse("*").unwrap()],
            owner_email: None,
            retry_policy: Some(RetryPolicy::custom(vec![300], Jitter::None, false).unwrap()),
            timeout_ms: None,
            rate_limit_per_second: None,
            auto_disable_after_hours: None,
            circuit_breaker: None,
            description: None,
            filter: None,
            headers: None,
        };
        h.services.create_subscription(&tenant, sub).await.unwrap();
        let event = NewEvent {
            event_type: EventType::parse("a.b").unwrap(),
            payload: json!({}),
        };
        h.services.ingest(&tenant, event, None).await.unwrap();
        let first = h.queue.take_visible();
        h.services.deliver_batch(&first).await.into_iter().for_each(|r| {
            r.unwrap();
        });
        assert_eq!(
            h.scheduler.items.lock().unwrap().len(),
            1,
            "the retry is in the scheduler table"
        );

        let tick = serde_json::from_str(include_str!("../../../infra/events/scheduler-scheduled.json")).unwrap();
        // 299 s to go: more than the queue can hold, so it stays in the table.
        h.clock.set(h.clock.now() + Duration::seconds(1));
        assert_eq!(handle(&h.services, &tick).await.unwrap(), moved(0));
        assert_eq!(h.scheduler.items.lock().unwrap().len(), 1);
        // 50 s to go: within the queue's limit, moved with the whole residual delay.
        h.clock.set(h.clock.now() + Duration::seconds(249));
        assert_eq!(handle(&h.services, &tick).await.unwrap(), moved(1));
        assert!(h.scheduler.items.lock().unwrap().is_empty());
        let (task, delay) = h.queue.log.lock().unwrap().last().cloned().unwrap();
        assert_eq!(
            (task.attempt, delay),
            (2, 50),
            "the residual delay, so the retry comes when it is due"
        );
        assert_eq!(handle(&h.services, &json!({})).await.unwrap(), moved(0));
    }
}
