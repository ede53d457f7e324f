//! The simulation loop.
//!
//! Each second: the cohorts landing now are offered to the consumer; `min(offered, C(t))`
//! are served and the rest fail, split over the cohorts by a multivariate hypergeometric
//! draw (uniformly random among those offered); each cohort's failures are then scheduled
//! with the production policy:
//!
//! - no jitter (one landing second): all of them, exactly;
//! - a small cohort (≤ [`SMALL_COHORT`]): one `RetryPolicy::next_delay` draw each, the very
//!   sampler the delivery path uses;
//! - a larger cohort over a narrow spread (≤ [`NARROW_SPREAD`] seconds): an exact multinomial
//!   split over the landing seconds, by sequential binomial draws;
//! - a larger cohort over a wide spread: added to a pool per (shard, attempt) that keeps
//!   the expected landings per second (a sum of piecewise-constant kernels, as a difference
//!   map) and, each second, lands `Binomial(pending, expected now / expected remaining)`.
//!   The mean is exact; only the covariance between sources is approximated, and only where
//!   a cohort of hundreds spreads over more than [`NARROW_SPREAD`] seconds. For decorrelated
//!   jitter, a pooled landing takes the mean of the possible previous delays.
//!
//! So the cost per second is bounded by the number of cohorts, not by N.
//!
//! With a rate limit or a circuit breaker, what lands meets them before the consumer (see
//! [`super::protection`]).

use std::collections::{BTreeMap, VecDeque};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Binomial, Distribution, Hypergeometric};

use super::kernel::{landing_offset, Kernel};
use super::protection::{on_ramp, Breaker, Limiter};
use super::{HealthModel, Series, ShardSeeds, StormConfig, StormReport};
use crate::error::ValidationError;
use crate::health::{adaptive_multiplier, DECAY_PER_HOUR, HEALTH_WINDOW};
use crate::policy::{DelayRange, Jitter, RetryContext, Seconds};

/// Cohorts up to this size draw each delay individually.
pub const SMALL_COHORT: u64 = 256;
/// Landing spreads up to this many seconds are split exactly.
pub const NARROW_SPREAD: u64 = 512;

/// How far the run has got, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub second: u64,
    /// An upper bound on the last second.
    pub horizon: u64,
}

/// Run one storm with the config's seed.
pub fn simulate(config: &StormConfig) -> Result<StormReport, ValidationError> {
    simulate_with_progress(config, &mut |_| {})
}

/// Run one storm seeded from `rng`.
pub fn simulate_with_rng(config: &StormConfig, rng: &mut impl Rng) -> Result<StormReport, ValidationError> {
    let mut config = config.clone();
    config.seed = rng.random();
    simulate(&config)
}

/// Run one storm, reporting progress now and then.
pub fn simulate_with_progress(
    config: &StormConfig,
    progress: &mut dyn FnMut(Progress),
) -> Result<StormReport, ValidationError> {
    config.validate()?;
    let mut sim = Sim::new(config);
    sim.run(progress);
    Ok(sim.report())
}

/// Deliveries that are alike for the rest of the storm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    shard: u32,
    /// The attempt they make when they land.
    attempt: u32,
    /// Decorrelated jitter only: the bucketed previous delay, as a landing offset (0: none).
    prev: u32,
    /// Part of the population that failed at t = 0 (delivery times are measured for these).
    initial: bool,
    /// Held by the breaker till their give-up second, and gone on with their schedule since:
    /// never held again.
    given_up: bool,
}

type PoolKey = (u32, u32, bool, bool);

/// Pending deliveries whose landings are tracked by expectation (see the module docs).
#[derive(Debug, Default)]
struct Pool {
    /// From each second on, the change to (expected landings per second, that × source second).
    diff: BTreeMap<u64, (f64, f64)>,
    rate: f64,
    rate_by_source: f64,
    expected: f64,
    pending: u64,
    last: u64,
}

impl Pool {
    fn add(&mut self, source: u64, count: u64, kernel: &Kernel) {
        let f = count as f64;
        for (from, to, p) in kernel.segments() {
            if p <= 0.0 {
                continue;
            }
            let w = f * p;
            let s = source as f64;
            let start = self.diff.entry(source + from).or_default();
            start.0 += w;
            start.1 += w * s;
            let end = self.diff.entry(source + to + 1).or_default();
            end.0 -= w;
            end.1 -= w * s;
        }
        self.expected += f;
        self.pending += count;
        self.last = self.last.max(source + kernel.last);
    }

    /// The deliveries landing in second `t`, and their mean offset from their failure.
    fn land(&mut self, t: u64, rng: &mut StdRng) -> Option<(u64, f64)> {
        while let Some(entry) = self.diff.first_entry() {
            if *entry.key() > t {
                break;
            }
            let (dr, ds) = entry.remove();
            self.rate += dr;
            self.rate_by_source += ds;
        }
        if self.pending == 0 {
            return None;
        }
        let rate = self.rate.max(0.0);
        let p = if t >= self.last || rate >= self.expected || self.expected <= 1e-9 {
            1.0
        } else {
            rate / self.expected
        };
        let n = binomial(rng, self.pending, p);
        let mean_offset = if rate > 1e-12 {
            t as f64 - self.rate_by_source / rate
        } else {
            0.0
        };
        self.expected = (self.expected - rate).max(0.0);
        self.pending -= n;
        if self.pending == 0 {
            // Nothing left to land: forget the expectations of what already landed.
            *self = Pool::default();
        }
        Some((n, mean_offset))
    }
}

/// The consumer's last [`HEALTH_WINDOW`] attempts, as production scores them.
#[derive(Debug, Default)]
struct HealthWindow {
    /// (second, successes, attempts), oldest first; attempts sum to at most the window.
    samples: VecDeque<(u64, f64, f64)>,
    total: f64,
}

impl HealthWindow {
    fn record(&mut self, t: u64, served: u64, offered: u64) {
        if offered == 0 {
            return;
        }
        let keep = offered.min(HEALTH_WINDOW as u64) as f64;
        self.samples.push_back((t, served as f64 * keep / offered as f64, keep));
        self.total += keep;
        let window = HEALTH_WINDOW as f64;
        while self.total > window + 1e-9 {
            let excess = self.total - window;
            let front = self.samples.front_mut().expect("total > 0");
            if front.2 <= excess {
                self.total -= front.2;
                self.samples.pop_front();
            } else {
                front.1 *= (front.2 - excess) / front.2;
                front.2 -= excess;
                self.total -= excess;
            }
        }
    }

    fn score(&self, t: u64) -> Option<f64> {
        if self.total <= 0.0 {
            return None;
        }
        let decayed: f64 = self
            .samples
            .iter()
            .map(|(at, ok, _)| ok * (-DECAY_PER_HOUR * (t - at) as f64 / 3_600.0).exp())
            .sum();
        Some(decayed / self.total)
    }
}

struct Sim<'a> {
    cfg: &'a StormConfig,
    max_attempts: u32,
    decorrelated: bool,
    prev_clamp: u64,
    pending: BTreeMap<u64, Vec<(Key, u64)>>,
    pools: BTreeMap<PoolKey, Pool>,
    consumer: StdRng,
    health: HealthWindow,
    series: Series,
    shard_offered: Vec<Vec<u64>>,
    delivered_initial: Vec<(u64, u64)>,
    total_attempts: u64,
    delivered: u64,
    dead: u64,
    breaker: Option<Breaker<Key>>,
    limiter: Option<Limiter<Key>>,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn binomial(rng: &mut impl Rng, n: u64, p: f64) -> u64 {
    if n == 0 || p <= 0.0 {
        return 0;
    }
    if p >= 1.0 {
        return n;
    }
    Binomial::new(n, p).expect("0 < p < 1").sample(rng)
}

/// How many of `sample` items drawn without replacement from `total` fall among `marked`.
fn hypergeometric(rng: &mut impl Rng, total: u64, marked: u64, sample: u64) -> u64 {
    if sample == 0 || marked == 0 {
        return 0;
    }
    if sample == total {
        return marked;
    }
    if marked == total {
        return sample;
    }
    let lo = sample.saturating_sub(total - marked);
    let hi = marked.min(sample);
    let mean = sample as f64 * marked as f64 / total as f64;
    // Near an end of the support rand_distr inverts from a start probability it computes in
    // O(total) steps; invert from a log-factorial start instead (a few dozen steps at most).
    if mean - (lo as f64) < 16.0 {
        return inverse_hypergeometric(rng, total, marked, sample);
    }
    if (hi as f64) - mean < 16.0 {
        // The marked ones left out of the sample, counted from their own lower end.
        return marked - inverse_hypergeometric(rng, total, marked, total - sample);
    }
    let x = match Hypergeometric::new(total, marked, sample) {
        Ok(h) => h.sample(rng),
        Err(_) => binomial(rng, marked, sample as f64 / total as f64),
    };
    x.clamp(lo, hi)
}

/// ln(n!), exact to 255 and Stirling's series beyond (relative error below 1e-15).
fn ln_factorial(n: u64) -> f64 {
    if n < 256 {
        return (2..=n).map(|i| (i as f64).ln()).sum();
    }
    let x = n as f64;
    x * x.ln() - x + 0.5 * (2.0 * std::f64::consts::PI * x).ln() + 1.0 / (12.0 * x) - 1.0 / (360.0 * x.powi(3))
}

/// Inversion from the lower end of the support: P(lo), then the ratio of successive terms.
fn inverse_hypergeometric(rng: &mut impl Rng, total: u64, marked: u64, sample: u64) -> u64 {
    let unmarked = total - marked;
    let lo = sample.saturating_sub(unmarked);
    let hi = marked.min(sample);
    let ln_choose = |n: u64, k: u64| ln_factorial(n) - ln_factorial(k) - ln_factorial(n - k);
    let mut p = (ln_choose(marked, lo) + ln_choose(unmarked, sample - lo) - ln_choose(total, sample)).exp();
    let mut u: f64 = rng.random();
    let mut x = lo;
    while u > p && x < hi {
        u -= p;
        p *= (marked - x) as f64 * (sample - x) as f64 / ((x + 1) as f64 * (unmarked + x + 1 - sample) as f64);
        x += 1;
    }
    x
}

/// `total` split over `parts` as evenly as whole numbers allow.
fn share(total: u64, parts: u32, i: u32) -> u64 {
    total / parts as u64 + u64::from((i as u64) < total % parts as u64)
}

/// The jitter streams of one second: one per shard, or one shared by all.
struct Streams {
    seed: u64,
    t: u64,
    shared: bool,
    rngs: Vec<Option<StdRng>>,
}

impl Streams {
    fn new(cfg: &StormConfig, t: u64) -> Self {
        let shared = cfg.shards == 1 || cfg.shard_seeds == ShardSeeds::Shared;
        Self {
            seed: cfg.seed,
            t,
            shared,
            rngs: (0..cfg.shards).map(|_| None).collect(),
        }
    }

    /// A shard's stream for this second: seeded from (seed, stream, second), so shards that
    /// share a seed draw the same delays for the same failures.
    fn get(&mut self, shard: u32) -> &mut StdRng {
        let (seed, t) = (self.seed, self.t);
        let stream = if self.shared { 0 } else { shard as u64 + 1 };
        self.rngs[shard as usize].get_or_insert_with(|| {
            StdRng::seed_from_u64(splitmix(
                seed ^ splitmix(stream.wrapping_mul(0xA24B_AED4_963E_E407) ^ splitmix(t)),
            ))
        })
    }
}

impl<'a> Sim<'a> {
    fn new(cfg: &'a StormConfig) -> Self {
        Self {
            cfg,
            max_attempts: cfg.policy.max_attempts(),
            decorrelated: cfg.policy.jitter == Jitter::Decorrelated,
            // Past a third of the longest delay, decorrelated jitter's range is capped anyway.
            prev_clamp: (cfg.policy.max_delay() / 3.0).ceil() as u64 + 2,
            pending: BTreeMap::new(),
            pools: BTreeMap::new(),
            consumer: StdRng::seed_from_u64(splitmix(cfg.seed ^ 0x636F_6E73_756D_6572)),
            health: HealthWindow::default(),
            series: Series::default(),
            shard_offered: if cfg.shards > 1 {
                vec![Vec::new(); cfg.shards as usize]
            } else {
                Vec::new()
            },
            delivered_initial: Vec::new(),
            total_attempts: 0,
            delivered: 0,
            dead: 0,
            breaker: cfg.circuit_breaker.enabled.then(|| Breaker::new(cfg.circuit_breaker)),
            limiter: cfg.rate_limit_per_second.map(Limiter::new),
        }
    }

    /// The second a cohort landing in second `t` gives up if the breaker holds it: when its
    /// schedule would have made its last attempt (`RetryPolicy::remaining_span`); `None` for
    /// one that gave up once, which is never held again.
    fn give_up(cfg: &StormConfig, t: u64, key: Key) -> Option<u64> {
        if key.given_up {
            return None;
        }
        let left = cfg
            .policy
            .remaining_span(key.attempt.saturating_sub(1), Self::previous_delay(key.prev));
        Some(t + left.ceil() as u64)
    }

    /// What of the cohorts landing in second `t` the breaker and the limiter let through.
    fn protect(&mut self, t: u64, landed: Vec<(Key, u64)>) -> Vec<(Key, u64)> {
        let cfg = self.cfg;
        let mut through = landed;
        if let Some(breaker) = &mut self.breaker {
            let passed = breaker.pass(t, through, |key| Self::give_up(cfg, t, key));
            through = passed.attempt;
            // Given up: attempted, and on with the rest of their schedule, never held again;
            // at the rate limit below, or else on the release ramp from this second.
            let given_up: Vec<_> = passed
                .last
                .into_iter()
                .map(|(key, n)| (Key { given_up: true, ..key }, n))
                .collect();
            match self.limiter {
                Some(_) => through.extend(given_up),
                None => {
                    for (second, key, n) in on_ramp(t, given_up) {
                        match second == t {
                            true => through.push((key, n)),
                            false => self.push(second, key, n),
                        }
                    }
                }
            }
        }
        if let Some(limiter) = &mut self.limiter {
            limiter.join(through);
            through = limiter.let_through(t);
        }
        through
    }

    /// After the consumer answered second `t`: the breaker moves, and what it releases goes
    /// to the limiter's line, or on the ramp from the next second.
    fn after_protection(&mut self, t: u64, served: u64, failed: u64) {
        let Some(breaker) = &mut self.breaker else {
            return;
        };
        let released = breaker.after(t, served, failed);
        if released.is_empty() {
            return;
        }
        match &mut self.limiter {
            Some(limiter) => limiter.join(released),
            None => {
                for (second, key, n) in on_ramp(t + 1, released) {
                    self.push(second, key, n);
                }
            }
        }
    }

    /// Held by the breaker or waiting in the limiter's line.
    fn waiting(&self) -> u64 {
        self.breaker.as_ref().map_or(0, |b| b.holding) + self.limiter.as_ref().map_or(0, |l| l.waiting)
    }

    /// Decorrelated jitter remembers the previous delay: by landing offset, exact to 128 s,
    /// then to 1/64 of its size.
    fn bucket(&self, offset: u64) -> u32 {
        if !self.decorrelated {
            return 0;
        }
        let o = offset.clamp(1, self.prev_clamp);
        let b = if o <= 128 {
            o
        } else {
            let shift = 63 - o.leading_zeros() - 6;
            (o >> shift) << shift
        };
        b as u32
    }

    /// The previous delay a bucket stands for: the middle of the delays that land in it.
    fn previous_delay(bucket: u32) -> Option<Seconds> {
        if bucket == 0 {
            return None;
        }
        let b = bucket as u64;
        let size = if b <= 128 {
            1
        } else {
            1u64 << (63 - b.leading_zeros() - 6)
        };
        Some(b as f64 - 1.0 + size as f64 / 2.0)
    }

    fn health_now(&self, t: u64) -> Option<f64> {
        match self.cfg.health {
            HealthModel::Tracked => self.health.score(t),
            HealthModel::Unknown => None,
            HealthModel::Fixed(h) => Some(h),
        }
    }

    fn push(&mut self, t: u64, key: Key, count: u64) {
        self.pending.entry(t).or_default().push((key, count));
    }

    /// Schedule `count` deliveries of `key` that failed in second `t`, or bury them.
    fn fail(&mut self, key: Key, count: u64, t: u64, health: Option<f64>, rng: &mut StdRng) {
        if key.attempt >= self.max_attempts {
            self.dead += count;
            return;
        }
        let cfg: &'a StormConfig = self.cfg;
        let policy = &cfg.policy;
        let failures = key.attempt;
        let previous_delay = Self::previous_delay(key.prev);
        let multiplier = if policy.adaptive {
            adaptive_multiplier(health)
        } else {
            1.0
        };
        let range = policy.delay_range(failures, previous_delay).expect("attempts are left");
        let kernel = Kernel::new(DelayRange {
            lo: range.lo * multiplier,
            hi: range.hi * multiplier,
        });
        let next = |bucket: u32| Key {
            attempt: failures + 1,
            prev: bucket,
            ..key
        };

        if kernel.width() == 1 {
            let o = kernel.first;
            self.push(t + o, next(self.bucket(o)), count);
        } else if count <= SMALL_COHORT {
            let ctx = RetryContext {
                failures,
                previous_delay,
                health,
                retry_after: None,
            };
            for _ in 0..count {
                let delay = policy.next_delay(ctx, true, rng).expect("attempts are left");
                let o = landing_offset(delay);
                self.push(t + o, next(self.bucket(o)), 1);
            }
        } else if kernel.width() <= NARROW_SPREAD {
            let (mut left, mut rest) = (count, 1.0f64);
            for o in kernel.first..=kernel.last {
                if left == 0 {
                    break;
                }
                let p = kernel.prob(o);
                let n = if o == kernel.last || p >= rest {
                    left
                } else {
                    binomial(rng, left, p / rest)
                };
                rest -= p;
                left -= n;
                if n > 0 {
                    self.push(t + o, next(self.bucket(o)), n);
                }
            }
        } else {
            self.pools
                .entry((key.shard, failures + 1, key.initial, key.given_up))
                .or_default()
                .add(t, count, &kernel);
        }
    }

    fn next_second(&self, t: u64) -> Option<u64> {
        let traffic = self.cfg.first_attempt_rps > 0 && t < self.cfg.traffic_seconds;
        if traffic || self.pools.values().any(|p| p.pending > 0) || self.waiting() > 0 {
            return Some(t + 1);
        }
        self.pending.keys().next().copied()
    }

    fn run(&mut self, progress: &mut dyn FnMut(Progress)) {
        let cfg = self.cfg;
        let horizon = cfg.horizon_bound();
        // t = 0: the population has just failed its first attempt.
        let mut streams = Streams::new(cfg, 0);
        self.total_attempts = cfg.population;
        self.health.record(0, 0, cfg.population);
        let health = self.health_now(0);
        for shard in 0..cfg.shards {
            let n = share(cfg.population, cfg.shards, shard);
            if n > 0 {
                let key = Key {
                    shard,
                    attempt: 1,
                    prev: 0,
                    initial: true,
                    given_up: false,
                };
                self.fail(key, n, 0, health, streams.get(shard));
            }
        }
        self.after_protection(0, 0, cfg.population);
        self.record_second(0, 0, 0, 0);

        let mut t = 0;
        let mut reported = 0;
        while let Some(next) = self.next_second(t) {
            t = next;
            self.step(t);
            if t / 1024 != reported {
                reported = t / 1024;
                progress(Progress { second: t, horizon });
            }
        }
        progress(Progress {
            second: horizon,
            horizon,
        });
    }

    fn step(&mut self, t: u64) {
        let cfg = self.cfg;
        let mut streams = Streams::new(cfg, t);
        let mut offered = self.pending.remove(&t).unwrap_or_default();
        for (&(shard, attempt, initial, given_up), pool) in self.pools.iter_mut() {
            if let Some((n, mean_offset)) = pool.land(t, streams.get(shard)) {
                if n > 0 {
                    let prev = if self.decorrelated {
                        mean_offset.round().max(1.0) as u64
                    } else {
                        0
                    };
                    offered.push((
                        Key {
                            shard,
                            attempt,
                            prev: prev as u32,
                            initial,
                            given_up,
                        },
                        n,
                    ));
                }
            }
        }
        if self.decorrelated {
            for (key, _) in offered.iter_mut().filter(|(k, _)| k.prev > 0) {
                key.prev = self.bucket(key.prev as u64);
            }
        }
        if cfg.first_attempt_rps > 0 && (1..=cfg.traffic_seconds).contains(&t) {
            for shard in 0..cfg.shards {
                let n = share(cfg.first_attempt_rps, cfg.shards, shard);
                if n > 0 {
                    offered.push((
                        Key {
                            shard,
                            attempt: 1,
                            prev: 0,
                            initial: false,
                            given_up: false,
                        },
                        n,
                    ));
                }
            }
        }
        offered.sort_unstable_by_key(|(k, _)| *k);
        offered.dedup_by(|(k, n), (k0, n0)| {
            let same = k == k0;
            if same {
                *n0 += *n;
            }
            same
        });

        let offered = self.protect(t, offered);
        let total: u64 = offered.iter().map(|(_, n)| n).sum();
        let served = total.min(cfg.capacity.at(t));
        let failed = total - served;
        // Which offered attempts fail is uniformly random: a multivariate hypergeometric split.
        let (mut left_total, mut left_failed) = (total, failed);
        let mut failures = Vec::new();
        for (key, n) in offered {
            let x = hypergeometric(&mut self.consumer, left_total, n, left_failed);
            left_total -= n;
            left_failed -= x;
            let ok = n - x;
            self.delivered += ok;
            if key.initial && ok > 0 {
                self.delivered_initial.push((t, ok));
            }
            if let Some(series) = self.shard_offered.get_mut(key.shard as usize) {
                series.resize(t as usize + 1, 0);
                series[t as usize] += n;
            }
            if x > 0 {
                failures.push((key, x));
            }
        }
        self.total_attempts += total;
        self.health.record(t, served, total);
        let health = self.health_now(t);
        for (key, x) in failures {
            self.fail(key, x, t, health, streams.get(key.shard));
        }
        self.after_protection(t, served, failed);
        self.record_second(t, total, served, failed);
    }

    fn record_second(&mut self, t: u64, offered: u64, served: u64, failed: u64) {
        let len = t as usize + 1;
        let s = &mut self.series;
        s.offered.resize(len, 0);
        s.served.resize(len, 0);
        s.failed.resize(len, 0);
        let from = s.capacity.len() as u64;
        s.capacity.extend((from..=t).map(|u| self.cfg.capacity.at(u)));
        s.offered[t as usize] = offered;
        s.served[t as usize] = served;
        s.failed[t as usize] = failed;
        if self.breaker.is_some() || self.limiter.is_some() {
            let waiting = self.waiting();
            self.series.waiting.resize(len, 0);
            self.series.waiting[t as usize] = waiting;
        }
    }

    fn report(mut self) -> StormReport {
        let drain = self.series.offered.iter().rposition(|n| *n > 0).unwrap_or(0) as u64;
        let len = drain as usize + 1;
        for v in [
            &mut self.series.offered,
            &mut self.series.served,
            &mut self.series.failed,
            &mut self.series.capacity,
            &mut self.series.waiting,
        ] {
            v.truncate(len);
        }
        for v in &mut self.shard_offered {
            v.resize(len, 0);
        }
        let (mut peak, mut peak_second) = (0, 0);
        for (t, n) in self.series.offered.iter().enumerate() {
            if *n > peak {
                (peak, peak_second) = (*n, t as u64);
            }
        }
        let delivered_initial: u64 = self.delivered_initial.iter().map(|(_, n)| n).sum();
        let (mean, p99) = if delivered_initial == 0 {
            (None, None)
        } else {
            let sum: f64 = self.delivered_initial.iter().map(|(t, n)| *t as f64 * *n as f64).sum();
            let mut cumulative = 0u128;
            let mut p99 = 0;
            for (t, n) in &self.delivered_initial {
                cumulative += *n as u128;
                if cumulative * 100 >= delivered_initial as u128 * 99 {
                    p99 = *t;
                    break;
                }
            }
            (Some(sum / delivered_initial as f64), Some(p99))
        };
        StormReport {
            policy: self.cfg.policy_label.clone(),
            jitter: self.cfg.policy.jitter.label(),
            population: self.cfg.population,
            seed: self.cfg.seed,
            shards: self.cfg.shards,
            peak_offered_rps: peak,
            peak_second,
            total_attempts: self.total_attempts,
            delivered: self.delivered,
            dead: self.dead,
            drain_seconds: drain,
            mean_delivery_seconds: mean,
            p99_delivery_seconds: p99,
            protection: self.cfg.protection_label(),
            breaker_openings: self.breaker.as_ref().map_or(0, |b| b.openings),
            peak_waiting: self.series.waiting.iter().copied().max().unwrap_or(0),
            series: self.series,
            shard_offered: self.shard_offered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_two_equal_cohorts_when_half_fail_then_the_failures_split_evenly_on_average() {
        let mut rng = StdRng::seed_from_u64(1);
        for (total, sample) in [
            (2_000u64, 1_000u64),
            (2_000_000_000, 1_999_999_000),
            (10_000, 3),
            (2_000_000_000, 7),
            (2_000_000_000, 500_000),
        ] {
            let marked = total / 2;
            let runs = 400;
            let mean = (0..runs)
                .map(|_| hypergeometric(&mut rng, total, marked, sample) as f64)
                .sum::<f64>()
                / runs as f64;
            let expected = sample as f64 * marked as f64 / total as f64;
            let sd = (expected * 0.5).sqrt().max(0.5);
            assert!(
                (mean - expected).abs() < 5.0 * sd / (runs as f64).sqrt() + 1e-6,
                "{total} {sample}: {mean} vs {expected}"
            );
        }
        // A small cohort among a billion offered: a handful of failures, mean kept.
        let runs = 2_000;
        let mean = (0..runs)
            .map(|_| hypergeometric(&mut rng, 1_000_000_000, 10, 600_000_000) as f64)
            .sum::<f64>()
            / runs as f64;
        assert!((mean - 6.0).abs() < 0.2, "{mean}");
        let mean = (0..runs)
            .map(|_| hypergeometric(&mut rng, 1_000_000_000, 999_999_990, 600_000_000) as f64)
            .sum::<f64>()
            / runs as f64;
        assert!((mean - 599_999_994.0).abs() < 0.2, "{mean}");
        assert_eq!(hypergeometric(&mut rng, 10, 10, 4), 4);
        assert_eq!(hypergeometric(&mut rng, 10, 3, 10), 3);
    }
}
