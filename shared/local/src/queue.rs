//! The delivery queue and its dead-letter queue, as SQS behaves: a per-message delay, and a
//! visibility timeout so a message whose handler died comes back.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hookwise_core::ports::{
    self, Created, DeliveryQueue, DeliveryTask, EventWrite, PortResult, QueueConsumer, QueueMessage, StoreWithQueue,
};
use hookwise_core::PortError;
use rusqlite::{params, OptionalExtension};

use crate::store::EventRows;
use crate::{db_err, each_alone, from_nanos, nanos, to_json, LocalBackend};

/// Which of the two queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueName {
    /// Delivery tasks for the worker.
    Delivery,
    /// Dead deliveries for the dead-letter handler.
    DeadLetter,
}

impl QueueName {
    fn as_str(self) -> &'static str {
        match self {
            Self::Delivery => "delivery",
            Self::DeadLetter => "dead",
        }
    }
}

/// Proof of one receive of one message; acking with it deletes the message unless it has
/// been received again since (its visibility ran out and another handler took it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Receipt {
    queue: QueueName,
    id: i64,
    receive_count: u32,
}

/// A message taken from a queue, invisible to other receivers until its timeout.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub receipt: Receipt,
    pub task: DeliveryTask,
    /// 1 the first time the message is received.
    pub receive_count: u32,
}

/// Where undecodable messages go: kept for a person to look at, out of every receiver's way.
const CORRUPT: &str = "corrupt";

// What a receive reads, each an index search (a test checks their query plans).
const FIRST_GROUP: &str = "SELECT grp FROM queue WHERE queue = ?1 ORDER BY grp LIMIT 1";
const NEXT_GROUP: &str = "SELECT grp FROM queue WHERE queue = ?1 AND grp > ?2 ORDER BY grp LIMIT 1";
const GROUP_OLDEST: &str = "SELECT id, doc, receive_count, visible_at FROM queue
     WHERE queue = ?1 AND grp = ?2 AND visible_at <= ?3 ORDER BY visible_at, id LIMIT ?4";
const GROUP_FIRST_VISIBLE: &str = "SELECT MIN(visible_at) FROM queue WHERE queue = ?1 AND grp = ?2";
/// The delayed message due soonest (never received, not visible yet): what an injected
/// `early` fault hands out. Only with faults on, so it may scan.
const SOONEST_DELAYED: &str = "SELECT id, doc, receive_count, visible_at FROM queue
     WHERE queue = ?1 AND visible_at > ?2 AND receive_count = 0 ORDER BY visible_at, id LIMIT 1";

/// The groups (tenants) with messages on `queue`, visible or not: a skip scan of the index
/// `queue_by_group`, one seek per group, so what a receive costs grows with the number of
/// tenants waiting and the batch, not with the backlog.
fn groups(conn: &rusqlite::Connection, queue: QueueName) -> rusqlite::Result<Vec<String>> {
    let mut first = conn.prepare_cached(FIRST_GROUP)?;
    let mut next = conn.prepare_cached(NEXT_GROUP)?;
    let mut groups: Vec<String> = Vec::new();
    let mut found = first.query_row([queue.as_str()], |row| row.get(0)).optional()?;
    while let Some(group) = found {
        found = next
            .query_row(params![queue.as_str(), group], |row| row.get(0))
            .optional()?;
        groups.push(group);
    }
    Ok(groups)
}

/// Up to `max` visible messages (id, body, receive count), fair by tenant: each group's
/// oldest first, then each one's second, and so on, so one tenant's backlog does not hold up
/// another's messages. Each group gives its `max` oldest at most, from the index.
fn fair_turns(
    conn: &rusqlite::Connection,
    queue: QueueName,
    now_ns: i64,
    max: usize,
) -> rusqlite::Result<Vec<(i64, String, u32)>> {
    let mut oldest = conn.prepare_cached(GROUP_OLDEST)?;
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    // (turn, visible_at, id) orders them; the body and count come along.
    let mut turns: Vec<((usize, i64, i64), String, u32)> = Vec::new();
    for group in groups(conn, queue)? {
        let rows = oldest.query_map(params![queue.as_str(), group, now_ns, limit], |row| {
            Ok((row.get::<_, i64>(0)?, row.get(1)?, row.get(2)?, row.get::<_, i64>(3)?))
        })?;
        for (turn, row) in rows.enumerate() {
            let (id, doc, count, visible_at) = row?;
            turns.push(((turn, visible_at, id), doc, count));
        }
    }
    turns.sort_unstable_by_key(|(order, ..)| *order);
    turns.truncate(max);
    Ok(turns
        .into_iter()
        .map(|((_, _, id), doc, count)| (id, doc, count))
        .collect())
}

/// What a message carries, for the fault log: its delivery and attempt, and how long before
/// its time it was handed out (`early_ns`).
fn carries(task: &DeliveryTask, early_ns: Option<i64>) -> String {
    let mut text = format!("{} attempt {}", task.delivery_id, task.attempt);
    if let Some(ns) = early_ns {
        text += &format!(", {} ms before its time", ns / 1_000_000);
    }
    text
}

/// `at + by`, saturating instead of panicking at the end of time.
fn later(at: DateTime<Utc>, by: chrono::Duration) -> DateTime<Utc> {
    at.checked_add_signed(by).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl LocalBackend {
    /// Take up to `max` visible messages from the delivery queue, oldest first, hiding them
    /// for `visibility_timeout`. Messages already received `max_receive_count` times move to
    /// the dead-letter queue instead (SQS's redrive).
    pub async fn receive(&self, max: usize, visibility_timeout: Duration) -> PortResult<Vec<Received>> {
        self.receive_from(QueueName::Delivery, max, visibility_timeout).await
    }

    /// Delete a received delivery-queue message. `false` when the receipt is stale: the
    /// message was acked already or has been received again since.
    pub async fn ack(&self, receipt: &Receipt) -> PortResult<bool> {
        Ok(self.ack_in(QueueName::Delivery, std::slice::from_ref(receipt)).await? == 1)
    }

    /// Delete many received delivery-queue messages in one transaction; how many were deleted.
    pub async fn ack_many(&self, receipts: &[Receipt]) -> PortResult<usize> {
        self.ack_in(QueueName::Delivery, receipts).await
    }

    /// [`receive`](Self::receive) for the dead-letter queue (no redrive from there).
    pub async fn receive_dead(&self, max: usize, visibility_timeout: Duration) -> PortResult<Vec<Received>> {
        self.receive_from(QueueName::DeadLetter, max, visibility_timeout).await
    }

    pub async fn ack_dead(&self, receipt: &Receipt) -> PortResult<bool> {
        Ok(self
            .ack_in(QueueName::DeadLetter, std::slice::from_ref(receipt))
            .await?
            == 1)
    }

    pub async fn ack_dead_many(&self, receipts: &[Receipt]) -> PortResult<usize> {
        self.ack_in(QueueName::DeadLetter, receipts).await
    }

    /// Keep received messages hidden for `hidden_for` from now (to return them later, or to
    /// extend one still being worked on); how many were still held by these receipts.
    pub async fn hide(&self, receipts: &[Receipt], hidden_for: Duration) -> PortResult<usize> {
        let until = nanos(later(
            self.now(),
            chrono::Duration::from_std(hidden_for).unwrap_or(chrono::Duration::MAX),
        ));
        let keys: Vec<(i64, &'static str, u32)> = receipts
            .iter()
            .map(|r| (r.id, r.queue.as_str(), r.receive_count))
            .collect();
        self.with_conn("change a message's visibility", move |conn| {
            let err = |e| db_err("change a message's visibility", e);
            let mut stmt = conn
                .prepare_cached("UPDATE queue SET visible_at = ?1 WHERE id = ?2 AND queue = ?3 AND receive_count = ?4")
                .map_err(err)?;
            let mut changed = 0;
            for (id, queue, count) in &keys {
                changed += stmt.execute(params![until, id, queue, count]).map_err(err)?;
            }
            Ok(changed)
        })
        .await
    }

    /// Make every received but unacknowledged message visible now, on both queues; how many.
    /// For the process that has just taken the data dir's [`DataDirLock`](crate::DataDirLock):
    /// whoever received them is gone, so they need not wait out their visibility timeout.
    pub async fn release_in_flight(&self) -> PortResult<usize> {
        let now = nanos(self.now());
        let released = self
            .with_conn("release in-flight messages", move |conn| {
                conn.prepare_cached("UPDATE queue SET visible_at = ?1 WHERE receive_count > 0 AND visible_at > ?1")
                    .and_then(|mut s| s.execute(params![now]))
                    .map_err(|e| db_err("release in-flight messages", e))
            })
            .await?;
        self.inner.delivery_ready.notify_waiters();
        self.inner.dead_ready.notify_waiters();
        Ok(released)
    }

    /// The receiving end of one of the two queues, as the worker loop drains it.
    pub fn consumer(&self, queue: QueueName, visibility_timeout: Duration) -> LocalConsumer {
        LocalConsumer {
            backend: self.clone(),
            queue,
            visibility_timeout,
        }
    }

    /// Messages in a queue, visible or not.
    pub async fn queue_len(&self, queue: QueueName) -> PortResult<u64> {
        self.with_read("count queue messages", move |conn| {
            conn.query_row("SELECT COUNT(*) FROM queue WHERE queue = ?1", [queue.as_str()], |row| {
                row.get::<_, i64>(0)
            })
            .map(|n| n as u64)
            .map_err(|e| db_err("count queue messages", e))
        })
        .await
    }

    /// When the next message of a queue becomes visible (in the past if one is visible now);
    /// `None` when the queue is empty.
    pub async fn next_visible_at(&self, queue: QueueName) -> PortResult<Option<DateTime<Utc>>> {
        self.with_read("peek at the queue", move |conn| {
            let err = |e| db_err("peek at the queue", e);
            let mut first = conn.prepare_cached(GROUP_FIRST_VISIBLE).map_err(err)?;
            let mut soonest: Option<i64> = None;
            for group in groups(conn, queue).map_err(err)? {
                let at: Option<i64> = first
                    .query_row(params![queue.as_str(), group], |row| row.get(0))
                    .map_err(err)?;
                soonest = soonest.into_iter().chain(at).min();
            }
            Ok(soonest.map(from_nanos))
        })
        .await
    }

    /// Wait until a message of `queue` may be visible: one is enqueued, the earliest hidden
    /// one's time comes (by the configured clock), or `max_wait` passes. A worker loops
    /// `receive` → (empty) → `wait_for_messages` instead of polling hard.
    pub async fn wait_for_messages(&self, queue: QueueName, max_wait: Duration) -> PortResult<()> {
        let notify = match queue {
            QueueName::Delivery => &self.inner.delivery_ready,
            QueueName::DeadLetter => &self.inner.dead_ready,
        };
        // Registered before looking, so an enqueue between the look and the sleep still wakes us.
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let wait = match self.next_visible_at(queue).await? {
            Some(at) => (at - self.now()).to_std().unwrap_or(Duration::ZERO).min(max_wait),
            None => max_wait,
        };
        if wait.is_zero() {
            return Ok(());
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(wait) => {}
        }
        Ok(())
    }

    async fn receive_from(
        &self,
        queue: QueueName,
        max: usize,
        visibility_timeout: Duration,
    ) -> PortResult<Vec<Received>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let now = self.now();
        let now_ns = nanos(now);
        let hidden_until = nanos(later(
            now,
            chrono::Duration::from_std(visibility_timeout).unwrap_or(chrono::Duration::MAX),
        ));
        let redrive = match queue {
            QueueName::Delivery => self.inner.config.max_receive_count,
            QueueName::DeadLetter => None,
        };
        // Injected queue faults, drawn here: the call may run twice.
        let draws = self.inner.faults.as_ref().and_then(|f| f.receive_draws());
        let (received, redriven, left_visible, early) = self
            .with_conn("receive from the queue", move |conn| {
                let err = |e| db_err("receive from the queue", e);
                let mut hide = conn
                    .prepare_cached("UPDATE queue SET visible_at = ?1, receive_count = receive_count + 1 WHERE id = ?2")
                    .map_err(err)?;
                let mut set_aside = conn.prepare_cached("UPDATE queue SET queue = ?1 WHERE id = ?2").map_err(err)?;
                let mut redrive_one = conn
                    .prepare_cached("UPDATE queue SET queue = 'dead', receive_count = 0, visible_at = ?1 WHERE id = ?2")
                    .map_err(err)?;
                let (mut received, mut redriven) = (Vec::with_capacity(max), 0);
                let mut rng = draws.map(|d| d.rng());
                let (mut left_visible, mut early) = (Vec::new(), Vec::new());
                for (id, doc, count) in fair_turns(conn, queue, now_ns, max).map_err(err)? {
                    // Received too often (SQS's `maxReceiveCount`): on to the dead-letter queue.
                    if redrive.is_some_and(|max_count| count >= max_count) {
                        redriven += redrive_one.execute(params![now_ns, id]).map_err(err)?;
                        continue;
                    }
                    match serde_json::from_str::<DeliveryTask>(&doc) {
                        Ok(task) => {
                            // An injected duplicate: received, and left visible for the next.
                            let leave = match (&draws, rng.as_mut()) {
                                (Some(d), Some(rng)) => d.leave_visible(rng),
                                _ => false,
                            };
                            if leave {
                                left_visible.push((id, carries(&task, None)));
                            }
                            let until = if leave { now_ns } else { hidden_until };
                            hide.execute(params![until, id]).map_err(err)?;
                            let receive_count = count.saturating_add(1);
                            received.push(Received { receipt: Receipt { queue, id, receive_count }, task, receive_count });
                        }
                        Err(e) => {
                            tracing::error!(message_id = id, error = %e, "queue message does not decode; set aside as corrupt");
                            set_aside.execute(params![CORRUPT, id]).map_err(err)?;
                        }
                    }
                }
                // An injected early message: the delayed one due soonest, handed out now.
                if let (Some(d), Some(rng)) = (&draws, rng.as_mut()) {
                    if d.hand_out_early(rng) && queue == QueueName::Delivery && received.len() < max {
                        let soonest = conn
                            .prepare_cached(SOONEST_DELAYED)
                            .and_then(|mut s| {
                                s.query_row(params![queue.as_str(), now_ns], |row| {
                                    Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?, row.get::<_, u32>(2)?, row.get::<_, i64>(3)?))
                                })
                                .optional()
                            })
                            .map_err(err)?;
                        if let Some((id, doc, count, visible_at)) = soonest {
                            if let Ok(task) = serde_json::from_str::<DeliveryTask>(&doc) {
                                hide.execute(params![hidden_until, id]).map_err(err)?;
                                let receive_count = count.saturating_add(1);
                                early.push((id, carries(&task, Some(visible_at - now_ns))));
                                received.push(Received { receipt: Receipt { queue, id, receive_count }, task, receive_count });
                            }
                        }
                    }
                }
                Ok((received, redriven, left_visible, early))
            })
            .await?;
        if let Some(faults) = &self.inner.faults {
            faults.received(
                "receive from the queue",
                received.iter().map(|r| r.receipt.id),
                left_visible,
                early,
            );
        }
        if redriven > 0 {
            tracing::warn!(
                count = redriven,
                "delivery messages received too often moved to the dead-letter queue"
            );
            self.inner.dead_ready.notify_waiters();
        }
        Ok(received)
    }

    async fn ack_in(&self, queue: QueueName, receipts: &[Receipt]) -> PortResult<usize> {
        if let Some(r) = receipts.iter().find(|r| r.queue != queue) {
            return Err(PortError::permanent(
                "ack a message",
                format!(
                    "receipt for message {} of the {} queue used on the {} queue",
                    r.id,
                    r.queue.as_str(),
                    queue.as_str()
                ),
            ));
        }
        let keys: Vec<(i64, u32)> = receipts.iter().map(|r| (r.id, r.receive_count)).collect();
        self.with_conn("ack a message", move |conn| {
            let err = |e| db_err("ack a message", e);
            let mut deleted = 0;
            {
                let mut stmt = conn
                    .prepare_cached("DELETE FROM queue WHERE id = ?1 AND queue = ?2 AND receive_count = ?3")
                    .map_err(err)?;
                for (id, count) in &keys {
                    deleted += stmt.execute(params![id, queue.as_str(), count]).map_err(err)?;
                }
            }
            Ok(deleted)
        })
        .await
    }

    /// The delivery queue's messages for `tasks`, each with its delay in seconds (at most the
    /// queue's longest).
    fn delivery_messages(&self, tasks: &[(DeliveryTask, u32)]) -> PortResult<Messages> {
        let max = self.max_delay_seconds();
        if let Some((task, delay)) = tasks.iter().find(|(_, delay)| *delay > max) {
            return Err(PortError::permanent(
                "enqueue",
                format!(
                    "delivery `{}`: a delay of {delay} s is longer than the queue's {max} s",
                    task.delivery_id
                ),
            ));
        }
        let now = self.now();
        let rows = tasks
            .iter()
            .map(|(task, delay)| {
                Ok((
                    to_json("delivery task", task)?,
                    nanos(later(now, chrono::Duration::seconds(i64::from(*delay)))),
                    group(task),
                ))
            })
            .collect::<PortResult<Vec<_>>>()?;
        Ok(Messages {
            queue: QueueName::Delivery,
            rows,
            enqueued_at: nanos(now),
        })
    }

    async fn push(&self, messages: Messages) -> PortResult<()> {
        if messages.rows.is_empty() {
            return Ok(());
        }
        let queue = messages.queue;
        self.with_conn("enqueue", move |conn| messages.insert(conn)).await?;
        self.wake(queue);
        Ok(())
    }

    /// Wake the receivers waiting on `queue`: a message has been written.
    fn wake(&self, queue: QueueName) {
        match queue {
            QueueName::Delivery => self.inner.delivery_ready.notify_waiters(),
            QueueName::DeadLetter => self.inner.dead_ready.notify_waiters(),
        }
    }
}

/// Messages ready to be written to one queue: each one's document, when it becomes visible,
/// and its group (the tenant, or "" for none) that receives take turns by.
struct Messages {
    queue: QueueName,
    rows: Vec<(String, i64, String)>,
    enqueued_at: i64,
}

impl Messages {
    fn insert(&self, conn: &rusqlite::Connection) -> PortResult<()> {
        let err = |e| db_err("enqueue", e);
        let mut stmt = conn
            .prepare_cached("INSERT INTO queue (queue, doc, visible_at, enqueued_at, grp) VALUES (?1, ?2, ?3, ?4, ?5)")
            .map_err(err)?;
        for (doc, visible_at, group) in &self.rows {
            stmt.execute(params![self.queue.as_str(), doc, visible_at, self.enqueued_at, group])
                .map_err(err)?;
        }
        Ok(())
    }
}

#[async_trait]
impl DeliveryQueue for LocalBackend {
    fn max_delay_seconds(&self) -> u32 {
        self.inner.config.max_delay_seconds
    }

    async fn enqueue(&self, tasks: &[(DeliveryTask, u32)]) -> PortResult<()> {
        self.push(self.delivery_messages(tasks)?).await
    }

    async fn dead_letter(&self, tasks: &[DeliveryTask]) -> PortResult<()> {
        let now = nanos(self.now());
        let rows = tasks
            .iter()
            .map(|task| Ok((to_json("delivery task", task)?, now, group(task))))
            .collect::<PortResult<Vec<_>>>()?;
        self.push(Messages {
            queue: QueueName::DeadLetter,
            rows,
            enqueued_at: now,
        })
        .await
    }
}

/// The store and the delivery queue in one file: a batch's events, each with its first
/// attempts' messages, are one call, so they commit together.
#[async_trait]
impl StoreWithQueue for LocalBackend {
    async fn create_events_queued(&self, writes: &[EventWrite<'_>]) -> Vec<PortResult<Created>> {
        const WHAT: &str = "create event";
        // Encoded here, off the database's thread; one that does not encode fails alone.
        let rows: Vec<PortResult<(EventRows, Messages)>> = writes
            .iter()
            .map(|w| Ok((EventRows::of(w.event, w.deliveries)?, self.delivery_messages(w.tasks)?)))
            .collect();
        let written = self
            .with_conn(WHAT, move |conn| {
                // Each event all or nothing: one that fails takes only its own rows back.
                each_alone(conn, rows.len(), |i| {
                    let (event, messages) = rows[i].as_ref().map_err(|e| e.copy_for(WHAT))?;
                    let created = event.insert(conn)?;
                    if created == Created::New {
                        messages.insert(conn)?;
                    }
                    Ok(created)
                })
                .map_err(|e| db_err(WHAT, e))
            })
            .await;
        let results = match written {
            Ok(results) => results,
            // The whole call failed (its transaction did not commit): so did every event.
            Err(e) => return writes.iter().map(|_| Err(e.copy_for(WHAT))).collect(),
        };
        let queued = results
            .iter()
            .zip(writes)
            .any(|(r, w)| matches!(r, Ok(Created::New)) && !w.tasks.is_empty());
        if queued {
            self.wake(QueueName::Delivery);
        }
        results
    }
}

/// One queue of a [`LocalBackend`] behind the core's consumer port.
#[derive(Debug, Clone)]
pub struct LocalConsumer {
    backend: LocalBackend,
    queue: QueueName,
    visibility_timeout: Duration,
}

#[async_trait]
impl QueueConsumer for LocalConsumer {
    type Receipt = Receipt;

    async fn receive(&self, max: usize, wait: Duration) -> PortResult<Vec<ports::Received<Receipt>>> {
        let mut got = self
            .backend
            .receive_from(self.queue, max, self.visibility_timeout)
            .await?;
        if got.is_empty() && !wait.is_zero() {
            self.backend.wait_for_messages(self.queue, wait).await?;
            got = self
                .backend
                .receive_from(self.queue, max, self.visibility_timeout)
                .await?;
        }
        // Undecodable rows never get here: `receive_from` sets them aside as corrupt.
        Ok(got
            .into_iter()
            .map(|r| ports::Received {
                message: QueueMessage {
                    message_id: r.receipt.id.to_string(),
                    task: Ok(r.task),
                    redriven: false,
                    receive_count: r.receive_count,
                },
                receipt: r.receipt,
            })
            .collect())
    }

    async fn ack(&self, receipts: &[Receipt]) -> PortResult<()> {
        self.backend.ack_in(self.queue, receipts).await.map(drop)
    }

    async fn change_visibility(&self, receipts: &[Receipt], hidden_for: Duration) -> PortResult<()> {
        self.backend.hide(receipts, hidden_for).await.map(drop)
    }

    fn visibility_timeout(&self) -> Duration {
        self.visibility_timeout
    }
}

/// The group a message takes its turn in: its tenant.
fn group(task: &DeliveryTask) -> String {
    task.tenant_id.as_ref().map(|t| t.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement a receive runs, as SQLite plans it on the real schema: each one an
    /// index search, none a scan or a sort of the queue. (The window query this replaced
    /// numbered every visible message, so a receive cost grew with the backlog.)
    #[test]
    fn a_receive_searches_the_index_and_never_scans_or_sorts_the_queue() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        crate::schema::prepare(&conn, crate::Synchronous::Full).unwrap();
        for sql in [FIRST_GROUP, NEXT_GROUP, GROUP_OLDEST, GROUP_FIRST_VISIBLE] {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            // Parameters left unbound are NULL: the plan does not depend on them.
            let mut rows = stmt.raw_query();
            let mut plan = Vec::new();
            while let Some(row) = rows.next().unwrap() {
                plan.push(row.get::<_, String>(3).unwrap());
            }
            let plan = plan.join("; ");
            assert!(
                plan.contains("USING") && plan.contains("INDEX queue_by_group"),
                "{sql}: {plan}"
            );
            assert!(!plan.contains("SCAN") && !plan.contains("TEMP B-TREE"), "{sql}: {plan}");
        }
    }
}
