//! The deliver function: an SQS batch of delivery tasks from the delivery queue, one attempt
//! each, answered with the messages SQS must redeliver. The rule for which those are is the
//! core's [`Services::handle_messages`]; this crate only names the queue.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use hookwise_core::services::{QueueRole, Services};

/// `deadline_ms`: the invocation's, from the Lambda context (milliseconds since the epoch).
pub async fn handle(services: &Services, event: SqsEvent, deadline_ms: u64) -> SqsBatchResponse {
    hookwise_aws::handle_sqs_event(services, QueueRole::Delivery, event, deadline_ms).await
}

#[cfg(test)]
mod tests;
