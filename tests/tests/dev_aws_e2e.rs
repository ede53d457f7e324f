//! End to end on the real `hookwise dev --aws --provision` process: the one-process runner
//! (API, delivery worker, dead-letter handler, scheduler) on DynamoDB, SQS and SES v2, all
//! on moto server, with fresh tables and queues made from template.yaml; a real receiving
//! server on 127.0.0.1; retries in real (short) time.
//!
//! Needs moto only (HOOKWISE_TEST_MOTO_URL): run under scripts/aws-test-services.sh. Without
//! it the tests skip, unless HOOKWISE_TEST_REQUIRE_AWS=1 (the script sets it), when they fail.
//!
//! One test runs it on another mix: SQS on LocalStack (HOOKWISE_TEST_LOCALSTACK_URL, from
//! scripts/localstack.sh), the tables on DynamoDB Local, and `--log-email` instead of SES v2
//! (LocalStack's free edition has none). It skips without LocalStack, unless
//! HOOKWISE_TEST_REQUIRE_LOCALSTACK=1 (that script sets it), when it fails:
//! `scripts/aws-test-services.sh run -- scripts/localstack.sh run -- cargo test ...`.
//!
//! Each scenario step is one helper, run on either mix: a [`Backend`] says where the step
//! reads the queues, the tables and the emails (moto's SES v2, or `--log-email`'s stderr).

mod aws_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use aws_support::{unique_prefix, workspace_root, DYNAMODB_LOCAL_URL, MOTO_URL, SENDER};
use hookwise_aws::AwsClients;
use hookwise_tests::{hookwise_bin, Api, Receiver};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);
/// Provisioning two tables and two queues on moto, then the first listen.
const STARTUP: Duration = Duration::from_secs(60);
const SHUTDOWN: Duration = Duration::from_secs(20);

/// Where `dev --aws` finds each service.
struct Endpoints {
    dynamodb: String,
    sqs: String,
    sesv2: String,
    kms: String,
}

impl Endpoints {
    /// All four on one server (moto).
    fn all(url: &str) -> Self {
        Self {
            dynamodb: url.to_owned(),
            sqs: url.to_owned(),
            sesv2: url.to_owned(),
            kms: url.to_owned(),
        }
    }
}

/// A running `hookwise dev --aws --provision`.
struct DevAws {
    child: Child,
    base: String,
    api_key: String,
    prefix: String,
    table: String,
    scheduler_table: String,
    delivery_queue_url: String,
    dead_letter_queue_url: String,
    /// Every line it printed on stderr so far (also passed on to the test's stderr).
    stderr: Arc<Mutex<Vec<String>>>,
}

impl DevAws {
    /// Start on a free port with a 1 s scheduler, fresh resources named after `label`.
    fn start(endpoints: &Endpoints, label: &str, extra: &[&str]) -> Self {
        let prefix = unique_prefix(label);
        let template = workspace_root().join("template.yaml");
        let mut command = Command::new(hookwise_bin());
        command
            .args(["dev", "--aws", "--provision", "--template"])
            .arg(&template)
            .args(["--aws-prefix", &prefix, "--sender-email", SENDER])
            .args(["--listen", "127.0.0.1:0", "--scheduler-interval", "1"])
            .args(extra)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("HOOKWISE_LOG", "warn")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_DEFAULT_REGION")
            .env_remove("HOOKWISE_API_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // These endpoints, whatever the test's own environment says: one server through
        // AWS_ENDPOINT_URL, or one per service through the SDK's per-service variables.
        let one = [&endpoints.sqs, &endpoints.sesv2, &endpoints.kms]
            .iter()
            .all(|url| **url == endpoints.dynamodb);
        if one {
            command
                .env("AWS_ENDPOINT_URL", &endpoints.sqs)
                .env_remove("AWS_ENDPOINT_URL_DYNAMODB")
                .env_remove("AWS_ENDPOINT_URL_SQS")
                .env_remove("AWS_ENDPOINT_URL_SESV2")
                .env_remove("AWS_ENDPOINT_URL_KMS");
        } else {
            command
                .env_remove("AWS_ENDPOINT_URL")
                .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoints.dynamodb)
                .env("AWS_ENDPOINT_URL_SQS", &endpoints.sqs)
                .env("AWS_ENDPOINT_URL_SESV2", &endpoints.sesv2)
                .env("AWS_ENDPOINT_URL_KMS", &endpoints.kms);
        }
        let mut child = command.spawn().expect("hookwise dev --aws starts");

        // Read stdout on a thread (and keep draining it), so a hung start fails in time.
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        // Keep stderr (the log mailer's emails are there) and pass it on.
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (lines, pipe) = (stderr.clone(), child.stderr.take().expect("stderr"));
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("{line}");
                lines.lock().unwrap().push(line);
            }
        });
        let (mut base, mut api_key, mut tables, mut queues) = (None, None, None, None);
        let start = Instant::now();
        while base.is_none() || api_key.is_none() || tables.is_none() || queues.is_none() {
            let left = STARTUP.saturating_sub(start.elapsed());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(e) => {
                    let status = child.try_wait().ok().flatten();
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("hookwise dev --aws did not print its address, key, tables and queues ({e:?}; exit status {status:?})");
                }
            };
            if let Some(url) = line.split("listening on ").nth(1) {
                base = Some(url.trim().to_owned());
            }
            if let Some(key) = line.strip_prefix("API key:") {
                api_key = Some(key.trim().to_owned());
            }
            if let Some(pair) = line.strip_prefix("tables:") {
                tables = Some(split_pair(pair));
            }
            if let Some(pair) = line.strip_prefix("queues:") {
                queues = Some(split_pair(pair));
            }
        }
        let (table, scheduler_table) = tables.unwrap();
        let (delivery_queue_url, dead_letter_queue_url) = queues.unwrap();
        Self {
            child,
            base: base.unwrap(),
            api_key: api_key.unwrap(),
            prefix,
            table,
            scheduler_table,
            delivery_queue_url,
            dead_letter_queue_url,
            stderr,
        }
    }

    /// The emails `--log-email` printed so far: each `---- email to {to} ----` block.
    fn logged_emails(&self) -> Vec<Email> {
        let lines = self.stderr.lock().unwrap().clone();
        let mut emails = Vec::new();
        let mut open: Option<(String, Vec<String>)> = None;
        for line in lines {
            if let Some(to) = line
                .strip_prefix("---- email to ")
                .and_then(|rest| rest.strip_suffix(" ----"))
            {
                open = Some((to.to_owned(), Vec::new()));
            } else if line == "---- end of email ----" {
                if let Some((to, body)) = open.take() {
                    let subject = body
                        .first()
                        .and_then(|l| l.strip_prefix("Subject: "))
                        .unwrap_or_default()
                        .to_owned();
                    // After the subject line comes one blank line, then the text.
                    let text = body.iter().skip(2).cloned().collect::<Vec<_>>().join("\n");
                    emails.push(Email {
                        to,
                        from: None,
                        subject,
                        body: text,
                    });
                }
            } else if let Some((_, body)) = open.as_mut() {
                body.push(line);
            }
        }
        emails
    }

    fn api(&self) -> Api {
        Api {
            base: self.base.clone(),
            key: self.api_key.clone(),
            http: reqwest::Client::new(),
        }
    }

    /// SIGTERM, then wait (bounded) for the process to exit.
    fn terminate(&mut self) -> (ExitStatus, Duration) {
        let start = Instant::now();
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -TERM {} failed", self.child.id());
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status, start.elapsed());
            }
            assert!(
                start.elapsed() < SHUTDOWN,
                "hookwise dev --aws still running {SHUTDOWN:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stop it with SIGTERM and insist on a clean exit (code 0) in time.
    fn assert_clean_shutdown(&mut self) {
        let (status, took) = self.terminate();
        assert_eq!(
            status.code(),
            Some(0),
            "hookwise dev --aws exited with {status} after SIGTERM"
        );
        eprintln!("hookwise dev --aws stopped cleanly {took:?} after SIGTERM");
    }
}

impl Drop for DevAws {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `"  a / b"` → `("a", "b")`.
fn split_pair(s: &str) -> (String, String) {
    let (a, b) = s.split_once(" / ").unwrap_or_else(|| panic!("`a / b` in {s:?}"));
    (a.trim().to_owned(), b.trim().to_owned())
}

/// Moto, or skip (or fail under scripts/aws-test-services.sh).
fn moto() -> Option<String> {
    aws_support::endpoint(MOTO_URL)
}

const LOCALSTACK_URL: &str = "HOOKWISE_TEST_LOCALSTACK_URL";
/// Set by scripts/localstack.sh: a missing LocalStack (or DynamoDB Local) fails the test.
const REQUIRE_LOCALSTACK: &str = "HOOKWISE_TEST_REQUIRE_LOCALSTACK";

/// LocalStack and DynamoDB Local, or skip (or fail under scripts/localstack.sh).
fn localstack_and_dynamodb_local() -> Option<(String, String)> {
    let required = std::env::var(REQUIRE_LOCALSTACK).is_ok_and(|v| v == "1");
    let get = |var: &str| std::env::var(var).ok().filter(|url| !url.is_empty());
    let missing = |what: &str| {
        assert!(!required, "{what} is not set, but {REQUIRE_LOCALSTACK}=1");
        eprintln!(
            "SKIPPED: {what} is not set; run under scripts/aws-test-services.sh run -- scripts/localstack.sh run -- ..."
        );
        None
    };
    let Some(localstack) = get(LOCALSTACK_URL) else {
        return missing(LOCALSTACK_URL);
    };
    let Some(dynamodb) = get(DYNAMODB_LOCAL_URL) else {
        return missing(DYNAMODB_LOCAL_URL);
    };
    Some((localstack, dynamodb))
}

/// A TCP port that only counts the connections made to it (then drops them): an SES v2
/// endpoint that `--log-email` must never call.
struct ConnectionCounter {
    addr: std::net::SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl ConnectionCounter {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Self { addr, connections }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Messages in a queue, visible or in flight.
async fn queue_depth(clients: &AwsClients, url: &str) -> u64 {
    let out = clients
        .sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .expect("queue attributes");
    let attrs = out.attributes.unwrap_or_default();
    [
        QueueAttributeName::ApproximateNumberOfMessages,
        QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        QueueAttributeName::ApproximateNumberOfMessagesDelayed,
    ]
    .iter()
    .map(|a| attrs.get(a).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0))
    .sum()
}

async fn wait_queue_empty(clients: &AwsClients, url: &str, within: Duration) {
    let start = Instant::now();
    loop {
        let depth = queue_depth(clients, url).await;
        if depth == 0 {
            return;
        }
        assert!(
            start.elapsed() < within,
            "{url} still holds {depth} messages after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The scheduler table: the sum of its cursors' versions (`#CURSOR#{shard}`, bumped
/// by every `schedule`; `None` if nothing was ever scheduled) and the tasks still waiting
/// (every item but the cursors, the scheduler's lease, `#LEASE`, and the audit's place,
/// `#AUDIT`).
async fn scheduler_table(clients: &AwsClients, table: &str) -> (Option<u64>, usize) {
    let out = clients
        .dynamodb
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .expect("scan the scheduler table");
    let mut cursor = None;
    let mut tasks = 0;
    for item in out.items() {
        let bucket = item.get("bucket").and_then(|b| b.as_s().ok());
        if bucket.is_some_and(|b| b == "#LEASE" || b == "#AUDIT") {
            continue;
        }
        if bucket.is_some_and(|b| b.starts_with("#CURSOR")) {
            let version: u64 = item
                .get("version")
                .and_then(|v| v.as_n().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            cursor = Some(cursor.unwrap_or(0) + version);
        } else {
            tasks += 1;
        }
    }
    (cursor, tasks)
}

fn started_at(attempt: &Value) -> chrono::DateTime<chrono::Utc> {
    attempt["started_at"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a started_at: {attempt}"))
}

/// The gaps between a delivery's attempts, in ms.
fn gaps_ms(attempts: &[Value]) -> Vec<i64> {
    attempts
        .windows(2)
        .map(|w| (started_at(&w[1]) - started_at(&w[0])).num_milliseconds())
        .collect()
}

/// A queue's name: the last segment of its URL (a table's name is itself).
fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap()
}

/// What the scenario steps read a running `dev --aws` through: the services it was pointed
/// at, and where its emails land.
struct Backend {
    /// Where the queues are, for messages ("moto", "LocalStack").
    queues: &'static str,
    /// Where the tables are, for messages ("moto", "DynamoDB Local").
    tables: &'static str,
    clients: AwsClients,
    outbox: Outbox,
}

impl Backend {
    /// Everything on moto, emails through its SES v2.
    async fn moto(moto_url: &str) -> Self {
        Self {
            queues: "moto",
            tables: "moto",
            clients: AwsClients::for_endpoint(moto_url, None).await,
            outbox: Outbox::MotoSes(moto_url.to_owned()),
        }
    }

    /// Queues on LocalStack, tables on DynamoDB Local, emails from `--log-email`.
    async fn localstack(localstack_url: &str, dynamodb_url: &str) -> Self {
        Self {
            queues: "LocalStack",
            tables: "DynamoDB Local",
            clients: AwsClients {
                dynamodb: AwsClients::for_endpoint(dynamodb_url, None).await.dynamodb,
                ..AwsClients::for_endpoint(localstack_url, None).await
            },
            outbox: Outbox::Stderr,
        }
    }
}

/// Where the dead-letter handler's emails land.
enum Outbox {
    /// SES v2 on this moto server, read from its `/moto-api/data.json`.
    MotoSes(String),
    /// `--log-email`: the `---- email to` blocks on the process's stderr.
    Stderr,
}

/// One email the dead-letter handler sent.
#[derive(Debug)]
struct Email {
    to: String,
    /// The sender, where the outbox records one (`--log-email` prints none).
    from: Option<String>,
    subject: String,
    body: String,
}

impl Outbox {
    /// Every email `dev` sent so far, as far as this outbox can tell: all of `--log-email`'s;
    /// in moto's SES (shared by every test) the ones to `owner`, an address only one test uses.
    async fn sent(&self, dev: &DevAws, owner: &str) -> Vec<Email> {
        match self {
            Outbox::MotoSes(moto_url) => aws_support::moto_mail_to(moto_url, owner)
                .await
                .iter()
                .map(|mail| {
                    let text = |field: &str| mail[field].as_str().unwrap_or_default().to_owned();
                    Email {
                        to: owner.to_owned(),
                        from: Some(text("source")),
                        subject: text("subject"),
                        body: text("body"),
                    }
                })
                .collect(),
            Outbox::Stderr => dev.logged_emails(),
        }
    }

    /// Where the emails to `owner` are looked for, for messages.
    fn place(&self, owner: &str) -> String {
        match self {
            Outbox::MotoSes(moto_url) => format!("SES email to {owner} in {moto_url}/moto-api/data.json"),
            Outbox::Stderr => format!("`---- email to {owner} ----` on stderr"),
        }
    }
}

/// The resources it printed were made from template.yaml under our prefix: the tables on
/// the backend (the main one with the template's indexes), the queues with their settings.
async fn check_the_template_resources(dev: &DevAws, backend: &Backend) {
    check_the_resource_names(dev);
    check_the_template_tables(dev, backend).await;
    check_the_template_queues(dev, backend).await;
}

/// Each printed table and queue is named `{prefix}-...{its template suffix}`.
fn check_the_resource_names(dev: &DevAws) {
    for (name, suffix) in [
        (&dev.table, "-main"),
        (&dev.scheduler_table, "-scheduler"),
        (&dev.delivery_queue_url, "-delivery"),
        (&dev.dead_letter_queue_url, "-dead-letter"),
    ] {
        let last = last_segment(name);
        assert!(
            last.starts_with(&format!("{}-", dev.prefix)) && last.ends_with(suffix),
            "{name}: not {}-...{suffix}",
            dev.prefix
        );
    }
}

/// Both tables are on the backend's DynamoDB, the main one with the template's indexes.
async fn check_the_template_tables(dev: &DevAws, backend: &Backend) {
    let mut described = Vec::new();
    for table in [&dev.table, &dev.scheduler_table] {
        let out = backend
            .clients
            .dynamodb
            .describe_table()
            .table_name(table)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{table} is on {}: {e}", backend.tables));
        described.push(out);
    }
    let mut indexes: Vec<&str> = described[0]
        .table()
        .map(|t| {
            t.global_secondary_indexes()
                .iter()
                .filter_map(|i| i.index_name())
                .collect()
        })
        .unwrap_or_default();
    indexes.sort_unstable();
    assert_eq!(
        indexes,
        ["by-subscription", "by-tenant", "by-tenant-status", "overdue"],
        "the template's indexes"
    );
}

/// The backend lists the three queues provisioned from template.yaml under our prefix
/// (delivery, dead-letter, parked); the delivery queue has the template's visibility
/// timeout (360 s) and redrives to the dead-letter queue.
async fn check_the_template_queues(dev: &DevAws, backend: &Backend) {
    let queues = backend.queues;
    let listed = backend
        .clients
        .sqs
        .list_queues()
        .queue_name_prefix(&dev.prefix)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{queues} lists its queues: {e}"));
    let mut names: Vec<&str> = listed.queue_urls().iter().map(|u| last_segment(u)).collect();
    names.sort_unstable();
    let dead_letter_name = last_segment(&dev.dead_letter_queue_url);
    let parked_name = dead_letter_name.replace("-dead-letter", "-parked");
    let mut want = vec![dead_letter_name, last_segment(&dev.delivery_queue_url), &parked_name];
    want.sort_unstable();
    assert_eq!(names, want, "{queues}'s queues under {}", dev.prefix);

    let attrs = backend
        .clients
        .sqs
        .get_queue_attributes()
        .queue_url(&dev.delivery_queue_url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap_or_else(|e| panic!("the delivery queue is on {queues}: {e}"))
        .attributes
        .unwrap_or_default();
    assert_eq!(
        attrs.get(&QueueAttributeName::VisibilityTimeout).map(String::as_str),
        Some("360"),
        "{attrs:?}"
    );
    let redrive = attrs.get(&QueueAttributeName::RedrivePolicy).expect("a redrive policy");
    assert!(
        redrive.contains(dead_letter_name),
        "redrives to the dead-letter queue: {redrive}"
    );
}

/// Subscribe `url` to `event_type`, retrying on `schedule` (s), send one such event, and
/// wait for its delivery to be `status`: returns the subscription, the event's id and the
/// delivery.
async fn one_event(
    dev: &DevAws,
    url: String,
    schedule: &[u64],
    event_type: &str,
    payload: Value,
    status: &str,
) -> (Value, String, Value) {
    let api = dev.api();
    let sub = api
        .subscribe(json!({
            "url": url,
            "event_types": [event_type],
            "retry_policy": {"schedule_seconds": schedule},
        }))
        .await;
    let event = api.send_event(event_type, payload).await;
    let id = event["deliveries"][0]["id"].as_str().unwrap();
    let delivery = api.wait_status(id, status, WAIT).await;
    (sub, event["id"].as_str().unwrap().to_owned(), delivery)
}

/// A flaky endpoint (two 500s, then 200) on 1 s retries: delivered on attempt 3, each
/// attempt recorded and each request signed; every retry waited on the queue's
/// DelaySeconds, none in the scheduler table, and nothing is left in the queue.
/// Returns the event's and the delivery's ids.
async fn a_flaky_endpoint_is_delivered_on_attempt_3(dev: &DevAws, backend: &Backend) -> (String, String) {
    let flaky = Receiver::start(2).await;
    let paid = json!({"amount": 100});
    let (_, event_id, delivered) =
        one_event(dev, flaky.url("/flaky"), &[1, 1, 1], "invoice.paid", paid, "delivered").await;
    let attempts = delivered["attempts"].as_array().unwrap();
    let codes: Vec<_> = attempts
        .iter()
        .map(|a| (a["attempt"].as_u64().unwrap(), a["status_code"].as_u64().unwrap()))
        .collect();
    assert_eq!(codes, [(1, 500), (2, 500), (3, 200)], "{delivered}");
    assert_eq!(attempts[0]["response_excerpt"], "down for maintenance");
    assert_eq!(delivered["attempt_count"], 3, "{delivered}");
    assert_eq!(delivered["last_status_code"], 200, "{delivered}");
    let gaps = gaps_ms(attempts);
    eprintln!(
        "{}: the flaky delivery's retries came after {gaps:?} ms (1 s asked)",
        backend.queues
    );
    for gap in &gaps {
        assert!(
            *gap >= 900,
            "a 1 s retry came after {gap} ms: the queue's delay was not kept: {delivered}"
        );
    }
    assert_eq!(flaky.count(), 3);
    for got in flaky.requests() {
        assert_eq!(got.header("webhook-id"), Some(event_id.as_str()));
        assert!(
            got.header("webhook-signature").is_some_and(|s| s.starts_with("v1,")),
            "{got:?}"
        );
    }

    // 1 s retries fit the queue's delay: nothing went through the scheduler table, and
    // nothing is left behind in the queue.
    let clients = &backend.clients;
    assert_eq!(scheduler_table(clients, &dev.scheduler_table).await, (None, 0));
    wait_queue_empty(clients, &dev.delivery_queue_url, WAIT).await;
    (event_id, delivered["id"].as_str().unwrap().to_owned())
}

/// The data lives in the main table (not SQLite): it holds items, the delivery list (an
/// index query) shows the one delivery as delivered, and the event keeps its payload.
async fn the_delivery_is_stored_in_the_main_table(dev: &DevAws, backend: &Backend, event_id: &str, id: &str) {
    let scanned = backend
        .clients
        .dynamodb
        .scan()
        .table_name(&dev.table)
        .send()
        .await
        .expect("scan the main table");
    assert!(scanned.count() > 0, "the main table on {} is empty", backend.tables);
    let api = dev.api();
    let (status, page) = api.get("/v1/deliveries").await;
    assert_eq!(status, 200, "{page}");
    let listed: Vec<_> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["id"].clone(), d["status"].clone()))
        .collect();
    assert_eq!(listed, [(json!(id), json!("delivered"))]);
    let (status, ev) = api.get(&format!("/v1/events/{event_id}")).await;
    assert_eq!((status, ev["payload"].clone()), (200, json!({"amount": 100})), "{ev}");
}

/// A delivery that went dead, and the endpoint that kept failing it.
struct DeadDelivery {
    failing: Receiver,
    /// The subscription's URL.
    url: String,
    event_id: String,
    id: String,
}

impl DeadDelivery {
    fn replay_route(&self) -> String {
        format!("/v1/deliveries/{}/replay", self.id)
    }
}

/// The whole dead-delivery scenario: it goes dead, the dead-letter handler sends one email,
/// and replay delivers it. `dev` must run with `--max-queue-delay 2` and `--owner-email owner`.
async fn an_always_failing_endpoint_goes_dead_then_replay_delivers_it(dev: &DevAws, backend: &Backend, owner: &str) {
    let dead = an_always_failing_endpoint_goes_dead(dev, backend).await;
    the_dead_letter_sends_one_email(dev, backend, owner, &dead).await;
    replay_delivers_it_without_a_second_email(dev, backend, owner, &dead).await;
}

/// An endpoint that always fails, on [1 s, 4 s] with the queue's delay capped at 2 s: three
/// 500s in round 0, then dead; retry 1 waited on the queue's delay, retry 2 (above the cap)
/// in the scheduler table, which the scheduler moved on to the queue, on time.
async fn an_always_failing_endpoint_goes_dead(dev: &DevAws, backend: &Backend) -> DeadDelivery {
    let failing = Receiver::start(u32::MAX).await;
    let failed = json!({"invoice": 9});
    let (sub, event_id, dead) =
        one_event(dev, failing.url("/failing"), &[1, 4], "invoice.failed", failed, "dead").await;
    let attempts = dead["attempts"].as_array().unwrap();
    let codes: Vec<_> = attempts
        .iter()
        .map(|a| {
            (
                a["round"].as_u64().unwrap(),
                a["attempt"].as_u64().unwrap(),
                a["status_code"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(codes, [(0, 1, 500), (0, 2, 500), (0, 3, 500)], "{dead}");
    assert_eq!(failing.count(), 3);
    let gaps = gaps_ms(attempts);
    eprintln!(
        "{}: the dead delivery's retries came after {gaps:?} ms (1 s, 4 s asked)",
        backend.queues
    );
    assert!(gaps[0] >= 900, "retry 1 came after {} ms, not ~1 s: {dead}", gaps[0]);
    // The scheduler moves it no earlier than the queue can hold it until due: on time.
    assert!(gaps[1] >= 3_500, "retry 2 came after {} ms, not ~4 s: {dead}", gaps[1]);
    let (cursor, waiting) = scheduler_table(&backend.clients, &dev.scheduler_table).await;
    assert!(
        cursor.is_some_and(|v| v >= 1),
        "nothing was ever scheduled in {}",
        dev.scheduler_table
    );
    assert_eq!(waiting, 0, "the scheduler moved the retry out of its table");
    DeadDelivery {
        failing,
        url: sub["url"].as_str().unwrap().to_owned(),
        event_id,
        id: dead["id"].as_str().unwrap().to_owned(),
    }
}

/// The dead-letter handler runs after the delivery is marked dead: exactly one email to
/// `owner` (from the sender, where the outbox records it), naming the event, the delivery,
/// the endpoint, its last answer and the replay URL; handled and deleted, so the
/// dead-letter message does not come back for a second one.
async fn the_dead_letter_sends_one_email(dev: &DevAws, backend: &Backend, owner: &str, dead: &DeadDelivery) {
    let outbox = &backend.outbox;
    let start = Instant::now();
    let emails = loop {
        let emails: Vec<_> = outbox
            .sent(dev, owner)
            .await
            .into_iter()
            .filter(|email| email.to == owner)
            .collect();
        if !emails.is_empty() {
            break emails;
        }
        assert!(start.elapsed() < WAIT, "no {} after {WAIT:?}", outbox.place(owner));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    wait_queue_empty(&backend.clients, &dev.dead_letter_queue_url, WAIT).await;
    assert_eq!(emails.len(), 1, "exactly one email: {emails:?}");
    let all = outbox.sent(dev, owner).await;
    assert_eq!(
        all.len(),
        1,
        "still one email in all once the dead letter is handled: {all:?}"
    );

    let email = &emails[0];
    if let Some(from) = &email.from {
        assert_eq!(from, SENDER, "{email:?}");
    }
    let url = dead.url.as_str();
    assert_eq!(
        email.subject,
        format!("[Hookwise] Delivery of invoice.failed to {url} failed")
    );
    let replay_url = format!("{}{}", dev.base, dead.replay_route());
    for needle in [
        dead.event_id.as_str(),
        "invoice.failed",
        &format!("Delivery:     {}", dead.id),
        url,
        "HTTP 500",
        replay_url.as_str(),
    ] {
        assert!(email.body.contains(needle), "the email lacks {needle}:\n{}", email.body);
    }
}

/// Replay, once the endpoint is back: a fresh attempt 1 of round 1 through the delivery
/// queue, delivered (the dead round's three attempts and the replay's one, the fourth
/// request for the same event); both queues drain, and no second email is sent.
async fn replay_delivers_it_without_a_second_email(dev: &DevAws, backend: &Backend, owner: &str, dead: &DeadDelivery) {
    let api = dev.api();
    dead.failing.recover();
    let (status, replayed) = api.post(&dead.replay_route(), json!({})).await;
    assert_eq!(status, 202, "{replayed}");
    let delivered = api.wait_status(&dead.id, "delivered", WAIT).await;
    let attempts = delivered["attempts"].as_array().unwrap();
    let last = attempts.last().unwrap();
    assert_eq!(
        (
            last["round"].as_u64(),
            last["attempt"].as_u64(),
            last["status_code"].as_u64()
        ),
        (Some(1), Some(1), Some(200)),
        "{delivered}"
    );
    assert_eq!(
        attempts.len(),
        4,
        "the dead round's three and the replay's one: {delivered}"
    );
    assert_eq!(dead.failing.count(), 4);
    assert_eq!(
        dead.failing.requests()[3].header("webhook-id"),
        Some(dead.event_id.as_str())
    );
    wait_queue_empty(&backend.clients, &dev.delivery_queue_url, WAIT).await;
    wait_queue_empty(&backend.clients, &dev.dead_letter_queue_url, WAIT).await;
    assert_eq!(
        backend.outbox.sent(dev, owner).await.len(),
        1,
        "no second email after the replay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_dev_aws_and_an_endpoint_failing_its_first_two_requests_then_attempt_three_delivers_and_all_are_recorded_in_dynamodb(
) {
    let Some(moto_url) = moto() else { return };
    let mut dev = DevAws::start(&Endpoints::all(&moto_url), "devflaky", &[]);
    let backend = Backend::moto(&moto_url).await;

    check_the_template_resources(&dev, &backend).await;
    // The queue's delay is 900 s by default: the 1 s retries fit it.
    let (event_id, id) = a_flaky_endpoint_is_delivered_on_attempt_3(&dev, &backend).await;
    the_delivery_is_stored_in_the_main_table(&dev, &backend, &event_id, &id).await;

    dev.assert_clean_shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_dev_aws_and_a_batch_of_events_then_each_valid_one_reaches_every_subscription_once() {
    let Some(moto_url) = moto() else { return };
    let mut dev = DevAws::start(&Endpoints::all(&moto_url), "devbatch", &[]);
    let receiver = Receiver::start(0).await;
    hookwise_tests::batch_reaches_every_subscription(&dev.api(), &receiver, WAIT).await;
    dev.assert_clean_shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_dev_aws_and_an_always_failing_endpoint_then_it_goes_dead_with_one_ses_v2_email_and_replay_delivers_it() {
    let Some(moto_url) = moto() else { return };
    let owner = format!("{}@owner.example", unique_prefix("o"));
    // The queue delays at most 2 s here: the 4 s retry must wait in the scheduler table.
    let mut dev = DevAws::start(
        &Endpoints::all(&moto_url),
        "devdead",
        &["--owner-email", &owner, "--max-queue-delay", "2"],
    );
    let backend = Backend::moto(&moto_url).await;

    // The email goes through SES v2, into moto's data.
    an_always_failing_endpoint_goes_dead_then_replay_delivers_it(&dev, &backend, &owner).await;

    dev.assert_clean_shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_dev_aws_with_sqs_on_localstack_tables_on_dynamodb_local_and_log_email_then_retries_wait_out_the_queue_delay_and_a_dead_delivery_prints_its_email(
) {
    let Some((localstack_url, dynamodb_url)) = localstack_and_dynamodb_local() else {
        return;
    };
    let Some(moto_url) = moto() else { return };
    // SES v2 at a port that only counts connections: with --log-email nothing may call it.
    let ses = ConnectionCounter::start().await;
    let owner = format!("{}@owner.example", unique_prefix("o"));
    let endpoints = Endpoints {
        dynamodb: dynamodb_url.clone(),
        sqs: localstack_url.clone(),
        sesv2: ses.url(),
        // The signing secrets' key: LocalStack runs SQS alone here.
        kms: moto_url,
    };
    // The queue delays at most 2 s: a 4 s retry waits in the scheduler table.
    let mut dev = DevAws::start(
        &endpoints,
        "devls",
        &["--log-email", "--owner-email", &owner, "--max-queue-delay", "2"],
    );
    let backend = Backend::localstack(&localstack_url, &dynamodb_url).await;

    // The queues are LocalStack's, the tables DynamoDB Local's; each retry that fits waits
    // on LocalStack's DelaySeconds; the dead-letter handler (its queue on LocalStack too)
    // prints the email on stderr.
    check_the_template_resources(&dev, &backend).await;
    a_flaky_endpoint_is_delivered_on_attempt_3(&dev, &backend).await;
    an_always_failing_endpoint_goes_dead_then_replay_delivers_it(&dev, &backend, &owner).await;

    assert_eq!(ses.count(), 0, "--log-email, yet something connected to SES v2");
    dev.assert_clean_shutdown();
}
