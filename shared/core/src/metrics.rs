//! Operational metrics: what the services count and time, handed to a [`Recorder`]. The
//! Lambda functions record into CloudWatch's embedded metric format (`hookwise-aws`, one log
//! line per invocation); the local hosts record nothing.

use std::time::Duration;

/// Where the services' metrics go. Each name is one of the constants below.
pub trait Recorder: Send + Sync {
    /// `n` more of `name`.
    fn count(&self, name: &'static str, n: u64);
    /// One observation of a duration.
    fn time(&self, name: &'static str, took: Duration);
    /// The end of a unit of work (a Lambda invocation): publish what was recorded since.
    fn flush(&self);
}

/// Deliveries by what their attempt came to (`Services::deliver`).
pub const DELIVERED: &str = "Delivered";
pub const RETRYING: &str = "Retrying";
pub const DEAD: &str = "Dead";
/// Duplicate or late messages, nothing done.
pub const STALE: &str = "Stale";
/// First attempts that arrived before their delivery was stored, looked at again.
pub const NOT_STORED_YET: &str = "NotStoredYet";
/// Messages that came before their attempt's time, queued again for then.
pub const EARLY: &str = "Early";
/// Attempts the endpoint's rate limit deferred to their slot, not attempted.
pub const RATE_LIMITED: &str = "RateLimited";
/// Attempts an open circuit breaker held, breakers opened, and held attempts released.
pub const HELD: &str = "Held";
pub const BREAKER_OPENED: &str = "BreakerOpened";
pub const RELEASED: &str = "Released";
/// Writes the delivery path makes best effort, failed and only logged: a circuit breaker's
/// change, an endpoint's health; and scheduler tick phases that failed (the tick went on to
/// the next). A steady count is a store (or a permission) failing.
pub const BEST_EFFORT_FAILURES: &str = "BestEffortFailures";
/// Messages given back to the queue on an infrastructure failure.
pub const REDELIVERED: &str = "Redelivered";
/// How long a POST took, from its start to its answer (or timeout).
pub const ATTEMPT_LATENCY: &str = "AttemptLatency";
/// From the ingest's queueing of a first attempt to the worker taking it.
pub const QUEUE_LAG: &str = "QueueLag";
/// Dead-letter messages handled, dead rounds whose owners will be told, owners' emails sent,
/// and deliveries the queue gave up on put back on their schedule.
pub const DEAD_LETTERS: &str = "DeadLetters";
pub const NOTICES: &str = "Notices";
pub const EMAILS: &str = "Emails";
/// Owners' emails (dead deliveries, digests, disablings) SES refused or did not answer: each
/// is tried again, but a steady count is mail not reaching owners.
pub const EMAIL_FAILURES: &str = "EmailFailures";
pub const RESCHEDULED: &str = "Rescheduled";
/// Retries the scheduler moved from its table to the queue, and overdue deliveries it
/// queued again.
pub const RETRIES_MOVED: &str = "RetriesMoved";
/// Scheduler ticks that ran (held the lease): none for minutes is a scheduler stopped, or
/// kept from its lease.
pub const TICKS: &str = "Ticks";
pub const REQUEUED: &str = "Requeued";
/// Items of the scheduler table that could not be read as tasks, set aside out of the way
/// of the tasks due with them (`hookwise scheduler set-aside` lists them): any is a defect,
/// or an item written by hand, that an operator looks at.
pub const SCHEDULER_ITEMS_SET_ASIDE: &str = "SchedulerItemsSetAside";

/// Records nothing.
pub struct NoMetrics;

impl Recorder for NoMetrics {
    fn count(&self, _: &'static str, _: u64) {}
    fn time(&self, _: &'static str, _: Duration) {}
    fn flush(&self) {}
}
