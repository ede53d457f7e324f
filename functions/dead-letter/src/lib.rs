//! The dead-letter function: an SQS batch from the dead-letter queue, handled by
//! [`Services::handle_dead_letters`] in one go (so many deaths of one owner make one digest).
//!
//! The queue holds two kinds of message with the same body (a delivery task): the ones the
//! deliver function handed on after the last failed attempt, and the ones SQS's own redrive
//! moved here after `maxReceiveCount` failed receives (poison messages; they carry a
//! `DeadLetterQueueSourceArn` attribute). The service tells them apart by the delivery's
//! state: a delivery not yet dead is marked dead first. Both end with one email.
//!
//! If the service fails, every decodable message of the batch is reported, so SQS sends
//! them again; a notice already claimed is not sent twice. A body that is not a task is
//! logged and dropped: there is no delivery to mark and no owner to tell, and redelivering
//! it cannot change it.

use std::sync::Arc;

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use hookwise_aws::decode_task;
use hookwise_core::services::Services;
use hookwise_http::{HttpSender, SenderConfig};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The services on the AWS adapters, built once per container. The sender is never used
/// here (nothing is POSTed), but the ports carry one.
pub async fn services_from_env() -> Result<Services, BoxError> {
    hookwise_aws::services_from_env(Arc::new(HttpSender::new(SenderConfig::default())?)).await
}

pub async fn handle(services: &Services, event: SqsEvent) -> SqsBatchResponse {
    let mut ids = Vec::new();
    let mut tasks = Vec::new();
    for m in &event.records {
        let id = m.message_id.clone().unwrap_or_default();
        match decode_task(m.body.as_deref().unwrap_or_default()) {
            Ok(task) => {
                let redriven = m.attributes.contains_key("DeadLetterQueueSourceArn");
                tracing::info!(message_id = %id, delivery_id = %task.delivery_id, attempt = task.attempt, redriven, "dead letter");
                ids.push(id);
                tasks.push(task);
            }
            Err(err) => {
                let body: String = m.body.as_deref().unwrap_or_default().chars().take(200).collect();
                tracing::error!(message_id = %id, error = %err, body, "dead-letter message is not a delivery task; dropping it");
            }
        }
    }
    let mut out = SqsBatchResponse::default();
    match services.handle_dead_letters(&tasks).await {
        Ok(report) => {
            if report.emails > 0 {
                tracing::info!(
                    notified = report.notified,
                    emails = report.emails,
                    "owners told of dead deliveries"
                );
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, retryable = err.is_retryable(), messages = ids.len(), "dead-letter batch failed; SQS will redeliver it");
            out.batch_item_failures = ids
                .into_iter()
                .map(|id| {
                    let mut f = BatchItemFailure::default();
                    f.item_identifier = id;
                    f
                })
                .collect();
        }
    }
    out
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

    #[tokio::test]
    async fn given_a_message_sqs_redrove_for_a_pending_delivery_then_it_is_marked_dead_and_the_owner_told_once() {
        let h = Harness::new(ScriptedSender::always(200));
        let (tenant, _) = h.tenant("owner@example.com").await;
        let sub = NewSubscription {
            url: EndpointUrl::parse("https://hooks.example.com/in").unwrap(),
            event_types: vec![EventTypeFilter::parse("*").unwrap()],
            owner_email: None,
            retry_policy: Some(RetryPolicy::custom(vec![1], Jitter::None, false).unwrap()),
            timeout_ms: None,
            description: None,
        };
        h.services.create_subscription(&tenant, sub).await.unwrap();
        let event = NewEvent {
            event_type: EventType::parse("invoice.paid").unwrap(),
            payload: serde_json::json!({}),
        };
        h.services.ingest(&tenant, event, None).await.unwrap();
        let task = h.queue.take_visible().remove(0);

        // The poison message, twice (SQS is at least once), and a body that is no task.
        let body = encode_task(&task);
        let out = handle(
            &h.services,
            sqs_event(&[
                ("a", body.clone(), true),
                ("b", body, true),
                ("c", "garbage".into(), false),
            ]),
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
