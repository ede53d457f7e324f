//! What the benchmarks share (`benches/delivery.rs`, `benches/latency.rs`, `benches/growth.rs`):
//! settings from the environment, a process's memory from `/proc`, bounded and open-loop load
//! on the API, a receiver that times each event from its acceptance, percentiles, round trips,
//! and a data dir's copy.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::http::StatusCode;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::Api;

/// Events in one batch request (the API's largest).
pub const BATCH: usize = 100;
/// How long the idle process is left alone before its memory is read.
pub const IDLE: Duration = Duration::from_secs(2);
/// Sent first at the open-loop rate and not counted: connections, caches and the SQLite
/// page cache warm up, and so do the emulators (DynamoDB Local's JVM takes some seconds to
/// reach its pace: in a 15 s run the AWS path delivered 17, 54, 110, 166 and 225 events in
/// its first seconds at 200 a second, then caught up).
pub const WARM_UP: Duration = Duration::from_secs(10);
/// Past an open loop's last send, how long the deliveries still due are waited for.
pub const DRAIN: Duration = Duration::from_secs(60);

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A `/proc/<pid>/status` figure in MB (`VmRSS`, `VmHWM`).
pub fn proc_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    kb / 1024.0
}

/// Run `n` calls of `make(i)` with at most `bound` in flight.
pub async fn run_bounded<F, Fut>(n: usize, bound: usize, make: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(bound));
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let permit = permits.clone().acquire_owned().await.expect("semaphore open");
        let fut = make(i);
        handles.push(tokio::spawn(async move {
            fut.await;
            drop(permit);
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
}

/// Latencies in milliseconds, sorted: the nearest-rank percentile.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Round trips of `call`, one at a time, after `warm_up` untimed ones: milliseconds, sorted.
pub async fn round_trips<F, Fut>(warm_up: usize, n: usize, call: F) -> Vec<f64>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..warm_up {
        call().await;
    }
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        call().await;
        took.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    took.sort_by(f64::total_cmp);
    took
}

/// Copy a data dir that no process has open (its files and its outbox), leaving out the
/// WAL's index (`-shm`), which SQLite rebuilds from the WAL on opening.
pub fn copy_data_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("the copy's dir");
    for entry in std::fs::read_dir(from).expect("the data dir").flatten() {
        let (path, name) = (entry.path(), entry.file_name());
        if name.to_string_lossy().ends_with("-shm") {
            continue;
        }
        if path.is_dir() {
            copy_data_dir(&path, &to.join(&name));
        } else {
            std::fs::copy(&path, to.join(&name)).expect("copy a data dir's file");
        }
    }
}

/// A receiver on 127.0.0.1 that answers 200 at once and notes, for the events of the current
/// run (`{"run": RUN, "i": I}` payloads), each one's first arrival: its latency from the
/// event's acceptance (the envelope's `timestamp`, Hookwise's clock, to the millisecond) to
/// its arrival (this machine's clock), and how many POSTs arrived.
#[derive(Clone)]
pub struct Arrivals {
    run: Arc<AtomicU64>,
    seen: Arc<Mutex<HashMap<u64, f64>>>,
    posts: Arc<AtomicU64>,
    pub url: String,
}

impl Arrivals {
    pub async fn start() -> Self {
        let (run, seen, posts) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(Mutex::new(HashMap::new())),
            Arc::new(AtomicU64::new(0)),
        );
        let (r, s, p) = (run.clone(), seen.clone(), posts.clone());
        let app = axum::Router::new().fallback(move |body: Bytes| {
            let (r, s, p) = (r.clone(), s.clone(), p.clone());
            async move {
                let arrived = SystemTime::now();
                let envelope: Value = serde_json::from_slice(&body).unwrap_or_default();
                let accepted = envelope["timestamp"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                let this_run = envelope["data"]["run"].as_u64() == Some(r.load(Ordering::SeqCst));
                if let (true, Some(accepted), Some(i)) = (this_run, accepted, envelope["data"]["i"].as_u64()) {
                    let ms = arrived
                        .duration_since(SystemTime::from(accepted))
                        .map(|d| d.as_secs_f64() * 1000.0)
                        .unwrap_or(0.0);
                    s.lock().unwrap().entry(i).or_insert(ms);
                    p.fetch_add(1, Ordering::SeqCst);
                }
                StatusCode::OK
            }
        });
        let addr = crate::serve_on_loopback(app).await;
        Self {
            run,
            seen,
            posts,
            url: format!("http://{addr}/hook"),
        }
    }

    /// Forget what arrived, and count only run `run`'s events from now on.
    pub fn begin(&self, run: u64) {
        self.run.store(run, Ordering::SeqCst);
        self.seen.lock().unwrap().clear();
        self.posts.store(0, Ordering::SeqCst);
    }

    /// POSTs of the current run so far (a duplicate counts again).
    pub fn posts(&self) -> usize {
        self.posts.load(Ordering::SeqCst) as usize
    }

    /// Wait until `n` POSTs of the current run have arrived; fail after `within`.
    pub async fn wait_posts(&self, n: usize, within: Duration) {
        crate::wait_for_count(n, within, Duration::from_millis(20), || self.posts()).await;
    }

    /// How many of events `from..to` of the current run have arrived.
    fn seen_between(&self, from: u64, to: u64) -> usize {
        self.seen
            .lock()
            .unwrap()
            .keys()
            .filter(|i| (from..to).contains(*i))
            .count()
    }

    /// The latencies of events `from..to` of the current run that arrived, sorted.
    fn latencies(&self, from: u64, to: u64) -> Vec<f64> {
        let seen = self.seen.lock().unwrap();
        let mut l: Vec<f64> = (from..to).filter_map(|i| seen.get(&i).copied()).collect();
        l.sort_by(f64::total_cmp);
        l
    }

    /// The longest latency among each `per` consecutive events of `from..to` that arrived
    /// (each second's, at `per` events a second), in sending order.
    fn slowest_by_group(&self, from: u64, to: u64, per: u64) -> Vec<f64> {
        let seen = self.seen.lock().unwrap();
        (from..to)
            .step_by(per.max(1) as usize)
            .map(|start| {
                (start..(start + per).min(to))
                    .filter_map(|i| seen.get(&i).copied())
                    .fold(0.0, f64::max)
            })
            .collect()
    }
}

/// Events `0..n` of run `run`, `per_request` to a request (1: `POST /v1/events`; more: the
/// batch), `concurrency` requests at a time; each must be accepted.
pub async fn ingest(api: &Api, run: u64, n: usize, per_request: usize, concurrency: usize) {
    run_bounded(n.div_ceil(per_request), concurrency, |r| {
        let api = api.clone();
        let events: Vec<Value> = (r * per_request..n.min((r + 1) * per_request))
            .map(|i| json!({"type": "bench.tick", "payload": {"run": run, "i": i}}))
            .collect();
        async move {
            if per_request == 1 {
                let event = events.into_iter().next().expect("one event");
                let (status, body) = api.post("/v1/events", event).await;
                assert_eq!(status, 202, "{body}");
            } else {
                let (status, body) = api.post("/v1/events/batch", json!({"events": events})).await;
                assert_eq!(status, 202, "{body}");
                let refused = body["results"].as_array().expect("results");
                assert!(refused.iter().all(|r| r.get("id").is_some()), "{body}");
            }
        }
    })
    .await;
}

/// One open-loop run's figures, of the events after the warm-up.
#[derive(Debug, Clone)]
pub struct OpenLoop {
    pub rate: u32,
    pub sent: usize,
    /// Answered other than 202 (a 503 when a store or queue call timed out).
    pub refused: usize,
    pub delivered: usize,
    /// How late the sender itself was at its worst (the offered load held if this is small).
    pub send_lag_max_ms: f64,
    /// Sorted, in milliseconds.
    pub latencies: Vec<f64>,
    /// The longest latency of the events sent in each second, in order: where the tail is
    /// (a start-up transient, or pauses all through).
    pub slowest_by_second: Vec<f64>,
}

impl OpenLoop {
    pub fn json(&self) -> Value {
        let l = &self.latencies;
        json!({
            "rate": self.rate,
            "sent": self.sent,
            "refused": self.refused,
            "delivered": self.delivered,
            "send_lag_max_ms": self.send_lag_max_ms,
            "p50_ms": percentile(l, 50.0),
            "p95_ms": percentile(l, 95.0),
            "p99_ms": percentile(l, 99.0),
            "max_ms": l.last().copied().unwrap_or(f64::NAN),
            "slowest_by_second_ms": self.slowest_by_second.iter().map(|ms| ms.round()).collect::<Vec<_>>(),
        })
    }
}

/// Send run `run`'s events at `rate` a second for `warm_up` (not counted) and then `seconds`,
/// each at its own instant (one per `POST /v1/events`, whether or not the ones before it were
/// answered), and wait up to `drain` past the last send for their deliveries. `during` is
/// called once the last event is sent, while the load is still on (to read the memory).
pub async fn open_loop(
    api: &Api,
    arrivals: &Arrivals,
    run: u64,
    rate: u32,
    (warm_up, seconds): (Duration, Duration),
    drain: Duration,
    during: impl FnOnce(),
) -> OpenLoop {
    arrivals.begin(run);
    let warm_up = (rate as f64 * warm_up.as_secs_f64()) as usize;
    let counted = (rate as f64 * seconds.as_secs_f64()) as usize;
    let total = warm_up + counted;
    let gap = Duration::from_secs_f64(1.0 / rate as f64);
    let refused = Arc::new(AtomicU64::new(0));
    let mut lag_max = Duration::ZERO;
    let mut sends = Vec::with_capacity(total);
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    for i in 0..total {
        let due = start + gap * i as u32;
        tokio::time::sleep_until(due).await;
        lag_max = lag_max.max(due.elapsed());
        let (api, refused) = (api.clone(), refused.clone());
        sends.push(tokio::spawn(async move {
            let (status, _) = api
                .post(
                    "/v1/events",
                    json!({"type": "bench.tick", "payload": {"run": run, "i": i}}),
                )
                .await;
            if status != 202 && i >= warm_up {
                refused.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    during();
    for s in sends {
        s.await.expect("a send");
    }
    let refused = refused.load(Ordering::SeqCst) as usize;
    let waited = Instant::now();
    let (from, to) = (warm_up as u64, total as u64);
    while arrivals.seen_between(from, to) < counted - refused && waited.elapsed() < drain {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let latencies = arrivals.latencies(from, to);
    OpenLoop {
        rate,
        sent: counted,
        refused,
        delivered: latencies.len(),
        send_lag_max_ms: lag_max.as_secs_f64() * 1000.0,
        slowest_by_second: arrivals.slowest_by_group(from, to, rate as u64),
        latencies,
    }
}
