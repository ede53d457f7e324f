//! The worker loop: receive a batch, hand it to a handler, acknowledge what the handler is
//! done with. What is not acknowledged comes back after the queue's visibility timeout (and
//! after `maxReceiveCount` receives, the queue redrives it to the dead-letter queue): which
//! messages those are is decided by the handler, for the services by
//! [`Services::handle_messages`], so the redelivery rule lives in one place.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hookwise_core::ports::{QueueConsumer, QueueMessage};
use hookwise_core::services::{Disposition, QueueRole, Services};
use tokio_util::sync::CancellationToken;

/// Turns a batch of messages into what becomes of each one, in order.
#[async_trait]
pub trait BatchHandler: Send + Sync {
    async fn handle(&self, messages: &[QueueMessage]) -> Vec<Disposition>;
}

/// The services handling one queue's batches, as the Lambda functions do.
pub struct ServicesHandler {
    pub services: Arc<Services>,
    pub role: QueueRole,
}

#[async_trait]
impl BatchHandler for ServicesHandler {
    async fn handle(&self, messages: &[QueueMessage]) -> Vec<Disposition> {
        self.services.handle_messages(self.role, messages, None).await
    }
}

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// For logs: which queue.
    pub name: &'static str,
    /// Messages per receive (SQS: at most 10).
    pub batch_size: usize,
    /// How long one receive waits for a first message. Shutdown waits for it too: a receive
    /// is never cut short, or the messages it took would stay hidden until their timeout.
    pub wait: Duration,
    /// Batches handled at once: the next receive does not wait for the batch in hand (whose
    /// attempts may be waiting for their rate-limit slots), as Lambda's pollers do not.
    pub batches_in_flight: usize,
}

/// A pause after a failed receive, so a queue that is down is not polled hard.
const AFTER_ERROR: Duration = Duration::from_secs(1);

/// Drain `consumer` through `handler` until `stop` is cancelled, up to
/// `batches_in_flight` batches at once; the batches in hand are finished first.
pub async fn run_worker<C, H>(consumer: C, handler: H, config: WorkerConfig, stop: CancellationToken)
where
    C: QueueConsumer + 'static,
    C::Receipt: 'static,
    H: BatchHandler + 'static,
{
    let consumer = Arc::new(consumer);
    let handler = Arc::new(handler);
    let slots = Arc::new(tokio::sync::Semaphore::new(config.batches_in_flight.max(1)));
    let mut batches = tokio::task::JoinSet::new();
    while !stop.is_cancelled() {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = stop.cancelled() => break,
        };
        let batch = match consumer.receive(config.batch_size, config.wait).await {
            Ok(batch) => batch,
            Err(error) => {
                tracing::error!(queue = config.name, %error, "receive failed");
                tokio::select! {
                    _ = tokio::time::sleep(AFTER_ERROR) => {}
                    _ = stop.cancelled() => {}
                }
                continue;
            }
        };
        if batch.is_empty() {
            continue;
        }
        let (consumer, handler, name) = (consumer.clone(), handler.clone(), config.name);
        batches.spawn(async move { handle_batch(&*consumer, &*handler, name, batch, permit).await });
        while let Some(done) = batches.try_join_next() {
            log_panic(config.name, done);
        }
    }
    while let Some(done) = batches.join_next().await {
        log_panic(config.name, done);
    }
}

fn log_panic(queue: &str, done: Result<(), tokio::task::JoinError>) {
    if let Err(error) = done {
        tracing::error!(queue, %error, "a batch's handler panicked; its messages will be redelivered");
    }
}

/// Hand one batch to the handler, keeping it hidden meanwhile, and acknowledge what is done.
/// The batch's `slot` is given back once the handler is done: the ack is a queue round trip
/// that the next receive need not wait for (under load it was a tenth of each slot's time).
async fn handle_batch<C: QueueConsumer, H: BatchHandler>(
    consumer: &C,
    handler: &H,
    name: &str,
    batch: Vec<hookwise_core::ports::Received<C::Receipt>>,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let (receipts, messages): (Vec<_>, Vec<_>) = batch.into_iter().map(|r| (r.receipt, r.message)).unzip();
    let dispositions = keep_hidden(consumer, &receipts, handler.handle(&messages)).await;
    drop(slot);
    let done: Vec<C::Receipt> = receipts
        .into_iter()
        .zip(dispositions)
        .filter(|(_, d)| *d == Disposition::Done)
        .map(|(r, _)| r)
        .collect();
    if !done.is_empty() {
        if let Err(error) = consumer.ack(&done).await {
            tracing::error!(queue = name, %error,
                "ack failed; those messages will be redelivered (and found stale)");
        }
    }
}

/// Run `work`, and while it runs extend the batch's visibility every half timeout, so no
/// other consumer takes a message that is still being handled.
async fn keep_hidden<C: QueueConsumer, T>(consumer: &C, receipts: &[C::Receipt], work: impl Future<Output = T>) -> T {
    let timeout = consumer.visibility_timeout();
    let every = (timeout / 2).max(Duration::from_secs(1));
    let mut extend = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = extend.tick() => {
                if let Err(error) = consumer.change_visibility(receipts, timeout).await {
                    tracing::warn!(%error, "could not extend the visibility of a batch still in hand");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
