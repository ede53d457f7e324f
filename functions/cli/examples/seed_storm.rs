//! The reference retry-storm simulation, its own method in Rust: one random draw per delivery
//! per tier, a FIFO of (count, tier) cohorts, each second's arrivals capped at the capacity
//! and the overflow sent on to the next tier, the second taken modulo the window. The same
//! model and the same faults as `../shared/reference/seed_storm.py`, not `hookwise storm`'s
//! (which models the queue over time, with cohorts instead of per-delivery draws).
//!
//! `scripts/bench-storm.sh` times it beside the Python and `hookwise storm`, so the table
//! shows what the language buys (this against the Python: the same work) and what the
//! algorithm buys (`hookwise storm` against this).
//!
//! Usage: seed_storm N JITTER(none|full|equal) WINDOW_SECONDS [SEED]; prints one JSON line:
//! the peak second's arrivals, every attempt, the arrivals within capacity, those over it,
//! and the last second with any.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BASE: f64 = 2.0;
const MAX_TIER: u32 = 6;
const CAPACITY: u64 = 500;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: seed_storm N none|full|equal WINDOW_SECONDS [SEED]";
    let n: u64 = args.get(1).and_then(|a| a.parse().ok()).expect(usage);
    let jitter = args.get(2).map(String::as_str).expect(usage);
    let window: usize = args.get(3).and_then(|a| a.parse().ok()).expect(usage);
    let seed: u64 = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(1);
    let mut rng = StdRng::seed_from_u64(seed);

    let mut arrivals = vec![0u64; window];
    let mut pending = VecDeque::from([(n, 0u32)]);
    let mut attempts = 0u64;
    // The seed's `buckets` dict, one per cohort: the seconds in the order first met.
    let mut buckets: Vec<u64> = vec![0; window];
    let mut order: Vec<usize> = Vec::new();
    while let Some((count, tier)) = pending.pop_front() {
        attempts += count;
        let delay = BASE.powi(tier as i32);
        for _ in 0..count {
            let t = match jitter {
                "full" => rng.random_range(0.0..delay),
                "equal" => delay / 2.0 + rng.random_range(0.0..delay / 2.0),
                "none" => delay,
                other => panic!("unknown jitter {other}: {usage}"),
            };
            let sec = (t as usize) % window;
            if buckets[sec] == 0 {
                order.push(sec);
            }
            buckets[sec] += 1;
        }
        for sec in order.drain(..) {
            arrivals[sec] += std::mem::take(&mut buckets[sec]);
            if arrivals[sec] > CAPACITY && tier < MAX_TIER {
                let overflow = arrivals[sec] - CAPACITY;
                arrivals[sec] = CAPACITY;
                pending.push_back((overflow, tier + 1));
            }
        }
    }
    let peak = arrivals.iter().copied().max().unwrap_or(0);
    let within: u64 = arrivals.iter().map(|a| (*a).min(CAPACITY)).sum();
    let over: u64 = arrivals.iter().map(|a| a.saturating_sub(CAPACITY)).sum();
    let last = arrivals.iter().rposition(|a| *a > 0).unwrap_or(0);
    println!(
        "{{\"peak\": {peak}, \"attempts\": {attempts}, \"within_capacity\": {within}, \"over_capacity\": {over}, \"last_second\": {last}}}"
    );
}
