//! Properties of the delivery state machine, over random runs of outcomes, duplicate and
//! stale messages, and replays.

use chrono::{DateTime, Duration, Utc};
use hookwise_core::model::*;
use hookwise_core::policy::{Jitter, RetryPolicy};
use hookwise_core::ports::{DeliveryChange, DeliveryTask, SendOutcome};
use hookwise_core::state::*;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn delivery(now: DateTime<Utc>) -> Delivery {
    let mut rng = StdRng::seed_from_u64(9);
    let event = Event {
        id: EventId::generate(now, &mut rng),
        tenant_id: TenantId::generate(now, &mut rng),
        event_type: EventType::parse("invoice.paid").unwrap(),
        payload: serde_json::json!({}),
        created_at: now,
        idempotency_key: None,
        test: false,
    };
    Delivery::new(
        DeliveryId::generate(now, &mut rng),
        &event,
        SubscriptionId::generate(now, &mut rng),
    )
}

fn outcome(status: u16) -> SendOutcome {
    SendOutcome {
        status_code: Some(status),
        error: None,
        response_excerpt: None,
        duration_ms: 1,
        retry_after: None,
    }
}

/// What the store does: apply the change only if the delivery is as expected.
fn apply(current: &mut Delivery, change: &DeliveryChange, recorded: &mut Vec<(u32, u32)>) -> bool {
    if !change.expected.holds_for(current) {
        return false;
    }
    if let Some(a) = &change.attempt {
        if recorded.contains(&(a.round, a.attempt)) {
            return false;
        }
        recorded.push((a.round, a.attempt));
    }
    *current = change.next.clone();
    true
}

#[derive(Debug, Clone)]
enum Step {
    /// Handle the message the delivery waits for, with this HTTP status.
    Attempt(u16),
    /// A message for an attempt that is not the one awaited (duplicate or late).
    StaleMessage {
        back: u32,
        status: u16,
    },
    Replay,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop_oneof![Just(200u16), Just(500), Just(503), Just(404), Just(429)].prop_map(Step::Attempt),
        1 => (0u32..3, prop_oneof![Just(200u16), Just(500)]).prop_map(|(back, status)| Step::StaleMessage { back, status }),
        1 => Just(Step::Replay),
    ]
}

proptest! {
    #[test]
    fn attempts_only_grow_finals_hold_and_death_means_exhaustion(
        schedule in proptest::collection::vec(0u64..100, 0..6),
        retries_enabled in any::<bool>(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let policy = RetryPolicy::custom(schedule, Jitter::Full, false).unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        let mut now: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        let mut d = delivery(now);
        let mut recorded = Vec::new();

        for s in steps {
            now += Duration::seconds(1);
            let before = d.clone();
            match s {
                Step::Attempt(status) | Step::StaleMessage { status, .. } => {
                    let task = match s {
                        Step::StaleMessage { back, .. } => DeliveryTask { delivery_id: d.id.clone(), round: d.round, attempt: d.attempts.saturating_sub(back), queued_at: None, slot: None, tenant_id: None, held_until: None, redrives: 0 },
                        _ => next_task(&d),
                    };
                    if !is_due_attempt(&d, &task) {
                        // The worker skips it; even if it did not, the condition refuses it.
                        let o = outcome(status);
                        let ctx = AttemptContext { attempt: task.attempt, previous_delay: None, health: None, retries_enabled };
                        let change = after_attempt(&d, task.attempt, now, &o, decide(&policy, &o, ctx, now, &mut rng), now);
                        let stale = DeliveryChange { expected: hookwise_core::ports::Expected { attempts: task.attempt.saturating_sub(1), ..change.expected }, ..change };
                        if stale.expected != hookwise_core::ports::Expected::of(&d) {
                            prop_assert!(!apply(&mut d, &stale, &mut recorded));
                        }
                        prop_assert_eq!(&d, &before);
                        continue;
                    }
                    let o = outcome(status);
                    let ctx = AttemptContext { attempt: task.attempt, previous_delay: d.last_delay_seconds, health: None, retries_enabled };
                    let decision = decide(&policy, &o, ctx, now, &mut rng);
                    let change = after_attempt(&d, task.attempt, now, &o, decision, now);
                    prop_assert!(apply(&mut d, &change, &mut recorded));
                    // Applying the same change again (a duplicate) is refused.
                    prop_assert!(!apply(&mut d, &change, &mut recorded));

                    prop_assert_eq!(d.attempts, before.attempts + 1, "attempt numbers only grow, one at a time");
                    let exhausted = !retries_enabled || d.attempts >= policy.max_attempts();
                    match d.status {
                        DeliveryStatus::Delivered => prop_assert!((200..300).contains(&status)),
                        DeliveryStatus::Dead => prop_assert!(exhausted, "dead only when attempts are exhausted"),
                        DeliveryStatus::Retrying => {
                            prop_assert!(!exhausted);
                            prop_assert!(d.next_attempt_at.unwrap() > now - Duration::seconds(1));
                        }
                        DeliveryStatus::Pending => prop_assert!(false, "an attempt never leaves a delivery pending"),
                    }
                    if !(200..300).contains(&status) && !exhausted && status != 410 {
                        prop_assert_eq!(d.status, DeliveryStatus::Retrying, "failures with attempts left retry");
                    }
                }
                Step::Replay => match replay(&d, now) {
                    Some(change) => {
                        prop_assert_eq!(before.status, DeliveryStatus::Dead, "only dead deliveries replay");
                        prop_assert!(apply(&mut d, &change, &mut recorded));
                        prop_assert_eq!((d.status, d.round, d.attempts), (DeliveryStatus::Pending, before.round + 1, 0));
                        prop_assert_eq!(next_task(&d).attempt, 1, "a replay makes a fresh attempt #1");
                    }
                    None => prop_assert_ne!(before.status, DeliveryStatus::Dead),
                },
            }
            if before.status.is_final() && !matches!(s, Step::Replay) {
                prop_assert_eq!(&d, &before, "delivered and dead change only through replay");
            }
        }
    }
}

#[test]
fn a_410_is_dead_at_once_and_a_2xx_is_delivered() {
    let now = Utc::now();
    let policy = RetryPolicy::standard();
    let mut rng = StdRng::seed_from_u64(1);
    let ctx = AttemptContext {
        attempt: 1,
        previous_delay: None,
        health: None,
        retries_enabled: true,
    };
    assert_eq!(decide(&policy, &outcome(410), ctx, now, &mut rng), Decision::Dead);
    assert_eq!(decide(&policy, &outcome(204), ctx, now, &mut rng), Decision::Delivered);
    match decide(&policy, &outcome(500), ctx, now, &mut rng) {
        Decision::Retry { at, delay } => {
            assert!((60.0..=66.0).contains(&delay));
            assert_eq!(at, now + seconds(delay));
        }
        other => panic!("expected a retry, got {other:?}"),
    }
}

#[test]
fn retry_after_counts_only_with_429_or_503() {
    let now = Utc::now();
    let policy = RetryPolicy::custom(vec![10, 100], Jitter::None, false).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let ctx = AttemptContext {
        attempt: 1,
        previous_delay: None,
        health: None,
        retries_enabled: true,
    };
    let with = |status| SendOutcome {
        retry_after: Some(50.0),
        ..outcome(status)
    };
    assert!(matches!(decide(&policy, &with(429), ctx, now, &mut rng), Decision::Retry { delay, .. } if delay == 50.0));
    assert!(matches!(decide(&policy, &with(500), ctx, now, &mut rng), Decision::Retry { delay, .. } if delay == 10.0));
}
