//! The delivery state machine. An attempt's outcome, the policy, the endpoint's health and
//! `now` decide `Delivered`, `Retry { at }` or `Dead`; each move is a conditional
//! [`DeliveryChange`] that expects the state it started from, so a stale or duplicate
//! message cannot move a delivery backwards or record an attempt twice.
//!
//! ```text
//! pending ──attempt──▶ delivered
//!    │                    ▲
//!    └─fail─▶ retrying ───┘   (attempts left)
//!                │ fail, none left / 410 / retries off
//!                ▼
//!              dead ──replay──▶ pending (next round, attempt #1)
//! ```

use chrono::{DateTime, Duration, Utc};
use rand::Rng;

use crate::model::{Attempt, Delivery, DeliveryStatus};
use crate::policy::{RetryContext, RetryPolicy, Seconds};
use crate::ports::{DeliveryChange, DeliveryTask, Expected, SendOutcome};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    Delivered,
    Retry { at: DateTime<Utc>, delay: Seconds },
    Dead,
}

/// What is known about the attempt just made, besides its outcome.
#[derive(Debug, Clone, Copy)]
pub struct AttemptContext {
    /// The attempt's number, from 1.
    pub attempt: u32,
    pub previous_delay: Option<Seconds>,
    pub health: Option<f64>,
    pub retries_enabled: bool,
}

/// Decide what follows an attempt.
pub fn decide(
    policy: &RetryPolicy,
    outcome: &SendOutcome,
    ctx: AttemptContext,
    now: DateTime<Utc>,
    rng: &mut impl Rng,
) -> Decision {
    if outcome.is_success() {
        return Decision::Delivered;
    }
    if outcome.status_code == Some(410) {
        // Gone: the endpoint asked never to be called again.
        return Decision::Dead;
    }
    let retry_after = outcome
        .retry_after
        .filter(|_| matches!(outcome.status_code, Some(429 | 503)));
    let retry = RetryContext {
        failures: ctx.attempt,
        previous_delay: ctx.previous_delay,
        health: ctx.health,
        retry_after,
    };
    match policy.next_delay(retry, ctx.retries_enabled, rng) {
        Some(delay) => Decision::Retry {
            at: now + seconds(delay),
            delay,
        },
        None => Decision::Dead,
    }
}

pub fn seconds(s: Seconds) -> Duration {
    Duration::milliseconds((s * 1000.0).round() as i64)
}

/// The delay, in the queue's whole seconds, that makes a message queued at `now` visible at
/// `at` and never before it: rounded up (0 when `at` has come).
pub fn delay_until(now: DateTime<Utc>, at: DateTime<Utc>) -> u64 {
    (at - now)
        .to_std()
        .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// Whether `task` is the attempt the delivery is waiting for.
pub fn is_due_attempt(delivery: &Delivery, task: &DeliveryTask) -> bool {
    matches!(delivery.status, DeliveryStatus::Pending | DeliveryStatus::Retrying)
        && delivery.round == task.round
        && delivery.attempts + 1 == task.attempt
}

/// A retry whose message could not be queued before its attempt's write: its next attempt
/// a moment past its time (`not_before` stays where the schedule put it), which leaves it to
/// the sweep (`Delivery::is_swept`), as a moved attempt is.
pub fn leave_to_the_sweep(next: &mut Delivery) {
    next.next_attempt_at = next.next_attempt_at.map(|at| at + Duration::milliseconds(1));
}

/// Whether `delivery`'s retry is the one [`leave_to_the_sweep`] left: its message was not
/// queued.
pub fn is_left_to_the_sweep(delivery: &Delivery) -> bool {
    delivery.status == DeliveryStatus::Retrying
        && delivery.next_attempt_at.is_some()
        && delivery.next_attempt_at == delivery.not_before.map(|at| at + Duration::milliseconds(1))
}

/// Whether `task` is the message of the attempt `delivery` recorded last, and that attempt's
/// retry is the one [`leave_to_the_sweep`] left: the message, come back (or given up on by
/// the queue), queues the retry then, not the sweep minutes later.
pub fn retry_waits_on(delivery: &Delivery, task: &DeliveryTask) -> bool {
    delivery.round == task.round && delivery.attempts == task.attempt && is_left_to_the_sweep(delivery)
}

/// The change that records a retry [`leave_to_the_sweep`] left as queued at last (by its
/// attempt's message, come back or given up on): its next attempt back at its time, as a
/// retry queued before its attempt's write has it, so no later copy of that message, nor
/// the sweep, queues it again.
pub fn retry_queued(delivery: &Delivery, now: DateTime<Utc>) -> DeliveryChange {
    let at = delivery.not_before.or(delivery.next_attempt_at).unwrap_or(now);
    requeued(delivery, now, at)
}

/// A message for a later attempt than the one its delivery waits for, in the same round: a
/// retry's, queued before the write that records the attempt before it, come before that
/// write landed (or that write failed, and that attempt is to be made again).
pub fn is_ahead_of_delivery(delivery: &Delivery, task: &DeliveryTask) -> bool {
    matches!(delivery.status, DeliveryStatus::Pending | DeliveryStatus::Retrying)
        && delivery.round == task.round
        && delivery.attempts + 1 < task.attempt
}

/// The change that records `outcome` as attempt `attempt` and applies `decision`.
pub fn after_attempt(
    delivery: &Delivery,
    attempt: u32,
    started_at: DateTime<Utc>,
    outcome: &SendOutcome,
    decision: Decision,
    now: DateTime<Utc>,
) -> DeliveryChange {
    let (status, next_attempt_at, last_delay) = match decision {
        Decision::Delivered => (DeliveryStatus::Delivered, None, delivery.last_delay_seconds),
        Decision::Retry { at, delay } => (DeliveryStatus::Retrying, Some(at), Some(delay)),
        Decision::Dead => (DeliveryStatus::Dead, None, delivery.last_delay_seconds),
    };
    let failed = !outcome.is_success();
    let next = Delivery {
        status,
        attempts: attempt,
        next_attempt_at,
        not_before: next_attempt_at,
        last_delay_seconds: last_delay,
        last_status_code: outcome.status_code,
        last_error: failed.then(|| outcome.describe()),
        updated_at: now,
        ..delivery.clone()
    };
    let record = Attempt {
        delivery_id: delivery.id.clone(),
        round: delivery.round,
        attempt,
        started_at,
        duration_ms: outcome.duration_ms,
        status_code: outcome.status_code,
        error: outcome.error.as_ref().map(|_| outcome.describe()),
        response_excerpt: outcome.response_excerpt.clone(),
        next_attempt_at,
    };
    DeliveryChange {
        expected: Expected::of(delivery),
        next,
        attempt: Some(record),
    }
}

/// A 2xx whose write lost to another change of its delivery in the same round: another copy
/// of its message recorded the same attempt as failed (retrying, or dead), or a later attempt
/// came first. A 2xx is final, so the delivery is delivered all the same, over whatever was
/// recorded. The success is logged as the round's next attempt: the log holds each POST once,
/// in the order recorded (an attempt's number is its key in every store). `None` when there is
/// nothing to override: delivered already, or replayed since (a new round).
pub fn success_over(stored: &Delivery, lost: &DeliveryChange, now: DateTime<Utc>) -> Option<DeliveryChange> {
    let success = lost.attempt.as_ref()?;
    if stored.round != success.round || stored.status == DeliveryStatus::Delivered {
        return None;
    }
    let attempt = stored.attempts + 1;
    let next = Delivery {
        status: DeliveryStatus::Delivered,
        attempts: attempt,
        next_attempt_at: None,
        not_before: None,
        last_status_code: success.status_code,
        last_error: None,
        updated_at: now,
        ..stored.clone()
    };
    Some(DeliveryChange {
        expected: Expected::of(stored),
        next,
        attempt: Some(Attempt {
            attempt,
            next_attempt_at: None,
            ..success.clone()
        }),
    })
}

/// Dead without another attempt: the subscription is gone or disabled, or the event is gone.
/// (A message the queue gave up on is no such verdict: see `Services::handle_dead_letters`.)
pub fn give_up(delivery: &Delivery, reason: &str, now: DateTime<Utc>) -> Option<DeliveryChange> {
    if delivery.status.is_final() {
        return None;
    }
    let next = Delivery {
        status: DeliveryStatus::Dead,
        next_attempt_at: None,
        not_before: None,
        last_error: Some(reason.to_owned()),
        updated_at: now,
        ..delivery.clone()
    };
    Some(DeliveryChange {
        expected: Expected::of(delivery),
        next,
        attempt: None,
    })
}

/// Replay: a dead delivery starts a new round with a fresh attempt #1, due now.
pub fn replay(delivery: &Delivery, now: DateTime<Utc>) -> Option<DeliveryChange> {
    if delivery.status != DeliveryStatus::Dead {
        return None;
    }
    let next = Delivery {
        status: DeliveryStatus::Pending,
        round: delivery.round + 1,
        attempts: 0,
        next_attempt_at: Some(now),
        not_before: None,
        last_delay_seconds: None,
        held_until: None,
        updated_at: now,
        ..delivery.clone()
    };
    Some(DeliveryChange {
        expected: Expected::of(delivery),
        next,
        attempt: None,
    })
}

/// The sweep re-queued an overdue delivery. Its next attempt is that message, due by
/// `handled_by` at the latest, when the sweep may look at it again.
pub fn requeued(delivery: &Delivery, now: DateTime<Utc>, handled_by: DateTime<Utc>) -> DeliveryChange {
    let next = Delivery {
        next_attempt_at: Some(handled_by),
        updated_at: now,
        ..delivery.clone()
    };
    DeliveryChange {
        expected: Expected::of(delivery),
        next,
        attempt: None,
    }
}

/// The message for a delivery's next attempt, queued at `queued_at`, before the state it
/// is for is written: a new delivery's first attempt (before its ingest stores it), or a
/// retry (before the write that records the attempt that decided it).
pub fn queued_ahead_task(delivery: &Delivery, queued_at: DateTime<Utc>) -> DeliveryTask {
    DeliveryTask {
        queued_at: Some(queued_at),
        ..next_task(delivery)
    }
}

/// The queue message for the attempt a delivery waits for.
pub fn next_task(delivery: &Delivery) -> DeliveryTask {
    DeliveryTask {
        delivery_id: delivery.id.clone(),
        round: delivery.round,
        attempt: delivery.attempts + 1,
        queued_at: None,
        slot: None,
        tenant_id: Some(delivery.tenant_id.clone()),
        held_until: delivery.held_until,
        redrives: 0,
    }
}
