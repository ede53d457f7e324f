//! Delivery throughput and memory: N events through a real `hookwise dev` (the release
//! binary, SQLite with its default `synchronous=FULL`) to a local receiver, beside a bare
//! reqwest POST loop at the same concurrency to the same kind of receiver, in one run.
//! Events go in one per request and then in batches of 100 (`POST /v1/events/batch`); each
//! run is timed from the first ingest request to the receiver's last delivery. The process's
//! resident memory is read from `/proc` when idle (started, one subscription, no traffic) and
//! at its peak (`VmHWM`) after the run (the highest of all rounds).
//!
//! Each run through Hookwise is paired with a bare loop run just before it, and the whole is
//! repeated (HOOKWISE_BENCH_ROUNDS, 3): each mode's figures are its median round's, by ratio.
//!
//! `scripts/bench-delivery.sh` builds the release binary and runs this; N and the
//! concurrency come from HOOKWISE_BENCH_EVENTS (10000) and HOOKWISE_BENCH_CONCURRENCY (32).
//! With HOOKWISE_BENCH_JSON=FILE the figures are also written there as JSON, for
//! `scripts/bench.sh`'s table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hookwise_tests::bench::{env_usize, ingest, proc_mb, run_bounded, BATCH, IDLE};
use hookwise_tests::{Dev, Receiver, TempDir};
use serde_json::{json, Value};

/// One run through `hookwise dev`.
struct Run {
    ingested: Duration,
    delivered: Duration,
    idle_mb: f64,
    peak_mb: f64,
}

/// A run through `hookwise dev` and the bare loop run just before it.
struct Paired {
    bare: Duration,
    run: Run,
}

impl Paired {
    /// Hookwise's end-to-end rate over the bare loop's (the same count both ways).
    fn ratio(&self) -> f64 {
        self.bare.as_secs_f64() / self.run.delivered.as_secs_f64()
    }
}

/// The round whose ratio is the median (the upper one of an even count), with the highest
/// peak of memory any round reached.
fn median(mut rounds: Vec<Paired>) -> Paired {
    let peak_mb = rounds.iter().map(|r| r.run.peak_mb).fold(0.0, f64::max);
    rounds.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
    let middle = rounds.len() / 2;
    let mut median = rounds.swap_remove(middle);
    median.run.peak_mb = peak_mb;
    median
}

#[tokio::main]
async fn main() {
    let n = env_usize("HOOKWISE_BENCH_EVENTS", 10_000);
    let concurrency = env_usize("HOOKWISE_BENCH_CONCURRENCY", 32);
    let rounds = env_usize("HOOKWISE_BENCH_ROUNDS", 3).max(1);
    // Baseline: the same kind of receiver, bare POSTs, one pooled client. It runs again before
    // each run through Hookwise, which is measured against the run just before it: the
    // machine's speed drifts over a few seconds, and a pair only a second apart shares it.
    let bare = Bare::start().await;
    let (mut single, mut batched) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        single.push(Paired {
            bare: bare.run(n, concurrency).await,
            run: through_hookwise(n, concurrency, 1).await,
        });
        batched.push(Paired {
            bare: bare.run(n, concurrency).await,
            run: through_hookwise(n, concurrency, BATCH).await,
        });
        eprintln!(
            "round {round} of {rounds}: ratios {:.3} one per request, {:.3} batched",
            single[round - 1].ratio(),
            batched[round - 1].ratio()
        );
    }
    let (single, batched) = (median(single), median(batched));

    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    println!("events: {n}, concurrency: {concurrency}, synchronous=FULL, median of {rounds} rounds");
    for (label, paired) in [("1 event per request", &single), ("100 events per request", &batched)] {
        let run = &paired.run;
        println!("hookwise dev, {label}:");
        println!(
            "  bare reqwest POST loop:         {:>7.0} req/s        ({:.2} s, just before)",
            rate(paired.bare),
            paired.bare.as_secs_f64()
        );
        println!(
            "  ingest (API):                   {:>7.0} events/s     ({:.2} s)",
            rate(run.ingested),
            run.ingested.as_secs_f64()
        );
        println!(
            "  end to end:                     {:>7.0} deliveries/s ({:.2} s, first ingest to last delivery)",
            rate(run.delivered),
            run.delivered.as_secs_f64()
        );
        println!("  ratio hookwise / bare:          {:>7.3}", paired.ratio());
        println!("  memory: idle {:.1} MB, peak {:.1} MB", run.idle_mb, run.peak_mb);
    }
    if let Ok(path) = std::env::var("HOOKWISE_BENCH_JSON") {
        let figures = |paired: &Paired| {
            let run = &paired.run;
            json!({
                "bare_per_second": rate(paired.bare),
                "ingest_per_second": rate(run.ingested),
                "deliveries_per_second": rate(run.delivered),
                "ratio_to_bare": paired.ratio(),
                "idle_rss_mb": run.idle_mb,
                "peak_rss_mb": run.peak_mb,
            })
        };
        let out: Value = json!({
            "events": n,
            "concurrency": concurrency,
            "rounds": rounds,
            "single": figures(&single),
            "batch": figures(&batched),
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&out).unwrap()).expect("write the JSON figures");
    }
}

/// The baseline: bare POSTs of one small JSON body to a receiver of its own.
struct Bare {
    _receiver: Receiver,
    client: reqwest::Client,
    url: Arc<String>,
    body: Vec<u8>,
}

impl Bare {
    async fn start() -> Self {
        let receiver = Receiver::start(0).await;
        let url = Arc::new(receiver.url("/bare"));
        let body = serde_json::to_vec(
            &json!({"id": "evt_x", "type": "bench.tick", "timestamp": "2026-01-01T00:00:00Z", "data": {"i": 0}}),
        )
        .unwrap();
        Self {
            _receiver: receiver,
            client: reqwest::Client::new(),
            url,
            body,
        }
    }

    /// `n` POSTs, `concurrency` at a time: how long they took.
    async fn run(&self, n: usize, concurrency: usize) -> Duration {
        let start = Instant::now();
        run_bounded(n, concurrency, |_| {
            let (client, url, body) = (self.client.clone(), self.url.clone(), self.body.clone());
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
        start.elapsed()
    }
}

/// Ingest `n` events through the API of a fresh `hookwise dev`, `per_request` at a time, and
/// wait until the receiver has had every delivery.
async fn through_hookwise(n: usize, concurrency: usize, per_request: usize) -> Run {
    let dir = TempDir::new("bench");
    let concurrency_arg = concurrency.to_string();
    let dev = Dev::start(&dir.0, &["--concurrency", &concurrency_arg]);
    let api = dev.api();
    let rx = Receiver::start(0).await;
    api.subscribe(json!({"url": rx.url("/hook")})).await;
    tokio::time::sleep(IDLE).await;
    let idle_mb = proc_mb(dev.pid(), "VmRSS");
    let start = Instant::now();
    // Run 0: the receiver here counts every POST, whatever the run.
    ingest(&api, 0, n, per_request, concurrency).await;
    let ingested = start.elapsed();
    rx.wait_count(n, Duration::from_secs(600)).await;
    let delivered = start.elapsed();
    Run {
        ingested,
        delivered,
        idle_mb,
        peak_mb: proc_mb(dev.pid(), "VmHWM"),
    }
}
