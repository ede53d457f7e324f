//! `SchedulerTable` on SQLite: retries due later than the queue can delay.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hookwise_core::model::{SubscriptionId, TenantId};
use hookwise_core::ports::{AuditPosition, DuePage, Holding, PortResult, ScheduledTask, SchedulerTable, SetAsideItem};
use hookwise_core::PortError;
use rusqlite::{params, OptionalExtension};

use crate::{db_err, from_json, from_nanos, nanos, to_json, LocalBackend};

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

    async fn due_page(&self, now: DateTime<Utc>, until: DateTime<Utc>, limit: u32) -> PortResult<DuePage> {
        const WHAT: &str = "read due retries";
        let (now, until) = (nanos(now), nanos(until));
        self.with_conn(WHAT, move |conn| {
            let err = |e| db_err(WHAT, e);
            let rows = conn
                .prepare_cached(
                    "SELECT due, delivery_id, round, attempt, doc FROM scheduled WHERE due <= ?1
                     ORDER BY due, delivery_id, round, attempt LIMIT ?2",
                )
                .and_then(|mut stmt| {
                    stmt.query_map(params![until, limit], |row| {
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, i64>(2)?,
                            row.get::<_, i64>(3)?,
                            row.get::<_, String>(4)?,
                        ))
                    })?
                    .collect::<Result<Vec<_>, _>>()
                })
                .map_err(err)?;
            let mut page = DuePage::default();
            for (due, id, round, attempt, doc) in rows {
                match from_json::<ScheduledTask>("scheduled task", &doc) {
                    Ok(task) => page.tasks.push(task),
                    // Out of the way of the rest, kept for an operator, in this transaction.
                    Err(error) => {
                        let key = format!("{due:020}#{id}#{round}#{attempt}");
                        conn.prepare_cached(
                            "INSERT OR REPLACE INTO scheduled_aside (key, set_aside_at, error, doc)
                             VALUES (?1, ?2, ?3, ?4)",
                        )
                        .and_then(|mut s| s.execute(params![key, now, error.to_string(), doc]))
                        .map_err(err)?;
                        conn.prepare_cached(
                            "DELETE FROM scheduled WHERE due = ?1 AND delivery_id = ?2 AND round = ?3 AND attempt = ?4",
                        )
                        .and_then(|mut s| s.execute(params![due, id, round, attempt]))
                        .map_err(err)?;
                        page.set_aside += 1;
                    }
                }
            }
            Ok(page)
        })
        .await
    }

    async fn set_aside(&self, after: Option<&str>, limit: u32) -> PortResult<Vec<SetAsideItem>> {
        const WHAT: &str = "list the scheduled rows set aside";
        let after = after.unwrap_or_default().to_owned();
        self.with_read(WHAT, move |conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT key, set_aside_at, error, doc FROM scheduled_aside WHERE key > ?1 ORDER BY key LIMIT ?2",
                )
                .and_then(|mut stmt| {
                    stmt.query_map(params![after, limit], |row| {
                        Ok(SetAsideItem {
                            key: row.get(0)?,
                            set_aside_at: from_nanos(row.get(1)?),
                            error: row.get(2)?,
                            raw: row.get(3)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()
                })
                .map_err(|e| db_err(WHAT, e))?;
            Ok(rows)
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
                    "SELECT doc FROM held WHERE subscription_id = ?1 ORDER BY delivery_id, round, attempt LIMIT ?2",
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
        self.position("first attempts", "read the audit's position").await
    }

    async fn save_audit_position(&self, position: &AuditPosition) -> PortResult<()> {
        self.save_position("first attempts", position, "save the audit's position")
            .await
    }

    async fn tend_position(&self) -> PortResult<Option<SubscriptionId>> {
        let after: Option<Option<SubscriptionId>> =
            self.position("tend", "read where tending the breakers got to").await?;
        Ok(after.flatten())
    }

    async fn save_tend_position(&self, after: Option<&SubscriptionId>) -> PortResult<()> {
        self.save_position("tend", &after, "save where tending the breakers got to")
            .await
    }
}

impl LocalBackend {
    /// The position saved as `name` in `audit_position`, if any.
    async fn position<T: serde::de::DeserializeOwned>(
        &self,
        name: &'static str,
        what: &'static str,
    ) -> PortResult<Option<T>> {
        let doc: Option<String> = self
            .with_conn(what, move |conn| {
                conn.prepare_cached("SELECT doc FROM audit_position WHERE name = ?1")
                    .and_then(|mut s| s.query_row([name], |row| row.get(0)).optional())
                    .map_err(|e| db_err(what, e))
            })
            .await?;
        doc.map(|doc| from_json(what, &doc)).transpose()
    }

    /// Save `position` as `name` in `audit_position`, over what was there.
    async fn save_position<T: serde::Serialize>(
        &self,
        name: &'static str,
        position: &T,
        what: &'static str,
    ) -> PortResult<()> {
        let doc = to_json(what, position)?;
        self.with_conn(what, move |conn| {
            conn.prepare_cached(
                "INSERT INTO audit_position (name, doc) VALUES (?1, ?2) \
                 ON CONFLICT (name) DO UPDATE SET doc = excluded.doc",
            )
            .and_then(|mut s| s.execute(params![name, doc]))
            .map_err(|e| db_err(what, e))?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use hookwise_core::model::DeliveryId;
    use hookwise_core::ports::DeliveryTask;

    use super::*;

    fn task(due: DateTime<Utc>) -> ScheduledTask {
        ScheduledTask {
            task: DeliveryTask {
                delivery_id: DeliveryId::generate(due, &mut rand::rng()),
                round: 0,
                attempt: 2,
                queued_at: None,
                slot: None,
                tenant_id: None,
                held_until: None,
                redrives: 0,
            },
            due,
        }
    }

    #[tokio::test]
    async fn given_a_row_whose_document_does_not_parse_beside_a_task_then_the_task_is_due_and_the_row_is_set_aside() {
        let backend = LocalBackend::open_in_memory().unwrap();
        let t0: DateTime<Utc> = "2031-01-01T08:00:00Z".parse().unwrap();
        let good = task(t0 + chrono::Duration::seconds(30));
        backend.schedule(&good).await.unwrap();
        let due = nanos(t0);
        backend
            .with_conn("put a broken row", move |conn| {
                conn.execute(
                    "INSERT INTO scheduled (due, delivery_id, round, attempt, doc) VALUES (?1, 'del_x', 0, 2, '{\"due\": ')",
                    params![due],
                )
                .map_err(|e| db_err("put a broken row", e))
            })
            .await
            .unwrap();

        let now = t0 + chrono::Duration::minutes(1);
        let page = backend.due_page(now, now, 10).await.unwrap();
        assert_eq!(
            page,
            DuePage {
                tasks: vec![good.clone()],
                set_aside: 1
            }
        );
        let aside = backend.set_aside(None, 10).await.unwrap();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(aside[0].key, format!("{due:020}#del_x#0#2"));
        assert_eq!((aside[0].set_aside_at, aside[0].raw.as_str()), (now, "{\"due\": "));
        assert!(aside[0].error.contains("decode"), "{}", aside[0].error);
        // Gone from the schedule: the next read finds only the task.
        assert_eq!(backend.due_page(now, now, 10).await.unwrap().set_aside, 0);
        assert!(backend.set_aside(Some(&aside[0].key), 10).await.unwrap().is_empty());
    }
}
