//! The circuit breaker per endpoint: after `failure_threshold` consecutive failed attempts it
//! opens, and the endpoint's attempts are held (not made, not counted) but for one probe per
//! `probe_interval_seconds`; a success closes it, and what it held is released at the
//! endpoint's rate limit, or else at a ramp ([`ramp_offset`]).
//!
//! ```text
//! closed ──threshold failures──▶ open ──probe time──▶ half_open ──success──▶ closed
//!                                  ▲                      │
//!                                  └──────probe fails─────┘
//! ```
//!
//! The rules are here; `Services` stores the state (`Store::circuit`) and parks what is held
//! (`SchedulerTable::hold`).

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::model::DeliveryId;

/// A subscription's breaker settings: on by default (threshold 5, a probe each 30 s), each
/// field defaulting so when others are given; `enabled: false` turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CircuitBreaker {
    #[serde(default = "on")]
    pub enabled: bool,
    #[serde(default = "default_threshold")]
    pub failure_threshold: u32,
    #[serde(default = "default_probe_interval")]
    pub probe_interval_seconds: u32,
}

pub const DEFAULT_FAILURE_THRESHOLD: u32 = 5;
pub const DEFAULT_PROBE_INTERVAL_SECONDS: u32 = 30;
/// The most consecutive failures a threshold may ask for: the endpoint's health window.
pub const MAX_FAILURE_THRESHOLD: u32 = crate::health::HEALTH_WINDOW as u32;
/// The longest probe interval: an hour.
pub const MAX_PROBE_INTERVAL_SECONDS: u32 = 3_600;

fn on() -> bool {
    true
}
fn default_threshold() -> u32 {
    DEFAULT_FAILURE_THRESHOLD
}
fn default_probe_interval() -> u32 {
    DEFAULT_PROBE_INTERVAL_SECONDS
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::on()
    }
}

impl CircuitBreaker {
    /// On, with the default threshold and probe interval.
    pub fn on() -> Self {
        Self {
            enabled: true,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            probe_interval_seconds: DEFAULT_PROBE_INTERVAL_SECONDS,
        }
    }

    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::on()
        }
    }

    pub fn probe_interval(&self) -> Duration {
        Duration::seconds(self.probe_interval_seconds.into())
    }

    /// Why the settings are out of range, if they are.
    pub fn problem(&self) -> Option<String> {
        if !(1..=MAX_FAILURE_THRESHOLD).contains(&self.failure_threshold) {
            return Some(format!(
                "circuit_breaker.failure_threshold must be 1 to {MAX_FAILURE_THRESHOLD}"
            ));
        }
        if !(1..=MAX_PROBE_INTERVAL_SECONDS).contains(&self.probe_interval_seconds) {
            return Some(format!(
                "circuit_breaker.probe_interval_seconds must be 1 to {MAX_PROBE_INTERVAL_SECONDS}"
            ));
        }
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

impl CircuitState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// An endpoint's breaker as stored; none stored is closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Circuit {
    pub state: CircuitState,
    /// Since when it has been in this state (open and half open: since it opened).
    pub since: DateTime<Utc>,
    /// Open: when a delivery may next be tried as the probe. Half open: when the probe in
    /// flight counts as lost, and another may be tried. Closed and releasing: when the next
    /// page of what it held is released.
    pub next_probe_at: Option<DateTime<Utc>>,
    /// Open: the delivery queued to arrive at `next_probe_at` and be the probe (so that one
    /// comes, though every other is parked). Half open: the probe in flight (its own message
    /// coming back is still it).
    pub probe: Option<DeliveryId>,
    /// Which attempt of `probe` it is, as `(round, attempt)`: the probe's outcome is only
    /// that attempt's (absent from a breaker stored before it was kept).
    #[serde(default)]
    pub probe_attempt: Option<(u32, u32)>,
    /// Closed after holding: how many held deliveries have been released so far, whether all
    /// are (`releasing` false), and so where the next one goes on the ramp.
    #[serde(default)]
    pub released: u64,
    #[serde(default)]
    pub releasing: bool,
    /// Every write moves it on; a write expects the version it read.
    pub version: u64,
}

impl Circuit {
    pub fn closed(now: DateTime<Utc>) -> Self {
        Self {
            state: CircuitState::Closed,
            since: now,
            next_probe_at: None,
            probe: None,
            probe_attempt: None,
            released: 0,
            releasing: false,
            version: 0,
        }
    }

    fn next(&self, state: CircuitState, since: DateTime<Utc>) -> Self {
        Self {
            state,
            since,
            next_probe_at: None,
            probe: None,
            probe_attempt: None,
            released: 0,
            releasing: false,
            version: self.version + 1,
        }
    }
}

/// What a delivery due now does, given its endpoint's breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Closed: make the attempt.
    Send,
    /// Make the attempt as the probe, after writing this claim (half open, this delivery).
    Probe(Circuit),
    /// Make the attempt: it is the probe already claimed (its message came back).
    ProbeAgain,
    /// Open, and no delivery is on its way to be the next probe: this one is, after writing
    /// this claim; queue it for the probe time.
    Candidate(Circuit),
    /// Open, and this is the delivery on its way to be the next probe, come early (a copy
    /// of its message): queue it again for the probe time, `at`.
    WaitForProbe { at: DateTime<Utc> },
    /// Hold it: not attempted until the breaker closes.
    Hold,
}

/// What a delivery due now does, given its endpoint's breaker; `attempt`: which of its
/// attempts is due, as `(round, attempt)`; `gives_up_at`: when it would make its attempt
/// anyway, as its schedule's last, if held.
pub fn admit(
    circuit: Option<&Circuit>,
    breaker: &CircuitBreaker,
    delivery: &DeliveryId,
    attempt: (u32, u32),
    gives_up_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Admission {
    let Some(c) = circuit.filter(|c| breaker.enabled && c.state != CircuitState::Closed) else {
        return Admission::Send;
    };
    if c.state == CircuitState::HalfOpen && c.probe.as_ref() == Some(delivery) {
        return Admission::ProbeAgain;
    }
    let probe_at = match c.next_probe_at {
        Some(at) if now < at => at,
        _ => {
            let claim = Circuit {
                state: CircuitState::HalfOpen,
                next_probe_at: Some(now + breaker.probe_interval()),
                probe: Some(delivery.clone()),
                probe_attempt: Some(attempt),
                version: c.version + 1,
                ..c.clone()
            };
            return Admission::Probe(claim);
        }
    };
    if !worth_holding(c, gives_up_at) {
        return Admission::Send;
    }
    match (c.state, &c.probe) {
        (CircuitState::Open, Some(p)) if p == delivery => Admission::WaitForProbe { at: probe_at },
        (CircuitState::Open, None) => Admission::Candidate(Circuit {
            probe: Some(delivery.clone()),
            probe_attempt: Some(attempt),
            version: c.version + 1,
            ..c.clone()
        }),
        _ => Admission::Hold,
    }
}

/// Whether an attempt that gives up at `gives_up_at` is held by the breaker `c` (open or
/// half open): not if it would give up before the next probe could close the breaker, as
/// holding it could then only cost it the attempts its schedule gives it (and send them all
/// at once when it gives up).
pub fn worth_holding(c: &Circuit, gives_up_at: DateTime<Utc>) -> bool {
    c.next_probe_at.is_none_or(|probe_at| gives_up_at >= probe_at)
}

/// The change an attempt's outcome makes to its endpoint's breaker, if any: `failures` is how
/// many attempts in a row have now failed (this one included).
pub fn after_attempt(
    circuit: Option<&Circuit>,
    breaker: &CircuitBreaker,
    success: bool,
    failures: u32,
    now: DateTime<Utc>,
) -> Option<Circuit> {
    if !breaker.enabled {
        return None;
    }
    let closed = Circuit::closed(now);
    let current = circuit.unwrap_or(&closed);
    match (current.state, success) {
        // A success closes it; the release of what it held starts.
        (CircuitState::Open | CircuitState::HalfOpen, true) => Some(Circuit {
            releasing: true,
            ..current.next(CircuitState::Closed, now)
        }),
        (CircuitState::Closed, false) if failures >= breaker.failure_threshold => {
            let version = circuit.map_or(0, |c| c.version + 1);
            Some(Circuit {
                next_probe_at: Some(now + breaker.probe_interval()),
                version,
                ..current.next(CircuitState::Open, now)
            })
        }
        // The probe failed: open again, since it first opened, until the next probe time.
        (CircuitState::HalfOpen, false) => Some(Circuit {
            next_probe_at: Some(now + breaker.probe_interval()),
            ..current.next(CircuitState::Open, current.since)
        }),
        _ => None,
    }
}

/// Deliveries released per second at first when no rate limit paces them; doubling each second.
pub const RAMP_START_PER_SECOND: u64 = 10;

/// The second, counted from the breaker's closing, in which the `n`-th held delivery (from 0)
/// is released on the ramp: 10 in the first second, 20 in the next, 40 in the next...
pub fn ramp_offset(n: u64) -> u32 {
    let mut k = 0u32;
    while ramp_released_through(k) <= n {
        k += 1;
    }
    k
}

/// When the `n`-th held delivery (from 0) is released on the ramp of a breaker closed at
/// `since`: the start of its second ([`ramp_offset`]).
pub fn ramp_at(since: DateTime<Utc>, n: u64) -> DateTime<Utc> {
    since + Duration::seconds(ramp_offset(n).into())
}

/// How many the ramp has released by the end of its second `k`: 10 · (2^(k+1) − 1).
pub fn ramp_released_through(k: u32) -> u64 {
    RAMP_START_PER_SECOND.saturating_mul((1u64 << (k + 1).min(62)) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attempt due, `(round, attempt)`.
    const A: (u32, u32) = (0, 1);

    fn at(s: i64) -> DateTime<Utc> {
        "2026-01-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + Duration::seconds(s)
    }

    #[test]
    fn it_opens_at_the_threshold_probes_once_per_interval_and_a_success_closes_it() {
        let b = CircuitBreaker::on();
        let d = DeliveryId::parse("dlv_01J0000000000000000000000A").unwrap();
        let other = DeliveryId::parse("dlv_01J0000000000000000000000B").unwrap();
        assert_eq!(after_attempt(None, &b, false, 4, at(0)), None, "under the threshold");
        let open = after_attempt(None, &b, false, 5, at(0)).expect("opens");
        assert_eq!((open.state, open.next_probe_at), (CircuitState::Open, Some(at(30))));
        // The first to come before the probe time is queued for it; the rest are held.
        let later = at(3_600);
        let Admission::Candidate(waiting) = admit(Some(&open), &b, &other, A, later, at(1)) else {
            panic!("the first held is the next probe");
        };
        assert_eq!(waiting.probe.as_ref(), Some(&other));
        assert_eq!(admit(Some(&waiting), &b, &d, A, later, at(29)), Admission::Hold);
        // The next probe come early (a copy of its message) is queued for the probe time.
        assert_eq!(
            admit(Some(&waiting), &b, &other, A, later, at(29)),
            Admission::WaitForProbe { at: at(30) }
        );
        let Admission::Probe(probing) = admit(Some(&open), &b, &d, A, later, at(30)) else {
            panic!("the probe time has come");
        };
        assert_eq!(
            (probing.state, probing.probe_attempt),
            (CircuitState::HalfOpen, Some(A))
        );
        assert_eq!(probing.version, open.version + 1);
        // One probe at a time: others are held, its own message is still the probe.
        assert_eq!(admit(Some(&probing), &b, &other, A, later, at(31)), Admission::Hold);
        assert_eq!(admit(Some(&probing), &b, &d, A, later, at(31)), Admission::ProbeAgain);
        // A probe lost for an interval is replaced.
        assert!(matches!(
            admit(Some(&probing), &b, &other, A, later, at(60)),
            Admission::Probe(_)
        ));
        let again = after_attempt(Some(&probing), &b, false, 6, at(31)).expect("reopens");
        assert_eq!(
            (again.state, again.since, again.next_probe_at),
            (CircuitState::Open, at(0), Some(at(61)))
        );
        let closed = after_attempt(Some(&probing), &b, true, 0, at(32)).expect("closes");
        assert_eq!((closed.state, closed.releasing), (CircuitState::Closed, true));
        assert_eq!(admit(Some(&closed), &b, &d, A, later, at(32)), Admission::Send);
    }

    #[test]
    fn an_attempt_that_would_give_up_before_the_next_probe_is_not_held() {
        let b = CircuitBreaker::on();
        let d = DeliveryId::parse("dlv_01J0000000000000000000000A").unwrap();
        let open = after_attempt(None, &b, false, 5, at(0)).unwrap();
        // Its schedule ends at 3 s, the probe comes at 30 s: holding it would cost it its
        // attempts, so it is made.
        assert_eq!(admit(Some(&open), &b, &d, A, at(3), at(1)), Admission::Send);
        assert!(matches!(
            admit(Some(&open), &b, &d, A, at(30), at(1)),
            Admission::Candidate(_)
        ));
    }

    #[test]
    fn a_disabled_breaker_neither_opens_nor_holds() {
        let off = CircuitBreaker::off();
        let d = DeliveryId::parse("dlv_01J0000000000000000000000A").unwrap();
        assert_eq!(after_attempt(None, &off, false, 50, at(0)), None);
        let open = after_attempt(None, &CircuitBreaker::on(), false, 5, at(0)).unwrap();
        assert_eq!(admit(Some(&open), &off, &d, A, at(3_600), at(1)), Admission::Send);
    }

    #[test]
    fn the_ramp_doubles_each_second() {
        let per_second: Vec<usize> = (0..5)
            .map(|k| (0..1_000u64).filter(|n| ramp_offset(*n) == k).count())
            .collect();
        assert_eq!(per_second, vec![10, 20, 40, 80, 160]);
    }
}
