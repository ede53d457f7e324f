//! Endpoint health: the decayed share of recent attempts that succeeded, and the
//! multiplier the adaptive policy applies to a retry delay.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// How many recent attempts the score looks at.
pub const HEALTH_WINDOW: usize = 50;
/// Decay rate λ, per hour.
pub const DECAY_PER_HOUR: f64 = 0.1;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HealthSample {
    pub at: DateTime<Utc>,
    pub success: bool,
}

/// The last [`HEALTH_WINDOW`] attempts against one endpoint, oldest first, and when one last
/// succeeded (which may be before the window: what auto-disable goes by).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointHealth {
    pub samples: Vec<HealthSample>,
    #[serde(default)]
    pub last_success_at: Option<DateTime<Utc>>,
    /// The saves it has had, as read (0: none). A save is written only over the version it
    /// was read at (`Store::save_endpoint_health`), so two processes' saves never undo one
    /// another's samples.
    #[serde(default)]
    pub version: u64,
}

impl EndpointHealth {
    pub fn record(&mut self, sample: HealthSample) {
        self.note_success(&sample);
        self.samples.push(sample);
        if self.samples.len() > HEALTH_WINDOW {
            let excess = self.samples.len() - HEALTH_WINDOW;
            self.samples.drain(..excess);
        }
    }

    /// `samples` (recorded elsewhere, and not in these) added in time order, the window kept.
    pub fn merge(&mut self, samples: &[HealthSample]) {
        for s in samples {
            self.note_success(s);
        }
        self.samples.extend_from_slice(samples);
        self.samples.sort_by_key(|s| s.at);
        if self.samples.len() > HEALTH_WINDOW {
            let excess = self.samples.len() - HEALTH_WINDOW;
            self.samples.drain(..excess);
        }
    }

    fn note_success(&mut self, sample: &HealthSample) {
        if sample.success && self.last_success_at.is_none_or(|at| at < sample.at) {
            self.last_success_at = Some(sample.at);
        }
    }

    /// How many of the latest attempts failed, one after another.
    pub fn consecutive_failures(&self) -> u32 {
        self.samples.iter().rev().take_while(|s| !s.success).count() as u32
    }

    /// `health(e) = Σ 1[success] · e^(−λ·age) / |D_e|`; `None` with no history.
    pub fn score(&self, now: DateTime<Utc>) -> Option<f64> {
        if self.samples.is_empty() {
            return None;
        }
        let decayed: f64 = self
            .samples
            .iter()
            .filter(|s| s.success)
            .map(|s| {
                let age_hours = (now - s.at).num_milliseconds().max(0) as f64 / 3_600_000.0;
                (-DECAY_PER_HOUR * age_hours).exp()
            })
            .sum();
        Some(decayed / self.samples.len() as f64)
    }
}

/// The adaptive policy's step: ×0.5 when healthy (> 0.9), ×1 when degraded (> 0.5), ×2
/// otherwise; ×1 with no history.
pub fn adaptive_multiplier(health: Option<f64>) -> f64 {
    match health {
        None => 1.0,
        Some(h) if h > 0.9 => 0.5,
        Some(h) if h > 0.5 => 1.0,
        Some(_) => 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn multipliers_follow_the_health_bands() {
        assert_eq!(adaptive_multiplier(Some(0.95)), 0.5);
        assert_eq!(adaptive_multiplier(Some(0.7)), 1.0);
        assert_eq!(adaptive_multiplier(Some(0.3)), 2.0);
        assert_eq!(adaptive_multiplier(None), 1.0);
    }

    #[test]
    fn score_decays_with_age_and_counts_failures() {
        let now = Utc::now();
        let mut h = EndpointHealth::default();
        assert_eq!(h.score(now), None);
        h.record(HealthSample { at: now, success: true });
        h.record(HealthSample {
            at: now,
            success: false,
        });
        assert!((h.score(now).unwrap() - 0.5).abs() < 1e-9);

        let mut old = EndpointHealth::default();
        old.record(HealthSample {
            at: now - Duration::hours(10),
            success: true,
        });
        assert!((old.score(now).unwrap() - (-1.0f64).exp()).abs() < 1e-9);
    }

    #[test]
    fn merged_samples_go_in_time_order_and_the_window_holds() {
        let now = Utc::now();
        let at = |s: i64| now + Duration::seconds(s);
        let mut h = EndpointHealth::default();
        h.record(HealthSample {
            at: at(1),
            success: true,
        });
        h.record(HealthSample {
            at: at(3),
            success: true,
        });
        h.merge(&[HealthSample {
            at: at(2),
            success: false,
        }]);
        let times: Vec<_> = h.samples.iter().map(|s| s.at).collect();
        assert_eq!(times, vec![at(1), at(2), at(3)]);
        let many: Vec<_> = (10..70)
            .map(|s| HealthSample {
                at: at(s),
                success: false,
            })
            .collect();
        h.merge(&many);
        assert_eq!(h.samples.len(), HEALTH_WINDOW);
        assert_eq!(h.samples[0].at, at(20), "the oldest go first");
    }

    #[test]
    fn window_keeps_only_the_most_recent_attempts() {
        let now = Utc::now();
        let mut h = EndpointHealth::default();
        for _ in 0..HEALTH_WINDOW {
            h.record(HealthSample {
                at: now,
                success: false,
            });
        }
        for _ in 0..HEALTH_WINDOW {
            h.record(HealthSample { at: now, success: true });
        }
        assert_eq!(h.samples.len(), HEALTH_WINDOW);
        assert_eq!(h.score(now), Some(1.0));
    }
}
