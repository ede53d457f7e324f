//! The circuit breaker on the delivery path (the rules are in [`crate::circuit`]): whether an
//! attempt due now is made, made as the probe, or held; what its outcome does to the breaker;
//! and the release of what it held once it closes.
//!
//! What it costs: an endpoint whose latest attempt succeeded costs nothing (its breaker is
//! closed, and not read). Once attempts fail, its breaker is read, kept by the process for
//! [`CIRCUIT_TTL`]; and a save of the endpoint's health that ends a stored run of failures
//! reads it once, fresh, to close it if it was left open. It is written on each change of
//! state and each probe. A held attempt is a read of the breaker (one a second at most: an
//! attempt is held on a copy read within [`HOLD_ON_A_READ_WITHIN`], and one held on a copy
//! older than a closing is released by the scheduler's next tick), a write moving the
//! delivery's next attempt to its give-up time (so the sweep leaves it be), and its parking
//! (`SchedulerTable::hold`); nothing more while held, however long. Its release is one
//! message.
//!
//! Held attempts are released, after the probe that closed the breaker, page by page: the
//! closing call releases the first, and the first released attempt to find the release going
//! on (`Circuit::releasing`) once most of that page has gone (`next_probe_at`) releases the
//! next.
//!
//! Nothing here depends on one call finishing. Every step that claims work on the breaker
//! writes what makes it happen first (the probe's message before its claim), or claims it
//! only for a while (a page's release, for [`RELEASE_CLAIM`]); and every endpoint that holds
//! anything is listed (`SchedulerTable::holding`) until it holds nothing, and the scheduler's
//! tick tends each one ([`Services::tend_breaker`]): a probe overdue by [`PROBE_GRACE`] is
//! queued, a release that stopped goes on, and what a breaker turned off, or a subscription
//! disabled or deleted, still holds is let go. A change of the subscription tends it at once.

use std::time::Instant;

use chrono::{DateTime, Utc};

use super::operational::Operational;
use super::{DeliverOutcome, Services};
use crate::circuit::{self, Admission, Circuit, CircuitState};
use crate::error::{PortError, Result};
use crate::metrics;
use crate::model::{Delivery, DeliveryStatus, Subscription, SubscriptionId, SubscriptionStatus, TenantId};
use crate::ports::{DeliveryTask, Holding, ScheduledTask};
use crate::state::{self, seconds};

/// How long a process keeps an endpoint's breaker state before reading it again: another
/// process's opening or closing is seen within this.
pub const CIRCUIT_TTL: std::time::Duration = std::time::Duration::from_secs(2);
/// How old a kept breaker state may be for an attempt to be held on it. A hold made on a copy
/// older than a closing waits for the scheduler's next tick to release it (a minute on AWS);
/// read again for every hold, a storm's holds would cost a read each.
pub const HOLD_ON_A_READ_WITHIN: chrono::Duration = chrono::Duration::milliseconds(1000);
/// Held attempts released per page.
const RELEASE_PAGE: u32 = 500;
/// Pages of a disabled or deleted subscription's held attempts let go of in one tending: a
/// few endpoints with large held sets cannot fill the tick while others wait for theirs (the
/// scheduler tends them round, `Services::tend_breakers`, and the next round lets go of more).
const LET_GO_PAGES: usize = 2;
/// How long a page's release is claimed for: another release waits that long for it to be
/// queued and un-parked (so two never queue one page twice), and then takes it on (its
/// releaser died).
const RELEASE_CLAIM: chrono::TimeDelta = chrono::TimeDelta::seconds(60);
/// How late a probe may be before the scheduler's tick queues one: the probe's own message,
/// queued to arrive at the probe time, may be received a few seconds after it.
pub const PROBE_GRACE: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// What the breaker says of an attempt due now.
#[derive(Debug, Clone)]
pub(super) enum Gate {
    /// Make it (`probe`: as the breaker's probe). `circuit`: the breaker as read, if it was.
    Attempt { circuit: Option<Circuit>, probe: bool },
    /// Hold it.
    Hold,
    /// Queue it to arrive at `at` and be the probe then; then write `claim` (the breaker
    /// naming it the next probe), if it is not named already.
    ProbeAt { at: DateTime<Utc>, claim: Option<Claim> },
}

/// A change of the breaker to write over the copy it was made from.
#[derive(Debug, Clone)]
pub(super) struct Claim {
    pub read: Circuit,
    pub next: Circuit,
}

impl Services {
    /// The endpoint's breaker, as this process keeps it (fresh: read now).
    pub(crate) async fn kept_circuit(&self, sub: &Subscription, fresh: bool) -> Result<Option<Circuit>> {
        let ttl = chrono::Duration::from_std(CIRCUIT_TTL).unwrap_or_default();
        if !fresh {
            if let Some(kept) = self.lookups.circuits.get(&sub.id, self.now() - ttl) {
                return Ok(kept);
            }
        }
        let read_in = self.lookups.generation();
        let circuit = self.ports.store.circuit(&sub.id).await?;
        self.keep_circuit(sub, circuit.clone(), read_in);
        Ok(circuit)
    }

    fn keep_circuit(&self, sub: &Subscription, circuit: Option<Circuit>, read_in: u64) {
        let l = &self.lookups;
        l.circuits
            .put(sub.id.clone(), circuit, self.now(), &l.generation, read_in);
    }

    /// When the attempt `task` gives up if held: when its retry schedule would have made its
    /// last attempt (at the latest), kept through probes, releases and the retries after it
    /// (`held_until`). Held till then, it is made, the breaker open or not, and so is every
    /// retry after it, on its schedule: the breaker never kills a delivery sooner than its
    /// schedule would have, nor with fewer attempts. (So an attempt with no retry after it, a
    /// tenant's with retries off say, is never held.)
    pub(super) fn gives_up_at(
        &self,
        sub: &Subscription,
        delivery: &Delivery,
        task: &DeliveryTask,
        retries: bool,
    ) -> DateTime<Utc> {
        task.held_until.unwrap_or_else(|| {
            let left = match retries {
                true => sub
                    .retry_policy
                    .remaining_span(delivery.attempts, delivery.last_delay_seconds),
                false => 0.0,
            };
            self.now() + seconds(left)
        })
    }

    /// Whether the attempt `task` is made. `failures`: how many of the endpoint's latest
    /// attempts failed in a row, as this process knows (none: the breaker is closed).
    /// `gives_up_at`: from then the attempt is made, as its schedule's last.
    pub(super) async fn gate(
        &self,
        sub: &Subscription,
        task: &DeliveryTask,
        failures: u32,
        gives_up_at: DateTime<Utc>,
    ) -> Result<Gate> {
        let breaker = &sub.circuit_breaker;
        // A released or held attempt reads the breaker: the release may be its to go on with.
        if !breaker.enabled || (failures == 0 && task.held_until.is_none()) {
            return Ok(Gate::Attempt {
                circuit: None,
                probe: false,
            });
        }
        if self.now() >= gives_up_at {
            // Its last attempt; a success closes the breaker, so it is read fresh.
            let circuit = self.kept_circuit(sub, true).await?;
            return Ok(Gate::Attempt { circuit, probe: false });
        }
        let mut circuit = self.kept_circuit(sub, false).await?;
        let recent = self
            .lookups
            .circuits
            .get(&sub.id, self.now() - HOLD_ON_A_READ_WITHIN)
            .is_some();
        for fresh in [false, true] {
            let now = self.now();
            let attempt = (task.round, task.attempt);
            match circuit::admit(circuit.as_ref(), breaker, &task.delivery_id, attempt, gives_up_at, now) {
                Admission::Send => return Ok(Gate::Attempt { circuit, probe: false }),
                Admission::ProbeAgain => return Ok(Gate::Attempt { circuit, probe: true }),
                Admission::Probe(claim) => {
                    if self.write_circuit(sub, &claim, circuit.as_ref()).await? {
                        tracing::info!(subscription_id = %sub.id, "circuit breaker half open: this attempt is its probe");
                        return Ok(Gate::Attempt {
                            circuit: Some(claim),
                            probe: true,
                        });
                    }
                }
                // Its message is queued for the probe time (by `hold`) before its claim is
                // written: a claim never names a probe that is not on its way.
                // Named the next probe on what a fresh read says: a kept copy may be older
                // than a closing, and the claim is not waited for.
                Admission::Candidate(_) if !fresh => {}
                Admission::Candidate(next) => {
                    let at = next.next_probe_at.unwrap_or(now);
                    let read = circuit.clone().unwrap_or_else(|| Circuit::closed(now));
                    let claim = Some(Claim { read, next });
                    return Ok(Gate::ProbeAt { at, claim });
                }
                Admission::WaitForProbe { at } => return Ok(Gate::ProbeAt { at, claim: None }),
                // Held on what a recent read says: a kept copy may be older than the closing.
                Admission::Hold if fresh || recent => return Ok(Gate::Hold),
                Admission::Hold => {}
            }
            circuit = self.kept_circuit(sub, true).await?;
        }
        Ok(Gate::Hold)
    }

    /// Store a change of the breaker; `false` if another came first (the kept copy is
    /// forgotten, so the next look reads it).
    async fn write_circuit(&self, sub: &Subscription, next: &Circuit, read: Option<&Circuit>) -> Result<bool> {
        let read_in = self.lookups.generation();
        match self.ports.store.put_circuit(&sub.id, next, read).await {
            Ok(()) => {
                self.keep_circuit(sub, Some(next.clone()), read_in);
                Ok(true)
            }
            Err(PortError::ConditionFailed(_)) => {
                self.lookups.circuits.forget(&sub.id);
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// After an attempt (recorded): open the breaker at the threshold, open it again after a
    /// failed probe, or close it on a success and release what it held; an attempt the
    /// breaker released (`released`) goes on with the release. Best effort (an error is
    /// logged and counted: the delivery is recorded, and the scheduler's tick tends a breaker
    /// that holds attempts), but for a probe's move: that error is returned, so its message
    /// comes back and its outcome moves the breaker then (`resume_retry`), for a half-open
    /// breaker whose probe is done may hold nothing the tick would tend it for.
    pub(super) async fn after_attempt_breaker(
        &self,
        sub: &Subscription,
        circuit: Option<Circuit>,
        probe: bool,
        success: bool,
        released: bool,
    ) -> Result<()> {
        let result = match self.move_breaker(sub, circuit, probe, success).await {
            Err(err) if probe => return Err(err),
            Ok(Some((read, next))) => self.after_move(sub, read.as_ref(), next).await,
            other => other.map(|_| ()),
        };
        let result = match result {
            Ok(()) if released => self.go_on_releasing(sub).await,
            other => other,
        };
        if let Err(err) = result {
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(error = %err, subscription_id = %sub.id, "could not update the circuit breaker");
        }
        Ok(())
    }

    /// The breaker's change after an attempt, written: what it was read as and what it is
    /// now, or `None` if it does not change (or another change came first).
    async fn move_breaker(
        &self,
        sub: &Subscription,
        read: Option<Circuit>,
        probe: bool,
        success: bool,
    ) -> Result<Option<(Option<Circuit>, Circuit)>> {
        let breaker = &sub.circuit_breaker;
        if !breaker.enabled {
            return Ok(None);
        }
        let failures = self.kept_failures(&sub.id);
        if !success && failures < breaker.failure_threshold && !probe {
            return Ok(None);
        }
        let circuit = match read {
            Some(c) => Some(c),
            None if success => return Ok(None), // closed, and not read: nothing to close
            None => self.kept_circuit(sub, false).await?,
        };
        // While a probe is in flight only its own failure opens the breaker again: another
        // attempt's (a delivery that gave up being held) would take the probe's closing write
        // from it, and keep the breaker open one more interval.
        if !success && !probe && circuit.as_ref().is_some_and(|c| c.state == CircuitState::HalfOpen) {
            return Ok(None);
        }
        let now = self.now();
        let Some(next) = circuit::after_attempt(circuit.as_ref(), breaker, success, failures, now) else {
            return Ok(None);
        };
        if next.state == CircuitState::Open {
            // The failures that open it are stored first: an attempt reads the breaker only
            // when the endpoint's health shows failures, so a process that never saw these
            // (another, or this one started afresh after a crash) must find them stored, or
            // its attempts go past an open breaker that nobody probes or closes. And so is the
            // failed probe's that re-opens it: a save ending the stored run with an older
            // success would close it (`close_after_success`).
            self.save_health(sub, now).await?;
            // Saved, the run may be over: another process's success came after these
            // failures. Opened now, the breaker would go unread (every process sees the run
            // ended) until a failure found it.
            if !probe && self.kept_failures(&sub.id) < breaker.failure_threshold {
                return Ok(None);
            }
        }
        match self.write_circuit(sub, &next, circuit.as_ref()).await? {
            true => Ok(Some((circuit, next))),
            false => Ok(None),
        }
    }

    /// A save of the endpoint's health is about to end a stored run of failures with a
    /// success (one made past the breaker, by a process whose health showed no failures): the
    /// breaker, read fresh, is closed as a probe's success closes it, and what it held
    /// released. Not one half open with its probe in flight (the probe decides), nor one
    /// turned off (the scheduler's tick releases what it holds). An error stops the save, so
    /// the run stays stored and the next save tries again.
    pub(super) async fn close_after_success(&self, sub: &Subscription) -> Result<()> {
        let breaker = &sub.circuit_breaker;
        if !breaker.enabled {
            return Ok(());
        }
        let Some(read) = self.kept_circuit(sub, true).await? else {
            return Ok(());
        };
        let now = self.now();
        let probing = read.state == CircuitState::HalfOpen && read.next_probe_at.is_some_and(|at| now < at);
        if probing {
            return Ok(());
        }
        let Some(next) = circuit::after_attempt(Some(&read), breaker, true, 0, now) else {
            return Ok(()); // closed
        };
        // Another change came first (a probe's claim, a closing): that one stands.
        if self.write_circuit(sub, &next, Some(&read)).await? {
            tracing::info!(subscription_id = %sub.id, "circuit breaker closed: the endpoint's attempts succeed again");
            self.after_move(sub, Some(&read), next).await?;
        }
        Ok(())
    }

    /// What follows a change of the breaker from `read` to `next`: the next probe queued
    /// when it opens, the first page released when it closes.
    async fn after_move(&self, sub: &Subscription, read: Option<&Circuit>, next: Circuit) -> Result<()> {
        let failures = self.kept_failures(&sub.id);
        match next.state {
            CircuitState::Open => {
                let opened = read.is_none_or(|c| c.state == CircuitState::Closed);
                if opened {
                    self.metrics.count(metrics::BREAKER_OPENED, 1);
                    tracing::warn!(subscription_id = %sub.id, failures, next_probe_at = ?next.next_probe_at,
                        "circuit breaker open: the endpoint's attempts are held");
                }
                // It opened on at least the threshold's failures (the count this process
                // keeps may have moved on since).
                let failed = failures.max(sub.circuit_breaker.failure_threshold);
                let told = opened
                    .then(|| Operational::breaker_opened(sub, &next, failed))
                    .flatten();
                // Told whatever becomes of the follow-up: the move is stored either way.
                let followed = self.queue_next_probe(sub, next).await;
                self.tell_best_effort(&sub.tenant_id, told).await;
                followed
            }
            CircuitState::Closed => {
                tracing::info!(subscription_id = %sub.id, "circuit breaker closed: releasing what it held");
                let told = Operational::breaker_closed(sub, read, &next);
                let followed = self.release_page(sub, next).await;
                self.tell_best_effort(&sub.tenant_id, told).await;
                followed
            }
            CircuitState::HalfOpen => Ok(()),
        }
    }

    /// The release goes on with whoever finds it going (a released attempt, the scheduler's
    /// tick), once its next page is due.
    async fn go_on_releasing(&self, sub: &Subscription) -> Result<()> {
        let now = self.now();
        match self.kept_circuit(sub, false).await? {
            Some(c) if c.state == CircuitState::Closed && c.releasing && c.next_probe_at.is_none_or(|at| now >= at) => {
                self.release_page(sub, c).await
            }
            _ => Ok(()),
        }
    }

    /// Hold an attempt the open breaker keeps from its endpoint: park it until the release
    /// (`probe_at`: or queue it to be the probe then, and write the breaker's claim naming
    /// it), due to make its last attempt at `until` if the breaker is open till then.
    pub(super) async fn hold(
        &self,
        sub: &Subscription,
        delivery: &Delivery,
        task: &DeliveryTask,
        until: DateTime<Utc>,
        probe_at: Option<(DateTime<Utc>, Option<Claim>)>,
    ) -> Result<DeliverOutcome> {
        self.next_attempt_not_before(delivery, until).await?;
        let held = DeliveryTask {
            queued_at: None,
            slot: None,
            held_until: Some(until),
            ..task.clone()
        };
        match probe_at {
            Some((at, claim)) => {
                self.schedule_attempt(held, at.min(until)).await?;
                if let Some(Claim { read, next }) = claim {
                    // Best effort: its message is queued, and is judged when it comes (another
                    // change came first, or the write failed: without the claim, the first to
                    // come at the probe time is the probe). An error here would send the
                    // message back and queue a second copy.
                    if let Err(err) = self.write_circuit(sub, &next, Some(&read)).await {
                        self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
                        tracing::warn!(error = %err, subscription_id = %sub.id, "could not name the next probe on the breaker");
                    }
                }
            }
            None => {
                let item = ScheduledTask { task: held, due: until };
                self.ports.scheduler.hold(&sub.tenant_id, &sub.id, &item).await?
            }
        }
        Ok(DeliverOutcome::Held { until })
    }

    /// The breaker is open with no probe on its way (it has just opened, or its probe failed,
    /// or the one on its way found its attempt made): queue the first held attempt (the
    /// oldest delivery's), to arrive at the probe time and be the probe, then name it on the breaker,
    /// then un-park it. None held: the next attempt to come is queued so instead
    /// (`Admission::Candidate`). Whatever step fails, a message is on its way or the attempt
    /// is still parked, where the scheduler's tick finds the probe overdue.
    async fn queue_next_probe(&self, sub: &Subscription, circuit: Circuit) -> Result<()> {
        let Some(first) = self.first_held(&sub.id).await? else {
            return Ok(());
        };
        let at = circuit.next_probe_at.unwrap_or_else(|| self.now());
        self.schedule_attempt(first.task.clone(), at).await?;
        let claim = Circuit {
            probe: Some(first.task.delivery_id.clone()),
            probe_attempt: Some((first.task.round, first.task.attempt)),
            version: circuit.version + 1,
            ..circuit.clone()
        };
        self.write_circuit(sub, &claim, Some(&circuit)).await?;
        self.ports.scheduler.release(&sub.id, &[first]).await?;
        Ok(())
    }

    /// The first held attempt (the oldest delivery's) of those not given up yet: one whose
    /// give-up time has passed made its last attempt then (its scheduled copy), and is
    /// un-parked here.
    async fn first_held(&self, sub: &SubscriptionId) -> Result<Option<ScheduledTask>> {
        let now = self.now();
        loop {
            let page = self.ports.scheduler.held(sub, 50).await?;
            let (gone, waiting): (Vec<_>, Vec<_>) = page.iter().cloned().partition(|i| i.due <= now);
            if let Some(first) = waiting.into_iter().next() {
                if !gone.is_empty() {
                    self.ports.scheduler.release(sub, &gone).await?;
                }
                return Ok(Some(first));
            }
            if gone.is_empty() {
                return Ok(None);
            }
            self.ports.scheduler.release(sub, &gone).await?;
        }
    }

    /// A held (or released) attempt that found its delivery moved on: if it was on its way to
    /// be the probe, another is queued instead; if it was the probe (its breaker half open),
    /// the outcome of the probe's attempt, once recorded, moves the breaker, as that attempt
    /// would have (that move, or the process making it, failed).
    pub(super) async fn probe_moved_on(&self, delivery: &Delivery) -> Result<()> {
        let Some(sub) = self
            .kept_subscription(&delivery.tenant_id, &delivery.subscription_id)
            .await?
        else {
            return Ok(());
        };
        if !sub.circuit_breaker.enabled {
            return Ok(());
        }
        let Some(circuit) = self.kept_circuit(&sub, true).await? else {
            return Ok(());
        };
        if circuit.probe.as_ref() != Some(&delivery.id) {
            return Ok(());
        }
        let now = self.now();
        let next = match circuit.state {
            CircuitState::Open => Circuit {
                probe: None,
                probe_attempt: None,
                version: circuit.version + 1,
                ..circuit.clone()
            },
            CircuitState::HalfOpen => {
                // Only the probe's attempt, recorded, is its outcome: a 2xx, or a 429 (up,
                // pacing). Another move of the delivery (the probe sent back for a rate-limit
                // slot, the sweep's re-marking) leaves its last outcome an older attempt's,
                // and the probe still on its way. (The delivery item is all this reads: the
                // Deliver role may not query the table for its attempt log.)
                let made = match circuit.probe_attempt {
                    // That attempt recorded. (A delivery gone past it without it, or replayed
                    // since, says nothing of it: the probe counts as lost at `next_probe_at`,
                    // and the next attempt then is the probe.)
                    Some((round, attempt)) => delivery.round == round && delivery.attempts >= attempt,
                    // A breaker stored before the probe's attempt was kept: a move made since
                    // the probe began.
                    None => circuit
                        .next_probe_at
                        .is_some_and(|at| delivery.updated_at >= at - sub.circuit_breaker.probe_interval()),
                };
                if !made {
                    return Ok(());
                }
                let success = delivery.status == DeliveryStatus::Delivered || delivery.last_status_code == Some(429);
                let failures = sub.circuit_breaker.failure_threshold;
                match circuit::after_attempt(Some(&circuit), &sub.circuit_breaker, success, failures, now) {
                    Some(next) => next,
                    None => return Ok(()),
                }
            }
            CircuitState::Closed => return Ok(()),
        };
        if !self.write_circuit(&sub, &next, Some(&circuit)).await? {
            return Ok(());
        }
        match next.state {
            // Closed by the probe's success: released, and told, as any closing is.
            CircuitState::Closed => self.after_move(&sub, Some(&circuit), next).await,
            _ => self.queue_next_probe(&sub, next).await,
        }
    }

    /// Release the next page of what the closed breaker held: claim it on the breaker (its
    /// count of released, and no other page for [`RELEASE_CLAIM`]), queue it at the
    /// endpoint's rate limit (the limiter paces it) or on the ramp, un-park it, then say when
    /// the next page is due. A crash after the claim leaves the page held, first in line for
    /// whoever finds the claim run out.
    async fn release_page(&self, sub: &Subscription, circuit: Circuit) -> Result<()> {
        let page = self.ports.scheduler.held(&sub.id, RELEASE_PAGE).await?;
        let now = self.now();
        let released = circuit.released + page.len() as u64;
        let claim = Circuit {
            released,
            releasing: !page.is_empty(),
            next_probe_at: (!page.is_empty()).then_some(now + RELEASE_CLAIM),
            version: circuit.version + 1,
            ..circuit.clone()
        };
        if !self.write_circuit(sub, &claim, Some(&circuit)).await? || page.is_empty() {
            return Ok(());
        }
        let tasks: Vec<(DeliveryTask, u32)> = page
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let delay = match sub.rate_limit_per_second {
                    Some(_) => 0,
                    // Rounded up: `now` is a little past `since`, and a delay rounded down
                    // would bring each second's share a second early.
                    None => state::delay_until(now, circuit::ramp_at(circuit.since, circuit.released + i as u64)),
                };
                let delay = u32::try_from(delay).unwrap_or(u32::MAX);
                (item.task.clone(), delay.min(self.ports.queue.max_delay_seconds()))
            })
            .collect();
        self.ports.queue.enqueue(&tasks).await?;
        self.ports.scheduler.release(&sub.id, &page).await?;
        self.metrics.count(metrics::RELEASED, page.len() as u64);
        tracing::info!(subscription_id = %sub.id, released = page.len(), "held attempts released");
        // The next page once most of this one has gone: three fifths of its slots at the rate
        // limit, or a second before the ramp reaches it.
        let next_page_at = match sub.rate_limit_per_second {
            Some(r) => now + chrono::Duration::milliseconds(page.len() as i64 * 600 / i64::from(r.max(1))),
            None => circuit.since + chrono::Duration::seconds(i64::from(circuit::ramp_offset(released)) - 1),
        };
        let done = Circuit {
            next_probe_at: Some(next_page_at),
            version: claim.version + 1,
            ..claim.clone()
        };
        // Changed meanwhile (reopened, say): that change stands, and this page is queued.
        self.write_circuit(sub, &done, Some(&claim)).await?;
        Ok(())
    }

    /// Whatever the endpoint's breaker is owed that nobody did: called for each endpoint that
    /// holds attempts by the scheduler's tick, and by a change of its subscription. Anyone
    /// may call it, any number of times.
    /// - Holding nothing: it is no longer listed (then looked at again, in case a hold came
    ///   meanwhile).
    /// - Its subscription disabled or deleted: everything held is queued at once (each dies,
    ///   its owner told, on arrival, with no POST).
    /// - Its breaker turned off, or closed with attempts still held (held on a read from
    ///   up to a second before the closing): they are released as on a closing.
    /// - A release whose next page is due: the page.
    /// - Open, or half open, past the probe time by [`PROBE_GRACE`] (the probe's message was
    ///   lost, or its claim's writer died): the first held attempt is queued now,
    ///   to be the probe.
    ///
    /// A disabled or deleted subscription's held attempts are queued a page at a time until
    /// `until`, a few pages at most (`LET_GO_PAGES`).
    pub(crate) async fn tend_breaker(&self, holding: &Holding, until: Instant) -> Result<()> {
        let scheduler = &self.ports.scheduler;
        let sub_id = &holding.subscription_id;
        if scheduler.held(sub_id, 1).await?.is_empty() {
            scheduler.stop_holding(sub_id).await?;
            if let Some(late) = scheduler.held(sub_id, 1).await?.pop() {
                scheduler.hold(&holding.tenant_id, sub_id, &late).await?;
            }
            return Ok(());
        }
        let sub = self.ports.store.get_subscription(&holding.tenant_id, sub_id).await?;
        let Some(sub) = sub.filter(|s| s.status == SubscriptionStatus::Active) else {
            return self.let_go_of_held(sub_id, until).await;
        };
        let now = self.now();
        match self.kept_circuit(&sub, true).await? {
            Some(c) if c.state == CircuitState::Closed && c.releasing => {
                match c.next_probe_at.is_none_or(|at| now >= at) {
                    true => self.release_page(&sub, c).await,
                    false => Ok(()),
                }
            }
            Some(c) if sub.circuit_breaker.enabled && c.state != CircuitState::Closed => {
                if c.next_probe_at.is_some_and(|at| now < at + PROBE_GRACE) {
                    return Ok(());
                }
                let Some(next) = self.first_held(sub_id).await? else {
                    return Ok(());
                };
                tracing::warn!(subscription_id = %sub.id, next_probe_at = ?c.next_probe_at,
                    "the circuit breaker's probe is overdue; the next held attempt is queued to be it");
                self.schedule_attempt(next.task.clone(), now).await?;
                scheduler.release(sub_id, &[next]).await?;
                Ok(())
            }
            // Turned off while open, or closed (or never stored) with attempts still held.
            other => self.release_anew(&sub, other).await,
        }
    }

    /// [`Self::tend_breaker`] after a change of the subscription (its breaker turned off, it
    /// disabled or deleted), so what it held is let go now, not at the next tick: its first
    /// page (the request or the attempt that made the change has its own time limit; the
    /// scheduler's tick does the rest). Best effort: the tick does it otherwise.
    pub(crate) async fn tend_after_change(&self, tenant: &TenantId, sub: &SubscriptionId) {
        let holding = Holding {
            subscription_id: sub.clone(),
            tenant_id: tenant.clone(),
        };
        if let Err(err) = self.tend_breaker(&holding, Instant::now()).await {
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(error = %err, subscription_id = %sub,
                "could not let go of what the circuit breaker held; the scheduler's tick will");
        }
    }

    /// Release what the breaker holds from now, as on a closing: the breaker turned off, or
    /// closed with attempts still held.
    async fn release_anew(&self, sub: &Subscription, read: Option<Circuit>) -> Result<()> {
        let now = self.now();
        let closing = Circuit {
            releasing: true,
            version: read.as_ref().map_or(0, |c| c.version + 1),
            ..Circuit::closed(now)
        };
        if !self.write_circuit(sub, &closing, read.as_ref()).await? {
            return Ok(());
        }
        tracing::info!(subscription_id = %sub.id, "releasing what the circuit breaker still held");
        // A breaker turned off while open is closed from now: told as a closing.
        let was_open = read.as_ref().is_some_and(|c| c.state != CircuitState::Closed);
        let told = was_open
            .then(|| Operational::breaker_closed(sub, read.as_ref(), &closing))
            .flatten();
        let followed = self.release_page(sub, closing).await;
        self.tell_best_effort(&sub.tenant_id, told).await;
        followed
    }

    /// Queue what a disabled or deleted subscription's breaker held, a page at a time until
    /// `until` (one page at least) and [`LET_GO_PAGES`] at most: each is settled on arrival
    /// (dead, its owner told), with no POST.
    async fn let_go_of_held(&self, sub: &SubscriptionId, until: Instant) -> Result<()> {
        for _ in 0..LET_GO_PAGES {
            let page = self.ports.scheduler.held(sub, RELEASE_PAGE).await?;
            if page.is_empty() {
                return Ok(());
            }
            let tasks: Vec<_> = page.iter().map(|i| (i.task.clone(), 0)).collect();
            self.ports.queue.enqueue(&tasks).await?;
            self.ports.scheduler.release(sub, &page).await?;
            tracing::info!(subscription_id = %sub, settled = page.len(),
                "held attempts of a disabled or deleted subscription queued to be settled");
            if Instant::now() >= until {
                break;
            }
        }
        Ok(())
    }
}
