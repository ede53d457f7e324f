//! A retry storm, end to end: the real `hookwise dev` and a receiver that can take 100
//! requests a second (a token bucket; it answers 503 to the excess) and is down entirely
//! (503 to every request) for its first 90 s; 5 000 events to it within the first seconds.
//!
//! Four arms, each on its own hosts and receiver, judged by what the receiver got:
//! - `rate_limit_per_second: 100` and the circuit breaker on (the default), on SQLite;
//! - the same with an equal-jitter policy (each delay `d/2 + U(0, d/2)`);
//! - neither, on SQLite: the storm unprotected;
//! - limit and breaker on `hookwise dev --aws` (DynamoDB Local, LocalStack's SQS), two
//!   processes delivering side by side and sharing the endpoint's limiter through DynamoDB.
//!   It sends first, alone; the other arms start once it has sent.
//!
//! Measured at the receiver: the busiest one-second window (sliding, to the millisecond), the
//! POSTs received during the outage, the time from recovery to the last delivery, deliveries
//! dead and lost. Each protected arm must lose none, kill none and keep every one-second
//! window within the limit, a tenth more, and one. The figures are printed, and the requests
//! per second of every arm charted to `tests/artifacts/storm-e2e.svg`.
//!
//! The AWS arm needs DynamoDB Local and moto (scripts/aws-test-services.sh) and LocalStack
//! (scripts/localstack.sh); without them it is left out, unless one of those scripts asked
//! for them (HOOKWISE_TEST_REQUIRE_AWS=1, HOOKWISE_TEST_REQUIRE_LOCALSTACK=1), when the test
//! fails.

mod aws_support;

use std::collections::HashSet;
use std::fmt::Write;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use hookwise_tests::{hookwise_bin, spawn_until_ready, Api, Dev, TempDir};
use serde_json::{json, Value};

const OUTAGE: Duration = Duration::from_secs(90);
const CAPACITY_PER_SECOND: f64 = 100.0;
const RATE_LIMIT: u32 = 100;
/// The most POSTs any one-second window may hold in a protected arm: the limit, the
/// limiter's tolerance (a tenth), and one.
const BUSIEST_ALLOWED: usize = 111;
const EVENTS: usize = 5_000;
/// All sent well inside the outage (on SQLite in 3 s or so; on DynamoDB Local and LocalStack
/// in about 30).
const SEND_WITHIN: Duration = Duration::from_secs(60);
/// Doubling from 2 s (the naive curve): 254 s from first attempt to last, longer
/// than the outage and the release after it; with equal jitter, at least half that: 127 s.
const SCHEDULE: [u64; 7] = [2, 4, 8, 16, 32, 64, 128];
/// The longest an arm may take to settle.
const SETTLE: Duration = Duration::from_secs(420);
/// Delivery processes of the AWS arm.
const AWS_WORKERS: usize = 2;
/// Set by scripts/localstack.sh.
const LOCALSTACK_URL: &str = "HOOKWISE_TEST_LOCALSTACK_URL";

// ---------------------------------------------------------------------------------------
// The receiver

struct Load {
    /// When each POST came, since the receiver started.
    arrivals: Vec<Duration>,
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
            arrivals: Vec::new(),
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
    load.arrivals.push(now - started);
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

/// The most arrivals in any one-second window `[t, t + 1 s)`, over sorted `arrivals`.
fn busiest_second(arrivals: &[Duration]) -> usize {
    let mut first = 0;
    let mut most = 0;
    for (last, at) in arrivals.iter().enumerate() {
        while *at - arrivals[first] >= Duration::from_secs(1) {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

/// Arrivals counted in each whole second since the start (for the chart).
fn per_second(arrivals: &[Duration]) -> Vec<u32> {
    let mut counts = Vec::new();
    for at in arrivals {
        let second = at.as_secs() as usize;
        if counts.len() <= second {
            counts.resize(second + 1, 0);
        }
        counts[second] += 1;
    }
    counts
}

// ---------------------------------------------------------------------------------------
// The hosts

/// Where the AWS arm's services are: the tables on DynamoDB Local, the queues on LocalStack's
/// SQS, the secrets' key on moto's KMS. (Moto's SQS does not keep up with a queue of
/// thousands: each receive stalled past the SDK's 5 s.)
struct AwsEndpoints {
    dynamodb: String,
    sqs: String,
    kms: String,
}

impl AwsEndpoints {
    fn from_env() -> Option<Self> {
        let get = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
        let found = (
            get(aws_support::DYNAMODB_LOCAL_URL),
            get(LOCALSTACK_URL),
            get(aws_support::MOTO_URL),
        );
        match found {
            (Some(dynamodb), Some(sqs), Some(kms)) => Some(Self { dynamodb, sqs, kms }),
            _ => {
                let required = [aws_support::REQUIRE, "HOOKWISE_TEST_REQUIRE_LOCALSTACK"]
                    .iter()
                    .any(|var| std::env::var(var).is_ok_and(|v| v == "1"));
                assert!(
                    !required,
                    "the AWS arm needs DynamoDB Local, LocalStack and moto: {found:?}"
                );
                None
            }
        }
    }
}

/// What delivers for an arm: one `hookwise dev` on SQLite, or `hookwise dev --aws`
/// processes side by side on one set of tables and queues.
enum Hosts {
    /// The process goes first, then its data dir.
    Local {
        dev: Dev,
        _dir: TempDir,
    },
    Aws(Vec<(Child, Api)>),
}

impl Hosts {
    fn local() -> Self {
        let dir = TempDir::new("storm-e2e");
        Self::Local {
            dev: Dev::start(&dir.0, &[]),
            _dir: dir,
        }
    }

    /// `AWS_WORKERS` processes on one set of tables and queues: the first makes them (and
    /// the tenant of the shared key), the others use what it printed.
    fn aws(aws: &AwsEndpoints) -> Self {
        let key = "hwk_storm_e2e_shared_key_0123456789";
        let mut processes: Vec<(Child, Api)> = Vec::new();
        let mut resources: Vec<(String, String)> = Vec::new();
        for n in 0..AWS_WORKERS {
            let mut command = Command::new(hookwise_bin());
            command
                .args(["dev", "--aws", "--listen", "127.0.0.1:0", "--scheduler-interval", "1"])
                .arg("--log-email")
                .env("AWS_ENDPOINT_URL_DYNAMODB", &aws.dynamodb)
                .env("AWS_ENDPOINT_URL_SQS", &aws.sqs)
                // The signing secrets' key; SES v2 is never called (--log-email).
                .env("AWS_ENDPOINT_URL_KMS", &aws.kms)
                .env("AWS_ENDPOINT_URL_SESV2", "http://127.0.0.1:1")
                .env_remove("AWS_ENDPOINT_URL")
                .env("AWS_ACCESS_KEY_ID", "testing")
                .env("AWS_SECRET_ACCESS_KEY", "testing")
                .env("AWS_REGION", "us-east-1")
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env("HOOKWISE_ALLOWED_TARGET_CIDRS", "127.0.0.0/8")
                .env("HOOKWISE_API_KEY", key)
                .env("HOOKWISE_LOG", "warn");
            if n == 0 {
                let template = aws_support::workspace_root().join("template.yaml");
                command.args(["--provision", "--aws-prefix", &aws_support::unique_prefix("storm")]);
                command.arg("--template").arg(template);
            } else {
                command.envs(resources.iter().cloned());
            }
            let mut base = None;
            let child = spawn_until_ready(&mut command, |line| {
                // `  export HOOKWISE_TABLE=… HOOKWISE_SCHEDULER_TABLE=…`, from --provision.
                if let Some(vars) = line.trim().strip_prefix("export ") {
                    resources.extend(
                        vars.split_whitespace()
                            .filter_map(|pair| pair.split_once('='))
                            .map(|(k, v)| (k.to_owned(), v.to_owned())),
                    );
                }
                base = line.split("listening on ").nth(1).map(|b| b.trim().to_owned());
                base.is_some()
            });
            let api = Api {
                base: base.unwrap(),
                key: key.into(),
                http: reqwest::Client::new(),
            };
            processes.push((child, api));
        }
        Self::Aws(processes)
    }

    fn apis(&self) -> Vec<Api> {
        match self {
            Self::Local { dev, .. } => vec![dev.api()],
            Self::Aws(processes) => processes.iter().map(|(_, api)| api.clone()).collect(),
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if let Self::Aws(processes) = self {
            for (child, _) in processes {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// One arm

struct Arm {
    label: &'static str,
    /// The rate limit and the breaker on, or neither.
    protected: bool,
    jitter: Option<&'static str>,
}

struct Figures {
    label: &'static str,
    protected: bool,
    busiest_second: usize,
    /// From the receiver's start to the last event accepted.
    sent_in: Duration,
    during_outage: u64,
    recovery_to_last: Option<Duration>,
    delivered: u64,
    dead: u64,
    lost: u64,
    /// Events the receiver took (answered 200), by `webhook-id`.
    taken: u64,
    per_second: Vec<u32>,
}

/// `sent`: told once the arm's events are all sent.
async fn run(arm: Arm, hosts: Hosts, sent: Option<&tokio::sync::watch::Sender<bool>>) -> Figures {
    let label = arm.label;
    let apis = hosts.apis();
    let api = &apis[0];
    let receiver = Receiver::start().await;
    let mut policy = json!({"schedule_seconds": SCHEDULE});
    if let Some(jitter) = arm.jitter {
        policy["jitter"] = json!(jitter);
    }
    let mut subscription = json!({"url": receiver.url, "retry_policy": policy});
    if arm.protected {
        subscription["rate_limit_per_second"] = json!(RATE_LIMIT);
    } else {
        subscription["circuit_breaker"] = json!({"enabled": false});
    }
    let sub = api.subscribe(subscription).await;
    let sub_id = sub["id"].as_str().unwrap().to_owned();

    // Batches of 100, to each host in turn; an event refused for a moment (503) is sent
    // again with its key.
    for batch in 0..EVENTS / 100 {
        let mut events: Vec<Value> = (0..100)
            .map(|n| {
                let n = batch * 100 + n;
                json!({"type": "order.paid", "payload": {"n": n}, "idempotency_key": format!("storm-{n}")})
            })
            .collect();
        let host = &apis[batch % apis.len()];
        for _ in 0..5 {
            let (status, out) = host.post("/v1/events/batch", json!({"events": events})).await;
            assert_eq!(status, 202, "{label}: {out}");
            let results = out["results"].as_array().expect("results");
            events = events
                .into_iter()
                .zip(results)
                .filter(|(_, r)| r["error"]["status"] == 503)
                .map(|(e, _)| e)
                .collect();
            if events.is_empty() {
                break;
            }
        }
        assert!(events.is_empty(), "{label}: events refused five times: {events:?}");
    }
    let sent_in = receiver.started.elapsed();
    assert!(sent_in < SEND_WITHIN, "{label}: 5 000 events took {sent_in:?} to send");
    if let Some(sent) = sent {
        sent.send_replace(true);
    }

    // Settled when none is pending or retrying; then the dead are counted.
    loop {
        let open = count(api, &sub_id, "pending", 1).await + count(api, &sub_id, "retrying", 1).await;
        if open == 0 {
            break;
        }
        assert!(
            receiver.started.elapsed() < SETTLE,
            "{label}: deliveries still open after {SETTLE:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let dead = count(api, &sub_id, "dead", u64::MAX).await;
    let delivered = count(api, &sub_id, "delivered", u64::MAX).await;
    drop(hosts);
    let mut load = receiver.load.lock().unwrap();
    load.arrivals.sort();
    let taken = load.took.len() as u64;
    Figures {
        label,
        protected: arm.protected,
        busiest_second: busiest_second(&load.arrivals),
        sent_in,
        during_outage: load.during_outage,
        recovery_to_last: load.last_taken.map(|at| (at - receiver.started).saturating_sub(OUTAGE)),
        delivered,
        dead,
        lost: (EVENTS as u64).saturating_sub(taken + dead),
        taken,
        per_second: per_second(&load.arrivals),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_e2e_rate_limit_and_breaker_against_neither() {
    let aws = AwsEndpoints::from_env();
    if aws.is_none() {
        eprintln!("the arm on dev --aws is left out: no DynamoDB Local, LocalStack and moto");
    }
    // The AWS arm sends first, alone, then the others start: on two cores, three more
    // processes taking a storm each would make its sending the machine's speed, not its own.
    let (sent, aws_sent) = tokio::sync::watch::channel(aws.is_none());
    let aws_arm = async {
        let env = aws.as_ref()?;
        let arm = Arm {
            label: "dev --aws x2, limit + breaker",
            protected: true,
            jitter: None,
        };
        Some(run(arm, Hosts::aws(env), Some(&sent)).await)
    };
    let local_arm = |arm: Arm| {
        let mut aws_sent = aws_sent.clone();
        async move {
            aws_sent
                .wait_for(|sent| *sent)
                .await
                .expect("the AWS arm tells when it has sent");
            run(arm, Hosts::local(), None).await
        }
    };
    let (on, jittered, off, on_aws) = tokio::join!(
        local_arm(Arm {
            label: "limit 100/s + breaker",
            protected: true,
            jitter: None,
        }),
        local_arm(Arm {
            label: "the same, equal jitter",
            protected: true,
            jitter: Some("equal"),
        }),
        local_arm(Arm {
            label: "neither",
            protected: false,
            jitter: None,
        }),
        aws_arm
    );
    let mut arms = vec![&on, &jittered, &off];
    arms.extend(on_aws.as_ref());
    let figures = figures(&arms);
    println!("{figures}");
    std::fs::write(artifacts().join("storm-e2e.txt"), figures).expect("figures written");
    std::fs::write(artifacts().join("storm-e2e.svg"), chart(&arms)).expect("chart written");

    for f in &arms {
        let label = f.label;
        assert_eq!(f.lost, 0, "{label}: deliveries lost");
        assert_eq!(
            f.taken, f.delivered,
            "{label}: the receiver took {}, Hookwise says it delivered {}",
            f.taken, f.delivered
        );
        if !f.protected {
            continue;
        }
        assert_eq!(f.dead, 0, "{label}: deliveries dead");
        assert_eq!(f.delivered, EVENTS as u64, "{label}");
        assert!(
            f.busiest_second <= BUSIEST_ALLOWED,
            "{label}: {} requests in one second, over the limit of {RATE_LIMIT}",
            f.busiest_second
        );
        // The outage sees the breaker's first failures and its probes, not every attempt.
        assert!(
            f.during_outage * 100 < off.during_outage,
            "{label}: {} POSTs during the outage with the breaker, {} without",
            f.during_outage,
            off.during_outage
        );
    }
}

/// How many of the subscription's deliveries have `status`, counting no further than `upto`.
async fn count(api: &Api, sub_id: &str, status: &str, upto: u64) -> u64 {
    let (mut n, mut cursor) = (0, None::<String>);
    loop {
        let mut path = format!("/v1/deliveries?subscription_id={sub_id}&status={status}&limit=100");
        if let Some(c) = &cursor {
            // Opaque: it may hold `#` (DynamoDB's), so it goes encoded.
            let c: String = url::form_urlencoded::byte_serialize(c.as_bytes()).collect();
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

/// The arms' figures, as a table.
fn figures(runs: &[&Figures]) -> String {
    let mut out = String::from("\nstorm end to end: 5 000 events at once, receiver down 90 s then 100 requests/s\n");
    let row = |out: &mut String, name: &str, cells: Vec<String>| {
        let _ = write!(out, "{name:<38}");
        for c in cells {
            let _ = write!(out, "{c:>32}");
        }
        out.push('\n');
    };
    row(&mut out, "", runs.iter().map(|r| r.label.to_owned()).collect());
    row(
        &mut out,
        "5 000 events sent in",
        runs.iter()
            .map(|r| format!("{:.1} s", r.sent_in.as_secs_f64()))
            .collect(),
    );
    row(
        &mut out,
        "busiest 1 s at the receiver (sliding)",
        runs.iter().map(|r| r.busiest_second.to_string()).collect(),
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
    row(
        &mut out,
        "taken by the receiver",
        runs.iter().map(|r| r.taken.to_string()).collect(),
    );
    for r in runs {
        let _ = writeln!(out, "{}: requests in each second: {:?}", r.label, r.per_second);
    }
    out
}

/// Requests per second at the receiver, one line per run, as an SVG.
fn chart(runs: &[&Figures]) -> String {
    let (w, h, left, bottom, top) = (900.0, 360.0, 60.0, 40.0, 40.0);
    let seconds = runs.iter().map(|r| r.per_second.len()).max().unwrap_or(1).max(1) as f64;
    let peak = runs
        .iter()
        .flat_map(|r| r.per_second.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let x = |s: f64| left + s / seconds * (w - left - 20.0);
    let y = |v: f64| h - bottom - v / peak * (h - bottom - top);
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" font-size="15" text-anchor="middle">Requests per second at the receiver: down 90 s, then 100/s; 5 000 events at once</text>
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
    for (i, (run, colour)) in runs
        .iter()
        .zip(["#2e86ab", "#8e44ad", "#e4572e", "#f4a261"])
        .enumerate()
    {
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
        top + 16.0 + 16.0 * runs.len() as f64
    );
    svg.push_str("</svg>\n");
    svg
}
