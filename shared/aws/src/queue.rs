//! The delivery queue and its dead-letter queue on SQS. A message's body is the
//! [`DeliveryTask`] as JSON ([`encode_task`] / [`decode_task`]), on both queues: a message
//! SQS itself moved to the dead-letter queue after too many receives reads the same.

use async_trait::async_trait;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use aws_sdk_sqs::Client;
use futures::{StreamExt, TryStreamExt};
use hookwise_core::ports::{DeliveryQueue, DeliveryTask, PortResult};
use hookwise_core::PortError;

use crate::config::AwsConfig;
use crate::error::classify;

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
    client: Client,
    delivery_queue_url: String,
    dead_letter_queue_url: String,
    max_delay_seconds: u32,
}

impl SqsQueue {
    pub fn new(client: Client, config: &AwsConfig) -> Self {
        Self {
            client,
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
        };
        let body = encode_task(&task);
        assert!(body.contains("\"attempt\":3"));
        assert_eq!(decode_task(&body).unwrap(), task);
        assert!(decode_task("{\"delivery_id\":\"nope\"}").is_err());
    }
}
