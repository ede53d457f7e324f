//! Counting what Hookwise asks of AWS: every HTTP request the SDK sends (retries included,
//! as AWS bills them), by service and operation, plus the DynamoDB capacity units the store
//! was charged. A test divides them by the events delivered to get the cost per event.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::ConsumedCapacity;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

/// What was counted so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestCounts {
    /// Requests by `"{service}.{operation}"`, e.g. `"dynamodb.TransactWriteItems"`.
    pub requests: BTreeMap<String, u64>,
    /// DynamoDB read and write capacity units consumed (what on-demand bills as request units).
    pub read_units: f64,
    pub write_units: f64,
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
}

/// An SDK interceptor that counts requests; clone it into every client
/// ([`AwsClients::new`](crate::AwsClients::new)) and into the store
/// ([`DynamoStore::with_counter`](crate::DynamoStore::with_counter)) for capacity units.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    counts: Arc<Mutex<RequestCounts>>,
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
        let units: f64 = consumed.into_iter().filter_map(ConsumedCapacity::capacity_units).sum();
        let mut c = self.lock();
        if write {
            c.write_units += units;
        } else {
            c.read_units += units;
        }
        *c.units_by_call
            .entry(format!("{}: {what}", if write { "write" } else { "read" }))
            .or_default() += units;
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "HookwiseRequestCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        match cfg.load::<Metadata>() {
            Some(m) => self.record_request(m.service(), m.name()),
            None => self.record_request("unknown", "unknown"),
        }
        Ok(())
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
}
