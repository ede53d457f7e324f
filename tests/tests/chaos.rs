//! The chaos suite: Hookwise under faults, end to end, on both backends.
//!
//! - **Locally:** the real `hookwise dev` on SQLite with `--faults` (hookwise-local's
//!   injector: the store's and queues' calls fail before they run or lose their answer
//!   after they commit, received messages come again or before their time), crashed twice
//!   and restarted on the same data dir: it aborts itself right after the commit of a
//!   150-subscription event's ingest, before answering it, and is killed with SIGKILL while
//!   deliveries are in flight.
//! - **On the AWS path:** the real `hookwise dev --aws` (the service code the Lambdas run) on
//!   DynamoDB Local and moto, each behind a [`FaultProxy`] that answers a share of DynamoDB,
//!   SQS and SES v2 requests with the services' real throttling and 5xx errors (some after
//!   the request was applied) and adds latency; two SIGKILLs, the first from the proxy right
//!   after the k-th DynamoDB write of the events, in the middle of the 150-subscription
//!   ingest; duplicated, stale and early queue messages sent beside the real ones.
//!
//! The endpoints are real HTTP servers on 127.0.0.1: steady, flaky, slow past the
//! subscription's timeout, down (connections dropped) then up, 429 with `Retry-After`, and
//! one that always fails. Events go in through a client that retries with the same
//! `Idempotency-Key` until it gets an answer, as a careful client does.
//!
//! At the end, with the faults off, every event the API accepted must have all its deliveries
//! `delivered`, or `dead` after the whole schedule (all its attempts), each dead one in exactly
//! one email, and no retry made sooner after the attempt before it than the schedule says (by
//! the attempts' recorded start times and durations). The verdict is the receivers': each
//! delivery is said delivered if and only if its endpoint answered it with a 2xx in time, and
//! no endpoint got more POSTs for a delivery than its recorded attempts and [`EXTRA_POSTS`].
//! Every kind of fault the run injects must have fired, each host is crashed twice, and the
//! first crash must have caught the 150-subscription event's ingest (its client sent it
//! again). The suite prints its figures: events, faults by kind, lost, early deaths and
//! retries, the receivers' verdict, POSTs received against attempts recorded, and the time to
//! drain.

mod aws_support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use hookwise_core::ports::DeliveryTask;
use hookwise_tests::fault_proxy::{FaultKind, FaultPlan, FaultProxy, Service};
use hookwise_tests::{hookwise_bin, spawn_until_ready, Api, TempDir};
use serde_json::{json, Value};

const API_KEY: &str = "hwk_chaos_suite_key_0123456789abcdef";
const OWNER: &str = "owner@chaos.example";
/// Five attempts, a few seconds apart: a schedule the suite can exhaust.
const SCHEDULE: [u64; 4] = [2, 3, 3, 4];
/// From a delivery's first attempt to its last (no jitter, not adaptive).
const SCHEDULE_SPAN: Duration = Duration::from_secs(2 + 3 + 3 + 4);
const TIMEOUT_MS: u64 = 1000;
const ORDER_EVENTS: usize = 40;
const FAN_OUT: usize = 150;
const DRAIN: Duration = Duration::from_secs(240);
/// The owner's digest window: at most one email per this long.
const DIGEST_WINDOW: Duration = Duration::from_secs(5);
/// POSTs a delivery may get beyond its recorded attempts: a SIGKILL between a POST and its
/// record (two in a run), the duplicated messages sent beside the real ones (two of an
/// attempt), and a message SQS sends twice (a lost answer to its send) or hands out again
/// (its visibility timeout passing under the injected latency), each of which can cost one;
/// locally, a message the injector hands out again or early (which goes back to arrive at
/// its time, perhaps beside another copy), or an attempt's record whose answer it loses,
/// likewise.
const EXTRA_POSTS: u64 = 6;
/// How long the faults go on after the last event was accepted: longer than a schedule.
const FAULT_PHASE: Duration = Duration::from_secs(25);

// ---------------------------------------------------------------------------------------
// Endpoints

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Behaviour {
    Steady,
    /// Every third POST fails with 500, but no message's third or later: flaky, never down,
    /// so each of its deliveries arrives within its schedule. (Every third POST alone can
    /// land on one message five times running, and kill it.)
    Flaky,
    /// Slower than the subscription's timeout for the first seconds of the run.
    Slow,
    /// Drops every connection for the first seconds of the run.
    DownThenUp,
    /// The first POST of each message is 429 with `Retry-After: 1`.
    RateLimited,
    /// Always 500: its deliveries go dead once their schedule is spent.
    AlwaysFails,
}

const BEHAVIOURS: [Behaviour; 6] = [
    Behaviour::Steady,
    Behaviour::Flaky,
    Behaviour::Slow,
    Behaviour::DownThenUp,
    Behaviour::RateLimited,
    Behaviour::AlwaysFails,
];

/// How long the slow and the down endpoint misbehave: less than a schedule's span (12 s
/// of delays), so a delivery that dies there died early.
const BAD_SPELL: Duration = Duration::from_secs(8);

/// The slow and the down endpoint misbehave for [`BAD_SPELL`] from the first request they
/// get, whenever the host gets round to it.
#[derive(Clone, Default)]
struct BadSpell(Arc<Mutex<Option<Instant>>>);

impl BadSpell {
    /// Called on each request: is it still on?
    fn on(&self) -> bool {
        self.0.lock().unwrap().get_or_insert_with(Instant::now).elapsed() < BAD_SPELL
    }

    /// What is left of it, once it has started.
    fn left(&self) -> Option<Duration> {
        self.0
            .lock()
            .unwrap()
            .map(|start| BAD_SPELL.saturating_sub(start.elapsed()))
    }
}

#[derive(Default)]
struct Hits {
    posts: AtomicU64,
    /// Connections the down endpoint dropped: attempts that never became a POST.
    dropped: AtomicU64,
    /// POSTs by path and `webhook-id` (a delivery: each subscription has its own path).
    by_message: Mutex<HashMap<Key, u64>>,
    /// The deliveries (path, `webhook-id`) answered with a 2xx in the subscription's time.
    answered: Mutex<std::collections::HashSet<Key>>,
    /// When each delivery's POSTs came, for the report on one that went wrong.
    times: Mutex<HashMap<Key, Vec<chrono::DateTime<chrono::Utc>>>>,
}

/// A delivery as its endpoint sees it: the path and the `webhook-id`.
type Key = (String, String);

struct Endpoint {
    behaviour: Behaviour,
    addr: SocketAddr,
    hits: Arc<Hits>,
}

impl Endpoint {
    async fn start(behaviour: Behaviour) -> Self {
        let spell = BadSpell::default();
        let hits = Arc::new(Hits::default());
        let (h, bad) = (hits.clone(), spell.clone());
        let app = axum::Router::new().fallback(move |uri: axum::http::Uri, headers: HeaderMap, _body: Bytes| {
            let (h, bad) = (h.clone(), bad.clone());
            async move {
                let n = h.posts.fetch_add(1, Ordering::SeqCst);
                let id = headers
                    .get("webhook-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let delivery = (uri.path().to_owned(), id);
                h.times
                    .lock()
                    .unwrap()
                    .entry(delivery.clone())
                    .or_default()
                    .push(chrono::Utc::now());
                let seen = {
                    let mut by = h.by_message.lock().unwrap();
                    let c = by.entry(delivery.clone()).or_default();
                    *c += 1;
                    *c
                };
                let bad_spell = behaviour == Behaviour::Slow && bad.on();
                match behaviour {
                    Behaviour::Flaky if n % 3 == 2 && seen <= 2 => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    // A 200 after the subscription's timeout: the sender gave up before it.
                    Behaviour::Slow if bad_spell => {
                        tokio::time::sleep(Duration::from_millis(TIMEOUT_MS + 500)).await;
                        StatusCode::OK.into_response()
                    }
                    Behaviour::RateLimited if seen == 1 => {
                        (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "slow down").into_response()
                    }
                    Behaviour::AlwaysFails => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    _ => {
                        h.answered.lock().unwrap().insert(delivery);
                        StatusCode::OK.into_response()
                    }
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let h = hits.clone();
        let spell = spell.clone();
        tokio::spawn(async move {
            if behaviour == Behaviour::DownThenUp {
                // Down: every connection is accepted and dropped before a byte is read,
                // from the first until the spell is over; then served.
                loop {
                    let accepted = match spell.left() {
                        None => listener.accept().await,
                        Some(left) => match tokio::time::timeout(left, listener.accept()).await {
                            Ok(accepted) => accepted,
                            Err(_) => break,
                        },
                    };
                    let Ok((socket, _)) = accepted else {
                        continue;
                    };
                    spell.on();
                    drop(socket);
                    h.dropped.fetch_add(1, Ordering::SeqCst);
                }
            }
            axum::serve(listener, app).await.unwrap()
        });
        Self { behaviour, addr, hits }
    }
}

// ---------------------------------------------------------------------------------------
// Hosts

/// Where `hookwise dev` runs and how it is reached.
struct Host {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    /// Flags every start adds from now on (the local backend's `--faults`).
    extra: Vec<String>,
    env: Vec<(String, String)>,
    kills: u32,
}

impl Host {
    fn new(args: Vec<String>, env: Vec<(String, String)>) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self {
            child: None,
            port,
            args,
            extra: Vec::new(),
            env,
            kills: 0,
        }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn api(&self) -> Api {
        Api {
            base: self.base(),
            key: API_KEY.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    /// Start (again) on the same port, and wait for the ready line.
    fn start(&mut self) {
        let extra = self.extra.clone();
        self.start_with(&extra);
    }

    /// [`start`](Self::start), with `extra` for this start instead of [`Host::extra`].
    fn start_with(&mut self, extra: &[String]) {
        let mut command = Command::new(hookwise_bin());
        command
            .args(["dev", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--scheduler-interval", "1", "--owner-email", OWNER])
            .args(["--digest-window", &DIGEST_WINDOW.as_secs().to_string()])
            .args(&self.args)
            .args(extra)
            .envs(self.env.iter().cloned())
            .env("HOOKWISE_API_KEY", API_KEY)
            .env("HOOKWISE_LOG", "warn");
        let child = spawn_until_ready(&mut command, |line| line.contains("listening on"));
        self.child = Some(child);
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("the host runs").id()
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill -9");
            child.wait().expect("reaped");
            self.kills += 1;
        }
    }

    /// Stop it as an operator does (SIGTERM), not a crash, and wait for it.
    async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM");
        let start = Instant::now();
        while child.try_wait().expect("wait").is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "hookwise dev did not stop on SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stop, then start with `extra` from now on.
    async fn restart(&mut self, extra: Vec<String>) {
        self.stop().await;
        self.extra = extra;
        self.start();
    }

    /// Wait for the armed crash (`Backend::arm_ingest_crash`): the host dies by itself, and it
    /// counts as a kill. How it died.
    async fn crashed(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("the host runs");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                self.kills += 1;
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the armed crash never came: the host still runs after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What differs between the backends: faults, extra messages, and where emails land.
trait Backend {
    /// Faults on, or off for the drain (the local host restarts with or without them).
    async fn faults(&self, on: bool, host: &mut Host);
    /// Arm the first crash, to land in the middle of the 150-subscription ingest about to
    /// be sent: the host dies after a count of writes from now (then [`Host::crashed`]).
    async fn arm_ingest_crash(&self, host: &mut Host);
    /// Duplicated, stale and early copies of the messages for these deliveries.
    async fn inject_messages(&self, deliveries: &[Value]) -> usize;
    /// The text of every dead-delivery email sent so far.
    async fn emails(&self) -> Vec<String>;
    fn fault_figures(&self) -> String;
    /// The kinds of fault the run was to inject that never fired.
    fn faults_never_fired(&self) -> Vec<String>;
    /// The faults injected on one delivery's messages, where the backend knows them.
    fn faults_on(&self, delivery_id: &str) -> Vec<String>;
}

struct Local {
    data_dir: TempDir,
}

/// Copies of a delivery's messages beside the real ones (its JSON from the API): the attempt
/// it waits for, twice (one of them early, if its retry is not due yet); one it made
/// already (stale); one far ahead (early, for an attempt not made yet).
fn injected_copies(d: &Value) -> Vec<DeliveryTask> {
    let delivery_id = hookwise_core::model::DeliveryId::parse(d["id"].as_str().unwrap()).unwrap();
    let attempt = d["attempt_count"].as_u64().unwrap() as u32;
    let round = d["round"].as_u64().unwrap() as u32;
    [attempt + 1, attempt + 1, attempt.max(1), attempt + 4]
        .into_iter()
        .map(|attempt| DeliveryTask {
            delivery_id: delivery_id.clone(),
            round,
            attempt,
            queued_at: None,
            slot: None,
            tenant_id: None,
            held_until: None,
            redrives: 0,
        })
        .collect()
}

/// The local host's faults (`hookwise dev --faults`, hookwise-local's `faults` module): the
/// store's and queues' calls fail before they run or lose their answer after they commit,
/// and received messages come again (duplicates) or before their time (early: a delivery's
/// attempt is never made before its schedule's time, whatever message carries it). Every
/// kind fires several times a run and the run still converges.
const LOCAL_FAULTS: &str = "seed=11,call-error=0.02,lost-answer=0.02,duplicate=0.05,early=0.05";
/// The first crash: right after the commit of the first call that writes this many rows.
/// The 150-subscription event's ingest writes about 300 rows in one call; no other call of
/// the run writes more than a few dozen.
const ABORT_AFTER_ROWS: u64 = 150;
/// The kinds [`LOCAL_FAULTS`] and the crash inject, as `faults.log` names them.
const LOCAL_FAULT_KINDS: [&str; 5] = ["call-error", "lost-answer", "duplicate", "early", "abort"];

impl Local {
    /// `<data-dir>/faults.log`: one line, `<kind> <call>`, per fault fired, over every run.
    fn fault_log(&self) -> Vec<(String, String)> {
        let text = std::fs::read_to_string(self.data_dir.0.join("faults.log")).unwrap_or_default();
        text.lines()
            .map(|line| {
                let (kind, call) = line.split_once(' ').unwrap_or((line, ""));
                (kind.to_owned(), call.to_owned())
            })
            .collect()
    }

    fn fault_counts(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for (kind, _) in self.fault_log() {
            *counts.entry(kind).or_default() += 1;
        }
        counts
    }
}

fn faults_flag(spec: &str) -> Vec<String> {
    vec!["--faults".into(), spec.into()]
}

impl Backend for Local {
    async fn faults(&self, on: bool, host: &mut Host) {
        host.restart(if on { faults_flag(LOCAL_FAULTS) } else { Vec::new() })
            .await;
    }
    async fn arm_ingest_crash(&self, host: &mut Host) {
        // This start only; the one after the crash has the faults without it.
        host.stop().await;
        host.start_with(&faults_flag(&format!(
            "{LOCAL_FAULTS},abort-after-rows={ABORT_AFTER_ROWS}"
        )));
    }
    async fn inject_messages(&self, deliveries: &[Value]) -> usize {
        // Into the running host's queue, through the database file it shares.
        let backend = hookwise_local::LocalBackend::open(&self.data_dir.0).expect("the host's data dir");
        let tasks: Vec<(DeliveryTask, u32)> = deliveries.iter().flat_map(injected_copies).map(|t| (t, 0)).collect();
        hookwise_core::ports::DeliveryQueue::enqueue(&backend, &tasks)
            .await
            .expect("inject messages");
        tasks.len()
    }
    async fn emails(&self) -> Vec<String> {
        let dir = self.data_dir.0.join("outbox");
        let mut texts = Vec::new();
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.path().extension().is_some_and(|e| e == "eml") {
                texts.push(std::fs::read_to_string(entry.path()).expect("eml"));
            }
        }
        texts
    }
    fn fault_figures(&self) -> String {
        let counts = self.fault_counts();
        let mut text = format!("  {LOCAL_FAULTS}\n");
        for kind in LOCAL_FAULT_KINDS {
            text += &format!("  {kind:<12} {:>6}\n", counts.get(kind).copied().unwrap_or(0));
        }
        for (_, call) in self.fault_log().iter().filter(|(kind, _)| kind == "abort") {
            text += &format!("  the abort came {call}\n");
        }
        text
    }
    fn faults_on(&self, delivery_id: &str) -> Vec<String> {
        self.fault_log()
            .into_iter()
            .filter(|(_, call)| call.contains(delivery_id))
            .map(|(kind, call)| format!("{kind} {call}"))
            .collect()
    }
    fn faults_never_fired(&self) -> Vec<String> {
        let counts = self.fault_counts();
        LOCAL_FAULT_KINDS
            .iter()
            .filter(|kind| !counts.contains_key(**kind))
            .map(|kind| kind.to_string())
            .collect()
    }
}

struct Aws {
    env: aws_support::AwsEnv,
    /// For the test's own messages, past the faults.
    sqs: aws_sdk_sqs::Client,
    dynamodb: FaultProxy,
    moto: FaultProxy,
    plan: FaultPlan,
}

impl Aws {
    async fn new() -> Option<Self> {
        let env = aws_support::AwsEnv::new("chaos", None).await?;
        // A short visibility timeout, so messages a killed process held come back soon.
        for url in [
            &env.provisioned.delivery_queue_url,
            &env.provisioned.dead_letter_queue_url,
        ] {
            env.clients
                .sqs
                .set_queue_attributes()
                .queue_url(url)
                .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "5")
                .send()
                .await
                .expect("visibility timeout");
        }
        let plan = FaultPlan::none()
            .seed(11)
            .throttle(Service::DynamoDb, 0.04)
            .server_error(Service::DynamoDb, 0.02)
            .lost_response(Service::DynamoDb, 0.02)
            .latency(Service::DynamoDb, 0.10)
            .throttle(Service::Sqs, 0.04)
            .server_error(Service::Sqs, 0.02)
            .lost_response(Service::Sqs, 0.02)
            .latency(Service::Sqs, 0.10)
            // An email whose answer is lost is sent twice: SES has no idempotency key. Only
            // faults that stop the email before it is sent keep "exactly one notice" true.
            .throttle(Service::Ses, 0.30)
            .server_error(Service::Ses, 0.20)
            // A run sends a few emails: the first two are sure to fail, each through the SDK's
            // three tries, one throttled and one with 5xx.
            .first(
                Service::Ses,
                &[
                    FaultKind::Throttle,
                    FaultKind::Throttle,
                    FaultKind::Throttle,
                    FaultKind::ServerError,
                    FaultKind::ServerError,
                    FaultKind::ServerError,
                ],
            )
            .latency_range(Duration::from_millis(20)..=Duration::from_millis(300));
        let dynamodb = FaultProxy::start(&env.dynamodb_url, FaultPlan::none()).await;
        let moto = FaultProxy::start(&env.moto_url, FaultPlan::none()).await;
        Some(Self {
            sqs: aws_support::patient_sqs(&env.clients),
            env,
            dynamodb,
            moto,
            plan,
        })
    }

    fn host_env(&self) -> Vec<(String, String)> {
        let mut vars = self.env.function_env(900);
        for (k, v) in vars.iter_mut() {
            match k.as_str() {
                "AWS_ENDPOINT_URL" => *v = self.moto.url(),
                "AWS_ENDPOINT_URL_DYNAMODB" => *v = self.dynamodb.url(),
                _ => {}
            }
        }
        vars
    }
}

/// The first crash on the AWS path: after this many DynamoDB writes (puts) from the events'
/// sending. The 150-subscription event alone takes 151 puts, so the crash lands in the middle
/// of its ingest, whatever the order events' puts around it.
const KILL_AFTER_WRITES: u64 = 60;

impl Backend for Aws {
    async fn arm_ingest_crash(&self, host: &mut Host) {
        let pid = host.pid().to_string();
        // kill -9 right there, before the proxy answers that write.
        self.dynamodb.after_writes(KILL_AFTER_WRITES, move || {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        });
    }
    async fn faults(&self, on: bool, _host: &mut Host) {
        if on {
            self.dynamodb.set_plan(self.plan.clone());
            self.moto.set_plan(self.plan.clone());
        } else {
            // SES's stay on to the end: most emails go out while the rest drains.
            self.dynamodb.set_plan(FaultPlan::none());
            self.moto.set_plan(FaultPlan {
                sqs: Default::default(),
                ..self.plan.clone()
            });
        }
    }

    async fn inject_messages(&self, deliveries: &[Value]) -> usize {
        let mut sent = 0;
        for d in deliveries {
            for task in injected_copies(d) {
                self.sqs
                    .send_message()
                    .queue_url(&self.env.provisioned.delivery_queue_url)
                    .message_body(hookwise_aws::encode_task(&task))
                    .send()
                    .await
                    .expect("inject a message");
                sent += 1;
            }
        }
        sent
    }

    async fn emails(&self) -> Vec<String> {
        aws_support::moto_mail_to(&self.env.moto_url, OWNER)
            .await
            .iter()
            .map(Value::to_string)
            .collect()
    }

    fn fault_figures(&self) -> String {
        format!(
            "  DynamoDB Local:\n{}  moto (SQS, SES v2):\n{}",
            indent(&self.dynamodb.stats().to_string()),
            indent(&self.moto.stats().to_string())
        )
    }
    fn faults_on(&self, _delivery_id: &str) -> Vec<String> {
        Vec::new() // the proxy sees requests, not deliveries
    }
    fn faults_never_fired(&self) -> Vec<String> {
        let (dynamodb, moto) = (self.dynamodb.stats(), self.moto.stats());
        let mut never = Vec::new();
        for (service, stats, kinds) in [
            (Service::DynamoDb, &dynamodb, &FaultKind::ALL[..]),
            (Service::Sqs, &moto, &FaultKind::ALL[..]),
            // Only what stops an email before it is sent (see the plan).
            (Service::Ses, &moto, &[FaultKind::Throttle, FaultKind::ServerError][..]),
        ] {
            never.extend(
                kinds
                    .iter()
                    .filter(|kind| stats.faults(service, **kind) == 0)
                    .map(|kind| format!("{service:?} {kind:?}")),
            );
        }
        never
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

// ---------------------------------------------------------------------------------------
// The run

/// POST an event until the API answers it (202, or 200 for a repeat), through crashes and
/// restarts; `None` if it never accepts it.
async fn send_until_accepted(api: Api, body: Value, key: String) -> (Option<Value>, u32) {
    let start = Instant::now();
    let mut tries = 0;
    while start.elapsed() < Duration::from_secs(120) {
        tries += 1;
        let sent = api
            .http
            .post(format!("{}/v1/events", api.base))
            .bearer_auth(&api.key)
            .header("idempotency-key", &key)
            .json(&body)
            .send()
            .await;
        if let Ok(resp) = sent {
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            match status {
                200 | 202 => return (serde_json::from_str(&text).ok(), tries),
                400..=499 if status != 408 && status != 429 => panic!("the API refused an event: {status} {text}"),
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (None, tries)
}

async fn wait_ready(api: &Api) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if let Ok(r) = api
            .http
            .get(format!("{}/v1/subscriptions", api.base))
            .bearer_auth(&api.key)
            .send()
            .await
        {
            if r.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("hookwise dev did not answer within 60 s");
}

/// Retry a read through faults (a 5xx from the API under injected errors is expected).
async fn get_ok(api: &Api, path: &str) -> Value {
    for _ in 0..50 {
        if let Ok(r) = api
            .http
            .get(format!("{}{path}", api.base))
            .bearer_auth(&api.key)
            .send()
            .await
        {
            if r.status().is_success() {
                return r.json().await.expect("JSON");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("GET {path} never succeeded");
}

async fn subscribe(api: &Api, url: String, types: &str) -> String {
    let body = json!({
        "url": url,
        "event_types": [types],
        "retry_policy": {"schedule_seconds": SCHEDULE},
        "timeout_ms": TIMEOUT_MS,
    });
    for _ in 0..50 {
        let (status, sub) = api.post("/v1/subscriptions", body.clone()).await;
        if status == 201 {
            return sub["id"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("could not subscribe {url}");
}

struct Figures {
    events: usize,
    deliveries: usize,
    delivered: usize,
    dead: usize,
    lost: usize,
    /// Said delivered, but its endpoint never answered it with a 2xx in time.
    delivered_unanswered: usize,
    /// Answered with a 2xx in time, but not said delivered.
    answered_undelivered: usize,
    /// Deliveries whose endpoint got more POSTs than their attempts and [`EXTRA_POSTS`], and
    /// the most any got beyond its attempts.
    over_posted: usize,
    most_extra_posts: u64,
    /// Dead with other than their schedule's attempts.
    dead_off_schedule: usize,
    early_deaths: usize,
    /// Retries made sooner after the attempt before them than the schedule says.
    early_retries: usize,
    /// 2xx attempts made by a copy of the message of the failed attempt before them, handled
    /// at the same time, the 2xx recorded over the failure ([`RetryGaps::alongside`]).
    alongside: usize,
    notices_missing: usize,
    notices_repeated: usize,
    posts: u64,
    dropped: u64,
    attempts: u64,
    injected_messages: usize,
    kills: u32,
    /// How often the client sent the 150-subscription event: more than once if the first
    /// crash caught its ingest.
    bulk_tries: u32,
    drain: Duration,
    /// Emails to the owner, and how long the run took from the first event on.
    emails: usize,
    run: Duration,
}

async fn run(name: &str, backend: &impl Backend, host: &mut Host) -> Figures {
    let mut endpoints = Vec::new();
    for b in BEHAVIOURS {
        endpoints.push(Endpoint::start(b).await);
    }
    let bulk = Endpoint::start(Behaviour::Steady).await;

    host.start();
    let run_start = Instant::now();
    let api = host.api();
    wait_ready(&api).await;
    let mut behaviour_of: HashMap<String, Behaviour> = HashMap::new();
    // Each subscription's receiver and path: what it received is the verdict.
    let mut receiver_of: HashMap<String, (Arc<Hits>, String)> = HashMap::new();
    for e in &endpoints {
        let id = subscribe(&api, format!("http://{}/hook", e.addr), "order.*").await;
        behaviour_of.insert(id.clone(), e.behaviour);
        receiver_of.insert(id, (e.hits.clone(), "/hook".into()));
    }
    for i in 0..FAN_OUT {
        let path = format!("/bulk/{i}");
        let id = subscribe(&api, format!("http://{}{path}", bulk.addr), "bulk.*").await;
        behaviour_of.insert(id.clone(), Behaviour::Steady);
        receiver_of.insert(id, (bulk.hits.clone(), path));
    }
    backend.faults(true, host).await;
    backend.arm_ingest_crash(host).await;

    // Events in, concurrently, with two crashes: one during a 150-subscription ingest (after
    // a count of writes: see `arm_ingest_crash`), one while deliveries are in flight.
    let send = |i: usize, kind: &str| {
        let api = api.clone();
        let body = json!({"type": format!("{kind}.created"), "payload": {"n": i}});
        let key = format!("{name}-{kind}-{i}");
        (key.clone(), tokio::spawn(send_until_accepted(api, body, key)))
    };
    let mut sending = vec![send(0, "bulk")];
    for i in 0..ORDER_EVENTS / 2 {
        sending.push(send(i, "order"));
    }
    let crash = host.crashed().await;
    host.start();
    for i in ORDER_EVENTS / 2..ORDER_EVENTS {
        sending.push(send(i, "order"));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    host.kill9();
    host.start();
    let mut accepted = Vec::new();
    let mut retried = Vec::new();
    let mut bulk_tries = 0;
    for (key, s) in sending {
        let (answer, tries) = s.await.expect("sender");
        if key == format!("{name}-bulk-0") {
            bulk_tries = tries;
        }
        if let Some(ev) = answer {
            if tries > 1 {
                retried.push(format!("{key} ({tries} tries)"));
            }
            accepted.push(ev["id"].as_str().unwrap().to_owned());
        }
    }
    // Copies of the messages for the deliveries of a few events, beside the real ones.
    let mut injected = 0;
    // (delivery, attempt) of each copy, as the check of retries' gaps needs them.
    let mut copied = HashSet::new();
    for id in accepted.iter().take(5) {
        let ev = get_ok(&api, &format!("/v1/events/{id}")).await;
        let deliveries = ev["deliveries"].as_array().unwrap();
        injected += backend.inject_messages(deliveries).await;
        // Only the copies of the attempt each delivery waited for then can make it (the
        // others are stale, or far ahead, and go back).
        for d in deliveries {
            let due = d["attempt_count"].as_u64().unwrap() as u32 + 1;
            for task in injected_copies(d).into_iter().filter(|t| t.attempt == due) {
                copied.insert((task.delivery_id.to_string(), task.attempt));
            }
        }
    }
    // Faults on through most of the schedule, the deaths and their emails included.
    tokio::time::sleep(FAULT_PHASE).await;
    backend.faults(false, host).await;

    // Drain: every delivery of every accepted event final.
    let drain_start = Instant::now();
    let mut last_report = Instant::now();
    eprintln!("chaos ({name}): faults off; so far:\n{}", backend.fault_figures());
    let events = loop {
        let mut events = Vec::new();
        let mut open = 0;
        for id in &accepted {
            let ev = get_ok(&api, &format!("/v1/events/{id}")).await;
            open += ev["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["status"] != "delivered" && d["status"] != "dead")
                .count();
            events.push(ev);
        }
        if open == 0 || drain_start.elapsed() > DRAIN {
            break events;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "chaos ({name}): {open} deliveries still open after {:.0} s of draining",
                drain_start.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let drain = drain_start.elapsed();
    // The last notices are on their way out of the dead-letter queue.
    let emails = {
        let want = events
            .iter()
            .flat_map(|e| e["deliveries"].as_array().unwrap())
            .filter(|d| d["status"] == "dead")
            .count();
        let mut emails = backend.emails().await;
        let start = Instant::now();
        while count_notices(&emails).values().filter(|n| **n > 0).count() < want && start.elapsed() < DRAIN {
            tokio::time::sleep(Duration::from_secs(1)).await;
            emails = backend.emails().await;
        }
        emails
    };
    let notices = count_notices(&emails);

    let mut f = Figures {
        events: accepted.len(),
        deliveries: 0,
        delivered: 0,
        dead: 0,
        lost: 0,
        delivered_unanswered: 0,
        answered_undelivered: 0,
        over_posted: 0,
        most_extra_posts: 0,
        dead_off_schedule: 0,
        early_deaths: 0,
        early_retries: 0,
        alongside: 0,
        notices_missing: 0,
        notices_repeated: 0,
        posts: endpoints
            .iter()
            .chain([&bulk])
            .map(|e| e.hits.posts.load(Ordering::SeqCst))
            .sum(),
        dropped: endpoints.iter().map(|e| e.hits.dropped.load(Ordering::SeqCst)).sum(),
        attempts: 0,
        injected_messages: injected,
        kills: host.kills,
        bulk_tries,
        drain,
        emails: emails.len(),
        run: run_start.elapsed(),
    };
    for ev in &events {
        let ds = ev["deliveries"].as_array().unwrap();
        let want = if ev["type"].as_str().unwrap().starts_with("bulk") {
            FAN_OUT
        } else {
            BEHAVIOURS.len()
        };
        f.lost += want.saturating_sub(ds.len());
        for d in ds {
            f.deliveries += 1;
            let attempts = d["attempt_count"].as_u64().unwrap();
            f.attempts += attempts;
            let id = d["id"].as_str().unwrap();
            // The receiver's word: answered iff delivered, and no more POSTs than attempts
            // and the bound.
            let (hits, path) = &receiver_of[d["subscription_id"].as_str().unwrap()];
            let key = (path.clone(), ev["id"].as_str().unwrap().to_owned());
            let answered = hits.answered.lock().unwrap().contains(&key);
            let posts = hits.by_message.lock().unwrap().get(&key).copied().unwrap_or(0);
            match (d["status"] == "delivered", answered) {
                (true, false) => {
                    f.delivered_unanswered += 1;
                    eprintln!(
                        "said delivered, never answered: {}",
                        story(d, hits, &key, backend, &api).await
                    );
                }
                (false, true) => {
                    f.answered_undelivered += 1;
                    eprintln!(
                        "answered, not said delivered: {}",
                        story(d, hits, &key, backend, &api).await
                    );
                }
                _ => {}
            }
            f.most_extra_posts = f.most_extra_posts.max(posts.saturating_sub(attempts));
            if posts > attempts + EXTRA_POSTS {
                f.over_posted += 1;
                eprintln!(
                    "{posts} POSTs for {attempts} attempts: {}",
                    story(d, hits, &key, backend, &api).await
                );
            }
            if attempts > 1 {
                // The attempts that had a copy of their message handed out beside it: the
                // test's own copies, and the local host's duplicate receives.
                let faults = backend.faults_on(id);
                let had_a_copy = |attempt: u32| {
                    copied.contains(&(id.to_owned(), attempt))
                        || faults
                            .iter()
                            .any(|f| f.starts_with("duplicate ") && f.ends_with(&format!(" attempt {attempt}")))
                };
                let gaps = retry_gaps(&api, d, had_a_copy).await;
                f.alongside += gaps.alongside;
                if gaps.early {
                    f.early_retries += 1;
                    eprintln!("a retry before its time: {}", story(d, hits, &key, backend, &api).await);
                }
            }
            match d["status"].as_str().unwrap() {
                "delivered" => f.delivered += 1,
                "dead" => {
                    f.dead += 1;
                    if attempts != (SCHEDULE.len() + 1) as u64 {
                        f.dead_off_schedule += 1;
                        eprintln!(
                            "dead after {attempts} attempts: {}",
                            story(d, hits, &key, backend, &api).await
                        );
                    }
                    let behaviour = behaviour_of[d["subscription_id"].as_str().unwrap()];
                    // Only the always-failing endpoint's die, and no sooner than its schedule's
                    // end.
                    if behaviour != Behaviour::AlwaysFails || lifetime(d) < SCHEDULE_SPAN {
                        f.early_deaths += 1;
                        eprintln!(
                            "early death ({behaviour:?}): {}",
                            story(d, hits, &key, backend, &api).await
                        );
                    }
                    match notices.get(id).copied().unwrap_or(0) {
                        0 => {
                            f.notices_missing += 1;
                            eprintln!("dead without a notice: {}", story(d, hits, &key, backend, &api).await);
                        }
                        1 => {}
                        _ => f.notices_repeated += 1,
                    }
                }
                other => {
                    f.lost += 1;
                    eprintln!("still {other} after the drain: {d}");
                }
            }
        }
    }
    let mut by_behaviour: BTreeMap<Behaviour, u64> = BTreeMap::new();
    for e in &endpoints {
        by_behaviour.insert(e.behaviour, e.hits.posts.load(Ordering::SeqCst));
    }
    println!(
        "chaos ({name}): {} events accepted ({} deliveries: {} delivered, {} dead), {} kill -9, {} extra queue messages\n\
         the first crash ({crash}) caught the 150-subscription ingest: sent {} times\n\
         faults injected:\n{}\
         lost: {}  early deaths: {}  retries before their time: {} (2xx copies alongside a failed attempt: {})  \
         dead without a notice: {}  with more than one: {}\n\
         by the receivers: said delivered but never answered: {}  answered but not said delivered: {}  \
         POSTs past the attempts at most: {} (bound {EXTRA_POSTS}; {} past it)\n\
         POSTs received: {} (by endpoint: {by_behaviour:?}, fan-out {}), connections dropped while down: {}\n\
         attempts recorded: {}\n\
         emails to the owner: {} in {:.0} s, with a {} s digest window\n\
         events the client had to send again (crashes, 503s): {retried:?}\n\
         time to drain after the store and queue faults stopped (SES's go on): {:.1} s",
        f.events,
        f.deliveries,
        f.delivered,
        f.dead,
        f.kills,
        f.injected_messages,
        f.bulk_tries,
        backend.fault_figures(),
        f.lost,
        f.early_deaths,
        f.early_retries,
        f.alongside,
        f.notices_missing,
        f.notices_repeated,
        f.delivered_unanswered,
        f.answered_undelivered,
        f.most_extra_posts,
        f.over_posted,
        f.posts,
        bulk.hits.posts.load(Ordering::SeqCst),
        f.dropped,
        f.attempts,
        f.emails,
        f.run.as_secs_f64(),
        DIGEST_WINDOW.as_secs(),
        f.drain.as_secs_f64(),
    );
    f
}

/// A delivery that went wrong, for the report: as the API has it, when its endpoint got its
/// POSTs and when its recorded attempts started, and the faults injected on its messages
/// (where the backend knows).
async fn story(d: &Value, hits: &Hits, key: &Key, backend: &impl Backend, api: &Api) -> String {
    let time = |v: &Value| v.as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    let created = time(&d["created_at"]);
    let after_creation = |t: chrono::DateTime<chrono::Utc>| format!("{:.2}", (t - created).as_seconds_f64());
    let posts: Vec<String> = hits
        .times
        .lock()
        .unwrap()
        .get(key)
        .into_iter()
        .flatten()
        .map(|t| after_creation(*t))
        .collect();
    let id = d["id"].as_str().unwrap();
    let detail = get_ok(api, &format!("/v1/deliveries/{id}")).await;
    let attempts: Vec<String> = detail["attempts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            format!(
                "#{} at {} for {} ms ({})",
                a["attempt"],
                after_creation(time(&a["started_at"])),
                a["duration_ms"],
                a["status_code"]
            )
        })
        .collect();
    format!(
        "{d}\n  its endpoint's POSTs, in s after its creation: {}\n  its attempts as recorded: {}\n  \
         faults on its messages: {:?}",
        posts.join(", "),
        attempts.join(", "),
        backend.faults_on(id)
    )
}

/// What the gaps between a delivery's attempts in one round show.
struct RetryGaps {
    /// A retry started sooner after the end of the attempt before it (its start and its
    /// recorded duration) than the schedule's delay, whatever message carried it: the local
    /// injector hands messages out early.
    early: bool,
    /// 2xx attempts within [`ALONGSIDE_WITHIN`] of the end of a failed attempt whose message
    /// had a copy handed out beside it (`had_a_copy`: the test's own copies, the local host's
    /// duplicate receives). Those are no retries: the copy, handled at the same time as the message,
    /// made the same attempt, and its 2xx, whose write lost to the failure's, was recorded
    /// over it as the round's next attempt (a 2xx is final).
    alongside: usize,
}

/// How soon after the end of a failed attempt a copy of its message may start the same
/// attempt: it read the delivery before the failure's write landed (a moment after that
/// end), and may then have waited up to `rate_limit::SLOT_WAIT` (a second) for its turn.
const ALONGSIDE_WITHIN: chrono::Duration = chrono::Duration::milliseconds(1_500);

async fn retry_gaps(api: &Api, d: &Value, had_a_copy: impl Fn(u32) -> bool) -> RetryGaps {
    let detail = get_ok(api, &format!("/v1/deliveries/{}", d["id"].as_str().unwrap())).await;
    let attempts = detail["attempts"].as_array().unwrap();
    let started = |a: &Value| {
        a["started_at"]
            .as_str()
            .unwrap()
            .parse::<chrono::DateTime<chrono::Utc>>()
            .unwrap()
    };
    let mut gaps = RetryGaps {
        early: false,
        alongside: 0,
    };
    for p in attempts.windows(2).filter(|p| p[0]["round"] == p[1]["round"]) {
        let attempt = p[0]["attempt"].as_u64().unwrap() as u32;
        // Past the schedule (a 2xx recorded over the last attempt's failure): no delay.
        let delay = SCHEDULE.get(attempt as usize - 1).copied().unwrap_or(0);
        let took = chrono::Duration::milliseconds(p[0]["duration_ms"].as_i64().unwrap());
        let gap = started(&p[1]) - started(&p[0]) - took;
        if delay > 0 && gap >= chrono::Duration::seconds(delay as i64) {
            continue;
        }
        match is_2xx(&p[1]) && had_a_copy(attempt) && gap < ALONGSIDE_WITHIN {
            true => gaps.alongside += 1,
            false => gaps.early = true,
        }
    }
    gaps
}

fn is_2xx(attempt: &Value) -> bool {
    attempt["status_code"]
        .as_u64()
        .is_some_and(|code| (200..300).contains(&code))
}

/// From a delivery's creation to its last change.
fn lifetime(d: &Value) -> Duration {
    let at = |field: &str| {
        d[field]
            .as_str()
            .unwrap()
            .parse::<chrono::DateTime<chrono::Utc>>()
            .unwrap()
    };
    (at("updated_at") - at("created_at")).to_std().unwrap_or_default()
}

/// How many emails name each delivery (by its replay link).
fn count_notices(emails: &[String]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for text in emails {
        for part in text.split("/v1/deliveries/").skip(1) {
            let id: String = part
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            *counts.entry(id).or_default() += 1;
        }
    }
    counts
}

fn check(f: &Figures, backend: &impl Backend) {
    assert_eq!(f.events, ORDER_EVENTS + 1, "the API never accepted some events");
    assert_eq!(f.lost, 0, "deliveries were lost");
    assert_eq!(
        f.delivered_unanswered, 0,
        "deliveries said delivered that no endpoint answered"
    );
    assert_eq!(
        f.answered_undelivered, 0,
        "deliveries an endpoint answered, not said delivered"
    );
    assert_eq!(
        f.over_posted, 0,
        "deliveries POSTed more than their attempts and {EXTRA_POSTS}"
    );
    assert_eq!(f.kills, 2, "each host is killed twice");
    assert!(
        f.bulk_tries > 1,
        "the first crash missed the 150-subscription ingest: its client sent it once"
    );
    let never = backend.faults_never_fired();
    assert!(never.is_empty(), "fault kinds that never fired: {never:?}");
    assert_eq!(f.early_deaths, 0, "deliveries died before their schedule ran out");
    assert_eq!(f.early_retries, 0, "retries made before their schedule's delay");
    assert_eq!(f.notices_missing, 0, "dead deliveries without a notice");
    assert_eq!(f.notices_repeated, 0, "dead deliveries told more than once");
    // At most one email per window: a storm of deaths is not a storm of emails.
    let windows = f.run.as_secs_f64() / DIGEST_WINDOW.as_secs_f64();
    assert!(
        f.emails as f64 <= windows.floor() + 1.0,
        "{} emails in {:.0} s: more than one per {} s window",
        f.emails,
        f.run.as_secs_f64(),
        DIGEST_WINDOW.as_secs()
    );
    assert_eq!(
        f.dead, ORDER_EVENTS,
        "the always-failing endpoint's deliveries, and only those, die"
    );
    // Every attempt of its schedule, and no more (the breaker never costs one); its POSTs
    // are held to its attempts by the receivers' count above.
    assert_eq!(
        f.dead_off_schedule, 0,
        "dead deliveries with other than their schedule's attempts"
    );
    // An attempt is recorded only after its request went out; a crash between the two
    // makes a POST with no record, never the other way round.
    assert!(
        f.posts + f.dropped >= f.attempts,
        "fewer requests arrived than attempts were recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_local() {
    let data_dir = TempDir::new("chaos");
    let backend = Local { data_dir };
    let mut host = Host::new(
        vec![
            "--data-dir".into(),
            backend.data_dir.0.display().to_string(),
            "--visibility-timeout".into(),
            "5".into(),
        ],
        Vec::new(),
    );
    let f = run("local", &backend, &mut host).await;
    check(&f, &backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_aws() {
    let Some(backend) = Aws::new().await else {
        return;
    };
    let mut host = Host::new(vec!["--aws".into()], backend.host_env());
    let f = run("aws", &backend, &mut host).await;
    check(&f, &backend);
}
