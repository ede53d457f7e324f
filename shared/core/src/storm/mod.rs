//! Retry-storm simulation: N deliveries fail together at t = 0; will their
//! retries keep a recovering consumer down?
//!
//! The model, in whole seconds: a delivery that fails attempt k in second t makes attempt
//! k+1 in second `t + max(1, ceil(d))`, `d` being the production policy's delay after k
//! failures, jitter (and the adaptive health multiplier) included; after its last attempt
//! fails it is dead. The consumer serves at most C(t) attempts in second t; which of the
//! offered attempts fail is uniformly random among them.
//!
//! Counts, not individuals: deliveries that share (shard, attempt, landing second, previous
//! delay for decorrelated jitter, whether they belong to the initial failure) form a cohort,
//! and a cohort's failures are split over landing seconds by multinomial draws (or by the
//! production sampler itself when it is small), so N = 10⁹ costs what N = 10³ costs. See
//! [`engine`] for the two approximations, both exact when there is no jitter.

mod engine;
pub mod kernel;
mod protection;
#[cfg(test)]
mod tests;

use serde::Serialize;

use crate::circuit::CircuitBreaker;
use crate::error::ValidationError;
use crate::policy::{Jitter, RetryPolicy};

pub use engine::{simulate, simulate_with_progress, simulate_with_rng, Progress};

/// The consumer's capacity: `base_rps`, changed from `from_second` on by each step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capacity {
    pub base_rps: u64,
    /// Sorted by `from_second`: an outage (rps 0), a recovery, a rolling degradation.
    pub steps: Vec<CapacityStep>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CapacityStep {
    pub from_second: u64,
    pub rps: u64,
}

impl Capacity {
    pub fn constant(rps: u64) -> Self {
        Self {
            base_rps: rps,
            steps: Vec::new(),
        }
    }

    /// Attempts the consumer serves in second `t`.
    pub fn at(&self, t: u64) -> u64 {
        self.steps
            .iter()
            .take_while(|s| s.from_second <= t)
            .last()
            .map_or(self.base_rps, |s| s.rps)
    }
}

/// How the shards of a sharded dispatcher seed their jitter (the multi-shard edge case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardSeeds {
    /// Every shard derives its jitter from the same seed and failure second: the shards
    /// draw the same delays and land together.
    Shared,
    /// Each shard has its own random stream.
    Independent,
}

/// The endpoint health the adaptive policies see (the adaptive multiplier: ×0.5 healthy,
/// ×1 degraded, ×2 failing).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthModel {
    /// The consumer is one endpoint: its score is computed, as production does, from its
    /// last 50 simulated attempts (so a mass failure doubles an adaptive policy's delays).
    Tracked,
    /// No history: ×1.
    Unknown,
    /// A fixed score in [0, 1].
    Fixed(f64),
}

/// One storm to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct StormConfig {
    /// The production policy whose code schedules the retries.
    pub policy: RetryPolicy,
    /// A label for reports (`standard`, `b=2 m=6`, ...).
    pub policy_label: String,
    /// Deliveries that failed their first attempt at t = 0.
    pub population: u64,
    pub capacity: Capacity,
    /// New first attempts in every second from 1 to `traffic_seconds`.
    pub first_attempt_rps: u64,
    pub traffic_seconds: u64,
    pub seed: u64,
    pub shards: u32,
    pub shard_seeds: ShardSeeds,
    pub health: HealthModel,
    /// The endpoint's rate limit, as a subscription sets it (`None`: none).
    pub rate_limit_per_second: Option<u32>,
    /// The endpoint's circuit breaker, as a subscription sets it (off unless asked for: the
    /// calculator models the retry policy alone by default).
    pub circuit_breaker: CircuitBreaker,
}

pub const MAX_SHARDS: u32 = 1024;
/// Longer storms would need series of more than this many seconds.
pub const MAX_HORIZON_SECONDS: u64 = 20_000_000;

impl StormConfig {
    /// The naive doubling curve's parameters: retries r = 1 ..= m+1, retry r waiting b^(r−1) s, not adaptive.
    pub fn seed_policy(base: u64, max_tier: u32, jitter: Jitter) -> Result<RetryPolicy, ValidationError> {
        if base < 1 {
            return Err(ValidationError::new(
                "invalid_storm",
                "backoff_base_seconds must be at least 1",
            ));
        }
        let mut delays = Vec::with_capacity(max_tier as usize + 1);
        for r in 0..=max_tier {
            let d = base
                .checked_pow(r)
                .filter(|d| *d <= RetryPolicy::MAX_DELAY_SECONDS)
                .ok_or_else(|| {
                    ValidationError::new(
                        "invalid_storm",
                        format!("max_tier: {base}^{r} s is longer than the 30 days a delay may last"),
                    )
                })?;
            delays.push(d);
        }
        RetryPolicy::custom(delays, jitter, false)
    }

    pub fn new(policy: RetryPolicy, population: u64, capacity_rps: u64) -> Self {
        Self {
            policy_label: policy.label(),
            policy,
            population,
            capacity: Capacity::constant(capacity_rps),
            first_attempt_rps: 0,
            traffic_seconds: 0,
            seed: 0,
            shards: 1,
            shard_seeds: ShardSeeds::Independent,
            health: HealthModel::Tracked,
            rate_limit_per_second: None,
            circuit_breaker: CircuitBreaker::off(),
        }
    }

    /// "rate limit 100/s, breaker on", or "" with neither.
    pub fn protection_label(&self) -> String {
        let mut parts = Vec::new();
        if let Some(r) = self.rate_limit_per_second {
            parts.push(format!("rate limit {r}/s"));
        }
        if self.circuit_breaker.enabled {
            parts.push("breaker on".to_owned());
        }
        parts.join(", ")
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        let bad = |m: String| Err(ValidationError::new("invalid_storm", m));
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return bad(format!("shards: {} is not between 1 and {MAX_SHARDS}", self.shards));
        }
        if self.rate_limit_per_second.is_some_and(|r| !(1..=10_000).contains(&r)) {
            return bad("rate_limit_per_second: must be 1 to 10000".into());
        }
        if let Some(problem) = self.circuit_breaker.problem() {
            return bad(problem);
        }
        if let HealthModel::Fixed(h) = self.health {
            if !(0.0..=1.0).contains(&h) {
                return bad(format!("adaptive_health: {h} is not a score between 0 and 1"));
            }
        }
        if self
            .capacity
            .steps
            .windows(2)
            .any(|w| w[0].from_second >= w[1].from_second)
        {
            return bad("capacity_schedule: steps must be in increasing from_second order".into());
        }
        self.policy.jitter.validate()?;
        if self.horizon_bound() > MAX_HORIZON_SECONDS {
            return bad(format!(
                "retry_policy: this policy can keep retrying for {} s; the calculator stops at {MAX_HORIZON_SECONDS} s",
                self.horizon_bound()
            ));
        }
        Ok(())
    }

    /// The latest second anything can happen: the longest possible chain of delays; with a
    /// breaker, held for up to as long again; with a limit, everything waiting its turn.
    pub fn horizon_bound(&self) -> u64 {
        let multiplier = if self.policy.adaptive { 2.0 } else { 1.0 };
        let mut total = 0.0;
        for k in 1..self.policy.max_attempts() {
            let hi = self
                .policy
                .delay_range(k, Some(self.policy.max_delay()))
                .map_or(0.0, |r| r.hi);
            total += (hi * multiplier).ceil().max(1.0);
        }
        let mut bound = self.traffic_seconds + total as u64 + 1;
        if self.circuit_breaker.enabled {
            bound += total as u64 + u64::from(self.circuit_breaker.probe_interval_seconds);
        }
        if let Some(r) = self.rate_limit_per_second {
            let attempts = (self.population + self.first_attempt_rps * self.traffic_seconds)
                .saturating_mul(u64::from(self.policy.max_attempts()));
            bound += attempts / u64::from(r) + 1;
        }
        bound
    }
}

/// Attempts per second, indexed by second from 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Series {
    pub offered: Vec<u64>,
    pub served: Vec<u64>,
    pub failed: Vec<u64>,
    pub capacity: Vec<u64>,
    /// Held by the breaker or waiting for the limiter, at the end of each second (with either).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<u64>,
}

/// What a storm did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StormReport {
    pub policy: String,
    pub jitter: String,
    pub population: u64,
    pub seed: u64,
    pub shards: u32,
    /// The highest number of attempts offered to the consumer in one second, and the
    /// earliest second it happened (the N first attempts at t = 0 are not offered again).
    pub peak_offered_rps: u64,
    pub peak_second: u64,
    /// Every attempt, the population's failed first attempts included.
    pub total_attempts: u64,
    pub delivered: u64,
    pub dead: u64,
    /// The last second in which any attempt was made.
    pub drain_seconds: u64,
    /// From t = 0 to delivery, over the initial population's deliveries; `None` when none
    /// was delivered.
    pub mean_delivery_seconds: Option<f64>,
    pub p99_delivery_seconds: Option<u64>,
    /// "rate limit 100/s, breaker on", or empty.
    pub protection: String,
    /// How often the breaker opened, and the most held or waiting at once.
    pub breaker_openings: u64,
    pub peak_waiting: u64,
    pub series: Series,
    /// Offered attempts per second for each shard, when there is more than one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shard_offered: Vec<Vec<u64>>,
}

/// The jitter strategies `--compare` runs, the policy's own first when it is another.
pub fn comparison_jitters(own: Jitter) -> Vec<Jitter> {
    let mut all = vec![
        Jitter::None,
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
        Jitter::Proportional(0.1),
    ];
    if !all.contains(&own) {
        all.push(own);
    }
    all
}
