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
    }
}

/// Handle one SQS batch from `role`'s queue.
pub async fn handle_sqs_event(services: &Services, role: QueueRole, event: SqsEvent) -> SqsBatchResponse {
    let messages: Vec<QueueMessage> = event.records.iter().map(queue_message).collect();
    let dispositions = services.handle_messages(role, &messages).await;
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
