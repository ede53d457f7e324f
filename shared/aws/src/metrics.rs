//! The services' metrics as CloudWatch embedded metric format: one JSON line on standard
//! output per Lambda invocation, which CloudWatch Logs turns into metrics in the `Hookwise`
//! namespace, with the deployment (`Service`, its stack's name) and the function as their
//! dimensions (no API call, no permission beyond the logs'). Counts go out as one value each; durations as the values observed, in
//! milliseconds (an array of at most 100, so CloudWatch has their percentiles).
//!
//! The line carries the function's own application log level (`AWS_LAMBDA_LOG_LEVEL`, which
//! the template sets from `LogLevel`) as its `level`: Lambda's log-level filter takes a JSON
//! line without one for INFO, and would drop every metric at `warn` or `error`.
//!
//! The format is a small JSON document (the specification: CloudWatch's "Specification:
//! Embedded metric format"), so it is written here rather than through a metrics framework.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use hookwise_core::metrics::Recorder;
use serde_json::{json, Value};

pub const NAMESPACE: &str = "Hookwise";
/// At most this many values of one metric per line (EMF's limit).
const MAX_VALUES: usize = 100;

#[derive(Debug, Default)]
struct Recorded {
    counts: BTreeMap<&'static str, u64>,
    /// Milliseconds.
    times: BTreeMap<&'static str, Vec<f64>>,
}

/// Records one function's metrics; [`Recorder::flush`] prints them.
#[derive(Debug)]
pub struct EmfMetrics {
    service: String,
    function: String,
    level: String,
    recorded: Mutex<Recorded>,
}

impl EmfMetrics {
    /// The dimensions' values: `service`, the deployment's name (`FunctionConfig::service`),
    /// and `function` (`deliver`, `dead-letter`, `scheduler`); the line's level is the
    /// function's (`AWS_LAMBDA_LOG_LEVEL`, else INFO).
    pub fn new(service: &str, function: &str) -> Self {
        let level = std::env::var("AWS_LAMBDA_LOG_LEVEL").unwrap_or_else(|_| "INFO".into());
        Self::at_level(service, function, &level)
    }

    fn at_level(service: &str, function: &str, level: &str) -> Self {
        Self {
            service: service.to_owned(),
            function: function.to_owned(),
            level: level.to_owned(),
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
        doc.insert("level".into(), json!(self.level));
        doc.insert("Service".into(), json!(self.service));
        doc.insert("Function".into(), json!(self.function));
        for (name, n) in &recorded.counts {
            metrics.push(json!({"Name": name, "Unit": "Count"}));
            doc.insert((*name).into(), json!(n));
        }
        for (name, seen) in recorded.times {
            metrics.push(json!({"Name": name, "Unit": "Milliseconds"}));
            doc.insert(name.into(), json!(at_most_100(seen)));
        }
        doc.insert(
            "_aws".into(),
            json!({
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{"Namespace": NAMESPACE, "Dimensions": [["Service", "Function"]], "Metrics": metrics}],
            }),
        );
        Some(Value::Object(doc))
    }
}

/// The values, or, past [`MAX_VALUES`], as many evenly spaced quantiles of them (each
/// standing for the same share, so the percentiles hold).
fn at_most_100(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    if values.len() <= MAX_VALUES {
        return values;
    }
    (0..MAX_VALUES).map(|i| values[i * values.len() / MAX_VALUES]).collect()
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
        let ms = (took.as_secs_f64() * 10_000.0).round() / 10.0;
        let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        recorded.times.entry(name).or_default().push(ms);
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
        let m = EmfMetrics::at_level("hookwise-prod", "deliver", "WARN");
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
                "level": "WARN",
                "Service": "hookwise-prod",
                "Function": "deliver",
                "Delivered": 3,
                "AttemptLatency": [35.3, 120.0, 120.0],
                "_aws": {
                    "Timestamp": 1_700_000_000_000i64,
                    "CloudWatchMetrics": [{
                        "Namespace": "Hookwise",
                        "Dimensions": [["Service", "Function"]],
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
    fn many_durations_go_out_as_a_hundred_quantiles() {
        let m = EmfMetrics::at_level("hookwise-prod", "deliver", "INFO");
        for ms in 0..1000 {
            m.time(ATTEMPT_LATENCY, Duration::from_millis(999 - ms));
        }
        let line = m.take_line(1).unwrap();
        let values: Vec<f64> = line["AttemptLatency"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(values.len(), MAX_VALUES);
        assert_eq!((values[0], values[50], values[99]), (0.0, 500.0, 990.0));
    }
}
