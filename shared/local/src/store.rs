//! `Store` on SQLite.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hookwise_core::circuit::Circuit;
use hookwise_core::health::EndpointHealth;
use hookwise_core::model::*;
use hookwise_core::ports::{
    AuditPage, Created, DeadNotice, DeliveryChange, DeliveryPage, DeliveryQuery, DigestClaim, PortResult, Store,
};
use hookwise_core::rate_limit::{self, Arrival, Lines, Verdict};
use hookwise_core::stats::{StatsCounts, STATS_RETENTION};
use hookwise_core::PortError;
use rusqlite::{params, Connection, OptionalExtension};

use crate::{db_err, from_json, from_nanos, is_constraint_violation, nanos, to_json, LocalBackend};

/// `limit` 0 asks for the default page; larger asks are cut to the maximum.
const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 100;

/// A delivery ready to be written: its JSON and the columns queries use.
struct DeliveryRow {
    id: String,
    tenant_id: String,
    event_id: String,
    subscription_id: String,
    status: &'static str,
    round: u32,
    attempts: u32,
    next_attempt_at: Option<i64>,
    created_at: i64,
    doc: String,
}

impl DeliveryRow {
    fn of(d: &Delivery) -> PortResult<Self> {
        Ok(Self {
            id: d.id.to_string(),
            tenant_id: d.tenant_id.to_string(),
            event_id: d.event_id.to_string(),
            subscription_id: d.subscription_id.to_string(),
            status: d.status.as_str(),
            round: d.round,
            attempts: d.attempts,
            next_attempt_at: d.next_attempt_at.map(nanos),
            created_at: nanos(d.created_at),
            doc: to_json("delivery", d)?,
        })
    }
}

/// An event and its deliveries, checked and encoded, ready to be written in one call.
pub(crate) struct EventRows {
    event_id: String,
    tenant: String,
    key: Option<String>,
    doc: String,
    deliveries: Vec<DeliveryRow>,
}

impl EventRows {
    pub(crate) fn of(event: &Event, deliveries: &[Delivery]) -> PortResult<Self> {
        if let Some(d) = deliveries
            .iter()
            .find(|d| d.event_id != event.id || d.tenant_id != event.tenant_id)
        {
            return Err(PortError::permanent(
                "create event",
                format!(
                    "delivery `{}` does not belong to event `{}` of its tenant",
                    d.id, event.id
                ),
            ));
        }
        Ok(Self {
            event_id: event.id.to_string(),
            tenant: event.tenant_id.to_string(),
            key: event.idempotency_key.clone(),
            doc: to_json("event", event)?,
            deliveries: deliveries.iter().map(DeliveryRow::of).collect::<PortResult<_>>()?,
        })
    }

    /// [`Store::create_event`]'s writes, on the connection's thread.
    pub(crate) fn insert(&self, conn: &Connection) -> PortResult<Created> {
        let err = |e| db_err("create event", e);
        if let Some(key) = &self.key {
            let existing: Option<String> = conn
                .prepare_cached("SELECT id FROM events WHERE tenant_id = ?1 AND idempotency_key = ?2")
                .and_then(|mut s| s.query_row([&self.tenant, key], |row| row.get(0)).optional())
                .map_err(err)?;
            if let Some(existing) = existing {
                let id = EventId::parse(&existing).map_err(|e| PortError::permanent("decode a stored event id", e))?;
                return Ok(Created::Existing(id));
            }
        }
        let inserted = conn
            .prepare_cached("INSERT INTO events (id, tenant_id, idempotency_key, doc) VALUES (?1, ?2, ?3, ?4)")
            .and_then(|mut s| s.execute(params![self.event_id, self.tenant, self.key, self.doc]));
        match inserted {
            Ok(_) => {}
            Err(e) if is_constraint_violation(&e) => {
                return Err(PortError::ConditionFailed(format!(
                    "event `{}` already exists",
                    self.event_id
                )))
            }
            Err(e) => return Err(err(e)),
        }
        {
            let mut stmt = conn
                .prepare_cached(
                    "INSERT INTO deliveries (id, tenant_id, event_id, subscription_id, status, round, attempts,
                                             next_attempt_at, created_at, doc)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                )
                .map_err(err)?;
            for r in &self.deliveries {
                let result = stmt.execute(params![
                    r.id,
                    r.tenant_id,
                    r.event_id,
                    r.subscription_id,
                    r.status,
                    r.round,
                    r.attempts,
                    r.next_attempt_at,
                    r.created_at,
                    r.doc
                ]);
                match result {
                    Ok(_) => {}
                    Err(e) if is_constraint_violation(&e) => {
                        return Err(PortError::ConditionFailed(format!(
                            "delivery `{}` already exists",
                            r.id
                        )))
                    }
                    Err(e) => return Err(err(e)),
                }
            }
        }
        Ok(Created::New)
    }
}

/// The position after the last item of a page: `<created_at nanos>.<delivery id>`.
fn encode_cursor(d: &Delivery) -> String {
    format!("{}.{}", nanos(d.created_at), d.id)
}

fn decode_cursor(cursor: &str) -> PortResult<(i64, String)> {
    let bad = || PortError::InvalidCursor(cursor.to_owned());
    let (at, id) = cursor.split_once('.').ok_or_else(bad)?;
    let at = at.parse::<i64>().map_err(|_| bad())?;
    DeliveryId::parse(id).map_err(|_| bad())?;
    Ok((at, id.to_owned()))
}

/// `Delivery::awaits_queued_message`, in SQL: a first attempt as its ingest stored it, or a
/// retry as its attempt left it (`not_before`, kept in the doc alone, is its next attempt's
/// time) due within `Delivery::QUEUED_RETRY_HORIZON` of its creation.
fn awaits_queued_message() -> String {
    let horizon = Delivery::QUEUED_RETRY_HORIZON.num_nanoseconds().unwrap_or(i64::MAX);
    format!(
        "((status = 'pending' AND round = 0 AND next_attempt_at = created_at)
          OR (status = 'retrying' AND next_attempt_at <= created_at + {horizon}
              AND json_extract(doc, '$.not_before') IS json_extract(doc, '$.next_attempt_at')))"
    )
}

fn query_docs<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    what: &'static str,
    sql: &str,
    params: impl rusqlite::Params,
) -> PortResult<Vec<T>> {
    let mut stmt = conn.prepare_cached(sql).map_err(|e| db_err(what, e))?;
    let docs = stmt
        .query_map(params, |row| row.get::<_, String>(0))
        .map_err(|e| db_err(what, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| db_err(what, e))?;
    docs.iter().map(|doc| from_json(what, doc)).collect()
}

fn query_doc<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    what: &'static str,
    sql: &str,
    params: impl rusqlite::Params,
) -> PortResult<Option<T>> {
    let mut stmt = conn.prepare_cached(sql).map_err(|e| db_err(what, e))?;
    let doc: Option<String> = stmt
        .query_row(params, |row| row.get(0))
        .optional()
        .map_err(|e| db_err(what, e))?;
    doc.map(|d| from_json(what, &d)).transpose()
}

/// An event type's scope as `event_types` keys it: its tenant's id, or '' for the deployment's.
fn catalogue_scope(tenant: Option<&TenantId>) -> String {
    tenant.map_or_else(String::new, |t| t.to_string())
}

#[async_trait]
impl Store for LocalBackend {
    async fn create_tenant(&self, tenant: &Tenant) -> PortResult<()> {
        let id = tenant.id.to_string();
        let hashes: Vec<String> = tenant.api_keys.iter().map(|k| k.hash.clone()).collect();
        let doc = to_json("tenant", tenant)?;
        self.with_conn("create tenant", move |conn| {
            let in_use = |e: rusqlite::Error| {
                if is_constraint_violation(&e) {
                    PortError::ConditionFailed(format!("tenant `{id}` or its API key already exists"))
                } else {
                    db_err("create tenant", e)
                }
            };
            conn.execute("INSERT INTO tenants (id, doc) VALUES (?1, ?2)", params![id, doc])
                .map_err(in_use)?;
            for hash in &hashes {
                conn.execute(
                    "INSERT INTO api_keys (hash, tenant_id) VALUES (?1, ?2)",
                    params![hash, id],
                )
                .map_err(in_use)?;
            }
            Ok(())
        })
        .await
    }

    async fn tenant_by_api_key(&self, api_key_hash: &str) -> PortResult<Option<Tenant>> {
        let hash = api_key_hash.to_owned();
        self.with_conn("find tenant by API key", move |conn| {
            query_doc(
                conn,
                "tenant",
                "SELECT t.doc FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.hash = ?1",
                [&hash],
            )
        })
        .await
    }

    async fn get_tenant(&self, id: &TenantId) -> PortResult<Option<Tenant>> {
        let id = id.to_string();
        self.with_read("get tenant", move |conn| {
            query_doc(conn, "tenant", "SELECT doc FROM tenants WHERE id = ?1", [&id])
        })
        .await
    }

    async fn deployment(&self) -> PortResult<Deployment> {
        self.with_read("read the deployment's settings", move |conn| {
            query_doc(
                conn,
                "deployment",
                "SELECT doc FROM settings WHERE name = 'deployment'",
                [],
            )
        })
        .await
        .map(Option::unwrap_or_default)
    }

    async fn put_deployment(&self, next: &Deployment, read: &Deployment) -> PortResult<()> {
        let doc = to_json("deployment", next)?;
        let version = read.version;
        self.with_conn("write the deployment's settings", move |conn| {
            // A stored copy has a version of 1 or more: `read` at 0 is of none stored.
            let sql = if version == 0 {
                "INSERT INTO settings (name, doc) SELECT 'deployment', ?1 WHERE ?2 = 0
                 ON CONFLICT (name) DO NOTHING"
            } else {
                "UPDATE settings SET doc = ?1 WHERE name = 'deployment' AND json_extract(doc, '$.version') = ?2"
            };
            let changed = conn
                .execute(sql, params![doc, version])
                .map_err(|e| db_err("write the deployment's settings", e))?;
            if changed == 0 {
                return Err(PortError::ConditionFailed("the deployment's settings changed".into()));
            }
            Ok(())
        })
        .await
    }

    async fn create_portal_session(&self, session: &PortalSession) -> PortResult<()> {
        let id = session.id.to_string();
        let doc = to_json("portal session", session)?;
        self.with_conn("create portal session", move |conn| {
            let added = conn
                .execute(
                    "INSERT INTO portal_sessions (id, doc) VALUES (?1, ?2) ON CONFLICT (id) DO NOTHING",
                    params![id, doc],
                )
                .map_err(|e| db_err("create portal session", e))?;
            match added {
                1 => Ok(()),
                _ => Err(PortError::ConditionFailed(format!("portal session `{id}` exists"))),
            }
        })
        .await
    }

    async fn portal_session(&self, id: &PortalSessionId) -> PortResult<Option<PortalSession>> {
        let id = id.to_string();
        self.with_read("read portal session", move |conn| {
            query_doc(
                conn,
                "portal session",
                "SELECT doc FROM portal_sessions WHERE id = ?1",
                [&id],
            )
        })
        .await
    }

    async fn delete_portal_session(&self, id: &PortalSessionId) -> PortResult<bool> {
        let id = id.to_string();
        self.with_conn("delete portal session", move |conn| {
            conn.execute("DELETE FROM portal_sessions WHERE id = ?1", [&id])
                .map(|n| n > 0)
                .map_err(|e| db_err("delete portal session", e))
        })
        .await
    }

    async fn put_event_type(&self, def: &EventTypeDefinition, read_at: Option<DateTime<Utc>>) -> PortResult<()> {
        let scope = catalogue_scope(def.tenant_id.as_ref());
        let name = def.name.to_string();
        let doc = to_json("event type", def)?;
        // `updated_at` as the document holds it (serde's RFC 3339), to compare like for like.
        let read_at = read_at.map(|at| to_json("event type version", &at)).transpose()?;
        self.with_conn("write event type", move |conn| {
            let written = match &read_at {
                None => conn
                    .prepare_cached(
                        "INSERT INTO event_types (scope, name, doc) VALUES (?1, ?2, ?3)
                         ON CONFLICT (scope, name) DO NOTHING",
                    )
                    .and_then(|mut s| s.execute(params![scope, name, doc])),
                Some(read_at) => conn
                    .prepare_cached(
                        "UPDATE event_types SET doc = ?3
                         WHERE scope = ?1 AND name = ?2 AND json_quote(json_extract(doc, '$.updated_at')) = ?4",
                    )
                    .and_then(|mut s| s.execute(params![scope, name, doc, read_at])),
            }
            .map_err(|e| db_err("write event type", e))?;
            if written == 0 {
                return Err(PortError::ConditionFailed(match read_at {
                    None => format!("event type `{name}` exists"),
                    Some(_) => format!("event type `{name}` changed since it was read, or is gone"),
                }));
            }
            Ok(())
        })
        .await
    }

    async fn event_type(&self, tenant: Option<&TenantId>, name: &EventType) -> PortResult<Option<EventTypeDefinition>> {
        let (scope, name) = (catalogue_scope(tenant), name.to_string());
        self.with_read("read event type", move |conn| {
            query_doc(
                conn,
                "event type",
                "SELECT doc FROM event_types WHERE scope = ?1 AND name = ?2",
                [&scope, &name],
            )
        })
        .await
    }

    async fn list_event_types(
        &self,
        tenant: Option<&TenantId>,
        after: Option<&EventType>,
        limit: u32,
    ) -> PortResult<Vec<EventTypeDefinition>> {
        // No name is empty: after '' is from the start. Text compares byte by byte (BINARY).
        let (scope, after) = (
            catalogue_scope(tenant),
            after.map_or_else(String::new, |a| a.to_string()),
        );
        self.with_read("list event types", move |conn| {
            query_docs(
                conn,
                "event type",
                "SELECT doc FROM event_types WHERE scope = ?1 AND name > ?2 ORDER BY name LIMIT ?3",
                params![scope, after, limit],
            )
        })
        .await
    }

    async fn list_tenants(&self, after: Option<&TenantId>, limit: u32) -> PortResult<Vec<Tenant>> {
        let after = after.map_or_else(String::new, |a| a.to_string());
        self.with_read("list tenants", move |conn| {
            query_docs(
                conn,
                "tenant",
                "SELECT doc FROM tenants WHERE id > ?1 ORDER BY id LIMIT ?2",
                params![after, limit],
            )
        })
        .await
    }

    async fn update_tenant(&self, tenant: &Tenant, read: &Tenant) -> PortResult<()> {
        let id = tenant.id.to_string();
        let (claimed, freed) = tenant.key_changes(read);
        let claimed: Vec<String> = claimed.into_iter().map(|k| k.hash.clone()).collect();
        let freed: Vec<String> = freed.into_iter().map(|k| k.hash.clone()).collect();
        let version = read.version;
        let doc = to_json("tenant", tenant)?;
        self.with_conn("update tenant", move |conn| {
            let changed = conn
                .execute(
                    "UPDATE tenants SET doc = ?2 WHERE id = ?1 AND coalesce(json_extract(doc, '$.version'), 0) = ?3",
                    params![id, doc, version],
                )
                .map_err(|e| db_err("update tenant", e))?;
            if changed == 0 {
                return Err(PortError::ConditionFailed(format!(
                    "tenant `{id}` changed since it was read, or is gone"
                )));
            }
            for hash in &freed {
                conn.execute(
                    "DELETE FROM api_keys WHERE hash = ?1 AND tenant_id = ?2",
                    params![hash, id],
                )
                .map_err(|e| db_err("update tenant", e))?;
            }
            for hash in &claimed {
                conn.execute(
                    "INSERT INTO api_keys (hash, tenant_id) VALUES (?1, ?2)",
                    params![hash, id],
                )
                .map_err(|e| match is_constraint_violation(&e) {
                    true => PortError::ConditionFailed("API key already in use".into()),
                    false => db_err("update tenant", e),
                })?;
            }
            Ok(())
        })
        .await
    }

    async fn create_subscription(&self, sub: &Subscription) -> PortResult<()> {
        let id = sub.id.to_string();
        let tenant = sub.tenant_id.to_string();
        let created_at = nanos(sub.created_at);
        let doc = to_json("subscription", sub)?;
        self.with_conn("create subscription", move |conn| {
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO subscriptions (id, tenant_id, created_at, doc) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (id) DO NOTHING",
                )
                .and_then(|mut s| s.execute(params![id, tenant, created_at, doc]))
                .map_err(|e| db_err("create subscription", e))?;
            if inserted == 0 {
                return Err(PortError::ConditionFailed(format!("subscription `{id}` exists")));
            }
            Ok(())
        })
        .await
    }

    async fn replace_subscription(&self, sub: &Subscription, read_at: DateTime<Utc>) -> PortResult<()> {
        let id = sub.id.to_string();
        let tenant = sub.tenant_id.to_string();
        let doc = to_json("subscription", sub)?;
        // `updated_at` as the document holds it (serde's RFC 3339), to compare like for like.
        let read_at = to_json("subscription version", &read_at)?;
        self.with_conn("replace subscription", move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE subscriptions SET doc = ?3
                     WHERE id = ?1 AND tenant_id = ?2 AND json_quote(json_extract(doc, '$.updated_at')) = ?4",
                )
                .and_then(|mut s| s.execute(params![id, tenant, doc, read_at]))
                .map_err(|e| db_err("replace subscription", e))?;
            if changed == 0 {
                return Err(PortError::ConditionFailed(format!(
                    "subscription `{id}` changed since it was read, or is gone"
                )));
            }
            Ok(())
        })
        .await
    }

    async fn get_subscription(&self, tenant: &TenantId, id: &SubscriptionId) -> PortResult<Option<Subscription>> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.with_read("get subscription", move |conn| {
            query_doc(
                conn,
                "subscription",
                "SELECT doc FROM subscriptions WHERE id = ?1 AND tenant_id = ?2",
                [&id, &tenant],
            )
        })
        .await
    }

    async fn list_subscriptions(
        &self,
        tenant: &TenantId,
        after: Option<&SubscriptionId>,
        limit: u32,
    ) -> PortResult<Vec<Subscription>> {
        let (tenant, after) = (tenant.to_string(), after.map_or_else(String::new, |a| a.to_string()));
        self.with_read("list subscriptions", move |conn| {
            query_docs(
                conn,
                "subscription",
                "SELECT doc FROM subscriptions WHERE tenant_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
                rusqlite::params![tenant, after, limit],
            )
        })
        .await
    }

    async fn delete_subscription(&self, tenant: &TenantId, id: &SubscriptionId) -> PortResult<bool> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.with_conn("delete subscription", move |conn| {
            let deleted = conn
                .execute(
                    "DELETE FROM subscriptions WHERE id = ?1 AND tenant_id = ?2",
                    [&id, &tenant],
                )
                .map_err(|e| db_err("delete subscription", e))?;
            if deleted > 0 {
                conn.execute("DELETE FROM endpoint_health WHERE subscription_id = ?1", [&id])
                    .map_err(|e| db_err("delete subscription", e))?;
                conn.execute("DELETE FROM endpoint_stats WHERE subscription_id = ?1", [&id])
                    .map_err(|e| db_err("delete subscription", e))?;
            }
            Ok(deleted > 0)
        })
        .await
    }

    async fn create_event(&self, event: &Event, deliveries: &[Delivery]) -> PortResult<Created> {
        let rows = EventRows::of(event, deliveries)?;
        self.with_conn("create event", move |conn| rows.insert(conn)).await
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> PortResult<Option<Event>> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.with_read("get event", move |conn| {
            query_doc(
                conn,
                "event",
                "SELECT doc FROM events WHERE id = ?1 AND tenant_id = ?2",
                [&id, &tenant],
            )
        })
        .await
    }

    async fn event_deliveries(&self, tenant: &TenantId, event: &EventId) -> PortResult<Vec<Delivery>> {
        let (tenant, event) = (tenant.to_string(), event.to_string());
        self.with_conn("list an event's deliveries", move |conn| {
            query_docs(
                conn,
                "delivery",
                "SELECT doc FROM deliveries WHERE event_id = ?1 AND tenant_id = ?2 ORDER BY created_at, id",
                [&event, &tenant],
            )
        })
        .await
    }

    async fn get_delivery(&self, id: &DeliveryId) -> PortResult<Option<Delivery>> {
        let id = id.to_string();
        self.with_read("get delivery", move |conn| {
            query_doc(conn, "delivery", "SELECT doc FROM deliveries WHERE id = ?1", [&id])
        })
        .await
    }

    async fn list_deliveries(&self, tenant: &TenantId, query: &DeliveryQuery) -> PortResult<DeliveryPage> {
        let limit = match query.limit {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let after = query.cursor.as_deref().map(decode_cursor).transpose()?;
        let tenant = tenant.to_string();
        let status = query.status.map(|s| s.as_str());
        let subscription = query.subscription_id.as_ref().map(|s| s.to_string());
        self.with_read("list deliveries", move |conn| {
            // Only the filters asked for go into the SQL, so each shape can use its index;
            // `(created_at, id) < (?, ?)` starts the scan right after the cursor.
            let mut sql = String::from("SELECT doc FROM deliveries WHERE tenant_id = ?");
            let mut args: Vec<rusqlite::types::Value> = vec![tenant.clone().into()];
            if let Some(status) = status {
                sql.push_str(" AND status = ?");
                args.push(status.to_owned().into());
            }
            if let Some(sub) = &subscription {
                sql.push_str(" AND subscription_id = ?");
                args.push(sub.clone().into());
            }
            if let Some((at, id)) = &after {
                sql.push_str(" AND (created_at, id) < (?, ?)");
                args.push((*at).into());
                args.push(id.clone().into());
            }
            sql.push_str(" ORDER BY created_at DESC, id DESC LIMIT ?");
            args.push(i64::from(limit + 1).into());
            let mut items: Vec<Delivery> = query_docs(conn, "delivery", &sql, rusqlite::params_from_iter(args))?;
            let next_cursor = if items.len() > limit as usize {
                items.truncate(limit as usize);
                items.last().map(encode_cursor)
            } else {
                None
            };
            Ok(DeliveryPage { items, next_cursor })
        })
        .await
    }

    async fn apply_change(&self, change: &DeliveryChange) -> PortResult<()> {
        if let Some(a) = &change.attempt {
            if a.delivery_id != change.next.id {
                return Err(PortError::permanent(
                    "apply delivery change",
                    format!(
                        "attempt of `{}` recorded against delivery `{}`",
                        a.delivery_id, change.next.id
                    ),
                ));
            }
        }
        let row = DeliveryRow::of(&change.next)?;
        let expected = change.expected;
        let attempt = match &change.attempt {
            Some(a) => Some((a.round, a.attempt, to_json("attempt", a)?)),
            None => None,
        };
        self.with_conn("apply delivery change", move |conn| {
            let err = |e| db_err("apply delivery change", e);
            let updated = conn
                .prepare_cached(
                    "UPDATE deliveries
                     SET status = ?1, round = ?2, attempts = ?3, next_attempt_at = ?4, doc = ?5
                     WHERE id = ?6 AND tenant_id = ?7 AND event_id = ?8 AND subscription_id = ?9
                       AND status = ?10 AND round = ?11 AND attempts = ?12",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        row.status,
                        row.round,
                        row.attempts,
                        row.next_attempt_at,
                        row.doc,
                        row.id,
                        row.tenant_id,
                        row.event_id,
                        row.subscription_id,
                        expected.status.as_str(),
                        expected.round,
                        expected.attempts
                    ])
                })
                .map_err(err)?;
            if updated == 0 {
                return Err(PortError::ConditionFailed(format!(
                    "delivery `{}` is no longer {} at round {} after {} attempts",
                    row.id,
                    expected.status.as_str(),
                    expected.round,
                    expected.attempts
                )));
            }
            if let Some((round, number, doc)) = &attempt {
                let inserted = conn
                    .prepare_cached("INSERT INTO attempts (delivery_id, round, attempt, doc) VALUES (?1, ?2, ?3, ?4)")
                    .and_then(|mut s| s.execute(params![row.id, round, number, doc]));
                match inserted {
                    Ok(_) => {}
                    // The error rolls the delivery's update back too.
                    Err(e) if is_constraint_violation(&e) => {
                        return Err(PortError::ConditionFailed(format!(
                            "attempt {number} of round {round} of delivery `{}` is already recorded",
                            row.id
                        )))
                    }
                    Err(e) => return Err(err(e)),
                }
            }
            Ok(())
        })
        .await
    }

    async fn attempts(&self, delivery: &DeliveryId) -> PortResult<Vec<Attempt>> {
        let id = delivery.to_string();
        self.with_conn("list attempts", move |conn| {
            query_docs(
                conn,
                "attempt",
                "SELECT doc FROM attempts WHERE delivery_id = ?1 ORDER BY round, attempt",
                [&id],
            )
        })
        .await
    }

    async fn overdue_deliveries(&self, due_before: DateTime<Utc>, limit: u32) -> PortResult<Vec<Delivery>> {
        let before = nanos(due_before);
        self.with_conn("list overdue deliveries", move |conn| {
            query_docs(
                conn,
                "delivery",
                // `Delivery::is_swept`, in SQL (the partial index still applies), but for
                // early retries (`Delivery::awaits_queued_retry`): here no audit runs (one
                // database holds the queue, which loses nothing, and the audit would only
                // duplicate a backlog), so the sweep is their backstop, for a retry an older
                // build wrote and died before queueing.
                "SELECT doc FROM deliveries
                 WHERE status IN ('pending', 'retrying')
                   AND NOT (status = 'pending' AND round = 0 AND next_attempt_at = created_at)
                   AND next_attempt_at < ?1
                 ORDER BY next_attempt_at, id LIMIT ?2",
                params![before, limit],
            )
        })
        .await
    }

    async fn awaiting_queued_message(
        &self,
        created: std::ops::Range<DateTime<Utc>>,
        after: Option<&str>,
        limit: u32,
    ) -> PortResult<AuditPage> {
        const WHAT: &str = "audit queued messages";
        let (from, to) = (nanos(created.start), nanos(created.end));
        let (after_at, after_id) = match after {
            Some(a) => decode_cursor(a)?,
            None => (i64::MIN, String::new()),
        };
        let limit = limit.max(1);
        let deliveries: Vec<Delivery> = self
            .with_conn(WHAT, move |conn| {
                // The store and the queue are one database here, so every stored delivery
                // is committed.
                query_docs(
                    conn,
                    WHAT,
                    &format!(
                        "SELECT doc FROM deliveries
                         WHERE status IN ('pending', 'retrying') AND {}
                           AND created_at >= ?1 AND created_at < ?2 AND (created_at, id) > (?3, ?4)
                         ORDER BY created_at, id LIMIT ?5",
                        awaits_queued_message()
                    ),
                    params![from, to, after_at, after_id, limit],
                )
            })
            .await?;
        let next = (deliveries.len() == limit as usize).then(|| encode_cursor(deliveries.last().unwrap()));
        Ok(AuditPage { deliveries, next })
    }

    async fn limit_rate(
        &self,
        sub: &SubscriptionId,
        interval: std::time::Duration,
        now: DateTime<Utc>,
        arrival: Arrival,
    ) -> PortResult<Verdict> {
        let sub = sub.to_string();
        self.with_conn("take a rate-limit turn", move |conn| {
            let lines = conn
                .prepare_cached("SELECT next_turn, last_slot, alive FROM rate_lines WHERE subscription_id = ?1")
                .and_then(|mut s| {
                    s.query_row([&sub], |row| {
                        Ok(Lines {
                            next_turn: row.get::<_, Option<i64>>(0)?.map(from_nanos),
                            last_slot: row.get::<_, Option<i64>>(1)?.map(from_nanos),
                            alive: row.get::<_, Option<i64>>(2)?.map(from_nanos),
                        })
                    })
                    .optional()
                })
                .map_err(|e| db_err("read the rate-limit lines", e))?
                .unwrap_or_default();
            let (verdict, after) = rate_limit::admit(lines, interval, now, arrival);
            conn.prepare_cached(
                "INSERT INTO rate_lines (subscription_id, next_turn, last_slot, alive) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (subscription_id) DO UPDATE
                 SET next_turn = excluded.next_turn, last_slot = excluded.last_slot, alive = excluded.alive",
            )
            .and_then(|mut s| {
                s.execute(params![
                    sub,
                    after.next_turn.map(nanos),
                    after.last_slot.map(nanos),
                    after.alive.map(nanos)
                ])
            })
            .map_err(|e| db_err("write the rate-limit lines", e))?;
            Ok(verdict)
        })
        .await
    }

    async fn circuit(&self, sub: &SubscriptionId) -> PortResult<Option<Circuit>> {
        let id = sub.to_string();
        self.with_conn("read a circuit breaker", move |conn| {
            query_doc(
                conn,
                "circuit breaker",
                "SELECT doc FROM circuits WHERE subscription_id = ?1",
                [&id],
            )
        })
        .await
    }

    async fn put_circuit(&self, sub: &SubscriptionId, circuit: &Circuit, read: Option<&Circuit>) -> PortResult<()> {
        const WHAT: &str = "write a circuit breaker";
        let id = sub.to_string();
        let doc = to_json("circuit breaker", circuit)?;
        let version = circuit.version as i64;
        let read = read.map(|r| r.version as i64);
        self.with_conn(WHAT, move |conn| {
            let written = match read {
                None => conn
                    .prepare_cached(
                        "INSERT INTO circuits (subscription_id, version, doc) VALUES (?1, ?2, ?3)
                         ON CONFLICT (subscription_id) DO NOTHING",
                    )
                    .and_then(|mut s| s.execute(params![id, version, doc])),
                Some(read) => conn
                    .prepare_cached(
                        "UPDATE circuits SET version = ?2, doc = ?3 WHERE subscription_id = ?1 AND version = ?4",
                    )
                    .and_then(|mut s| s.execute(params![id, version, doc, read])),
            }
            .map_err(|e| db_err(WHAT, e))?;
            if written == 0 {
                return Err(PortError::ConditionFailed(
                    "the circuit breaker changed since it was read".into(),
                ));
            }
            Ok(())
        })
        .await
    }

    async fn endpoint_health(&self, sub: &SubscriptionId) -> PortResult<EndpointHealth> {
        let id = sub.to_string();
        self.with_read("read endpoint health", move |conn| {
            Ok(query_doc(
                conn,
                "endpoint health",
                "SELECT doc FROM endpoint_health WHERE subscription_id = ?1",
                [&id],
            )?
            .unwrap_or_default())
        })
        .await
    }

    async fn save_endpoint_health(&self, sub: &SubscriptionId, health: &EndpointHealth) -> PortResult<()> {
        let id = sub.to_string();
        let read = health.version as i64;
        let doc = to_json(
            "endpoint health",
            &EndpointHealth {
                version: health.version + 1,
                ..health.clone()
            },
        )?;
        self.with_conn("save endpoint health", move |conn| {
            // Over the version read only (0: none, or one saved before versions were kept), or
            // over this very save (again, its answer lost: it writes the same).
            let sql = match read {
                0 => {
                    "INSERT INTO endpoint_health (subscription_id, doc) VALUES (?1, ?2)
                     ON CONFLICT (subscription_id) DO UPDATE SET doc = excluded.doc
                       WHERE coalesce(json_extract(endpoint_health.doc, '$.version'), 0) = ?3
                          OR endpoint_health.doc = excluded.doc"
                }
                _ => {
                    "UPDATE endpoint_health SET doc = ?2
                     WHERE subscription_id = ?1
                       AND (coalesce(json_extract(doc, '$.version'), 0) = ?3 OR doc = ?2)"
                }
            };
            let written = conn
                .prepare_cached(sql)
                .and_then(|mut s| s.execute(params![id, doc, read]))
                .map_err(|e| db_err("save endpoint health", e))?;
            if written == 0 {
                return Err(PortError::ConditionFailed(format!(
                    "the endpoint health of {id} was saved since it was read"
                )));
            }
            Ok(())
        })
        .await
    }

    async fn add_endpoint_stats(
        &self,
        sub: &SubscriptionId,
        counts: &[(DateTime<Utc>, StatsCounts)],
    ) -> PortResult<()> {
        const WHAT: &str = "add endpoint stats";
        let Some(newest) = counts.iter().map(|(at, _)| *at).max() else {
            return Ok(());
        };
        let id = sub.to_string();
        let counts: Vec<(i64, StatsCounts)> = counts.iter().map(|(at, c)| (nanos(*at), *c)).collect();
        // Buckets past their retention go as new ones come, by the buckets' own times (no
        // clock here): an endpoint that no longer sends keeps its last week until deleted.
        let expired = newest.checked_sub_signed(STATS_RETENTION).map_or(i64::MIN, nanos);
        self.with_conn(WHAT, move |conn| {
            // Read, add, write back: the writing thread runs one call at a time, so no other
            // add comes between.
            for (bucket, c) in &counts {
                let mut sum: StatsCounts = query_doc(
                    conn,
                    "endpoint stats",
                    "SELECT doc FROM endpoint_stats WHERE subscription_id = ?1 AND bucket = ?2",
                    params![id, bucket],
                )?
                .unwrap_or_default();
                sum.add(c);
                let doc = to_json("endpoint stats", &sum)?;
                conn.prepare_cached(
                    "INSERT INTO endpoint_stats (subscription_id, bucket, doc) VALUES (?1, ?2, ?3)
                     ON CONFLICT (subscription_id, bucket) DO UPDATE SET doc = excluded.doc",
                )
                .and_then(|mut s| s.execute(params![id, bucket, doc]))
                .map_err(|e| db_err(WHAT, e))?;
            }
            conn.prepare_cached("DELETE FROM endpoint_stats WHERE subscription_id = ?1 AND bucket < ?2")
                .and_then(|mut s| s.execute(params![id, expired]))
                .map_err(|e| db_err(WHAT, e))?;
            Ok(())
        })
        .await
    }

    async fn endpoint_stats(
        &self,
        sub: &SubscriptionId,
        from: DateTime<Utc>,
    ) -> PortResult<Vec<(DateTime<Utc>, StatsCounts)>> {
        const WHAT: &str = "read endpoint stats";
        let (id, from) = (sub.to_string(), nanos(from));
        self.with_read(WHAT, move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT bucket, doc FROM endpoint_stats WHERE subscription_id = ?1 AND bucket >= ?2
                     ORDER BY bucket",
                )
                .map_err(|e| db_err(WHAT, e))?;
            let rows = stmt
                .query_map(params![id, from], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
                })
                .map_err(|e| db_err(WHAT, e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| db_err(WHAT, e))?;
            rows.iter()
                .map(|(bucket, doc)| Ok((from_nanos(*bucket), from_json("endpoint stats", doc)?)))
                .collect()
        })
        .await
    }

    async fn queue_dead_notice(&self, owner: &Email, notice: &DeadNotice) -> PortResult<bool> {
        let (id, round, owner) = (notice.delivery_id.to_string(), notice.round, owner.to_string());
        let died_at = nanos(notice.died_at);
        let doc = to_json("dead notice", notice)?;
        self.with_conn("queue dead notice", move |conn| {
            let added = conn
                .prepare_cached(
                    "INSERT INTO notices (delivery_id, round, owner, died_at, doc) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (delivery_id, round) DO NOTHING",
                )
                .and_then(|mut s| s.execute(params![id, round, owner, died_at, doc]))
                .map_err(|e| db_err("queue dead notice", e))?;
            Ok(added == 1)
        })
        .await
    }

    async fn due_digests(&self, now: DateTime<Utc>, window_start: DateTime<Utc>, limit: u32) -> PortResult<Vec<Email>> {
        let (now, window_start) = (nanos(now), nanos(window_start));
        let owners: Vec<String> = self
            .with_conn("due digests", move |conn| {
                conn.prepare_cached(
                    "SELECT DISTINCT n.owner FROM notices n LEFT JOIN digests g ON g.owner = n.owner
                     WHERE n.sent_at IS NULL AND (g.last_sent_at IS NULL OR g.last_sent_at <= ?1)
                       AND (g.retry_at IS NULL OR g.retry_at <= ?3)
                     ORDER BY n.owner LIMIT ?2",
                )
                .and_then(|mut s| {
                    s.query_map(params![window_start, limit, now], |row| row.get(0))?
                        .collect::<Result<_, _>>()
                })
                .map_err(|e| db_err("due digests", e))
            })
            .await?;
        owners
            .iter()
            .map(|o| Email::parse(o).map_err(|e| PortError::permanent("due digests", format!("owner `{o}`: {e}"))))
            .collect()
    }

    async fn claim_digest(
        &self,
        owner: &Email,
        now: DateTime<Utc>,
        window_start: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> PortResult<Option<DigestClaim>> {
        let who = owner.to_string();
        let (at, window_start, stale_before) = (nanos(now), nanos(window_start), nanos(stale_before));
        let docs: Option<Vec<String>> = self
            .with_conn("claim digest", move |conn| {
                let err = |e| db_err("claim digest", e);
                let docs: Vec<String> = conn
                    .prepare_cached(
                        "SELECT doc FROM notices WHERE owner = ?1 AND sent_at IS NULL ORDER BY died_at, delivery_id",
                    )
                    .and_then(|mut s| s.query_map([&who], |row| row.get(0))?.collect::<Result<_, _>>())
                    .map_err(err)?;
                if docs.is_empty() {
                    return Ok(None);
                }
                let claimed = conn
                    .prepare_cached(
                        "INSERT INTO digests (owner, claimed_at) VALUES (?1, ?2)
                         ON CONFLICT (owner) DO UPDATE SET claimed_at = excluded.claimed_at
                         WHERE (last_sent_at IS NULL OR last_sent_at <= ?3) AND (claimed_at IS NULL OR claimed_at < ?4)
                           AND (retry_at IS NULL OR retry_at <= ?2)",
                    )
                    .and_then(|mut s| s.execute(params![who, at, window_start, stale_before]))
                    .map_err(err)?;
                Ok((claimed == 1).then_some(docs))
            })
            .await?;
        let Some(docs) = docs else { return Ok(None) };
        let notices = docs
            .iter()
            .map(|doc| from_json("dead notice", doc))
            .collect::<PortResult<_>>()?;
        Ok(Some(DigestClaim::new(owner.clone(), notices, now, 0)))
    }

    async fn finish_digest(&self, claim: &DigestClaim) -> PortResult<()> {
        let owner = claim.owner.to_string();
        let at = nanos(claim.claimed_at);
        let sent: Vec<(String, u32)> = claim
            .notices
            .iter()
            .map(|n| (n.delivery_id.to_string(), n.round))
            .collect();
        self.with_conn("finish digest", move |conn| {
            let err = |e| db_err("finish digest", e);
            let mut mark = conn
                .prepare_cached("UPDATE notices SET sent_at = ?3 WHERE delivery_id = ?1 AND round = ?2")
                .map_err(err)?;
            for (id, round) in &sent {
                mark.execute(params![id, round, at]).map_err(err)?;
            }
            conn.prepare_cached(
                "UPDATE digests SET last_sent_at = claimed_at, claimed_at = NULL, retry_at = NULL
                 WHERE owner = ?1 AND claimed_at = ?2",
            )
            .and_then(|mut s| s.execute(params![owner, at]))
            .map_err(err)?;
            Ok(())
        })
        .await
    }

    async fn release_digest(&self, claim: &DigestClaim, retry_at: DateTime<Utc>) -> PortResult<()> {
        let owner = claim.owner.to_string();
        let (at, retry_at) = (nanos(claim.claimed_at), nanos(retry_at));
        self.with_conn("release digest", move |conn| {
            conn.prepare_cached(
                "UPDATE digests SET claimed_at = NULL, retry_at = ?3 WHERE owner = ?1 AND claimed_at = ?2",
            )
            .and_then(|mut s| s.execute(params![owner, at, retry_at]))
            .map_err(|e| db_err("release digest", e))?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_corrupt_row_is_a_permanent_error_not_a_panic() {
        let backend = LocalBackend::open_in_memory().unwrap();
        let id = "dlv_01J0000000000000000000000A";
        backend
            .with_conn("corrupt a row", move |conn| {
                conn.execute(
                    "INSERT INTO deliveries (id, tenant_id, event_id, subscription_id, status, round, attempts, created_at, doc)
                     VALUES (?1, 'ten_x', 'evt_x', 'sub_x', 'pending', 0, 0, 0, '{not json')",
                    [id],
                )
                .map_err(|e| db_err("corrupt a row", e))
            })
            .await
            .unwrap();
        let err = backend.get_delivery(&DeliveryId::parse(id).unwrap()).await.unwrap_err();
        assert!(matches!(err, PortError::Permanent { .. }), "{err:?}");
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        assert!(decode_cursor("nonsense").is_err());
        assert!(decode_cursor("12.not_an_id").is_err());
        assert!(decode_cursor("x.dlv_01J0000000000000000000000A").is_err());
        assert_eq!(
            decode_cursor("-5.dlv_01J0000000000000000000000A").unwrap(),
            (-5, "dlv_01J0000000000000000000000A".to_owned())
        );
    }
}
