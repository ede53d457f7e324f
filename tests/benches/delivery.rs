//! Delivery throughput: N events through a real `hookwise dev` to a local receiver, beside a
//! bare reqwest POST loop at the same concurrency to the same receiver, in one run.
//!
//! `scripts/bench-delivery.sh` builds the release binary and runs this; N and the
//! concurrency come from HOOKWISE_BENCH_EVENTS (10000) and HOOKWISE_BENCH_CONCURRENCY (32).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::run_bounded;
use hookwise_tests::{Dev, Receiver, TempDir};
use serde_json::json;

mod futures_lite {
    use std::future::Future;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    /// Run `n` calls of `make(i)` with at most `bound` in flight.
    pub async fn run_bounded<F, Fut>(n: usize, bound: usize, make: F)
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
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
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let n = env_usize("HOOKWISE_BENCH_EVENTS", 10_000);
    let concurrency = env_usize("HOOKWISE_BENCH_CONCURRENCY", 32);
    let body = serde_json::to_vec(
        &json!({"id": "evt_x", "type": "bench.tick", "timestamp": "2026-01-01T00:00:00Z", "data": {"i": 0}}),
    )
    .unwrap();

    // Baseline: the same receiver, bare POSTs, one pooled client.
    let baseline_rx = Receiver::start(0).await;
    let client = reqwest::Client::new();
    let url = Arc::new(baseline_rx.url("/bare"));
    let start = Instant::now();
    run_bounded(n, concurrency, |_| {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        async move {
            let resp = client
                .post(url.as_str())
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("POST");
            assert!(resp.status().is_success());
        }
    })
    .await;
    let bare = start.elapsed();

    // Hookwise, once per SQLite `synchronous` setting: FULL (the default) and NORMAL, so the
    // cost of a commit that survives a power cut is measured in the same run.
    let full = through_hookwise(n, concurrency, "full").await;
    let normal = through_hookwise(n, concurrency, "normal").await;

    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    println!("events: {n}, concurrency: {concurrency}");
    println!(
        "bare reqwest POST loop:        {:>9.0} req/s  ({:.2} s)",
        rate(bare),
        bare.as_secs_f64()
    );
    for (label, (ingested, delivered)) in [("synchronous=FULL", full), ("synchronous=NORMAL", normal)] {
        println!("hookwise dev, {label}:");
        println!(
            "  ingest (API):                {:>9.0} ev/s   ({:.2} s)",
            rate(ingested),
            ingested.as_secs_f64()
        );
        println!(
            "  end to end:                  {:>9.0} deliveries/s ({:.2} s, ingest to last delivery)",
            rate(delivered),
            delivered.as_secs_f64()
        );
        println!("  ratio hookwise / bare:       {:>9.3}", rate(delivered) / rate(bare));
    }
    println!("FULL / NORMAL end to end:      {:>9.3}", rate(full.1) / rate(normal.1));
}

/// Ingest `n` events through the API of a fresh `hookwise dev`; (time to ingest them all,
/// time until the receiver has had every delivery).
async fn through_hookwise(n: usize, concurrency: usize, synchronous: &str) -> (Duration, Duration) {
    let dir = TempDir::new("bench");
    let concurrency_arg = concurrency.to_string();
    let dev = Dev::start(
        &dir.0,
        &["--concurrency", &concurrency_arg, "--synchronous", synchronous],
    );
    let api = dev.api();
    let rx = Receiver::start(0).await;
    api.subscribe(json!({"url": rx.url("/hook")})).await;
    let start = Instant::now();
    run_bounded(n, concurrency, |i| {
        let api = api.clone();
        async move {
            let (status, _) = api
                .post("/v1/events", json!({"type": "bench.tick", "payload": {"i": i}}))
                .await;
            assert_eq!(status, 202);
        }
    })
    .await;
    let ingested = start.elapsed();
    rx.wait_count(n, Duration::from_secs(600)).await;
    (ingested, start.elapsed())
}
