//! Growth: the same figures on a data dir with an empty history and on one holding N
//! deliveries (1 000 000 by `scripts/bench-growth.sh`), side by side in one run, and each
//! figure's ratio seeded / empty (goal: within 1.5× of empty).
//!
//! Both data dirs come from `functions/cli/examples/seed_history.rs` (the empty one with no
//! deliveries), so they hold the same tenant and subscriptions, made the same way; each run
//! works on a copy (`HOOKWISE_GROWTH_EMPTY`, `HOOKWISE_GROWTH_SEEDED`: the seeded dirs). Both
//! `hookwise dev` (release binary, `synchronous=FULL`) run at once, and the bench takes them in
//! turn, each phase on one then the other:
//!
//! - throughput as `benches/delivery.rs` measures it: HOOKWISE_BENCH_EVENTS (10 000) events
//!   at HOOKWISE_BENCH_CONCURRENCY (32) requests at a time, one per request and then 100 per
//!   request, from the first ingest request to the last delivery; HOOKWISE_BENCH_ROUNDS (3)
//!   rounds, the median round by ratio;
//! - reads, one request at a time, 10 untimed then HOOKWISE_GROWTH_REQUESTS (1000) timed, in
//!   5 rounds the two stores take in turn: `GET /v1/deliveries` (the first page), the same
//!   filtered by the seeded subscription, by `status=dead`, and by both (the dashboard's
//!   filters), and `GET /v1/subscriptions` (each subscription's counts of its latest
//!   deliveries); p50 and p99. They come after the
//!   throughput runs and after 60 deliveries made dead on each store alike, so the empty
//!   store has full pages to answer too, its `status=dead` ones included;
//! - latency as `benches/latency.rs` measures it: an open-loop load at HOOKWISE_GROWTH_RATE
//!   (1000) events a second for HOOKWISE_GROWTH_SECONDS (30) after a 10 s warm-up, from the
//!   event's acceptance to its arrival; p50, p95, p99;
//! - memory: `VmRSS` idle (started, before any request), `VmRSS` under the open-loop load
//!   (when its last event is sent), `VmHWM` at the end.
//!
//! The seeded subscription is pointed at the bench's receiver (`PATCH`) before any load, and
//! every event goes to it. With HOOKWISE_BENCH_JSON=FILE the figures are also written there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hookwise_tests::bench::{
    copy_data_dir, env_usize, ingest, open_loop, percentile, proc_mb, round_trips, Arrivals, OpenLoop, BATCH, DRAIN,
    IDLE, WARM_UP,
};
use hookwise_tests::{Api, Dev, Receiver, TempDir};
use serde_json::{json, Map, Value};

/// Untimed requests before a listing's first round of timed ones.
const READ_WARM_UP: usize = 10;
/// The reads are timed in rounds, the stores taking turns, so a noisy moment of the machine
/// falls on both alike rather than on one store's whole series (a p99 of a few hundred
/// sub-millisecond reads is its few slowest).
const READ_ROUNDS: usize = 5;

/// The listings read, by figure: the first page of deliveries, the same filtered by the
/// seeded subscription, by `status=dead` and by both (the dashboard's filters), and the
/// subscriptions with each one's counts of its latest deliveries.
fn listings(subscription: &str) -> [(&'static str, String); 5] {
    [
        ("deliveries", "/v1/deliveries".to_owned()),
        (
            "deliveries_by_subscription",
            format!("/v1/deliveries?subscription_id={subscription}"),
        ),
        ("deliveries_dead", "/v1/deliveries?status=dead".to_owned()),
        (
            "deliveries_by_subscription_dead",
            format!("/v1/deliveries?subscription_id={subscription}&status=dead"),
        ),
        ("subscriptions", "/v1/subscriptions".to_owned()),
    ]
}
/// Dead deliveries made on each store before the reads: more than a page.
const DEAD: usize = 60;
/// The goal: each figure within this factor of the empty store's.
const GOAL: f64 = 1.5;

/// One `hookwise dev` on a copy of a seeded data dir, its seeded subscription pointed at a
/// receiver of its own.
struct Backend {
    label: &'static str,
    /// What the seed recorded (`seed-info.json`).
    seed: Value,
    db_mb: f64,
    dev: Dev,
    api: Api,
    arrivals: Arrivals,
    subscription: String,
    figures: Map<String, Value>,
    _dir: TempDir,
}

impl Backend {
    async fn start(label: &'static str, seeded: &Path, concurrency: usize) -> Self {
        let info = std::fs::read(seeded.join("seed-info.json"))
            .unwrap_or_else(|e| panic!("{}/seed-info.json: {e} (seed it with seed_history)", seeded.display()));
        let seed: Value = serde_json::from_slice(&info).expect("seed-info.json");
        let dir = TempDir::new(&format!("growth-{label}"));
        let copied = Instant::now();
        copy_data_dir(seeded, &dir.0);
        let db_mb = ["hookwise.db", "hookwise.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(dir.0.join(f)).ok())
            .map(|m| m.len() as f64 / 1e6)
            .sum();
        eprintln!(
            "{label}: copied {db_mb:.0} MB in {:.1} s",
            copied.elapsed().as_secs_f64()
        );
        let dev = Dev::start(&dir.0, &["--concurrency", &concurrency.to_string()]);
        let api = dev.api();
        let arrivals = Arrivals::start().await;
        let subscription = seed["subscription"]
            .as_str()
            .expect("the seeded subscription")
            .to_owned();
        let (status, body) = api
            .call(
                reqwest::Method::PATCH,
                &format!("/v1/subscriptions/{subscription}"),
                Some(json!({"url": arrivals.url})),
                &[],
            )
            .await;
        assert_eq!(status, 200, "{body}");
        Self {
            label,
            seed,
            db_mb,
            dev,
            api,
            arrivals,
            subscription,
            figures: Map::new(),
            _dir: dir,
        }
    }

    fn set(&mut self, key: &str, value: f64) {
        self.figures.insert(key.to_owned(), json!(value));
    }

    fn get(&self, key: &str) -> f64 {
        self.figures[key].as_f64().unwrap_or(f64::NAN)
    }

    /// Round trips of `GET path`, one request at a time, after `warm_up` untimed ones.
    async fn reads(&self, path: &str, warm_up: usize, n: usize) -> Vec<f64> {
        let api = &self.api;
        round_trips(warm_up, n, || async move {
            let (status, body) = api.get(path).await;
            assert_eq!(status, 200, "GET {path}: {body}");
        })
        .await
    }

    /// `n` dead deliveries of the seeded subscription, made alike on both stores, so that
    /// each `status=dead` listing compares a full page with a full page (the empty store has
    /// no dead delivery of its own): the subscription points at a receiver that answers 429,
    /// with no retries, `n` events go out in one batch and each delivery is waited for until
    /// dead; then the subscription gets its URL and policy back, and one event of `run` is
    /// delivered to end the endpoint's run of failures. A 429 never opens the circuit
    /// breaker (the endpoint is up), where a closed port's failures would, and it would then
    /// hold the latency run's first attempts.
    async fn make_dead(&self, n: usize, run: u64) {
        let throttling = Receiver::start(0).await;
        throttling.answer_with(429);
        let path = format!("/v1/subscriptions/{}", self.subscription);
        let (status, before) = self.api.get(&path).await;
        assert_eq!(status, 200, "{before}");
        let patch = |body: Value| async {
            let (status, answer) = self.api.call(reqwest::Method::PATCH, &path, Some(body), &[]).await;
            assert_eq!(status, 200, "{answer}");
            answer
        };
        patch(json!({"url": throttling.url("/slow-down"), "retry_policy": {"schedule_seconds": []}})).await;
        let events: Vec<Value> = (0..n)
            .map(|i| json!({"type": "bench.dead", "payload": {"i": i}}))
            .collect();
        let (status, body) = self.api.post("/v1/events/batch", json!({"events": events})).await;
        assert_eq!(status, 202, "{body}");
        let ids: Vec<String> = body["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| r["deliveries"][0]["id"].as_str().expect("a delivery").to_owned())
            .collect();
        for id in &ids {
            self.api.wait_status(id, "dead", Duration::from_secs(60)).await;
        }
        let after = patch(json!({"url": before["url"], "retry_policy": before["retry_policy"]})).await;
        assert_eq!(
            (&after["url"], &after["retry_policy"]),
            (&before["url"], &before["retry_policy"]),
            "the subscription as it was"
        );
        self.throughput(run, 1, 1, 1).await;
        // The dead-letter handling of the `n` (their notices) runs in the background.
        tokio::time::sleep(IDLE).await;
    }

    /// Events `0..n` of `run` through the API, `per_request` at a time, and their deliveries:
    /// (ingest time, time to the last delivery).
    async fn throughput(&self, run: u64, n: usize, per_request: usize, concurrency: usize) -> (Duration, Duration) {
        self.arrivals.begin(run);
        let start = Instant::now();
        ingest(&self.api, run, n, per_request, concurrency).await;
        let ingested = start.elapsed();
        self.arrivals.wait_posts(n, Duration::from_secs(600)).await;
        (ingested, start.elapsed())
    }
}

/// A figure, as printed and compared.
struct Figure {
    key: &'static str,
    label: &'static str,
    unit: &'static str,
    /// A rate: more is better (its ratio's goal is ≥ 1 / GOAL).
    rate: bool,
    /// Held to the goal (memory is reported only).
    goal: bool,
}

const fn figure(key: &'static str, label: &'static str, unit: &'static str, rate: bool, goal: bool) -> Figure {
    Figure {
        key,
        label,
        unit,
        rate,
        goal,
    }
}

const FIGURES: &[Figure] = &[
    figure(
        "single_per_second",
        "end to end, 1 event/request",
        "deliveries/s",
        true,
        true,
    ),
    figure(
        "batch_per_second",
        "end to end, 100 events/request",
        "deliveries/s",
        true,
        true,
    ),
    figure(
        "single_ingest_per_second",
        "ingest, 1 event/request",
        "events/s",
        true,
        true,
    ),
    figure(
        "batch_ingest_per_second",
        "ingest, 100 events/request",
        "events/s",
        true,
        true,
    ),
    figure("latency_p50_ms", "latency p50", "ms", false, true),
    figure("latency_p95_ms", "latency p95", "ms", false, true),
    figure("latency_p99_ms", "latency p99", "ms", false, true),
    figure("deliveries_p99_ms", "GET /v1/deliveries p99", "ms", false, true),
    figure(
        "deliveries_by_subscription_p99_ms",
        "  ?subscription_id= p99",
        "ms",
        false,
        true,
    ),
    figure("deliveries_dead_p99_ms", "  ?status=dead p99", "ms", false, true),
    figure(
        "deliveries_by_subscription_dead_p99_ms",
        "  ?subscription_id=&status=dead p99",
        "ms",
        false,
        true,
    ),
    figure("subscriptions_p99_ms", "GET /v1/subscriptions p99", "ms", false, true),
    figure("idle_rss_mb", "RSS idle (VmRSS)", "MB", false, false),
    figure("load_rss_mb", "RSS under 1000/s (VmRSS)", "MB", false, false),
    figure("peak_rss_mb", "RSS peak (VmHWM)", "MB", false, false),
];

fn dir_from_env(name: &str) -> PathBuf {
    std::env::var_os(name)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{name}: a data dir seed_history made (scripts/bench-growth.sh sets it)"))
}

#[tokio::main]
async fn main() {
    let n = env_usize("HOOKWISE_BENCH_EVENTS", 10_000);
    let concurrency = env_usize("HOOKWISE_BENCH_CONCURRENCY", 32);
    let rounds = env_usize("HOOKWISE_BENCH_ROUNDS", 3).max(1);
    // Whole rounds: what is printed is what is timed.
    let requests = env_usize("HOOKWISE_GROWTH_REQUESTS", 1000)
        .max(1)
        .next_multiple_of(READ_ROUNDS);
    let rate = env_usize("HOOKWISE_GROWTH_RATE", 1000) as u32;
    let seconds = env_usize("HOOKWISE_GROWTH_SECONDS", 30) as u64;

    let mut backends = [
        Backend::start("empty", &dir_from_env("HOOKWISE_GROWTH_EMPTY"), concurrency).await,
        Backend::start("seeded", &dir_from_env("HOOKWISE_GROWTH_SEEDED"), concurrency).await,
    ];
    tokio::time::sleep(IDLE).await;
    for b in &mut backends {
        let idle = proc_mb(b.dev.pid(), "VmRSS");
        b.set("idle_rss_mb", idle);
    }

    // Throughput: each round takes the empty store and then the seeded one, so a pair shares
    // the machine's speed of the moment; the round whose ratio is the median is kept.
    let mut run = 0;
    for (mode, per_request) in [("single", 1), ("batch", BATCH)] {
        let mut paired = Vec::new();
        for round in 1..=rounds {
            let mut pair = Vec::new();
            for b in &backends {
                run += 1;
                pair.push(b.throughput(run, n, per_request, concurrency).await);
            }
            eprintln!(
                "{mode}, round {round} of {rounds}: {:.2} s empty, {:.2} s seeded",
                pair[0].1.as_secs_f64(),
                pair[1].1.as_secs_f64()
            );
            paired.push(pair);
        }
        let ratio = |pair: &Vec<(Duration, Duration)>| pair[1].1.as_secs_f64() / pair[0].1.as_secs_f64();
        paired.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
        let median = &paired[paired.len() / 2];
        for (b, (ingested, delivered)) in backends.iter_mut().zip(median) {
            b.set(&format!("{mode}_ingest_per_second"), n as f64 / ingested.as_secs_f64());
            b.set(&format!("{mode}_per_second"), n as f64 / delivered.as_secs_f64());
        }
    }

    // After the throughput runs, so the empty store's listings have full pages to answer
    // too: of its recent deliveries, and of the dead ones made here.
    eprintln!("reads, {requests} each, one at a time, in {READ_ROUNDS} rounds the stores take in turn");
    for b in &mut backends {
        run += 1;
        b.make_dead(DEAD, run).await;
    }
    for (i, (key, _)) in listings("").iter().enumerate() {
        let mut took = vec![Vec::new(); backends.len()];
        for round in 0..READ_ROUNDS {
            let warm_up = if round == 0 { READ_WARM_UP } else { 0 };
            for (b, took) in backends.iter().zip(&mut took) {
                let path = &listings(&b.subscription)[i].1;
                took.extend(b.reads(path, warm_up, requests / READ_ROUNDS).await);
            }
        }
        for (b, mut took) in backends.iter_mut().zip(took) {
            took.sort_by(f64::total_cmp);
            b.set(&format!("{key}_p50_ms"), percentile(&took, 50.0));
            b.set(&format!("{key}_p99_ms"), percentile(&took, 99.0));
        }
    }

    eprintln!("open-loop load, {rate}/s for {seconds} s after {} s", WARM_UP.as_secs());
    for b in &mut backends {
        run += 1;
        let pid = b.dev.pid();
        let mut load_rss = 0.0;
        let figures: OpenLoop = open_loop(
            &b.api,
            &b.arrivals,
            run,
            rate,
            (WARM_UP, Duration::from_secs(seconds)),
            DRAIN,
            || load_rss = proc_mb(pid, "VmRSS"),
        )
        .await;
        b.set("load_rss_mb", load_rss);
        let l = &figures.latencies;
        for (key, p) in [
            ("latency_p50_ms", 50.0),
            ("latency_p95_ms", 95.0),
            ("latency_p99_ms", 99.0),
        ] {
            b.set(key, percentile(l, p));
        }
        b.set("latency_max_ms", l.last().copied().unwrap_or(f64::NAN));
        b.figures.insert("latency".into(), figures.json());
        b.set("peak_rss_mb", proc_mb(pid, "VmHWM"));
    }

    report(&backends, n, concurrency, rounds, requests, rate, seconds);
}

fn report(
    backends: &[Backend; 2],
    n: usize,
    concurrency: usize,
    rounds: usize,
    requests: usize,
    rate: u32,
    seconds: u64,
) {
    let [empty, seeded] = backends;
    let seed = &seeded.seed;
    println!(
        "growth: {} deliveries ({} events, {} attempts) over {} days, seeded in {:.0} s; database {:.0} MB (empty: {:.1} MB)",
        seed["deliveries"],
        seed["events"],
        seed["attempts"],
        seed["days"],
        seed["seconds"].as_f64().unwrap_or(f64::NAN),
        seeded.db_mb,
        empty.db_mb
    );
    println!(
        "throughput: {n} events at concurrency {concurrency}, median of {rounds} rounds; latency: {rate}/s for {seconds} s \
         after {} s; reads: {requests} one at a time",
        WARM_UP.as_secs()
    );
    println!(
        "{:<38} {:>10} {:>10}  {:<12} {:>9}  goal",
        "figure", empty.label, seeded.label, "unit", "ratio"
    );
    let mut ratios = Map::new();
    for f in FIGURES {
        let (e, s) = (empty.get(f.key), seeded.get(f.key));
        let ratio = s / e;
        let met = if f.rate { ratio >= 1.0 / GOAL } else { ratio <= GOAL };
        let goal = match (f.goal, f.rate) {
            (false, _) => "-".to_owned(),
            (true, true) => format!("≥ {:.2} {}", 1.0 / GOAL, if met { "met" } else { "MISSED" }),
            (true, false) => format!("≤ {GOAL:.2} {}", if met { "met" } else { "MISSED" }),
        };
        println!(
            "{:<38} {e:>10.1} {s:>10.1}  {:<12} {ratio:>9.2}  {goal}",
            f.label, f.unit
        );
        ratios.insert(
            f.key.to_owned(),
            json!({"ratio": ratio, "goal_met": f.goal.then_some(met)}),
        );
    }
    if let Ok(path) = std::env::var("HOOKWISE_BENCH_JSON") {
        let side = |b: &Backend| {
            let mut figures = b.figures.clone();
            figures.insert("db_mb".into(), json!(b.db_mb));
            Value::Object(figures)
        };
        let out = json!({
            "seed": {
                "deliveries": seed["deliveries"], "events": seed["events"], "attempts": seed["attempts"],
                "days": seed["days"], "seconds": seed["seconds"], "db_mb": seeded.db_mb,
            },
            "events": n,
            "concurrency": concurrency,
            "rounds": rounds,
            "requests": requests,
            "latency_rate": rate,
            "latency_seconds": seconds,
            "latency_warm_up_seconds": WARM_UP.as_secs(),
            "goal": GOAL,
            "empty": side(empty),
            "seeded": side(seeded),
            "ratios": ratios,
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&out).unwrap()).expect("write the JSON figures");
    }
}
