//! The deliver function: one SQS batch of delivery tasks, handled concurrently (at most
//! `Config::deliver_concurrency` at once) by [`Services::deliver_batch`], answered with the
//! messages SQS must redeliver.
//!
//! What goes into `batchItemFailures` (and so comes back after the visibility timeout):
//! - every `Err` from `deliver`, retryable or not. A retryable one (throttling, 5xx, a
//!   timeout) may pass next time. A permanent one (access denied, a missing table, a corrupt
//!   item) is not swallowed either: after the queue's `maxReceiveCount` SQS's own redrive
//!   moves the message to the dead-letter queue, whose function marks the delivery dead and
//!   tells its owner, so the fault ends as a visible dead delivery rather than a dropped
//!   message (deleting it would leave the delivery pending for the sweep to re-queue forever).
//! - a body that does not decode as a task. During a deploy old and new code run side by
//!   side; a redelivery may reach a container that reads it. If none does, the redrive parks
//!   it on the dead-letter queue, where it is logged.
//!
//! Stale and duplicate messages are `Ok(Stale)`: done, deleted.

use std::sync::Arc;

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use hookwise_aws::{decode_task, env};
use hookwise_core::ports::DeliveryTask;
use hookwise_core::services::{DeliverOutcome, Services};
use hookwise_http::{HttpSender, SenderConfig};
use ipnet::IpNet;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The CIDRs in `HOOKWISE_ALLOWED_TARGET_CIDRS` (comma-separated; empty allows none).
pub fn allowed_cidrs(value: Option<&str>) -> Result<Vec<IpNet>, BoxError> {
    value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|e| format!("{}: `{s}` is not a CIDR: {e}", env::ALLOWED_TARGET_CIDRS).into())
        })
        .collect()
}

/// The services on the AWS adapters and the real HTTP sender, built once per container.
pub async fn services_from_env() -> Result<Services, BoxError> {
    let allow = allowed_cidrs(std::env::var(env::ALLOWED_TARGET_CIDRS).ok().as_deref())?;
    let sender = HttpSender::new(SenderConfig {
        allow_cidrs: allow,
        ..SenderConfig::default()
    })?;
    hookwise_aws::services_from_env(Arc::new(sender)).await
}

fn message_id(m: &SqsMessage) -> String {
    // An empty identifier makes Lambda retry the whole batch: the safe side.
    m.message_id.clone().unwrap_or_default()
}

/// Deliver every decodable message; report the ones SQS must send again.
pub async fn handle(services: &Services, event: SqsEvent) -> SqsBatchResponse {
    let mut failures = Vec::new();
    let mut ids = Vec::new();
    let mut tasks: Vec<DeliveryTask> = Vec::new();
    for m in &event.records {
        match decode_task(m.body.as_deref().unwrap_or_default()) {
            Ok(task) => {
                ids.push(message_id(m));
                tasks.push(task);
            }
            Err(err) => {
                tracing::error!(message_id = %message_id(m), error = %err, "message body is not a delivery task; leaving it to SQS's redrive");
                failures.push(message_id(m));
            }
        }
    }
    let results = services.deliver_batch(&tasks).await;
    for ((id, task), result) in ids.into_iter().zip(&tasks).zip(results) {
        if let Some(why) = failed(&result) {
            tracing::warn!(message_id = %id, delivery_id = %task.delivery_id, attempt = task.attempt, error = %why, "delivery failed; SQS will redeliver the message");
            failures.push(id);
        }
    }
    response(failures)
}

/// Why a message must come back, if it must.
fn failed(result: &hookwise_core::Result<DeliverOutcome>) -> Option<String> {
    match result {
        Ok(_) => None,
        Err(err) if err.is_retryable() => Some(format!("retryable: {err}")),
        Err(err) => Some(format!(
            "permanent, redriven to the dead-letter queue after maxReceiveCount: {err}"
        )),
    }
}

pub fn response(failed_message_ids: Vec<String>) -> SqsBatchResponse {
    let mut out = SqsBatchResponse::default();
    out.batch_item_failures = failed_message_ids
        .into_iter()
        .map(|id| {
            let mut f = BatchItemFailure::default();
            f.item_identifier = id;
            f
        })
        .collect();
    out
}

#[cfg(test)]
mod tests;
