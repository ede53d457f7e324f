//! A fault-injecting HTTP proxy for chaos tests: it sits between the AWS SDK and a local
//! emulator (DynamoDB Local, moto for SQS and SES v2), forwards every request, and on a seeded
//! random plan answers some of them with the error the real service would send instead.
//!
//! Faults, per service:
//! - [`FaultKind::Throttle`]: answered without forwarding, with the service's throttling error
//!   in its real wire shape, so the SDK classifies it as throttling and retries it.
//! - [`FaultKind::ServerError`]: answered without forwarding, with the service's 5xx.
//! - [`FaultKind::LostResponse`]: forwarded (the emulator applies it), then the answer is
//!   thrown away and the 5xx returned instead: the write happened, the client thinks it failed.
//! - [`FaultKind::Latency`]: a delay before anything else happens; independent of the others.
//!
//! The error bodies follow the SDKs' own parsers (aws-sdk-* `json_errors.rs`,
//! `aws_query_compatible_errors.rs`) and the services' models; see [`fault_response`].
//! Requests that are not DynamoDB, SQS or SES v2 are forwarded untouched and never faulted.
//!
//! Determinism: one `StdRng` seeded from the plan decides every request, in the order the
//! requests arrive; a test that sends its requests one at a time sees the same faults for the
//! same seed. [`FaultProxy::set_plan`] re-seeds it.
//!
//! Recording ([`FaultProxy::record_calls`]): every request, who signed it, what it asked and
//! what it was answered, as a [`RecordedCall`]: what the least-privilege test checks against
//! the template's policies (`tests/src/iam_policy.rs`).
//!
//! A hook on writes ([`FaultProxy::after_writes`]): a callback right after the k-th DynamoDB
//! write from now has been applied, before its answer goes back; the chaos suite kills its
//! host there, in the middle of an ingest.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::request::Parts;
// By its module path: `http::StatusCode` would sort differently in rustfmt's 2021 and 2024 styles.
use axum::http::status::StatusCode;
use axum::response::Response;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// Bodies larger than this are refused (413). SES v2 raw messages may be up to 40 MB.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Which AWS service a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Service {
    DynamoDb,
    Sqs,
    Ses,
    /// KMS (the signing secrets' key): recorded, never faulted.
    Kms,
    /// Anything else: forwarded untouched, never faulted.
    Other,
}

impl Service {
    pub fn name(self) -> &'static str {
        match self {
            Service::DynamoDb => "dynamodb",
            Service::Sqs => "sqs",
            Service::Ses => "ses",
            Service::Kms => "kms",
            Service::Other => "other",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the proxy can do to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    Throttle,
    ServerError,
    LostResponse,
    Latency,
}

impl FaultKind {
    pub const ALL: [FaultKind; 4] = [
        FaultKind::Throttle,
        FaultKind::ServerError,
        FaultKind::LostResponse,
        FaultKind::Latency,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Throttle => "throttle",
            FaultKind::ServerError => "server_error",
            FaultKind::LostResponse => "lost_response",
            FaultKind::Latency => "latency",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Probabilities (0.0..=1.0) of each fault for one service. At most one of throttle,
/// server error and lost response hits a request: they share one draw, in that order, so
/// their sum should not exceed 1 (past 1 the later ones get what is left). Latency has its
/// own draw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServiceFaults {
    pub throttle: f64,
    pub server_error: f64,
    pub lost_response: f64,
    pub latency: f64,
}

impl ServiceFaults {
    fn get_mut(&mut self, kind: FaultKind) -> &mut f64 {
        match kind {
            FaultKind::Throttle => &mut self.throttle,
            FaultKind::ServerError => &mut self.server_error,
            FaultKind::LostResponse => &mut self.lost_response,
            FaultKind::Latency => &mut self.latency,
        }
    }
}

/// What to inject, per service; build it from [`FaultPlan::none`].
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    pub dynamodb: ServiceFaults,
    pub sqs: ServiceFaults,
    pub ses: ServiceFaults,
    /// The delay a latency fault adds, drawn uniformly (millisecond steps).
    pub latency: RangeInclusive<Duration>,
    /// Seed of the RNG that decides every request.
    pub seed: u64,
    /// Operations never faulted, e.g. `(Service::Sqs, "DeleteMessage")`. Operation names are
    /// the SDK's: the `X-Amz-Target` suffix for DynamoDB and SQS (or the query `Action`),
    /// and for SES v2 the names [`ses_operation`] gives (`SendEmail`, `GetAccount`, ...).
    pub spared: BTreeSet<(Service, String)>,
    /// Faults the first faultable requests of a service get, in order, whatever the draws
    /// say: a kind a service's few requests would likely all miss is sure to fire.
    pub first: BTreeMap<Service, Vec<FaultKind>>,
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self::none()
    }
}

impl FaultPlan {
    /// No faults: a faithful proxy.
    pub fn none() -> Self {
        Self {
            dynamodb: ServiceFaults::default(),
            sqs: ServiceFaults::default(),
            ses: ServiceFaults::default(),
            latency: Duration::from_millis(50)..=Duration::from_millis(400),
            seed: 0,
            spared: BTreeSet::new(),
            first: BTreeMap::new(),
        }
    }

    /// The first faultable requests of `service` get `kinds`, one each, in order.
    pub fn first(mut self, service: Service, kinds: &[FaultKind]) -> Self {
        self.first.insert(service, kinds.to_vec());
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Set the probability of `kind` for `service` (`Service::Other` is ignored).
    pub fn with(mut self, service: Service, kind: FaultKind, probability: f64) -> Self {
        if let Some(faults) = self.faults_mut(service) {
            *faults.get_mut(kind) = probability;
        }
        self
    }

    pub fn throttle(self, service: Service, probability: f64) -> Self {
        self.with(service, FaultKind::Throttle, probability)
    }

    pub fn server_error(self, service: Service, probability: f64) -> Self {
        self.with(service, FaultKind::ServerError, probability)
    }

    pub fn lost_response(self, service: Service, probability: f64) -> Self {
        self.with(service, FaultKind::LostResponse, probability)
    }

    pub fn latency(self, service: Service, probability: f64) -> Self {
        self.with(service, FaultKind::Latency, probability)
    }

    pub fn latency_range(mut self, range: RangeInclusive<Duration>) -> Self {
        self.latency = range;
        self
    }

    /// Never fault `operation` of `service`.
    pub fn spare(mut self, service: Service, operation: &str) -> Self {
        self.spared.insert((service, operation.to_owned()));
        self
    }

    pub fn faults(&self, service: Service) -> Option<&ServiceFaults> {
        match service {
            Service::DynamoDb => Some(&self.dynamodb),
            Service::Sqs => Some(&self.sqs),
            Service::Ses => Some(&self.ses),
            Service::Kms | Service::Other => None,
        }
    }

    fn faults_mut(&mut self, service: Service) -> Option<&mut ServiceFaults> {
        match service {
            Service::DynamoDb => Some(&mut self.dynamodb),
            Service::Sqs => Some(&mut self.sqs),
            Service::Ses => Some(&mut self.ses),
            Service::Kms | Service::Other => None,
        }
    }
}

/// What the proxy saw and did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Requests seen, by service (`Service::Other` included).
    pub requests: BTreeMap<Service, u64>,
    /// Faults injected, by service and kind.
    pub faults: BTreeMap<(Service, FaultKind), u64>,
    /// Forwarded requests the upstream did not answer (the client got a 502).
    pub upstream_failures: u64,
}

impl FaultStats {
    pub fn requests(&self, service: Service) -> u64 {
        self.requests.get(&service).copied().unwrap_or(0)
    }

    pub fn faults(&self, service: Service, kind: FaultKind) -> u64 {
        self.faults.get(&(service, kind)).copied().unwrap_or(0)
    }

    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }

    pub fn total_faults(&self) -> u64 {
        self.faults.values().sum()
    }
}

/// A short table, one `service what count` line for each non-zero count, then the totals:
///
/// ```text
/// dynamodb  requests        120
/// dynamodb  throttle         12
/// total     requests        120
/// total     faults           12
/// ```
impl fmt::Display for FaultStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (service, n) in &self.requests {
            writeln!(f, "{:<9} {:<13} {n:>6}", service.name(), "requests")?;
            for kind in FaultKind::ALL {
                let n = self.faults(*service, kind);
                if n > 0 {
                    writeln!(f, "{:<9} {:<13} {n:>6}", service.name(), kind.name())?;
                }
            }
        }
        if self.upstream_failures > 0 {
            writeln!(f, "{:<9} {:<13} {:>6}", "upstream", "failures", self.upstream_failures)?;
        }
        writeln!(f, "{:<9} {:<13} {:>6}", "total", "requests", self.total_requests())?;
        write!(f, "{:<9} {:<13} {:>6}", "total", "faults", self.total_faults())
    }
}

/// One request as the proxy saw it, and its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    /// The access key id it was signed with (SigV4's `Credential=`); empty if unsigned.
    pub access_key: String,
    pub service: Service,
    /// As [`FaultPlan::spared`] names operations.
    pub operation: String,
    /// Its parameters: the JSON body (DynamoDB, SQS, SES v2), or an awsQuery form as an
    /// object of strings.
    pub params: Value,
    /// The answer's status, and the error code it carried (`AccessDeniedException`, say).
    pub status: u16,
    pub error: Option<String>,
}

/// A running proxy on 127.0.0.1; dropping it (or [`FaultProxy::stop`]) stops it.
pub struct FaultProxy {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    shutdown: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl FaultProxy {
    /// Listen on 127.0.0.1:0 and forward to `upstream` (e.g. `http://127.0.0.1:8000`).
    /// Panics only if it cannot bind or build its HTTP client.
    pub async fn start(upstream: &str, plan: FaultPlan) -> FaultProxy {
        let client = reqwest::Client::builder()
            // The upstream is local: never through a proxy from the environment, and a
            // redirect goes back to the client as it came.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client");
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client,
            state: Mutex::new(Decider::new(plan)),
            next_request_id: AtomicU64::new(1),
            recorded: Mutex::new(None),
            write_hook: Mutex::new(None),
        });
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("a local address");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            // Graceful: open (keep-alive) connections are closed too, not only the listener.
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        FaultProxy {
            addr,
            shared,
            shutdown: Mutex::new(Some(tx)),
        }
    }

    /// `http://127.0.0.1:PORT`, for the SDK's endpoint URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replace the plan (e.g. with [`FaultPlan::none`] so the system can drain); re-seeds.
    pub fn set_plan(&self, plan: FaultPlan) {
        self.shared.lock().set_plan(plan);
    }

    pub fn plan(&self) -> FaultPlan {
        self.shared.lock().plan.clone()
    }

    pub fn stats(&self) -> FaultStats {
        self.shared.lock().stats.clone()
    }

    /// From now on, keep every request as a [`RecordedCall`].
    pub fn record_calls(&self) {
        self.shared.recorded().get_or_insert_with(Vec::new);
    }

    /// The requests recorded so far, in the order they were answered.
    pub fn calls(&self) -> Vec<RecordedCall> {
        self.shared.recorded().clone().unwrap_or_default()
    }

    /// Call `then` once, right after the `k`-th DynamoDB write (`PutItem`, `BatchWriteItem`,
    /// `TransactWriteItems`) forwarded from now on has been answered by the upstream (so it
    /// was applied), before that answer goes back to the client. Writes a fault stopped
    /// before the upstream are not counted. Replaces a hook set before that has not fired.
    pub fn after_writes(&self, k: u64, then: impl FnOnce() + Send + 'static) {
        *self.shared.write_hook() = Some(WriteHook {
            left: k.max(1),
            then: Box::new(then),
        });
    }

    /// Stop accepting; requests in flight finish, then their connections close.
    pub fn stop(&self) {
        let sender = self.shutdown.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = sender {
            let _ = tx.send(());
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Shared {
    upstream: String,
    client: reqwest::Client,
    state: Mutex<Decider>,
    next_request_id: AtomicU64,
    /// `Some` while recording.
    recorded: Mutex<Option<Vec<RecordedCall>>>,
    /// Armed by [`FaultProxy::after_writes`].
    write_hook: Mutex<Option<WriteHook>>,
}

/// What to do after how many more DynamoDB writes.
struct WriteHook {
    left: u64,
    then: Box<dyn FnOnce() + Send>,
}

impl Shared {
    /// Never held across an await; a poisoned lock is still usable (the state is counters).
    fn lock(&self) -> MutexGuard<'_, Decider> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recorded(&self) -> MutexGuard<'_, Option<Vec<RecordedCall>>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write_hook(&self) -> MutexGuard<'_, Option<WriteHook>> {
        self.write_hook.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `call` was forwarded and answered: if it is the armed hook's last write, run the hook
    /// (outside the lock).
    fn forwarded(&self, call: &Call) {
        if call.service != Service::DynamoDb || !dynamodb_write(&call.operation) {
            return;
        }
        let due = {
            let mut hook = self.write_hook();
            match hook.as_mut() {
                Some(h) if h.left > 1 => {
                    h.left -= 1;
                    None
                }
                Some(_) => hook.take(),
                None => None,
            }
        };
        if let Some(hook) = due {
            (hook.then)();
        }
    }

    /// Keep `call` and its answer, if recording.
    fn record(&self, parts: &Parts, body: &[u8], call: &Call, answer: &Response, answer_body: &[u8]) {
        let mut recorded = self.recorded();
        let Some(calls) = recorded.as_mut() else {
            return;
        };
        let status = answer.status();
        calls.push(RecordedCall {
            access_key: access_key(&parts.headers),
            service: call.service,
            operation: call.operation.clone(),
            params: params(call, body),
            status: status.as_u16(),
            error: (status.is_client_error() || status.is_server_error())
                .then(|| error_code(answer.headers(), answer_body))
                .flatten(),
        });
    }

    /// A request id for a synthetic answer, like the `x-amzn-RequestId` AWS sends.
    fn request_id(&self) -> String {
        let n = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        format!("FAULTPROXY{n:042}")
    }
}

/// The plan, its RNG and the counts, behind one lock.
struct Decider {
    plan: FaultPlan,
    rng: StdRng,
    stats: FaultStats,
    /// Faultable requests by service since the plan was set (for [`FaultPlan::first`]).
    since_plan: BTreeMap<Service, usize>,
}

/// What to do with one request.
#[derive(Debug, Default, PartialEq)]
struct Decision {
    fault: Option<FaultKind>,
    delay: Option<Duration>,
}

impl Decider {
    fn new(plan: FaultPlan) -> Self {
        Self {
            rng: StdRng::seed_from_u64(plan.seed),
            plan,
            stats: FaultStats::default(),
            since_plan: BTreeMap::new(),
        }
    }

    fn set_plan(&mut self, plan: FaultPlan) {
        self.rng = StdRng::seed_from_u64(plan.seed);
        self.plan = plan;
        self.since_plan.clear();
    }

    /// Count the request and decide its fate. Every faultable request takes the same three
    /// draws, so changing one probability does not shift the others' sequence.
    fn decide(&mut self, call: &Call) -> Decision {
        *self.stats.requests.entry(call.service).or_default() += 1;
        let Some(faults) = self.plan.faults(call.service).copied() else {
            return Decision::default();
        };
        if self.plan.spared.contains(&(call.service, call.operation.clone())) {
            return Decision::default();
        }
        let pick: f64 = self.rng.random();
        let slow: f64 = self.rng.random();
        let lo = self.plan.latency.start().as_millis() as u64;
        let hi = (self.plan.latency.end().as_millis() as u64).max(lo);
        let delay_ms = self.rng.random_range(lo..=hi);

        let mut fault = if pick < faults.throttle {
            Some(FaultKind::Throttle)
        } else if pick < faults.throttle + faults.server_error {
            Some(FaultKind::ServerError)
        } else if pick < faults.throttle + faults.server_error + faults.lost_response {
            Some(FaultKind::LostResponse)
        } else {
            None
        };
        let mut delay = (slow < faults.latency).then(|| Duration::from_millis(delay_ms));
        let nth = self.since_plan.entry(call.service).or_default();
        let scripted = self
            .plan
            .first
            .get(&call.service)
            .and_then(|kinds| kinds.get(*nth))
            .copied();
        *nth += 1;
        match scripted {
            Some(FaultKind::Latency) => delay = Some(Duration::from_millis(delay_ms)),
            Some(kind) => fault = Some(kind),
            None => {}
        }
        if delay.is_some() {
            self.count(call.service, FaultKind::Latency);
        }
        Decision { fault, delay }
    }

    fn count(&mut self, service: Service, kind: FaultKind) {
        *self.stats.faults.entry((service, kind)).or_default() += 1;
    }
}

/// How a request speaks: the error answer must be in the same protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// awsJson1_0 (DynamoDB).
    AwsJson,
    /// awsJson1_0 with `@awsQueryCompatible` (SQS since aws-sdk-sqs 1.x moved off XML).
    SqsJson,
    /// The older awsQuery protocol: form body in, XML out.
    SqsQuery,
    /// restJson1 (SES v2).
    RestJson,
    /// Not an AWS service we fault.
    Other,
}

/// A classified request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    service: Service,
    operation: String,
    protocol: Protocol,
}

fn classify(parts: &Parts, body: &[u8]) -> Call {
    let target = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Some(op) = target.strip_prefix("DynamoDB_20120810.") {
        return Call {
            service: Service::DynamoDb,
            operation: op.to_owned(),
            protocol: Protocol::AwsJson,
        };
    }
    if let Some(op) = target.strip_prefix("AmazonSQS.") {
        return Call {
            service: Service::Sqs,
            operation: op.to_owned(),
            protocol: Protocol::SqsJson,
        };
    }
    if let Some(op) = target.strip_prefix("TrentService.") {
        return Call {
            service: Service::Kms,
            operation: op.to_owned(),
            protocol: Protocol::Other,
        };
    }
    let path = parts.uri.path();
    if path.starts_with("/v2/email/") {
        return Call {
            service: Service::Ses,
            operation: ses_operation(parts.method.as_str(), path),
            protocol: Protocol::RestJson,
        };
    }
    if let Some(op) = sqs_query_action(parts, body) {
        return Call {
            service: Service::Sqs,
            operation: op,
            protocol: Protocol::SqsQuery,
        };
    }
    Call {
        service: Service::Other,
        operation: path.to_owned(),
        protocol: Protocol::Other,
    }
}

/// The `Action` of an awsQuery request (form body, or query string for GET) when it is for
/// SQS: its `Version` is SQS's 2012-11-05, or it has none. Other query services (SES v1, STS,
/// SNS) send their own versions and are left alone.
fn sqs_query_action(parts: &Parts, body: &[u8]) -> Option<String> {
    let is_form = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let params = if is_form {
        std::str::from_utf8(body).ok()?
    } else {
        parts.uri.query()?
    };
    let value = |name: &str| {
        params
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
    };
    let action = value("Action").filter(|a| !a.is_empty())?;
    match value("Version") {
        None | Some("2012-11-05") => Some(action.to_owned()),
        Some(_) => None,
    }
}

/// SES v2 (restJson1) has no operation header; name the calls Hookwise makes as the SDK
/// does, the rest `"{METHOD} {path}"`.
pub fn ses_operation(method: &str, path: &str) -> String {
    let rest = path.trim_start_matches("/v2/email/").trim_end_matches('/');
    let name = match (method, rest) {
        ("POST", "outbound-emails") => "SendEmail",
        ("POST", "outbound-bulk-emails") => "SendBulkEmail",
        ("GET", "account") => "GetAccount",
        ("POST", "identities") => "CreateEmailIdentity",
        ("GET", "identities") => "ListEmailIdentities",
        ("GET", r) if r.starts_with("identities/") => "GetEmailIdentity",
        ("DELETE", r) if r.starts_with("identities/") => "DeleteEmailIdentity",
        _ => return format!("{method} {path}"),
    };
    name.to_owned()
}

/// DynamoDB's data-plane operations: the ones whose model lists
/// `ProvisionedThroughputExceededException` (aws-sdk-dynamodb 1.136 `protocol_serde`).
/// The control plane (DescribeTable, CreateTable, ...) is throttled with Coral's
/// `ThrottlingException` instead.
fn dynamodb_data_plane(operation: &str) -> bool {
    matches!(
        operation,
        "GetItem"
            | "PutItem"
            | "UpdateItem"
            | "DeleteItem"
            | "Query"
            | "Scan"
            | "BatchGetItem"
            | "BatchWriteItem"
            | "TransactGetItems"
            | "TransactWriteItems"
            | "ExecuteStatement"
            | "BatchExecuteStatement"
            | "ExecuteTransaction"
    )
}

/// The DynamoDB operations that write items, as [`FaultProxy::after_writes`] counts them.
fn dynamodb_write(operation: &str) -> bool {
    matches!(operation, "PutItem" | "BatchWriteItem" | "TransactWriteItems")
}

/// The answer the real service gives for a throttle or a 5xx (`kind` is Throttle, or
/// anything else for the 5xx), in the request's protocol.
///
/// How the SDK reads them (aws-sdk-{dynamodb,sqs,sesv2} `src/json_errors.rs`
/// `parse_error_metadata`): the code is the `x-amzn-errortype` header, else the body's
/// `code`, else its `__type`, cut at the first `:` and after the `#`. SQS, being
/// `@awsQueryCompatible`, then lets `x-amzn-query-error: Code;Type` override it
/// (aws-sdk-sqs `src/aws_query_compatible_errors.rs`, `src/protocol_serde.rs`). The code
/// decides retries: aws-runtime `src/retries/classifiers.rs` `THROTTLING_ERRORS` has
/// `ProvisionedThroughputExceededException`, `ThrottlingException`, `RequestThrottled` and
/// `TooManyRequestsException`; aws-smithy-runtime `src/client/retries/classifiers.rs`
/// `TRANSIENT_ERROR_STATUS_CODES` retries any 500/502/503/504.
fn fault_response(call: &Call, kind: FaultKind, request_id: &str) -> Response {
    let throttle = kind == FaultKind::Throttle;
    match call.protocol {
        Protocol::AwsJson => {
            let (status, body) = match (throttle, dynamodb_data_plane(&call.operation)) {
                (true, true) => (
                    StatusCode::BAD_REQUEST,
                    r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API."}"#,
                ),
                (true, false) => (
                    StatusCode::BAD_REQUEST,
                    r#"{"__type":"com.amazon.coral.availability#ThrottlingException","message":"Rate exceeded"}"#,
                ),
                (false, _) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"Internal server error"}"#,
                ),
            };
            // (Real answers also carry `x-amz-crc32`; no client requires it, the Rust SDK
            // does not read it.)
            answer(status, "application/x-amz-json-1.0", body, request_id)
        }
        Protocol::SqsJson => {
            // The model: RequestThrottled is @httpError(403) with
            // @awsQueryError(code: "RequestThrottled", httpResponseCode: 403). SQS has no
            // modelled 5xx; the AWS-wide one is Coral's InternalFailure (HTTP 500).
            let (status, query_error, body) = if throttle {
                (
                    StatusCode::FORBIDDEN,
                    "RequestThrottled;Sender",
                    r#"{"__type":"com.amazonaws.sqs#RequestThrottled","message":"Request is throttled."}"#,
                )
            } else {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalFailure;Receiver",
                    r#"{"__type":"com.amazon.coral.service#InternalFailure","message":"We encountered an internal error. Please try again."}"#,
                )
            };
            let mut resp = answer(status, "application/x-amz-json-1.0", body, request_id);
            insert(&mut resp, "x-amzn-query-error", query_error);
            resp
        }
        Protocol::SqsQuery => {
            let (status, fault, code, message) = if throttle {
                (
                    StatusCode::FORBIDDEN,
                    "Sender",
                    "RequestThrottled",
                    "Request is throttled.",
                )
            } else {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Receiver",
                    "InternalFailure",
                    "We encountered an internal error. Please try again.",
                )
            };
            let body = format!(
                "<?xml version=\"1.0\"?><ErrorResponse xmlns=\"http://queue.amazonaws.com/doc/2012-11-05/\">\
                 <Error><Type>{fault}</Type><Code>{code}</Code><Message>{message}</Message><Detail/></Error>\
                 <RequestId>{request_id}</RequestId></ErrorResponse>"
            );
            answer(status, "text/xml", &body, request_id)
        }
        Protocol::RestJson => {
            // The SES v2 model: TooManyRequestsException @httpError(429),
            // InternalServiceErrorException @httpError(500); restJson1 names the error in
            // the x-amzn-ErrorType header.
            let (status, error_type, body) = if throttle {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyRequestsException",
                    r#"{"message":"Too many requests have been made to the operation."}"#,
                )
            } else {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalServiceErrorException",
                    r#"{"message":"The request couldn't be processed because an error occurred with the Amazon SES API v2."}"#,
                )
            };
            let mut resp = answer(status, "application/json", body, request_id);
            insert(&mut resp, "x-amzn-ErrorType", error_type);
            resp
        }
        // Never faulted; here only so the match is total.
        Protocol::Other => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "fault proxy: no fault for this request",
        ),
    }
}

fn answer(status: StatusCode, content_type: &'static str, body: &str, request_id: &str) -> Response {
    let mut resp = Response::new(Body::from(body.to_owned()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    insert(&mut resp, "x-amzn-RequestId", request_id);
    resp
}

/// Add a header (HTTP/1 sends names in lower case anyway); one that is not valid (never, for
/// ours) is skipped.
fn insert(resp: &mut Response, name: &str, value: &str) {
    if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
        resp.headers_mut().insert(name, value);
    }
}

fn plain(status: StatusCode, text: &str) -> Response {
    let mut resp = Response::new(Body::from(text.to_owned()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus the one
/// the HTTP stack sets itself from the new message (`content-length`). `host` goes through
/// as the client sent it: SigV4 signs it, and moto enforcing IAM checks the signature.
fn hop_by_hop(name: &HeaderName, connection_listed: &[String]) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "expect"
    ) || connection_listed.iter().any(|c| c == name.as_str())
}

/// The end-to-end headers of `headers`, in order, duplicates kept.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let listed: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !hop_by_hop(name, &listed) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// The one handler: every method, every path.
async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            let text = format!("fault proxy: reading the body: {e}");
            return plain(StatusCode::PAYLOAD_TOO_LARGE, &text);
        }
    };
    let call = classify(&parts, &body);
    let answer = respond(&shared, &parts, body.clone(), &call).await;
    if shared.recorded().is_none() {
        return answer;
    }
    // Every answer is whole in memory already: reading it back costs a copy.
    let (head, answer_body) = answer.into_parts();
    let answer_body = axum::body::to_bytes(answer_body, MAX_BODY_BYTES)
        .await
        .unwrap_or_default();
    let answer = Response::from_parts(head, Body::from(answer_body.clone()));
    shared.record(&parts, &body, &call, &answer, &answer_body);
    answer
}

/// Fault the request or forward it, as the plan decides.
async fn respond(shared: &Shared, parts: &Parts, body: Bytes, call: &Call) -> Response {
    let decision = shared.lock().decide(call);
    if let Some(delay) = decision.delay {
        tokio::time::sleep(delay).await;
    }
    if let Some(kind @ (FaultKind::Throttle | FaultKind::ServerError)) = decision.fault {
        shared.lock().count(call.service, kind);
        return fault_response(call, kind, &shared.request_id());
    }
    let upstream = match forward(shared, parts, body).await {
        Ok(resp) => resp,
        Err(e) => {
            shared.lock().stats.upstream_failures += 1;
            return plain(
                StatusCode::BAD_GATEWAY,
                &format!("fault proxy: upstream {}: {e}", shared.upstream),
            );
        }
    };
    shared.forwarded(call);
    if decision.fault == Some(FaultKind::LostResponse) {
        // The upstream has applied the request and answered in full; the client never
        // learns that.
        shared.lock().count(call.service, FaultKind::LostResponse);
        return fault_response(call, FaultKind::ServerError, &shared.request_id());
    }
    upstream
}

/// The access key id of a SigV4 `Authorization` header (`... Credential=AKID/date/...`).
fn access_key(headers: &HeaderMap) -> String {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split("Credential=").nth(1))
        .and_then(|c| c.split('/').next())
        .unwrap_or_default()
        .to_owned()
}

/// A request's parameters as JSON: its body, or its awsQuery form as an object.
fn params(call: &Call, body: &[u8]) -> Value {
    if call.protocol == Protocol::SqsQuery {
        let pairs = url::form_urlencoded::parse(body);
        return Value::Object(
            pairs
                .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
                .collect(),
        );
    }
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// The error code of an AWS error answer, as the SDKs read it: the `x-amzn-query-error` or
/// `x-amzn-errortype` header, else the JSON body's `__type` or `code`, else an XML `<Code>`;
/// cut at a `:` and after a `#`.
fn error_code(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let from_json = || {
        let json = json.as_ref()?;
        json["__type"].as_str().or(json["code"].as_str()).map(str::to_owned)
    };
    let from_xml = || {
        let text = std::str::from_utf8(body).ok()?;
        let start = text.find("<Code>")? + "<Code>".len();
        let end = text[start..].find('<')? + start;
        Some(text[start..end].to_owned())
    };
    let code = header("x-amzn-query-error")
        .map(|q| q.split(';').next().unwrap_or_default().to_owned())
        .or_else(|| header("x-amzn-errortype"))
        .or_else(from_json)
        .or_else(from_xml)?;
    let code = code.split(':').next().unwrap_or_default();
    Some(code.rsplit('#').next().unwrap_or_default().to_owned())
}

/// Send the request on to the upstream and read its whole answer.
async fn forward(shared: &Shared, parts: &Parts, body: Bytes) -> Result<Response, reqwest::Error> {
    let path_and_query = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let url = format!("{}{}", shared.upstream, path_and_query);
    let resp = shared
        .client
        .request(parts.method.clone(), url)
        .headers(end_to_end(&parts.headers))
        .body(body)
        .send()
        .await?;
    let status = resp.status();
    let headers = end_to_end(resp.headers());
    let bytes = resp.bytes().await?;
    let mut out = Response::new(Body::from(bytes));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn the_first_requests_get_the_scripted_faults_then_the_draws_decide_and_a_new_plan_starts_over() {
        let plan = FaultPlan::none().first(Service::Ses, &[FaultKind::Throttle, FaultKind::ServerError]);
        let mut decider = Decider::new(plan.clone());
        let call = |service| Call {
            service,
            operation: "SendEmail".into(),
            protocol: Protocol::RestJson,
        };
        let faults = |d: &mut Decider, service| (0..3).map(|_| d.decide(&call(service)).fault).collect::<Vec<_>>();
        let scripted = vec![Some(FaultKind::Throttle), Some(FaultKind::ServerError), None];
        assert_eq!(faults(&mut decider, Service::Ses), scripted);
        assert_eq!(
            faults(&mut decider, Service::Sqs),
            vec![None; 3],
            "another service's are its own"
        );
        decider.set_plan(plan);
        assert_eq!(faults(&mut decider, Service::Ses), scripted);
    }

    /// A tiny upstream on 127.0.0.1:0: counts requests, answers 201 with a header and a body
    /// that echoes the method, path and query, a request header and the request body.
    struct Upstream {
        url: String,
        hits: Arc<AtomicUsize>,
    }

    impl Upstream {
        async fn start() -> Self {
            let hits = Arc::new(AtomicUsize::new(0));
            let h = hits.clone();
            let app = axum::Router::new().fallback(move |req: Request| {
                let h = h.clone();
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    let (parts, body) = req.into_parts();
                    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
                    let header = |name: &str| {
                        parts
                            .headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-")
                            .to_owned()
                    };
                    let echo = format!(
                        "{} {} x-custom={} host={} body={}",
                        parts.method,
                        parts.uri,
                        header("x-custom"),
                        header("host"),
                        String::from_utf8_lossy(&body)
                    );
                    (StatusCode::CREATED, [("x-upstream", "yes")], echo)
                }
            });
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            Self { url, hits }
        }

        fn hits(&self) -> usize {
            self.hits.load(Ordering::SeqCst)
        }
    }

    fn client() -> reqwest::Client {
        reqwest::Client::builder().no_proxy().build().unwrap()
    }

    async fn dynamodb(proxy: &FaultProxy, op: &str) -> reqwest::Response {
        client()
            .post(format!("{}/", proxy.url()))
            .header("x-amz-target", format!("DynamoDB_20120810.{op}"))
            .header("content-type", "application/x-amz-json-1.0")
            .body(r#"{"TableName":"t"}"#)
            .send()
            .await
            .unwrap()
    }

    async fn sqs(proxy: &FaultProxy, op: &str) -> reqwest::Response {
        client()
            .post(format!("{}/", proxy.url()))
            .header("x-amz-target", format!("AmazonSQS.{op}"))
            .header("content-type", "application/x-amz-json-1.0")
            .body(r#"{"QueueUrl":"q"}"#)
            .send()
            .await
            .unwrap()
    }

    async fn ses_send(proxy: &FaultProxy) -> reqwest::Response {
        client()
            .post(format!("{}/v2/email/outbound-emails", proxy.url()))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap()
    }

    fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
        resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    #[tokio::test]
    async fn without_a_plan_everything_is_forwarded_faithfully() {
        let up = Upstream::start().await;
        let proxy = FaultProxy::start(&up.url, FaultPlan::none()).await;
        let resp = client()
            .put(format!("{}/some/path?a=1&b=two", proxy.url()))
            .header("x-custom", "kept")
            .body("hello")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        assert_eq!(header(&resp, "x-upstream"), "yes");
        // `host` as the client sent it: SigV4 signs it.
        let host = proxy.url().trim_start_matches("http://").to_owned();
        assert_eq!(
            resp.text().await.unwrap(),
            format!("PUT /some/path?a=1&b=two x-custom=kept host={host} body=hello")
        );

        let resp = dynamodb(&proxy, "PutItem").await;
        assert_eq!(resp.status(), 201);
        assert!(resp.text().await.unwrap().ends_with(r#"body={"TableName":"t"}"#));
        assert_eq!(up.hits(), 2);
        assert_eq!(proxy.stats().total_faults(), 0);
    }

    #[tokio::test]
    async fn recorded_calls_name_their_signer_parameters_and_answers_error_code() {
        let up = Upstream::start().await;
        let proxy = FaultProxy::start(&up.url, FaultPlan::none().throttle(Service::Sqs, 1.0)).await;
        dynamodb(&proxy, "GetItem").await;
        assert!(proxy.calls().is_empty(), "nothing is kept before recording starts");
        proxy.record_calls();
        client()
            .post(format!("{}/", proxy.url()))
            .header("x-amz-target", "DynamoDB_20120810.Query")
            .header(
                "authorization",
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0",
            )
            .body(r#"{"TableName":"t","IndexName":"i"}"#)
            .send()
            .await
            .unwrap();
        sqs(&proxy, "SendMessage").await;
        client()
            .post(format!("{}/", proxy.url()))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("Action=DeleteMessage&Version=2012-11-05&QueueUrl=http%3A%2F%2Fq%2F1%2Fa+b")
            .send()
            .await
            .unwrap();
        let calls = proxy.calls();
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert_eq!(
            (
                calls[0].access_key.as_str(),
                calls[0].operation.as_str(),
                calls[0].status
            ),
            ("AKIDEXAMPLE", "Query", 201)
        );
        assert_eq!(calls[0].params, serde_json::json!({"TableName": "t", "IndexName": "i"}));
        assert_eq!(calls[0].error, None);
        assert_eq!((calls[1].service, calls[1].access_key.as_str()), (Service::Sqs, ""));
        assert_eq!(calls[1].error.as_deref(), Some("RequestThrottled"), "the fault's code");
        assert_eq!(calls[2].params["QueueUrl"], "http://q/1/a b", "a form, decoded");
    }

    #[tokio::test]
    async fn a_dynamodb_throttle_answers_for_the_service_and_forwards_nothing() {
        let up = Upstream::start().await;
        let proxy = FaultProxy::start(&up.url, FaultPlan::none().throttle(Service::DynamoDb, 1.0)).await;
        let resp = dynamodb(&proxy, "PutItem").await;
        assert_eq!(resp.status(), 400);
        assert_eq!(header(&resp, "content-type"), "application/x-amz-json-1.0");
        assert!(!header(&resp, "x-amzn-requestid").is_empty());
        let body = resp.text().await.unwrap();
        assert_eq!(
            body,
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API."}"#
        );

        // The control plane is throttled the way DynamoDB does it there.
        let resp = dynamodb(&proxy, "DescribeTable").await;
        assert_eq!(resp.status(), 400);
        assert_eq!(
            resp.text().await.unwrap(),
            r#"{"__type":"com.amazon.coral.availability#ThrottlingException","message":"Rate exceeded"}"#
        );
        assert_eq!(up.hits(), 0, "a throttled request never reaches the upstream");
    }

    #[tokio::test]
    async fn sqs_and_ses_throttles_carry_the_codes_their_sdks_read() {
        let up = Upstream::start().await;
        let plan = FaultPlan::none()
            .throttle(Service::Sqs, 1.0)
            .throttle(Service::Ses, 1.0);
        let proxy = FaultProxy::start(&up.url, plan).await;

        let resp = sqs(&proxy, "SendMessage").await;
        assert_eq!(resp.status(), 403);
        assert_eq!(header(&resp, "content-type"), "application/x-amz-json-1.0");
        assert_eq!(header(&resp, "x-amzn-query-error"), "RequestThrottled;Sender");
        assert_eq!(
            resp.text().await.unwrap(),
            r#"{"__type":"com.amazonaws.sqs#RequestThrottled","message":"Request is throttled."}"#
        );

        // The older query protocol gets the XML error.
        let resp = client()
            .post(format!("{}/123456789012/q", proxy.url()))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("Action=SendMessage&MessageBody=hi&Version=2012-11-05")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403);
        assert_eq!(header(&resp, "content-type"), "text/xml");
        let text = resp.text().await.unwrap();
        assert!(
            text.contains("<Type>Sender</Type><Code>RequestThrottled</Code>"),
            "{text}"
        );

        let resp = ses_send(&proxy).await;
        assert_eq!(resp.status(), 429);
        assert_eq!(header(&resp, "x-amzn-errortype"), "TooManyRequestsException");
        assert_eq!(header(&resp, "content-type"), "application/json");
        assert_eq!(up.hits(), 0);
    }

    #[tokio::test]
    async fn a_lost_response_reaches_the_upstream_and_the_client_gets_a_5xx() {
        let up = Upstream::start().await;
        let plan = FaultPlan::none()
            .lost_response(Service::Sqs, 1.0)
            .lost_response(Service::DynamoDb, 1.0);
        let proxy = FaultProxy::start(&up.url, plan).await;

        let resp = sqs(&proxy, "SendMessage").await;
        assert_eq!(up.hits(), 1, "the upstream applied it");
        assert_eq!(resp.status(), 500);
        assert_eq!(header(&resp, "x-amzn-query-error"), "InternalFailure;Receiver");
        let text = resp.text().await.unwrap();
        assert!(text.contains("com.amazon.coral.service#InternalFailure"), "{text}");

        let resp = dynamodb(&proxy, "TransactWriteItems").await;
        assert_eq!(up.hits(), 2);
        assert_eq!(resp.status(), 500);
        assert_eq!(
            resp.text().await.unwrap(),
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"Internal server error"}"#
        );
        assert_eq!(proxy.stats().faults(Service::Sqs, FaultKind::LostResponse), 1);
    }

    #[tokio::test]
    async fn a_server_error_forwards_nothing() {
        let up = Upstream::start().await;
        let proxy = FaultProxy::start(&up.url, FaultPlan::none().server_error(Service::Ses, 1.0)).await;
        let resp = ses_send(&proxy).await;
        assert_eq!(resp.status(), 500);
        assert_eq!(header(&resp, "x-amzn-errortype"), "InternalServiceErrorException");
        assert_eq!(up.hits(), 0);
    }

    #[tokio::test]
    async fn other_requests_and_spared_operations_are_never_faulted() {
        let up = Upstream::start().await;
        let mut plan = FaultPlan::none().spare(Service::Sqs, "DeleteMessage");
        for service in [Service::DynamoDb, Service::Sqs, Service::Ses] {
            plan = plan.throttle(service, 1.0);
        }
        let proxy = FaultProxy::start(&up.url, plan).await;
        for _ in 0..5 {
            let resp = client()
                .post(format!("{}/", proxy.url()))
                .body("{}")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 201);
            // Another query service (SES v1) is not SQS.
            let resp = client()
                .post(format!("{}/", proxy.url()))
                .header("content-type", "application/x-www-form-urlencoded")
                .body("Action=SendEmail&Version=2010-12-01")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 201);
            assert_eq!(sqs(&proxy, "DeleteMessage").await.status(), 201);
        }
        assert_eq!(up.hits(), 15);
        let stats = proxy.stats();
        assert_eq!(stats.requests(Service::Other), 10);
        assert_eq!(stats.requests(Service::Sqs), 5);
        assert_eq!(stats.total_faults(), 0);
    }

    #[tokio::test]
    async fn stats_count_requests_and_faults_per_service() {
        let up = Upstream::start().await;
        let plan = FaultPlan::none()
            .throttle(Service::DynamoDb, 1.0)
            .latency(Service::Sqs, 1.0)
            .latency_range(Duration::from_millis(1)..=Duration::from_millis(3));
        let proxy = FaultProxy::start(&up.url, plan).await;
        for _ in 0..3 {
            dynamodb(&proxy, "GetItem").await;
        }
        for _ in 0..2 {
            assert_eq!(sqs(&proxy, "ReceiveMessage").await.status(), 201);
        }
        ses_send(&proxy).await;

        let stats = proxy.stats();
        assert_eq!(stats.requests(Service::DynamoDb), 3);
        assert_eq!(stats.requests(Service::Sqs), 2);
        assert_eq!(stats.requests(Service::Ses), 1);
        assert_eq!(stats.faults(Service::DynamoDb, FaultKind::Throttle), 3);
        assert_eq!(stats.faults(Service::Sqs, FaultKind::Latency), 2);
        assert_eq!((stats.total_requests(), stats.total_faults()), (6, 5));
        let table = stats.to_string();
        assert!(table.contains("dynamodb  throttle           3"), "{table}");
        assert!(table.contains("sqs       latency            2"), "{table}");
        assert!(table.ends_with("total     faults             5"), "{table}");
    }

    #[tokio::test]
    async fn the_write_hook_runs_once_after_the_kth_applied_write_before_its_answer() {
        let up = Upstream::start().await;
        // The first DynamoDB request is throttled: never applied, so not a write counted.
        let plan = FaultPlan::none().first(Service::DynamoDb, &[FaultKind::Throttle]);
        let proxy = FaultProxy::start(&up.url, plan).await;
        assert_eq!(dynamodb(&proxy, "PutItem").await.status(), 400);
        let (tx, rx) = std::sync::mpsc::channel();
        let hits = up.hits.clone();
        proxy.after_writes(3, move || tx.send(hits.load(Ordering::SeqCst)).unwrap());
        // Reads, updates and other services are not writes it counts.
        for op in ["GetItem", "Query", "UpdateItem", "DeleteItem"] {
            assert_eq!(dynamodb(&proxy, op).await.status(), 201);
        }
        assert_eq!(sqs(&proxy, "SendMessage").await.status(), 201);
        assert_eq!(dynamodb(&proxy, "PutItem").await.status(), 201);
        assert_eq!(dynamodb(&proxy, "TransactWriteItems").await.status(), 201);
        assert!(rx.try_recv().is_err(), "not after two writes");
        assert_eq!(dynamodb(&proxy, "BatchWriteItem").await.status(), 201);
        // Ran before the third write's answer came back, after the upstream had it.
        assert_eq!(rx.try_recv(), Ok(8), "the upstream's count when it ran");
        dynamodb(&proxy, "PutItem").await;
        assert!(rx.try_recv().is_err(), "once");
    }

    #[tokio::test]
    async fn set_plan_none_stops_the_faults() {
        let up = Upstream::start().await;
        let proxy = FaultProxy::start(&up.url, FaultPlan::none().server_error(Service::DynamoDb, 1.0)).await;
        assert_eq!(dynamodb(&proxy, "PutItem").await.status(), 500);
        proxy.set_plan(FaultPlan::none());
        assert_eq!(dynamodb(&proxy, "PutItem").await.status(), 201);
        assert_eq!(up.hits(), 1);
        assert_eq!(proxy.stats().faults(Service::DynamoDb, FaultKind::ServerError), 1);
    }

    #[tokio::test]
    async fn the_same_seed_gives_the_same_faults() {
        let up = Upstream::start().await;
        let plan = FaultPlan::none().seed(7).throttle(Service::DynamoDb, 0.5);
        let proxy = FaultProxy::start(&up.url, plan.clone()).await;
        let mut runs = Vec::new();
        for _ in 0..2 {
            proxy.set_plan(plan.clone());
            let mut statuses = Vec::new();
            for _ in 0..20 {
                statuses.push(dynamodb(&proxy, "GetItem").await.status().as_u16());
            }
            runs.push(statuses);
        }
        assert_eq!(runs[0], runs[1]);
        assert!(runs[0].contains(&400) && runs[0].contains(&201), "{:?}", runs[0]);
    }

    #[tokio::test]
    async fn an_unreachable_upstream_answers_502() {
        // A port that was free a moment ago.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let proxy = FaultProxy::start(&format!("http://127.0.0.1:{port}"), FaultPlan::none()).await;
        assert_eq!(dynamodb(&proxy, "GetItem").await.status(), 502);
        assert_eq!(proxy.stats().upstream_failures, 1);
    }

    #[tokio::test]
    async fn a_stopped_proxy_refuses_connections() {
        let up = Upstream::start().await;
        let proxy = FaultProxy::start(&up.url, FaultPlan::none()).await;
        let url = proxy.url();
        drop(proxy);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(client().get(&url).send().await.is_err());
    }
}
