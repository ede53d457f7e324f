//! The two SQS-triggered functions' whole job: an SQS event in, the core's redelivery rule
//! ([`Services::handle_messages`]) applied, an `SqsBatchResponse` out naming the messages
//! SQS must send again (the event source mapping sets `ReportBatchItemFailures`).

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use hookwise_core::ports::QueueMessage;
use hookwise_core::services::{Disposition, QueueRole, Services};

use crate::decode_task;

/// A record as the core's queue message. A record without an id gets an empty one, which
/// makes Lambda retry the whole batch if it is reported: the safe side.
pub fn queue_message(record: &SqsMessage) -> QueueMessage {
    QueueMessage {
        message_id: record.message_id.clone().unwrap_or_default(),
        task: decode_task(record.body.as_deref().unwrap_or_default()).map_err(|e| e.to_string()),
        redriven: record.attributes.contains_key("DeadLetterQueueSourceArn"),
        receive_count: record
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|n| n.parse().ok())
            .unwrap_or(1),
    }
}

/// The Lambda context's deadline as a time. Lambda sends milliseconds since the epoch;
/// `cargo lambda watch` sends the function's timeout instead (600000), so a value that
/// could not be a time this century is read as milliseconds from `now`.
pub fn invocation_deadline(
    deadline_ms: u64,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    const YEAR_2001_MS: u64 = 978_307_200_000;
    let ms = i64::try_from(deadline_ms).ok()?;
    if deadline_ms < YEAR_2001_MS {
        return Some(now + chrono::Duration::milliseconds(ms));
    }
    chrono::DateTime::from_timestamp_millis(ms)
}

/// Handle one SQS batch from `role`'s queue within the invocation's deadline (the Lambda
/// context's, in milliseconds since the epoch).
pub async fn handle_sqs_event(
    services: &Services,
    role: QueueRole,
    event: SqsEvent,
    deadline_ms: u64,
) -> SqsBatchResponse {
    let messages: Vec<QueueMessage> = event.records.iter().map(queue_message).collect();
    let deadline = invocation_deadline(deadline_ms, chrono::Utc::now());
    let dispositions = services.handle_messages(role, &messages, deadline).await;
    services.flush_metrics();
    let mut response = SqsBatchResponse::default();
    response.set_failures(
        messages
            .into_iter()
            .zip(dispositions)
            .filter(|(_, d)| *d == Disposition::Redeliver)
            .map(|(m, _)| m.message_id),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_an_epoch_time_from_lambda_and_a_duration_from_cargo_lambda_watch() {
        let now = chrono::DateTime::from_timestamp_millis(1_796_121_944_927).unwrap();
        assert_eq!(
            invocation_deadline(1_796_121_974_927, now),
            Some(now + chrono::Duration::seconds(30))
        );
        assert_eq!(
            invocation_deadline(600_000, now),
            Some(now + chrono::Duration::seconds(600))
        );
    }
}
