//! The dead-letter function: an SQS batch from the dead-letter queue, handled at once (so
//! many deaths of one owner make one digest) by the core's [`Services::handle_messages`].
//!
//! The queue holds two kinds of message with the same body (a delivery task): the ones the
//! deliver function handed on after the last failed attempt, and the ones SQS's own redrive
//! moved here after `maxReceiveCount` failed receives (they carry a
//! `DeadLetterQueueSourceArn` attribute). The service tells them apart by the delivery's
//! state: a dead delivery's owner is told (once); a delivery not dead goes back on its
//! schedule, since the queue giving up on a message is no verdict on the delivery.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use hookwise_core::services::{QueueRole, Services};

/// `deadline_ms`: the invocation's, from the Lambda context (milliseconds since the epoch).
pub async fn handle(services: &Services, event: SqsEvent, deadline_ms: u64) -> SqsBatchResponse {
    hookwise_aws::handle_sqs_event(services, QueueRole::DeadLetter, event, deadline_ms).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lambda_events::sqs::SqsEvent;
    use hookwise_aws::encode_task;
    use hookwise_core::model::*;
    use hookwise_core::policy::{Jitter, RetryPolicy};
    use hookwise_core::ports::Store;
    use hookwise_core::services::{NewEvent, NewSubscription};
    use hookwise_core::testing::memory::{Harness, ScriptedSender};

    fn sqs_event(messages: &[(&str, String, bool)]) -> SqsEvent {
        let records: Vec<_> = messages
            .iter()
            .map(|(id, body, redriven)| {
                let mut attributes = serde_json::json!({"ApproximateReceiveCount": "1"});
                if *redriven {
                    attributes["DeadLetterQueueSourceArn"] = "arn:aws:sqs:us-east-1:123456789012:delivery".into();
                }
                serde_json::json!({"messageId": id, "receiptHandle": "rh", "body": body, "attributes": attributes,
                    "messageAttributes": {}, "eventSource": "aws:sqs", "awsRegion": "us-east-1"})
            })
            .collect();
        serde_json::from_value(serde_json::json!({ "Records": records })).unwrap()
    }

    /// A tenant, a subscription on `policy`, one event: its first delivery task.
    async fn one_task(h: &Harness, policy: RetryPolicy) -> hookwise_core::ports::DeliveryTask {
        let (tenant, _) = h.tenant("owner@example.com").await;
        let sub = NewSubscription {
            url: EndpointUrl::parse("https://hooks.example.com/in").unwrap(),
            event_types: vec![EventTypeFilter::parse("*").unwrap()],
            owner_email: None,
            retry_policy: Some(policy),
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
            event_type: EventType::parse("invoice.paid").unwrap(),
            payload: serde_json::json!({}),
        };
        h.services.ingest(&tenant, event, None).await.unwrap();
        h.queue.take_visible().remove(0)
    }

    #[tokio::test]
    async fn given_a_message_sqs_redrove_for_a_pending_delivery_then_it_goes_back_on_its_schedule_not_dead() {
        let h = Harness::new(ScriptedSender::always(200));
        let task = one_task(&h, RetryPolicy::custom(vec![1], Jitter::None, false).unwrap()).await;

        // SQS gave up on the message (say the function timed out five times), and sent it
        // here, twice (at least once); a body that is no task comes with it.
        let body = encode_task(&task);
        let out = handle(
            &h.services,
            sqs_event(&[
                ("a", body.clone(), true),
                ("b", body, true),
                ("c", "garbage".into(), false),
            ]),
            h.deadline_in(60),
        )
        .await;
        let failed: Vec<_> = out
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        assert_eq!(failed, ["c"], "the undecodable one stays on the queue for an operator");
        let d = h.store.get_delivery(&task.delivery_id).await.unwrap().unwrap();
        assert_eq!(d.status, DeliveryStatus::Pending, "no verdict on the delivery: {d:?}");
        assert_eq!(
            h.queue.take_visible(),
            // The delivery is stored: the new message has no first-queued time to look with,
            // and counts this redrive.
            vec![hookwise_core::ports::DeliveryTask {
                queued_at: None,
                redrives: 1,
                ..task
            }],
            "queued again, due now (once, though it came twice)"
        );
        assert!(
            h.mailer.sent.lock().unwrap().is_empty(),
            "nobody is told of a death that did not happen"
        );
    }

    #[tokio::test]
    async fn given_a_delivery_dead_after_its_schedule_then_its_owner_is_told_once() {
        let h = Harness::new(ScriptedSender::always(500));
        let task = one_task(&h, RetryPolicy::custom(vec![], Jitter::None, false).unwrap()).await;
        h.services
            .deliver_batch(std::slice::from_ref(&task))
            .await
            .into_iter()
            .for_each(|r| {
                r.unwrap();
            });
        let dead = h.queue.take_dead();
        assert_eq!(dead.len(), 1, "one attempt, no retries: dead");

        let body = encode_task(&dead[0]);
        let out = handle(
            &h.services,
            sqs_event(&[("a", body.clone(), false), ("b", body, false)]),
            h.deadline_in(60),
        )
        .await;
        assert!(out.batch_item_failures.is_empty(), "{out:?}");
        let d = h.store.get_delivery(&task.delivery_id).await.unwrap().unwrap();
        assert_eq!(d.status, DeliveryStatus::Dead);
        let sent = h.mailer.sent.lock().unwrap();
        assert_eq!(sent.len(), 1, "one email for one dead delivery");
        assert_eq!(sent[0].to.to_string(), "owner@example.com");
        assert!(sent[0].text.contains(&task.delivery_id.to_string()));
    }
}
