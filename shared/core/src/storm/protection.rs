//! The storm's rate limit and circuit breaker, by the rules the delivery path runs, applied
//! to cohorts: the limiter's slots (`rate_limit::reserve_many`) and the breaker's states
//! (`circuit::admit`, `circuit::after_attempt`, `circuit::ramp_offset`).
//!
//! Each second, what lands meets the breaker first, as in `Services::deliver_within`.
//! Closed, it goes on. Open, it is held until its give-up second (when its schedule would
//! have made its last attempt), but for one probe per interval and the held whose give-up
//! has come, which are attempted and go on with the rest of their schedule, never held
//! again; what would give up before the next probe is not held (`circuit::worth_holding`). Then the limiter: a line, out of which the
//! limit's slots go to the consumer each second; an attempt waiting in it is not offered,
//! nor counted, until its slot. After the consumer answers, the breaker moves: a success
//! while open closes it and releases what it held (into the limiter's line if there is a
//! limit, else on the ramp); failures in a row open it. The run of failures is estimated:
//! all of a second's when none succeeded (added to the run before), else the expected run at
//! the end of a random order, failed / (served + 1).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::circuit::{self, Admission, Circuit, CircuitBreaker, CircuitState};
use crate::model::DeliveryId;
use crate::rate_limit::reserve_many;

/// Second `t` of the storm as a time, for the rules that take one.
fn at(t: u64) -> DateTime<Utc> {
    DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::seconds(t as i64)
}

/// The endpoint's rate limit: a line of cohorts and the limiter's next free slot.
#[derive(Debug)]
pub(super) struct Limiter<K> {
    interval: Duration,
    next: Option<DateTime<Utc>>,
    line: VecDeque<(K, u64)>,
    /// Attempts in the line.
    pub waiting: u64,
}

impl<K: Copy> Limiter<K> {
    pub fn new(per_second: u32) -> Self {
        Self {
            // As `Subscription::slot_interval`.
            interval: Duration::from_secs(1) / per_second.max(1),
            next: None,
            line: VecDeque::new(),
            waiting: 0,
        }
    }

    pub fn join(&mut self, cohorts: impl IntoIterator<Item = (K, u64)>) {
        for (key, n) in cohorts.into_iter().filter(|(_, n)| *n > 0) {
            self.waiting += n;
            self.line.push_back((key, n));
        }
    }

    /// What goes to the consumer in second `t`: the line's head, as many as have a slot in it.
    pub fn let_through(&mut self, t: u64) -> Vec<(K, u64)> {
        let (now, end) = (at(t), at(t + 1));
        let mut out = Vec::new();
        while let Some((key, n)) = self.line.front_mut() {
            let (slot, _) = reserve_many(self.next, self.interval, now, 1);
            if slot >= end {
                break;
            }
            let room = (end - slot).to_std().unwrap_or_default().as_nanos();
            let go = (room.div_ceil(self.interval.as_nanos().max(1)) as u64).min(*n);
            let (_, after) = reserve_many(self.next, self.interval, now, go);
            self.next = Some(after);
            out.push((*key, go));
            *n -= go;
            self.waiting -= go;
            if *n == 0 {
                self.line.pop_front();
            }
        }
        out
    }
}

/// What passes an open breaker in a second.
pub(super) struct Passed<K> {
    /// Attempted as they are (the probe, or everything when closed).
    pub attempt: Vec<(K, u64)>,
    /// Held to their give-up second: attempted, and on with their schedule.
    pub last: Vec<(K, u64)>,
}

/// The endpoint's circuit breaker and what it holds.
#[derive(Debug)]
pub(super) struct Breaker<K> {
    settings: CircuitBreaker,
    circuit: Option<Circuit>,
    /// Failed attempts in a row, as estimated.
    run: u64,
    /// Held cohorts by the second they give up.
    held: BTreeMap<u64, Vec<(K, u64)>>,
    pub holding: u64,
    probing: bool,
    pub openings: u64,
}

impl<K: Copy> Breaker<K> {
    pub fn new(settings: CircuitBreaker) -> Self {
        Self {
            settings,
            circuit: None,
            run: 0,
            held: BTreeMap::new(),
            holding: 0,
            probing: false,
            openings: 0,
        }
    }

    fn closed(&self) -> bool {
        self.circuit.as_ref().is_none_or(|c| c.state == CircuitState::Closed)
    }

    /// Meet what landed in second `t`; `give_up` says when a cohort's schedule would end
    /// (`None`: it gave up once, and is never held again).
    pub fn pass(&mut self, t: u64, landed: Vec<(K, u64)>, give_up: impl Fn(K) -> Option<u64>) -> Passed<K> {
        self.probing = false;
        if self.closed() {
            return Passed {
                attempt: landed,
                last: Vec::new(),
            };
        }
        let mut last = Vec::new();
        while let Some(entry) = self.held.first_entry().filter(|e| *e.key() <= t) {
            for (key, n) in entry.remove() {
                self.holding -= n;
                last.push((key, n));
            }
        }
        let mut attempt = Vec::new();
        for (key, n) in landed {
            let Some(until) = give_up(key) else {
                attempt.push((key, n));
                continue;
            };
            let worth = self
                .circuit
                .as_ref()
                .is_some_and(|c| circuit::worth_holding(c, at(until)));
            // Its schedule over (no retry after it): attempted at once, as `gate` does.
            if until <= t || !worth {
                attempt.push((key, n));
            } else {
                self.held.entry(until).or_default().push((key, n));
                self.holding += n;
            }
        }
        // The breaker's rules see one delivery standing for whichever is tried (held, it
        // gives up no sooner than the next probe).
        let probe = DeliveryId::parse("dlv_00000000000000000000000000").expect("a delivery id");
        match circuit::admit(
            self.circuit.as_ref(),
            &self.settings,
            &probe,
            (0, 1),
            DateTime::<Utc>::MAX_UTC,
            at(t),
        ) {
            Admission::Probe(claim) => {
                if let Some(key) = self.take_soonest() {
                    self.circuit = Some(claim);
                    self.probing = true;
                    attempt.push((key, 1));
                }
            }
            Admission::Candidate(claim) => self.circuit = Some(claim),
            Admission::Send | Admission::ProbeAgain | Admission::WaitForProbe { .. } | Admission::Hold => {}
        }
        Passed { attempt, last }
    }

    /// The held delivery soonest to give up, taken out to be the probe.
    fn take_soonest(&mut self) -> Option<K> {
        let mut entry = self.held.first_entry()?;
        let cohorts = entry.get_mut();
        let (key, n) = cohorts.last_mut().expect("no empty second is kept");
        let key = *key;
        *n -= 1;
        if *n == 0 {
            cohorts.pop();
            if cohorts.is_empty() {
                entry.remove();
            }
        }
        self.holding -= 1;
        Some(key)
    }

    /// After the consumer answered second `t`'s attempts: what the breaker released, soonest
    /// to give up first, if a success closed it.
    pub fn after(&mut self, t: u64, served: u64, failed: u64) -> Vec<(K, u64)> {
        self.run = if served == 0 {
            self.run + failed
        } else {
            failed / (served + 1)
        };
        let closed = self.closed();
        let failures = u32::try_from(self.run).unwrap_or(u32::MAX);
        if !closed && served > 0 {
            self.circuit = circuit::after_attempt(self.circuit.as_ref(), &self.settings, true, 0, at(t));
            self.holding = 0;
            return std::mem::take(&mut self.held).into_values().flatten().collect();
        }
        if (closed && failed > 0) || self.probing {
            if let Some(next) = circuit::after_attempt(self.circuit.as_ref(), &self.settings, false, failures, at(t)) {
                self.openings += u64::from(closed && next.state == CircuitState::Open);
                self.circuit = Some(next);
            }
        }
        Vec::new()
    }
}

/// Released cohorts on the ramp from second `from`: (second, key, count), the n-th released
/// in second `from + ramp_offset(n)`.
pub(super) fn on_ramp<K: Copy>(from: u64, released: Vec<(K, u64)>) -> Vec<(u64, K, u64)> {
    let mut out = Vec::new();
    let mut n = 0u64;
    for (key, mut count) in released {
        while count > 0 {
            let second = circuit::ramp_offset(n);
            let go = (circuit::ramp_released_through(second) - n).min(count);
            out.push((from + u64::from(second), key, go));
            n += go;
            count -= go;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_lets_the_limit_through_each_second_in_line_order() {
        let mut l = Limiter::new(100);
        l.join([("a", 150), ("b", 100)]);
        assert_eq!(l.let_through(0), vec![("a", 100)]);
        assert_eq!(l.let_through(1), vec![("a", 50), ("b", 50)]);
        assert_eq!(l.let_through(2), vec![("b", 50)]);
        assert_eq!(l.waiting, 0);
        assert!(l.let_through(3).is_empty());
    }

    #[test]
    fn the_breaker_opens_holds_probes_and_releases_on_a_success() {
        let b = CircuitBreaker::on();
        let mut breaker = Breaker::new(b);
        // 10 fail at once: open.
        assert!(breaker.after(0, 0, 10).is_empty());
        assert_eq!(breaker.openings, 1);
        let passed = breaker.pass(1, vec![("a", 40)], |_| Some(1_000));
        assert!(passed.attempt.is_empty() && passed.last.is_empty());
        assert_eq!(breaker.holding, 40);
        // The probe time: one is tried; it fails and the breaker opens again.
        let passed = breaker.pass(30, Vec::new(), |_| Some(1_000));
        assert_eq!(passed.attempt, vec![("a", 1)]);
        assert!(breaker.after(30, 0, 1).is_empty());
        assert_eq!(breaker.openings, 1, "a failed probe is no new opening");
        assert!(breaker.pass(31, Vec::new(), |_| Some(1_000)).attempt.is_empty());
        // The next probe succeeds: what it held is released.
        let passed = breaker.pass(60, Vec::new(), |_| Some(1_000));
        assert_eq!(passed.attempt, vec![("a", 1)]);
        assert_eq!(breaker.after(60, 1, 0), vec![("a", 38)]);
        assert_eq!(
            breaker.pass(61, vec![("b", 5)], |_| Some(1_000)).attempt,
            vec![("b", 5)]
        );
    }

    #[test]
    fn held_past_their_give_up_they_are_attempted() {
        let mut breaker = Breaker::new(CircuitBreaker::on());
        breaker.after(0, 0, 5);
        breaker.pass(1, vec![("a", 3), ("b", 2)], |k| Some(if k == "a" { 40 } else { 50 }));
        assert_eq!(breaker.holding, 5);
        let passed = breaker.pass(40, Vec::new(), |_| Some(0));
        assert_eq!(passed.last, vec![("a", 3)]);
        assert_eq!(passed.attempt, vec![("b", 1)], "and the probe, due since 30");
        assert_eq!(breaker.holding, 1);
    }

    #[test]
    fn what_would_give_up_before_the_next_probe_is_not_held() {
        let mut breaker = Breaker::new(CircuitBreaker::on());
        breaker.after(0, 0, 5);
        let passed = breaker.pass(1, vec![("a", 3), ("b", 2)], |k| Some(if k == "a" { 10 } else { 30 }));
        assert_eq!(
            passed.attempt,
            vec![("a", 3)],
            "its schedule ends before the probe at 30"
        );
        assert_eq!(breaker.holding, 2);
    }

    #[test]
    fn the_ramp_releases_ten_then_doubles() {
        let out = on_ramp(5, vec![("a", 25), ("b", 20)]);
        assert_eq!(out, vec![(5, "a", 10), (6, "a", 15), (6, "b", 5), (7, "b", 15)]);
    }
}
