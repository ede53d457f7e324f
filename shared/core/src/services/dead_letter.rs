//! The dead-letter handler: make sure the delivery is dead, then record its owner's notice
//! and send the owner's email if their digest window is open (`notices`).

use std::collections::BTreeMap;

use super::operational::Operational;
use super::Services;
use crate::error::{PortError, Result};
use crate::model::*;
use crate::ports::{DeadNotice, DeliveryTask, SendErrorKind, SendOutcome};
use crate::state::{after_attempt, decide, is_due_attempt, next_task, retry_waits_on, AttemptContext, Decision};
use crate::stats::StatsCounts;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadLetterReport {
    /// Dead rounds newly recorded for their owners' next email.
    pub queued: usize,
    /// Deliveries told about in the emails sent.
    pub notified: usize,
    pub emails: usize,
    /// Deliveries that were not dead (the queue had given up on their message) and went
    /// back on their schedule.
    pub rescheduled: usize,
    /// Attempts whose messages the queue gave up on [`MAX_REDRIVES`] times, counted as
    /// failed attempts.
    pub counted: usize,
}

/// The times the queue may give up on one attempt's messages (each time after its
/// `maxReceiveCount` receives) before the attempt counts as failed: so an attempt is POSTed
/// at most 3 × 5 = 15 times, and a delivery cannot cycle through the dead-letter queue for
/// ever.
pub const MAX_REDRIVES: u32 = 3;

impl Services {
    /// Each task's delivery is judged again: still due means the queue gave up on its message
    /// (back on its schedule it goes); dead means its owner is to be told. The notices are
    /// stored before the batch is done, so none is lost; the owners' emails follow, each as
    /// soon as its digest window allows (an email that fails is the scheduler's to retry).
    #[tracing::instrument(name = "dead_letters", skip_all, fields(messages = tasks.len()))]
    pub async fn handle_dead_letters(&self, tasks: &[DeliveryTask]) -> Result<DeadLetterReport> {
        let store = &self.ports.store;
        let mut report = DeadLetterReport::default();
        let mut owners = BTreeMap::new();
        let mut seen = std::collections::HashSet::new();
        let mut to_tell = Vec::new();
        // Attempts the queue gave up on, put back on their schedule last (below), and retries
        // whose queueing failed, whose attempt's message the queue gave up on.
        let mut again = Vec::new();
        let mut waiting_retries = Vec::new();
        for task in tasks {
            // A copy of a message in this batch. (Another attempt's message is not: a retry's,
            // queued before its attempt's write, may come with that attempt's own.)
            if !seen.insert((&task.delivery_id, task.round, task.attempt)) {
                continue;
            }
            let Some(delivery) = store.get_delivery(&task.delivery_id).await? else {
                if task.queued_at.is_some() && task.round == 0 && task.attempt == 1 {
                    tracing::warn!(delivery_id = %task.delivery_id, queued_at = ?task.queued_at,
                        "a first attempt's delivery was never stored (its ingest failed, and its client had the error); dropping the message");
                }
                continue;
            };
            if delivery.round != task.round {
                continue; // replayed since: this round's death is old news
            }
            let delivery = if is_due_attempt(&delivery, task) && task.redrives + 1 >= MAX_REDRIVES {
                // The queue has given up on this attempt's messages again and again: each
                // time up to its maxReceiveCount receives, each of which may have POSTed.
                // It counts as one failed attempt now, and its schedule decides what follows.
                report.counted += 1;
                match self.count_unfinished_attempt(&delivery, task).await? {
                    // Dead by it: told and noticed here, below, as any dead letter (not sent
                    // to the dead-letter queue: this function may not, and is its reader).
                    Some(dead) => dead,
                    None => continue,
                }
            } else {
                delivery
            };
            if is_due_attempt(&delivery, task) {
                // Not dead: the queue gave up on the message after failed receives (timeouts,
                // throttling, a crash), which is no verdict on the delivery. Back on its
                // schedule it goes, due now or when it was due, counted.
                let due = delivery.next_attempt_at.unwrap_or(self.now()).max(self.now());
                // A held attempt's give-up time goes with it (its own, or the delivery's).
                let task = DeliveryTask {
                    redrives: task.redrives + 1,
                    held_until: task.held_until.or(delivery.held_until),
                    ..next_task(&delivery)
                };
                again.push((task, due, delivery));
                continue;
            }
            if retry_waits_on(&delivery, task) {
                // The queue gave up on the message of an attempt that was recorded but whose
                // retry could not be queued: the retry goes on its schedule now, as it does
                // when the message comes back (`resume_retry`), not minutes late by the sweep.
                waiting_retries.push(delivery);
                continue;
            }
            if delivery.status != DeliveryStatus::Dead {
                continue;
            }
            let sub = store
                .get_subscription(&delivery.tenant_id, &delivery.subscription_id)
                .await?;
            // The operational webhook is told once the owners' digests are sent (below), so
            // no email waits for it; a failure to tell brings the batch back, to be told
            // again (stored once).
            to_tell.push((
                delivery.tenant_id.clone(),
                Operational::delivery_dead(&delivery, sub.as_ref()),
            ));
            let Some(owner) = self.owner_of(&delivery, sub).await? else {
                tracing::warn!(delivery_id = %delivery.id, "dead delivery has no owner to tell");
                continue;
            };
            let notice = DeadNotice {
                delivery_id: delivery.id.clone(),
                round: delivery.round,
                tenant_id: delivery.tenant_id.clone(),
                subscription_id: delivery.subscription_id.clone(),
                died_at: delivery.updated_at,
            };
            if store.queue_dead_notice(&owner, &notice).await? {
                tracing::info!(
                    delivery_id = %delivery.id, event_id = %delivery.event_id, tenant_id = %delivery.tenant_id,
                    round = delivery.round, "dead delivery; its owner will be told"
                );
                report.queued += 1;
            }
            owners.insert(owner.to_string(), owner);
        }
        for owner in owners.values() {
            match self.send_digest(owner).await {
                Ok(Some(told)) => {
                    report.notified += told;
                    report.emails += 1;
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(to = %owner, %error,
                    "a dead-delivery email failed; its notices wait for the scheduler's next try"),
            }
        }
        let mut untold = None;
        for (tenant, what) in to_tell {
            if let Err(error) = self.tell(&tenant, what).await {
                untold.get_or_insert(error);
            }
        }
        if let Some(error) = untold {
            return Err(error);
        }
        // Last, once nothing else can send the batch back: a batch that came back after its
        // attempts were queued would queue each a second time, and two copies of one
        // attempt are two POSTs.
        for (task, due, delivery) in again {
            self.schedule_attempt(task.clone(), due).await?;
            tracing::warn!(
                delivery_id = %delivery.id, event_id = %delivery.event_id, tenant_id = %delivery.tenant_id,
                attempt = task.attempt, %due,
                "the queue gave up on this delivery's message after failed receives; it is back on its schedule"
            );
            report.rescheduled += 1;
        }
        for delivery in waiting_retries {
            self.queue_waiting_retry(&delivery).await?;
            tracing::warn!(
                delivery_id = %delivery.id, attempt = delivery.attempts + 1,
                "the queue gave up on the message that was to queue this retry; it is queued now"
            );
            report.rescheduled += 1;
        }
        Ok(report)
    }

    /// An attempt whose messages the queue gave up on [`MAX_REDRIVES`] times, recorded as a
    /// failed attempt (it may have been made, its outcome never recorded): the subscription's
    /// schedule decides, as after any failure, so these cycles end with the schedule.
    /// The delivery as it is then, if that attempt made it dead.
    async fn count_unfinished_attempt(&self, delivery: &Delivery, task: &DeliveryTask) -> Result<Option<Delivery>> {
        let Some(sub) = self
            .kept_subscription(&delivery.tenant_id, &delivery.subscription_id)
            .await?
        else {
            // Its subscription is gone: the next message's worker abandons it.
            self.schedule_attempt(next_task(delivery), self.now()).await?;
            return Ok(None);
        };
        let (tenant, deployment) = futures::try_join!(self.kept_tenant(&delivery.tenant_id), self.kept_deployment())?;
        let retries = deployment.retries_on(tenant.as_ref());
        let now = self.now();
        let outcome = SendOutcome {
            status_code: None,
            error: Some((
                SendErrorKind::Other,
                format!(
                    "the worker never finished this attempt: the queue gave up on its messages {MAX_REDRIVES} times"
                ),
            )),
            response_excerpt: None,
            duration_ms: 0,
            retry_after: None,
        };
        let ctx = AttemptContext {
            attempt: task.attempt,
            previous_delay: delivery.last_delay_seconds,
            health: None,
            retries_enabled: retries,
        };
        let decision = decide(&sub.retry_policy, &outcome, ctx, now, &mut *self.rng());
        let mut change = after_attempt(delivery, task.attempt, now, &outcome, decision, now);
        change.next.held_until = task.held_until_after(now);
        if let Err(error) = self.queue_retry_ahead(&mut change, decision).await {
            tracing::warn!(%error, delivery_id = %delivery.id, "could not queue the retry of an attempt counted as failed; the sweep queues it once overdue");
        }
        match self.ports.store.apply_change(&change).await {
            Ok(()) => {}
            Err(PortError::ConditionFailed(_)) => return Ok(None), // moved on meanwhile
            Err(e) => return Err(e.into()),
        }
        tracing::warn!(delivery_id = %delivery.id, attempt = task.attempt, ?decision,
            "the queue gave up on this attempt's messages {MAX_REDRIVES} times; it counts as a failed attempt");
        if decision == Decision::Dead {
            self.count_stats(&delivery.subscription_id, now, StatsCounts::dead())
                .await;
            return Ok(Some(change.next));
        }
        self.hand_on(&change.next, decision).await?;
        Ok(None)
    }

    /// Who hears of a dead delivery: its subscription's owner (`sub`, as read), or else its
    /// tenant's.
    async fn owner_of(&self, delivery: &Delivery, sub: Option<Subscription>) -> Result<Option<Email>> {
        if let Some(owner) = sub.and_then(|s| s.owner_email) {
            return Ok(Some(owner));
        }
        Ok(self
            .ports
            .store
            .get_tenant(&delivery.tenant_id)
            .await?
            .map(|t| t.owner_email))
    }
}
