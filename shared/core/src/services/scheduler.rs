//! The scheduler tick (every minute on AWS): move retries due within the horizon from the
//! scheduler table to the queue with their residual delay, tend the circuit breaker of
//! every endpoint holding attempts (`Services::tend_breaker`), then re-queue deliveries left
//! pending or retrying past their due time (an enqueue that failed after a write) and first
//! attempts whose message the queue lost (the audit), each within its share of the tick's
//! time budget; last, send the owners' emails whose digest window has opened.
//! Each phase stands alone: one that fails is logged and counted, and the tick goes on to the
//! next, so a throttle or one bad item in one phase never stops the others (`Phase`).
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
use crate::model::{Delivery, SubscriptionId};
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

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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
    /// Items of the scheduler table that could not be read, set aside
    /// (`SchedulerTable::set_aside`).
    pub set_aside: usize,
    /// Phases that failed (each logged, and counted in [`metrics::BEST_EFFORT_FAILURES`]);
    /// the tick went on past them, and the counts above are what they did before failing.
    pub failed: usize,
}

/// A tick's phases, in the order they run.
///
/// Each budgeted phase has a reserved share of `Config::scheduler_budget`: moving due
/// retries 35 %, tending breakers 20 %, the sweep 25 %, the audit 20 %. A phase may go on
/// until the tick's end less the shares of the phases after it: what one leaves unused goes
/// to the next, and none can spend the shares of those after it (it stops between two
/// calls, so the most it takes from the next is the call in flight at its deadline). The
/// owners' emails come last with their own `EMAIL_SHARE`, even past the budget (the
/// Scheduler function's 60 s hold the budget and this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Move,
    Tend,
    Sweep,
    Audit,
    Emails,
}

impl Phase {
    /// The share of the budget reserved for it, in percent.
    fn share(self) -> u32 {
        match self {
            Phase::Move => 35,
            Phase::Tend => 20,
            Phase::Sweep => 25,
            Phase::Audit => 20,
            Phase::Emails => 0,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Phase::Move => "move due retries",
            Phase::Tend => "tend breakers",
            Phase::Sweep => "sweep overdue deliveries",
            Phase::Audit => "audit queued messages",
            Phase::Emails => "send owners' emails",
        }
    }
}

/// A tick's time: when it started, and its budget.
struct Budget {
    start: Instant,
    total: std::time::Duration,
}

impl Budget {
    fn new(total: std::time::Duration) -> Self {
        Self {
            start: Instant::now(),
            total,
        }
    }

    /// When `phase` stops taking on more (see [`Phase`]).
    fn until(&self, phase: Phase) -> Instant {
        let end = self.start + self.total;
        if phase == Phase::Emails {
            return end.max(Instant::now() + EMAIL_SHARE);
        }
        let later: u32 = [Phase::Tend, Phase::Sweep, Phase::Audit]
            .into_iter()
            .filter(|p| *p > phase)
            .map(Phase::share)
            .sum();
        end - self.total * later / 100
    }
}

/// When a walk stops starting more: at a time, or (a test's) after a number of starts.
enum Stop {
    At(Instant),
    #[cfg(test)]
    After(std::sync::atomic::AtomicUsize),
}

impl Stop {
    fn reached(&self) -> bool {
        match self {
            Stop::At(until) => Instant::now() >= *until,
            #[cfg(test)]
            Stop::After(left) => left.load(std::sync::atomic::Ordering::SeqCst) == 0,
        }
    }

    /// Whether one more may start (and if so, it is counted).
    fn start_one(&self) -> bool {
        match self {
            Stop::At(_) => !self.reached(),
            #[cfg(test)]
            Stop::After(left) => {
                use std::sync::atomic::Ordering::SeqCst;
                left.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
            }
        }
    }
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
        // A phase that failed is not the tick's failure: the others did their work, and an
        // error here would only make the host retry all of them. It is in the report, the
        // log and `BestEffortFailures` (whose alarm goes off when it lasts).
        if report.failed > 0 {
            tracing::error!(
                failed = report.failed,
                ?report,
                "the scheduler tick finished with failed phases"
            );
        }
        Ok(report)
    }

    /// Every phase in turn, each on its own (see [`Phase`]).
    async fn tick(&self) -> SchedulerReport {
        let budget = Budget::new(self.config.scheduler_budget);
        let mut report = SchedulerReport::default();
        let done = self
            .move_due_retries(budget.until(Phase::Move), &mut report.moved, &mut report.set_aside)
            .await;
        self.phase_done(Phase::Move, done, &mut report);
        let until = budget.until(Phase::Tend);
        let done = self.tend_breakers(&Stop::At(until), until, &mut report.tended).await;
        self.phase_done(Phase::Tend, done, &mut report);
        let done = self
            .sweep_overdue(budget.until(Phase::Sweep), &mut report.requeued)
            .await;
        self.phase_done(Phase::Sweep, done, &mut report);
        let done = self
            .audit_in_time(budget.until(Phase::Audit), &mut report.audited)
            .await;
        self.phase_done(Phase::Audit, done, &mut report);
        let done = self
            .send_due_digests(budget.until(Phase::Emails))
            .await
            .map(|sent| report.emails = sent);
        self.phase_done(Phase::Emails, done, &mut report);
        let SchedulerReport {
            moved,
            requeued,
            audited,
            emails,
            set_aside,
            failed,
            ..
        } = report;
        if moved + requeued + audited + emails + set_aside + failed > 0 {
            tracing::info!(?report, "scheduler tick");
        }
        self.metrics.count(metrics::RETRIES_MOVED, moved as u64);
        self.metrics.count(metrics::REQUEUED, (requeued + audited) as u64);
        self.metrics.count(metrics::EMAILS, emails as u64);
        report
    }

    /// A phase's end: one that failed is logged and counted, and the tick goes on.
    fn phase_done(&self, phase: Phase, done: Result<()>, report: &mut SchedulerReport) {
        if let Err(error) = done {
            report.failed += 1;
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::error!(phase = phase.name(), %error, retryable = error.is_retryable(),
                "a scheduler tick phase failed; the tick goes on, and the next tick tries again");
        }
    }

    /// Tend the breaker of each endpoint that holds attempts (`Services::tend_breaker`), a
    /// few at once, until `stop`, in [`crate::ports::SchedulerTable::holding`]'s order from
    /// after the last one a tick tended (`tend_position`) round to it again: an endpoint far
    /// down a long list is tended as often as the first. Where it got to is saved, even when
    /// the listing fails. An endpoint whose tending fails is logged and counted, and tended
    /// next time round; the walk goes on.
    async fn tend_breakers(&self, stop: &Stop, until: Instant, tended: &mut usize) -> Result<()> {
        let scheduler = &self.ports.scheduler;
        let start = scheduler.tend_position().await.unwrap_or_else(|error| {
            // A position that cannot be read must not stop the tending: from the first.
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(%error, "could not read where tending the breakers got to; from the first");
            None
        });
        let mut last = start.clone();
        let walked = self.tend_round(start.as_ref(), stop, until, tended, &mut last).await;
        if last != start {
            scheduler.save_tend_position(last.as_ref()).await?;
        }
        walked
    }

    /// One round of [`Self::tend_breakers`] from after `start`: `last` is kept at the last
    /// endpoint tended, `None` once the list's end is reached.
    async fn tend_round(
        &self,
        start: Option<&SubscriptionId>,
        stop: &Stop,
        until: Instant,
        tended: &mut usize,
        last: &mut Option<SubscriptionId>,
    ) -> Result<()> {
        let mut after = start.cloned();
        // From the first, the round ends at the list's end; from after `start`, it goes on
        // from the first up to `start`.
        let mut wrapped = start.is_none();
        loop {
            let mut page = self.ports.scheduler.holding(after.as_ref(), PAGE).await?;
            let at_end = page.len() < PAGE as usize;
            let listed = page.len();
            if let (true, Some(start)) = (wrapped, start) {
                page.retain(|h| h.subscription_id <= *start);
            }
            let round_done = page.len() < listed || (wrapped && at_end);
            // The futures are built first, so the stream's type names no closure (see
            // `deliver_batch_within`).
            let calls: Vec<_> = page
                .iter()
                .enumerate()
                .map(|(i, holding)| self.tend_one(i, holding, stop, until))
                .collect();
            let mut results: Vec<(usize, bool)> = futures::stream::iter(calls)
                .buffer_unordered(TEND_CONCURRENCY)
                .collect()
                .await;
            results.sort_unstable();
            *tended += results.iter().filter(|(_, t)| *t).count();
            // The place is after the endpoints tended without a gap from the page's start.
            let done = results.iter().take_while(|(_, t)| *t).count();
            if done > 0 {
                *last = Some(page[done - 1].subscription_id.clone());
            }
            if done < page.len() {
                tracing::warn!(
                    tended = *tended,
                    "the tick ran out of time tending breakers; the next tick goes on"
                );
                return Ok(());
            }
            if at_end && page.len() == listed {
                // The list's end: the next tick starts from the first.
                *last = None;
            }
            if round_done {
                return Ok(());
            }
            if at_end {
                // Round to the first, up to where this round started.
                (wrapped, after) = (true, None);
            } else {
                after = page.last().map(|h| h.subscription_id.clone());
            }
            if stop.reached() {
                return Ok(());
            }
        }
    }

    /// Tend one endpoint's breaker unless `stop` is reached (`false`); an error is logged and
    /// counted. With its place in the page.
    async fn tend_one(&self, i: usize, holding: &Holding, stop: &Stop, until: Instant) -> (usize, bool) {
        if !stop.start_one() {
            return (i, false);
        }
        if let Err(error) = self.tend_breaker(holding, until).await {
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(%error, subscription_id = %holding.subscription_id,
                "could not tend the circuit breaker; the next tick tries again");
        }
        (i, true)
    }

    /// Queue the scheduled attempts due within the horizon, each with the delay left to it.
    /// Attempts the breaker held that give up in the same second go out on the release ramp
    /// (`circuit::ramp_offset`: 10 in the first second, doubling each second), not as a herd.
    /// An item of the table that cannot be read is set aside by the table and counted
    /// ([`metrics::SCHEDULER_ITEMS_SET_ASIDE`]); the rest move on.
    async fn move_due_retries(&self, until: Instant, moved: &mut usize, set_aside: &mut usize) -> Result<()> {
        let max_delay = self.ports.queue.max_delay_seconds();
        // Move only what the queue can hold until it is due: a longer residual delay would be
        // cut to the queue's limit and the retry would come early.
        let horizon = Duration::from_std(self.config.scheduler_horizon)
            .unwrap_or(Duration::minutes(15))
            .min(Duration::seconds(i64::from(max_delay)));
        let mut giving_up: std::collections::HashMap<i64, u64> = Default::default();
        loop {
            let now = self.now();
            let page = self.ports.scheduler.due_page(now, now + horizon, PAGE).await?;
            if page.set_aside > 0 {
                *set_aside += page.set_aside;
                self.metrics
                    .count(metrics::SCHEDULER_ITEMS_SET_ASIDE, page.set_aside as u64);
                tracing::error!(
                    set_aside = page.set_aside,
                    "scheduler items that could not be read were set aside (hookwise scheduler set-aside lists them)"
                );
            }
            let due = page.tasks;
            // Items set aside took places in the page: only a short page is the last.
            let last_page = due.len() + page.set_aside < PAGE as usize;
            if due.is_empty() {
                // All set aside: the next page may hold tasks.
                if last_page || Instant::now() >= until {
                    return Ok(());
                }
                continue;
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
            *moved += due.len();
            if last_page || Instant::now() >= until {
                return Ok(());
            }
        }
    }

    /// Page after page until nothing is overdue or the tick's budget is spent.
    async fn sweep_overdue(&self, until: Instant, swept: &mut usize) -> Result<()> {
        let grace = Duration::from_std(self.config.sweep_grace).unwrap_or(Duration::minutes(5));
        loop {
            let overdue = self.ports.store.overdue_deliveries(self.now() - grace, PAGE).await?;
            *swept += self.requeue(&overdue, 0).await?;
            if overdue.len() < PAGE as usize {
                return Ok(());
            }
            if Instant::now() >= until {
                tracing::warn!(swept = *swept, "the sweep ran out of time; the next tick goes on");
                return Ok(());
            }
        }
    }

    /// [`Self::audit_queued_messages`]: if it fails, the next tick goes on from the place
    /// saved. Not where one database holds the store and the queue
    /// (`Ports::store_with_queue`): no message is lost there, and the audit would only
    /// duplicate a backlog's.
    async fn audit_in_time(&self, until: Instant, requeued: &mut usize) -> Result<()> {
        if self.ports.store_with_queue.is_some() {
            return Ok(());
        }
        self.audit_queued_messages(until, requeued).await
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
    async fn audit_queued_messages(&self, until: Instant, requeued: &mut usize) -> Result<()> {
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
        let before = *requeued;
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
            *requeued += self.requeue(&page.deliveries, 0).await?;
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
        if *requeued > before {
            tracing::warn!(
                requeued = *requeued - before,
                "attempts whose message the queue lost were queued again"
            );
        }
        Ok(())
    }

    /// Queue each delivery's next attempt, to arrive after `delay` seconds, then mark it
    /// (queue first: a crash between the two duplicates a message rather than stranding the
    /// delivery again), so it is not looked at again until its message has had
    /// `requeue_wait` to get through. How many were marked (not one that moved on meanwhile).
    pub(super) async fn requeue(&self, deliveries: &[Delivery], delay: u32) -> Result<usize> {
        let wait = Duration::from_std(self.config.requeue_wait).unwrap_or(Duration::minutes(30));
        let now = self.now();
        let tasks: Vec<_> = deliveries.iter().map(|d| (next_task(d), delay)).collect();
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::SeqCst;

    use chrono::{DateTime, Utc};
    use serde_json::json;

    use super::*;
    use crate::circuit::CircuitBreaker;
    use crate::model::{EndpointUrl, EventType, EventTypeFilter, Subscription, Tenant, TenantId};
    use crate::policy::{Jitter, RetryPolicy};
    use crate::ports::{Clock, DeliveryTask, SchedulerTable};
    use crate::services::{NewEvent, NewSubscription};
    use crate::testing::memory::{Harness, ScriptedSender, UnreadableItem};

    async fn subscription(h: &Harness, tenant: &Tenant, url: &str, schedule: Vec<u64>) -> Subscription {
        let new = NewSubscription {
            url: EndpointUrl::parse(url).unwrap(),
            event_types: vec![EventTypeFilter::parse("*").unwrap()],
            owner_email: None,
            retry_policy: Some(RetryPolicy::custom(schedule, Jitter::None, false).unwrap()),
            timeout_ms: None,
            rate_limit_per_second: None,
            auto_disable_after_hours: None,
            circuit_breaker: Some(CircuitBreaker::off()),
            description: None,
            filter: None,
            headers: None,
        };
        h.services.create_subscription(tenant, new).await.unwrap().subscription
    }

    /// Ingest one event, make its first attempts and hand its dead letters over.
    async fn one_event_attempted(h: &Harness, tenant: &Tenant) {
        let event = NewEvent {
            event_type: EventType::parse("invoice.paid").unwrap(),
            payload: json!({}),
        };
        h.services.ingest(tenant, event, None).await.unwrap();
        for result in h.services.deliver_batch(&h.queue.take_visible()).await {
            result.unwrap();
        }
        h.services.handle_dead_letters(&h.queue.take_dead()).await.unwrap();
    }

    fn sub_id(n: u32) -> SubscriptionId {
        SubscriptionId::parse(&format!("sub_01kzzzzzzzzzzzzzzzzzzzzzz{n}")).unwrap()
    }

    fn list_holding(h: &Harness, subs: &[SubscriptionId]) {
        let tenant = TenantId::parse("ten_a").unwrap();
        let mut holding = h.scheduler.holding.lock().unwrap();
        for sub in subs {
            holding.insert(sub.clone(), tenant.clone());
        }
    }

    fn still_holding(h: &Harness) -> Vec<SubscriptionId> {
        h.scheduler.holding.lock().unwrap().keys().cloned().collect()
    }

    #[tokio::test]
    async fn given_moving_due_retries_failing_then_the_tick_still_tends_sweeps_and_sends_the_digests() {
        let (h, counts) = Harness::new(ScriptedSender::always(500)).recording();
        let (tenant, _) = h.tenant("owner@example.com").await;
        // One endpoint retries after 25 minutes (through the scheduler table: the queue
        // holds 15), the other's deliveries die at once.
        let retrying = subscription(&h, &tenant, "https://a.example.com/", vec![25 * 60]).await;
        subscription(&h, &tenant, "https://b.example.com/", vec![]).await;
        // The first death is told at once; the second waits for the digest.
        one_event_attempted(&h, &tenant).await;
        one_event_attempted(&h, &tenant).await;
        assert_eq!(h.mailer.sent.lock().unwrap().len(), 1);
        assert_eq!(
            h.scheduler.items.lock().unwrap().len(),
            2,
            "both retries wait in the table"
        );
        list_holding(&h, std::slice::from_ref(&retrying.id));

        // Past the retries' time, the sweep's grace and the digest window, the table
        // throttles the move.
        h.clock.advance(Duration::minutes(25 + 6));
        h.scheduler.failing_dues.store(1, SeqCst);
        let report = h
            .services
            .run_scheduler()
            .await
            .expect("a failed phase is not a failed tick");

        assert_eq!(
            (
                report.failed,
                report.moved,
                report.tended,
                report.requeued,
                report.emails
            ),
            (1, 0, 1, 2, 1),
            "only the move failed: {report:?}"
        );
        assert_eq!(counts.count_of(metrics::BEST_EFFORT_FAILURES), 1);
        assert_eq!(h.mailer.sent.lock().unwrap().len(), 2, "the digest went out");
        assert!(
            still_holding(&h).is_empty(),
            "the breaker was tended (it holds nothing)"
        );
        let next = h.services.run_scheduler().await.unwrap();
        assert_eq!((next.failed, next.moved), (0, 2), "and the next tick moves them");
    }

    #[tokio::test]
    async fn given_an_item_that_cannot_be_read_due_beside_a_task_then_the_task_moves_and_the_item_is_set_aside_and_counted(
    ) {
        let (h, counts) = Harness::new(ScriptedSender::always(200)).recording();
        let now = h.clock.now();
        let task = ScheduledTask {
            task: DeliveryTask {
                delivery_id: crate::model::DeliveryId::generate(now, &mut rand::rng()),
                round: 0,
                attempt: 2,
                queued_at: None,
                slot: None,
                tenant_id: None,
                held_until: None,
                redrives: 0,
            },
            due: now + Duration::minutes(1),
        };
        h.scheduler.schedule(&task).await.unwrap();
        let bad = UnreadableItem {
            due: now,
            key: "bad".into(),
            raw: "{not json".into(),
        };
        h.scheduler.unreadable.lock().unwrap().push(bad);

        let report = h.services.run_scheduler().await.unwrap();
        assert_eq!((report.moved, report.set_aside, report.failed), (1, 1, 0), "{report:?}");
        assert_eq!(counts.count_of(metrics::SCHEDULER_ITEMS_SET_ASIDE), 1);
        let aside = h.scheduler.set_aside(None, 10).await.unwrap();
        assert_eq!(aside.len(), 1);
        let at: DateTime<Utc> = h.clock.now();
        assert_eq!(
            (aside[0].key.as_str(), aside[0].raw.as_str(), aside[0].set_aside_at),
            ("bad", "{not json", at)
        );
        assert_eq!(h.services.run_scheduler().await.unwrap().set_aside, 0, "once");
    }

    #[tokio::test]
    async fn given_more_endpoints_holding_than_a_tick_tends_then_the_next_goes_on_after_the_last_tended_and_wraps_around(
    ) {
        let h = Harness::new(ScriptedSender::always(200));
        let subs: Vec<_> = (1..=5).map(sub_id).collect();
        // None holds an attempt: tending one lets it go, so those let go are those tended.
        list_holding(&h, &subs);
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        let tend = |starts: usize| {
            let h = &h;
            async move {
                let mut tended = 0;
                let stop = Stop::After(starts.into());
                h.services.tend_breakers(&stop, far, &mut tended).await.unwrap();
                tended
            }
        };

        assert_eq!(tend(2).await, 2);
        assert_eq!(still_holding(&h), subs[2..]);
        assert_eq!(h.scheduler.tend_position().await.unwrap(), Some(subs[1].clone()));
        // The first two hold again: the next tick goes on after the second all the same.
        list_holding(&h, &subs[..2]);
        assert_eq!(tend(2).await, 2);
        assert_eq!(still_holding(&h), [&subs[..2], &subs[4..]].concat());
        // The end of the list, then round to the first: every one tended.
        assert_eq!(tend(5).await, 3);
        assert!(still_holding(&h).is_empty());
        assert_eq!(
            h.scheduler.tend_position().await.unwrap(),
            None,
            "the list's end: from the first"
        );
    }
}
