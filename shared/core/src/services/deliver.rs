//! Deliver one queued attempt, in typed phases: check the message is still due → build the
//! signed request → send → decide → persist conditionally → hand on (queue, scheduler
//! table or dead-letter queue).

use chrono::{DateTime, Utc};
use futures::StreamExt;

use super::breaker::Gate;
use super::operational::Operational;
use super::secrets::Opened;
use super::Services;
use crate::error::{PortError, Result};
use crate::health::HealthSample;
use crate::metrics;
use crate::model::*;
use crate::ports::{DeliveryChange, DeliveryTask, ScheduledTask, WebhookRequest};
use crate::rate_limit::{self, Arrival, Verdict};
use crate::signing::signature_header;
use crate::state::{
    self, after_attempt, decide, give_up, is_ahead_of_delivery, is_due_attempt, AttemptContext, Decision,
};
use crate::stats::StatsCounts;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeliverOutcome {
    Delivered,
    Retrying {
        at: DateTime<Utc>,
    },
    Dead,
    /// The delivery had moved on (a duplicate or late message): nothing done.
    Stale,
    /// A message come before the state it is for is written (a first attempt's delivery, the
    /// attempt before a retry): queued again, to look once more a little later (see
    /// `look_again_later`).
    NotStoredYet,
    /// Over the endpoint's rate limit: queued again for the slot the limiter reserved, not
    /// attempted (and not counted as an attempt).
    RateLimited {
        slot: DateTime<Utc>,
    },
    /// Before its attempt's time (`Delivery::not_before`): queued again for then, not
    /// attempted.
    Early {
        at: DateTime<Utc>,
    },
    /// Held by the endpoint's open circuit breaker, not attempted (and not counted): parked
    /// until the breaker closes, or queued to be its next probe; it gives up at `until`.
    Held {
        until: DateTime<Utc>,
    },
}

/// The `disabled_reason` of a subscription whose endpoint answered 410.
const GONE: &str = "the endpoint answered 410 Gone";

/// How long a call that took on a disabled subscription's email (to send it) has it to itself:
/// longer than any such call lives (the Deliver function's 60 s), shorter than the queue's
/// visibility timeout (180 s on AWS, 120 s locally), so the message of a call that died finds
/// the email free when it comes back, and sends it. One back sooner (locally a failed batch's
/// messages can come back in half the timeout) is sent back again, at the cost of a receive.
pub const DISABLE_NOTICE_CLAIM: chrono::Duration = chrono::Duration::seconds(90);

/// How long after a message is queued the state it is for may still be written: an ingest's
/// delivery (no longer than the API's own time limit, API Gateway's 30 s; the ingest Lambda's
/// is 15 s), or the attempt a retry's message follows (the Deliver function's time after its
/// POST, 20 s). A message younger than this that comes before that state is queued again.
pub const WRITE_WINDOW: chrono::Duration = chrono::Duration::seconds(30);

/// How long after its attempt's time a message that came early is queued to arrive again
/// (`too_early`): longer than a Deliver call lives (60 s), so the message meant for that time
/// has been handled when it comes.
pub const EARLY_COPY_LAG: chrono::Duration = chrono::Duration::seconds(90);

/// How early a message may come and still be the one meant for its attempt's time
/// (`too_early`): hosts' clocks disagree by about this much, and a queue's delay is whole
/// seconds. It goes back to arrive this long after that time, not [`EARLY_COPY_LAG`] after.
pub const EARLY_SKEW: chrono::Duration = chrono::Duration::seconds(5);

/// How long a first attempt's message that finds no delivery is looked at again in the
/// process, before it is queued again with a delay (see `get_delivery_of`).
pub const FRESH_LOOK: chrono::Duration = chrono::Duration::milliseconds(500);

/// The headers and body a subscriber receives (Standard Webhooks, plus `Idempotency-Key`),
/// signed with `secrets` (the subscription's, opened: [`Subscription::signing_secrets`]),
/// then its `custom` headers (opened).
pub fn webhook_request(
    sub: &Subscription,
    secrets: &[Secret],
    custom: &[(String, String)],
    event: &Event,
    now: DateTime<Utc>,
) -> WebhookRequest {
    let body = serde_json::to_vec(&event.envelope()).expect("an envelope of JSON values serialises");
    let timestamp = now.timestamp();
    let id = event.id.as_str();
    WebhookRequest {
        url: sub.url.clone(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("webhook-id".into(), id.to_owned()),
            ("webhook-timestamp".into(), timestamp.to_string()),
            (
                "webhook-signature".into(),
                signature_header(secrets, id, timestamp, &body),
            ),
            ("idempotency-key".into(), id.to_owned()),
            (
                "user-agent".into(),
                concat!("Hookwise/", env!("CARGO_PKG_VERSION")).into(),
            ),
        ]
        .into_iter()
        .chain(custom.iter().cloned())
        .collect(),
        body,
        timeout: std::time::Duration::from_millis(sub.timeout_ms.into()),
    }
}

impl Services {
    /// Handle a batch of queue messages, `deliver_concurrency` at a time; results in the
    /// messages' order. An `Err` is an infrastructure failure: redeliver that message.
    pub async fn deliver_batch(&self, tasks: &[DeliveryTask]) -> Vec<Result<DeliverOutcome>> {
        self.deliver_batch_within(tasks, None).await
    }

    /// [`Self::deliver_batch`] that must be done by `deadline` (a Lambda invocation's): see
    /// [`Self::deliver_within`].
    pub async fn deliver_batch_within(
        &self,
        tasks: &[DeliveryTask],
        deadline: Option<DateTime<Utc>>,
    ) -> Vec<Result<DeliverOutcome>> {
        // The futures are built first (they do nothing until polled) so the stream's type
        // names no closure: a closure there trips the compiler's Send check under tokio::spawn.
        // The same task twice in one batch (a duplicate message) is handled once: run side by
        // side, both copies would find the delivery due and both would POST.
        let mut seen = std::collections::HashSet::new();
        let calls: Vec<_> = tasks
            .iter()
            .map(|t| self.deliver_first(t, deadline, seen.insert((&t.delivery_id, t.round, t.attempt))))
            .collect();
        futures::stream::iter(calls)
            .buffered(self.config.deliver_concurrency.max(1))
            .collect()
            .await
    }

    async fn deliver_first(
        &self,
        task: &DeliveryTask,
        deadline: Option<DateTime<Utc>>,
        first: bool,
    ) -> Result<DeliverOutcome> {
        if !first {
            return Ok(DeliverOutcome::Stale);
        }
        self.deliver_within(task, deadline).await
    }

    pub async fn deliver(&self, task: &DeliveryTask) -> Result<DeliverOutcome> {
        self.deliver_within(task, None).await
    }

    /// Deliver one task; with a `deadline`, the POST's timeout is the smaller of the
    /// subscription's and what the deadline leaves after [`Config::deadline_margin`], and a
    /// POST that would get less than [`super::SHORTEST_POST`] is not started: the message
    /// comes back (a retryable error), unattempted.
    #[tracing::instrument(skip_all, fields(delivery_id = %task.delivery_id, attempt = task.attempt))]
    pub async fn deliver_within(&self, task: &DeliveryTask, deadline: Option<DateTime<Utc>>) -> Result<DeliverOutcome> {
        let store = &self.ports.store;
        let Some(delivery) = self.get_delivery_of(task).await? else {
            return self.not_stored_yet(task).await;
        };
        if is_ahead_of_delivery(&delivery, task) {
            return self.not_written_yet(task).await;
        }
        if !is_due_attempt(&delivery, task) {
            return self.finish_stale(&delivery, task).await;
        }
        if let Some(at) = delivery.not_before.filter(|at| *at > self.now()) {
            return self.too_early(task, at).await;
        }
        // Independent reads, made at once, usually from what this process keeps (`lookups`).
        // The event is read only once the breaker lets the attempt through (below): a storm's
        // messages are mostly held, and a held attempt needs no event.
        let (subscription, tenant, health, deployment) = futures::try_join!(
            self.kept_subscription(&delivery.tenant_id, &delivery.subscription_id),
            self.kept_tenant(&delivery.tenant_id),
            self.kept_health(&delivery.subscription_id),
            self.kept_deployment(),
        )?;
        let sub = match subscription {
            Some(s) if s.status == SubscriptionStatus::Active => s,
            Some(_) => return self.abandon(&delivery, task, "the subscription is disabled").await,
            None => return self.abandon(&delivery, task, "the subscription was deleted").await,
        };
        // Before the breaker's gate and the rate limiter: a delivery that can never be signed
        // must not take a probe's turn or a slot.
        let secrets = match self.open_signing_secrets(&sub, self.now()).await? {
            Opened::Secrets(secrets) => secrets,
            // No attempt can be signed: dead at once, its owner told, replayable once fixed.
            Opened::Never(why) => return self.abandon(&delivery, task, &why).await,
        };
        let custom = match self.open_custom_headers(&sub).await? {
            Ok(headers) => headers,
            Err(why) => return self.abandon(&delivery, task, &why).await,
        };
        let retries_enabled = deployment.retries_on(tenant.as_ref());
        let gives_up_at = self.gives_up_at(&sub, &delivery, task, retries_enabled);
        let mut failures = health.consecutive_failures();
        let mut waited = false;
        let mut event = None;
        let (circuit, probe, event) = loop {
            let gate = self.gate(&sub, task, failures, gives_up_at).await?;
            // The breaker's work on a copy of the subscription this process kept (a probe, an
            // attempt it held: released, or to be held again): a DELETE or a disabling in
            // another process stops it now, not once the copy expires.
            let breakers_work = task.held_until.is_some() || matches!(gate, Gate::Attempt { probe: true, .. });
            if breakers_work {
                if let Some(why) = self.no_longer_active(&sub).await? {
                    self.forget_subscription(&sub.tenant_id, &sub.id);
                    return self.abandon(&delivery, task, why).await;
                }
            }
            match gate {
                Gate::Hold => return self.hold(&sub, &delivery, task, gives_up_at, None).await,
                Gate::ProbeAt { at, claim } => {
                    return self.hold(&sub, &delivery, task, gives_up_at, Some((at, claim))).await
                }
                Gate::Attempt { circuit, probe } => {
                    // Before the rate limiter: an attempt whose event is gone takes no slot.
                    // (It may be the breaker's probe: the breaker names another once
                    // `PROBE_GRACE` has passed, as for a probe whose subscription went.)
                    let read = match event.take() {
                        Some(read) => read,
                        None => match store.get_event(&delivery.tenant_id, &delivery.event_id).await? {
                            Some(read) => read,
                            None => return self.abandon(&delivery, task, "the event no longer exists").await,
                        },
                    };
                    if waited {
                        break (circuit, probe, read);
                    }
                    let before = self.now();
                    if let Some(slot) = self.wait_for_slot(&sub, &delivery, task).await? {
                        return Ok(DeliverOutcome::RateLimited { slot });
                    }
                    if self.now() == before || circuit.is_some() || probe {
                        break (circuit, probe, read);
                    }
                    // The breaker may have opened while this attempt waited for its turn
                    // (the ones before it failing): asked again, so an outage's first second
                    // costs the endpoint the threshold's failures, not a second of its rate.
                    (waited, failures, event) = (true, self.kept_failures(&sub.id), Some(read));
                }
            }
        };

        let started_at = self.now();
        let mut request = webhook_request(&sub, &secrets, &custom, &event, started_at);
        if let Some(deadline) = deadline {
            let left = (deadline - started_at)
                .to_std()
                .unwrap_or_default()
                .saturating_sub(self.config.deadline_margin);
            if left < super::SHORTEST_POST {
                return Err(PortError::retryable(
                    "deliver",
                    "too little of the invocation is left to make the attempt and record it",
                )
                .into());
            }
            request.timeout = request.timeout.min(left);
        }
        if let Some(queued_at) = task.queued_at.filter(|_| task.round == 0 && task.attempt == 1) {
            self.metrics.time(
                metrics::QUEUE_LAG,
                (started_at - queued_at).to_std().unwrap_or_default(),
            );
        }
        let outcome = self.ports.sender.send(request).await;
        let now = self.now();
        self.metrics.time(
            metrics::ATTEMPT_LATENCY,
            (now - started_at).to_std().unwrap_or_default(),
        );
        // A line per attempt: at INFO when it failed, at DEBUG when it delivered (the store
        // records every attempt, and a line each is most of what a delivery logs).
        if outcome.is_success() {
            tracing::debug!(event_id = %event.id, status = ?outcome.status_code, "attempt made");
        } else {
            tracing::info!(event_id = %event.id, status = ?outcome.status_code,
                error = ?outcome.error.as_ref().map(|e| e.0), "attempt failed");
        }

        // An attempt held till its schedule's end goes on with the rest of its schedule (its
        // `held_until`, past, keeps the breaker from holding it again): the breaker never
        // costs a delivery an attempt.
        let ctx = AttemptContext {
            attempt: task.attempt,
            previous_delay: delivery.last_delay_seconds,
            health: health.score(now),
            retries_enabled,
        };
        let decision = decide(&sub.retry_policy, &outcome, ctx, now, &mut *self.rng());
        let mut change = after_attempt(&delivery, task.attempt, started_at, &outcome, decision, now);
        change.next.held_until = task.held_until_after(started_at);
        // A retry that could not be queued: its error, returned last, brings the message back
        // once the attempt is recorded, and `resume_retry` queues the retry then.
        let queued = self.queue_retry_ahead(&mut change, decision).await;
        match self.record_attempt(&change, outcome.is_success()).await {
            Ok(()) => {}
            // A 2xx is final: recorded over what another copy of this message wrote.
            Err(PortError::ConditionFailed(_)) if outcome.is_success() => {
                match self.record_success_over(&change).await? {
                    Some(over) => change = over,
                    None => {
                        self.record_health(&sub, HealthSample { at: now, success: true }).await;
                        return self.lost_the_race(task).await;
                    }
                }
            }
            Err(PortError::ConditionFailed(_)) => return self.lost_the_race(task).await,
            Err(e) => return Err(e.into()),
        }
        self.record_health(
            &sub,
            HealthSample {
                at: now,
                success: outcome.is_success(),
            },
        )
        .await;
        self.count_stats(&sub.id, now, StatsCounts::attempt(&outcome)).await;
        // A 429 comes from an endpoint that is up and pacing its callers (its `Retry-After` is
        // honoured): to the breaker it is no failure, so it neither opens it nor fails a probe.
        let up = outcome.is_success() || outcome.status_code == Some(429);
        self.after_attempt_breaker(&sub, circuit, probe, up, task.held_until.is_some())
            .await?;
        let failed = !outcome.is_success() && outcome.status_code != Some(410);
        let gone = match outcome.status_code == Some(410) {
            true => self.disable_subscription(sub.clone(), GONE, false).await?,
            false => None,
        };
        let handed = self.hand_on(&change.next, decision).await?;
        // Told after the death is handed on (the owner's email never waits for it); an error
        // brings the message back, and `finish_stale` tells it again (stored once).
        if let Some(disabled) = gone {
            self.tell(&disabled.tenant_id, Operational::disabled_gone(&disabled, &change.next))
                .await?;
        }
        if failed {
            self.disable_if_failing(sub, health.last_success_at, tenant.as_ref(), now)
                .await?;
        }
        queued?;
        Ok(handed)
    }

    /// Store an attempt's change. A success's write that fails for now (throttled, a busy
    /// database) is tried again, backing off, for a third of the deadline's margin (the POST's
    /// timeout left the whole margin): a 2xx the endpoint gave is not lost to a throttled
    /// write and then attempted again, perhaps into a death. Only a crash between the POST
    /// and its write loses one, and the delivery then stays due: a later attempt decides.
    async fn record_attempt(&self, change: &DeliveryChange, success: bool) -> Result<(), PortError> {
        let budget = chrono::Duration::from_std(self.config.deadline_margin / 3).unwrap_or_default();
        let until = self.now() + budget;
        let mut backoff = chrono::Duration::milliseconds(50);
        let mut tried = false;
        loop {
            match self.ports.store.apply_change(change).await {
                Err(PortError::Retryable { what, source }) if success && self.now() + backoff < until => {
                    tracing::warn!(%what, error = %source, "the write of a delivered attempt failed; trying it again");
                    self.ports.clock.sleep_until(self.now() + backoff).await;
                    backoff = (backoff * 2).min(chrono::Duration::seconds(1));
                    tried = true;
                }
                // The first try landed, its answer lost: the delivery is what it wrote.
                Err(PortError::ConditionFailed(_)) if tried => {
                    let stored = self.ports.store.get_delivery(&change.next.id).await?;
                    return match stored.filter(|d| *d == change.next) {
                        Some(_) => Ok(()),
                        None => Err(PortError::ConditionFailed(
                            "moved on while its write was retried".into(),
                        )),
                    };
                }
                other => return other,
            }
        }
    }

    /// Why `sub`, read now from the store, takes no more attempts (deleted, or disabled), or
    /// `None` while it is active. Asked before a probe's POST and before an attempt the breaker
    /// held is made or held again: the copy this process keeps may be up to its time to live
    /// old.
    async fn no_longer_active(&self, sub: &Subscription) -> Result<Option<&'static str>> {
        let stored = self.ports.store.get_subscription(&sub.tenant_id, &sub.id).await?;
        Ok(match stored {
            None => Some("the subscription was deleted"),
            Some(s) if s.status != SubscriptionStatus::Active => Some("the subscription is disabled"),
            Some(_) => None,
        })
    }

    /// A 2xx whose write lost to another change of its delivery (another copy of its message,
    /// handled at the same time, recorded the attempt as failed, perhaps dead): recorded over
    /// it ([`state::success_over`]) on a fresh read, so a delivery the endpoint answered 2xx is
    /// never left retrying or dead. The change written, or `None` when there was nothing to
    /// override (delivered already, or replayed since).
    async fn record_success_over(&self, lost: &DeliveryChange) -> Result<Option<DeliveryChange>> {
        for _ in 0..3 {
            let Some(stored) = self.ports.store.get_delivery(&lost.next.id).await? else {
                return Ok(None);
            };
            let Some(over) = state::success_over(&stored, lost, self.now()) else {
                return Ok(None);
            };
            match self.record_attempt(&over, true).await {
                Ok(()) => {
                    tracing::warn!(
                        was = stored.status.as_str(),
                        attempts = stored.attempts,
                        "a 2xx whose write lost to another copy of its message; recorded as delivered over it"
                    );
                    return Ok(Some(over));
                }
                Err(PortError::ConditionFailed(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(PortError::retryable("record a delivered attempt", "its delivery kept changing").into())
    }

    /// Under the endpoint's rate limit ([`rate_limit`]): wait here for the attempt's turn to
    /// send, or send the message back to arrive shortly before its slot in the backlog, which
    /// is returned. A message back early (the queue delays in whole seconds) goes back again,
    /// its slot kept. A deferred delivery has its next attempt moved to its slot first, so
    /// neither the sweep nor the audit of queued messages queues it again while it waits.
    async fn wait_for_slot(
        &self,
        sub: &Subscription,
        delivery: &Delivery,
        task: &DeliveryTask,
    ) -> Result<Option<DateTime<Utc>>> {
        let Some(interval) = sub.slot_interval() else {
            return Ok(None);
        };
        let wait = chrono::Duration::from_std(rate_limit::SLOT_WAIT).unwrap_or_default();
        let arrival = match task.slot {
            Some(_) => Arrival::FromBacklog,
            None => Arrival::New,
        };
        let mut verdict = match task.slot {
            Some(slot) if slot - self.now() > wait => Verdict::Wait(slot),
            _ => {
                self.ports
                    .store
                    .limit_rate(&sub.id, interval, self.now(), arrival)
                    .await?
            }
        };
        // A turn answered more than the tolerance after it (a busy store: a contended write
        // tried again) is spent: sent now, it would land on the turns given after it, and a
        // second could hold more than the rate. It asks again, once, as it asked first (a new
        // attempt still goes behind any backlog), and keeps that answer: a store late on
        // every call still overshoots, less often, and costs the endpoint a turn for each.
        let tolerance = chrono::Duration::from_std(rate_limit::TOLERANCE).unwrap_or_default();
        if let Verdict::SendAt(turn) = verdict {
            if self.now() > turn + tolerance {
                tracing::debug!(
                    late_ms = (self.now() - turn).num_milliseconds(),
                    "a rate-limit turn answered after it had passed; asking for the next"
                );
                verdict = self
                    .ports
                    .store
                    .limit_rate(&sub.id, interval, self.now(), arrival)
                    .await?;
            }
        }
        let slot = match verdict {
            Verdict::SendAt(turn) => {
                self.ports.clock.sleep_until(turn).await;
                return Ok(None);
            }
            Verdict::Wait(slot) => slot,
        };
        self.next_attempt_not_before(delivery, slot).await?;
        let deferred = DeliveryTask {
            slot: Some(slot),
            ..task.clone()
        };
        self.schedule_attempt(deferred, slot - wait).await?;
        Ok(Some(slot))
    }

    /// An attempt that waits (for its slot, or held by the breaker) until `at`: its delivery's
    /// next attempt is moved there first if it is sooner, so neither the sweep nor the audit
    /// of first attempts queues it again meanwhile. A delivery that moved on keeps its move.
    pub(super) async fn next_attempt_not_before(&self, delivery: &Delivery, at: DateTime<Utc>) -> Result<()> {
        if delivery.status.is_final() || delivery.next_attempt_at.is_some_and(|next| next >= at) {
            return Ok(());
        }
        match self
            .ports
            .store
            .apply_change(&state::requeued(delivery, self.now(), at))
            .await
        {
            Ok(()) | Err(PortError::ConditionFailed(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Queue the retry an attempt decided on before the write that records the attempt
    /// (`change`), as a first attempt's message goes before its ingest's writes. Once the
    /// write lands, the retry is on its way: the delivery needs no entry for the sweep
    /// ([`Delivery::awaits_queued_retry`]), and no crash after the write can strand it. A
    /// crash before the write lands leaves the attempt's own message unacked: it comes back,
    /// and the attempt is made again. A retry's message that comes before the write is sent
    /// back for a while (`not_written_yet`). One that cannot be queued (the queue failed, or
    /// its answer was lost) leaves the retry to the sweep ([`state::leave_to_the_sweep`]), and
    /// its error is the caller's: the attempt is recorded all the same, not made again.
    pub(super) async fn queue_retry_ahead(
        &self,
        change: &mut DeliveryChange,
        decision: Decision,
    ) -> Result<(), PortError> {
        let Decision::Retry { at, .. } = decision else {
            return Ok(());
        };
        let task = state::queued_ahead_task(&change.next, self.now());
        let queued = self.schedule_attempt(task, at).await;
        if queued.is_err() {
            state::leave_to_the_sweep(&mut change.next);
        }
        queued
    }

    /// After the change is stored: hand a dead one on (a retry was queued before it:
    /// `queue_retry_ahead`).
    pub(super) async fn hand_on(&self, delivery: &Delivery, decision: Decision) -> Result<DeliverOutcome> {
        match decision {
            Decision::Delivered => Ok(DeliverOutcome::Delivered),
            Decision::Retry { at, .. } => Ok(DeliverOutcome::Retrying { at }),
            Decision::Dead => {
                self.count_stats(&delivery.subscription_id, self.now(), StatsCounts::dead())
                    .await;
                // Must not be lost: an error here redelivers the message, and
                // `finish_stale` sends it on again.
                self.ports.queue.dead_letter(&[dead_task(delivery)]).await?;
                Ok(DeliverOutcome::Dead)
            }
        }
    }

    /// On the queue with a delay if the queue can hold it that long, else in the scheduler table.
    pub(super) async fn schedule_attempt(&self, task: DeliveryTask, at: DateTime<Utc>) -> Result<(), PortError> {
        let delay = state::delay_until(self.now(), at);
        if delay <= u64::from(self.ports.queue.max_delay_seconds()) {
            self.ports.queue.enqueue(&[(task, delay as u32)]).await
        } else {
            self.ports.scheduler.schedule(&ScheduledTask { task, due: at }).await
        }
    }

    /// Queue the retry `d` waits on ([`state::retry_waits_on`]: its queueing failed), due at
    /// its time, then record it queued ([`state::retry_queued`]), so another copy of the
    /// message that queues it here, or the sweep, does not queue it again. That write is best
    /// effort: should it fail, a copy may queue a second message (stale once the first is
    /// handled, or two workers POSTing one attempt), where an error would bring this message
    /// back to queue one for certain.
    pub(super) async fn queue_waiting_retry(&self, d: &Delivery) -> Result<(), PortError> {
        let at = d.next_attempt_at.unwrap_or_else(|| self.now());
        self.schedule_attempt(state::next_task(d), at).await?;
        match self.ports.store.apply_change(&state::retry_queued(d, self.now())).await {
            Ok(()) | Err(PortError::ConditionFailed(_)) => {}
            Err(error) => {
                self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
                tracing::warn!(%error, delivery_id = %d.id, "could not record a retry queued again as queued");
            }
        }
        Ok(())
    }

    /// A message that came back after its attempt was recorded (its receiver died, or
    /// failed, after the state change): queue the retry that attempt decided on (in case its
    /// queueing failed: `queue_retry_ahead`), and if the attempt was the breaker's probe, move
    /// the breaker on its outcome, in case that is what did not happen. If it did, the second
    /// message is stale on arrival, and the breaker has moved on. Only for redelivered
    /// messages: a mere duplicate's twin did both.
    pub(super) async fn resume_retry(&self, task: &DeliveryTask) -> Result<()> {
        let Some(d) = self.ports.store.get_delivery(&task.delivery_id).await? else {
            return Ok(());
        };
        if d.round != task.round || d.attempts != task.attempt {
            return Ok(()); // not the message of the attempt recorded last
        }
        // Queued again only where its queueing failed: a message the queue took is not lost,
        // and a second copy of one attempt is two workers POSTing it at once.
        if state::retry_waits_on(&d, task) {
            self.queue_waiting_retry(&d).await?;
            tracing::info!(delivery_id = %d.id, attempt = task.attempt,
                "a message came back after its attempt was recorded; its retry is queued again");
        }
        if let Err(error) = self.probe_moved_on(&d).await {
            // The tick tends a breaker that holds attempts.
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(%error, delivery_id = %d.id, "could not move the circuit breaker on its probe's outcome");
        }
        Ok(())
    }

    /// A message whose work is recorded already. If it is the message that killed the
    /// delivery (by its attempt, or by giving up before one), what failed last time may be
    /// what came after the state change: the dead-letter hand-off, or after a 410 the
    /// subscription's disabling. Do those again; both are idempotent (the owner is still told
    /// only once).
    async fn finish_stale(&self, delivery: &Delivery, task: &DeliveryTask) -> Result<DeliverOutcome> {
        if task.held_until.is_some() {
            self.probe_moved_on(delivery).await?;
        }
        let killed_by_this = delivery.status == DeliveryStatus::Dead
            && delivery.round == task.round
            && (delivery.attempts == task.attempt || delivery.attempts + 1 == task.attempt);
        if killed_by_this {
            let mut disabled = None;
            if delivery.last_status_code == Some(410) && delivery.attempts == task.attempt {
                let sub = self
                    .ports
                    .store
                    .get_subscription(&delivery.tenant_id, &delivery.subscription_id)
                    .await?;
                // Still active and unchanged since: the disabling is what failed (an owner
                // who re-enabled it since has the last word). Disabled for it: its telling
                // may be what failed, and telling it again stores it once.
                disabled = match sub {
                    Some(s) if s.status == SubscriptionStatus::Active && s.updated_at <= delivery.updated_at => {
                        self.disable_subscription(s, GONE, false).await?
                    }
                    Some(s) if s.disabled_reason.as_deref() == Some(GONE) => Some(s),
                    _ => None,
                };
            }
            self.ports.queue.dead_letter(&[dead_task(delivery)]).await?;
            // Told after the hand-off, as on the 410 itself.
            if let Some(disabled) = disabled {
                self.tell(&disabled.tenant_id, Operational::disabled_gone(&disabled, delivery))
                    .await?;
            }
        }
        // Last: it may answer that another call is sending the email (an error that brings
        // this message back), which must not hold up the steps above.
        self.tell_of_disabling(delivery).await?;
        tracing::debug!(status = delivery.status.as_str(), "stale message");
        Ok(DeliverOutcome::Stale)
    }

    /// A message for the attempt its delivery waits for, come before that attempt's time (a
    /// copy sent again at once, an operator's redrive of the dead-letter queue): it goes back,
    /// unattempted, to arrive [`EARLY_COPY_LAG`] after that time. The message meant for then is
    /// on its way too, and is handled first: the copy, stale by then, costs a receive, and two
    /// workers never POST one attempt at once. Should that message have been lost, the copy
    /// makes the attempt, late by the lag. One early by [`EARLY_SKEW`] or less may be the
    /// message meant for then (another host's clock, a delay's rounding): it goes back to
    /// arrive that long after the time, late by seconds if it was, and after the attempt of
    /// the message meant for then if not.
    async fn too_early(&self, task: &DeliveryTask, at: DateTime<Utc>) -> Result<DeliverOutcome> {
        let back_at = match at - self.now() <= EARLY_SKEW {
            true => at + EARLY_SKEW,
            false => at + EARLY_COPY_LAG,
        };
        self.schedule_attempt(task.clone(), back_at).await?;
        tracing::debug!(%at, "a message came before its attempt's time; it goes back until then");
        Ok(DeliverOutcome::Early { at })
    }

    /// A message whose conditional write lost: another copy of it (queues deliver at least
    /// once) or another change came first. Stale now, it does what a stale message does, on
    /// a fresh read: the copy that won may have died, or failed, after its write and before
    /// what follows it (the dead-letter hand-off), and this copy's ack is the message's last.
    async fn lost_the_race(&self, task: &DeliveryTask) -> Result<DeliverOutcome> {
        match self.ports.store.get_delivery(&task.delivery_id).await? {
            Some(delivery) => self.finish_stale(&delivery, task).await,
            None => Ok(DeliverOutcome::Stale),
        }
    }

    /// The task's delivery, or none. A first attempt's message is queued a moment before its
    /// ingest stores the delivery, and a fast queue hands it over before that: while the
    /// message is younger than [`FRESH_LOOK`], the store is looked at again a few times here
    /// (about 10, 40, 130 and 400 ms after the first look: each wait three times the last, so
    /// a busy table that writes slowly is asked four more times, not six), so that race costs
    /// milliseconds,
    /// not the queue's shortest delay (a second: `not_stored_yet`).
    async fn get_delivery_of(&self, task: &DeliveryTask) -> Result<Option<Delivery>> {
        let first = task.queued_at.filter(|_| task.round == 0 && task.attempt == 1);
        let started = self.now();
        let mut wait = chrono::Duration::milliseconds(10);
        loop {
            if let Some(delivery) = self.ports.store.get_delivery(&task.delivery_id).await? {
                return Ok(Some(delivery));
            }
            // Bounded by its own start too: another host's clock may be ahead of this one's.
            let now = self.now();
            let older = |since: DateTime<Utc>| now + wait - since >= FRESH_LOOK;
            if first.is_none_or(older) || older(started) {
                return Ok(None);
            }
            self.ports.clock.sleep_until(now + wait).await;
            wait = wait * 3;
        }
    }

    /// A message whose delivery is not stored. A first attempt's is queued a moment before
    /// its delivery is stored, and a slow ingest (a batch, a throttled table) may take
    /// seconds, so one younger than [`WRITE_WINDOW`] is queued again (`look_again_later`).
    /// After the window it is an error: the queue sends the message again after its
    /// visibility timeout, and after `maxReceiveCount` receives hands it to the dead-letter
    /// handler, which drops it if its delivery was never stored (the ingest failed, and its
    /// client had the error) or puts it back on its schedule if it was. An ingest that failed
    /// costs six copies at most. Any other message without a delivery is for one that is gone.
    async fn not_stored_yet(&self, task: &DeliveryTask) -> Result<DeliverOutcome> {
        let Some(queued_at) = task.queued_at.filter(|_| task.round == 0 && task.attempt == 1) else {
            tracing::warn!("queued delivery does not exist; dropping the message");
            return Ok(DeliverOutcome::Stale);
        };
        self.look_again_later(task, queued_at, "delivery not stored yet", "the ingest's write")
            .await
    }

    /// A retry's message come before the write that records the attempt before it (the
    /// retry is queued first: `queue_retry_ahead`). One younger than [`WRITE_WINDOW`] is
    /// queued again (`look_again_later`). After the window it is an error, as a first
    /// attempt's is: the queue sends it again after its visibility timeout, and after
    /// `maxReceiveCount` receives hands it to the dead-letter handler, which puts it back on
    /// its schedule if the write has landed by then, or drops it if not (that attempt's own
    /// message, never acked, makes the attempt again and queues its retry anew). A message
    /// ahead of its delivery without a `queued_at` (an older build's) is dropped.
    async fn not_written_yet(&self, task: &DeliveryTask) -> Result<DeliverOutcome> {
        let Some(queued_at) = task.queued_at else {
            tracing::info!("a message for a later attempt than its delivery's next; dropping it");
            return Ok(DeliverOutcome::Stale);
        };
        self.look_again_later(
            task,
            queued_at,
            "the attempt before this retry is not recorded yet",
            "that attempt's write",
        )
        .await
    }

    /// A message queued before the state it is for was written (`what`, by `write`), and come
    /// before it: while younger than [`WRITE_WINDOW`] it is queued again, its delay as long as
    /// its age so far (at least a second): the copies look at about 1, 2, 4, 8, 16 and 32 s,
    /// each carrying the first `queued_at`. Once it is older, a retryable error.
    async fn look_again_later(
        &self,
        task: &DeliveryTask,
        queued_at: DateTime<Utc>,
        what: &str,
        write: &str,
    ) -> Result<DeliverOutcome> {
        let age = self.now() - queued_at;
        if age >= WRITE_WINDOW {
            let why = format!("{what} (its message was queued at {queued_at}, before {write})");
            return Err(PortError::retryable("deliver", why).into());
        }
        let delay = age.num_seconds().max(1) as u32;
        self.ports.queue.enqueue(&[(task.clone(), delay)]).await?;
        tracing::debug!(%queued_at, delay, "the state this message is for is not written yet; looking again");
        Ok(DeliverOutcome::NotStoredYet)
    }

    /// Dead without an attempt.
    pub(super) async fn abandon(
        &self,
        delivery: &Delivery,
        task: &DeliveryTask,
        reason: &str,
    ) -> Result<DeliverOutcome> {
        let Some(change) = give_up(delivery, reason, self.now()) else {
            return Ok(DeliverOutcome::Stale);
        };
        match self.ports.store.apply_change(&change).await {
            Ok(()) => {}
            Err(PortError::ConditionFailed(_)) => return self.lost_the_race(task).await,
            Err(e) => return Err(e.into()),
        }
        tracing::info!(reason, attempt = task.attempt, "delivery abandoned");
        self.hand_on(&change.next, Decision::Dead).await
    }

    /// Disable the subscription, with `reason`: a conditional write of the copy just read,
    /// tried again on a fresh copy if another change came first. A deleted one stays deleted.
    /// The copy written, when this call disabled it (not someone before it).
    /// `notice_pending`: its owner is to be told (`disable_notice_pending`).
    async fn disable_subscription(
        &self,
        mut sub: Subscription,
        reason: &str,
        notice_pending: bool,
    ) -> Result<Option<Subscription>> {
        for _ in 0..3 {
            let read_at = sub.updated_at;
            sub.status = SubscriptionStatus::Disabled;
            sub.disabled_reason = Some(reason.into());
            sub.disable_notice_pending = notice_pending;
            // The call that disables it sends the email: taken on in the same write.
            sub.disable_notice_claimed_at = notice_pending.then(|| self.now());
            sub.updated_at = super::subscriptions::next_version(read_at, self.now());
            let result = self.replace_subscription(&mut sub, read_at).await;
            self.forget_subscription(&sub.tenant_id, &sub.id);
            match result {
                Ok(()) => {
                    self.tend_after_change(&sub.tenant_id, &sub.id).await;
                    return Ok(Some(sub));
                }
                Err(PortError::ConditionFailed(_)) => {}
                Err(e) => return Err(e.into()),
            }
            match self.ports.store.get_subscription(&sub.tenant_id, &sub.id).await? {
                Some(fresh) if fresh.status == SubscriptionStatus::Active => sub = fresh,
                // This very write, made by a retry of a call whose answer was lost.
                Some(fresh) if fresh.updated_at == sub.updated_at => {
                    self.tend_after_change(&fresh.tenant_id, &fresh.id).await;
                    return Ok(Some(fresh));
                }
                _ => return Ok(None), // deleted, or disabled by someone else
            }
        }
        Err(PortError::retryable("disable the subscription", "it kept changing under its disabling").into())
    }

    /// Auto-disable: after a failed attempt, a subscription whose endpoint has had no success
    /// for its `auto_disable_after_hours` (since it became active) is disabled as
    /// [`DISABLED_FAILING`], and its owner told once. The endpoint's stored health is read
    /// first, so a success another process had since this one last looked keeps it. The
    /// disabling marks the email pending; an error before it is sent redelivers the message,
    /// whose coming back sends it (`tell_of_disabling`).
    async fn disable_if_failing(
        &self,
        sub: Subscription,
        last_success: Option<DateTime<Utc>>,
        tenant: Option<&Tenant>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let Some(hours) = sub.auto_disable_after_hours else {
            return Ok(());
        };
        let after = chrono::Duration::hours(hours.into());
        if now - sub.failing_since(last_success) < after {
            return Ok(());
        }
        let stored = self.stored_health(&sub.id).await?;
        let since = sub.failing_since(stored.last_success_at);
        if now - since < after {
            return Ok(());
        }
        let Some(disabled) = self.disable_subscription(sub, DISABLED_FAILING, true).await? else {
            return Ok(());
        };
        tracing::warn!(subscription_id = %disabled.id, %since, "subscription disabled: its endpoint has not succeeded since");
        self.send_disable_notice(disabled, tenant, since).await
    }

    /// A message that found its attempt recorded: if its subscription was disabled for failing
    /// and its owner not told (the call that disabled it failed before the email), tell them.
    /// The copy this process keeps only says whether to look: the email is taken on, on the
    /// stored copy, so that of two calls that find it pending one sends it.
    async fn tell_of_disabling(&self, delivery: &Delivery) -> Result<()> {
        let pending = |s: &Subscription| s.disable_notice_pending && s.status == SubscriptionStatus::Disabled;
        let (tenant_id, id) = (&delivery.tenant_id, &delivery.subscription_id);
        if !self
            .kept_subscription(tenant_id, id)
            .await?
            .as_ref()
            .is_some_and(pending)
        {
            return Ok(());
        }
        let mut taken_on = None;
        for _ in 0..3 {
            let Some(mut sub) = self.ports.store.get_subscription(tenant_id, id).await?.filter(pending) else {
                self.forget_subscription(tenant_id, id);
                return Ok(());
            };
            let claimed = sub.disable_notice_claimed_at;
            // Taken on by this call: its write landed, though its answer was lost.
            if claimed.is_none() || claimed != taken_on {
                if let Some(at) = claimed.filter(|at| self.now() - *at < DISABLE_NOTICE_CLAIM) {
                    // Another call is sending it. Should that call die, this message, back
                    // later, sends it.
                    return Err(PortError::retryable(
                        "tell of the disabling",
                        format!("the email is being sent by another call (since {at})"),
                    )
                    .into());
                }
                let read_at = sub.updated_at;
                taken_on = Some(self.now());
                sub.disable_notice_claimed_at = taken_on;
                sub.updated_at = super::subscriptions::next_version(read_at, self.now());
                let taken = self.replace_subscription(&mut sub, read_at).await;
                self.forget_subscription(tenant_id, id);
                match taken {
                    Ok(()) => {}
                    // Changed since (taken on by another call, re-enabled, edited): look again.
                    Err(PortError::ConditionFailed(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            let tenant = self.kept_tenant(&sub.tenant_id).await?;
            let since = sub.failing_since(self.stored_health(&sub.id).await?.last_success_at);
            return self.send_disable_notice(sub, tenant.as_ref(), since).await;
        }
        Err(PortError::retryable("tell of the disabling", "the subscription kept changing").into())
    }

    /// Email the owner of a subscription disabled for failing (its endpoint failing `since`),
    /// the email taken on by this call, then mark it told. An error leaves it pending, taken
    /// on until [`DISABLE_NOTICE_CLAIM`] has passed.
    async fn send_disable_notice(
        &self,
        sub: Subscription,
        tenant: Option<&Tenant>,
        since: DateTime<Utc>,
    ) -> Result<()> {
        let hours = sub.auto_disable_after_hours.unwrap_or(DEFAULT_AUTO_DISABLE_HOURS);
        if let Some(to) = sub
            .owner_email
            .clone()
            .or_else(|| tenant.map(|t| t.owner_email.clone()))
        {
            self.send_email(&self.disabled_email(&sub, to, since, hours)).await?;
        }
        let (told, tenant_id) = (Operational::disabled_failing(&sub, since, hours), sub.tenant_id.clone());
        let marked = self.mark_disable_notice_sent(sub).await;
        // Then the operational webhook, best effort: the email never waits for it, and once
        // the email is sent and marked, nothing would tell it again.
        self.tell_best_effort(&tenant_id, told).await;
        marked
    }

    /// The disabled subscription's email is sent: no longer pending, nor taken on.
    async fn mark_disable_notice_sent(&self, mut sub: Subscription) -> Result<()> {
        let taken_on = sub.disable_notice_claimed_at;
        for _ in 0..3 {
            let read_at = sub.updated_at;
            sub.disable_notice_pending = false;
            sub.disable_notice_claimed_at = None;
            sub.updated_at = super::subscriptions::next_version(read_at, self.now());
            let result = self.replace_subscription(&mut sub, read_at).await;
            self.forget_subscription(&sub.tenant_id, &sub.id);
            match result {
                Ok(()) => return Ok(()),
                Err(PortError::ConditionFailed(_)) => {}
                Err(e) => return Err(e.into()),
            }
            // Changed since: still pending under this call's claim (an edit, or this very
            // write landed with its answer lost), mark it told on the fresh copy; otherwise
            // (re-enabled, say) that change stands.
            match self.ports.store.get_subscription(&sub.tenant_id, &sub.id).await? {
                Some(fresh) if fresh.disable_notice_pending && fresh.disable_notice_claimed_at == taken_on => {
                    sub = fresh
                }
                _ => return Ok(()),
            }
        }
        Err(PortError::retryable("mark the disable email sent", "the subscription kept changing").into())
    }
}

fn dead_task(delivery: &Delivery) -> DeliveryTask {
    DeliveryTask {
        delivery_id: delivery.id.clone(),
        round: delivery.round,
        attempt: delivery.attempts,
        queued_at: None,
        slot: None,
        tenant_id: Some(delivery.tenant_id.clone()),
        held_until: None,
        redrives: 0,
    }
}
