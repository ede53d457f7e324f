//! The tables: the columns queries filter or sort on, and a JSON `doc` with the whole value.
//! Times are nanoseconds since the epoch (see [`crate::nanos`]).

use hookwise_core::model::{SealedSecret, SubscriptionId, TenantId};
use hookwise_core::ports::{PortResult, SecretContext};
use hookwise_core::PortError;
use rusqlite::Connection;

use crate::{db_err, Synchronous, BUSY_TIMEOUT};

/// 2: `dead_notices.sent_at`. 3: `notices` (who is told, and when) and `digests` replace
/// `dead_notices`. 4: `api_keys`, so a tenant can hold two (`tenants.api_key_hash` goes), and
/// `rate_slots`, and `queue.grp` (the tenant a receive takes turns by). 5: `circuits` and
/// `held` (the circuit breaker's state and the attempts it holds). 6: `queue_by_group`
/// replaces `queue_by_visibility`. 7: `holding` (the endpoints the scheduler tends).
/// 8: `rate_lines` (the limiter's send and backlog lines) replaces `rate_slots` (left for a
/// process of the version before still running on the file; it is no longer read).
const VERSION: i64 = 8;

/// Prepared statements kept per connection: more than the backend has.
const STATEMENT_CACHE: usize = 128;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tenants (
    id            TEXT PRIMARY KEY,
    doc           TEXT NOT NULL
);

-- Each rate-limited endpoint's lines (`rate_limit::Lines`, nanoseconds).
CREATE TABLE IF NOT EXISTS rate_lines (
    subscription_id  TEXT PRIMARY KEY,
    next_turn        INTEGER,
    last_slot        INTEGER,
    alive            INTEGER
) WITHOUT ROWID;

-- Each endpoint's circuit breaker, once it first opened.
CREATE TABLE IF NOT EXISTS circuits (
    subscription_id  TEXT PRIMARY KEY,
    version          INTEGER NOT NULL,
    doc              TEXT NOT NULL
);

-- Attempts an open circuit breaker holds, by endpoint (each is in `scheduled` too, due when
-- it gives up).
CREATE TABLE IF NOT EXISTS held (
    subscription_id  TEXT NOT NULL,
    delivery_id      TEXT NOT NULL,
    round            INTEGER NOT NULL,
    attempt          INTEGER NOT NULL,
    due              INTEGER NOT NULL,
    doc              TEXT NOT NULL,
    PRIMARY KEY (subscription_id, delivery_id, round, attempt)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS held_by_due ON held (subscription_id, due);

-- The endpoints that held an attempt, until the scheduler finds they hold none
-- (`SchedulerTable::holding`).
CREATE TABLE IF NOT EXISTS holding (
    subscription_id  TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS api_keys (
    hash       TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS subscriptions (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    doc         TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS subscriptions_by_tenant_and_id ON subscriptions (tenant_id, id);
DROP INDEX IF EXISTS subscriptions_by_tenant;

CREATE TABLE IF NOT EXISTS events (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    idempotency_key  TEXT,
    doc              TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_idempotency_key
    ON events (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE IF NOT EXISTS deliveries (
    id               TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    subscription_id  TEXT NOT NULL,
    status           TEXT NOT NULL,
    round            INTEGER NOT NULL,
    attempts         INTEGER NOT NULL,
    next_attempt_at  INTEGER,
    created_at       INTEGER NOT NULL,
    doc              TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_by_tenant ON deliveries (tenant_id, created_at, id);
CREATE INDEX IF NOT EXISTS deliveries_by_status ON deliveries (tenant_id, status, created_at, id);
CREATE INDEX IF NOT EXISTS deliveries_by_subscription ON deliveries (tenant_id, subscription_id, created_at, id);
-- A subscription's deliveries in one status (the dashboard's two filters together): without
-- it, either index above reads the other filter's rows one by one, all of a subscription's
-- history for a status it has none of (seconds at a million deliveries, on the one reading
-- connection). Added without a new version: `IF NOT EXISTS` builds it on an older file.
CREATE INDEX IF NOT EXISTS deliveries_by_subscription_and_status
    ON deliveries (tenant_id, subscription_id, status, created_at, id);
CREATE INDEX IF NOT EXISTS deliveries_by_event ON deliveries (event_id);
CREATE INDEX IF NOT EXISTS deliveries_overdue ON deliveries (next_attempt_at, id)
    WHERE status IN ('pending', 'retrying');
-- Unfinished deliveries by creation time: the audit of queued messages reads its ranges of
-- creation times here (`Delivery::awaits_queued_message`). It replaces the index of first
-- attempts alone, now that early retries are audited too.
DROP INDEX IF EXISTS deliveries_awaiting_first_message;
CREATE INDEX IF NOT EXISTS deliveries_unfinished_by_creation ON deliveries (created_at, id)
    WHERE status IN ('pending', 'retrying');

CREATE TABLE IF NOT EXISTS attempts (
    delivery_id  TEXT NOT NULL,
    round        INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    doc          TEXT NOT NULL,
    PRIMARY KEY (delivery_id, round, attempt)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS endpoint_health (
    subscription_id  TEXT PRIMARY KEY,
    doc              TEXT NOT NULL
);

-- Each endpoint's statistics (`Store::add_endpoint_stats`): `bucket` is the bucket's start,
-- `doc` its `StatsCounts`, added to by each write. (Added at version 8, as `event_types`:
-- `IF NOT EXISTS` gives it to a data dir from before.)
CREATE TABLE IF NOT EXISTS endpoint_stats (
    subscription_id  TEXT NOT NULL,
    bucket           INTEGER NOT NULL,
    doc              TEXT NOT NULL,
    PRIMARY KEY (subscription_id, bucket)
) WITHOUT ROWID;

-- A dead round's notice for its owner; `doc` is the notice, `sent_at` set once told.
CREATE TABLE IF NOT EXISTS notices (
    delivery_id  TEXT NOT NULL,
    round        INTEGER NOT NULL,
    owner        TEXT NOT NULL,
    died_at      INTEGER NOT NULL,
    sent_at      INTEGER,
    doc          TEXT NOT NULL,
    PRIMARY KEY (delivery_id, round)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS notices_waiting ON notices (owner, died_at, delivery_id) WHERE sent_at IS NULL;

-- An owner's emails: when the last went out, the claim on the next, and when a failed one
-- may be tried again.
CREATE TABLE IF NOT EXISTS digests (
    owner         TEXT PRIMARY KEY,
    last_sent_at  INTEGER,
    claimed_at    INTEGER,
    retry_at      INTEGER
) WITHOUT ROWID;

-- Both queues: `queue` is 'delivery' or 'dead'. A message is visible when
-- visible_at <= now; receiving it pushes visible_at out by the visibility timeout.
CREATE TABLE IF NOT EXISTS queue (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    queue          TEXT NOT NULL,
    doc            TEXT NOT NULL,
    visible_at     INTEGER NOT NULL,
    receive_count  INTEGER NOT NULL DEFAULT 0,
    enqueued_at    INTEGER NOT NULL,
    -- The tenant, whose turn a receive takes (see `receive_from`).
    grp            TEXT NOT NULL DEFAULT ''
);

CREATE TABLE IF NOT EXISTS scheduled (
    due          INTEGER NOT NULL,
    delivery_id  TEXT NOT NULL,
    round        INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    doc          TEXT NOT NULL,
    PRIMARY KEY (due, delivery_id, round, attempt)
) WITHOUT ROWID;

-- The scheduler's lease (`SchedulerTable::take_lease`): one row, `scheduler`.
CREATE TABLE IF NOT EXISTS leases (
    name    TEXT PRIMARY KEY,
    holder  TEXT NOT NULL,
    until   INTEGER NOT NULL
) WITHOUT ROWID;

-- Scheduled rows `SchedulerTable::due_page` could not read, moved out of the way
-- (`SchedulerTable::set_aside`): `key` the row's key, `doc` what it held. (Added at version
-- 8, as `event_types`: `IF NOT EXISTS` gives it to a data dir from before.)
CREATE TABLE IF NOT EXISTS scheduled_aside (
    key           TEXT PRIMARY KEY,
    set_aside_at  INTEGER NOT NULL,
    error         TEXT NOT NULL,
    doc           TEXT NOT NULL
) WITHOUT ROWID;

-- Where the audit of queued messages has got to (`SchedulerTable::audit_position`): the row
-- `first attempts`; and where tending the breakers has (`SchedulerTable::tend_position`): `tend`.
CREATE TABLE IF NOT EXISTS audit_position (
    name  TEXT PRIMARY KEY,
    doc   TEXT NOT NULL
) WITHOUT ROWID;

-- The deployment's settings (`Store::deployment`: operator keys, the rollout): one row.
CREATE TABLE IF NOT EXISTS settings (
    name  TEXT PRIMARY KEY,
    doc   TEXT NOT NULL
) WITHOUT ROWID;

-- Customers' portal sessions (`Store::portal_session`).
CREATE TABLE IF NOT EXISTS portal_sessions (
    id    TEXT PRIMARY KEY,
    doc   TEXT NOT NULL
) WITHOUT ROWID;

-- The event-type catalogue (`Store::event_type`): `scope` is the tenant's id, or '' for the
-- deployment's (no tenant id is empty); listed by name within a scope.
CREATE TABLE IF NOT EXISTS event_types (
    scope  TEXT NOT NULL,
    name   TEXT NOT NULL,
    doc    TEXT NOT NULL,
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS outbox (
    id          INTEGER PRIMARY KEY,
    message_id  TEXT NOT NULL,
    sent_at     INTEGER NOT NULL,
    from_addr   TEXT NOT NULL,
    to_addr     TEXT NOT NULL,
    subject     TEXT NOT NULL,
    body        TEXT NOT NULL,
    file        TEXT
);
"#;

/// The reading connection of a database file that [`prepare`] has made ready: it waits for
/// a lock as the writer does, keeps its statements, and can only read.
pub(crate) fn prepare_reader(conn: &Connection) -> PortResult<()> {
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| db_err("set busy_timeout", e))?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| db_err("set query_only", e))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// A few subscriptions' secrets as this backend seals them (`local1:`), with their contexts:
/// the data dir's key must open one (a single damaged one refuses no data dir).
pub(crate) fn sealed_secrets_sample(conn: &Connection) -> PortResult<Vec<(SecretContext, SealedSecret)>> {
    let what = "read the subscriptions' secrets";
    let mut statement = conn
        .prepare(
            "SELECT tenant_id, id, json_extract(doc, '$.secret') FROM subscriptions
             WHERE json_extract(doc, '$.secret') LIKE 'local1:%' LIMIT 5",
        )
        .map_err(|e| db_err(what, e))?;
    let rows = statement
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
            ))
        })
        .map_err(|e| db_err(what, e))?;
    let corrupt = |e: hookwise_core::ValidationError| PortError::permanent(what, e.message);
    let mut sample = Vec::new();
    for row in rows {
        let (tenant, subscription, sealed) = row.map_err(|e| db_err(what, e))?;
        let context = SecretContext::new(
            &TenantId::parse(&tenant).map_err(corrupt)?,
            &SubscriptionId::parse(&subscription).map_err(corrupt)?,
        );
        sample.push((context, SealedSecret::envelope(sealed)));
    }
    Ok(sample)
}

/// Pragmas and tables. WAL lets readers in other processes work alongside; `synchronous`
/// is `FULL` unless the config says otherwise (see [`Synchronous`]).
pub(crate) fn prepare(conn: &Connection, synchronous: Synchronous) -> PortResult<()> {
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| db_err("set busy_timeout", e))?;
    // An in-memory database answers `memory`; that is fine.
    let _mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|e| db_err("set journal_mode", e))?;
    conn.pragma_update(None, "synchronous", synchronous.as_str())
        .map_err(|e| db_err("set synchronous", e))?;
    // A batch's calls run in a savepoint (`each_alone`), whose undo copies of the pages they
    // change (the sub-journal) went to a temporary file once past 64 KiB: a quarter of the
    // database thread's time with batch ingest. They are only ever read to roll a savepoint
    // back, never after a crash (the WAL is what makes a commit durable), so memory is where
    // they belong.
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(|e| db_err("set temp_store", e))?;
    // What a write deletes or moves is zeroed where that costs no I/O (in a page written
    // anyway): a signing secret an older build stored in plain text leaves the page when its
    // subscription is written sealed. (Old WAL frames hold it until written over.)
    conn.pragma_update(None, "secure_delete", "FAST")
        .map_err(|e| db_err("set secure_delete", e))?;
    // Every statement the backend runs stays prepared (rusqlite keeps 16 by default, fewer
    // than the hot paths use, so they pushed each other out and were parsed again).
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);

    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|e| db_err("read user_version", e))?;
    if version > VERSION {
        return Err(PortError::permanent(
            "open the database",
            format!("its schema version {version} is newer than this build of Hookwise understands ({VERSION})"),
        ));
    }
    // The tables, each upgrade step and the new version in one transaction: a process killed
    // half way leaves the database as it was, and the next start upgrades it again. It takes
    // the write lock up front (IMMEDIATE), waiting out a running `hookwise dev`'s writes: a
    // deferred one that read first could not upgrade to writing once that process had
    // committed (SQLITE_BUSY at once, no wait), which the scheduler's lease, written every
    // tick, made common for `hookwise tenant` beside a running dev.
    let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| db_err("begin the schema upgrade", e))?;
    tx.execute_batch(SCHEMA).map_err(|e| db_err("create the tables", e))?;
    if version == 1 {
        // Notices claimed before version 2 were sent (or given back): mark them so.
        tx.execute_batch(
            "ALTER TABLE dead_notices ADD COLUMN sent_at INTEGER; UPDATE dead_notices SET sent_at = claimed_at;",
        )
        .map_err(|e| db_err("upgrade the schema to version 2", e))?;
    }
    let has_dead_notices: bool = tx
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'dead_notices'",
            [],
            |row| row.get(0),
        )
        .map_err(|e| db_err("read the schema", e))?;
    if (1..=2).contains(&version) && has_dead_notices {
        // Sent notices stay told. One claimed and never sent is dropped: its dead letter is
        // still on the queue (its batch failed), and queues it afresh when it comes back.
        // (`OR IGNORE` and the check above: an earlier build upgraded step by step, and one
        // killed between the steps left some of them done.)
        tx.execute_batch(
            "INSERT OR IGNORE INTO notices (delivery_id, round, owner, died_at, sent_at, doc)
                 SELECT delivery_id, round, '', claimed_at, sent_at, '{}' FROM dead_notices WHERE sent_at IS NOT NULL;
             DROP TABLE dead_notices;",
        )
        .map_err(|e| db_err("upgrade the schema to version 3", e))?;
    }
    let has_key_column: bool = tx
        .query_row(
            "SELECT count(*) > 0 FROM pragma_table_info('tenants') WHERE name = 'api_key_hash'",
            [],
            |row| row.get(0),
        )
        .map_err(|e| db_err("read the schema", e))?;
    let has_group_column: bool = tx
        .query_row(
            "SELECT count(*) > 0 FROM pragma_table_info('queue') WHERE name = 'grp'",
            [],
            |row| row.get(0),
        )
        .map_err(|e| db_err("read the schema", e))?;
    if !has_group_column {
        tx.execute_batch("ALTER TABLE queue ADD COLUMN grp TEXT NOT NULL DEFAULT '';")
            .map_err(|e| db_err("upgrade the schema to version 4", e))?;
    }
    // Receives take each tenant's oldest in turn, from this index (version 6; it replaces
    // `queue_by_visibility`, which made every receive sort the whole backlog).
    tx.execute_batch(
        "DROP INDEX IF EXISTS queue_by_visibility;
         CREATE INDEX IF NOT EXISTS queue_by_group ON queue (queue, grp, visible_at, id);",
    )
    .map_err(|e| db_err("upgrade the schema to version 6", e))?;
    if version < 7 {
        // Attempts held before version 7 are tended too: their endpoints are listed.
        tx.execute_batch(
            "INSERT OR IGNORE INTO holding (subscription_id, tenant_id)
                 SELECT DISTINCT held.subscription_id, subscriptions.tenant_id
                 FROM held JOIN subscriptions ON subscriptions.id = held.subscription_id;",
        )
        .map_err(|e| db_err("upgrade the schema to version 7", e))?;
    }
    if has_key_column {
        // Each tenant's one key moves to `api_keys`, and is listed on the tenant.
        tx.execute_batch(
            "INSERT OR IGNORE INTO api_keys (hash, tenant_id) SELECT api_key_hash, id FROM tenants;
             CREATE TABLE tenants_v4 (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
             INSERT INTO tenants_v4 (id, doc)
                 SELECT id, json_set(doc, '$.api_keys', json_array(json_object(
                     'hash', api_key_hash, 'created_at', json_extract(doc, '$.created_at'))))
                 FROM tenants;
             DROP TABLE tenants;
             ALTER TABLE tenants_v4 RENAME TO tenants;",
        )
        .map_err(|e| db_err("upgrade the schema to version 4", e))?;
    }
    tx.pragma_update(None, "user_version", VERSION)
        .map_err(|e| db_err("set user_version", e))?;
    tx.commit().map_err(|e| db_err("commit the schema upgrade", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_from_before_the_catalogue_gets_its_table_at_the_same_version() {
        let conn = Connection::open_in_memory().unwrap();
        prepare(&conn, Synchronous::default()).unwrap();
        // As a data dir of the build before the event-type catalogue was.
        conn.execute_batch("DROP TABLE event_types;").unwrap();
        prepare(&conn, Synchronous::default()).unwrap();
        let has_table: bool = conn
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'event_types'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert!(has_table);
        // No new version: a build from before still opens the file (and ignores the table).
        let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
        assert_eq!(version, VERSION);
    }

    /// The listing's plan with both filters (`Store::list_deliveries`' SQL: tenant, status,
    /// subscription, from a cursor, newest first): every filter in the index's search, and
    /// no sort of its own.
    #[test]
    fn deliveries_of_a_subscription_in_one_status_are_listed_from_their_own_index() {
        let conn = Connection::open_in_memory().unwrap();
        prepare(&conn, Synchronous::default()).unwrap();
        let plan: Vec<String> = conn
            .prepare(
                "EXPLAIN QUERY PLAN SELECT doc FROM deliveries WHERE tenant_id = 'ten_x' AND status = 'dead'
                 AND subscription_id = 'sub_x' AND (created_at, id) < (1, 'dlv_x')
                 ORDER BY created_at DESC, id DESC LIMIT 51",
            )
            .unwrap()
            .query_map([], |row| row.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let plan = plan.join("\n");
        assert!(
            plan.contains("deliveries_by_subscription_and_status (tenant_id=? AND subscription_id=? AND status=?"),
            "{plan}"
        );
        assert!(!plan.contains("TEMP B-TREE"), "{plan}");
    }

    #[test]
    fn a_database_from_before_endpoint_stats_gets_its_table_at_the_same_version() {
        let conn = Connection::open_in_memory().unwrap();
        prepare(&conn, Synchronous::default()).unwrap();
        // As a data dir of the build before endpoint statistics were.
        conn.execute_batch("DROP TABLE endpoint_stats;").unwrap();
        prepare(&conn, Synchronous::default()).unwrap();
        let has_table: bool = conn
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'endpoint_stats'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert!(has_table);
        let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
        assert_eq!(version, VERSION);
    }
}
