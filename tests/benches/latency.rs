//! Delivery latency under a steady open-loop load: events sent at a fixed arrival rate (each
//! at its own instant, whether or not the ones before it were answered), one per
//! `POST /v1/events`, through a real `hookwise dev` to a receiver on 127.0.0.1 that answers
//! 200 at once. An event's latency is taken at the receiver, from the event's acceptance
//! time (the envelope's `timestamp`, Hookwise's clock when it accepted the event, to the
//! millisecond) to the arrival of its first POST (the receiver's clock: the same machine's).
//!
//! Backends: `hookwise dev` (SQLite, `synchronous=FULL`), and `hookwise dev --aws` with its
//! tables on DynamoDB Local when run under `scripts/aws-test-services.sh` (its URLs and pids
//! in the environment): its queues on LocalStack's SQS (under `scripts/localstack.sh` too, its
//! emails then printed), then on moto's (the signing key is moto's KMS in both). For each,
//! the emulators' own round trip is measured before the load (a DynamoDB `GetItem` and an
//! SQS `GetQueueAttributes`, one at a time), so the reader can see what part is theirs.
//! Before the first, the emulators are warmed by an uncounted run of their own (on tables of
//! its own): cold, DynamoDB Local's JVM gave a run's first 10-20 s a backlog of seconds
//! (each second's slowest event 3.7 s, falling to 27 ms by the ninth second after the
//! warm-up), where a fresh `hookwise dev --aws` on warm emulators has none. Each run prints
//! the slowest event of each second, so the reader sees whether a tail is a transient, and
//! the cores each process used while it sent (Hookwise, this bench, each emulator) and how
//! busy the machine was, so the reader sees whether a tail is Hookwise's or a saturated
//! emulator's. The AWS path runs at 50/s too, the other rate Convoy publishes.
//!
//! `scripts/bench-latency.sh` builds the release binary and runs this. Settings:
//! HOOKWISE_LATENCY_RATES (`200,1000`, events a second), HOOKWISE_LATENCY_SECONDS (60 each),
//! HOOKWISE_LATENCY_AWS_RATES (`50,200`), HOOKWISE_LATENCY_SQS (`localstack,moto`),
//! HOOKWISE_LATENCY_LOG (the AWS runs' log filter); HOOKWISE_BENCH_JSON=FILE also writes the
//! figures.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hookwise_aws::AwsClients;
use hookwise_tests::bench::{open_loop, percentile, round_trips, Arrivals, OpenLoop, DRAIN, WARM_UP};
use hookwise_tests::cpu::{CpuMeter, CpuShares};
use hookwise_tests::{hookwise_bin, Api, Dev, TempDir};
use serde_json::{json, Value};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn rates(name: &str, default: &str) -> Vec<u32> {
    env_or(name, default)
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().expect("a rate is a whole number of events a second"))
        .collect()
}

/// One rate's figures, as a line.
fn print(figures: &OpenLoop, backend: &str) {
    let l = &figures.latencies;
    println!(
        "{backend}, {} events/s: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms, max {:.1} ms \
         ({} sent, {} refused, {} delivered; sender at most {:.1} ms late)",
        figures.rate,
        percentile(l, 50.0),
        percentile(l, 95.0),
        percentile(l, 99.0),
        l.last().copied().unwrap_or(f64::NAN),
        figures.sent,
        figures.refused,
        figures.delivered,
        figures.send_lag_max_ms,
    );
    let slowest: Vec<String> = figures.slowest_by_second.iter().map(|ms| format!("{ms:.0}")).collect();
    println!("  the slowest event of each second sent, ms: {}", slowest.join(" "));
}

/// How long the uncounted run that warms the emulators sends for, after its own `WARM_UP`.
const EMULATORS_WARM_UP: Duration = Duration::from_secs(20);

/// Send at `rate` a second for `seconds` after the warm-up (`WARM_UP`, not counted), each
/// event at its own instant, and wait for their deliveries: run `run` of the receiver's.
/// The CPU of the `watched` processes is read over the sending (warm-up included: the same
/// rate), not the drain.
async fn measure(
    api: &Api,
    arrivals: &Arrivals,
    (run, rate, seconds): (u64, u32, u64),
    watched: Vec<(String, Vec<u32>)>,
) -> (OpenLoop, CpuShares) {
    let periods = (WARM_UP, Duration::from_secs(seconds));
    let meter = CpuMeter::start(watched);
    let mut shares = None;
    let figures = open_loop(api, arrivals, run, rate, periods, DRAIN, || shares = Some(meter.read())).await;
    (figures, shares.expect("read once the last event was sent"))
}

/// `hookwise` and this process (the load and the receiver), then the emulators named, each a
/// label and the variable holding its pid (exported by scripts/aws-test-services.sh and
/// scripts/localstack.sh), as `(label, pids)`.
fn watched(hookwise: u32, emulators: &[(&str, &str)]) -> Vec<(String, Vec<u32>)> {
    let mut watched = vec![
        ("hookwise".to_owned(), vec![hookwise]),
        ("the bench (load and receiver)".to_owned(), vec![std::process::id()]),
    ];
    for (label, variable) in emulators {
        let pid = std::env::var(variable)
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{variable}: run under the scripts that start the emulators"));
        watched.push((label.to_string(), vec![pid]));
    }
    watched
}

/// Each emulator's label and the variable holding its pid.
const DYNAMODB_LOCAL: (&str, &str) = ("DynamoDB Local", "HOOKWISE_TEST_DYNAMODB_LOCAL_PID");
const LOCALSTACK: (&str, &str) = ("LocalStack", "HOOKWISE_TEST_LOCALSTACK_PID");
const MOTO: (&str, &str) = ("moto", "HOOKWISE_TEST_MOTO_PID");

/// Round trips of `call`, one at a time: p50 and p99 in milliseconds.
async fn p50_p99<F, Fut>(n: usize, call: F) -> (f64, f64)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let took = round_trips(0, n, call).await;
    (percentile(&took, 50.0), percentile(&took, 99.0))
}

/// A running `hookwise dev --aws --provision`, tables on DynamoDB Local, the rest on moto.
struct DevAws {
    child: Child,
    api: Api,
    table: String,
    queue_url: String,
}

impl DevAws {
    /// Tables on `dynamodb`, queues on `sqs`, the signing key on `moto`; email through moto's
    /// SES v2, or printed (`--log-email`) where the queues are not moto's.
    fn start(dynamodb: &str, sqs: &str, moto: &str, label: &str) -> Self {
        let prefix = format!("lat{label}{}", std::process::id());
        let email: &[&str] = if sqs == moto { &[] } else { &["--log-email"] };
        let template = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
        let mut child = Command::new(hookwise_bin())
            .args(["dev", "--aws", "--provision", "--template"])
            .arg(&template)
            .args(["--aws-prefix", &prefix, "--sender-email", "hookwise@example.com"])
            .args(["--listen", "127.0.0.1:0"])
            .args(email)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            // HOOKWISE_LATENCY_LOG (a filter, as HOOKWISE_LOG) shows where the time goes.
            .env("HOOKWISE_LOG", env_or("HOOKWISE_LATENCY_LOG", "warn"))
            .env_remove("AWS_ENDPOINT_URL")
            .env("AWS_ENDPOINT_URL_DYNAMODB", dynamodb)
            .env("AWS_ENDPOINT_URL_SQS", sqs)
            .env("AWS_ENDPOINT_URL_SESV2", moto)
            .env("AWS_ENDPOINT_URL_KMS", moto)
            .env_remove("HOOKWISE_API_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("hookwise dev --aws starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        let (mut base, mut key, mut table, mut queue_url) = (None, None, None, None);
        while base.is_none() || key.is_none() || table.is_none() || queue_url.is_none() {
            let line = lines
                .next()
                .expect("hookwise dev --aws printed its address, key, tables and queues");
            if let Some(url) = line.split("listening on ").nth(1) {
                base = Some(url.trim().to_owned());
            }
            if let Some(k) = line.strip_prefix("API key:") {
                key = Some(k.trim().to_owned());
            }
            if let Some(pair) = line.strip_prefix("tables:") {
                table = pair.split(" / ").next().map(|t| t.trim().to_owned());
            }
            if let Some(pair) = line.strip_prefix("queues:") {
                queue_url = pair.split(" / ").next().map(|q| q.trim().to_owned());
            }
        }
        // Keep draining stdout, so the process never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self {
            child,
            api: Api {
                base: base.unwrap(),
                key: key.unwrap(),
                http: reqwest::Client::new(),
            },
            table: table.unwrap(),
            queue_url: queue_url.unwrap(),
        }
    }
}

impl Drop for DevAws {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::main]
async fn main() {
    let seconds: u64 = env_or("HOOKWISE_LATENCY_SECONDS", "60").parse().expect("seconds");
    let mut out = json!({"seconds": seconds, "dev": [], "aws": null});
    let arrivals = Arrivals::start().await;
    let url = &arrivals.url;
    // Each open loop is a run of its own, so a late POST of an earlier one is not counted.
    let mut run = 0;

    println!("open-loop load, one event per request, {seconds} s per rate after a {} s warm-up; latency from acceptance to the first POST's arrival", WARM_UP.as_secs());
    for rate in rates("HOOKWISE_LATENCY_RATES", "200,1000") {
        // A fresh process and data dir for each rate.
        let dir = TempDir::new("latency");
        let dev = Dev::start(&dir.0, &[]);
        let api = dev.api();
        api.subscribe(json!({"url": url})).await;
        run += 1;
        let (figures, cpu) = measure(&api, &arrivals, (run, rate, seconds), watched(dev.pid(), &[])).await;
        print(&figures, "hookwise dev (SQLite)");
        println!("  {}", cpu.line());
        let mut figures = figures.json();
        figures["cpu"] = cpu.json();
        out["dev"].as_array_mut().unwrap().push(figures);
    }

    let (dynamodb, moto) = (
        std::env::var("HOOKWISE_TEST_DYNAMODB_LOCAL_URL"),
        std::env::var("HOOKWISE_TEST_MOTO_URL"),
    );
    let (Ok(dynamodb), Ok(moto)) = (dynamodb, moto) else {
        println!("hookwise dev --aws: skipped (run under scripts/aws-test-services.sh for it)");
        return write(&out);
    };
    // The queues on LocalStack's SQS first (when scripts/localstack.sh runs), then on
    // moto's: moto may not come back from a load it cannot take, and holds the signing key.
    let mut mixes = Vec::new();
    if let Ok(localstack) = std::env::var("HOOKWISE_TEST_LOCALSTACK_URL") {
        mixes.push(("LocalStack SQS", "localstack", localstack));
    }
    mixes.push(("moto SQS", "moto", moto.clone()));
    // HOOKWISE_LATENCY_SQS (`localstack,moto`) chooses among them.
    let chosen = env_or("HOOKWISE_LATENCY_SQS", "localstack,moto");
    mixes.retain(|(_, label, _)| chosen.split(',').any(|c| c.trim() == *label));
    let mut runs = Vec::new();
    let aws_rates = rates("HOOKWISE_LATENCY_AWS_RATES", "50,200");
    if let (Some((name, label, sqs)), Some(&rate)) = (mixes.first(), aws_rates.iter().max()) {
        let dev = DevAws::start(&dynamodb, sqs, &moto, &format!("{label}warm"));
        dev.api.subscribe(json!({"url": url})).await;
        run += 1;
        let warm = (run, rate, EMULATORS_WARM_UP.as_secs());
        measure(&dev.api, &arrivals, warm, Vec::new()).await;
        println!(
            "(the emulators warmed first: {rate}/s for {} s through a hookwise dev --aws of its own, on {name}, not counted)",
            (WARM_UP + EMULATORS_WARM_UP).as_secs()
        );
    }
    for (name, label, sqs) in mixes {
        for &rate in &aws_rates {
            let dev = DevAws::start(&dynamodb, &sqs, &moto, label);
            dev.api.subscribe(json!({"url": url})).await;
            // The emulators' own round trips, one call at a time, before the load.
            let (emulators_alone, said) = emulator_round_trips(&dynamodb, &sqs, &dev).await;
            run += 1;
            let emulators: &[(&str, &str)] = if label == "localstack" {
                &[DYNAMODB_LOCAL, LOCALSTACK, MOTO]
            } else {
                &[DYNAMODB_LOCAL, MOTO]
            };
            let watched = watched(dev.child.id(), emulators);
            let (figures, cpu) = measure(&dev.api, &arrivals, (run, rate, seconds), watched).await;
            print(&figures, &format!("hookwise dev --aws (DynamoDB Local, {name})"));
            println!("  {said}");
            println!("  {}", cpu.line());
            let mut run = figures.json();
            run["sqs"] = json!(name);
            run["emulators"] = emulators_alone;
            run["cpu"] = cpu.json();
            runs.push(run);
        }
    }
    out["aws"] = json!({"runs": runs});
    write(&out);
}

fn write(out: &Value) {
    if let Ok(path) = std::env::var("HOOKWISE_BENCH_JSON") {
        std::fs::write(&path, serde_json::to_vec_pretty(out).unwrap()).expect("write the JSON figures");
    }
}

/// DynamoDB Local's `GetItem` and the queue's `GetQueueAttributes`, 200 each, one at a time:
/// p50 and p99 as JSON, and in words. A call that fails is counted, not timed.
async fn emulator_round_trips(dynamodb: &str, sqs: &str, dev: &DevAws) -> (Value, String) {
    let ddb = AwsClients::for_endpoint(dynamodb, None).await;
    let queues = AwsClients::for_endpoint(sqs, None).await;
    let key = aws_sdk_dynamodb::types::AttributeValue::S("none".into());
    let failed = std::cell::Cell::new(0);
    let (get50, get99) = p50_p99(200, || async {
        let sent = ddb
            .dynamodb
            .get_item()
            .table_name(&dev.table)
            .key("pk", key.clone())
            .key("sk", key.clone())
            .send()
            .await;
        if sent.is_err() {
            failed.set(failed.get() + 1);
        }
    })
    .await;
    let (sqs50, sqs99) = p50_p99(200, || async {
        let sent = queues.sqs.get_queue_attributes().queue_url(&dev.queue_url).send().await;
        if sent.is_err() {
            failed.set(failed.get() + 1);
        }
    })
    .await;
    let json = json!({
        "dynamodb_get_item_p50_ms": get50, "dynamodb_get_item_p99_ms": get99,
        "sqs_p50_ms": sqs50, "sqs_p99_ms": sqs99, "failed_calls": failed.get(),
    });
    let said = format!(
        "the emulators alone, before the load: DynamoDB Local GetItem p50 {get50:.1} ms, p99 {get99:.1} ms; \
         SQS GetQueueAttributes p50 {sqs50:.1} ms, p99 {sqs99:.1} ms ({} calls failed)",
        failed.get()
    );
    (json, said)
}
