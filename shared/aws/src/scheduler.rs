//! The scheduler table: retries due later than SQS can delay, one partition per minute and
//! shard.
//!
//! | item   | `bucket` (partition)                  | `due_key` (sort)                     |
//! |--------|---------------------------------------|--------------------------------------|
//! | task   | due minute and shard `2026-11-30T05:07#3` | `{due}#{delivery}#{round}#{attempt}` |
//! | cursor | `#CURSOR#3`                           | `#CURSOR`: `pending` (string set of the minutes that may hold tasks), `version` |
//! | held   | `HELD#{subscription}`                 | `{delivery}#{round}#{attempt}` |
//! | lease  | `#LEASE`                              | `#LEASE`: `holder`, `lease_until` (the scheduler's one-at-a-time) |
//! | holding | `#HOLDING#3` (by subscription)       | `{subscription}`: `tenant_id` (the endpoints the scheduler tends) |
//! | audit  | `#AUDIT`                              | `#AUDIT`: `position` (how far the audit of queued messages has got, JSON) |
//! | tend   | `#TEND`                               | `#TEND`: `after` (the last endpoint the scheduler tended; absent: none) |
//! | aside  | `#ASIDE`                              | `{bucket} {due_key}` of an item `due_page` could not read: `raw` (its attributes, a map), `error`, `set_aside_at` |
//!
//! A delivery's tasks go to one of [`SHARDS`] shards (by its id), each with its own cursor
//! and its own partition per minute, so a burst of long retries spreads over eight keys
//! rather than heating one cursor item and one minute. A shard's minute of due tasks is one
//! Query. So that a minute is never skipped (a tick that failed, a Lambda that did not run
//! for an hour), `schedule` adds its minute to its shard's cursor, and `due` reads every
//! cursor and queries exactly the pending minutes up to `until`, oldest first; a minute found
//! empty leaves its cursor's set, by a write conditional on the cursor's `version` so a task
//! scheduled meanwhile keeps its minute in it.
//!
//! A held attempt (its endpoint's circuit breaker is open) is a `HELD#` item, which its
//! release queries by the endpoint, and a task due when it gives up; its endpoint is listed
//! in a `#HOLDING#` partition (one of [`SHARDS`]) until the scheduler finds it holds none.
//! The held item is keyed by the attempt, as on the other backends: one attempt held twice
//! (with another give-up time) is one item. A table written before kept it at
//! `{due}#{delivery}#{round}#{attempt}`; those items list first, and a release deletes both
//! keys.
//!
//! An item in a due minute or a `HELD#` partition that does not decode as a task is set
//! aside rather than failing the call: copied whole into `#ASIDE` with why and when, then
//! deleted from where it was, so the tasks beside it go on (`SchedulerTable::set_aside` lists
//! them for an operator; only those of a due minute are counted in the tick's report).
//!
//! Tasks and held items carry `expires_at` (epoch seconds), the table's TTL: their due time
//! plus the retention of the deliveries they are of, so one orphaned (its delivery gone) does
//! not stay for ever; items set aside expire the retention after they were set aside; the
//! cursors, the lease and the positions have none.
//!
//! A table written before the shards has one cursor, `#CURSOR`, and partitions named by the
//! minute alone: `due` reads it as one more shard, so its tasks come due as before and it
//! empties as they are removed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};
use aws_sdk_dynamodb::Client;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use hookwise_core::model::{DeliveryId, SubscriptionId, TenantId};
use hookwise_core::ports::{
    AuditPosition, DeliveryTask, DuePage, Holding, PortResult, ScheduledTask, SchedulerTable, SetAsideItem,
};
use hookwise_core::PortError;

use crate::error::classify;
use crate::item::{corrupt, expires_at, get_n, get_s, n, s, sortable_time, spread, ttl_retention, Item};
use crate::lazy_client::LazyClient;

pub const PARTITION_KEY: &str = "bucket";
pub const SORT_KEY: &str = "due_key";
const CURSOR: &str = "#CURSOR";
const LEASE: &str = "#LEASE";
const HOLDING: &str = "#HOLDING";
const AUDIT: &str = "#AUDIT";
const TEND: &str = "#TEND";
const ASIDE: &str = "#ASIDE";
/// Shards of the table's keys.
pub const SHARDS: u32 = 8;
/// DynamoDB's limit on one `BatchWriteItem`.
const MAX_BATCH_WRITE: usize = 25;
const CONCURRENCY: usize = 4;

/// The minute a time falls in, as the partition key.
pub fn minute_bucket(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M").to_string()
}

fn due_key(item: &ScheduledTask) -> String {
    format!(
        "{}#{}#{}#{}",
        sortable_time(item.due),
        item.task.delivery_id,
        item.task.round,
        item.task.attempt
    )
}

/// A cursor and the partitions it names: a shard's, or the one of a table written before
/// the shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Shard {
    Unsharded,
    Of(u32),
}

impl Shard {
    fn all() -> impl Iterator<Item = Shard> {
        std::iter::once(Shard::Unsharded).chain((0..SHARDS).map(Shard::Of))
    }

    fn of(task: &DeliveryTask) -> Shard {
        Shard::Of(spread(task.delivery_id.as_str(), SHARDS))
    }

    fn bucket(self, minute: &str) -> String {
        match self {
            Shard::Unsharded => minute.to_owned(),
            Shard::Of(n) => format!("{minute}#{n}"),
        }
    }

    fn cursor_key(self) -> Item {
        let pk = match self {
            Shard::Unsharded => CURSOR.to_owned(),
            Shard::Of(n) => format!("{CURSOR}#{n}"),
        };
        HashMap::from([(PARTITION_KEY.to_owned(), s(pk)), (SORT_KEY.to_owned(), s(CURSOR))])
    }
}

fn key(shard: Shard, item: &ScheduledTask) -> Item {
    HashMap::from([
        (PARTITION_KEY.to_owned(), s(shard.bucket(&minute_bucket(item.due)))),
        (SORT_KEY.to_owned(), s(due_key(item))),
    ])
}

fn decode(item: &Item) -> PortResult<ScheduledTask> {
    let due = DateTime::parse_from_rfc3339(get_s(item, "due")?)
        .map_err(|e| corrupt("due", e.to_string()))?
        .with_timezone(&Utc);
    let delivery_id =
        DeliveryId::parse(get_s(item, "delivery_id")?).map_err(|e| corrupt("delivery_id", e.to_string()))?;
    let slot = item.get("slot").map(|_| time_attr(item, "slot")).transpose()?;
    let held_until = item
        .get("held_until")
        .map(|_| time_attr(item, "held_until"))
        .transpose()?;
    let tenant_id = item
        .get("tenant_id")
        .map(|_| TenantId::parse(get_s(item, "tenant_id")?).map_err(|e| corrupt("tenant_id", e.to_string())))
        .transpose()?;
    Ok(ScheduledTask {
        task: DeliveryTask {
            delivery_id,
            round: get_n(item, "round")?,
            attempt: get_n(item, "attempt")?,
            queued_at: None,
            slot,
            tenant_id,
            held_until,
            redrives: if item.contains_key("redrives") {
                get_n(item, "redrives")?
            } else {
                0
            },
        },
        due,
    })
}

fn time_attr(item: &Item, name: &str) -> PortResult<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(get_s(item, name)?)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| corrupt(name, e.to_string()))
}

fn time(t: DateTime<Utc>) -> AttributeValue {
    s(t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true))
}

/// The attributes of a task, beside its keys.
fn task_attributes(mut record: Item, item: &ScheduledTask, retention: chrono::Duration) -> Item {
    let task = &item.task;
    record.insert(crate::store::TTL_ATTRIBUTE.into(), expires_at(item.due, retention));
    record.insert("due".into(), time(item.due));
    record.insert("delivery_id".into(), s(task.delivery_id.as_str()));
    record.insert("round".into(), n(task.round));
    record.insert("attempt".into(), n(task.attempt));
    if let Some(slot) = task.slot {
        record.insert("slot".into(), time(slot));
    }
    if let Some(tenant) = &task.tenant_id {
        record.insert("tenant_id".into(), s(tenant.as_str()));
    }
    if let Some(until) = task.held_until {
        record.insert("held_until".into(), time(until));
    }
    if task.redrives > 0 {
        record.insert("redrives".into(), n(task.redrives));
    }
    record
}

/// The scheduler's lease item.
fn lease_key() -> Item {
    HashMap::from([(PARTITION_KEY.to_owned(), s(LEASE)), (SORT_KEY.to_owned(), s(LEASE))])
}

/// A held attempt's item key: in its endpoint's partition, at `sort`.
fn held_key(sub: &SubscriptionId, sort: String) -> Item {
    HashMap::from([
        (PARTITION_KEY.to_owned(), s(format!("HELD#{sub}"))),
        (SORT_KEY.to_owned(), s(sort)),
    ])
}

/// A held attempt's sort key: the attempt's own, so holding it again (another give-up time)
/// replaces its item; the oldest delivery sorts first.
fn held_sort_key(item: &ScheduledTask) -> String {
    let task = &item.task;
    format!("{}#{}#{}", task.delivery_id, task.round, task.attempt)
}

/// How far the audit of queued messages has got: one item.
fn audit_key() -> Item {
    HashMap::from([(PARTITION_KEY.to_owned(), s(AUDIT)), (SORT_KEY.to_owned(), s(AUDIT))])
}

/// Where tending the breakers has got to: one item.
fn tend_key() -> Item {
    HashMap::from([(PARTITION_KEY.to_owned(), s(TEND)), (SORT_KEY.to_owned(), s(TEND))])
}

/// An item's partition and sort key, as its place in `#ASIDE` once set aside.
fn aside_sort_key(item: &Item) -> String {
    let key = |name| match item.get(name) {
        Some(AttributeValue::S(v)) => v.clone(),
        other => format!("{other:?}"),
    };
    format!("{} {}", key(PARTITION_KEY), key(SORT_KEY))
}

/// An attribute as DynamoDB JSON (`{"S": "..."}`), each type kept: what an item set aside held,
/// shown to an operator.
fn dynamodb_json(v: &AttributeValue) -> serde_json::Value {
    use aws_smithy_types::base64;
    use serde_json::json;
    match v {
        AttributeValue::S(x) => json!({ "S": x }),
        AttributeValue::N(x) => json!({ "N": x }),
        AttributeValue::B(x) => json!({ "B": base64::encode(x.as_ref()) }),
        AttributeValue::Bool(x) => json!({ "BOOL": x }),
        AttributeValue::Null(x) => json!({ "NULL": x }),
        AttributeValue::Ss(x) => json!({ "SS": x }),
        AttributeValue::Ns(x) => json!({ "NS": x }),
        AttributeValue::Bs(x) => json!({ "BS": x.iter().map(|b| base64::encode(b.as_ref())).collect::<Vec<_>>() }),
        AttributeValue::L(x) => json!({ "L": x.iter().map(dynamodb_json).collect::<Vec<_>>() }),
        AttributeValue::M(x) => json!({ "M": item_json(x) }),
        other => json!({ "?": format!("{other:?}") }),
    }
}

fn item_json(item: &Item) -> serde_json::Map<String, serde_json::Value> {
    item.iter().map(|(k, v)| (k.clone(), dynamodb_json(v))).collect()
}

/// An endpoint's entry in the list of those holding attempts.
fn holding_key(sub: &SubscriptionId) -> Item {
    HashMap::from([
        (
            PARTITION_KEY.to_owned(),
            s(format!("{HOLDING}#{}", spread(sub.as_str(), SHARDS))),
        ),
        (SORT_KEY.to_owned(), s(sub.as_str())),
    ])
}

#[derive(Clone, Debug)]
pub struct DynamoScheduler {
    client: LazyClient<Client>,
    table: String,
    /// How long after its due time an item expires (the deliveries' retention).
    retention: chrono::Duration,
    /// Tasks `due` found in unsharded partitions, by `due_key`, so `remove` deletes those.
    unsharded: Arc<Mutex<HashSet<String>>>,
}

impl DynamoScheduler {
    pub fn new(client: impl Into<LazyClient<Client>>, table: &str, retention: std::time::Duration) -> Self {
        Self {
            client: client.into(),
            table: table.to_owned(),
            retention: ttl_retention(retention),
            unsharded: Arc::default(),
        }
    }

    /// One conditional write of the lease item (`#h` its holder, `#u` until when); `false`
    /// if its condition did not hold.
    async fn write_lease(
        &self,
        what: &'static str,
        update: &str,
        condition: &str,
        values: &[(&str, AttributeValue)],
    ) -> PortResult<bool> {
        let values = values.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(lease_key()))
            .update_expression(update)
            .condition_expression(condition)
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#u", "lease_until")
            .set_expression_attribute_values(Some(values))
            .send()
            .await;
        match result.map_err(|e| classify(what, e)) {
            Ok(_) => Ok(true),
            Err(PortError::ConditionFailed(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn unsharded(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.unsharded.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// A shard's minutes that may hold tasks, and its cursor's version.
    async fn cursor(&self, shard: Shard) -> PortResult<(Vec<String>, u64)> {
        let Some(item) = self.read_item(shard.cursor_key(), "read scheduler cursor").await? else {
            return Ok((Vec::new(), 0));
        };
        let mut pending = match item.get("pending") {
            Some(AttributeValue::Ss(set)) => set.clone(),
            _ => Vec::new(),
        };
        pending.sort();
        let version = if item.contains_key("version") {
            get_n(&item, "version")?
        } else {
            0
        };
        Ok((pending, version))
    }

    /// A minute's items due at or before `until`, earliest first, at most `limit`: each task,
    /// or the item that does not decode as one and why.
    async fn query_minute(&self, bucket: &str, until: &str, limit: usize) -> PortResult<Vec<Decoded>> {
        self.query_items(limit, "scheduler due", |q| {
            q.key_condition_expression("#b = :b AND #k < :k")
                .expression_attribute_names("#b", PARTITION_KEY)
                .expression_attribute_names("#k", SORT_KEY)
                .expression_attribute_values(":b", s(bucket))
                // `$` sorts right after `#`: every key of a task due at `until` is below it.
                .expression_attribute_values(":k", s(format!("{until}$")))
        })
        .await
        .map(|items| {
            items
                .into_iter()
                .map(|item| decode(&item).map_err(|error| (item, error)))
                .collect()
        })
    }

    /// `HELD#{sub}`'s tasks, oldest delivery first, at most `limit`.
    /// One that does not decode is set aside, as in a due minute (it would otherwise stop its
    /// endpoint's tending for good), and the page read again without it: a short page still
    /// means the partition's end.
    async fn query_held(&self, sub: &SubscriptionId, limit: usize) -> PortResult<Vec<ScheduledTask>> {
        loop {
            let items = self
                .query_items(limit, "held attempts", |q| {
                    q.key_condition_expression("#b = :b")
                        .expression_attribute_names("#b", PARTITION_KEY)
                        .expression_attribute_values(":b", s(format!("HELD#{sub}")))
                })
                .await?;
            let read = items.len();
            let (mut tasks, mut bad) = (Vec::new(), Vec::new());
            for item in items {
                match decode(&item) {
                    Ok(task) => tasks.push(task),
                    Err(error) => bad.push((item, error)),
                }
            }
            if bad.is_empty() {
                return Ok(tasks);
            }
            self.set_items_aside(Utc::now(), bad).await?;
            if read < limit {
                return Ok(tasks);
            }
        }
    }

    /// One shard of the endpoints listed as holding, by subscription id after `after`.
    async fn query_holding(&self, shard: u32, after: Option<&str>, limit: u32) -> PortResult<Vec<Holding>> {
        let mut found = Vec::new();
        let mut start = None;
        while found.len() < limit as usize {
            let mut q = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .expression_attribute_names("#b", PARTITION_KEY)
                .expression_attribute_values(":b", s(format!("{HOLDING}#{shard}")))
                .limit((limit as usize - found.len()) as i32)
                .set_exclusive_start_key(start);
            q = match after {
                Some(after) => q
                    .key_condition_expression("#b = :b AND #k > :after")
                    .expression_attribute_names("#k", SORT_KEY)
                    .expression_attribute_values(":after", s(after)),
                None => q.key_condition_expression("#b = :b"),
            };
            let page = q.send().await.map_err(|e| classify("endpoints holding attempts", e))?;
            for item in page.items() {
                let sub = get_s(item, SORT_KEY)?;
                let tenant = get_s(item, "tenant_id")?;
                found.push(Holding {
                    subscription_id: SubscriptionId::parse(sub).map_err(|e| corrupt(SORT_KEY, e.to_string()))?,
                    tenant_id: TenantId::parse(tenant).map_err(|e| corrupt("tenant_id", e.to_string()))?,
                });
            }
            start = page.last_evaluated_key.filter(|k| !k.is_empty());
            if start.is_none() {
                break;
            }
        }
        Ok(found)
    }

    /// Every page of a consistent query (`query` sets its condition), up to `limit` items.
    async fn query_items(
        &self,
        limit: usize,
        what: &str,
        query: impl Fn(QueryFluentBuilder) -> QueryFluentBuilder,
    ) -> PortResult<Vec<Item>> {
        let mut items = Vec::new();
        let mut start = None;
        while items.len() < limit {
            let page = query(self.client.query().table_name(&self.table).consistent_read(true))
                .limit((limit - items.len()) as i32)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| classify(what, e))?;
            items.extend(page.items.unwrap_or_default());
            start = page.last_evaluated_key.filter(|k| !k.is_empty());
            if start.is_none() {
                break;
            }
        }
        Ok(items)
    }

    /// Copy each item that did not decode into `#ASIDE` (its attributes, why, when), then
    /// delete it from where it was, one by one, so what is done stays done: copied first, so a
    /// failure between the two leaves it in both, and the next call sets it aside again over
    /// the same copy.
    async fn set_items_aside(&self, now: DateTime<Utc>, bad: Vec<(Item, PortError)>) -> PortResult<()> {
        const WHAT: &str = "set aside a scheduler item that does not decode";
        for (item, error) in bad {
            tracing::error!(key = %aside_sort_key(&item), %error,
                "a scheduler item does not decode; it is set aside (hookwise scheduler set-aside)");
            let record = HashMap::from([
                (PARTITION_KEY.to_owned(), s(ASIDE)),
                (SORT_KEY.to_owned(), s(aside_sort_key(&item))),
                ("error".to_owned(), s(error.to_string())),
                ("set_aside_at".to_owned(), time(now)),
                (crate::store::TTL_ATTRIBUTE.to_owned(), expires_at(now, self.retention)),
                ("raw".to_owned(), AttributeValue::M(item.clone())),
            ]);
            self.write_item(record, WHAT).await?;
            let key = HashMap::from([
                (
                    PARTITION_KEY.to_owned(),
                    item.get(PARTITION_KEY).cloned().unwrap_or_else(|| s("")),
                ),
                (
                    SORT_KEY.to_owned(),
                    item.get(SORT_KEY).cloned().unwrap_or_else(|| s("")),
                ),
            ]);
            self.delete_all(vec![key]).await?;
        }
        Ok(())
    }

    async fn forget_minutes(&self, shard: Shard, empty: Vec<String>, version: u64) -> PortResult<()> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(shard.cursor_key()))
            .update_expression("DELETE #p :empty ADD #v :one")
            .condition_expression("#v = :version")
            .expression_attribute_names("#p", "pending")
            .expression_attribute_names("#v", "version")
            .expression_attribute_values(":empty", AttributeValue::Ss(empty))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":version", n(version))
            .send()
            .await;
        match result.map_err(|e| classify("update scheduler cursor", e)) {
            // A task was scheduled meanwhile: the next tick looks again.
            Ok(_) | Err(PortError::ConditionFailed(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One item by its key, read strongly consistent.
    async fn read_item(&self, key: Item, what: &str) -> PortResult<Option<Item>> {
        self.client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map(|out| out.item)
            .map_err(|e| classify(what, e))
    }

    /// One item written whole, over what was there.
    async fn write_item(&self, item: Item, what: &str) -> PortResult<()> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| classify(what, e))
    }

    async fn delete_all(&self, keys: Vec<Item>) -> PortResult<()> {
        let chunks: Vec<Vec<Item>> = keys.chunks(MAX_BATCH_WRITE).map(<[Item]>::to_vec).collect();
        futures::stream::iter(chunks)
            .map(|c| self.delete_chunk(c))
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn delete_chunk(&self, keys: Vec<Item>) -> PortResult<()> {
        let mut requests: Vec<WriteRequest> = keys
            .into_iter()
            .map(|k| {
                let delete = DeleteRequest::builder()
                    .set_key(Some(k))
                    .build()
                    .map_err(|e| PortError::permanent("building a delete", e))?;
                Ok(WriteRequest::builder().delete_request(delete).build())
            })
            .collect::<PortResult<_>>()?;
        for round in 0..8u32 {
            if requests.is_empty() {
                return Ok(());
            }
            if round > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(25 << round)).await;
            }
            let out = self
                .client
                .batch_write_item()
                .request_items(&self.table, requests)
                .send()
                .await
                .map_err(|e| classify("remove scheduled tasks", e))?;
            requests = out
                .unprocessed_items
                .and_then(|mut u| u.remove(&self.table))
                .unwrap_or_default();
        }
        if requests.is_empty() {
            Ok(())
        } else {
            Err(PortError::retryable(
                "remove scheduled tasks",
                "DynamoDB left deletes unprocessed after 8 tries",
            ))
        }
    }
}

#[async_trait]
impl SchedulerTable for DynamoScheduler {
    async fn schedule(&self, item: &ScheduledTask) -> PortResult<()> {
        let shard = Shard::of(&item.task);
        let record = task_attributes(key(shard, item), item, self.retention);
        self.write_item(record, "schedule task").await?;
        // After the task is written, so a tick that misses the minute's new task is one
        // whose cursor update then fails on the version.
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(shard.cursor_key()))
            .update_expression("ADD #p :minute, #v :one")
            .expression_attribute_names("#p", "pending")
            .expression_attribute_names("#v", "version")
            .expression_attribute_values(":minute", AttributeValue::Ss(vec![minute_bucket(item.due)]))
            .expression_attribute_values(":one", n(1))
            .send()
            .await
            .map_err(|e| classify("update scheduler cursor", e))?;
        Ok(())
    }

    async fn due_page(&self, now: DateTime<Utc>, until: DateTime<Utc>, limit: u32) -> PortResult<DuePage> {
        let limit = limit as usize;
        if limit == 0 {
            return Ok(DuePage::default());
        }
        let cursors: Vec<(Shard, (Vec<String>, u64))> = futures::stream::iter(Shard::all())
            .map(|shard| async move { Ok::<_, PortError>((shard, self.cursor(shard).await?)) })
            .buffered(CONCURRENCY)
            .try_collect()
            .await?;
        let last = minute_bucket(until);
        let until_key = sortable_time(until);
        let mut minutes: Vec<(String, Shard)> = cursors
            .iter()
            .flat_map(|(shard, (pending, _))| pending.iter().filter(|m| **m <= last).map(|m| (m.clone(), *shard)))
            .collect();
        minutes.sort();
        let mut due: Vec<(Shard, ScheduledTask)> = Vec::new();
        let mut bad: Vec<(Item, PortError)> = Vec::new();
        let mut empty: HashMap<Shard, Vec<String>> = HashMap::new();
        // Oldest minute first, a few queries in flight, in order; a minute's shards together.
        let until_key = &until_key;
        let mut results = futures::stream::iter(minutes)
            .map(|(m, shard)| async move {
                let tasks = self.query_minute(&shard.bucket(&m), until_key, limit).await;
                (m, shard, tasks)
            })
            .buffered(CONCURRENCY);
        let mut minute_done: Option<String> = None;
        while let Some((minute, shard, tasks)) = results.next().await {
            // What is set aside counts: a page of them is a call's work too.
            if due.len() + bad.len() >= limit && minute_done.as_ref() != Some(&minute) {
                break;
            }
            let items = tasks?;
            // Every task of a minute before `until`'s is due: none found means none there
            // (what did not decode is set aside below, before the minute is forgotten; a full
            // page of those may have more behind it).
            let only_bad = items.len() < limit && items.iter().all(Result::is_err);
            if minute < last && (items.is_empty() || only_bad) {
                empty.entry(shard).or_default().push(minute.clone());
            }
            for item in items {
                match item {
                    Ok(task) => due.push((shard, task)),
                    Err(item) => bad.push(item),
                }
            }
            minute_done = Some(minute);
        }
        drop(results);
        let set_aside = bad.len();
        if !bad.is_empty() {
            self.set_items_aside(now, bad).await?;
        }
        for (shard, minutes) in empty {
            let version = cursors.iter().find(|(s, _)| *s == shard).map_or(0, |(_, (_, v))| *v);
            self.forget_minutes(shard, minutes, version).await?;
        }
        due.sort_by_key(|(_, t)| (t.due, due_key(t)));
        due.truncate(limit);
        let mut unsharded = self.unsharded();
        for (shard, task) in &due {
            if *shard == Shard::Unsharded {
                unsharded.insert(due_key(task));
            }
        }
        Ok(DuePage {
            tasks: due.into_iter().map(|(_, t)| t).collect(),
            set_aside,
        })
    }

    async fn set_aside(&self, after: Option<&str>, limit: u32) -> PortResult<Vec<SetAsideItem>> {
        const WHAT: &str = "list the scheduler items set aside";
        let items = self
            .query_items(limit as usize, WHAT, |q| {
                let q = q
                    .expression_attribute_names("#b", PARTITION_KEY)
                    .expression_attribute_values(":b", s(ASIDE));
                match after {
                    Some(after) => q
                        .key_condition_expression("#b = :b AND #k > :after")
                        .expression_attribute_names("#k", SORT_KEY)
                        .expression_attribute_values(":after", s(after)),
                    None => q.key_condition_expression("#b = :b"),
                }
            })
            .await?;
        items
            .iter()
            .map(|item| {
                let raw = match item.get("raw") {
                    Some(AttributeValue::M(raw)) => serde_json::Value::Object(item_json(raw)).to_string(),
                    _ => String::new(),
                };
                Ok(SetAsideItem {
                    key: get_s(item, SORT_KEY)?.to_owned(),
                    set_aside_at: time_attr(item, "set_aside_at")?,
                    error: get_s(item, "error")?.to_owned(),
                    raw,
                })
            })
            .collect()
    }

    async fn remove(&self, items: &[ScheduledTask]) -> PortResult<()> {
        let mut keys: Vec<Item> = {
            let mut unsharded = self.unsharded();
            items
                .iter()
                .map(|item| {
                    let shard = if unsharded.remove(&due_key(item)) {
                        Shard::Unsharded
                    } else {
                        Shard::of(&item.task)
                    };
                    key(shard, item)
                })
                .collect()
        };
        keys.dedup();
        self.delete_all(keys).await
    }

    async fn hold(&self, tenant: &TenantId, sub: &SubscriptionId, item: &ScheduledTask) -> PortResult<()> {
        let record = task_attributes(held_key(sub, held_sort_key(item)), item, self.retention);
        self.write_item(record, "hold an attempt").await?;
        // After the held item: an endpoint found holding none is let go, then looked at
        // again, so a hold between the two is seen. Read first (a strongly consistent read),
        // written only if missing: a storm's holds read one item rather than write it.
        let listed = self
            .read_item(holding_key(sub), "read an endpoint's holding entry")
            .await?;
        if listed.is_none() {
            let mut entry = holding_key(sub);
            entry.insert("tenant_id".into(), s(tenant.as_str()));
            self.write_item(entry, "list an endpoint as holding").await?;
        }
        self.schedule(item).await
    }

    async fn holding(&self, after: Option<&SubscriptionId>, limit: u32) -> PortResult<Vec<Holding>> {
        let after = after.map(|a| a.to_string());
        let shards: Vec<Vec<Holding>> = futures::stream::iter(0..SHARDS)
            .map(|shard| self.query_holding(shard, after.as_deref(), limit))
            .buffered(CONCURRENCY)
            .try_collect()
            .await?;
        let mut all: Vec<Holding> = shards.into_iter().flatten().collect();
        all.sort();
        all.truncate(limit as usize);
        Ok(all)
    }

    async fn stop_holding(&self, sub: &SubscriptionId) -> PortResult<()> {
        self.delete_all(vec![holding_key(sub)]).await
    }

    async fn held(&self, sub: &SubscriptionId, limit: u32) -> PortResult<Vec<ScheduledTask>> {
        self.query_held(sub, limit as usize).await
    }

    async fn release(&self, sub: &SubscriptionId, items: &[ScheduledTask]) -> PortResult<()> {
        // Each at its key, and at the one a build before held it at (its give-up time first):
        // such an item lists first, and goes with its release.
        let sort_keys: std::collections::BTreeSet<String> =
            items.iter().flat_map(|i| [held_sort_key(i), due_key(i)]).collect();
        let keys = sort_keys.into_iter().map(|k| held_key(sub, k)).collect();
        self.delete_all(keys).await
    }

    async fn take_lease(&self, holder: &str, now: DateTime<Utc>, until: DateTime<Utc>) -> PortResult<bool> {
        let values = [
            (":h", s(holder)),
            (":until", s(sortable_time(until))),
            (":now", s(sortable_time(now))),
        ];
        self.write_lease(
            "take the scheduler's lease",
            "SET #h = :h, #u = :until",
            "attribute_not_exists(#h) OR #h = :h OR #u <= :now",
            &values,
        )
        .await
    }

    async fn end_lease(&self, holder: &str, now: DateTime<Utc>) -> PortResult<()> {
        let values = [(":h", s(holder)), (":now", s(sortable_time(now)))];
        // Not written: another tick took it over meanwhile, and it is theirs.
        self.write_lease("end the scheduler's lease", "SET #u = :now", "#h = :h", &values)
            .await
            .map(|_| ())
    }

    async fn audit_position(&self) -> PortResult<Option<AuditPosition>> {
        const WHAT: &str = "read the audit's position";
        let Some(item) = self.read_item(audit_key(), WHAT).await? else {
            return Ok(None);
        };
        serde_json::from_str(get_s(&item, "position")?)
            .map_err(|e| corrupt(WHAT, e.to_string()))
            .map(Some)
    }

    async fn save_audit_position(&self, position: &AuditPosition) -> PortResult<()> {
        const WHAT: &str = "save the audit's position";
        let mut item = audit_key();
        let doc = serde_json::to_string(position).map_err(|e| corrupt(WHAT, e.to_string()))?;
        item.insert("position".into(), s(doc));
        self.write_item(item, WHAT).await
    }

    async fn tend_position(&self) -> PortResult<Option<SubscriptionId>> {
        let item = self
            .read_item(tend_key(), "read where tending the breakers got to")
            .await?;
        match item.as_ref().and_then(|item| item.get("after")) {
            None => Ok(None),
            Some(AttributeValue::S(after)) => SubscriptionId::parse(after)
                .map(Some)
                .map_err(|e| corrupt("after", e.to_string())),
            Some(_) => Err(corrupt("after", "not a string")),
        }
    }

    async fn save_tend_position(&self, after: Option<&SubscriptionId>) -> PortResult<()> {
        let mut item = tend_key();
        if let Some(after) = after {
            item.insert("after".into(), s(after.as_str()));
        }
        self.write_item(item, "save where tending the breakers got to").await
    }
}

/// A minute's item: its task, or the item and why it does not decode as one.
type Decoded = Result<ScheduledTask, (Item, PortError)>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_lands_in_its_minute_and_sorts_by_due_time_within_it() {
        let t: DateTime<Utc> = "2026-11-30T05:07:59.999Z".parse().unwrap();
        assert_eq!(minute_bucket(t), "2026-11-30T05:07");
        let mut rng = rand::rng();
        let mut task = |due| ScheduledTask {
            task: DeliveryTask {
                delivery_id: DeliveryId::generate(t, &mut rng),
                round: 0,
                attempt: 2,
                queued_at: None,
                slot: None,
                tenant_id: None,
                held_until: None,
                redrives: 0,
            },
            due,
        };
        let early = due_key(&task(t - chrono::Duration::seconds(30)));
        let late = due_key(&task(t));
        assert!(early < late);
        assert!(
            late < format!("{}$", sortable_time(t)),
            "a task due exactly at `until` is included"
        );
    }
}
