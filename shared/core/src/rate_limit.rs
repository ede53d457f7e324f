//! The per-endpoint rate limit: two lines of slots `interval` apart, each a virtual scheduler
//! (GCRA), shared by every worker and process on the store.
//!
//! - The **send line**: every attempt takes its turn there as it is about to be sent, the
//!   line's next free slot (or `now`, once the line has fallen more than [`TOLERANCE`]
//!   behind). An attempt whose turn is within [`SLOT_WAIT`] waits for it in its worker and
//!   goes. So any one second holds at most `rate × (1 + TOLERANCE)` attempts, and one (under
//!   the `rate × 1.1 + 1` promised), however late or bunched the attempts arrive.
//! - The **backlog line** orders the new attempts the send line has no turn for yet: each
//!   gets a slot there and goes back on the queue to arrive a little before it, then takes its
//!   turn on the send line. A new attempt joins the backlog while the backlog holds a slot at
//!   or after the turn it would take, so the attempts already waiting go first, unless that
//!   turn is free now (it would go unused). A slot follows the last one given, or is the send
//!   line's next turn if that is later.
//!
//! An attempt back from the backlog takes the send line's next turn, whenever it comes: a
//! late pickup (its workers busy elsewhere) costs the endpoint little of its rate, where one
//! line alone would send it to the back again, and every late attempt again (a livelock).
//! If late ones bunched up and the send line is full, it comes back for the send line's next
//! turn, not the backlog's end, so no turn goes unused while attempts wait.
//!
//! The turn is reckoned from the `now` the attempt asked at. A store that answers more than
//! [`TOLERANCE`] after the turn (a contended write tried again) spends it: the attempt asks
//! once more, as it first asked, and keeps that answer (`Services::wait_for_slot`), as sent
//! then it would land on the turns given after it.
//!
//! A backlog none of whose attempts has come back for [`BACKLOG_GONE`] is taken for gone
//! (its deliveries were settled some other way): new attempts neither wait behind it nor
//! follow its last slot.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

/// How far behind `now` a line's next slot may be before the line starts afresh at `now`.
pub const TOLERANCE: Duration = Duration::from_millis(50);

/// The longest a worker waits for an attempt's turn; one further ahead goes back on the queue
/// (which delays in whole seconds) to arrive up to this much before its slot.
pub const SLOT_WAIT: Duration = Duration::from_secs(1);

/// How long a backlog may go without an attempt coming back from it before it is taken for
/// gone: longer than a pickup is late (seconds) and the second an attempt comes early.
pub const BACKLOG_GONE: Duration = Duration::from_secs(15);

/// An endpoint's two lines (`None`: never used).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lines {
    /// The send line's next free turn.
    pub next_turn: Option<DateTime<Utc>>,
    /// The backlog's last slot given.
    pub last_slot: Option<DateTime<Utc>>,
    /// When an attempt last came back from the backlog and took its turn, or the backlog
    /// last started afresh.
    pub alive: Option<DateTime<Utc>>,
}

/// How an attempt comes to the limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// For the first time: it goes behind any backlog.
    New,
    /// Back from the backlog, its slot due (or gone by).
    FromBacklog,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send at this time (now, or within [`SLOT_WAIT`]).
    SendAt(DateTime<Utc>),
    /// Come back for this slot of the backlog.
    Wait(DateTime<Utc>),
}

/// The verdict on an attempt arriving at `now`, and the lines after it.
pub fn admit(lines: Lines, interval: Duration, now: DateTime<Utc>, arrival: Arrival) -> (Verdict, Lines) {
    let interval = TimeDelta::from_std(interval).unwrap_or(TimeDelta::MAX);
    let turn = next_free(lines.next_turn, now);
    let within_wait = turn - now <= TimeDelta::from_std(SLOT_WAIT).unwrap_or_default();
    if arrival == Arrival::FromBacklog {
        if !within_wait {
            return (Verdict::Wait(turn), lines);
        }
        let (next_turn, alive) = (Some(turn + interval), Some(now));
        return (
            Verdict::SendAt(turn),
            Lines {
                next_turn,
                alive,
                ..lines
            },
        );
    }
    let gone = now - TimeDelta::from_std(BACKLOG_GONE).unwrap_or_default();
    let backlog = lines.last_slot.filter(|_| lines.alive.is_some_and(|at| at > gone));
    let behind_backlog = turn > now && backlog.is_some_and(|last| last >= turn);
    if within_wait && !behind_backlog {
        let next_turn = Some(turn + interval);
        return (Verdict::SendAt(turn), Lines { next_turn, ..lines });
    }
    let (slot, alive) = match backlog {
        Some(last) if last >= turn => (last + interval, lines.alive),
        // Afresh at the send line's next turn: alive from now.
        _ => (turn, Some(now)),
    };
    let last_slot = Some(slot);
    (
        Verdict::Wait(slot),
        Lines {
            last_slot,
            alive,
            ..lines
        },
    )
}

/// A line's next free slot at `now`.
fn next_free(next: Option<DateTime<Utc>>, now: DateTime<Utc>) -> DateTime<Utc> {
    let behind = now - TimeDelta::from_std(TOLERANCE).unwrap_or_default();
    next.filter(|n| *n >= behind).unwrap_or(now)
}

/// `n` attempts joining one line at once (the storm calculator's cohorts): the first one's
/// slot, the rest each `interval` after the one before, and the next free after the last.
pub fn reserve_many(
    next: Option<DateTime<Utc>>,
    interval: Duration,
    now: DateTime<Utc>,
    n: u64,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let slot = next_free(next, now);
    let span = interval.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
    (slot, slot + TimeDelta::from_std(span).unwrap_or(TimeDelta::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: i64) -> TimeDelta {
        TimeDelta::milliseconds(n)
    }

    fn t0() -> DateTime<Utc> {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn turns_follow_each_other_for_a_second_then_the_backlog_takes_the_rest_in_order() {
        let every = Duration::from_millis(250);
        let mut lines = Lines::default();
        let mut verdicts = Vec::new();
        for _ in 0..7 {
            let (verdict, after) = admit(lines, every, t0(), Arrival::New);
            verdicts.push(verdict);
            lines = after;
        }
        let send = |n| Verdict::SendAt(t0() + ms(n));
        let wait = |n| Verdict::Wait(t0() + ms(n));
        assert_eq!(
            verdicts,
            [
                send(0),
                send(250),
                send(500),
                send(750),
                send(1000),
                wait(1250),
                wait(1500)
            ]
        );
        // Back a second before its slot: it waits that second, in its turn.
        let (verdict, after) = admit(lines, every, t0() + ms(250), Arrival::FromBacklog);
        assert_eq!(verdict, send(1250));
        // A new one goes behind the backlog, though the send line has a turn free soon.
        let (verdict, _) = admit(after, every, t0() + ms(250), Arrival::New);
        assert_eq!(verdict, wait(1750));
    }

    #[test]
    fn an_attempt_back_late_takes_the_next_turn_and_an_idle_line_starts_afresh() {
        let every = Duration::from_millis(10);
        let now = t0();
        let lines = |next_turn| Lines {
            next_turn,
            last_slot: Some(now + ms(60_000)),
            alive: Some(now),
        };
        // Late, with the send line just used: the next turn, though the backlog is long.
        assert_eq!(
            admit(lines(Some(now + ms(5))), every, now, Arrival::FromBacklog).0,
            Verdict::SendAt(now + ms(5))
        );
        // A little behind: its place, sent at once.
        assert_eq!(
            admit(lines(Some(now - ms(50))), every, now, Arrival::FromBacklog).0,
            Verdict::SendAt(now - ms(50))
        );
        // Far behind (idle): afresh at now, so an idle spell is not a burst later.
        let (verdict, after) = admit(lines(Some(now - ms(51))), every, now, Arrival::FromBacklog);
        assert_eq!((verdict, after.next_turn), (Verdict::SendAt(now), Some(now + ms(10))));
        // The send line full (late ones bunched): back for its next turn, not the backlog's
        // end, the lines as they were.
        let full = lines(Some(now + ms(1_001)));
        assert_eq!(
            admit(full, every, now, Arrival::FromBacklog),
            (Verdict::Wait(now + ms(1_001)), full)
        );
        // A new one, though, goes to the backlog's end.
        assert_eq!(admit(full, every, now, Arrival::New).0, Verdict::Wait(now + ms(60_010)));
    }

    #[test]
    fn a_backlog_none_came_back_from_for_a_while_is_taken_for_gone() {
        let every = Duration::from_millis(100);
        let now = t0();
        let busy = |alive| Lines {
            next_turn: Some(now + ms(500)),
            last_slot: Some(now + ms(3_600_000)),
            alive: Some(alive),
        };
        // Alive: a new one waits behind it.
        let gone = TimeDelta::from_std(BACKLOG_GONE).unwrap();
        assert_eq!(
            admit(busy(now - gone + ms(1)), every, now, Arrival::New).0,
            Verdict::Wait(now + ms(3_600_100))
        );
        // Gone: it takes its turn, and when the send line is full starts the backlog afresh.
        assert_eq!(
            admit(busy(now - gone), every, now, Arrival::New).0,
            Verdict::SendAt(now + ms(500))
        );
        let full = Lines {
            next_turn: Some(now + ms(1_500)),
            ..busy(now - gone)
        };
        let (verdict, after) = admit(full, every, now, Arrival::New);
        assert_eq!(
            (verdict, after.last_slot, after.alive),
            (Verdict::Wait(now + ms(1_500)), Some(now + ms(1_500)), Some(now))
        );
    }

    #[test]
    fn no_second_holds_more_than_the_rate_a_tenth_and_one_however_late_attempts_come_back() {
        // A storm of 5 000 at ~588/s, rate 100/s: each new one admitted or given a backlog
        // slot; each of those comes back between 0 and 5 s after its slot (its workers busy
        // elsewhere), in the order it happens to arrive.
        let rate = 100u32;
        let every = Duration::from_secs(1) / rate;
        let mut lines = Lines::default();
        let mut sent = Vec::new();
        let mut arrivals: Vec<(DateTime<Utc>, Arrival)> = (0..5_000i64)
            .map(|i| (t0() + TimeDelta::microseconds(i * 1_700), Arrival::New))
            .collect();
        let mut late = 0i64;
        while let Some(i) = (0..arrivals.len()).min_by_key(|i| arrivals[*i].0) {
            let (now, arrival) = arrivals.swap_remove(i);
            let (verdict, after) = admit(lines, every, now, arrival);
            lines = after;
            match verdict {
                Verdict::SendAt(at) => sent.push(at.max(now)),
                Verdict::Wait(slot) => {
                    late = (late + 1_237) % 5_000;
                    arrivals.push((slot - ms(1_000) + ms(late), Arrival::FromBacklog));
                }
            }
        }
        sent.sort();
        let window = TimeDelta::seconds(1);
        let most = (0..sent.len())
            .map(|i| sent[i..].iter().take_while(|t| **t - sent[i] <= window).count())
            .max()
            .unwrap();
        assert!(most as f64 <= f64::from(rate) * 1.1 + 1.0, "{most} in one second");
        // And the endpoint had its rate: 5 000 in little more than 50 s.
        let span = (*sent.last().unwrap() - sent[0]).as_seconds_f64();
        assert!(5_000.0 / span >= 0.9 * f64::from(rate), "{:.1}/s", 5_000.0 / span);
    }
}
