//! For the AWS end-to-end test: moto / DynamoDB Local endpoints from the environment, the
//! resources made from template.yaml, the four function binaries hosted by
//! `cargo lambda watch`, and a small stand-in for Lambda's SQS event source mapping.
//!
//! `cargo lambda watch --only-lambda-apis` serves the Lambda invoke API and the runtime API;
//! the test starts the compiled function binaries itself, each pointed at its own runtime
//! API path (`/.rt/<function>`), exactly as `cargo lambda watch` does when it starts them
//! through `cargo run` — minus that second cargo build with another feature set.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hookwise_aws::bootstrap::{provision, Provisioned, TemplateResources};
use hookwise_aws::{encode_task, env, AwsClients, RequestCounter, SqsConsumer};
use hookwise_core::ports::QueueMessage;
use hookwise_core::services::Disposition;
use hookwise_runner::{run_worker, BatchHandler, CancellationToken, WorkerConfig};
use serde_json::{json, Value};

pub const MOTO_URL: &str = "HOOKWISE_TEST_MOTO_URL";
pub const DYNAMODB_LOCAL_URL: &str = "HOOKWISE_TEST_DYNAMODB_LOCAL_URL";
/// Set by scripts/aws-test-services.sh: whatever is missing is then a failure, not a skip.
pub const REQUIRE: &str = "HOOKWISE_TEST_REQUIRE_AWS";
pub const SENDER: &str = "hookwise@example.com";
pub const FUNCTIONS: [&str; 4] = [
    "hookwise-ingest",
    "hookwise-deliver",
    "hookwise-scheduler",
    "hookwise-dead-letter",
];

fn required() -> bool {
    std::env::var(REQUIRE).is_ok_and(|v| v == "1")
}

/// Skip (returning `None`) or, under the test script, fail.
fn missing(what: &str) -> Option<String> {
    if required() {
        panic!("{what}, but {REQUIRE}=1: scripts/aws-e2e.sh should have provided it");
    }
    eprintln!("SKIPPED: {what}; run scripts/aws-e2e.sh to run the AWS end-to-end tests");
    None
}

pub fn endpoint(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => missing(&format!("{var} is not set")),
    }
}

/// `cargo lambda` answers, or the test is skipped (or fails under the script).
pub fn cargo_lambda() -> Option<()> {
    let ok = Command::new(env!("CARGO"))
        .args(["lambda", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Some(())
    } else {
        missing("`cargo lambda` is not installed (pip install cargo-lambda)").map(|_| ())
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

pub fn template() -> TemplateResources {
    let path = workspace_root().join("template.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    TemplateResources::parse(&yaml).expect("template.yaml parses")
}

pub fn unique_prefix(label: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "hwe2e-{label}-{}-{:x}-{}",
        std::process::id(),
        nanos % 0xffff_ffff,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// An SQS client for the test's own calls (injecting, reading back) that waits out an
/// emulator's stall the system under test rides out with its retries: moto on a loaded
/// machine has gone more than the SDK's 5 s without answering.
pub fn patient_sqs(clients: &AwsClients) -> aws_sdk_sqs::Client {
    let timeouts = aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
        .operation_attempt_timeout(Duration::from_secs(20))
        .operation_timeout(Duration::from_secs(60))
        .build();
    aws_sdk_sqs::Client::from_conf(clients.sqs.config().to_builder().timeout_config(timeouts).build())
}

/// Tables on DynamoDB Local, queues and SES on moto, all made from template.yaml.
pub struct AwsEnv {
    pub moto_url: String,
    pub dynamodb_url: String,
    pub clients: AwsClients,
    pub provisioned: Provisioned,
}

impl AwsEnv {
    pub async fn new(label: &str, counter: Option<&RequestCounter>) -> Option<Self> {
        let moto_url = endpoint(MOTO_URL)?;
        let dynamodb_url = endpoint(DYNAMODB_LOCAL_URL)?;
        Some(Self::at(moto_url, dynamodb_url, label, counter).await)
    }

    /// Queues and SES on `moto_url`, tables on `dynamodb_url` (which may be moto too).
    pub async fn at(moto_url: String, dynamodb_url: String, label: &str, counter: Option<&RequestCounter>) -> Self {
        let moto = AwsClients::for_endpoint(&moto_url, counter).await;
        let ddb = AwsClients::for_endpoint(&dynamodb_url, counter).await;
        let clients = AwsClients {
            dynamodb: ddb.dynamodb,
            ..moto
        };
        let provisioned = provision(&clients, &template(), &unique_prefix(label))
            .await
            .expect("tables and queues from template.yaml");
        // SES v2 sends only from a verified identity (moto checks too).
        clients
            .sesv2
            .create_email_identity()
            .email_identity(SENDER)
            .send()
            .await
            .expect("verify the sender on moto");
        Self {
            moto_url,
            dynamodb_url,
            clients,
            provisioned,
        }
    }

    /// Services in the test process on these tables and queues, delivering to loopback;
    /// `max_delay`, the queue's delay limit, if not the provisioned one.
    pub fn services(&self, max_delay: Option<u32>) -> hookwise_core::services::Services {
        use hookwise_http::{HttpSender, SenderConfig};
        let provisioned = self.provisioned.config(SENDER);
        let config = hookwise_aws::AwsConfig {
            queue_max_delay_seconds: max_delay.unwrap_or(provisioned.queue_max_delay_seconds),
            ..provisioned
        };
        let adapters = hookwise_aws::AwsAdapters::new(&self.clients, &config);
        let loopback = SenderConfig {
            allow_cidrs: vec!["127.0.0.0/8".parse().unwrap()],
            ..SenderConfig::default()
        };
        let ports = adapters.ports(
            Arc::new(HttpSender::new(loopback).unwrap()),
            Arc::new(hookwise_core::ports::SystemClock),
        );
        let rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
        hookwise_core::services::Services::new(ports, hookwise_core::services::Config::default(), rng)
    }

    /// What template.yaml's Globals give every function, pointed at these resources.
    pub fn function_env(&self, max_delay: u32) -> Vec<(String, String)> {
        let p = &self.provisioned;
        [
            (env::TABLE, p.table.clone()),
            (env::SCHEDULER_TABLE, p.scheduler_table.clone()),
            (env::DELIVERY_QUEUE_URL, p.delivery_queue_url.clone()),
            (env::DEAD_LETTER_QUEUE_URL, p.dead_letter_queue_url.clone()),
            (env::SENDER_EMAIL, SENDER.to_owned()),
            (env::SECRETS_KEY, p.secrets_key.clone()),
            (env::QUEUE_MAX_DELAY_SECONDS, max_delay.to_string()),
            (env::ALLOWED_TARGET_CIDRS, "127.0.0.0/8".to_owned()),
            (env::PUBLIC_API_URL, "http://127.0.0.1:1".to_owned()),
            // The SDK's standard variables: DynamoDB Local for the tables, moto for the rest.
            ("AWS_ENDPOINT_URL", self.moto_url.clone()),
            ("AWS_ENDPOINT_URL_DYNAMODB", self.dynamodb_url.clone()),
            ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_LAMBDA_LOG_FORMAT", "JSON".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// The four function binaries, built once per test run (debug, like `cargo lambda watch`).
pub fn function_bins() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Ok(dir) = std::env::var("HOOKWISE_LAMBDA_BIN_DIR") {
            return PathBuf::from(dir);
        }
        let root = workspace_root();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "--bins"]).current_dir(&root);
        for f in FUNCTIONS {
            cmd.args(["-p", f]);
        }
        assert!(
            cmd.status().expect("cargo runs").success(),
            "building the function binaries failed"
        );
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target.join("debug")
    })
    .clone()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How [`LambdaHost`] starts a function's process.
#[derive(Debug, Clone)]
pub enum Launcher {
    /// The binary of this machine's shared debug build ([`function_bins`]).
    Native,
    /// The arm64 `bootstrap` that `sam build` made for the function, as `sam deploy` ships
    /// it (`<build>/<LogicalId>/bootstrap`), under qemu-user with the aarch64 C library.
    Arm64 { build: PathBuf, sysroot: PathBuf },
}

impl Launcher {
    /// The artifacts the test command's `sam build` step made, and qemu's sysroot
    /// (`HOOKWISE_TEST_ARM64_BUILD`, `HOOKWISE_TEST_ARM64_SYSROOT`, set by scripts/test.sh);
    /// `None` (the test skips) where they are not named.
    pub fn arm64() -> Option<Self> {
        let (Ok(build), Ok(sysroot)) = (
            std::env::var("HOOKWISE_TEST_ARM64_BUILD"),
            std::env::var("HOOKWISE_TEST_ARM64_SYSROOT"),
        ) else {
            eprintln!("SKIPPED: HOOKWISE_TEST_ARM64_BUILD is not set; scripts/test.sh runs the arm64 artifacts");
            return None;
        };
        Some(Launcher::Arm64 {
            build: build.into(),
            sysroot: sysroot.into(),
        })
    }

    fn command(&self, function: &str) -> Command {
        match self {
            Launcher::Native => Command::new(function_bins().join(function)),
            Launcher::Arm64 { build, sysroot } => {
                let bootstrap = build.join(logical_id(function)).join("bootstrap");
                assert!(
                    bootstrap.is_file(),
                    "no {} (scripts/sam-build.sh makes it)",
                    bootstrap.display()
                );
                let mut cmd = Command::new("qemu-aarch64");
                cmd.arg("-L").arg(sysroot).arg(bootstrap);
                cmd
            }
        }
    }
}

/// The template's logical id of the function built as `binary`.
fn logical_id(binary: &str) -> String {
    let yaml = std::fs::read_to_string(workspace_root().join("template.yaml")).unwrap();
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    doc["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .find(|(_, r)| r["Metadata"]["BuildProperties"]["Binary"].as_str() == Some(binary))
        .and_then(|(id, _)| id.as_str())
        .unwrap_or_else(|| panic!("no function in template.yaml builds {binary}"))
        .to_owned()
}

/// `cargo lambda watch` and the four functions attached to it.
pub struct LambdaHost {
    watch: Child,
    functions: Vec<Child>,
    pub base: String,
    http: reqwest::Client,
}

impl LambdaHost {
    pub async fn start(fn_env: &[(String, String)]) -> Self {
        Self::start_with(fn_env, |_| Vec::new()).await
    }

    /// [`Self::start`], with `own(function)` set for that function over `fn_env`.
    pub async fn start_with(fn_env: &[(String, String)], own: impl Fn(&str) -> Vec<(String, String)>) -> Self {
        Self::start_launched(&Launcher::Native, fn_env, own).await
    }

    /// [`Self::start_with`], each function's process started by `launcher`.
    pub async fn start_launched(
        launcher: &Launcher,
        fn_env: &[(String, String)],
        own: impl Fn(&str) -> Vec<(String, String)>,
    ) -> Self {
        let port = free_port();
        let watch = Command::new(env!("CARGO"))
            .args([
                "lambda",
                "watch",
                "--only-lambda-apis",
                "--invoke-address",
                "127.0.0.1",
                "--invoke-port",
                &port.to_string(),
            ])
            .current_dir(workspace_root())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cargo lambda watch starts");
        let base = format!("http://127.0.0.1:{port}");
        let mut host = Self {
            watch,
            functions: Vec::new(),
            base,
            http: reqwest::Client::new(),
        };
        let start = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "cargo lambda watch did not listen on {port}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for name in FUNCTIONS {
            let child = launcher
                .command(name)
                .envs(fn_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .envs(own(name))
                .env("AWS_LAMBDA_RUNTIME_API", format!("http://127.0.0.1:{port}/.rt/{name}"))
                .env("AWS_LAMBDA_FUNCTION_NAME", name)
                .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
                .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
                .stdout(Stdio::inherit())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap_or_else(|e| panic!("{name} starts: {e}"));
            host.functions.push(child);
        }
        host
    }

    /// The function's answer; panics if the function returned an error.
    pub async fn invoke(&self, function: &str, payload: &Value) -> Value {
        let (ok, out) = self.try_invoke(function, payload).await;
        assert!(ok, "{function} failed: {out}");
        out
    }

    /// (succeeded, answer or error document).
    pub async fn try_invoke(&self, function: &str, payload: &Value) -> (bool, Value) {
        let resp = self
            .http
            .post(format!("{}/2015-03-31/functions/{function}/invocations", self.base))
            .json(payload)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .unwrap_or_else(|e| panic!("invoking {function}: {e}"));
        let ok = resp.status().is_success() && resp.headers().get("x-amz-function-error").is_none();
        let text = resp.text().await.expect("a body");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (ok && value.get("errorType").is_none(), value)
    }
}

impl Drop for LambdaHost {
    fn drop(&mut self) {
        for c in self.functions.iter_mut().chain(std::iter::once(&mut self.watch)) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An API Gateway HTTP API (payload format 2.0) event, as the template's HttpApi sends it.
pub fn http_api_event(method: &str, path: &str, api_key: &str, body: Option<&Value>) -> Value {
    json!({
        "version": "2.0",
        "routeKey": "ANY /{proxy+}",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"authorization": format!("Bearer {api_key}"), "content-type": "application/json", "host": "api.example.com"},
        "requestContext": {
            "accountId": "123456789012", "apiId": "e2e", "domainName": "api.example.com", "domainPrefix": "api",
            "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": "e2e"},
            "requestId": "e2e", "routeKey": "ANY /{proxy+}", "stage": "$default", "time": "30/Nov/2026:05:07:00 +0000", "timeEpoch": 0
        },
        "body": body.map(|b| b.to_string()),
        "isBase64Encoded": false
    })
}

/// What the event-source emulator did, for assertions.
#[derive(Default, Debug)]
pub struct SourceLog {
    /// Every message body handed to a function, by queue ("delivery" / "dead-letter").
    pub bodies: Vec<(String, String)>,
    /// Message ids the function reported in `batchItemFailures`.
    pub failures: Vec<String>,
    /// Every answer of the scheduler.
    pub scheduler: Vec<Value>,
}

/// Lambda's SQS event source mapping and EventBridge schedule, in miniature: the runner's
/// worker loop drains each queue into its function (a real SQS event in, the batch
/// response's failures left on the queue); the scheduler is invoked every second.
pub struct EventSources {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub log: Arc<Mutex<SourceLog>>,
}

impl EventSources {
    pub async fn start(host: Arc<LambdaHost>, sqs: aws_sdk_sqs::Client, provisioned: &Provisioned) -> Self {
        let stop = CancellationToken::new();
        let log = Arc::new(Mutex::new(SourceLog::default()));
        let mut tasks = Vec::new();
        for (label, url, function) in [
            ("delivery", provisioned.delivery_queue_url.clone(), "hookwise-deliver"),
            (
                "dead-letter",
                provisioned.dead_letter_queue_url.clone(),
                "hookwise-dead-letter",
            ),
        ] {
            let consumer = SqsConsumer::connect(sqs.clone(), &url)
                .await
                .expect("the queue's attributes");
            let handler = InvokeFunction {
                host: host.clone(),
                function,
                label,
                arn: format!(
                    "arn:aws:sqs:us-east-1:123456789012:{}",
                    url.rsplit('/').next().unwrap_or_default()
                ),
                log: log.clone(),
            };
            let config = WorkerConfig {
                name: label,
                batch_size: 10,
                wait: Duration::from_secs(1),
                batches_in_flight: 1,
            };
            tasks.push(tokio::spawn(run_worker(consumer, handler, config, stop.clone())));
        }
        let tick: Value = serde_json::from_str(
            &std::fs::read_to_string(workspace_root().join("infra/events/scheduler-scheduled.json")).unwrap(),
        )
        .unwrap();
        let (h, s, l) = (host.clone(), stop.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            while !s.is_cancelled() {
                let (ok, out) = h.try_invoke("hookwise-scheduler", &tick).await;
                if ok {
                    l.lock().unwrap().scheduler.push(out);
                } else {
                    eprintln!("scheduler tick failed: {out}");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
        Self { stop, tasks, log }
    }

    pub async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Scheduled retries the scheduler moved from its table to the queue, in all.
    pub fn moved_by_scheduler(&self) -> u64 {
        self.log
            .lock()
            .unwrap()
            .scheduler
            .iter()
            .filter_map(|r| r["moved"].as_u64())
            .sum()
    }

    pub fn bodies(&self, queue: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .bodies
            .iter()
            .filter(|(q, _)| q == queue)
            .map(|(_, b)| b.clone())
            .collect()
    }
}

/// One queue's function, invoked as the event source mapping does.
struct InvokeFunction {
    host: Arc<LambdaHost>,
    function: &'static str,
    label: &'static str,
    arn: String,
    log: Arc<Mutex<SourceLog>>,
}

#[async_trait::async_trait]
impl BatchHandler for InvokeFunction {
    async fn handle(&self, messages: &[QueueMessage]) -> Vec<Disposition> {
        // The body as it was sent: tasks go on the queue as `encode_task` writes them.
        let bodies: Vec<String> = messages
            .iter()
            .map(|m| m.task.as_ref().map(encode_task).unwrap_or_else(|e| e.clone()))
            .collect();
        let records: Vec<Value> = messages
            .iter()
            .zip(&bodies)
            .map(|(m, body)| {
                let mut attributes = json!({"ApproximateReceiveCount": m.receive_count.to_string()});
                if m.redriven {
                    attributes["DeadLetterQueueSourceArn"] = self.arn.clone().into();
                }
                json!({
                    "messageId": m.message_id, "receiptHandle": "handled-by-the-emulator", "body": body,
                    "attributes": attributes, "messageAttributes": {},
                    "eventSource": "aws:sqs", "eventSourceARN": self.arn, "awsRegion": "us-east-1"
                })
            })
            .collect();
        self.log
            .lock()
            .unwrap()
            .bodies
            .extend(bodies.into_iter().map(|b| (self.label.to_owned(), b)));
        let (ok, response) = self
            .host
            .try_invoke(self.function, &json!({ "Records": records }))
            .await;
        if !ok {
            // As Lambda does: a failed invocation leaves the whole batch to come back.
            eprintln!("event source {}: {} failed: {response}", self.label, self.function);
            return vec![Disposition::Redeliver; messages.len()];
        }
        let failed: Vec<String> = response["batchItemFailures"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|f| f["itemIdentifier"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        self.log.lock().unwrap().failures.extend(failed.iter().cloned());
        messages
            .iter()
            .map(|m| {
                if failed.contains(&m.message_id) {
                    Disposition::Redeliver
                } else {
                    Disposition::Done
                }
            })
            .collect()
    }
}

/// The API through the ingest function, one API Gateway HTTP API event per call.
pub struct Gateway {
    pub host: Arc<LambdaHost>,
    pub key: String,
}

impl Gateway {
    /// (status, JSON body) of `method path`.
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_for(None, method, path, body).await
    }

    /// (status, JSON body) of `method path`, naming a tenant with `Hookwise-Tenant` (as an
    /// operator key does).
    pub async fn call_for(&self, tenant: Option<&str>, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut event = http_api_event(method, path, &self.key, body.as_ref());
        if let Some(tenant) = tenant {
            event["headers"]["hookwise-tenant"] = json!(tenant);
        }
        let out = self.host.invoke("hookwise-ingest", &event).await;
        let status = out["statusCode"]
            .as_u64()
            .unwrap_or_else(|| panic!("an HTTP API response: {out}")) as u16;
        let text = match (out["body"].as_str(), out["isBase64Encoded"].as_bool()) {
            (Some(b), Some(true)) => panic!("unexpected base64 body for {path}: {b}"),
            (Some(b), _) => b.to_owned(),
            (None, _) => String::new(),
        };
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn post(&self, path: &str, body: Value) -> Value {
        let (status, out) = self.call("POST", path, Some(body)).await;
        assert!((200..300).contains(&status), "POST {path}: {status} {out}");
        out
    }

    pub async fn delivery(&self, id: &str) -> Value {
        let (status, d) = self.call("GET", &format!("/v1/deliveries/{id}"), None).await;
        assert_eq!(status, 200, "{d}");
        d
    }

    pub async fn wait_status(&self, id: &str, want: &str, within: Duration) -> Value {
        let every = Duration::from_millis(250);
        hookwise_tests::poll_delivery_status(id, want, within, every, || self.delivery(id)).await
    }
}

/// Every email moto's SES (v1 or v2) took for `to`, from `GET /moto-api/data.json`.
pub async fn moto_mail_to(moto_url: &str, to: &str) -> Vec<Value> {
    // moto serialises its models while other requests change them, and then answers with
    // an error page now and again: ask again.
    let mut tries = 0;
    let data: Value = loop {
        tries += 1;
        let body = reqwest::get(format!("{moto_url}/moto-api/data.json"))
            .await
            .expect("moto's data")
            .text()
            .await
            .expect("moto's data");
        match serde_json::from_str(&body) {
            Ok(data) => break data,
            Err(e) if tries < 10 => {
                eprintln!("moto's data is not JSON yet ({e}); asking again");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("moto's data is not JSON after {tries} tries: {e}: {body:.300}"),
        }
    };
    let mut mails = Vec::new();
    for service in ["ses", "sesv2"] {
        let Some(models) = data[service].as_object() else {
            continue;
        };
        for instances in models.values().filter_map(Value::as_array) {
            for m in instances {
                let addressed = m["destinations"]
                    .as_object()
                    .is_some_and(|d| d.values().filter_map(Value::as_array).flatten().any(|a| a == to));
                if addressed && m.get("body").is_some() {
                    mails.push(m.clone());
                }
            }
        }
    }
    mails
}
