//! Endpoint statistics: each endpoint's attempts counted by outcome and by latency, and its
//! deliveries that went dead, in five-minute buckets that add up. A process counts its own
//! attempts and adds them to the stored buckets now and then (`services::lookups`); a read
//! sums the buckets of a window into rates, percentiles and a series to chart.
//!
//! Latency is a histogram, not a list of samples, so that buckets from many processes add up
//! by counting alone (on DynamoDB, one `ADD` per write). A percentile is therefore the upper
//! bound of the histogram bin it falls in: `p95_ms: 500` reads "95 % of attempts took at most
//! 500 ms", and the true value lies above the bin below (250 ms).

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::ports::{SendErrorKind, SendOutcome};

/// A bucket's length.
pub const BUCKET_SECONDS: i64 = 300;
/// How long buckets are kept: the longest window, and a day more.
pub const STATS_RETENTION: TimeDelta = TimeDelta::days(8);
/// The latency bins' upper bounds, in milliseconds; the last bin is everything above.
pub const LATENCY_BOUNDS_MS: [u32; 10] = [25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000];
/// The bins: one per bound, and one above the last.
pub const LATENCY_BINS: usize = LATENCY_BOUNDS_MS.len() + 1;

/// What one bucket (or a sum of them) counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsCounts {
    /// Attempts answered 2xx.
    pub succeeded: u64,
    /// Attempts answered with another status: 4xx (429 included), then 5xx and the rest.
    pub http_4xx: u64,
    pub http_5xx: u64,
    /// Attempts that got no answer in time, and those that got none at all (connect, TLS,
    /// a blocked address...).
    pub timeout: u64,
    pub error: u64,
    /// Deliveries that went dead.
    pub dead: u64,
    /// Attempts by latency bin ([`LATENCY_BOUNDS_MS`]).
    pub latency: [u64; LATENCY_BINS],
}

impl StatsCounts {
    /// One attempt's outcome.
    pub fn attempt(outcome: &SendOutcome) -> Self {
        let mut c = Self::default();
        match (outcome.status_code, &outcome.error) {
            (Some(s), _) if (200..300).contains(&s) => c.succeeded = 1,
            (Some(s), _) if (400..500).contains(&s) => c.http_4xx = 1,
            (Some(_), _) => c.http_5xx = 1,
            (None, Some((SendErrorKind::Timeout, _))) => c.timeout = 1,
            (None, _) => c.error = 1,
        }
        c.latency[latency_bin(outcome.duration_ms)] = 1;
        c
    }

    /// A delivery that went dead.
    pub fn dead() -> Self {
        Self {
            dead: 1,
            ..Self::default()
        }
    }

    pub fn add(&mut self, other: &Self) {
        self.succeeded += other.succeeded;
        self.http_4xx += other.http_4xx;
        self.http_5xx += other.http_5xx;
        self.timeout += other.timeout;
        self.error += other.error;
        self.dead += other.dead;
        for (a, b) in self.latency.iter_mut().zip(other.latency) {
            *a += b;
        }
    }

    pub fn attempts(&self) -> u64 {
        self.succeeded + self.http_4xx + self.http_5xx + self.timeout + self.error
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The upper bound of the bin the `p`-th percentile (0 to 1) of latency falls in (`None`
    /// for the last bin, which has none, or with no attempts).
    pub fn latency_percentile(&self, p: f64) -> Option<Option<u32>> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (p * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bin, count) in self.latency.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(LATENCY_BOUNDS_MS.get(bin).copied());
            }
        }
        Some(None)
    }
}

fn latency_bin(ms: u64) -> usize {
    LATENCY_BOUNDS_MS
        .iter()
        .position(|&bound| ms <= u64::from(bound))
        .unwrap_or(LATENCY_BOUNDS_MS.len())
}

/// The start of the bucket `at` falls in.
pub fn bucket_of(at: DateTime<Utc>) -> DateTime<Utc> {
    let secs = at.timestamp().div_euclid(BUCKET_SECONDS) * BUCKET_SECONDS;
    DateTime::from_timestamp(secs, 0).unwrap_or(at)
}

/// A window the API reads, and the step its series is charted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Hour,
    Day,
    Week,
}

impl Window {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        match s {
            "1h" => Ok(Self::Hour),
            "24h" => Ok(Self::Day),
            "7d" => Ok(Self::Week),
            _ => Err(ValidationError::new("invalid_window", "window must be 1h, 24h or 7d")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "1h",
            Self::Day => "24h",
            Self::Week => "7d",
        }
    }

    pub fn length(self) -> TimeDelta {
        match self {
            Self::Hour => TimeDelta::hours(1),
            Self::Day => TimeDelta::hours(24),
            Self::Week => TimeDelta::days(7),
        }
    }

    /// The series' step: 12, 24 or 28 points.
    pub fn step(self) -> TimeDelta {
        match self {
            Self::Hour => TimeDelta::minutes(5),
            Self::Day => TimeDelta::hours(1),
            Self::Week => TimeDelta::hours(6),
        }
    }
}

/// A window's figures, summed from its buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub window: Window,
    /// The first step's start (the window's start, on a step's boundary) and the window's end.
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub total: StatsCounts,
    /// Each step's counts, oldest first, every step present.
    pub series: Vec<(DateTime<Utc>, StatsCounts)>,
}

impl Summary {
    /// Sum `buckets` (each with its start) into the window ending at `now`. A bucket outside
    /// it is left out.
    pub fn of(window: Window, now: DateTime<Utc>, buckets: &[(DateTime<Utc>, StatsCounts)]) -> Self {
        let step = window.step();
        let step_secs = step.num_seconds();
        let last = DateTime::from_timestamp(now.timestamp().div_euclid(step_secs) * step_secs, 0).unwrap_or(now);
        let steps = window.length().num_seconds() / step_secs;
        let from = last - step * (steps as i32 - 1);
        let mut series: Vec<(DateTime<Utc>, StatsCounts)> = (0..steps)
            .map(|i| (from + step * i as i32, StatsCounts::default()))
            .collect();
        let mut total = StatsCounts::default();
        for (start, counts) in buckets {
            if *start < from || *start > now {
                continue;
            }
            let i = ((*start - from).num_seconds() / step_secs) as usize;
            if let Some((_, c)) = series.get_mut(i) {
                c.add(counts);
                total.add(counts);
            }
        }
        Self {
            window,
            from,
            to: now,
            total,
            series,
        }
    }

    /// The share of attempts that succeeded, `None` with none.
    pub fn success_rate(&self) -> Option<f64> {
        let n = self.total.attempts();
        (n > 0).then(|| self.total.succeeded as f64 / n as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(status: Option<u16>, ms: u64) -> SendOutcome {
        SendOutcome {
            status_code: status,
            error: status.is_none().then(|| (SendErrorKind::Timeout, "timed out".into())),
            response_excerpt: None,
            duration_ms: ms,
            retry_after: None,
        }
    }

    #[test]
    fn attempts_are_counted_by_outcome_and_latency_bin() {
        let mut c = StatsCounts::default();
        for (status, ms) in [
            (Some(200), 10),
            (Some(204), 30),
            (Some(404), 80),
            (Some(503), 400),
            (None, 31_000),
        ] {
            c.add(&StatsCounts::attempt(&outcome(status, ms)));
        }
        assert_eq!(
            (c.succeeded, c.http_4xx, c.http_5xx, c.timeout, c.error),
            (2, 1, 1, 1, 0)
        );
        assert_eq!(c.attempts(), 5);
        assert_eq!(c.latency, [1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn a_percentile_is_the_upper_bound_of_its_bin() {
        let mut c = StatsCounts::default();
        for ms in (0..100).map(|i| {
            if i < 90 {
                20
            } else if i < 99 {
                400
            } else {
                40_000
            }
        }) {
            c.add(&StatsCounts::attempt(&outcome(Some(200), ms)));
        }
        assert_eq!(c.latency_percentile(0.5), Some(Some(25)));
        assert_eq!(c.latency_percentile(0.95), Some(Some(500)));
        assert_eq!(c.latency_percentile(0.99), Some(Some(500)));
        assert_eq!(c.latency_percentile(1.0), Some(None), "above the last bound");
        assert_eq!(StatsCounts::default().latency_percentile(0.5), None);
    }

    #[test]
    fn a_window_sums_its_buckets_into_steps_and_leaves_out_the_rest() {
        let now: DateTime<Utc> = "2026-12-06T10:07:00Z".parse().unwrap();
        let at = |s: &str| -> DateTime<Utc> { s.parse().unwrap() };
        let one = StatsCounts::attempt(&outcome(Some(200), 10));
        let buckets = [
            (at("2026-12-06T09:00:00Z"), one), // before the hour's first step
            (at("2026-12-06T09:10:00Z"), one),
            (at("2026-12-06T10:05:00Z"), one),
            (at("2026-12-06T10:05:00Z"), StatsCounts::dead()),
        ];
        let s = Summary::of(Window::Hour, now, &buckets);
        assert_eq!(s.series.len(), 12);
        assert_eq!(s.from, at("2026-12-06T09:10:00Z"));
        assert_eq!(s.total.attempts(), 2);
        assert_eq!(s.total.dead, 1);
        assert_eq!(s.series[0].1.attempts(), 1);
        assert_eq!(s.series[11].1.dead, 1);
        assert_eq!(s.success_rate(), Some(1.0));
        let week = Summary::of(Window::Week, now, &buckets);
        assert_eq!(week.series.len(), 28);
        assert_eq!(week.total.attempts(), 3);
        assert_eq!(bucket_of(at("2026-12-06T10:07:59Z")), at("2026-12-06T10:05:00Z"));
    }
}
