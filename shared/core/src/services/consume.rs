//! What becomes of each message of a batch from either queue: the redelivery rule, in one
//! place. Every host runs it: the worker loop of `hookwise dev` and `dev --aws` (acking or
//! returning each message) and the two SQS-triggered Lambdas (as `batchItemFailures`).

use super::deliver::DeliverOutcome;
use super::{Services, STATS_SPARE_TIME};
use crate::metrics;
use crate::ports::{DeliveryTask, QueueMessage};

/// Which queue a batch came from, and so which handler takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueRole {
    /// The delivery queue: one attempt per message.
    Delivery,
    /// The dead-letter queue: dead deliveries whose owners are told.
    DeadLetter,
}

impl QueueRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delivery => "delivery",
            Self::DeadLetter => "dead-letter",
        }
    }
}

/// What the queue does with a message once its batch has been handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Handled (or stale, or beyond help): delete it.
    Done,
    /// An infrastructure failure: the queue sends it again later, and after its
    /// `maxReceiveCount` redrives it to the dead-letter queue.
    Redeliver,
}

impl Services {
    /// Handle a batch from `role`'s queue; one disposition per message, in order.
    ///
    /// - Delivery queue: each task is delivered ([`Services::deliver_batch_within`]); an
    ///   `Err`, retryable or permanent, is redelivered rather than swallowed: after the
    ///   queue's `maxReceiveCount` it reaches the dead-letter queue, whose handler puts the
    ///   delivery back on its schedule and counts it (for the operator). A body that is not a
    ///   task is redelivered too (during a deploy a newer reader may take it); if none does,
    ///   the redrive parks it on the dead-letter queue.
    /// - Dead-letter queue: the batch is handled at once ([`Services::handle_dead_letters`]:
    ///   dead deliveries' notices are stored and their owners emailed as their digest windows
    ///   allow; deliveries the queue gave up on go back on their schedule); if that fails,
    ///   every task of the batch comes back (a notice already stored is not stored twice). A
    ///   failed email does not fail the batch: its notices wait for the scheduler's next
    ///   tick. A body that is not a task stays on the queue for an operator to look at: it is
    ///   logged at every receive, never deleted unread.
    ///
    /// A `deadline` (a Lambda invocation's) bounds the deliveries: see
    /// [`Services::deliver_within`].
    pub async fn handle_messages(
        &self,
        role: QueueRole,
        messages: &[QueueMessage],
        deadline: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Vec<Disposition> {
        let tasks: Vec<DeliveryTask> = messages.iter().filter_map(|m| m.task.clone().ok()).collect();
        let redelivered: Vec<bool> = messages
            .iter()
            .filter(|m| m.task.is_ok())
            .map(|m| m.receive_count > 1)
            .collect();
        for m in messages {
            match &m.task {
                Ok(task) if role == QueueRole::DeadLetter => tracing::info!(
                    message_id = %m.message_id, delivery_id = %task.delivery_id, attempt = task.attempt,
                    redriven = m.redriven, "dead letter"
                ),
                Ok(_) => {}
                Err(error) => tracing::error!(
                    queue = role.as_str(), message_id = %m.message_id, %error,
                    "message body is not a delivery task"
                ),
            }
        }
        // Per task, in order: done or not.
        let handled: Vec<bool> = match role {
            QueueRole::Delivery => {
                let outcomes = self.deliver_batch_within(&tasks, deadline).await;
                let mut handled = Vec::with_capacity(tasks.len());
                for ((outcome, task), redelivered) in outcomes.into_iter().zip(&tasks).zip(&redelivered) {
                    if let Ok(outcome) = &outcome {
                        self.metrics.count(outcome_metric(outcome), 1);
                    }
                    let result = match outcome {
                        Ok(DeliverOutcome::Stale) if *redelivered => self.resume_retry(task).await,
                        Ok(_) => Ok(()),
                        Err(e) => Err(e),
                    };
                    if let Err(error) = &result {
                        self.metrics.count(metrics::REDELIVERED, 1);
                        tracing::warn!(
                            delivery_id = %task.delivery_id, attempt = task.attempt, %error,
                            retryable = error.is_retryable(),
                            "delivery failed; the queue will redeliver the message (a permanent error is \
                             redriven to the dead-letter queue after maxReceiveCount)"
                        );
                    }
                    handled.push(result.is_ok());
                }
                self.save_stats_with_time_left(deadline).await;
                handled
            }
            QueueRole::DeadLetter => {
                self.metrics.count(metrics::DEAD_LETTERS, tasks.len() as u64);
                let ok = match self.handle_dead_letters(&tasks).await {
                    Ok(report) => {
                        self.metrics.count(metrics::NOTICES, report.queued as u64);
                        self.metrics.count(metrics::EMAILS, report.emails as u64);
                        self.metrics.count(metrics::RESCHEDULED, report.rescheduled as u64);
                        if report.queued + report.emails + report.rescheduled > 0 {
                            tracing::info!(
                                queued = report.queued,
                                notified = report.notified,
                                emails = report.emails,
                                rescheduled = report.rescheduled,
                                "dead-letter batch handled"
                            );
                        }
                        true
                    }
                    Err(error) => {
                        self.metrics.count(metrics::REDELIVERED, tasks.len() as u64);
                        tracing::warn!(%error, retryable = error.is_retryable(), messages = tasks.len(),
                            "dead-letter batch failed; the queue will redeliver it");
                        false
                    }
                };
                // The deaths it counted (an attempt the queue gave up on, with no retry left).
                self.save_stats_with_time_left(deadline).await;
                vec![ok; tasks.len()]
            }
        };
        let mut handled = handled.into_iter();
        messages
            .iter()
            .map(|m| match &m.task {
                Ok(_) if handled.next() == Some(true) => Disposition::Done,
                _ => Disposition::Redeliver,
            })
            .collect()
    }
}

impl Services {
    /// Statistics are a close count: not written when the invocation has too little time
    /// left for it (they wait for the next batch, or the next write).
    async fn save_stats_with_time_left(&self, deadline: Option<chrono::DateTime<chrono::Utc>>) {
        let spare = chrono::Duration::from_std(STATS_SPARE_TIME).unwrap_or_default();
        if deadline.is_none_or(|d| self.now() + spare < d) {
            self.save_due_stats().await;
        }
    }
}

fn outcome_metric(outcome: &DeliverOutcome) -> &'static str {
    match outcome {
        DeliverOutcome::Delivered => metrics::DELIVERED,
        DeliverOutcome::Retrying { .. } => metrics::RETRYING,
        DeliverOutcome::Dead => metrics::DEAD,
        DeliverOutcome::Stale => metrics::STALE,
        DeliverOutcome::NotStoredYet => metrics::NOT_STORED_YET,
        DeliverOutcome::RateLimited { .. } => metrics::RATE_LIMITED,
        DeliverOutcome::Early { .. } => metrics::EARLY,
        DeliverOutcome::Held { .. } => metrics::HELD,
    }
}
