//! Seed 003's storm, end to end: the real `hookwise dev` and a receiver that can take 100
//! requests a second (a token bucket; it answers 503 to the excess) and is down entirely
//! (503 to every request) for its first 90 s; 5 000 events to it within the first 10 s.
//!
//! Two runs side by side, each on its own `hookwise dev` and receiver: the subscription with
//! `rate_limit_per_second: 100` and its circuit breaker on (the default), and the same with
//! neither. Measured at the receiver: the peak requests per second, the POSTs received during
//! the outage, the time from recovery to the last delivery, deliveries dead and lost. The
//! protected run must lose none and kill none; the figures are printed, and the requests per
//! second of both runs charted to `tests/artifacts/storm-e2e.svg`.

use std::collections::HashSet;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use hookwise_tests::{Api, Dev, TempDir};
use serde_json::{json, Value};

const OUTAGE: Duration = Duration::from_secs(90);
const CAPACITY_PER_SECOND: f64 = 100.0;
const EVENTS: usize = 5_000;
const SEND_WITHIN: Duration = Duration::from_secs(10);
/// Doubling from 2 s, no jitter (the naive curve of seed 003): 254 s from first attempt to
/// last, longer than the outage and the release after it.
const SCHEDULE: [u64; 7] = [2, 4, 8, 16, 32, 64, 128];
/// The longest either run may take to settle.
const SETTLE: Duration = Duration::from_secs(420);

// ---------------------------------------------------------------------------------------
// The receiver

struct Load {
    /// POSTs in each second since the receiver started.
    per_second: Vec<u32>,
    during_outage: u64,
    /// The token bucket: what it can take now, and when it was last filled.
    tokens: f64,
    filled_at: Instant,
    /// Events it took (answered 200), by `webhook-id`, and when it took the last.
    took: HashSet<String>,
    last_taken: Option<Instant>,
}

#[derive(Clone)]
struct Receiver {
    started: Instant,
    load: Arc<Mutex<Load>>,
    url: String,
}

impl Receiver {
    async fn start() -> Self {
        let started = Instant::now();
        let load = Arc::new(Mutex::new(Load {
            per_second: Vec::new(),
            during_outage: 0,
            tokens: CAPACITY_PER_SECOND,
            filled_at: started,
            took: HashSet::new(),
            last_taken: None,
        }));
        let l = load.clone();
        let app = axum::Router::new().fallback(move |headers: HeaderMap| {
            let l = l.clone();
            async move { answer(&mut l.lock().unwrap(), started, &headers) }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { started, load, url }
    }
}

fn answer(load: &mut Load, started: Instant, headers: &HeaderMap) -> StatusCode {
    let now = Instant::now();
    let second = (now - started).as_secs() as usize;
    if load.per_second.len() <= second {
        load.per_second.resize(second + 1, 0);
    }
    load.per_second[second] += 1;
    if now - started < OUTAGE {
        load.during_outage += 1;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let refill = (now - load.filled_at).as_secs_f64() * CAPACITY_PER_SECOND;
    load.tokens = (load.tokens + refill).min(CAPACITY_PER_SECOND);
    load.filled_at = now;
    if load.tokens < 1.0 {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    load.tokens -= 1.0;
    let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or("");
    load.took.insert(id.to_owned());
    load.last_taken = Some(now);
    StatusCode::OK
}

// ---------------------------------------------------------------------------------------
// One run

struct Figures {
    label: &'static str,
    peak_per_second: u32,
    during_outage: u64,
    recovery_to_last: Option<Duration>,
    delivered: u64,
    dead: u64,
    lost: u64,
    per_second: Vec<u32>,
}

async fn run(label: &'static str, protected: bool) -> Figures {
    let dir = TempDir::new("storm-e2e");
    let dev = Dev::start(&dir.0, &[]);
    let api = dev.api();
    let receiver = Receiver::start().await;
    let mut subscription = json!({
        "url": receiver.url,
        "retry_policy": {"schedule_seconds": SCHEDULE},
    });
    if protected {
        subscription["rate_limit_per_second"] = json!(100);
    } else {
        subscription["circuit_breaker"] = json!({"enabled": false});
    }
    let sub = api.subscribe(subscription).await;
    let sub_id = sub["id"].as_str().unwrap().to_owned();

    for batch in 0..EVENTS / 100 {
        let events: Vec<Value> = (0..100)
            .map(|n| json!({"type": "order.paid", "payload": {"n": batch * 100 + n}}))
            .collect();
        let (status, out) = api.post("/v1/events/batch", json!({"events": events})).await;
        assert_eq!(status, 202, "{out}");
        assert_eq!(out["accepted"], 100, "{out}");
    }
    let sent_in = receiver.started.elapsed();
    assert!(sent_in < SEND_WITHIN, "{label}: 5 000 events took {sent_in:?} to send");

    // Settled when none is pending or retrying; then the dead are counted.
    loop {
        let open = count(&api, &sub_id, "pending", 1).await + count(&api, &sub_id, "retrying", 1).await;
        if open == 0 {
            break;
        }
        assert!(
            receiver.started.elapsed() < SETTLE,
            "{label}: deliveries still open after {SETTLE:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let dead = count(&api, &sub_id, "dead", u64::MAX).await;
    let delivered = count(&api, &sub_id, "delivered", u64::MAX).await;
    let load = receiver.load.lock().unwrap();
    let taken = load.took.len() as u64;
    assert_eq!(
        taken, delivered,
        "{label}: the receiver took {taken}, Hookwise says {delivered}"
    );
    Figures {
        label,
        peak_per_second: load.per_second.iter().copied().max().unwrap_or(0),
        during_outage: load.during_outage,
        recovery_to_last: load.last_taken.map(|at| (at - receiver.started).saturating_sub(OUTAGE)),
        delivered,
        dead,
        lost: EVENTS as u64 - taken - dead,
        per_second: load.per_second.clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_e2e_rate_limit_and_breaker_against_neither() {
    let (on, off) = tokio::join!(run("limit 100/s + breaker", true), run("neither", false));
    print_figures(&[&on, &off]);
    std::fs::write(artifacts().join("storm-e2e.svg"), chart(&[&on, &off])).expect("chart written");

    assert_eq!(on.lost, 0, "deliveries lost");
    assert_eq!(on.dead, 0, "deliveries dead");
    assert_eq!(off.lost, 0, "deliveries lost without protection");
    assert_eq!(on.delivered, EVENTS as u64);
    // At the receiver, over any one-second window: at most the limit, a tenth more, and one.
    let after_outage = &on.per_second[OUTAGE.as_secs() as usize..];
    let busiest = after_outage.iter().copied().max().unwrap_or(0);
    assert!(
        busiest <= 111,
        "{busiest} requests in one second, over the limit of 100"
    );
    // The outage sees the breaker's first failures and its probes, not every attempt.
    assert!(
        on.during_outage * 100 < off.during_outage,
        "{} POSTs during the outage with the breaker, {} without",
        on.during_outage,
        off.during_outage
    );
}

/// How many of the subscription's deliveries have `status`, counting no further than `upto`.
async fn count(api: &Api, sub_id: &str, status: &str, upto: u64) -> u64 {
    let (mut n, mut cursor) = (0, None::<String>);
    loop {
        let mut path = format!("/v1/deliveries?subscription_id={sub_id}&status={status}&limit=100");
        if let Some(c) = &cursor {
            path += &format!("&cursor={c}");
        }
        let (code, page) = api.get(&path).await;
        assert_eq!(code, 200, "{page}");
        n += page["data"].as_array().unwrap().len() as u64;
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() || n >= upto {
            return n;
        }
    }
}

fn artifacts() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts");
    std::fs::create_dir_all(&dir).expect("tests/artifacts");
    dir
}

fn print_figures(runs: &[&Figures]) {
    let mut out = String::from("\nstorm end to end: 5 000 events in 10 s, receiver down 90 s then 100 requests/s\n");
    let row = |out: &mut String, name: &str, cells: Vec<String>| {
        let _ = write!(out, "{name:<38}");
        for c in cells {
            let _ = write!(out, "{c:>24}");
        }
        out.push('\n');
    };
    row(&mut out, "", runs.iter().map(|r| r.label.to_owned()).collect());
    row(
        &mut out,
        "peak requests/s at the receiver",
        runs.iter().map(|r| r.peak_per_second.to_string()).collect(),
    );
    row(
        &mut out,
        "POSTs received during the outage",
        runs.iter().map(|r| r.during_outage.to_string()).collect(),
    );
    row(
        &mut out,
        "recovery to the last delivery",
        runs.iter()
            .map(|r| {
                r.recovery_to_last
                    .map_or("-".into(), |d| format!("{:.0} s", d.as_secs_f64()))
            })
            .collect(),
    );
    row(
        &mut out,
        "delivered",
        runs.iter().map(|r| r.delivered.to_string()).collect(),
    );
    row(&mut out, "dead", runs.iter().map(|r| r.dead.to_string()).collect());
    row(&mut out, "lost", runs.iter().map(|r| r.lost.to_string()).collect());
    for r in runs {
        let _ = writeln!(out, "{}: requests in each second: {:?}", r.label, r.per_second);
    }
    println!("{out}");
}

/// Requests per second at the receiver, one line per run, as an SVG.
fn chart(runs: &[&Figures]) -> String {
    let (w, h, left, bottom, top) = (900.0, 360.0, 60.0, 40.0, 40.0);
    let seconds = runs.iter().map(|r| r.per_second.len()).max().unwrap_or(1).max(1) as f64;
    let peak = runs.iter().map(|r| r.peak_per_second).max().unwrap_or(1).max(1) as f64;
    let x = |s: f64| left + s / seconds * (w - left - 20.0);
    let y = |v: f64| h - bottom - v / peak * (h - bottom - top);
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" font-size="15" text-anchor="middle">Requests per second at the receiver: down 90 s, then 100/s; 5 000 events in the first 10 s</text>
<rect x="{left}" y="{top}" width="{}" height="{}" fill="#eee"/>
"##,
        w / 2.0,
        x(OUTAGE.as_secs_f64()) - left,
        h - bottom - top
    );
    for tick in (0..=seconds as usize).step_by(30) {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{tick} s</text>"#,
            x(tick as f64),
            h - bottom + 16.0
        );
    }
    for v in [0.0, peak / 2.0, peak] {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{v:.0}</text>"#,
            left - 6.0,
            y(v) + 4.0
        );
    }
    let capacity = y(CAPACITY_PER_SECOND);
    let _ = writeln!(
        svg,
        r##"<line x1="{left}" x2="{}" y1="{capacity}" y2="{capacity}" stroke="#2a9d49" stroke-dasharray="4 3"/>"##,
        w - 20.0
    );
    for (i, (run, colour)) in runs.iter().zip(["#2e86ab", "#e4572e"]).enumerate() {
        let points: Vec<String> = run
            .per_second
            .iter()
            .enumerate()
            .map(|(s, n)| format!("{:.1},{:.1}", x(s as f64), y(f64::from(*n))))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            points.join(" ")
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" fill="{colour}">{}</text>"#,
            w - 220.0,
            top + 16.0 + 16.0 * i as f64,
            run.label
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" fill="#2a9d49">capacity 100/s</text>"##,
        w - 220.0,
        top + 48.0
    );
    svg.push_str("</svg>\n");
    svg
}
