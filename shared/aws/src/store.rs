//! The main table: one DynamoDB table for tenants, API keys, subscriptions, events,
//! deliveries, attempts, endpoint health and statistics, and dead notices.
//!
//! | item               | `pk`                     | `sk`                          |
//! |--------------------|--------------------------|-------------------------------|
//! | tenant             | `TEN#{tenant}`           | `#TENANT` (+ its keys' hashes) |
//! | tenant directory   | `TENANTS`                | `TEN#{tenant}` (to list them) |
//! | subscription       | `TEN#{tenant}`           | `SUB#{subscription}`          |
//! | API key (hash)     | `KEY#{sha256}`           | `#KEY` (a copy of the tenant) |
//! | event              | `EVT#{event}`            | `#EVENT` (+ its delivery ids) |
//! | delivery           | `DLV#{delivery}`         | `#DELIVERY` (+ its `attempt_log`) |
//! | spilled attempts   | `DLV#{delivery}`         | `ATTS#{round:010}#{n:010}` (of the first) |
//! | dead notice        | `DLV#{delivery}`         | `NOTICE#{round:010}` (→ whom, sent when) |
//! | owner's emails     | `OWNER#{email}`          | `#DIGEST` (last sent, claim, count)      |
//! | waiting notice     | `OWNER#{email}`          | `NOTICE#{delivery}#{round:010}`          |
//! | endpoint health    | `HEALTH#{subscription}`  | `#HEALTH`                     |
//! | rate limiter       | `RATE#{subscription}`    | `#RATE` (`next_turn`, `last_slot`, `alive`, µs) |
//! | circuit breaker    | `CIRCUIT#{subscription}` | `#CIRCUIT` (its state, `version`) |
//! | endpoint stats     | `STATS#{subscription}`   | `B#{bucket start}` (its counts, each a number) |
//! | event type         | `CATALOGUE#{tenant}`, or `CATALOGUE` for the deployment's | `TYPE#{name}` |
//!
//! Deliveries are read by id alone (queue messages carry only the id) and strongly
//! consistently, so they have their own partition. A delivery's attempts are in its item,
//! so that one conditional `UpdateItem` records an attempt and the state it led to; a log
//! past 8 KB moves to an item beside it (`spill_attempts`). An older build wrote one item
//! per attempt (`ATT#{round:010}#{n:010}`); those are read as before. Global
//! secondary indexes, all `KEYS_ONLY` so a delivery update that keeps an index's keys costs
//! that index nothing (listings read the items with `BatchGetItem`):
//!
//! | index              | partition key                       | sort key                  |
//! |--------------------|-------------------------------------|---------------------------|
//! | `by-tenant`        | `gsi_tenant` = `{tenant}#{shard}`   | `gsi_created` = `{created_at}#{id}` |
//! | `by-tenant-status` | `gsi_tenant_status` = `{tenant}#{status}#{shard}` | `gsi_created`, only while retrying or dead |
//! | `by-subscription`  | `gsi_subscription` = `{tenant}#{sub}#{shard}` | `gsi_created`   |
//! | `overdue`          | `gsi_due_shard` = `DUE#{0..7}`      | `gsi_due` = `{next_attempt_at}#{id}`, only while the sweep looks after it (`Delivery::is_swept`) |
//!
//! `{shard}` is one of [`LISTING_SHARDS`], by delivery id; an older build wrote these keys
//! without it, and listings read that key as one more shard (`listing_keys`).
//!
//! An ingest writes no transaction. Its deliveries come first, each a conditional put, then
//! the event, which lists them: the event's conditional put is the commit point (and, for a
//! keyed event, the key check). A delivery that never changed since its ingest is seen
//! (returned, listed, delivered) only once its event lists it (`committed`), so an ingest
//! that died between the two, or lost a race for its key, leaves nothing anyone sees; its
//! first attempts' messages find no delivery and are dropped (`Services::not_stored_yet`).
//! An owner's `#DIGEST` item is in `overdue` under `gsi_due_shard` = `DIGEST` while notices
//! wait for their email (which the sweep's `DUE#` partitions never read).
//!
//! Two indexes are sparse so that an event delivered on its first attempt writes as few
//! index entries as it can (each costs a write unit):
//! `by-tenant-status` holds only the statuses worth finding among many delivered ones
//! (retrying, dead); pending and delivered are listed from `by-tenant`, checked item by item.
//!
//! `expires_at` (epoch seconds) is the TTL of events, deliveries, attempts and
//! notices: their last change (a delivery's next attempt, if later) plus the configured
//! retention. No policy may retry for longer than the retention
//! (`hookwise_core::services::check_retention`), so an event outlives its retries; a replay
//! (a change to a new round) pushes its event's expiry to the replay plus the retention.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, KeysAndAttributes, Put, ReturnConsumedCapacity, ReturnValue,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use hookwise_core::circuit::Circuit;
use hookwise_core::health::EndpointHealth;
use hookwise_core::model::*;
use hookwise_core::ports::*;
use hookwise_core::rate_limit::{Arrival, Verdict, BACKLOG_GONE, SLOT_WAIT, TOLERANCE};
use hookwise_core::stats::{StatsCounts, STATS_RETENTION};
use hookwise_core::PortError;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::AwsConfig;
use crate::counter::RequestCounter;
use crate::error::{classify, classify_transaction, TxFailure};
use crate::item::{
    attribute_size, corrupt, from_item, from_json, get_n, get_s, health_from_attr, health_to_attr, health_version, n,
    payload_attr, s, sortable_time, spread, take_payload, to_item, to_json, Item,
};
use crate::lazy_client::LazyClient;
use crate::recent::RecentEvents;

pub const PK: &str = "pk";
pub const SK: &str = "sk";
pub const TTL_ATTRIBUTE: &str = "expires_at";
pub const INDEX_BY_TENANT: &str = "by-tenant";
pub const INDEX_BY_TENANT_STATUS: &str = "by-tenant-status";
pub const INDEX_BY_SUBSCRIPTION: &str = "by-subscription";
pub const INDEX_OVERDUE: &str = "overdue";
/// Each index's key attributes: an item is in the index when it has them all.
pub(crate) const INDEX_KEYS: [&[&str]; 4] = [
    &[GSI_TENANT, GSI_CREATED],
    &[GSI_TENANT_STATUS, GSI_CREATED],
    &[GSI_SUBSCRIPTION, GSI_CREATED],
    &[GSI_DUE_SHARD, GSI_DUE],
];
/// Partitions of the overdue index, so a burst of retries does not heat one GSI key.
pub const OVERDUE_SHARDS: u32 = 8;
/// Partitions of each listing index's key (`{key}#{0..15}`, by delivery id), so one tenant's
/// or one subscription's deliveries spread over sixteen index partitions (about 1 000 writes a
/// second each) instead of heating one. A listing reads every shard and merges them.
pub const LISTING_SHARDS: u32 = 16;

const GSI_TENANT: &str = "gsi_tenant";
const GSI_TENANT_STATUS: &str = "gsi_tenant_status";
const GSI_SUBSCRIPTION: &str = "gsi_subscription";
const GSI_CREATED: &str = "gsi_created";
const GSI_DUE_SHARD: &str = "gsi_due_shard";
const GSI_DUE: &str = "gsi_due";
/// On an event item: the ids of all its deliveries.
const DELIVERY_IDS: &str = "delivery_ids";

/// Index pages one listing call reads at most when it checks statuses item by item; past
/// that it returns a short page and a cursor, so a rare status among many costs bounded work.
const MAX_SCANNED_PAGES: usize = 10;

/// The statuses the sparse `by-tenant-status` index holds.
fn in_status_index(status: DeliveryStatus) -> bool {
    matches!(status, DeliveryStatus::Retrying | DeliveryStatus::Dead)
}

/// Not changed since its ingest wrote it: whether it is committed depends on its event.
fn untouched(d: &Delivery) -> bool {
    d.status == DeliveryStatus::Pending && d.round == 0 && d.attempts == 0
}

/// DynamoDB's limit of keys per `BatchGetItem`.
const MAX_BATCH_GET: usize = 100;
/// Batch requests in flight at once for one call.
const CONCURRENCY: usize = 4;
/// Notices marked sent at once when an email has gone out.
const NOTICE_WRITES: usize = 16;
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 100;

type Key = (String, String);

fn key_item((pk, sk): &Key) -> Item {
    HashMap::from([(PK.to_owned(), s(pk)), (SK.to_owned(), s(sk))])
}

fn tenant_key(id: &TenantId) -> Key {
    (format!("TEN#{id}"), "#TENANT".into())
}
/// One partition listing every tenant (a handful of writes a day: no need to spread it).
const TENANT_DIRECTORY: &str = "TENANTS";
fn directory_key(id: &TenantId) -> Key {
    (TENANT_DIRECTORY.into(), format!("TEN#{id}"))
}
/// A customer's portal session: an item of its own, dropped by the table's TTL a day after
/// it expires.
fn portal_session_key(id: &PortalSessionId) -> Key {
    (format!("PORTAL#{id}"), "#PORTAL".into())
}
/// The deployment's settings (operator keys, the rollout): one item.
fn deployment_key() -> Key {
    ("DEPLOYMENT".into(), "#DEPLOYMENT".into())
}
/// The event-type catalogue: a partition per scope, a tenant's or (`CATALOGUE`, which no
/// tenant's can be: tenant ids are never empty) the deployment's, holding nothing but its
/// definitions, so a scope is listed by one query in name order.
fn catalogue_partition(tenant: Option<&TenantId>) -> String {
    match tenant {
        Some(t) => format!("CATALOGUE#{t}"),
        None => "CATALOGUE".into(),
    }
}
const EVENT_TYPE_PREFIX: &str = "TYPE#";
fn event_type_key(tenant: Option<&TenantId>, name: &EventType) -> Key {
    (catalogue_partition(tenant), format!("{EVENT_TYPE_PREFIX}{name}"))
}
fn api_key_key(hash: &str) -> Key {
    (format!("KEY#{hash}"), "#KEY".into())
}
fn subscription_key(tenant: &TenantId, id: &SubscriptionId) -> Key {
    (format!("TEN#{tenant}"), format!("SUB#{id}"))
}
fn event_key(id: &EventId) -> Key {
    (format!("EVT#{id}"), "#EVENT".into())
}
fn delivery_key(id: &DeliveryId) -> Key {
    (format!("DLV#{id}"), "#DELIVERY".into())
}
fn notice_key(id: &DeliveryId, round: u32) -> Key {
    (format!("DLV#{id}"), format!("NOTICE#{round:010}"))
}
fn digest_key(owner: &Email) -> Key {
    (format!("OWNER#{owner}"), "#DIGEST".into())
}
fn waiting_notice_key(owner: &Email, id: &DeliveryId, round: u32) -> Key {
    (format!("OWNER#{owner}"), format!("NOTICE#{id}#{round:010}"))
}
/// The `overdue` partition of owners' digests with notices waiting.
const DIGEST_SHARD: &str = "DIGEST";
fn rate_key(sub: &SubscriptionId) -> Key {
    (format!("RATE#{sub}"), "#RATE".into())
}
fn circuit_key(sub: &SubscriptionId) -> Key {
    (format!("CIRCUIT#{sub}"), "#CIRCUIT".into())
}
fn health_key(sub: &SubscriptionId) -> Key {
    (format!("HEALTH#{sub}"), "#HEALTH".into())
}
/// An endpoint's statistics: a partition of its own, an item per bucket keyed by the bucket's
/// start ([`sortable_time`], so keys sort as times do), so a window is one query.
fn stats_partition(sub: &SubscriptionId) -> String {
    format!("STATS#{sub}")
}
const STATS_BUCKET_PREFIX: &str = "B#";
fn stats_key(sub: &SubscriptionId, bucket: DateTime<Utc>) -> Key {
    (
        stats_partition(sub),
        format!("{STATS_BUCKET_PREFIX}{}", sortable_time(bucket)),
    )
}

/// A bucket's counts as number attributes, one a field (the latency bins `l0`, `l1`...), so
/// that a write adds to them with `ADD` and processes side by side never overwrite each
/// other.
fn stats_attributes(c: &StatsCounts) -> Vec<(String, u64)> {
    let fields = [
        ("succeeded", c.succeeded),
        ("http_4xx", c.http_4xx),
        ("http_5xx", c.http_5xx),
        ("timeout", c.timeout),
        ("error", c.error),
        ("dead", c.dead),
    ];
    let bins = c.latency.iter().enumerate().map(|(i, v)| (format!("l{i}"), *v));
    fields
        .into_iter()
        .map(|(name, v)| (name.to_owned(), v))
        .chain(bins)
        .collect()
}

/// A bucket's item back into its counts: an attribute never added to is 0.
fn stats_from_item(item: &Item) -> Result<StatsCounts, PortError> {
    let count = |name: &str| {
        if item.contains_key(name) {
            get_n(item, name)
        } else {
            Ok(0)
        }
    };
    let mut c = StatsCounts {
        succeeded: count("succeeded")?,
        http_4xx: count("http_4xx")?,
        http_5xx: count("http_5xx")?,
        timeout: count("timeout")?,
        error: count("error")?,
        dead: count("dead")?,
        latency: Default::default(),
    };
    for (i, bin) in c.latency.iter_mut().enumerate() {
        *bin = count(&format!("l{i}"))?;
    }
    Ok(c)
}

/// A bucket's start from its sort key.
fn stats_bucket(item: &Item) -> Result<DateTime<Utc>, PortError> {
    let sk = get_s(item, SK)?;
    sk.strip_prefix(STATS_BUCKET_PREFIX)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| corrupt("endpoint stats", format!("`{sk}` is not a bucket's key")))
}

/// `key`'s shard for this delivery in a listing index.
fn listing_key(key: impl std::fmt::Display, id: &DeliveryId) -> String {
    format!("{key}#{}", spread(id.as_str(), LISTING_SHARDS))
}

/// Every shard of a listing index's `key`, and `key` itself: an older build wrote it unsharded,
/// and its items are listed as one more shard until they change or expire.
fn listing_keys(key: &str) -> impl Iterator<Item = String> + '_ {
    (0..LISTING_SHARDS)
        .map(move |shard| format!("{key}#{shard}"))
        .chain(std::iter::once(key.to_owned()))
}

fn overdue_shard(id: &str) -> u32 {
    spread(id, OVERDUE_SHARDS)
}

fn with_key(mut item: Item, key: &Key, kind: &str) -> Item {
    item.insert(PK.into(), s(&key.0));
    item.insert(SK.into(), s(&key.1));
    item.insert("kind".into(), s(kind));
    item
}

/// A time as [`to_item`] stores it (serde's RFC 3339), for a condition to compare like for like.
fn stored_time(at: DateTime<Utc>, what: &str) -> Result<AttributeValue, PortError> {
    match serde_json::to_value(at) {
        Ok(Value::String(text)) => Ok(s(text)),
        other => Err(PortError::permanent(what, format!("a time as {other:?}"))),
    }
}

fn build_err(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> PortError {
    PortError::permanent(format!("building the {what} request"), e)
}

/// The main-table adapter.
#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: LazyClient<Client>,
    table: String,
    retention: chrono::Duration,
    counter: Option<RequestCounter>,
    recent_events: RecentEvents,
    /// Each rate-limited endpoint's next free turn as this process last saw it, to guess
    /// whether its send line is idle (see `limit_rate`).
    turns_seen: std::sync::Arc<std::sync::Mutex<HashMap<SubscriptionId, i64>>>,
}

/// A write's condition: its expression, and the attribute names and values it refers to.
struct Condition {
    expression: &'static str,
    names: Vec<(&'static str, &'static str)>,
    values: Vec<(&'static str, AttributeValue)>,
}

impl Condition {
    fn new(expression: &'static str) -> Self {
        Self {
            expression,
            names: Vec::new(),
            values: Vec::new(),
        }
    }

    fn name(mut self, placeholder: &'static str, attribute: &'static str) -> Self {
        self.names.push((placeholder, attribute));
        self
    }

    fn value(mut self, placeholder: &'static str, value: AttributeValue) -> Self {
        self.values.push((placeholder, value));
        self
    }
}

impl DynamoStore {
    pub fn new(client: impl Into<LazyClient<Client>>, config: &AwsConfig) -> Self {
        Self {
            client: client.into(),
            table: config.table.clone(),
            retention: crate::item::ttl_retention(config.retention),
            counter: None,
            recent_events: RecentEvents::default(),
            turns_seen: Default::default(),
        }
    }

    /// Also count the capacity units each call consumed.
    pub fn with_counter(mut self, counter: Option<RequestCounter>) -> Self {
        self.counter = counter;
        self
    }

    pub fn table_name(&self) -> &str {
        &self.table
    }

    fn rcc(&self) -> Option<ReturnConsumedCapacity> {
        self.counter.as_ref().map(|_| ReturnConsumedCapacity::Indexes)
    }

    fn charge<'a>(
        &self,
        what: &str,
        write: bool,
        consumed: impl IntoIterator<Item = &'a aws_sdk_dynamodb::types::ConsumedCapacity>,
    ) {
        if let Some(c) = &self.counter {
            c.record_capacity(what, write, consumed);
        }
    }

    fn expires_at(&self, from: DateTime<Utc>) -> AttributeValue {
        crate::item::expires_at(from, self.retention)
    }

    // --- items

    fn delivery_item(&self, d: &Delivery) -> Item {
        let mut item = with_key(to_item(d), &delivery_key(&d.id), "delivery");
        let created = format!("{}#{}", sortable_time(d.created_at), d.id);
        item.insert(GSI_TENANT.into(), s(listing_key(&d.tenant_id, &d.id)));
        if in_status_index(d.status) {
            item.insert(
                GSI_TENANT_STATUS.into(),
                s(listing_key(format!("{}#{}", d.tenant_id, d.status.as_str()), &d.id)),
            );
        }
        item.insert(
            GSI_SUBSCRIPTION.into(),
            s(listing_key(format!("{}#{}", d.tenant_id, d.subscription_id), &d.id)),
        );
        item.insert(GSI_CREATED.into(), s(created));
        if let (true, Some(due)) = (d.is_swept(), d.next_attempt_at) {
            item.insert(GSI_DUE_SHARD.into(), s(format!("DUE#{}", overdue_shard(d.id.as_str()))));
            item.insert(GSI_DUE.into(), s(format!("{}#{}", sortable_time(due), d.id)));
        }
        // Kept for the retention after its last change or its next attempt, whichever is
        // later: a delivery waiting to retry is never deleted.
        let last_live = d.next_attempt_at.map_or(d.updated_at, |at| at.max(d.updated_at));
        item.insert(TTL_ATTRIBUTE.into(), self.expires_at(last_live));
        item
    }

    /// The event with the ids of all its deliveries: the list that commits them.
    fn event_item(&self, e: &Event, deliveries: &[Delivery]) -> Item {
        let mut item = with_key(to_item(e), &event_key(&e.id), "event");
        item.remove("payload");
        let (name, payload) = payload_attr(&e.payload);
        item.insert(name.into(), payload);
        item.insert(
            DELIVERY_IDS.into(),
            AttributeValue::L(deliveries.iter().map(|d| s(d.id.as_str())).collect()),
        );
        item.insert(TTL_ATTRIBUTE.into(), self.expires_at(e.created_at));
        item
    }

    /// The event and its delivery ids.
    fn decode_event(item: &Item) -> Result<(Event, Vec<DeliveryId>), PortError> {
        let mut item = item.clone();
        let payload = take_payload(&mut item)?;
        let mut json = to_json(&item)?;
        json.insert("payload".into(), payload);
        let ids = match json.remove(DELIVERY_IDS) {
            Some(Value::Array(ids)) => ids
                .into_iter()
                .map(|v| serde_json::from_value::<DeliveryId>(v).map_err(|e| corrupt(DELIVERY_IDS, e.to_string())))
                .collect::<Result<Vec<_>, _>>()?,
            _ => Vec::new(),
        };
        // Written by an older build for an ingest it had not finished: read, not acted on.
        json.remove("unwritten_deliveries");
        Ok((from_json(json)?, ids))
    }

    fn put(&self, item: Item, condition: Option<&str>) -> Result<TransactWriteItem, PortError> {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .set_condition_expression(condition.map(str::to_owned));
        Ok(TransactWriteItem::builder()
            .put(put.build().map_err(|e| build_err("put", e))?)
            .build())
    }

    fn put_new(&self, item: Item) -> Result<TransactWriteItem, PortError> {
        self.put(item, Some("attribute_not_exists(pk)"))
    }

    // --- calls

    /// A conditional `UpdateItem` of `sub`'s rate-limit lines: the number `returned` became,
    /// or, if the condition did not hold, the lines as they were.
    async fn write_line(
        &self,
        sub: &SubscriptionId,
        update: &str,
        condition: &str,
        values: Vec<(&'static str, AttributeValue)>,
        returned: &str,
    ) -> PortResult<Result<i64, Item>> {
        const WHAT: &str = "take a rate-limit turn";
        let mut call = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_item(&rate_key(sub))))
            .update_expression(update)
            .condition_expression(condition)
            .return_values(ReturnValue::UpdatedNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_return_consumed_capacity(self.rcc());
        for (placeholder, value) in values {
            call = call.expression_attribute_values(placeholder, value);
        }
        match call.send().await {
            Ok(out) => {
                self.charge(WHAT, true, out.consumed_capacity());
                let item = out.attributes.unwrap_or_default();
                Ok(Ok(get_n(&item, returned)?))
            }
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    Ok(Err(failed.item().cloned().unwrap_or_default()))
                }
                _ => Err(classify(WHAT, err)),
            },
        }
    }

    async fn get(&self, key: &Key, what: &str) -> Result<Option<Item>, PortError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key_item(key)))
            .consistent_read(true)
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await
            .map_err(|e| classify(what, e))?;
        self.charge(what, false, out.consumed_capacity());
        Ok(out.item)
    }

    /// One item, written if `condition` (an expression and its values) holds.
    async fn put_item(&self, item: Item, condition: Option<Condition>, what: &str) -> Result<(), PortError> {
        let mut put = self.client.put_item().table_name(&self.table).set_item(Some(item));
        if let Some(c) = condition {
            put = put.condition_expression(c.expression);
            for (placeholder, attribute) in c.names {
                put = put.expression_attribute_names(placeholder, attribute);
            }
            for (placeholder, value) in c.values {
                put = put.expression_attribute_values(placeholder, value);
            }
        }
        let out = put
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await
            .map_err(|e| classify(what, e))?;
        self.charge(what, true, out.consumed_capacity());
        Ok(())
    }

    /// Move all but the newest of a delivery's logged attempts to an item of their own
    /// (`ATTS#{round}#{attempt}` of the first), then take them off the delivery if nothing
    /// was appended meanwhile. Dying between the two leaves them in both places, which
    /// `attempts` reads once; a change that appended first leaves them for its own spill.
    async fn spill_attempts(&self, id: &DeliveryId, log: &[AttributeValue]) -> PortResult<()> {
        let (moved, _newest) = log.split_at(log.len() - 1);
        let first = attempt_from_attr(&moved[0], id)?;
        let newest = attempt_from_attr(&log[log.len() - 1], id)?;
        let key = (
            delivery_key(id).0,
            format!("ATTS#{:010}#{:010}", first.round, first.attempt),
        );
        let mut item = with_key(HashMap::new(), &key, "attempts");
        item.insert(ATTEMPT_LOG.into(), AttributeValue::L(moved.to_vec()));
        item.insert(TTL_ATTRIBUTE.into(), self.expires_at(newest.started_at));
        self.put_item(item, None, "spill attempts").await?;
        let removes: Vec<String> = (0..moved.len()).map(|i| format!("#log[{i}]")).collect();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_item(&delivery_key(id))))
            .update_expression(format!("REMOVE {}", removes.join(", ")))
            .condition_expression("size(#log) = :len")
            .expression_attribute_names("#log", ATTEMPT_LOG)
            .expression_attribute_values(":len", n(log.len()))
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await;
        // Appended to meanwhile: that change's own spill takes these too.
        unless_changed(
            result
                .map(|out| self.charge("spill attempts", true, out.consumed_capacity()))
                .map_err(|e| classify("spill attempts", e)),
        )
    }

    async fn transact(
        &self,
        items: Vec<TransactWriteItem>,
        token: Option<String>,
        what: &str,
    ) -> Result<(), TxFailure> {
        let out = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .set_client_request_token(token.clone())
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await
            .map_err(|e| classify_transaction(what, e))?;
        self.charge(what, true, out.consumed_capacity());
        if let Some(c) = &self.counter {
            c.record_transaction(token.as_deref(), out.consumed_capacity());
        }
        Ok(())
    }

    /// Every item of a query, following `LastEvaluatedKey`.
    async fn query_all(
        &self,
        query: aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
        what: &str,
    ) -> Result<Vec<Item>, PortError> {
        self.query_up_to(query, usize::MAX, what).await
    }

    /// The first `limit` items a query finds, page after page.
    async fn query_up_to(
        &self,
        query: aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
        limit: usize,
        what: &str,
    ) -> Result<Vec<Item>, PortError> {
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        while items.len() < limit {
            let page = i32::try_from(limit - items.len()).ok();
            let out = query
                .clone()
                .set_limit(page)
                .set_exclusive_start_key(start.take())
                .set_return_consumed_capacity(self.rcc())
                .send()
                .await
                .map_err(|e| classify(what, e))?;
            self.charge(what, false, out.consumed_capacity());
            items.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        Ok(items)
    }

    /// Up to `limit` tenant ids from the directory, in id order, after `after`: the
    /// directory's keys alone (a tenant's item is not read).
    async fn tenant_ids(&self, after: Option<&TenantId>, limit: u32) -> Result<Vec<TenantId>, PortError> {
        let from = after.map_or_else(|| "TEN#".to_owned(), |a| directory_key(a).1);
        let q = self
            .client
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk AND sk > :from")
            .expression_attribute_values(":pk", s(TENANT_DIRECTORY))
            .expression_attribute_values(":from", s(&from));
        let entries = self.query_up_to(q, limit as usize, "list tenants").await?;
        entries
            .iter()
            .map(|e| {
                let id = get_s(e, SK)?.trim_start_matches("TEN#");
                TenantId::parse(id).map_err(|err| corrupt("tenant directory", err.to_string()))
            })
            .collect()
    }

    /// Items by key, strongly consistent, 100 a request, some requests at once; keys
    /// DynamoDB leaves unprocessed are asked again with a backoff. Keyed by `pk`.
    async fn batch_get(&self, pks: &[Key], what: &str) -> Result<HashMap<String, Item>, PortError> {
        self.batch_get_read(pks, what, true).await
    }

    /// As [`Self::batch_get`], eventually consistent (half the read units) unless `consistent`.
    async fn batch_get_read(
        &self,
        pks: &[Key],
        what: &str,
        consistent: bool,
    ) -> Result<HashMap<String, Item>, PortError> {
        // DynamoDB refuses a request naming a key twice (an index may list an item under an
        // old key and its new one for a moment).
        let mut unique: Vec<&Key> = pks.iter().collect();
        unique.sort();
        unique.dedup();
        let chunks: Vec<Vec<Item>> = unique
            .chunks(MAX_BATCH_GET)
            .map(|c| c.iter().map(|k| key_item(k)).collect())
            .collect();
        let found: Vec<Vec<Item>> = futures::stream::iter(chunks)
            .map(|keys| self.batch_get_chunk(keys, what, consistent))
            .buffer_unordered(CONCURRENCY)
            .try_collect()
            .await?;
        let mut by_pk = HashMap::new();
        for item in found.into_iter().flatten() {
            let pk = get_s(&item, PK)?.to_owned();
            by_pk.insert(pk, item);
        }
        Ok(by_pk)
    }

    async fn batch_get_chunk(&self, keys: Vec<Item>, what: &str, consistent: bool) -> Result<Vec<Item>, PortError> {
        let mut items = Vec::new();
        let mut pending = Some(keys);
        for round in 0..8u32 {
            let Some(keys) = pending.take().filter(|k| !k.is_empty()) else {
                return Ok(items);
            };
            if round > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(25 << round)).await;
            }
            let request = KeysAndAttributes::builder()
                .set_keys(Some(keys))
                .consistent_read(consistent)
                .build()
                .map_err(|e| build_err(what, e))?;
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.table, request)
                .set_return_consumed_capacity(self.rcc())
                .send()
                .await
                .map_err(|e| classify(what, e))?;
            self.charge(what, false, out.consumed_capacity());
            if let Some(mut responses) = out.responses {
                items.extend(responses.remove(&self.table).unwrap_or_default());
            }
            pending = out
                .unprocessed_keys
                .and_then(|mut u| u.remove(&self.table))
                .map(|k| k.keys);
        }
        match pending {
            Some(keys) if !keys.is_empty() => Err(PortError::retryable(
                what,
                "DynamoDB left keys unprocessed after 8 tries",
            )),
            _ => Ok(items),
        }
    }

    async fn deliveries_by_id(&self, ids: &[DeliveryId], what: &str) -> Result<Vec<Delivery>, PortError> {
        let keys: Vec<Key> = ids.iter().map(delivery_key).collect();
        let found = self.batch_get(&keys, what).await?;
        keys.iter().filter_map(|k| found.get(&k.0)).map(from_item).collect()
    }

    /// Push an event's expiry out to `until`, unless it is later already (or the event gone).
    async fn keep_event_until(&self, event: &EventId, until: DateTime<Utc>) -> Result<(), PortError> {
        let key = event_key(event);
        unless_changed(
            self.update_item(
                &key,
                "SET #ttl = :until",
                Some("attribute_exists(pk) AND #ttl < :until"),
                &[("#ttl", TTL_ATTRIBUTE)],
                vec![(":until", n(until.timestamp()))],
                "keep event",
            )
            .await,
        )
    }

    /// Add one bucket's counts: one `UpdateItem`, `ADD` of each count that is not 0 (`ADD`
    /// starts a missing number at 0), so writes from processes side by side all land. The
    /// bucket expires [`STATS_RETENTION`] after its start, as the first write set it.
    async fn add_stats_bucket(&self, sub: &SubscriptionId, bucket: DateTime<Utc>, c: &StatsCounts) -> PortResult<()> {
        let added: Vec<(String, u64)> = stats_attributes(c).into_iter().filter(|(_, v)| *v > 0).collect();
        // Every attribute by a placeholder: `error` and `timeout` are DynamoDB reserved words.
        let placeholders: Vec<(String, String)> =
            (0..added.len()).map(|i| (format!("#c{i}"), format!(":c{i}"))).collect();
        let mut update = "SET #ttl = if_not_exists(#ttl, :expires), #kind = :kind".to_owned();
        if !added.is_empty() {
            let adds: Vec<String> = placeholders
                .iter()
                .map(|(name, value)| format!("{name} {value}"))
                .collect();
            update.push_str(" ADD ");
            update.push_str(&adds.join(", "));
        }
        let mut names = vec![("#ttl", TTL_ATTRIBUTE), ("#kind", "kind")];
        let mut values = vec![
            (":expires", crate::item::expires_at(bucket, STATS_RETENTION)),
            (":kind", s("endpoint_stats")),
        ];
        for ((name, value), (attribute, count)) in placeholders.iter().zip(&added) {
            names.push((name.as_str(), attribute.as_str()));
            values.push((value.as_str(), n(count)));
        }
        self.update_item(
            &stats_key(sub, bucket),
            &update,
            None,
            &names,
            values,
            "add endpoint stats",
        )
        .await
    }

    /// One conditional (or not) `UpdateItem`; a failed condition is `ConditionFailed`.
    async fn update_item(
        &self,
        key: &Key,
        update: &str,
        condition: Option<&str>,
        names: &[(&str, &str)],
        values: Vec<(&str, AttributeValue)>,
        what: &str,
    ) -> Result<(), PortError> {
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_item(key)))
            .update_expression(update)
            .set_condition_expression(condition.map(str::to_owned));
        for (name, attribute) in names {
            request = request.expression_attribute_names(*name, *attribute);
        }
        for (name, value) in values {
            request = request.expression_attribute_values(name, value);
        }
        let out = request
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await
            .map_err(|e| classify(what, e))?;
        self.charge(what, true, out.consumed_capacity());
        Ok(())
    }

    /// Event items by key, from those read a moment ago (`recent`) where it can. Keyed by `pk`.
    async fn events(&self, keys: &[Key], what: &str) -> Result<HashMap<String, Item>, PortError> {
        let mut found = HashMap::new();
        let mut unread = Vec::new();
        for key in keys {
            match self.recent_events.get(&key.0) {
                Some(item) => {
                    found.insert(key.0.clone(), item);
                }
                None => unread.push(key.clone()),
            }
        }
        for (pk, item) in self.batch_get(&unread, what).await? {
            self.recent_events.keep(&pk, &item);
            found.insert(pk, item);
        }
        Ok(found)
    }

    async fn event(&self, id: &EventId, what: &str) -> Result<Option<Item>, PortError> {
        let key = event_key(id);
        Ok(self.events(std::slice::from_ref(&key), what).await?.remove(&key.0))
    }

    /// A new event's delivery, if its item is not there yet. One that is, because an earlier
    /// run of this keyed ingest wrote it, is left as it is: it may have been attempted since.
    /// Unless it was attempted and its event is gone: the key's first event expired before
    /// its delivery did (a retrying delivery's item lives up to its retry span longer), and
    /// the key now names a new event, whose delivery starts afresh.
    async fn put_delivery(&self, d: &Delivery) -> Result<(), PortError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(self.delivery_item(d)))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await;
        let failed = match put {
            Ok(out) => {
                self.charge("create event", true, out.consumed_capacity());
                return Ok(());
            }
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => failed.item().cloned(),
                _ => return Err(classify("create event", err)),
            },
        };
        let Some(old) = failed else { return Ok(()) };
        if untouched(&from_item(&old)?) || self.get(&event_key(&d.event_id), "read event").await?.is_some() {
            return Ok(());
        }
        let updated_at = old.get("updated_at").cloned().unwrap_or_else(|| s(""));
        unless_changed(
            self.put_item(
                self.delivery_item(d),
                Some(Condition::new("updated_at = :was").value(":was", updated_at)),
                "create event",
            )
            .await,
        )
    }

    /// The deliveries anyone may see: all but those whose ingest did not commit them. A
    /// delivery is written before its event, so one that never changed since its ingest
    /// ([`untouched`]) is checked against its event's list (one `BatchGetItem` for all); one
    /// that changed was seen, so committed, before. `items` are deliveries, or carry one
    /// (`delivery` gives it).
    async fn committed<T: Send>(
        &self,
        items: Vec<T>,
        delivery: fn(&T) -> &Delivery,
        what: &str,
    ) -> Result<Vec<T>, PortError> {
        let events: Vec<Key> = items
            .iter()
            .map(delivery)
            .filter(|d| untouched(d))
            .map(|d| event_key(&d.event_id))
            .collect();
        if events.is_empty() {
            return Ok(items);
        }
        let found = self.events(&events, what).await?;
        let lists = |d: &Delivery| {
            let listed = found
                .get(&event_key(&d.event_id).0)
                .and_then(|event| event.get(DELIVERY_IDS))
                .and_then(|ids| ids.as_l().ok());
            listed.is_some_and(|ids| ids.iter().any(|id| id.as_s().is_ok_and(|id| id == d.id.as_str())))
        };
        Ok(items
            .into_iter()
            .filter(|item| !untouched(delivery(item)) || lists(delivery(item)))
            .collect())
    }

    /// One page of a tenant's deliveries from `index`, newest first, read whole.
    async fn list_from_index(
        &self,
        tenant: &TenantId,
        index: &str,
        key_attr: &str,
        key: String,
        status: Option<DeliveryStatus>,
        query: &DeliveryQuery,
    ) -> Result<DeliveryPage, PortError> {
        let limit = match query.limit as usize {
            0 => DEFAULT_PAGE,
            l => l.min(MAX_PAGE),
        };
        // `status` is checked on the items, so keys may be read that do not make the page.
        let checked = status.is_some();
        let mut cursor = query.cursor.clone();
        let mut found: Vec<(String, Delivery)> = Vec::new();
        let mut scanned_pages = 0;
        loop {
            scanned_pages += 1;
            let want = if checked { MAX_PAGE } else { limit + 1 - found.len() };
            let (keys, more) = self
                .newest_entries(index, key_attr, &key, cursor.as_deref(), want)
                .await?;
            let items = self
                .batch_get(
                    &keys.iter().map(|(_, k)| k.clone()).collect::<Vec<_>>(),
                    "list deliveries",
                )
                .await?;
            let mut candidates = Vec::new();
            for (created, k) in &keys {
                let Some(item) = items.get(&k.0) else { continue };
                let d: Delivery = from_item(item)?;
                // The index lags the table a little: check what it claimed.
                if &d.tenant_id == tenant && status.is_none_or(|st| d.status == st) {
                    candidates.push((created.clone(), d));
                }
            }
            found.extend(self.committed(candidates, |(_, d)| d, "list deliveries").await?);
            let next = keys.last().filter(|_| more).map(|(created, _)| created.clone());
            match next {
                Some(c) if found.len() <= limit && scanned_pages >= MAX_SCANNED_PAGES => {
                    // Enough read for one call: a short page, and the client goes on from here.
                    return Ok(DeliveryPage {
                        items: found.into_iter().map(|(_, d)| d).collect(),
                        next_cursor: Some(c),
                    });
                }
                Some(c) if found.len() <= limit => cursor = Some(c),
                _ => break,
            }
        }
        let next_cursor = (found.len() > limit).then(|| found[limit - 1].0.clone());
        found.truncate(limit);
        Ok(DeliveryPage {
            items: found.into_iter().map(|(_, d)| d).collect(),
            next_cursor,
        })
    }

    /// The newest `want` entries of a listing index's `key` below `cursor` (a `gsi_created`),
    /// across its shards, newest first; and whether there may be more below them. Each shard
    /// gives its newest `want`, so the merge's newest `want` are the key's.
    async fn newest_entries(
        &self,
        index: &str,
        key_attr: &str,
        key: &str,
        cursor: Option<&str>,
        want: usize,
    ) -> Result<(Vec<(String, Key)>, bool), PortError> {
        let queries: Vec<_> = listing_keys(key)
            .map(|shard| self.shard_entries(index, key_attr, shard, cursor, want))
            .collect();
        let shards: Vec<(Vec<(String, Key)>, bool)> = futures::stream::iter(queries)
            .buffer_unordered(LISTING_SHARDS as usize + 1)
            .try_collect()
            .await?;
        let mut more = shards.iter().any(|(_, more)| *more);
        let mut entries: Vec<(String, Key)> = shards.into_iter().flat_map(|(entries, _)| entries).collect();
        entries.sort_by(|a, b| b.0.cmp(&a.0));
        // A delivery an older build wrote is under its old key and its shard for a moment
        // after it changes (the index lags): once.
        entries.dedup_by(|a, b| a.1 == b.1);
        if entries.len() > want {
            entries.truncate(want);
            more = true;
        }
        Ok((entries, more))
    }

    /// One shard's newest `want` entries below `cursor`, and whether it has more.
    async fn shard_entries(
        &self,
        index: &str,
        key_attr: &str,
        shard: String,
        cursor: Option<&str>,
        want: usize,
    ) -> Result<(Vec<(String, Key)>, bool), PortError> {
        let mut q = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(index)
            .scan_index_forward(false)
            .limit(want as i32)
            .expression_attribute_names("#k", key_attr)
            .expression_attribute_values(":k", s(shard))
            .set_return_consumed_capacity(self.rcc());
        q = match cursor {
            Some(c) => q
                .key_condition_expression("#k = :k AND #c < :c")
                .expression_attribute_names("#c", GSI_CREATED)
                .expression_attribute_values(":c", s(c)),
            None => q.key_condition_expression("#k = :k"),
        };
        let out = q.send().await.map_err(|e| classify("list deliveries", e))?;
        self.charge("list deliveries", false, out.consumed_capacity());
        let entries = out
            .items()
            .iter()
            .map(|it| {
                Ok((
                    get_s(it, GSI_CREATED)?.to_owned(),
                    (get_s(it, PK)?.to_owned(), get_s(it, SK)?.to_owned()),
                ))
            })
            .collect::<Result<_, PortError>>()?;
        let more = out.last_evaluated_key.is_some_and(|k| !k.is_empty());
        Ok((entries, more))
    }

    async fn overdue_shard_keys(&self, shard: u32, before: &str, limit: u32) -> Result<Vec<(String, Key)>, PortError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(INDEX_OVERDUE)
            .key_condition_expression("#s = :s AND #d < :d")
            .expression_attribute_names("#s", GSI_DUE_SHARD)
            .expression_attribute_names("#d", GSI_DUE)
            .expression_attribute_values(":s", s(format!("DUE#{shard}")))
            .expression_attribute_values(":d", s(before))
            .limit(limit as i32)
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await
            .map_err(|e| classify("overdue deliveries", e))?;
        self.charge("overdue deliveries", false, out.consumed_capacity());
        out.items()
            .iter()
            .map(|it| {
                Ok((
                    get_s(it, GSI_DUE)?.to_owned(),
                    (get_s(it, PK)?.to_owned(), get_s(it, SK)?.to_owned()),
                ))
            })
            .collect()
    }
}

/// Where the audit of queued messages goes on: a tenant, one of its `by-tenant` keys (its
/// shards, then the unsharded key: [`listing_keys`]), and the last `gsi_created` read there.
#[derive(Debug, Clone, PartialEq)]
struct AuditPlace {
    tenant: TenantId,
    shard: usize,
    after: Option<String>,
}

impl AuditPlace {
    fn start_of(tenant: TenantId) -> Self {
        Self {
            tenant,
            shard: 0,
            after: None,
        }
    }

    fn encode(&self) -> String {
        format!("{}|{}|{}", self.tenant, self.shard, self.after.as_deref().unwrap_or(""))
    }

    fn decode(place: &str) -> PortResult<Self> {
        let bad = || PortError::InvalidCursor(place.to_owned());
        let mut parts = place.splitn(3, '|');
        let (tenant, shard, after) = (parts.next(), parts.next(), parts.next());
        let tenant = TenantId::parse(tenant.ok_or_else(bad)?).map_err(|_| bad())?;
        let shard = shard.and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let after = after.ok_or_else(bad)?;
        Ok(Self {
            tenant,
            shard,
            after: (!after.is_empty()).then(|| after.to_owned()),
        })
    }
}

/// A cursor is a `gsi_created` value, `{created_at}#{id}`, as this store hands them out;
/// anything else is refused rather than used as a bound.
fn check_cursor(cursor: &str) -> PortResult<()> {
    let valid = cursor
        .split_once('#')
        .is_some_and(|(at, id)| DateTime::parse_from_rfc3339(at).is_ok() && DeliveryId::parse(id).is_ok());
    if valid {
        Ok(())
    } else {
        Err(PortError::InvalidCursor(cursor.to_owned()))
    }
}

/// The same request content gets the same token, so a transaction the SDK retries after it
/// committed succeeds instead of failing its own conditions; any other content, another one.
fn request_token(parts: &[&dyn erased::Describe]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.describe().as_bytes());
        h.update([0]);
    }
    h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

mod erased {
    pub trait Describe {
        fn describe(&self) -> String;
    }
    impl<T: std::fmt::Debug> Describe for T {
        fn describe(&self) -> String {
            format!("{self:?}")
        }
    }
}

/// Unique per call, so a claim can recognise its own write on a retried request.
fn claim_nonce() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{nanos:x}-{:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A conditional write whose condition failed because another caller got there first (or the
/// item is gone) is no error to these callers.
fn unless_changed(result: Result<(), PortError>) -> Result<(), PortError> {
    match result {
        Ok(()) | Err(PortError::ConditionFailed(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// On a delivery item: the attempts it has recorded, oldest first, until they are spilled.
const ATTEMPT_LOG: &str = "attempt_log";
/// A log larger than this is moved to an item of its own (all but its newest attempt), so a
/// delivery whose endpoint answers every attempt with kilobytes of error page keeps its
/// item, and so the cost of each of its writes, bounded. Below it (the usual few hundred
/// bytes an attempt) the log stays where one write records it with the state.
const SPILL_BYTES: usize = 8 * 1024;

/// The `UpdateItem` that makes a delivery item what `item` says, keeps its attempt log
/// (appending `attempt`), and removes the index keys `item` no longer has (which takes the
/// delivery out of those indexes).
struct DeliveryUpdate {
    expression: String,
    names: HashMap<String, String>,
    values: Item,
}

impl DeliveryUpdate {
    fn new(next: &Delivery, mut item: Item, expected: &Expected, attempt: Option<&Attempt>) -> Self {
        item.remove(PK);
        item.remove(SK);
        // The fields the new state leaves empty (`to_item` drops them) and the index keys it
        // has no more.
        let emptied = match serde_json::to_value(next) {
            Ok(Value::Object(fields)) => fields
                .into_iter()
                .filter(|(_, v)| v.is_null())
                .map(|(k, _)| k)
                .collect(),
            _ => Vec::new(),
        };
        let mut names = HashMap::from([
            ("#status".to_owned(), "status".to_owned()),
            ("#round".to_owned(), "round".to_owned()),
            ("#attempts".to_owned(), "attempts".to_owned()),
        ]);
        let mut values = HashMap::from([
            (":status".to_owned(), s(expected.status.as_str())),
            (":round".to_owned(), n(expected.round)),
            (":attempts".to_owned(), n(expected.attempts)),
        ]);
        let removes: Vec<String> = [GSI_TENANT_STATUS, GSI_DUE_SHARD, GSI_DUE]
            .into_iter()
            .map(str::to_owned)
            .filter(|a| !item.contains_key(a))
            .chain(emptied)
            .enumerate()
            .map(|(i, a)| {
                names.insert(format!("#r{i}"), a);
                format!("#r{i}")
            })
            .collect();
        let mut sets: Vec<String> = item
            .into_iter()
            .enumerate()
            .map(|(i, (name, value))| {
                names.insert(format!("#a{i}"), name);
                values.insert(format!(":a{i}"), value);
                format!("#a{i} = :a{i}")
            })
            .collect();
        if let Some(attempt) = attempt {
            names.insert("#log".into(), ATTEMPT_LOG.into());
            values.insert(":none".into(), AttributeValue::L(Vec::new()));
            values.insert(":attempt".into(), AttributeValue::L(vec![attempt_to_attr(attempt)]));
            sets.push("#log = list_append(if_not_exists(#log, :none), :attempt)".into());
        }
        let mut expression = format!("SET {}", sets.join(", "));
        if !removes.is_empty() {
            expression.push_str(&format!(" REMOVE {}", removes.join(", ")));
        }
        Self {
            expression,
            names,
            values,
        }
    }
}

/// The field of an attempt its delivery's log leaves out: the item's own id. (40 bytes an
/// attempt: with them, a first attempt whose endpoint answered a few hundred bytes takes its
/// delivery past one write unit.)
const ATTEMPT_DELIVERY_ID: &str = "delivery_id";

fn attempt_to_attr(a: &Attempt) -> AttributeValue {
    let mut entry = to_item(a);
    entry.remove(ATTEMPT_DELIVERY_ID);
    AttributeValue::M(entry)
}

/// An entry of `delivery`'s log (one an older build wrote has the id already).
fn attempt_from_attr(v: &AttributeValue, delivery: &DeliveryId) -> Result<Attempt, PortError> {
    match v {
        AttributeValue::M(entry) => {
            let mut entry = entry.clone();
            entry
                .entry(ATTEMPT_DELIVERY_ID.into())
                .or_insert_with(|| s(delivery.as_str()));
            from_item(&entry)
        }
        _ => Err(corrupt(ATTEMPT_LOG, "an entry is not a map")),
    }
}

/// Attempts by round and number, each once: a log spilled to its own item by a call that
/// died before taking it off the delivery is in both places for a while.
fn in_order(attempts: Vec<Attempt>) -> Vec<Attempt> {
    let by_number: std::collections::BTreeMap<(u32, u32), Attempt> =
        attempts.into_iter().map(|a| ((a.round, a.attempt), a)).collect();
    by_number.into_values().collect()
}

const EXPECTED_STATE: &str = "attribute_exists(pk) AND #status = :status AND #round = :round AND #attempts = :attempts";

#[async_trait]
impl Store for DynamoStore {
    async fn create_tenant(&self, tenant: &Tenant) -> PortResult<()> {
        let mut items = vec![
            self.put_new(with_key(to_item(tenant), &tenant_key(&tenant.id), "tenant"))?,
            self.put(key_item(&directory_key(&tenant.id)), None)?,
        ];
        for key in &tenant.api_keys {
            items.push(self.put_new(with_key(to_item(tenant), &api_key_key(&key.hash), "api_key"))?);
        }
        match self.transact(items, None, "create tenant").await {
            Ok(()) => Ok(()),
            Err(TxFailure::Condition(_)) => {
                Err(PortError::ConditionFailed("API key or tenant id already in use".into()))
            }
            Err(TxFailure::Other(e)) => Err(e),
        }
    }

    async fn list_tenants(&self, after: Option<&TenantId>, limit: u32) -> PortResult<Vec<Tenant>> {
        let keys: Vec<Key> = self.tenant_ids(after, limit).await?.iter().map(tenant_key).collect();
        let found = self.batch_get(&keys, "list tenants").await?;
        // By id, as the directory lists them; one whose item is gone is left out.
        keys.iter().filter_map(|k| found.get(&k.0)).map(from_item).collect()
    }

    async fn update_tenant(&self, tenant: &Tenant, read: &Tenant) -> PortResult<()> {
        // Written only if still as read: an item an older build wrote has no version yet.
        let condition = if read.version == 0 {
            "attribute_exists(pk) AND (attribute_not_exists(#version) OR #version = :version)"
        } else {
            "attribute_exists(pk) AND #version = :version"
        };
        let put_tenant = Put::builder()
            .table_name(&self.table)
            .set_item(Some(with_key(to_item(tenant), &tenant_key(&tenant.id), "tenant")))
            .condition_expression(condition)
            .expression_attribute_names("#version", "version")
            .expression_attribute_values(":version", n(read.version))
            .build()
            .map_err(|e| build_err("put", e))?;
        let (claimed, freed) = tenant.key_changes(read);
        let mut items = vec![
            TransactWriteItem::builder().put(put_tenant).build(),
            // An older build listed no tenants: a change lists this one.
            self.put(key_item(&directory_key(&tenant.id)), None)?,
        ];
        // Every key item holds a copy of the tenant: the kept ones are written afresh.
        for key in &tenant.api_keys {
            let item = with_key(to_item(tenant), &api_key_key(&key.hash), "api_key");
            let claims = claimed.iter().any(|c| c.hash == key.hash);
            items.push(self.put(item, claims.then_some("attribute_not_exists(pk)"))?);
        }
        for key in freed {
            let delete = Delete::builder()
                .table_name(&self.table)
                .set_key(Some(key_item(&api_key_key(&key.hash))))
                .build()
                .map_err(|e| build_err("delete", e))?;
            items.push(TransactWriteItem::builder().delete(delete).build());
        }
        match self.transact(items, None, "update tenant").await {
            Ok(()) => Ok(()),
            Err(TxFailure::Condition(_)) => Err(PortError::ConditionFailed(format!(
                "tenant `{}` changed since it was read, is gone, or a new key is in use",
                tenant.id
            ))),
            Err(TxFailure::Other(e)) => Err(e),
        }
    }

    async fn tenant_by_api_key(&self, api_key_hash: &str) -> PortResult<Option<Tenant>> {
        self.get(&api_key_key(api_key_hash), "tenant by API key")
            .await?
            .as_ref()
            .map(from_item)
            .transpose()
    }

    async fn get_tenant(&self, id: &TenantId) -> PortResult<Option<Tenant>> {
        self.get(&tenant_key(id), "get tenant")
            .await?
            .as_ref()
            .map(from_item)
            .transpose()
    }

    async fn create_portal_session(&self, session: &PortalSession) -> PortResult<()> {
        let mut item = with_key(to_item(session), &portal_session_key(&session.id), "portal_session");
        let gone_at = session.valid_until + chrono::Duration::days(1);
        item.insert(TTL_ATTRIBUTE.into(), n(gone_at.timestamp()));
        let condition = Condition::new("attribute_not_exists(pk)");
        self.put_item(item, Some(condition), "create portal session").await
    }

    async fn portal_session(&self, id: &PortalSessionId) -> PortResult<Option<PortalSession>> {
        let item = self.get(&portal_session_key(id), "read portal session").await?;
        item.as_ref().map(from_item).transpose()
    }

    async fn delete_portal_session(&self, id: &PortalSessionId) -> PortResult<bool> {
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key_item(&portal_session_key(id))))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllOld)
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await
            .map_err(|e| classify("delete portal session", e))?;
        self.charge("delete portal session", true, out.consumed_capacity());
        Ok(out.attributes().is_some_and(|a| !a.is_empty()))
    }

    async fn deployment(&self) -> PortResult<Deployment> {
        let item = self.get(&deployment_key(), "read the deployment's settings").await?;
        Ok(item.as_ref().map(from_item).transpose()?.unwrap_or_default())
    }

    async fn put_deployment(&self, next: &Deployment, read: &Deployment) -> PortResult<()> {
        let item = with_key(to_item(next), &deployment_key(), "deployment");
        // A stored copy has a version of 1 or more: `read` at 0 is of none stored.
        let condition = match read.version {
            0 => Condition::new("attribute_not_exists(pk)"),
            v => Condition::new("#version = :version")
                .name("#version", "version")
                .value(":version", n(v)),
        };
        self.put_item(item, Some(condition), "write the deployment's settings")
            .await
    }

    async fn put_event_type(&self, def: &EventTypeDefinition, read_at: Option<DateTime<Utc>>) -> PortResult<()> {
        const WHAT: &str = "write event type";
        let item = with_key(
            to_item(def),
            &event_type_key(def.tenant_id.as_ref(), &def.name),
            "event_type",
        );
        // A new one where its scope has none of its name; a change over the copy read.
        let condition = match read_at {
            None => Condition::new("attribute_not_exists(pk)"),
            Some(at) => Condition::new("attribute_exists(pk) AND updated_at = :read_at")
                .value(":read_at", stored_time(at, WHAT)?),
        };
        self.put_item(item, Some(condition), WHAT).await
    }

    async fn event_type(&self, tenant: Option<&TenantId>, name: &EventType) -> PortResult<Option<EventTypeDefinition>> {
        self.get(&event_type_key(tenant, name), "read event type")
            .await?
            .as_ref()
            .map(from_item)
            .transpose()
    }

    async fn list_event_types(
        &self,
        tenant: Option<&TenantId>,
        after: Option<&EventType>,
        limit: u32,
    ) -> PortResult<Vec<EventTypeDefinition>> {
        // The partition holds only `TYPE#{name}` keys, sorted by their bytes as names are: those
        // after `after`'s, or after the bare prefix (no name is empty).
        let from = after.map_or_else(|| EVENT_TYPE_PREFIX.to_owned(), |a| event_type_key(tenant, a).1);
        let q = self
            .client
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk AND sk > :from")
            .expression_attribute_values(":pk", s(catalogue_partition(tenant)))
            .expression_attribute_values(":from", s(&from));
        self.query_up_to(q, limit as usize, "list event types")
            .await?
            .iter()
            .map(from_item)
            .collect()
    }

    async fn create_subscription(&self, sub: &Subscription) -> PortResult<()> {
        let item = with_key(to_item(sub), &subscription_key(&sub.tenant_id, &sub.id), "subscription");
        self.put_item(
            item,
            Some(Condition::new("attribute_not_exists(pk)")),
            "create subscription",
        )
        .await
    }

    async fn replace_subscription(&self, sub: &Subscription, read_at: DateTime<Utc>) -> PortResult<()> {
        let item = with_key(to_item(sub), &subscription_key(&sub.tenant_id, &sub.id), "subscription");
        let version = stored_time(read_at, "replace subscription")?;
        let condition = Condition::new("attribute_exists(pk) AND updated_at = :read_at").value(":read_at", version);
        self.put_item(item, Some(condition), "replace subscription").await
    }

    async fn get_subscription(&self, tenant: &TenantId, id: &SubscriptionId) -> PortResult<Option<Subscription>> {
        self.get(&subscription_key(tenant, id), "get subscription")
            .await?
            .as_ref()
            .map(from_item)
            .transpose()
    }

    async fn list_subscriptions(
        &self,
        tenant: &TenantId,
        after: Option<&SubscriptionId>,
        limit: u32,
    ) -> PortResult<Vec<Subscription>> {
        // The sort keys are `SUB#{id}`: those after `after` (ids are all of one length, and
        // `~` sorts after every character of one) up to the end of the `SUB#` range.
        let from = after.map_or_else(|| "SUB#".to_owned(), |a| format!("SUB#{a}~"));
        let q = self
            .client
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk AND sk BETWEEN :from AND :to")
            .expression_attribute_values(":pk", s(tenant_key(tenant).0))
            .expression_attribute_values(":from", s(&from))
            .expression_attribute_values(":to", s("SUB#~"));
        self.query_up_to(q, limit as usize, "list subscriptions")
            .await?
            .iter()
            .map(from_item)
            .collect()
    }

    async fn delete_subscription(&self, tenant: &TenantId, id: &SubscriptionId) -> PortResult<bool> {
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key_item(&subscription_key(tenant, id))))
            .return_values(ReturnValue::AllOld)
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await
            .map_err(|e| classify("delete subscription", e))?;
        self.charge("delete subscription", true, out.consumed_capacity());
        Ok(out.attributes.is_some_and(|a| !a.is_empty()))
    }

    async fn create_event(&self, event: &Event, deliveries: &[Delivery]) -> PortResult<Created> {
        // No transaction (it bills every item and index entry twice). The deliveries first
        // (`put_delivery`), then the event, the commit point: until it is written, and lists
        // them, the deliveries are not seen (`committed`).
        // The futures are built first: a closure in the stream trips the `Send` check.
        let puts: Vec<_> = deliveries.iter().map(|d| self.put_delivery(d)).collect();
        futures::stream::iter(puts)
            .buffer_unordered(CONCURRENCY * 4)
            .try_collect::<Vec<()>>()
            .await?;
        // A keyed event's id is derived from its key (`EventId::for_key`), so this
        // conditional put is the key check too: no marker item.
        let written = self
            .put_item(
                self.event_item(event, deliveries),
                Some(Condition::new("attribute_not_exists(pk)")),
                "create event",
            )
            .await;
        match written {
            Ok(()) => Ok(Created::New),
            Err(PortError::ConditionFailed(_)) => {
                let stored = self.get(&event_key(&event.id), "read event").await?;
                match stored.as_ref().map(Self::decode_event).transpose()? {
                    // The SDK's retry of this very put, after the first try's answer was lost.
                    Some((first, ids)) if &first == event && ids.iter().eq(deliveries.iter().map(|d| &d.id)) => {
                        Ok(Created::New)
                    }
                    Some(_) if event.idempotency_key.is_some() => Ok(Created::Existing(event.id.clone())),
                    _ => Err(PortError::ConditionFailed(format!("event {} already exists", event.id))),
                }
            }
            Err(e) => Err(e),
        }
    }
    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> PortResult<Option<Event>> {
        let Some(item) = self.event(id, "get event").await? else {
            return Ok(None);
        };
        let (event, _) = Self::decode_event(&item)?;
        Ok((&event.tenant_id == tenant).then_some(event))
    }

    /// In one read (`BatchGetItem`, a hundred keys a request): an ingest's keyed events. One
    /// that does not decode is `None` (and logged), as if read alone and failed: the others
    /// are still found.
    async fn get_events(&self, tenant: &TenantId, ids: &[EventId]) -> PortResult<Vec<Option<Event>>> {
        let keys: Vec<Key> = ids.iter().map(event_key).collect();
        let found = self.events(&keys, "get events").await?;
        Ok(keys
            .iter()
            .map(|key| match found.get(&key.0).map(Self::decode_event).transpose() {
                Ok(decoded) => decoded.map(|(event, _)| event).filter(|e| &e.tenant_id == tenant),
                Err(error) => {
                    tracing::warn!(%error, key = %key.0, "an event item that does not decode");
                    None
                }
            })
            .collect())
    }

    async fn event_deliveries(&self, tenant: &TenantId, event: &EventId) -> PortResult<Vec<Delivery>> {
        let Some(item) = self.event(event, "event deliveries").await? else {
            return Ok(Vec::new());
        };
        let (event, ids) = Self::decode_event(&item)?;
        if &event.tenant_id != tenant {
            return Ok(Vec::new());
        }
        self.deliveries_by_id(&ids, "event deliveries").await
    }

    async fn get_delivery(&self, id: &DeliveryId) -> PortResult<Option<Delivery>> {
        let Some(item) = self.get(&delivery_key(id), "get delivery").await? else {
            return Ok(None);
        };
        Ok(self
            .committed(vec![from_item(&item)?], |d| d, "get delivery")
            .await?
            .pop())
    }

    async fn list_deliveries(&self, tenant: &TenantId, query: &DeliveryQuery) -> PortResult<DeliveryPage> {
        if let Some(c) = &query.cursor {
            check_cursor(c)?;
        }
        match (&query.subscription_id, query.status) {
            (Some(sub), status) => {
                let key = format!("{tenant}#{sub}");
                self.list_from_index(tenant, INDEX_BY_SUBSCRIPTION, GSI_SUBSCRIPTION, key, status, query)
                    .await
            }
            (None, Some(status)) if !in_status_index(status) => {
                self.list_from_index(
                    tenant,
                    INDEX_BY_TENANT,
                    GSI_TENANT,
                    tenant.to_string(),
                    Some(status),
                    query,
                )
                .await
            }
            (None, Some(status)) => {
                let key = format!("{tenant}#{}", status.as_str());
                let page = self
                    .list_from_index(tenant, INDEX_BY_TENANT_STATUS, GSI_TENANT_STATUS, key, None, query)
                    .await?;
                // The index may still list a delivery under its old status for a moment.
                Ok(DeliveryPage {
                    items: page.items.into_iter().filter(|d| d.status == status).collect(),
                    ..page
                })
            }
            (None, None) => {
                self.list_from_index(tenant, INDEX_BY_TENANT, GSI_TENANT, tenant.to_string(), None, query)
                    .await
            }
        }
    }

    async fn apply_change(&self, change: &DeliveryChange) -> PortResult<()> {
        if change.next.round != change.expected.round {
            // A replay: its round may retry for up to the retention (no policy may retry
            // longer), so the event must outlive the round start by that much. First, so a
            // replay never runs without its event.
            self.keep_event_until(&change.next.event_id, change.next.updated_at + self.retention)
                .await?;
        }
        // The log holds each attempt once: the state's count says which are in it.
        let e = &change.expected;
        if let Some(a) = change
            .attempt
            .as_ref()
            .filter(|a| a.round == e.round && a.attempt <= e.attempts)
        {
            return Err(PortError::ConditionFailed(format!(
                "attempt {} of round {} of {} is already recorded",
                a.attempt, a.round, a.delivery_id
            )));
        }
        // One conditional `UpdateItem`, no transaction: the new state and the attempt that
        // caused it are one item (the attempt appended to the delivery's `attempt_log`).
        let update = DeliveryUpdate::new(
            &change.next,
            self.delivery_item(&change.next),
            e,
            change.attempt.as_ref(),
        );
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_item(&delivery_key(&change.next.id))))
            .update_expression(update.expression)
            .condition_expression(EXPECTED_STATE)
            .set_expression_attribute_names(Some(update.names))
            .set_expression_attribute_values(Some(update.values))
            .return_values(if change.attempt.is_some() {
                ReturnValue::UpdatedNew
            } else {
                ReturnValue::None
            })
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await;
        match result {
            Ok(out) => {
                self.charge("apply change", true, out.consumed_capacity());
                if let Some(logged @ AttributeValue::L(log)) = out.attributes.as_ref().and_then(|a| a.get(ATTEMPT_LOG))
                {
                    if attribute_size(logged) > SPILL_BYTES && log.len() > 1 {
                        self.spill_attempts(&change.next.id, log).await?;
                    }
                }
                Ok(())
            }
            Err(err) => {
                if let Some(UpdateItemError::ConditionalCheckFailedException(failed)) = err.as_service_error() {
                    // If a retry of this request finds its own write, the condition fails on
                    // an item equal to the new state: that is success.
                    let current: Option<Delivery> = failed.item().map(from_item).transpose().ok().flatten();
                    if current.as_ref() == Some(&change.next) {
                        return Ok(());
                    }
                    let why = match (&change.attempt, failed.item().is_some()) {
                        (Some(a), true) => format!(
                            "the delivery changed (attempt {} of round {} may be recorded already)",
                            a.attempt, a.round
                        ),
                        (None, true) => "the delivery changed".to_owned(),
                        (_, false) => "no such delivery".to_owned(),
                    };
                    return Err(PortError::ConditionFailed(format!(
                        "apply change to {}: {why}",
                        change.next.id
                    )));
                }
                Err(classify("apply change", err))
            }
        }
    }

    async fn attempts(&self, delivery: &DeliveryId) -> PortResult<Vec<Attempt>> {
        // The whole partition: the delivery with its log, the logs spilled from it, and the
        // one-item-per-attempt records an older build wrote.
        let q = self
            .client
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(delivery_key(delivery).0));
        let mut found = Vec::new();
        for item in self.query_all(q, "attempts").await? {
            match item.get("kind").and_then(|k| k.as_s().ok()).map(String::as_str) {
                Some("delivery" | "attempts") => {
                    if let Some(AttributeValue::L(log)) = item.get(ATTEMPT_LOG) {
                        for a in log {
                            found.push(attempt_from_attr(a, delivery)?);
                        }
                    }
                }
                Some("attempt") => found.push(from_item(&item)?),
                _ => {}
            }
        }
        Ok(in_order(found))
    }

    async fn overdue_deliveries(&self, due_before: DateTime<Utc>, limit: u32) -> PortResult<Vec<Delivery>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let before = sortable_time(due_before);
        let per_shard: Vec<Vec<(String, Key)>> = futures::stream::iter(0..OVERDUE_SHARDS)
            .map(|shard| self.overdue_shard_keys(shard, &before, limit))
            .buffered(OVERDUE_SHARDS as usize)
            .try_collect()
            .await?;
        let mut keys: Vec<(String, Key)> = per_shard.into_iter().flatten().collect();
        keys.sort();
        keys.truncate(limit as usize);
        let found = self
            .batch_get(
                &keys.iter().map(|(_, k)| k.clone()).collect::<Vec<_>>(),
                "overdue deliveries",
            )
            .await?;
        let mut overdue = Vec::new();
        for (_, k) in &keys {
            let Some(item) = found.get(&k.0) else { continue };
            if item
                .get("kind")
                .and_then(|v| v.as_s().ok())
                .is_some_and(|k| k == "event")
            {
                // An ingest an older build left half way (see docs/aws.md, upgrading): its
                // missing deliveries are not written; it leaves the index, so it is met once.
                tracing::warn!(key = %k.0, "an event an older build did not finish writing; its missing deliveries are not written");
                unless_changed(
                    self.update_item(
                        k,
                        "REMOVE #s, #d",
                        Some("attribute_exists(pk)"),
                        &[("#s", GSI_DUE_SHARD), ("#d", GSI_DUE)],
                        Vec::new(),
                        "overdue deliveries",
                    )
                    .await,
                )?;
                continue;
            }
            let d: Delivery = from_item(item)?;
            if matches!(d.status, DeliveryStatus::Pending | DeliveryStatus::Retrying)
                && d.next_attempt_at.is_some_and(|t| t < due_before)
            {
                overdue.push(d);
            }
        }
        Ok(overdue)
    }

    /// Tenant by tenant, and each tenant's `by-tenant` keys one after another (no order across
    /// them is needed: each delivery is met once), about `limit` index entries a call, the
    /// deliveries they name read eventually consistently (a first attempt an hour old is
    /// settled in every replica). A call stops at the end of a tenant's keys, so one with many
    /// tenants and nothing stored costs a few small queries each (tenants are found by the
    /// directory's keys, their items unread).
    async fn awaiting_queued_message(
        &self,
        created: std::ops::Range<DateTime<Utc>>,
        after: Option<&str>,
        limit: u32,
    ) -> PortResult<AuditPage> {
        const WHAT: &str = "audit queued messages";
        let mut place = match after {
            Some(a) => AuditPlace::decode(a)?,
            None => match self.tenant_ids(None, 1).await?.pop() {
                Some(first) => AuditPlace::start_of(first),
                None => return Ok(AuditPage::default()),
            },
        };
        let (start, end) = (sortable_time(created.start), sortable_time(created.end));
        let shards: Vec<String> = listing_keys(&place.tenant.to_string()).collect();
        let mut entries: Vec<Key> = Vec::new();
        let mut next = None;
        while let Some(shard) = shards.get(place.shard) {
            let want = (limit.max(1) as usize).saturating_sub(entries.len());
            // From the range's start (a key `{time}#{id}` sorts after its time alone), or
            // after the last read; to its end, exclusive (`{end}#{id}` sorts after `{end}`).
            let lo = place.after.clone().unwrap_or_else(|| start.clone());
            let q = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(INDEX_BY_TENANT)
                .key_condition_expression("#k = :k AND #c BETWEEN :lo AND :hi")
                .expression_attribute_names("#k", GSI_TENANT)
                .expression_attribute_names("#c", GSI_CREATED)
                .expression_attribute_values(":k", s(shard))
                .expression_attribute_values(":lo", s(&lo))
                .expression_attribute_values(":hi", s(&end))
                .limit(want as i32 + 1)
                .set_return_consumed_capacity(self.rcc());
            let out = q.send().await.map_err(|e| classify(WHAT, e))?;
            self.charge(WHAT, false, out.consumed_capacity());
            let mut read = Vec::new();
            for it in out.items() {
                let created_key = get_s(it, GSI_CREATED)?;
                if place.after.as_deref() != Some(created_key) {
                    read.push((
                        created_key.to_owned(),
                        (get_s(it, PK)?.to_owned(), get_s(it, SK)?.to_owned()),
                    ));
                }
            }
            let more = read.len() > want || out.last_evaluated_key.is_some_and(|k| !k.is_empty());
            read.truncate(want);
            if more {
                place.after = read.last().map(|(c, _)| c.clone()).or(place.after);
                entries.extend(read.into_iter().map(|(_, k)| k));
                next = Some(place.encode());
                break;
            }
            entries.extend(read.into_iter().map(|(_, k)| k));
            place = AuditPlace {
                shard: place.shard + 1,
                after: None,
                ..place
            };
        }
        if next.is_none() {
            // This tenant is done: the next one, if any, from its start.
            next = self
                .tenant_ids(Some(&place.tenant), 1)
                .await?
                .pop()
                .map(|t| AuditPlace::start_of(t).encode());
        }
        let items = self.batch_get_read(&entries, WHAT, false).await?;
        let mut awaiting = Vec::new();
        for k in &entries {
            let Some(item) = items.get(&k.0) else { continue };
            // One item that does not decode must not stop the audit at this place for good.
            match from_item::<Delivery>(item) {
                Ok(d) if d.awaits_queued_message() && created.contains(&d.created_at) => awaiting.push(d),
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, key = %k.0, "the audit of queued messages skips an item that does not decode")
                }
            }
        }
        // One whose ingest died before its event is not seen, and never will be.
        let deliveries = self.committed(awaiting, |d| d, WHAT).await?;
        Ok(AuditPage { deliveries, next })
    }

    /// `rate_limit::admit`'s rules as conditions on atomic writes (a contract test holds the
    /// two to the same verdicts), so workers on one endpoint never retry on each other:
    /// 1. a turn on the send line: `ADD` the interval to `next_turn` while it is between the
    ///    tolerance behind and [`SLOT_WAIT`] ahead, or `SET` it afresh past now once it has
    ///    fallen behind (tried first when this process last saw it idle). An attempt back from
    ///    the backlog marks it `alive`; one that finds the line full comes back for its next
    ///    turn, read from the refused write. A new attempt takes a turn only while the turn is
    ///    free now, or no backlog slot (of a backlog alive) is at or after it;
    /// 2. else a new attempt gets a slot on the backlog: `ADD` the interval to `last_slot`
    ///    while it is at or after the send line's next turn and the backlog alive, else `SET`
    ///    it to that turn, alive from now.
    ///
    /// One write a verdict most of the time, a wrong guess one more; lines moving between two
    /// steps go round again. (The SDK's retry of a lost `ADD` wastes a turn or slot: the rate
    /// dips, never rises.)
    async fn limit_rate(
        &self,
        sub: &SubscriptionId,
        interval: std::time::Duration,
        now: DateTime<Utc>,
        arrival: Arrival,
    ) -> PortResult<Verdict> {
        let now_us = now.timestamp_micros();
        let interval_us = i64::try_from(interval.as_micros()).unwrap_or(i64::MAX).max(1);
        let behind_us = now_us - TOLERANCE.as_micros() as i64;
        let latest_us = now_us + SLOT_WAIT.as_micros() as i64;
        let gone_us = now_us - BACKLOG_GONE.as_micros() as i64;
        let at = |us: i64| DateTime::from_timestamp_micros(us).unwrap_or(now);
        let new = arrival == Arrival::New;
        let last_seen = self
            .turns_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sub)
            .copied();
        let idle_first = last_seen.is_none_or(|next| next < behind_us);
        for _ in 0..4 {
            for idle in [idle_first, !idle_first] {
                let written = if idle {
                    let (update, mut values) = if new {
                        ("SET next_turn = :next", vec![])
                    } else {
                        ("SET next_turn = :next, alive = :now", vec![(":now", n(now_us))])
                    };
                    values.extend([(":next", n(now_us + interval_us)), (":behind", n(behind_us))]);
                    let condition = "attribute_not_exists(next_turn) OR next_turn < :behind";
                    self.write_line(sub, update, condition, values, "next_turn")
                        .await?
                        .map(|_| now_us)
                } else {
                    let mut values = vec![
                        (":interval", n(interval_us)),
                        (":behind", n(behind_us)),
                        (":latest", n(latest_us)),
                        (":now", n(now_us)),
                    ];
                    let (update, condition) = if new {
                        values.push((":gone", n(gone_us)));
                        (
                            "ADD next_turn :interval",
                            "next_turn BETWEEN :behind AND :latest AND (next_turn <= :now \
                             OR attribute_not_exists(last_slot) OR last_slot < next_turn \
                             OR attribute_not_exists(alive) OR alive <= :gone)",
                        )
                    } else {
                        (
                            "ADD next_turn :interval SET alive = :now",
                            "next_turn BETWEEN :behind AND :latest",
                        )
                    };
                    self.write_line(sub, update, condition, values, "next_turn")
                        .await?
                        .map(|next| next - interval_us)
                };
                match written {
                    Ok(turn) => {
                        self.turns_seen
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(sub.clone(), turn + interval_us);
                        return Ok(Verdict::SendAt(at(turn)));
                    }
                    // Back from the backlog to a full send line: back for its next turn.
                    Err(lines) if !new => {
                        if let Some(turn) = get_n::<i64>(&lines, "next_turn").ok().filter(|t| *t > latest_us) {
                            return Ok(Verdict::Wait(at(turn)));
                        }
                    }
                    Err(_) => {}
                }
            }
            if !new {
                continue;
            }
            let joined = self
                .write_line(
                    sub,
                    "ADD last_slot :interval",
                    "last_slot >= next_turn AND alive > :gone",
                    vec![(":interval", n(interval_us)), (":gone", n(gone_us))],
                    "last_slot",
                )
                .await?;
            let slot = match joined {
                Ok(slot) => Ok(slot),
                Err(_) => {
                    self.write_line(
                        sub,
                        "SET last_slot = next_turn, alive = :now",
                        "attribute_exists(next_turn) AND (attribute_not_exists(last_slot) OR last_slot < next_turn \
                         OR attribute_not_exists(alive) OR alive <= :gone)",
                        vec![(":now", n(now_us)), (":gone", n(gone_us))],
                        "last_slot",
                    )
                    .await?
                }
            };
            if let Ok(slot) = slot {
                return Ok(Verdict::Wait(at(slot)));
            }
        }
        // The lines moved under every step, four times over: come back in a moment, no turn
        // taken.
        Ok(Verdict::Wait(now + chrono::Duration::seconds(2)))
    }

    async fn circuit(&self, sub: &SubscriptionId) -> PortResult<Option<Circuit>> {
        self.get(&circuit_key(sub), "circuit breaker")
            .await?
            .map(|item| from_item(&item))
            .transpose()
    }

    async fn put_circuit(&self, sub: &SubscriptionId, circuit: &Circuit, read: Option<&Circuit>) -> PortResult<()> {
        let item = with_key(to_item(circuit), &circuit_key(sub), "circuit");
        let condition = match read {
            None => Condition::new("attribute_not_exists(pk)"),
            Some(r) => Condition::new("#version = :read")
                .name("#version", "version")
                .value(":read", n(r.version)),
        };
        self.put_item(item, Some(condition), "write a circuit breaker").await
    }

    async fn endpoint_health(&self, sub: &SubscriptionId) -> PortResult<EndpointHealth> {
        let Some(item) = self.get(&health_key(sub), "endpoint health").await? else {
            return Ok(EndpointHealth::default());
        };
        // Health is advisory: an item that does not decode (an older format) starts afresh
        // rather than holding up deliveries.
        Ok(health_from_attr(&item, "samples").unwrap_or_else(|err| {
            tracing::warn!(error = %err, subscription = %sub, "endpoint health does not decode; starting afresh");
            // Its version kept: the next save goes over it.
            EndpointHealth {
                version: health_version(&item),
                ..EndpointHealth::default()
            }
        }))
    }

    async fn save_endpoint_health(&self, sub: &SubscriptionId, health: &EndpointHealth) -> PortResult<()> {
        let mut item = HashMap::from([("samples".to_owned(), health_to_attr(health))]);
        if let Some(nanos) = health.last_success_at.and_then(|at| at.timestamp_nanos_opt()) {
            item.insert("last_success".to_owned(), n(nanos));
        }
        item.insert("version".to_owned(), n(health.version + 1));
        // Over the version read only (0: none, or one saved before versions were kept).
        let condition = match health.version {
            0 => Condition::new("attribute_not_exists(#version)"),
            v => Condition::new("#version = :version").value(":version", n(v)),
        }
        .name("#version", "version");
        let written = self
            .put_item(
                with_key(item, &health_key(sub), "endpoint_health"),
                Some(condition),
                "save endpoint health",
            )
            .await;
        match written {
            Err(PortError::ConditionFailed(why)) => {
                // The SDK's retry of this very put, after the first try's answer was lost,
                // finds its own write: done (a caller told otherwise would merge its samples
                // in twice).
                let saved = EndpointHealth {
                    version: health.version + 1,
                    ..health.clone()
                };
                match self.endpoint_health(sub).await? == saved {
                    true => Ok(()),
                    false => Err(PortError::ConditionFailed(why)),
                }
            }
            other => other,
        }
    }

    async fn add_endpoint_stats(
        &self,
        sub: &SubscriptionId,
        counts: &[(DateTime<Utc>, StatsCounts)],
    ) -> PortResult<()> {
        let adds: Vec<_> = counts
            .iter()
            .map(|(bucket, c)| self.add_stats_bucket(sub, *bucket, c))
            .collect();
        futures::future::try_join_all(adds).await?;
        Ok(())
    }

    async fn endpoint_stats(
        &self,
        sub: &SubscriptionId,
        from: DateTime<Utc>,
    ) -> PortResult<Vec<(DateTime<Utc>, StatsCounts)>> {
        // Eventually consistent, at half the price: a chart a second behind is as good, and a
        // week's window reads up to two thousand buckets.
        let q = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND sk >= :from")
            .expression_attribute_values(":pk", s(stats_partition(sub)))
            .expression_attribute_values(":from", s(stats_key(sub, from).1));
        self.query_all(q, "read endpoint stats")
            .await?
            .iter()
            .map(|item| Ok((stats_bucket(item)?, stats_from_item(item)?)))
            .collect()
    }

    async fn queue_dead_notice(&self, owner: &Email, notice: &DeadNotice) -> PortResult<bool> {
        let mut record = with_key(
            HashMap::new(),
            &notice_key(&notice.delivery_id, notice.round),
            "dead_notice",
        );
        record.insert("recipient".into(), s(owner.as_str()));
        // One time for the whole request, which its token covers: the SDK's retries of it send
        // the same content, and a later call (a redelivered dead letter) another token.
        let now = Utc::now();
        record.insert(TTL_ATTRIBUTE.into(), self.expires_at(notice.died_at.max(now)));
        let key = waiting_notice_key(owner, &notice.delivery_id, notice.round);
        let mut waiting = with_key(to_item(notice), &key, "waiting_notice");
        waiting.insert(TTL_ATTRIBUTE.into(), self.expires_at(notice.died_at.max(now)));
        let digest = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key_item(&digest_key(owner))))
            .update_expression(
                "SET recipient = :owner, #shard = :shard, #due = if_not_exists(#due, :due) ADD #counted :one",
            )
            .expression_attribute_names("#shard", GSI_DUE_SHARD)
            .expression_attribute_names("#due", GSI_DUE)
            .expression_attribute_names("#counted", "counted")
            .expression_attribute_values(":owner", s(owner.as_str()))
            .expression_attribute_values(":shard", s(DIGEST_SHARD))
            .expression_attribute_values(":due", s(format!("{}#{owner}", sortable_time(now))))
            .expression_attribute_values(":one", n(1))
            .build()
            .map_err(|e| build_err("digest update", e))?;
        // Recorded once per round: a notice item exists once it is recorded, unless it is a
        // claim left unsent by a build before digests (which named no recipient).
        let items = vec![
            self.put(
                record,
                Some("attribute_not_exists(pk) OR (attribute_not_exists(sent_at) AND attribute_not_exists(recipient) AND attribute_exists(claimed_at))"),
            )?,
            self.put(waiting, None)?,
            TransactWriteItem::builder().update(digest).build(),
        ];
        let token = request_token(&[owner, notice, &now]);
        match self.transact(items, Some(token), "queue dead notice").await {
            Ok(()) => Ok(true),
            Err(TxFailure::Condition(failed)) if failed.is_empty() || failed == [0] => Ok(false),
            Err(TxFailure::Condition(failed)) => Err(PortError::permanent(
                "queue dead notice",
                format!("conditions failed on items {failed:?}"),
            )),
            Err(TxFailure::Other(e)) => Err(e),
        }
    }

    async fn due_digests(&self, now: DateTime<Utc>, window_start: DateTime<Utc>, limit: u32) -> PortResult<Vec<Email>> {
        let q = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(INDEX_OVERDUE)
            .key_condition_expression("#s = :s")
            .expression_attribute_names("#s", GSI_DUE_SHARD)
            .expression_attribute_values(":s", s(DIGEST_SHARD));
        let keys: Vec<Key> = self
            .query_all(q, "due digests")
            .await?
            .iter()
            .map(|it| Ok((get_s(it, PK)?.to_owned(), get_s(it, SK)?.to_owned())))
            .collect::<PortResult<_>>()?;
        let found = self.batch_get(&keys, "due digests").await?;
        let mut owners = Vec::new();
        for (pk, _) in &keys {
            let Some(item) = found.get(pk) else { continue };
            let last_sent: Option<i64> = item
                .contains_key("last_sent_at")
                .then(|| get_n(item, "last_sent_at"))
                .transpose()?;
            let retry_at: Option<i64> = item
                .contains_key("retry_at")
                .then(|| get_n(item, "retry_at"))
                .transpose()?;
            if last_sent.is_none_or(|t| t <= window_start.timestamp_millis())
                && retry_at.is_none_or(|t| t <= now.timestamp_millis())
            {
                let owner = get_s(item, "recipient")?;
                owners.push(Email::parse(owner).map_err(|e| corrupt("recipient", e.to_string()))?);
            }
        }
        owners.truncate(limit as usize);
        Ok(owners)
    }

    async fn claim_digest(
        &self,
        owner: &Email,
        now: DateTime<Utc>,
        window_start: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> PortResult<Option<DigestClaim>> {
        let at = now.timestamp_millis();
        let nonce = claim_nonce();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_item(&digest_key(owner))))
            .update_expression("SET claimed_at = :now, claim = :nonce")
            .condition_expression(
                "attribute_exists(#due) AND (attribute_not_exists(last_sent_at) OR last_sent_at <= :window) \
                 AND (attribute_not_exists(claimed_at) OR claimed_at < :stale) \
                 AND (attribute_not_exists(retry_at) OR retry_at <= :now)",
            )
            .expression_attribute_names("#due", GSI_DUE)
            .expression_attribute_values(":now", n(at))
            .expression_attribute_values(":nonce", s(&nonce))
            .expression_attribute_values(":window", n(window_start.timestamp_millis()))
            .expression_attribute_values(":stale", n(stale_before.timestamp_millis()))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_return_consumed_capacity(self.rcc())
            .send()
            .await;
        let digest = match result {
            Ok(out) => {
                self.charge("claim digest", true, out.consumed_capacity());
                out.attributes.unwrap_or_default()
            }
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed))
                    if failed.item().is_some_and(|it| it.get("claim") == Some(&s(&nonce))) =>
                {
                    failed.item().cloned().unwrap_or_default() // our own claim, on a retried request
                }
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => return Ok(None),
                _ => return Err(classify("claim digest", err)),
            },
        };
        let counted = if digest.contains_key("counted") {
            get_n(&digest, "counted")?
        } else {
            0
        };
        let q = self
            .client
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk AND begins_with(sk, :notice)")
            .expression_attribute_values(":pk", s(digest_key(owner).0))
            .expression_attribute_values(":notice", s("NOTICE#"));
        let notices = self
            .query_all(q, "claim digest")
            .await?
            .iter()
            .map(from_item)
            .collect::<PortResult<_>>()?;
        let claimed_at = DateTime::from_timestamp_millis(at).unwrap_or(now);
        let claim = DigestClaim::new(owner.clone(), notices, claimed_at, counted);
        if claim.notices.is_empty() {
            // Nothing waits after all: the claim goes, and the owner leaves the index.
            let key = digest_key(owner);
            unless_changed(
                self.update_item(
                    &key,
                    "REMOVE claimed_at",
                    Some("claimed_at = :at"),
                    &[],
                    vec![(":at", n(at))],
                    "claim digest",
                )
                .await,
            )?;
            self.leave_digest_index(&claim).await?;
            return Ok(None);
        }
        Ok(Some(claim))
    }

    async fn finish_digest(&self, claim: &DigestClaim) -> PortResult<()> {
        let at = n(claim.claimed_at.timestamp_millis());
        // The window first: once the email is out, the owner's next may not go before the
        // window is over, whatever fails below (then the next email mentions again what was
        // not marked).
        let key = digest_key(&claim.owner);
        unless_changed(
            self.update_item(
                &key,
                "SET last_sent_at = :at REMOVE claimed_at, retry_at",
                Some("claimed_at = :at"),
                &[],
                vec![(":at", at.clone())],
                "finish digest",
            )
            .await,
        )?; // (or taken over meanwhile)
            // Marked sent, then no longer waiting: a crash between the two sends a notice again
            // rather than never.
        futures::stream::iter(claim.notices.iter().cloned())
            .map(|notice| {
                let at = at.clone();
                async move {
                    self.update_item(
                        &notice_key(&notice.delivery_id, notice.round),
                        "SET sent_at = :at",
                        None,
                        &[],
                        vec![(":at", at)],
                        "mark dead notice sent",
                    )
                    .await?;
                    let out = self
                        .client
                        .delete_item()
                        .table_name(&self.table)
                        .set_key(Some(key_item(&waiting_notice_key(
                            &claim.owner,
                            &notice.delivery_id,
                            notice.round,
                        ))))
                        .set_return_consumed_capacity(self.rcc())
                        .send()
                        .await
                        .map_err(|e| classify("finish digest", e))?;
                    self.charge("finish digest", true, out.consumed_capacity());
                    Ok::<_, PortError>(())
                }
            })
            .buffer_unordered(NOTICE_WRITES)
            .try_collect::<Vec<()>>()
            .await?;
        self.leave_digest_index(claim).await
    }

    async fn release_digest(&self, claim: &DigestClaim, retry_at: DateTime<Utc>) -> PortResult<()> {
        let key = digest_key(&claim.owner);
        unless_changed(
            self.update_item(
                &key,
                "SET retry_at = :retry REMOVE claimed_at",
                Some("claimed_at = :at"),
                &[],
                vec![
                    (":at", n(claim.claimed_at.timestamp_millis())),
                    (":retry", n(retry_at.timestamp_millis())),
                ],
                "release digest",
            )
            .await,
        ) // taken over meanwhile
    }
}

impl DynamoStore {
    /// The owner leaves the `overdue` index, unless a notice was stored since `claim` or
    /// another claim holds the owner: those keep it there for the next email.
    async fn leave_digest_index(&self, claim: &DigestClaim) -> Result<(), PortError> {
        let key = digest_key(&claim.owner);
        unless_changed(
            self.update_item(
                &key,
                "REMOVE #shard, #due",
                Some("#counted = :counted AND attribute_not_exists(claimed_at)"),
                &[("#shard", GSI_DUE_SHARD), ("#due", GSI_DUE), ("#counted", "counted")],
                vec![(":counted", n(claim.counted))],
                "finish digest",
            )
            .await,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overdue_shards_spread_ids_and_stay_in_range() {
        let mut rng = rand::rng();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let shard = overdue_shard(DeliveryId::generate(Utc::now(), &mut rng).as_str());
            assert!(shard < OVERDUE_SHARDS);
            seen.insert(shard);
        }
        assert_eq!(seen.len(), OVERDUE_SHARDS as usize);
    }

    #[test]
    fn stats_attributes_read_back_as_the_counts_they_hold() {
        let c = StatsCounts {
            succeeded: 1,
            http_4xx: 2,
            http_5xx: 3,
            timeout: 4,
            error: 5,
            dead: 6,
            latency: std::array::from_fn(|i| 10 + i as u64),
        };
        let item: Item = stats_attributes(&c).into_iter().map(|(name, v)| (name, n(v))).collect();
        assert_eq!(stats_from_item(&item).unwrap(), c);
        assert_eq!(stats_from_item(&Item::new()).unwrap(), StatsCounts::default());
    }

    #[test]
    fn stats_keys_sort_as_their_buckets_and_read_back() {
        let sub = SubscriptionId::generate(Utc::now(), &mut rand::rng());
        let a = hookwise_core::stats::bucket_of("2030-06-01T09:58:00Z".parse().unwrap());
        let b = a + chrono::Duration::seconds(hookwise_core::stats::BUCKET_SECONDS);
        let (ka, kb) = (stats_key(&sub, a), stats_key(&sub, b));
        assert!(ka.1 < kb.1);
        let item = key_item(&kb);
        assert_eq!(stats_bucket(&item).unwrap(), b);
    }

    #[test]
    fn request_tokens_fit_dynamodb_and_differ_with_content() {
        let a = request_token(&[&1u32, &"x"]);
        assert_eq!(a.len(), 32);
        assert_eq!(a, request_token(&[&1u32, &"x"]));
        assert_ne!(a, request_token(&[&2u32, &"x"]));
    }
}
