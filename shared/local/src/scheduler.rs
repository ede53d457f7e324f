//! `SchedulerTable` on SQLite: retries due later than the queue can delay.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hookwise_core::model::{SubscriptionId, TenantId};
use hookwise_core::ports::{AuditPosition, Holding, PortResult, ScheduledTask, SchedulerTable};
use hookwise_core::PortError;
use rusqlite::{params, OptionalExtension};

use crate::{db_err, from_json, nanos, to_json, LocalBackend};

#[async_trait]
impl SchedulerTable for LocalBackend {
    async fn schedule(&self, item: &ScheduledTask) -> PortResult<()> {
        let due = nanos(item.due);
        let id = item.task.delivery_id.to_string();
        let (round, attempt) = (item.task.round, item.task.attempt);
        let doc = to_json("scheduled task", item)?;
        self.with_conn("schedule a retry", move |conn| {
            // The same item scheduled twice is one item.
            conn.prepare_cached(
                "INSERT OR REPLACE INTO scheduled (due, delivery_id, round, attempt, doc) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut s| s.execute(params![due, id, round, attempt, doc]))
            .map_err(|e| db_err("schedule a retry", e))?;
            Ok(())
        })
        .await
    }

    async fn due(&self, until: DateTime<Utc>, limit: u32) -> PortResult<Vec<ScheduledTask>> {
        let until = nanos(until);
        self.with_conn("read due retries", move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT doc FROM scheduled WHERE due <= ?1 ORDER BY due, delivery_id, round, attempt LIMIT ?2",
                )
                .map_err(|e| db_err("read due retries", e))?;
            let docs = stmt
                .query_map(params![until, limit], |row| row.get::<_, String>(0))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| db_err("read due retries", e))?;
            docs.iter().map(|d| from_json("scheduled task", d)).collect()
        })
        .await
    }

    async fn remove(&self, items: &[ScheduledTask]) -> PortResult<()> {
        let keys: Vec<(i64, String, u32, u32)> = items
            .iter()
            .map(|i| {
                (
                    nanos(i.due),
                    i.task.delivery_id.to_string(),
                    i.task.round,
                    i.task.attempt,
                )
            })
            .collect();
        self.with_conn("remove scheduled retries", move |conn| {
            let err = |e| db_err("remove scheduled retries", e);
            {
                let mut stmt = conn
                    .prepare_cached(
                        "DELETE FROM scheduled WHERE due = ?1 AND delivery_id = ?2 AND round = ?3 AND attempt = ?4",
                    )
                    .map_err(err)?;
                for (due, id, round, attempt) in &keys {
                    stmt.execute(params![due, id, round, attempt]).map_err(err)?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn hold(&self, tenant: &TenantId, sub: &SubscriptionId, item: &ScheduledTask) -> PortResult<()> {
        let tenant = tenant.to_string();
        let sub = sub.to_string();
        let due = nanos(item.due);
        let id = item.task.delivery_id.to_string();
        let (round, attempt) = (item.task.round, item.task.attempt);
        let doc = to_json("held attempt", item)?;
        self.with_conn("hold an attempt", move |conn| {
            let err = |e| db_err("hold an attempt", e);
            conn.prepare_cached(
                "INSERT OR REPLACE INTO held (subscription_id, delivery_id, round, attempt, due, doc)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut s| s.execute(params![sub, id, round, attempt, due, doc]))
            .map_err(err)?;
            conn.prepare_cached(
                "INSERT OR REPLACE INTO scheduled (due, delivery_id, round, attempt, doc) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut s| s.execute(params![due, id, round, attempt, doc]))
            .map_err(err)?;
            conn.prepare_cached("INSERT OR IGNORE INTO holding (subscription_id, tenant_id) VALUES (?1, ?2)")
                .and_then(|mut s| s.execute(params![sub, tenant]))
                .map_err(err)?;
            Ok(())
        })
        .await
    }

    async fn holding(&self, after: Option<&SubscriptionId>, limit: u32) -> PortResult<Vec<Holding>> {
        let after = after.map(|a| a.to_string()).unwrap_or_default();
        self.with_conn("list the endpoints holding attempts", move |conn| {
            let err = |e| db_err("list the endpoints holding attempts", e);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT subscription_id, tenant_id FROM holding WHERE subscription_id > ?1
                     ORDER BY subscription_id LIMIT ?2",
                )
                .map_err(err)?;
            let rows = stmt
                .query_map(params![after, limit], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                })
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(err)?;
            rows.into_iter()
                .map(|(sub, tenant)| {
                    Ok(Holding {
                        subscription_id: SubscriptionId::parse(&sub)
                            .map_err(|e| PortError::permanent("read holding", e.to_string()))?,
                        tenant_id: TenantId::parse(&tenant)
                            .map_err(|e| PortError::permanent("read holding", e.to_string()))?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn stop_holding(&self, sub: &SubscriptionId) -> PortResult<()> {
        let sub = sub.to_string();
        self.with_conn("stop listing an endpoint as holding", move |conn| {
            conn.prepare_cached("DELETE FROM holding WHERE subscription_id = ?1")
                .and_then(|mut s| s.execute(params![sub]))
                .map_err(|e| db_err("stop listing an endpoint as holding", e))?;
            Ok(())
        })
        .await
    }

    async fn held(&self, sub: &SubscriptionId, limit: u32) -> PortResult<Vec<ScheduledTask>> {
        let sub = sub.to_string();
        self.with_conn("read held attempts", move |conn| {
            let err = |e| db_err("read held attempts", e);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT doc FROM held WHERE subscription_id = ?1 ORDER BY due, delivery_id, round, attempt LIMIT ?2",
                )
                .map_err(err)?;
            let docs = stmt
                .query_map(params![sub, limit], |row| row.get::<_, String>(0))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(err)?;
            docs.iter().map(|d| from_json("held attempt", d)).collect()
        })
        .await
    }

    async fn release(&self, sub: &SubscriptionId, items: &[ScheduledTask]) -> PortResult<()> {
        let sub = sub.to_string();
        let keys: Vec<(String, u32, u32)> = items
            .iter()
            .map(|i| (i.task.delivery_id.to_string(), i.task.round, i.task.attempt))
            .collect();
        self.with_conn("release held attempts", move |conn| {
            let err = |e| db_err("release held attempts", e);
            let mut stmt = conn
                .prepare_cached(
                    "DELETE FROM held WHERE subscription_id = ?1 AND delivery_id = ?2 AND round = ?3 AND attempt = ?4",
                )
                .map_err(err)?;
            for (id, round, attempt) in &keys {
                stmt.execute(params![sub, id, round, attempt]).map_err(err)?;
            }
            Ok(())
        })
        .await
    }

    async fn take_lease(&self, holder: &str, now: DateTime<Utc>, until: DateTime<Utc>) -> PortResult<bool> {
        let (holder, now, until) = (holder.to_owned(), nanos(now), nanos(until));
        self.with_conn("take the scheduler's lease", move |conn| {
            // Taken (a row changed) unless another holder's lease runs past now.
            let changed = conn
                .prepare_cached(
                    "INSERT INTO leases (name, holder, until) VALUES ('scheduler', ?1, ?2) \
                     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until \
                     WHERE leases.holder = excluded.holder OR leases.until <= ?3",
                )
                .and_then(|mut s| s.execute(params![holder, until, now]))
                .map_err(|e| db_err("take the scheduler's lease", e))?;
            Ok(changed == 1)
        })
        .await
    }

    async fn end_lease(&self, holder: &str, now: DateTime<Utc>) -> PortResult<()> {
        let (holder, now) = (holder.to_owned(), nanos(now));
        self.with_conn("end the scheduler's lease", move |conn| {
            conn.prepare_cached("UPDATE leases SET until = ?2 WHERE name = 'scheduler' AND holder = ?1")
                .and_then(|mut s| s.execute(params![holder, now]))
                .map_err(|e| db_err("end the scheduler's lease", e))?;
            Ok(())
        })
        .await
    }

    async fn audit_position(&self) -> PortResult<Option<AuditPosition>> {
        const WHAT: &str = "read the audit's position";
        let doc: Option<String> = self
            .with_conn(WHAT, move |conn| {
                conn.prepare_cached("SELECT doc FROM audit_position WHERE name = 'first attempts'")
                    .and_then(|mut s| s.query_row([], |row| row.get(0)).optional())
                    .map_err(|e| db_err(WHAT, e))
            })
            .await?;
        doc.map(|doc| from_json(WHAT, &doc)).transpose()
    }

    async fn save_audit_position(&self, position: &AuditPosition) -> PortResult<()> {
        const WHAT: &str = "save the audit's position";
        let doc = to_json(WHAT, position)?;
        self.with_conn(WHAT, move |conn| {
            conn.prepare_cached(
                "INSERT INTO audit_position (name, doc) VALUES ('first attempts', ?1) \
                 ON CONFLICT (name) DO UPDATE SET doc = excluded.doc",
            )
            .and_then(|mut s| s.execute(params![doc]))
            .map_err(|e| db_err(WHAT, e))?;
            Ok(())
        })
        .await
    }
}
