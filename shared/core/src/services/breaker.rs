//! The circuit breaker on the delivery path (the rules are in [`crate::circuit`]): whether an
//! attempt due now is made, made as the probe, or held; what its outcome does to the breaker;
//! and the release of what it held once it closes.
//!
//! What it costs: an endpoint whose latest attempt succeeded costs nothing (its breaker is
//! closed, and not read). Once attempts fail, its breaker is read, kept by the process for
//! [`CIRCUIT_TTL`]. It is written on each change of state and each probe. A held attempt is
//! one read of the breaker (fresh: an attempt is never held on an old copy), a write moving
//! the delivery's next attempt to its give-up time (so the sweep leaves it be), and its parking
//! (`SchedulerTable::hold`); nothing more while held, however long. Its release is one
//! message.
//!
//! Held attempts are released, after the probe that closed the breaker, page by page: the
//! closing call releases the first, and the first attempt to find the release going on
//! (`Circuit::releasing`) once most of that page has gone (`next_probe_at`) releases the
//! next. One held after the last page went (by a process whose breaker read came a moment
//! before the closing) is made when its give-up time comes, the breaker then closed.

use chrono::{DateTime, Utc};

use super::{DeliverOutcome, Services};
use crate::circuit::{self, Admission, Circuit, CircuitState};
use crate::error::{PortError, Result};
use crate::metrics;
use crate::model::{Delivery, Subscription};
use crate::ports::{DeliveryTask, ScheduledTask};
use crate::state::{requeued, seconds};

/// How long a process keeps an endpoint's breaker state before reading it again: another
/// process's opening or closing is seen within this.
pub const CIRCUIT_TTL: std::time::Duration = std::time::Duration::from_secs(2);
/// Held attempts released per page.
const RELEASE_PAGE: u32 = 500;

/// What the breaker says of an attempt due now.
#[derive(Debug, Clone)]
pub(super) enum Gate {
    /// Make it (`probe`: as the breaker's probe). `circuit`: the breaker as read, if it was.
    Attempt { circuit: Option<Circuit>, probe: bool },
    /// Hold it.
    Hold,
    /// Queue it to arrive at `at` and be the probe then.
    ProbeAt { at: DateTime<Utc> },
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
    /// last attempt (at the latest), kept through probes and releases (`held_until`). Held
    /// till then, it makes that attempt, the breaker open or not, so the breaker never kills
    /// a delivery sooner than its schedule would have, nor without a last try. (So an attempt
    /// with no retry after it, a tenant's with retries off say, is never held.)
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
        for fresh in [false, true] {
            let now = self.now();
            match circuit::admit(circuit.as_ref(), breaker, &task.delivery_id, now) {
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
                Admission::Candidate(claim) => {
                    if self.write_circuit(sub, &claim, circuit.as_ref()).await? {
                        let at = claim.next_probe_at.unwrap_or(now);
                        return Ok(Gate::ProbeAt { at });
                    }
                }
                // Held on what a fresh read says: a kept copy may be older than the closing.
                Admission::Hold if fresh => return Ok(Gate::Hold),
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
    /// failed probe, or close it on a success and release what it held. Best effort: an
    /// error is logged (the breaker protects the endpoint; the delivery is recorded).
    pub(super) async fn after_attempt_breaker(
        &self,
        sub: &Subscription,
        circuit: Option<Circuit>,
        probe: bool,
        success: bool,
    ) {
        if let Err(err) = self.move_breaker(sub, circuit, probe, success).await {
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(error = %err, subscription_id = %sub.id, "could not update the circuit breaker");
        }
    }

    async fn move_breaker(&self, sub: &Subscription, read: Option<Circuit>, probe: bool, success: bool) -> Result<()> {
        let breaker = &sub.circuit_breaker;
        if !breaker.enabled {
            return Ok(());
        }
        let failures = self.kept_failures(&sub.id);
        if !success && failures < breaker.failure_threshold && !probe {
            return Ok(());
        }
        let circuit = match read {
            Some(c) => Some(c),
            None if success => return Ok(()), // closed, and not read: nothing to close
            None => self.kept_circuit(sub, false).await?,
        };
        let now = self.now();
        if let Some(next) = circuit::after_attempt(circuit.as_ref(), breaker, success, failures, now) {
            if self.write_circuit(sub, &next, circuit.as_ref()).await? {
                match next.state {
                    CircuitState::Open => {
                        if circuit.as_ref().is_none_or(|c| c.state == CircuitState::Closed) {
                            self.metrics.count(metrics::BREAKER_OPENED, 1);
                            tracing::warn!(subscription_id = %sub.id, failures, next_probe_at = ?next.next_probe_at,
                                "circuit breaker open: the endpoint's attempts are held");
                        }
                        return self.queue_next_probe(sub, next).await;
                    }
                    CircuitState::Closed => {
                        tracing::info!(subscription_id = %sub.id, "circuit breaker closed: releasing what it held");
                    }
                    CircuitState::HalfOpen => {}
                }
            }
        }
        // The release goes on with whoever finds it going, once its next page is due.
        let now = self.now();
        match self.kept_circuit(sub, false).await? {
            Some(c) if c.state == CircuitState::Closed && c.releasing && c.next_probe_at.is_none_or(|at| now >= at) => {
                self.release_page(sub, c).await
            }
            _ => Ok(()),
        }
    }

    /// Hold an attempt the open breaker keeps from its endpoint: park it until the release
    /// (`probe_at`: or queue it to be the probe then), due to make its last attempt at
    /// `until` if the breaker is open till then.
    pub(super) async fn hold(
        &self,
        sub: &Subscription,
        delivery: &Delivery,
        task: &DeliveryTask,
        until: DateTime<Utc>,
        probe_at: Option<DateTime<Utc>>,
    ) -> Result<DeliverOutcome> {
        let now = self.now();
        if delivery.is_swept() && delivery.next_attempt_at.is_none_or(|at| at < until) {
            // The sweep would queue it again at its next attempt's time: not before the end.
            match self.ports.store.apply_change(&requeued(delivery, now, until)).await {
                Ok(()) | Err(PortError::ConditionFailed(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let held = DeliveryTask {
            queued_at: None,
            slot: None,
            held_until: Some(until),
            ..task.clone()
        };
        match probe_at {
            Some(at) => self.schedule_attempt(held, at.min(until)).await?,
            None => {
                self.ports
                    .scheduler
                    .hold(&sub.id, &ScheduledTask { task: held, due: until })
                    .await?
            }
        }
        Ok(DeliverOutcome::Held { until })
    }

    /// The breaker is open with no probe on its way (it has just opened, or its probe failed,
    /// or the one on its way found its attempt made): queue the held attempt due to give up
    /// soonest, to arrive at the probe time and be the probe. None held: the next attempt to
    /// come is queued so instead (`Admission::Candidate`).
    async fn queue_next_probe(&self, sub: &Subscription, circuit: Circuit) -> Result<()> {
        let Some(first) = self.ports.scheduler.held(&sub.id, 1).await?.pop() else {
            return Ok(());
        };
        let claim = Circuit {
            probe: Some(first.task.delivery_id.clone()),
            version: circuit.version + 1,
            ..circuit.clone()
        };
        if !self.write_circuit(sub, &claim, Some(&circuit)).await? {
            return Ok(());
        }
        let at = circuit.next_probe_at.unwrap_or_else(|| self.now());
        self.schedule_attempt(first.task.clone(), at).await?;
        self.ports.scheduler.release(&sub.id, &[first]).await?;
        Ok(())
    }

    /// A held (or released) attempt that found its delivery moved on: if it was on its way to
    /// be the probe, another is queued instead.
    pub(super) async fn probe_moved_on(&self, delivery: &Delivery) -> Result<()> {
        let Some(sub) = self
            .kept_subscription(&delivery.tenant_id, &delivery.subscription_id)
            .await?
        else {
            return Ok(());
        };
        let Some(circuit) = self.kept_circuit(&sub, true).await? else {
            return Ok(());
        };
        if circuit.state != CircuitState::Open || circuit.probe.as_ref() != Some(&delivery.id) {
            return Ok(());
        }
        let cleared = Circuit {
            probe: None,
            version: circuit.version + 1,
            ..circuit.clone()
        };
        if self.write_circuit(&sub, &cleared, Some(&circuit)).await? {
            self.queue_next_probe(&sub, cleared).await?;
        }
        Ok(())
    }

    /// Release the next page of what the closed breaker held: claim it on the breaker (its
    /// count of released), then queue it at the endpoint's rate limit (the limiter paces
    /// it) or on the ramp, then un-park it. A crash after the claim leaves the page held,
    /// first in line for the next page.
    async fn release_page(&self, sub: &Subscription, circuit: Circuit) -> Result<()> {
        let page = self.ports.scheduler.held(&sub.id, RELEASE_PAGE).await?;
        let now = self.now();
        let released = circuit.released + page.len() as u64;
        // The next page once most of this one has gone: three fifths of its slots at the rate
        // limit, or a second before the ramp reaches it.
        let next_page_at = match sub.rate_limit_per_second {
            Some(r) => now + chrono::Duration::milliseconds(page.len() as i64 * 600 / i64::from(r.max(1))),
            None => circuit.since + chrono::Duration::seconds(i64::from(circuit::ramp_offset(released)) - 1),
        };
        let claim = Circuit {
            released,
            releasing: !page.is_empty(),
            next_probe_at: Some(next_page_at),
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
                    None => {
                        let at = circuit.since
                            + chrono::Duration::seconds(circuit::ramp_offset(circuit.released + i as u64).into());
                        (at - now).num_seconds().max(0) as u32
                    }
                };
                (item.task.clone(), delay.min(self.ports.queue.max_delay_seconds()))
            })
            .collect();
        self.ports.queue.enqueue(&tasks).await?;
        self.ports.scheduler.release(&sub.id, &page).await?;
        self.metrics.count(metrics::RELEASED, page.len() as u64);
        tracing::info!(subscription_id = %sub.id, released = page.len(), "held attempts released");
        Ok(())
    }
}
