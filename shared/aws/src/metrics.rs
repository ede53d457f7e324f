//! The services' metrics as CloudWatch embedded metric format: one JSON line on standard
//! output per Lambda invocation, which CloudWatch Logs turns into metrics in the `Hookwise`
//! namespace, with the function as their dimension (no API call, no permission beyond the
//! logs'). Counts go out as one value each; durations as every value observed, in
//! milliseconds (EMF's `Values` and `Counts`, so CloudWatch has their percentiles).
//!
//! The format is a small JSON document (the specification: CloudWatch's "Specification:
//! Embedded metric format"), so it is written here rather than through a metrics framework.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use hookwise_core::metrics::Recorder;
use serde_json::{json, Value};

pub const NAMESPACE: &str = "Hookwise";
/// At most this many distinct values of one duration per line (EMF allows 100).
const MAX_VALUES: usize = 100;

#[derive(Debug, Default)]
struct Recorded {
    counts: BTreeMap<&'static str, u64>,
    /// Milliseconds (rounded to 0.1) → how many times.
    times: BTreeMap<&'static str, BTreeMap<u64, u64>>,
}

/// Records one function's metrics; [`Recorder::flush`] prints them.
#[derive(Debug)]
pub struct EmfMetrics {
    function: String,
    recorded: Mutex<Recorded>,
}

impl EmfMetrics {
    /// `function`: the dimension's value (`deliver`, `dead-letter`, `scheduler`).
    pub fn new(function: &str) -> Self {
        Self {
            function: function.to_owned(),
            recorded: Mutex::new(Recorded::default()),
        }
    }

    /// What was recorded since the last call, as one EMF document (`None`: nothing), and
    /// forget it.
    pub fn take_line(&self, timestamp_ms: i64) -> Option<Value> {
        let recorded = std::mem::take(&mut *self.recorded.lock().unwrap_or_else(|e| e.into_inner()));
        if recorded.counts.is_empty() && recorded.times.is_empty() {
            return None;
        }
        let mut metrics = Vec::new();
        let mut doc = serde_json::Map::new();
        doc.insert("Function".into(), json!(self.function));
        for (name, n) in &recorded.counts {
            metrics.push(json!({"Name": name, "Unit": "Count"}));
            doc.insert((*name).into(), json!(n));
        }
        for (name, seen) in &recorded.times {
            metrics.push(json!({"Name": name, "Unit": "Milliseconds"}));
            let (values, counts): (Vec<f64>, Vec<u64>) = merged(seen).into_iter().unzip();
            doc.insert((*name).into(), json!({"Values": values, "Counts": counts}));
        }
        doc.insert(
            "_aws".into(),
            json!({
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{"Namespace": NAMESPACE, "Dimensions": [["Function"]], "Metrics": metrics}],
            }),
        );
        Some(Value::Object(doc))
    }
}

/// The observed values as at most [`MAX_VALUES`] (milliseconds, count) pairs: neighbours are
/// merged into their count-weighted mean when there are more.
fn merged(seen: &BTreeMap<u64, u64>) -> Vec<(f64, u64)> {
    let tenths: Vec<(u64, u64)> = seen.iter().map(|(v, n)| (*v, *n)).collect();
    let per_bucket = tenths.len().div_ceil(MAX_VALUES).max(1);
    tenths
        .chunks(per_bucket)
        .map(|chunk| {
            let n: u64 = chunk.iter().map(|(_, n)| n).sum();
            let sum: f64 = chunk.iter().map(|(v, n)| *v as f64 * *n as f64).sum();
            ((sum / n as f64).round() / 10.0, n)
        })
        .collect()
}

impl Recorder for EmfMetrics {
    fn count(&self, name: &'static str, n: u64) {
        if n > 0 {
            *self
                .recorded
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .counts
                .entry(name)
                .or_default() += n;
        }
    }

    fn time(&self, name: &'static str, took: Duration) {
        let tenths = (took.as_secs_f64() * 10_000.0).round() as u64;
        let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        *recorded.times.entry(name).or_default().entry(tenths).or_default() += 1;
    }

    /// One line on standard output, where Lambda's log agent takes it.
    fn flush(&self) {
        if let Some(line) = self.take_line(chrono::Utc::now().timestamp_millis()) {
            println!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookwise_core::metrics::{ATTEMPT_LATENCY, DELIVERED, RETRYING};

    #[test]
    fn an_invocations_metrics_are_one_emf_document_then_nothing() {
        let m = EmfMetrics::new("deliver");
        assert_eq!(m.take_line(1), None);
        m.count(DELIVERED, 2);
        m.count(DELIVERED, 1);
        m.count(RETRYING, 0); // nothing to say: not a metric of this line
        m.time(ATTEMPT_LATENCY, Duration::from_millis(120));
        m.time(ATTEMPT_LATENCY, Duration::from_millis(120));
        m.time(ATTEMPT_LATENCY, Duration::from_micros(35_260));
        let line = m.take_line(1_700_000_000_000).unwrap();
        assert_eq!(
            line,
            json!({
                "Function": "deliver",
                "Delivered": 3,
                "AttemptLatency": {"Values": [35.3, 120.0], "Counts": [1, 2]},
                "_aws": {
                    "Timestamp": 1_700_000_000_000i64,
                    "CloudWatchMetrics": [{
                        "Namespace": "Hookwise",
                        "Dimensions": [["Function"]],
                        "Metrics": [
                            {"Name": "Delivered", "Unit": "Count"},
                            {"Name": "AttemptLatency", "Unit": "Milliseconds"},
                        ],
                    }],
                },
            })
        );
        assert_eq!(m.take_line(2), None, "taken");
    }

    #[test]
    fn many_distinct_durations_fit_emfs_hundred_values_and_keep_their_count() {
        let m = EmfMetrics::new("deliver");
        for ms in 0..1000 {
            m.time(ATTEMPT_LATENCY, Duration::from_millis(ms));
        }
        let line = m.take_line(1).unwrap();
        let values = line["AttemptLatency"]["Values"].as_array().unwrap();
        let counts: u64 = line["AttemptLatency"]["Counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum();
        assert!(values.len() <= MAX_VALUES, "{}", values.len());
        assert_eq!(counts, 1000);
        assert_eq!(values[0], json!(4.5), "the mean of 0..=9 ms");
    }
}
