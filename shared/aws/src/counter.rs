//! Counting what Hookwise asks of AWS: every HTTP request the SDK sends (retries included,
//! as AWS bills them), by service and operation, plus the DynamoDB capacity units the store
//! was charged, the table's and the indexes' apart. The cost meter (`tests/tests/cost.rs`)
//! divides them by the events delivered to get the cost per event.
//!
//! DynamoDB Local under-reports `TransactWriteItems`: items of equal cost in one transaction
//! are charged once. So the counter also works out what each transaction's puts cost from
//! their sizes (two units per KB, rounded up per item), and
//! [`RequestCounts::billed_write_units`] counts the larger of the two.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::ConsumedCapacity;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

use crate::store::{INDEX_KEYS, PK, SK};

/// What was counted so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestCounts {
    /// Requests by `"{service}.{operation}"`, e.g. `"dynamodb.TransactWriteItems"`.
    pub requests: BTreeMap<String, u64>,
    /// DynamoDB read and write capacity units consumed (what on-demand bills as request units),
    /// table and indexes together, as reported.
    pub read_units: f64,
    pub write_units: f64,
    /// The part of `write_units` charged to global secondary indexes.
    pub index_write_units: f64,
    /// The write units reported for transactions, and what they are billed: per transaction,
    /// the larger of the reported units and those its items' sizes and index keys say it
    /// costs (see the module's note).
    pub transaction_units_reported: f64,
    pub transaction_units_billed: f64,
    /// Capacity units by store call, e.g. `"write: apply change"`: where the units go.
    pub units_by_call: BTreeMap<String, f64>,
}

impl RequestCounts {
    /// Requests to one service (`"dynamodb"`, `"sqs"`, `"sesv2"`; case-insensitive).
    pub fn service_total(&self, service: &str) -> u64 {
        self.requests
            .iter()
            .filter(|(k, _)| k.split('.').next().is_some_and(|s| s.eq_ignore_ascii_case(service)))
            .map(|(_, n)| n)
            .sum()
    }

    pub fn total(&self) -> u64 {
        self.requests.values().sum()
    }

    /// The write units AWS would bill: as reported, with each transaction at least what its
    /// items' sizes and index keys say.
    pub fn billed_write_units(&self) -> f64 {
        self.write_units - self.transaction_units_reported + self.transaction_units_billed
    }
}

/// An SDK interceptor that counts requests; clone it into every client
/// ([`AwsClients::new`](crate::AwsClients::new)) and into the store
/// ([`DynamoStore::with_counter`](crate::DynamoStore::with_counter)) for capacity units.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    counts: Arc<Mutex<RequestCounts>>,
    /// Transactions sent and not answered yet, by their client request token: what their
    /// items say they cost.
    sized: Arc<Mutex<BTreeMap<String, f64>>>,
}

impl RequestCounter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn snapshot(&self) -> RequestCounts {
        self.lock().clone()
    }

    pub fn reset(&self) {
        *self.lock() = RequestCounts::default();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RequestCounts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn record_request(&self, service: &str, operation: &str) {
        *self
            .lock()
            .requests
            .entry(format!("{service}.{operation}"))
            .or_default() += 1;
    }

    pub(crate) fn record_capacity<'a>(
        &self,
        what: &str,
        write: bool,
        consumed: impl IntoIterator<Item = &'a ConsumedCapacity>,
    ) {
        let consumed: Vec<&ConsumedCapacity> = consumed.into_iter().collect();
        let units: f64 = consumed.iter().filter_map(|c| c.capacity_units()).sum();
        let index_units: f64 = consumed
            .iter()
            .flat_map(|c| c.global_secondary_indexes().into_iter().flatten())
            .filter_map(|(_, capacity)| capacity.capacity_units())
            .sum();
        let mut c = self.lock();
        if write {
            c.write_units += units;
            c.index_write_units += index_units;
        } else {
            c.read_units += units;
        }
        *c.units_by_call
            .entry(format!("{}: {what}", if write { "write" } else { "read" }))
            .or_default() += units;
    }

    /// A transaction's units as reported (the store calls this beside `record_capacity`),
    /// with its client request token, which names what its items said it costs.
    pub(crate) fn record_transaction<'a>(
        &self,
        token: Option<&str>,
        consumed: impl IntoIterator<Item = &'a ConsumedCapacity>,
    ) {
        let reported: f64 = consumed.into_iter().filter_map(ConsumedCapacity::capacity_units).sum();
        let sized = token
            .and_then(|t| self.sized.lock().unwrap_or_else(|p| p.into_inner()).remove(t))
            .unwrap_or(0.0);
        let mut c = self.lock();
        c.transaction_units_reported += reported;
        c.transaction_units_billed += reported.max(sized);
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "HookwiseRequestCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        match cfg.load::<Metadata>() {
            Some(m) => {
                self.record_request(m.service(), m.name());
                if m.name() == "TransactWriteItems" {
                    let sized = context.request().body().bytes().and_then(transaction_units_by_size);
                    if let Some((token, units)) = sized {
                        self.sized
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(token, units);
                    }
                }
            }
            None => self.record_request("unknown", "unknown"),
        }
        Ok(())
    }
}

/// A `TransactWriteItems` request's client token, and what its items cost by their size and
/// index keys: two write units per KB of each item, rounded up (an update's or a condition
/// check's, whose item the request does not carry, as one KB), and two per index entry of a
/// new item (a put on the condition that none is there). Entries an overwrite adds, moves or
/// removes are not known from the request: for those the reported units must do.
fn transaction_units_by_size(body: &[u8]) -> Option<(String, f64)> {
    let request = serde_json::from_slice::<serde_json::Value>(body).ok()?;
    let token = request["ClientRequestToken"].as_str()?.to_owned();
    let items = request["TransactItems"].as_array().cloned().unwrap_or_default();
    let units = items
        .iter()
        .map(|item| {
            let put = &item["Put"];
            let Some(attributes) = put["Item"].as_object() else {
                return 2.0;
            };
            let kb = item_size(attributes).div_ceil(1024).max(1);
            let new = put["ConditionExpression"]
                .as_str()
                .is_some_and(|c| c.starts_with("attribute_not_exists(pk)"));
            let entries = if new {
                INDEX_KEYS
                    .iter()
                    .filter(|keys| keys.iter().all(|k| attributes.contains_key(*k)))
                    .count()
            } else {
                0
            };
            2.0 * (kb + entries) as f64
        })
        .sum();
    Some((token, units))
}

/// What DynamoDB bills per stored item (and per index entry) beyond its own bytes.
const ITEM_OVERHEAD: u64 = 100;

/// What `table` stores, as DynamoDB bills storage: its items' bytes (as the table reports
/// them), 100 bytes of overhead per item, and per index entry its keys and the table's, plus
/// 100 bytes (Hookwise's indexes project keys only). Reads the whole table: for the cost
/// meter's small tables, not a deployment's.
pub async fn stored_bytes(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<u64, BoxError> {
    let described = client.describe_table().table_name(table).send().await?;
    let items = described.table().and_then(|t| t.table_size_bytes()).unwrap_or(0);
    let mut overhead = 0;
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .set_exclusive_start_key(start)
            .send()
            .await?;
        for item in page.items() {
            let key_bytes = |names: &[&str]| -> u64 {
                names
                    .iter()
                    .filter_map(|n| item.get(*n).and_then(|v| v.as_s().ok()).map(|v| n.len() + v.len()))
                    .sum::<usize>() as u64
            };
            overhead += ITEM_OVERHEAD;
            for keys in INDEX_KEYS
                .iter()
                .filter(|keys| keys.iter().all(|k| item.contains_key(*k)))
            {
                overhead += ITEM_OVERHEAD + key_bytes(keys) + key_bytes(&[PK, SK]);
            }
        }
        match page.last_evaluated_key {
            Some(key) if !key.is_empty() => start = Some(key),
            _ => break,
        }
    }
    Ok(items.max(0) as u64 + overhead)
}

/// An item's size as DynamoDB counts it: each attribute's name and value, in bytes.
fn item_size(attributes: &serde_json::Map<String, serde_json::Value>) -> usize {
    attributes
        .iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

fn value_size(value: &serde_json::Value) -> usize {
    let Some((kind, v)) = value.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    let text = |v: &serde_json::Value| v.as_str().map_or(0, str::len);
    match kind.as_str() {
        "S" => text(v),
        // Numbers: about one byte per two significant digits, plus one.
        "N" => text(v).div_ceil(2) + 1,
        // Base64 on the wire.
        "B" => text(v) * 3 / 4,
        "BOOL" | "NULL" => 1,
        "SS" | "NS" | "BS" => v.as_array().map_or(0, |a| a.iter().map(text).sum()),
        "L" => 3 + v.as_array().map_or(0, |a| a.iter().map(|e| 1 + value_size(e)).sum()),
        "M" => {
            3 + v
                .as_object()
                .map_or(0, |m| m.iter().map(|(k, e)| 1 + k.len() + value_size(e)).sum())
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_by_service_and_reset() {
        let c = RequestCounter::new();
        c.record_request("DynamoDB", "GetItem");
        c.record_request("DynamoDB", "GetItem");
        c.record_request("SQS", "SendMessageBatch");
        c.record_capacity("put", true, &[ConsumedCapacity::builder().capacity_units(2.0).build()]);
        let s = c.snapshot();
        assert_eq!(s.service_total("dynamodb"), 2);
        assert_eq!(s.service_total("sqs"), 1);
        assert_eq!(s.total(), 3);
        assert_eq!(s.write_units, 2.0);
        assert_eq!(s.units_by_call["write: put"], 2.0);
        c.reset();
        assert_eq!(c.snapshot(), RequestCounts::default());
    }

    #[test]
    fn a_transaction_costs_two_units_per_started_kb_of_each_item_and_index_entry_it_adds() {
        let big = "x".repeat(1500);
        let body = serde_json::json!({"ClientRequestToken": "t-1", "TransactItems": [
            {"Put": {"TableName": "t", "Item": {"pk": {"S": "a"}, "payload": {"S": big}},
                     "ConditionExpression": "attribute_not_exists(pk)"}},
            {"Put": {"TableName": "t", "ConditionExpression": "attribute_not_exists(pk)", "Item": {
                "pk": {"S": "b"}, "gsi_tenant": {"S": "t"}, "gsi_created": {"S": "c"},
                "gsi_subscription": {"S": "s"}, "gsi_due_shard": {"S": "DUE#1"}}}},
            {"Put": {"TableName": "t", "ConditionExpression": "#status = :status", "Item": {
                "pk": {"S": "c"}, "gsi_tenant": {"S": "t"}, "gsi_created": {"S": "c"}}}},
            {"Update": {"TableName": "t", "Key": {"pk": {"S": "d"}}, "UpdateExpression": "SET x = :x"}},
        ]});
        // 2 KB; 1 KB and two index entries (the overdue one lacks its sort key); an overwrite
        // of 1 KB; an update as 1 KB: twice over.
        let sized = transaction_units_by_size(body.to_string().as_bytes());
        assert_eq!(sized, Some(("t-1".to_owned(), 2.0 * (2.0 + 3.0 + 1.0 + 1.0))));
        let nested = serde_json::json!({"m": {"M": {"k": {"L": [{"S": "ab"}, {"BOOL": true}]}}}});
        assert_eq!(
            item_size(nested.as_object().unwrap()),
            1 + 3 + (1 + 1 + 3 + (1 + 2) + (1 + 1))
        );
    }

    #[test]
    fn a_transaction_is_billed_the_larger_of_its_reported_and_sized_units() {
        let c = RequestCounter::new();
        c.sized.lock().unwrap().insert("t-1".into(), 30.0);
        let reported = ConsumedCapacity::builder().capacity_units(14.0).build();
        c.record_capacity("create event", true, [&reported]);
        c.record_transaction(Some("t-1"), [&reported]);
        c.record_capacity("apply change", true, [&reported]);
        c.record_transaction(Some("unsized"), [&reported]);
        let counts = c.snapshot();
        assert_eq!(counts.write_units, 28.0);
        assert_eq!(counts.billed_write_units(), 30.0 + 14.0);
    }
}
