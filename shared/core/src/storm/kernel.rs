//! Where a retry lands: a delay `d` drawn uniformly from the policy's [`DelayRange`] puts the
//! next attempt `max(1, ceil(d))` whole seconds after the failure. The distribution of that
//! offset is piecewise constant: a partial first second, full seconds, a partial last second.

use crate::policy::{DelayRange, Seconds};

/// The landing offset of a delay: never the second of the failure itself.
pub fn landing_offset(delay: Seconds) -> u64 {
    (delay.ceil().max(1.0)) as u64
}

/// The distribution of landing offsets for one range of delays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kernel {
    pub range: DelayRange,
    /// The smallest and largest offsets with any probability.
    pub first: u64,
    pub last: u64,
}

impl Kernel {
    pub fn new(range: DelayRange) -> Self {
        let first = landing_offset(range.lo);
        // A draw is in [lo, hi): hi itself is never drawn, but the seconds up to it are.
        let last = if range.hi > range.lo {
            landing_offset(range.hi).max(first)
        } else {
            first
        };
        Self { range, first, last }
    }

    pub fn width(&self) -> u64 {
        self.last - self.first + 1
    }

    /// The probability that the retry lands `offset` seconds after the failure.
    pub fn prob(&self, offset: u64) -> f64 {
        if offset < self.first || offset > self.last {
            return 0.0;
        }
        let DelayRange { lo, hi } = self.range;
        if hi <= lo {
            return 1.0;
        }
        // Delays in (offset − 1, offset] land at `offset`; everything up to 1 s lands at 1.
        let lower = if offset == 1 {
            f64::NEG_INFINITY
        } else {
            offset as f64 - 1.0
        };
        let upper = offset as f64;
        ((upper.min(hi) - lower.max(lo)).max(0.0)) / (hi - lo)
    }

    /// The distribution as at most three runs `(from, to, probability of each offset)`.
    pub fn segments(&self) -> Vec<(u64, u64, f64)> {
        let mut out = vec![(self.first, self.first, self.prob(self.first))];
        if self.last > self.first {
            if self.last > self.first + 1 {
                let mid = self.first + 1;
                out.push((mid, self.last - 1, self.prob(mid)));
            }
            out.push((self.last, self.last, self.prob(self.last)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_no_jitter_when_landing_then_one_offset_with_certainty() {
        let k = Kernel::new(DelayRange::fixed(4.0));
        assert_eq!((k.first, k.last, k.prob(4)), (4, 4, 1.0));
        let zero = Kernel::new(DelayRange::fixed(0.0));
        assert_eq!(
            (zero.first, zero.prob(1)),
            (1, 1.0),
            "a retry never lands in its failure's second"
        );
    }

    #[test]
    fn given_a_range_when_landing_then_the_offsets_sum_to_one() {
        for range in [
            DelayRange { lo: 0.0, hi: 8.0 },
            DelayRange { lo: 60.0, hi: 66.0 },
            DelayRange { lo: 0.3, hi: 2.7 },
            DelayRange { lo: 54.0, hi: 66.0 },
        ] {
            let k = Kernel::new(range);
            let total: f64 = (k.first..=k.last).map(|o| k.prob(o)).sum();
            assert!((total - 1.0).abs() < 1e-12, "{range:?}: {total}");
            let seg: f64 = k.segments().iter().map(|(a, b, p)| (b - a + 1) as f64 * p).sum();
            assert!((seg - 1.0).abs() < 1e-12);
        }
        let full = Kernel::new(DelayRange { lo: 0.0, hi: 4.0 });
        assert_eq!((full.first, full.last), (1, 4));
        assert!((full.prob(1) - 0.25).abs() < 1e-12);
    }
}
