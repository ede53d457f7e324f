//! The per-endpoint rate limit: a virtual scheduler (GCRA). Each attempt reserves a slot, the
//! one `interval` after the last reserved; an attempt whose slot is ahead waits for it (on the
//! queue, then a moment in its worker) and is sent then, without reserving again.
//!
//! The limiter may fall behind `now` by [`TOLERANCE`] and still hand out its next slot (one in
//! the past is sent at once): a worker a moment late keeps its place. So any one second holds
//! at most `rate × (1 + TOLERANCE)` attempts, and one: under the `rate × 1.1 + 1` promised.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// How far behind `now` the next slot may be before the limiter starts afresh at `now`.
pub const TOLERANCE: Duration = Duration::from_millis(50);

/// The slot for an attempt when the next free one is `next` (`None`: never reserved), and the
/// next free one after it.
pub fn reserve(next: Option<DateTime<Utc>>, interval: Duration, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    reserve_many(next, interval, now, 1)
}

/// [`reserve`] for `n` attempts at once (the storm calculator's cohorts): the first one's
/// slot, the rest each `interval` after the one before, and the next free after the last.
pub fn reserve_many(
    next: Option<DateTime<Utc>>,
    interval: Duration,
    now: DateTime<Utc>,
    n: u64,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let behind = now - chrono::Duration::from_std(TOLERANCE).unwrap_or_default();
    let slot = next.filter(|n| *n >= behind).unwrap_or(now);
    let span = interval.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
    (
        slot,
        slot + chrono::Duration::from_std(span).unwrap_or(chrono::TimeDelta::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_each_other_and_start_afresh_once_the_limiter_falls_behind() {
        let now: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        let ms = |n: i64| chrono::Duration::milliseconds(n);
        let every = Duration::from_millis(10);
        assert_eq!(reserve(None, every, now), (now, now + ms(10)));
        // Ahead: the next one, wherever now is.
        assert_eq!(reserve(Some(now + ms(500)), every, now), (now + ms(500), now + ms(510)));
        // A little behind: its place in the line, sent at once.
        assert_eq!(reserve(Some(now - ms(50)), every, now), (now - ms(50), now - ms(40)));
        // Far behind (idle): afresh at now, so an idle spell is not a burst later.
        assert_eq!(reserve(Some(now - ms(51)), every, now), (now, now + ms(10)));
    }

    #[test]
    fn no_second_holds_more_than_the_rate_a_tenth_and_one() {
        // Reservations as fast as they come, each at its own `now`, in a storm of 5 000.
        let start: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        let rate = 100u32;
        let every = Duration::from_secs(1) / rate;
        let mut next = None;
        let mut sent = Vec::new();
        for i in 0..5_000i64 {
            let now = start + chrono::Duration::microseconds(i * 1_700); // arrivals at ~588/s
            let (slot, after) = reserve(next, every, now);
            next = Some(after);
            sent.push(slot.max(now));
        }
        sent.sort();
        let window = chrono::Duration::seconds(1);
        let most = (0..sent.len())
            .map(|i| sent[i..].iter().take_while(|t| **t - sent[i] <= window).count())
            .max()
            .unwrap();
        assert!(most as f64 <= f64::from(rate) * 1.1 + 1.0, "{most} in one second");
    }
}
