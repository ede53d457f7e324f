//! Retry policies: how long to wait before each retry, with which jitter, and when to give
//! up. One implementation serves the delivery path and the storm calculator, so what the
//! calculator simulates is what production does. Everything here is pure: the caller passes
//! the RNG.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::health::adaptive_multiplier;

/// Seconds, as a float: jitter makes delays fractional.
pub type Seconds = f64;

/// How a nominal delay `d` is spread.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Jitter {
    /// Exactly `d`.
    None,
    /// `d × U(1 − p, 1 + p)` (±10 % is `p = 0.1`).
    Proportional(f64),
    /// `d + U(0, p × d)` (`p = 0.1` by default).
    Additive(f64),
    /// `U(0, d)` (AWS's "full jitter").
    Full,
    /// `d/2 + U(0, d/2)` (AWS's "equal jitter").
    Equal,
    /// `min(cap, U(base, 3 × previous delay))` (AWS's "decorrelated jitter").
    Decorrelated,
}

impl Jitter {
    /// The names the CLI and config files accept for the parameterless strategies.
    pub const NAMES: [&'static str; 4] = ["none", "full", "equal", "decorrelated"];

    pub fn validate(self) -> Result<Self, ValidationError> {
        match self {
            Jitter::Proportional(p) | Jitter::Additive(p) if !(p > 0.0 && p <= 1.0) => Err(ValidationError::new(
                "invalid_jitter",
                format!("jitter fraction {p} must be greater than 0 and at most 1"),
            )),
            j => Ok(j),
        }
    }

    /// A strategy named on a command line: `none`, `full`, `equal`, `decorrelated`,
    /// `proportional:P` or `additive:P`.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let fraction = |p: &str| {
            p.parse::<f64>()
                .map_err(|_| ValidationError::new("invalid_jitter", format!("`{p}` is not a number")))
        };
        let j = match s {
            "none" => Jitter::None,
            "full" => Jitter::Full,
            "equal" => Jitter::Equal,
            "decorrelated" => Jitter::Decorrelated,
            _ => match s.split_once(':') {
                Some(("proportional", p)) => Jitter::Proportional(fraction(p)?),
                Some(("additive", p)) => Jitter::Additive(fraction(p)?),
                _ => {
                    return Err(ValidationError::new(
                        "invalid_jitter",
                        format!(
                            "unknown jitter `{s}`: use none, full, equal, decorrelated, proportional:P or additive:P"
                        ),
                    ))
                }
            },
        };
        j.validate()
    }

    pub fn label(self) -> String {
        match self {
            Jitter::None => "none".into(),
            Jitter::Proportional(p) => format!("proportional:{p}"),
            Jitter::Additive(p) => format!("additive:{p}"),
            Jitter::Full => "full".into(),
            Jitter::Equal => "equal".into(),
            Jitter::Decorrelated => "decorrelated".into(),
        }
    }
}

/// The nominal delays, before jitter.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// The delay before each retry, in seconds: `[60, 300]` means three attempts in all.
    Delays(Vec<u64>),
    /// The exponential formula: the retry after `k` failures waits `min(base × 2^(k−1) + jitter, max)`.
    Exponential {
        base_seconds: u64,
        max_delay_seconds: u64,
        max_attempts: u32,
    },
}

/// A retry policy: schedule, jitter, and whether endpoint health scales the delays.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// `Some` for the named policies, which are stored and shown by name.
    pub name: Option<&'static str>,
    pub schedule: Schedule,
    pub jitter: Jitter,
    pub adaptive: bool,
}

/// A uniform range a jittered delay is drawn from (`lo == hi` when there is no jitter).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DelayRange {
    pub lo: Seconds,
    pub hi: Seconds,
}

impl DelayRange {
    pub fn fixed(d: Seconds) -> Self {
        Self { lo: d, hi: d }
    }

    pub fn sample(self, rng: &mut impl Rng) -> Seconds {
        if self.hi > self.lo {
            rng.random_range(self.lo..self.hi)
        } else {
            self.lo
        }
    }
}

/// What is known when a retry is planned.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryContext {
    /// Attempts made and failed so far (at least 1).
    pub failures: u32,
    /// The delay actually waited before the attempt that just failed, if it was a retry.
    pub previous_delay: Option<Seconds>,
    /// The endpoint's health score, if it has any history.
    pub health: Option<f64>,
    /// The endpoint's `Retry-After`, if it sent one with a 429 or 503.
    pub retry_after: Option<Seconds>,
}

pub const POLICY_NAMES: [&str; 3] = ["standard", "ledger", "exponential"];

impl RetryPolicy {
    /// The standard table: 8 attempts, after 1 min, 5 min, 30 min, 2 h, 8 h, 24 h, 48 h;
    /// jitter `+U(0, 0.1 × d)`; adaptive.
    pub fn standard() -> Self {
        Self {
            name: Some("standard"),
            schedule: Schedule::Delays(vec![60, 300, 1_800, 7_200, 28_800, 86_400, 172_800]),
            jitter: Jitter::Additive(0.1),
            adaptive: true,
        }
    }

    /// Retries after 1 min, 5 min, 30 min, 2 h, 12 h (dead ~14.6 h after the first
    /// attempt); ±10 % jitter; not adaptive.
    pub fn ledger() -> Self {
        Self {
            name: Some("ledger"),
            schedule: Schedule::Delays(vec![60, 300, 1_800, 7_200, 43_200]),
            jitter: Jitter::Proportional(0.1),
            adaptive: false,
        }
    }

    /// The exponential formula: base 60 s doubling, capped at 24 h, 15 attempts (~4.4 days).
    pub fn exponential() -> Self {
        Self {
            name: Some("exponential"),
            schedule: Schedule::Exponential {
                base_seconds: 60,
                max_delay_seconds: 86_400,
                max_attempts: 15,
            },
            jitter: Jitter::Additive(0.1),
            adaptive: true,
        }
    }

    pub fn named(name: &str) -> Result<Self, ValidationError> {
        match name {
            "standard" => Ok(Self::standard()),
            "ledger" => Ok(Self::ledger()),
            "exponential" => Ok(Self::exponential()),
            other => Err(ValidationError::new(
                "unknown_retry_policy",
                format!("unknown retry policy `{other}`: use one of standard, ledger, exponential, or a custom {{\"schedule_seconds\": [...]}}"),
            )),
        }
    }

    pub const MAX_RETRIES: usize = 50;
    pub const MAX_DELAY_SECONDS: u64 = 30 * 86_400;

    /// A custom policy: the delay before each retry, a jitter strategy, adaptive or not.
    pub fn custom(schedule_seconds: Vec<u64>, jitter: Jitter, adaptive: bool) -> Result<Self, ValidationError> {
        if schedule_seconds.len() > Self::MAX_RETRIES {
            return Err(ValidationError::new(
                "invalid_retry_policy",
                format!(
                    "schedule_seconds has {} delays; at most {} retries are allowed",
                    schedule_seconds.len(),
                    Self::MAX_RETRIES
                ),
            ));
        }
        if let Some(d) = schedule_seconds.iter().find(|d| **d > Self::MAX_DELAY_SECONDS) {
            return Err(ValidationError::new(
                "invalid_retry_policy",
                format!("a delay of {d} s is longer than the 30 days (2592000 s) allowed"),
            ));
        }
        Ok(Self {
            name: None,
            schedule: Schedule::Delays(schedule_seconds),
            jitter: jitter.validate()?,
            adaptive,
        })
    }

    /// The same policy with another jitter (the storm calculator compares strategies).
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Attempts in all, the first included.
    pub fn max_attempts(&self) -> u32 {
        match &self.schedule {
            Schedule::Delays(d) => d.len() as u32 + 1,
            Schedule::Exponential { max_attempts, .. } => *max_attempts,
        }
    }

    /// The nominal delay (no jitter) before the attempt that follows `failures` failed
    /// attempts; `None` when that was the last attempt.
    pub fn base_delay(&self, failures: u32) -> Option<Seconds> {
        if failures == 0 || failures >= self.max_attempts() {
            return None;
        }
        match &self.schedule {
            Schedule::Delays(d) => Some(d[failures as usize - 1] as f64),
            Schedule::Exponential {
                base_seconds,
                max_delay_seconds,
                ..
            } => {
                let d = *base_seconds as f64 * 2f64.powi(failures as i32 - 1);
                Some(d.min(*max_delay_seconds as f64))
            }
        }
    }

    /// The longest delay this policy waits: `Retry-After` and decorrelated jitter are capped here.
    pub fn max_delay(&self) -> Seconds {
        match &self.schedule {
            Schedule::Delays(d) => d.iter().copied().max().unwrap_or(0) as f64,
            Schedule::Exponential { max_delay_seconds, .. } => *max_delay_seconds as f64,
        }
    }

    /// The uniform range the jittered delay after `failures` failures is drawn from.
    /// `previous_delay` matters only to decorrelated jitter.
    pub fn delay_range(&self, failures: u32, previous_delay: Option<Seconds>) -> Option<DelayRange> {
        let d = self.base_delay(failures)?;
        let range = match self.jitter {
            Jitter::None => DelayRange::fixed(d),
            Jitter::Proportional(p) => DelayRange {
                lo: d * (1.0 - p),
                hi: d * (1.0 + p),
            },
            Jitter::Additive(p) => DelayRange {
                lo: d,
                hi: d * (1.0 + p),
            },
            Jitter::Full => DelayRange { lo: 0.0, hi: d },
            Jitter::Equal => DelayRange { lo: d / 2.0, hi: d },
            Jitter::Decorrelated => {
                let base = self.base_delay(1).unwrap_or(d);
                let prev = previous_delay.unwrap_or(base).max(base);
                return Some(DelayRange {
                    lo: base,
                    hi: (3.0 * prev).min(self.max_delay()).max(base),
                });
            }
        };
        Some(match self.schedule {
            // The jittered delay is capped: min(base × 2^n + jitter, max_delay).
            Schedule::Exponential { max_delay_seconds, .. } => {
                let cap = max_delay_seconds as f64;
                DelayRange {
                    lo: range.lo.min(cap),
                    hi: range.hi.min(cap),
                }
            }
            Schedule::Delays(_) => range,
        })
    }

    /// The delay before the next attempt, or `None` when the delivery is dead.
    /// Retries switched off for the tenant make every first failure final.
    pub fn next_delay(&self, ctx: RetryContext, retries_enabled: bool, rng: &mut impl Rng) -> Option<Seconds> {
        if !retries_enabled {
            return None;
        }
        let mut delay = self.delay_range(ctx.failures, ctx.previous_delay)?.sample(rng);
        if self.adaptive {
            delay *= adaptive_multiplier(ctx.health);
        }
        if let Some(asked) = ctx.retry_after {
            // Never sooner than the endpoint asked, but never past the policy's longest wait.
            delay = delay.max(asked.min(self.max_delay()));
        }
        Some(delay)
    }

    /// The longest a delivery can spend retrying on this policy, first attempt to last:
    /// every delay at the top of its jitter range, doubled by adaptive health at its worst,
    /// or raised by `Retry-After` to the policy's longest delay, whichever is more.
    pub fn longest_span(&self) -> Seconds {
        let adaptive = if self.adaptive { 2.0 } else { 1.0 };
        let mut previous = None;
        let mut total = 0.0;
        for failures in 1..self.max_attempts() {
            let range = self.delay_range(failures, previous).expect("within max_attempts");
            total += (range.hi * adaptive).max(self.max_delay());
            previous = Some(range.hi);
        }
        total
    }

    /// The longest time from the attempt that follows `failures` failed ones (the last of
    /// them `previous_delay` after the one before) to the schedule's last attempt: each delay
    /// at the top of its jitter range, doubled if adaptive (as an unhealthy endpoint's are),
    /// `Retry-After` aside. A delivery the circuit breaker holds makes its last attempt then.
    pub fn remaining_span(&self, failures: u32, previous_delay: Option<Seconds>) -> Seconds {
        let adaptive = if self.adaptive { 2.0 } else { 1.0 };
        let mut previous = previous_delay;
        let mut total = 0.0;
        for f in failures + 1..self.max_attempts() {
            let Some(range) = self.delay_range(f, previous) else {
                break;
            };
            total += range.hi * adaptive;
            previous = Some(range.hi);
        }
        total
    }

    /// The schedule with jitter off: (attempt, delay before it, time since the first attempt).
    pub fn nominal_schedule(&self) -> Vec<(u32, Seconds, Seconds)> {
        let mut rows = vec![(1, 0.0, 0.0)];
        let mut total = 0.0;
        for failures in 1..self.max_attempts() {
            let d = self.base_delay(failures).expect("within max_attempts");
            total += d;
            rows.push((failures + 1, d, total));
        }
        rows
    }

    pub fn label(&self) -> String {
        self.name.map(str::to_owned).unwrap_or_else(|| "custom".into())
    }
}

/// The form a policy takes in the API, in config files and in storage: a name, or a custom
/// schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PolicySpec {
    Named(String),
    Custom {
        schedule_seconds: Vec<u64>,
        jitter: Jitter,
        adaptive: bool,
    },
}

/// The custom form's fields, strictly: a misspelt field is an error that names it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomSpec {
    schedule_seconds: Vec<u64>,
    #[serde(default = "default_custom_jitter")]
    jitter: Jitter,
    #[serde(default)]
    adaptive: bool,
}

fn default_custom_jitter() -> Jitter {
    Jitter::None
}

/// By the value's shape (a string or a map) rather than serde's untagged trial and error,
/// whose only error is "did not match any variant": a bad custom policy says which field is
/// wrong and why, in the API, in config files and on the command line alike.
impl<'de> Deserialize<'de> for PolicySpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SpecVisitor;
        impl<'de> serde::de::Visitor<'de> for SpecVisitor {
            type Value = PolicySpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a policy name (\"standard\", \"ledger\", \"exponential\") or a custom policy \
                     {\"schedule_seconds\": [...], \"jitter\": ..., \"adaptive\": ...}",
                )
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<PolicySpec, E> {
                Ok(PolicySpec::Named(name.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<PolicySpec, A::Error> {
                let c = CustomSpec::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(PolicySpec::Custom {
                    schedule_seconds: c.schedule_seconds,
                    jitter: c.jitter,
                    adaptive: c.adaptive,
                })
            }
        }
        d.deserialize_any(SpecVisitor)
    }
}

impl TryFrom<PolicySpec> for RetryPolicy {
    type Error = ValidationError;
    fn try_from(spec: PolicySpec) -> Result<Self, Self::Error> {
        match spec {
            PolicySpec::Named(name) => RetryPolicy::named(&name),
            PolicySpec::Custom {
                schedule_seconds,
                jitter,
                adaptive,
            } => RetryPolicy::custom(schedule_seconds, jitter, adaptive),
        }
    }
}

impl From<RetryPolicy> for PolicySpec {
    fn from(p: RetryPolicy) -> Self {
        if let Some(name) = p.name {
            return PolicySpec::Named(name.to_owned());
        }
        // A custom policy is a list of delays; a formula is written out as one.
        let schedule_seconds = (1..p.max_attempts())
            .filter_map(|k| p.base_delay(k))
            .map(|d| d as u64)
            .collect();
        PolicySpec::Custom {
            schedule_seconds,
            jitter: p.jitter,
            adaptive: p.adaptive,
        }
    }
}

// Stored and shown as its spec: a name, or a custom schedule.
impl Serialize for RetryPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        PolicySpec::from(self.clone()).serialize(s)
    }
}

impl<'de> Deserialize<'de> for RetryPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spec = PolicySpec::deserialize(d)?;
        RetryPolicy::try_from(spec).map_err(serde::de::Error::custom)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::standard()
    }
}
