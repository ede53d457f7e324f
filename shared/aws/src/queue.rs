//! The delivery queue and its dead-letter queue on SQS. A message's body is the
//! [`DeliveryTask`] as JSON ([`encode_task`] / [`decode_task`]), on both queues: a message
//! SQS itself moved to the dead-letter queue after too many receives reads the same.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, MessageSystemAttributeName,
    QueueAttributeName, SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;
use futures::{StreamExt, TryStreamExt};
use hookwise_core::ports::{DeliveryQueue, DeliveryTask, PortResult, QueueConsumer, QueueMessage, Received};
use hookwise_core::PortError;

use crate::config::AwsConfig;
use crate::error::classify;
use crate::lazy_client::LazyClient;

/// SQS's limit on one `SendMessageBatch`.
const MAX_BATCH: usize = 10;
const CONCURRENCY: usize = 4;

pub fn encode_task(task: &DeliveryTask) -> String {
    serde_json::to_string(task).expect("a task serialises")
}

pub fn decode_task(body: &str) -> Result<DeliveryTask, serde_json::Error> {
    serde_json::from_str(body)
}

#[derive(Clone, Debug)]
pub struct SqsQueue {
    client: LazyClient<Client>,
    delivery_queue_url: String,
    dead_letter_queue_url: String,
    max_delay_seconds: u32,
}

impl SqsQueue {
    pub fn new(client: impl Into<LazyClient<Client>>, config: &AwsConfig) -> Self {
        Self {
            client: client.into(),
            delivery_queue_url: config.delivery_queue_url.clone(),
            dead_letter_queue_url: config.dead_letter_queue_url.clone(),
            max_delay_seconds: config.queue_max_delay_seconds,
        }
    }

    pub fn delivery_queue_url(&self) -> &str {
        &self.delivery_queue_url
    }

    pub fn dead_letter_queue_url(&self) -> &str {
        &self.dead_letter_queue_url
    }

    /// Tasks to one queue, ten a request, a few requests at once.
    async fn send(&self, queue_url: &str, tasks: Vec<(DeliveryTask, u32)>, what: &str) -> PortResult<()> {
        // Owned chunks: the stream's closure must not borrow from its argument.
        let chunks: Vec<Vec<(DeliveryTask, u32)>> = tasks.chunks(MAX_BATCH).map(<[_]>::to_vec).collect();
        futures::stream::iter(chunks)
            .map(|chunk| self.send_batch(queue_url, chunk, what))
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn send_batch(&self, queue_url: &str, chunk: Vec<(DeliveryTask, u32)>, what: &str) -> PortResult<()> {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, (task, delay))| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(encode_task(task))
                    .delay_seconds(*delay as i32)
                    // SQS fair queues: the tenant is the message group on this standard
                    // queue, so one tenant's backlog does not hold up another's.
                    .set_message_group_id(task.tenant_id.as_ref().map(|t| t.to_string()))
                    .build()
                    .map_err(|e| PortError::permanent(format!("building {what}"), e))
            })
            .collect::<PortResult<Vec<_>>>()?;
        let out = self
            .client
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| classify(what, e))?;
        // A batch succeeds as a call even when some entries failed.
        let failed = out.failed();
        if failed.is_empty() {
            return Ok(());
        }
        let detail = failed
            .iter()
            .map(|f| format!("{} ({})", f.code(), f.message().unwrap_or("-")))
            .collect::<Vec<_>>()
            .join(", ");
        let source = format!("{} of {} messages failed: {detail}", failed.len(), chunk.len());
        if failed.iter().any(|f| f.sender_fault()) {
            Err(PortError::permanent(what, source))
        } else {
            Err(PortError::retryable(what, source))
        }
    }
}

#[async_trait]
impl DeliveryQueue for SqsQueue {
    fn max_delay_seconds(&self) -> u32 {
        self.max_delay_seconds
    }

    async fn enqueue(&self, tasks: &[(DeliveryTask, u32)]) -> PortResult<()> {
        if let Some((task, delay)) = tasks.iter().find(|(_, d)| *d > self.max_delay_seconds) {
            return Err(PortError::permanent(
                "enqueue",
                format!(
                    "a delay of {delay} s for {} exceeds the queue's {} s: use the scheduler table",
                    task.delivery_id, self.max_delay_seconds
                ),
            ));
        }
        self.send(&self.delivery_queue_url, tasks.to_vec(), "enqueue").await
    }

    async fn dead_letter(&self, tasks: &[DeliveryTask]) -> PortResult<()> {
        self.send(
            &self.dead_letter_queue_url,
            tasks.iter().map(|t| (t.clone(), 0)).collect(),
            "dead letter",
        )
        .await
    }
}

/// The receiving end of one SQS queue, for hosts that poll it themselves (`hookwise dev
/// --aws`, the tests' event-source emulator); on Lambda the event source mapping polls.
#[derive(Clone, Debug)]
pub struct SqsConsumer {
    client: LazyClient<Client>,
    queue_url: String,
    visibility_timeout: Duration,
}

impl SqsConsumer {
    /// A consumer of `queue_url`, which reads the queue's own visibility timeout.
    pub async fn connect(client: impl Into<LazyClient<Client>>, queue_url: &str) -> PortResult<Self> {
        let client = client.into();
        let out = client
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(QueueAttributeName::VisibilityTimeout)
            .send()
            .await
            .map_err(|e| classify("read the queue's visibility timeout", e))?;
        let seconds = out
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::VisibilityTimeout))
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| {
                PortError::permanent("read the queue's visibility timeout", format!("none for {queue_url}"))
            })?;
        Ok(Self {
            client,
            queue_url: queue_url.to_owned(),
            visibility_timeout: Duration::from_secs(seconds),
        })
    }

    /// Receipt handles ten a request (SQS's batch limit), `what` for errors.
    async fn in_batches<F, Fut>(&self, receipts: &[String], what: &str, call: F) -> PortResult<()>
    where
        F: Fn(Vec<(String, String)>) -> Fut,
        Fut: std::future::Future<Output = PortResult<usize>>,
    {
        for chunk in receipts.chunks(MAX_BATCH) {
            let entries: Vec<(String, String)> = chunk
                .iter()
                .enumerate()
                .map(|(i, r)| (i.to_string(), r.clone()))
                .collect();
            let failed = call(entries).await?;
            if failed > 0 {
                // A receipt gone stale (the message came back and was received again) fails here.
                tracing::warn!(failed, queue = %self.queue_url, "{what}: some entries failed");
            }
        }
        Ok(())
    }
}

#[async_trait]
impl QueueConsumer for SqsConsumer {
    /// The receipt handle.
    type Receipt = String;

    async fn receive(&self, max: usize, wait: Duration) -> PortResult<Vec<Received<String>>> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(max.clamp(1, MAX_BATCH) as i32)
            .wait_time_seconds(wait.as_secs().min(20) as i32)
            .message_system_attribute_names(MessageSystemAttributeName::DeadLetterQueueSourceArn)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|e| classify("receive", e))?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                let redriven = m
                    .attributes()
                    .is_some_and(|a| a.contains_key(&MessageSystemAttributeName::DeadLetterQueueSourceArn));
                let receive_count = m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                Received {
                    message: QueueMessage {
                        message_id: m.message_id().unwrap_or_default().to_owned(),
                        task: decode_task(m.body().unwrap_or_default()).map_err(|e| e.to_string()),
                        redriven,
                        receive_count,
                    },
                    receipt: m.receipt_handle.unwrap_or_default(),
                }
            })
            .collect())
    }

    async fn ack(&self, receipts: &[String]) -> PortResult<()> {
        self.in_batches(receipts, "delete", |entries| async move {
            let entries = entries
                .into_iter()
                .map(|(id, handle)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(id)
                        .receipt_handle(handle)
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| PortError::permanent("delete", e))?;
            let out = self
                .client
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| classify("delete", e))?;
            Ok(out.failed().len())
        })
        .await
    }

    async fn change_visibility(&self, receipts: &[String], hidden_for: Duration) -> PortResult<()> {
        // SQS takes whole seconds, at most 12 hours.
        let seconds = hidden_for.as_secs().min(12 * 3600) as i32;
        self.in_batches(receipts, "change visibility", |entries| async move {
            let entries = entries
                .into_iter()
                .map(|(id, handle)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(id)
                        .receipt_handle(handle)
                        .visibility_timeout(seconds)
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| PortError::permanent("change visibility", e))?;
            let out = self
                .client
                .change_message_visibility_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| classify("change visibility", e))?;
            Ok(out.failed().len())
        })
        .await
    }

    fn visibility_timeout(&self) -> Duration {
        self.visibility_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookwise_core::model::DeliveryId;

    #[test]
    fn a_task_body_round_trips_as_json() {
        let task = DeliveryTask {
            delivery_id: DeliveryId::generate(chrono::Utc::now(), &mut rand::rng()),
            round: 1,
            attempt: 3,
            queued_at: None,
            slot: None,
            tenant_id: None,
            held_until: None,
            redrives: 0,
        };
        let body = encode_task(&task);
        assert!(body.contains("\"attempt\":3"));
        assert_eq!(decode_task(&body).unwrap(), task);
        assert!(decode_task("{\"delivery_id\":\"nope\"}").is_err());
    }
}
