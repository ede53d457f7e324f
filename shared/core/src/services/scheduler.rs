//! The scheduler tick (every minute on AWS): move retries due within the horizon from the
//! scheduler table to the queue with their residual delay, tend the circuit breaker of
//! every endpoint holding attempts (`Services::tend_breaker`), then re-queue deliveries left
//! pending or retrying past their due time (an enqueue that failed after a write) and first
//! attempts whose message the queue lost (the audit), each within the tick's time budget;
//! last, send the owners' emails whose digest window has opened.
//! One tick at a time: a tick runs only while it holds the scheduler's lease (a conditional
//! write with an expiry, `SchedulerTable::take_lease`), so a slow tick and the next minute's
//! never overlap, without reserving Lambda concurrency.

use std::time::Instant;

use chrono::Duration;
use futures::{StreamExt, TryStreamExt};

use rand::Rng;

use super::Services;
use crate::circuit;
use crate::error::{PortError, Result};
use crate::metrics;
use crate::model::Delivery;
use crate::ports::{AuditPosition, Holding, ScheduledTask};
use crate::state::{next_task, requeued};

/// Items handled per query.
const PAGE: u32 = 500;
/// How long a tick sends owners' emails for, at least.
const EMAIL_SHARE: std::time::Duration = std::time::Duration::from_secs(10);
/// Store writes in flight at once while sweeping.
const SWEEP_CONCURRENCY: usize = 16;
/// Endpoints whose breakers are tended at once.
const TEND_CONCURRENCY: usize = 8;
/// The audit of queued messages takes on a new range of creation times once this much has
/// gathered: each range costs a query per tenant and listing shard on DynamoDB.
const AUDIT_EVERY: Duration = Duration::minutes(10);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerReport {
    /// Another tick held the lease: this one did nothing.
    pub skipped: bool,
    /// Scheduled retries moved to the queue.
    pub moved: usize,
    /// Endpoints holding attempts whose circuit breaker was tended.
    pub tended: usize,
    /// Overdue deliveries re-queued by the sweep.
    pub requeued: usize,
    /// First attempts whose message the queue lost, queued again by the audit.
    pub audited: usize,
    /// Owners' dead-delivery emails sent.
    pub emails: usize,
}

impl Services {
    #[tracing::instrument(name = "scheduler_tick", skip_all, err)]
    pub async fn run_scheduler(&self) -> Result<SchedulerReport> {
        // This process's own counts, lease or not: a long-running host's delivery workers
        // share its services, and their last attempts' counts are written here.
        self.save_due_stats().await;
        let holder = match &self.config.scheduler_holder {
            Some(name) => name.clone(),
            None => format!("{:032x}", self.rng().random::<u128>()),
        };
        let now = self.now();
        let lease = Duration::from_std(self.config.scheduler_lease).unwrap_or(Duration::seconds(90));
        if !self.ports.scheduler.take_lease(&holder, now, now + lease).await? {
            tracing::info!("another scheduler tick holds the lease; this one does nothing");
            return Ok(SchedulerReport {
                skipped: true,
                ..SchedulerReport::default()
            });
        }
        self.metrics.count(metrics::TICKS, 1);
        let report = self.tick().await;
        if let Err(error) = self.ports.scheduler.end_lease(&holder, self.now()).await {
            // The lease expires by itself: the next tick may wait for that, no longer.
            tracing::warn!(%error, "could not give the scheduler's lease back");
        }
        report
    }

    async fn tick(&self) -> Result<SchedulerReport> {
        let until = Instant::now() + self.config.scheduler_budget;
        let moved = self.move_due_retries(until).await?;
        let tended = self.tend_breakers(until).await;
        let requeued = self.sweep_overdue(until).await?;
        let audited = self.audit_in_time(until).await;
        // Emails get their share even when the sweep spent the budget (the Scheduler
        // function's 60 s hold the budget and this).
        let emails = self.send_due_digests(until.max(Instant::now() + EMAIL_SHARE)).await?;
        if moved + requeued + audited + emails > 0 {
            tracing::info!(moved, tended, requeued, audited, emails, "scheduler tick");
        }
        self.metrics.count(metrics::RETRIES_MOVED, moved as u64);
        self.metrics.count(metrics::REQUEUED, (requeued + audited) as u64);
        self.metrics.count(metrics::EMAILS, emails as u64);
        Ok(SchedulerReport {
            skipped: false,
            moved,
            tended,
            requeued,
            audited,
            emails,
        })
    }

    /// Tend the breaker of every endpoint that holds attempts (`Services::tend_breaker`),
    /// within the tick's budget (each endpoint's own work too), a few at once. Best effort:
    /// what fails is logged and counted, and tended at the next tick; the tick goes on.
    async fn tend_breakers(&self, until: Instant) -> usize {
        let mut after = None;
        let mut tended = 0;
        loop {
            let page = match self.ports.scheduler.holding(after.as_ref(), PAGE).await {
                Ok(page) => page,
                Err(error) => {
                    self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
                    tracing::warn!(%error, "could not list the endpoints holding attempts; the next tick tries again");
                    return tended;
                }
            };
            // The futures are built first, so the stream's type names no closure (see
            // `deliver_batch_within`).
            let calls: Vec<_> = page.iter().map(|holding| self.tend_in_time(holding, until)).collect();
            let done = futures::stream::iter(calls)
                .buffer_unordered(TEND_CONCURRENCY)
                .filter(|tended| std::future::ready(*tended))
                .count()
                .await;
            tended += done;
            match page.last() {
                Some(last) if page.len() >= PAGE as usize && Instant::now() < until => {
                    after = Some(last.subscription_id.clone());
                }
                _ => {
                    if done < page.len() {
                        tracing::warn!(
                            tended,
                            "the tick ran out of time tending breakers; the next tick goes on"
                        );
                    }
                    return tended;
                }
            }
        }
    }

    /// Tend one endpoint's breaker if the tick has time left (`false` if not); an error is
    /// logged and counted.
    async fn tend_in_time(&self, holding: &Holding, until: Instant) -> bool {
        if Instant::now() >= until {
            return false;
        }
        if let Err(error) = self.tend_breaker(holding, until).await {
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(%error, subscription_id = %holding.subscription_id,
                "could not tend the circuit breaker; the next tick tries again");
        }
        true
    }

    /// Queue the scheduled attempts due within the horizon, each with the delay left to it.
    /// Attempts the breaker held that give up in the same second go out on the release ramp
    /// (`circuit::ramp_offset`: 10 in the first second, doubling each second), not as a herd.
    async fn move_due_retries(&self, until: Instant) -> Result<usize> {
        let max_delay = self.ports.queue.max_delay_seconds();
        // Move only what the queue can hold until it is due: a longer residual delay would be
        // cut to the queue's limit and the retry would come early.
        let horizon = Duration::from_std(self.config.scheduler_horizon)
            .unwrap_or(Duration::minutes(15))
            .min(Duration::seconds(i64::from(max_delay)));
        let mut moved = 0;
        let mut giving_up: std::collections::HashMap<i64, u64> = Default::default();
        loop {
            let now = self.now();
            let due = self.ports.scheduler.due(now + horizon, PAGE).await?;
            if due.is_empty() {
                return Ok(moved);
            }
            let mut tasks = Vec::new();
            let mut later = Vec::new();
            for item in &due {
                let mut at = item.due;
                if item.task.held_until == Some(item.due) {
                    let n = giving_up.entry(item.due.timestamp()).or_default();
                    at += Duration::seconds(circuit::ramp_offset(*n).into());
                    *n += 1;
                }
                let residual = ((at - now).num_milliseconds().max(0) as u64).div_ceil(1000);
                match u32::try_from(residual).ok().filter(|r| *r <= max_delay) {
                    Some(delay) => tasks.push((item.task.clone(), delay)),
                    // Its place on the ramp is past what the queue can hold: back in the
                    // table for then (not ramped again: `held_until` is no longer its due).
                    None => later.push(ScheduledTask {
                        task: item.task.clone(),
                        due: at,
                    }),
                }
            }
            // Queue (or schedule again) first, then delete: a crash between the two duplicates
            // a message (which the conditional writes absorb) rather than losing one.
            self.ports.queue.enqueue(&tasks).await?;
            for item in &later {
                self.ports.scheduler.schedule(item).await?;
            }
            self.ports.scheduler.remove(&due).await?;
            moved += due.len();
            if due.len() < PAGE as usize || Instant::now() >= until {
                return Ok(moved);
            }
        }
    }

    /// Page after page until nothing is overdue or the tick's budget is spent.
    async fn sweep_overdue(&self, until: Instant) -> Result<usize> {
        let grace = Duration::from_std(self.config.sweep_grace).unwrap_or(Duration::minutes(5));
        let mut swept = 0;
        loop {
            let overdue = self.ports.store.overdue_deliveries(self.now() - grace, PAGE).await?;
            swept += self.requeue(&overdue).await?;
            if overdue.len() < PAGE as usize {
                return Ok(swept);
            }
            if Instant::now() >= until {
                tracing::warn!(swept, "the sweep ran out of time; the next tick goes on");
                return Ok(swept);
            }
        }
    }

    /// [`Self::audit_queued_messages`], best effort: what fails is logged and counted, and the
    /// next tick goes on from the place saved (the digests after it still go out). Not where
    /// one database holds the store and the queue (`Ports::store_with_queue`): no message is
    /// lost there, and the audit would only duplicate a backlog's.
    async fn audit_in_time(&self, until: Instant) -> usize {
        if self.ports.store_with_queue.is_some() {
            return 0;
        }
        self.audit_queued_messages(until).await.unwrap_or_else(|error| {
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(%error, "the audit of queued messages failed; the next tick goes on from where it stopped");
            0
        })
    }

    /// The audit of queued messages: a first attempt, or an early retry, still waiting
    /// `queued_message_audit_age` after its creation for the message queued before its state
    /// was written ([`crate::model::Delivery::awaits_queued_message`]) lost it to the queue
    /// (past its retention after a long outage, or in a purge); it is queued again, and
    /// marked, so the sweep looks after it from then on (again every `requeue_wait` while it
    /// stays overdue). Each delivery is looked at once: ranges of creation time, at least
    /// [`AUDIT_EVERY`] long, each audited page by page, the place reached saved after each
    /// page. The first tick starts the audit at its own cutoff: what was stored an hour or more
    /// before it (by an older build, which held and deferred first attempts without moving
    /// them) is not audited.
    async fn audit_queued_messages(&self, until: Instant) -> Result<usize> {
        let age = Duration::from_std(self.config.queued_message_audit_age).unwrap_or(Duration::hours(1));
        let cutoff = self.now() - age;
        let scheduler = &self.ports.scheduler;
        let mut position = match scheduler.audit_position().await? {
            Some(position) => position,
            None => {
                let start = AuditPosition {
                    from: cutoff,
                    to: cutoff,
                    after: None,
                };
                scheduler.save_audit_position(&start).await?;
                start
            }
        };
        let mut requeued = 0;
        while Instant::now() < until {
            if position.from == position.to {
                if cutoff - position.from < AUDIT_EVERY {
                    break;
                }
                position.to = cutoff;
            }
            let page = self
                .ports
                .store
                .awaiting_queued_message(position.from..position.to, position.after.as_deref(), PAGE)
                .await?;
            requeued += self.requeue(&page.deliveries).await?;
            position = match page.next {
                Some(next) => AuditPosition {
                    after: Some(next),
                    ..position
                },
                None => AuditPosition {
                    from: position.to,
                    to: position.to,
                    after: None,
                },
            };
            scheduler.save_audit_position(&position).await?;
        }
        if requeued > 0 {
            tracing::warn!(requeued, "attempts whose message the queue lost were queued again");
        }
        Ok(requeued)
    }

    /// Queue each delivery's next attempt now, then mark it (queue first: a crash between
    /// the two duplicates a message rather than stranding the delivery again), so it is not
    /// looked at again until its message has had `requeue_wait` to get through. How many
    /// were marked (not one that moved on meanwhile).
    async fn requeue(&self, deliveries: &[Delivery]) -> Result<usize> {
        let wait = Duration::from_std(self.config.requeue_wait).unwrap_or(Duration::minutes(30));
        let now = self.now();
        let tasks: Vec<_> = deliveries.iter().map(|d| (next_task(d), 0)).collect();
        self.ports.queue.enqueue(&tasks).await?;
        let changes: Vec<_> = deliveries.iter().map(|d| requeued(d, now, now + wait)).collect();
        let marked: Vec<bool> = futures::stream::iter(changes)
            .map(|change| async move {
                match self.ports.store.apply_change(&change).await {
                    Ok(()) => Ok(true),
                    Err(PortError::ConditionFailed(_)) => Ok(false), // moved on meanwhile
                    Err(e) => Err(e),
                }
            })
            .buffer_unordered(SWEEP_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(marked.iter().filter(|m| **m).count())
    }
}
