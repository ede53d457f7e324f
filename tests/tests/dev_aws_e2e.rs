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
}

impl Endpoints {
    /// All three on one server (moto).
    fn all(url: &str) -> Self {
        Self {
            dynamodb: url.to_owned(),
            sqs: url.to_owned(),
            sesv2: url.to_owned(),
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
        let one = endpoints.dynamodb == endpoints.sqs && endpoints.sqs == endpoints.sesv2;
        if one {
            command
                .env("AWS_ENDPOINT_URL", &endpoints.sqs)
                .env_remove("AWS_ENDPOINT_URL_DYNAMODB")
                .env_remove("AWS_ENDPOINT_URL_SQS")
                .env_remove("AWS_ENDPOINT_URL_SESV2");
        } else {
            command
                .env_remove("AWS_ENDPOINT_URL")
                .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoints.dynamodb)
                .env("AWS_ENDPOINT_URL_SQS", &endpoints.sqs)
                .env("AWS_ENDPOINT_URL_SESV2", &endpoints.sesv2);
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

    /// The emails `--log-email` printed so far: each `---- email to {to} ----` block as
    /// (to, subject, body).
    fn logged_emails(&self) -> Vec<(String, String, String)> {
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
                    emails.push((to, subject, text));
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

/// The scheduler table on moto: the sum of its cursors' versions (`#CURSOR#{shard}`, bumped
/// by every `schedule`; `None` if nothing was ever scheduled) and the tasks still waiting.
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
        if item
            .get("bucket")
            .and_then(|b| b.as_s().ok())
            .is_some_and(|b| b.starts_with("#CURSOR"))
        {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_dev_aws_and_an_endpoint_failing_its_first_two_requests_then_attempt_three_delivers_and_all_are_recorded_in_dynamodb(
) {
    let Some(moto_url) = moto() else { return };
    let mut dev = DevAws::start(&Endpoints::all(&moto_url), "devflaky", &[]);
    let api = dev.api();

    // The resources it printed were made from template.yaml, on moto, under our prefix.
    for (name, suffix) in [
        (&dev.table, "-main"),
        (&dev.scheduler_table, "-scheduler"),
        (&dev.delivery_queue_url, "-delivery"),
        (&dev.dead_letter_queue_url, "-dead-letter"),
    ] {
        let last = name.rsplit('/').next().unwrap();
        assert!(
            last.starts_with(&format!("{}-", dev.prefix)) && last.ends_with(suffix),
            "{name}: not {}-...{suffix}",
            dev.prefix
        );
    }
    let clients = AwsClients::for_endpoint(&moto_url, None).await;
    let described = clients
        .dynamodb
        .describe_table()
        .table_name(&dev.table)
        .send()
        .await
        .expect("the main table is on moto");
    let mut indexes: Vec<&str> = described
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
    let attrs = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&dev.delivery_queue_url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .expect("the delivery queue is on moto")
        .attributes
        .unwrap_or_default();
    assert_eq!(
        attrs.get(&QueueAttributeName::VisibilityTimeout).map(String::as_str),
        Some("360"),
        "{attrs:?}"
    );
    let redrive = attrs.get(&QueueAttributeName::RedrivePolicy).expect("a redrive policy");
    let dead_letter_name = dev.dead_letter_queue_url.rsplit('/').next().unwrap();
    assert!(
        redrive.contains(dead_letter_name),
        "redrives to the dead-letter queue: {redrive}"
    );

    let receiver = Receiver::start(2).await;
    api.subscribe(json!({"url": receiver.url("/hook"), "retry_policy": {"schedule_seconds": [1, 1, 1]}}))
        .await;
    let event = api.send_event("invoice.paid", json!({"amount": 100})).await;
    let event_id = event["id"].as_str().unwrap();
    let id = event["deliveries"][0]["id"].as_str().unwrap();

    let delivery = api.wait_status(id, "delivered", WAIT).await;
    let attempts = delivery["attempts"].as_array().unwrap();
    let codes: Vec<_> = attempts
        .iter()
        .map(|a| (a["attempt"].as_u64().unwrap(), a["status_code"].as_u64().unwrap()))
        .collect();
    assert_eq!(codes, [(1, 500), (2, 500), (3, 200)], "{delivery}");
    assert_eq!(attempts[0]["response_excerpt"], "down for maintenance");
    assert_eq!(delivery["attempt_count"], 3, "{delivery}");
    assert_eq!(delivery["last_status_code"], 200, "{delivery}");
    assert_eq!(receiver.count(), 3);
    for got in receiver.requests() {
        assert_eq!(got.header("webhook-id"), Some(event_id));
        assert!(
            got.header("webhook-signature").is_some_and(|s| s.starts_with("v1,")),
            "{got:?}"
        );
    }

    // The data lives in the DynamoDB table on moto (not SQLite), and the delivery list
    // (an index query) shows the delivery too.
    let scanned = clients
        .dynamodb
        .scan()
        .table_name(&dev.table)
        .send()
        .await
        .expect("scan the main table");
    assert!(scanned.count() > 0, "the main table on moto is empty");
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

    // 1 s retries fit the queue's delay (900 s by default): nothing went through the
    // scheduler table, and nothing is left behind in the queue.
    assert_eq!(scheduler_table(&clients, &dev.scheduler_table).await, (None, 0));
    wait_queue_empty(&clients, &dev.delivery_queue_url, WAIT).await;

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
    let api = dev.api();
    let clients = AwsClients::for_endpoint(&moto_url, None).await;

    let receiver = Receiver::start(u32::MAX).await;
    let sub = api
        .subscribe(json!({"url": receiver.url("/hook"), "retry_policy": {"schedule_seconds": [1, 4]}}))
        .await;
    let event = api.send_event("invoice.failed", json!({"invoice": 9})).await;
    let event_id = event["id"].as_str().unwrap();
    let id = event["deliveries"][0]["id"].as_str().unwrap();

    let dead = api.wait_status(id, "dead", WAIT).await;
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
    assert_eq!(receiver.count(), 3);
    // Retry 1 waited on the queue (1 s); retry 2 (4 s, above the 2 s limit) was written to
    // the scheduler table, and the scheduler moved it on to the queue.
    let gap = |a: usize, b: usize| (started_at(&attempts[b]) - started_at(&attempts[a])).num_milliseconds();
    assert!(
        gap(0, 1) >= 900,
        "retry 1 came after {} ms, not ~1 s: {dead}",
        gap(0, 1)
    );
    // The scheduler moves it no earlier than the queue can hold it until due: on time.
    assert!(
        gap(1, 2) >= 3_500,
        "retry 2 came after {} ms, not ~4 s: {dead}",
        gap(1, 2)
    );
    let (cursor, waiting) = scheduler_table(&clients, &dev.scheduler_table).await;
    assert!(
        cursor.is_some_and(|v| v >= 1),
        "nothing was ever scheduled in {}",
        dev.scheduler_table
    );
    assert_eq!(waiting, 0, "the scheduler moved the retry out of its table");

    // The dead-letter handler runs after the delivery is marked dead: one email, in moto's SES.
    let start = Instant::now();
    let mails = loop {
        let mails = aws_support::moto_mail_to(&moto_url, &owner).await;
        if !mails.is_empty() {
            break mails;
        }
        assert!(
            start.elapsed() < WAIT,
            "no SES email to {owner} in {moto_url}/moto-api/data.json after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Handled and deleted: the dead-letter message will not come back for a second email.
    wait_queue_empty(&clients, &dev.dead_letter_queue_url, WAIT).await;
    assert_eq!(mails.len(), 1, "exactly one email: {mails:?}");
    let mails = aws_support::moto_mail_to(&moto_url, &owner).await;
    assert_eq!(
        mails.len(),
        1,
        "still one email once the dead letter is handled: {mails:?}"
    );
    let mail = &mails[0];
    assert_eq!(mail["source"], SENDER, "{mail}");
    let subject = mail["subject"].as_str().unwrap_or_default();
    let url = sub["url"].as_str().unwrap();
    assert_eq!(
        subject,
        format!("[Hookwise] Delivery of invoice.failed to {url} failed")
    );
    let body = mail["body"].as_str().unwrap_or_default();
    let replay_route = format!("/v1/deliveries/{id}/replay");
    let replay_url = format!("{}{replay_route}", dev.base);
    for needle in [
        event_id,
        "invoice.failed",
        &format!("Delivery:     {id}"),
        url,
        "HTTP 500",
        replay_url.as_str(),
    ] {
        assert!(body.contains(needle), "the email lacks {needle}:\n{body}");
    }

    // Replay: a fresh attempt #1 of round 1, delivered once the endpoint is back.
    receiver.recover();
    let (status, replayed) = api.post(&replay_route, json!({})).await;
    assert_eq!(status, 202, "{replayed}");
    let delivered = api.wait_status(id, "delivered", WAIT).await;
    let last = delivered["attempts"].as_array().unwrap().last().unwrap().clone();
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
        delivered["attempts"].as_array().unwrap().len(),
        4,
        "the dead round's three and the replay's one: {delivered}"
    );
    assert_eq!(receiver.count(), 4);
    assert_eq!(receiver.requests()[3].header("webhook-id"), Some(event_id));
    wait_queue_empty(&clients, &dev.delivery_queue_url, WAIT).await;
    assert_eq!(
        aws_support::moto_mail_to(&moto_url, &owner).await.len(),
        1,
        "no second email after the replay"
    );

    dev.assert_clean_shutdown();
}

/// The gaps between a delivery's attempts, in ms.
fn gaps_ms(attempts: &[Value]) -> Vec<i64> {
    attempts
        .windows(2)
        .map(|w| (started_at(&w[1]) - started_at(&w[0])).num_milliseconds())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_dev_aws_with_sqs_on_localstack_tables_on_dynamodb_local_and_log_email_then_retries_wait_out_the_queue_delay_and_a_dead_delivery_prints_its_email(
) {
    let Some((localstack_url, dynamodb_url)) = localstack_and_dynamodb_local() else {
        return;
    };
    // SES v2 at a port that only counts connections: with --log-email nothing may call it.
    let ses = ConnectionCounter::start().await;
    let owner = format!("{}@owner.example", unique_prefix("o"));
    let endpoints = Endpoints {
        dynamodb: dynamodb_url.clone(),
        sqs: localstack_url.clone(),
        sesv2: ses.url(),
    };
    // The queue delays at most 2 s: a 4 s retry waits in the scheduler table.
    let mut dev = DevAws::start(
        &endpoints,
        "devls",
        &["--log-email", "--owner-email", &owner, "--max-queue-delay", "2"],
    );
    let api = dev.api();
    let clients = AwsClients {
        dynamodb: AwsClients::for_endpoint(&dynamodb_url, None).await.dynamodb,
        ..AwsClients::for_endpoint(&localstack_url, None).await
    };

    // The queues are LocalStack's: it lists the three provisioned from template.yaml, with
    // the template's visibility timeout and redrive; the tables are DynamoDB Local's.
    let listed = clients
        .sqs
        .list_queues()
        .queue_name_prefix(&dev.prefix)
        .send()
        .await
        .expect("LocalStack lists its queues");
    let mut names: Vec<String> = listed
        .queue_urls()
        .iter()
        .map(|u| u.rsplit('/').next().unwrap().to_owned())
        .collect();
    names.sort_unstable();
    let last = |url: &str| url.rsplit('/').next().unwrap().to_owned();
    let delivery_name = last(&dev.delivery_queue_url);
    let dead_letter_name = last(&dev.dead_letter_queue_url);
    let parked_name = dead_letter_name.replace("-dead-letter", "-parked");
    let mut want = vec![dead_letter_name.clone(), delivery_name.clone(), parked_name];
    want.sort_unstable();
    assert_eq!(names, want, "LocalStack's queues under {}", dev.prefix);
    let attrs = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&dev.delivery_queue_url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .expect("the delivery queue is on LocalStack")
        .attributes
        .unwrap_or_default();
    assert_eq!(
        attrs.get(&QueueAttributeName::VisibilityTimeout).map(String::as_str),
        Some("360"),
        "{attrs:?}"
    );
    let redrive = attrs.get(&QueueAttributeName::RedrivePolicy).expect("a redrive policy");
    assert!(
        redrive.contains(&dead_letter_name),
        "redrives to the dead-letter queue: {redrive}"
    );
    for table in [&dev.table, &dev.scheduler_table] {
        clients
            .dynamodb
            .describe_table()
            .table_name(table)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{table} is on DynamoDB Local: {e}"));
    }

    // A flaky endpoint: two 500s, then delivered; each 1 s retry waited on the queue's
    // DelaySeconds (LocalStack's), none in the scheduler table.
    let flaky = Receiver::start(2).await;
    api.subscribe(json!({
        "url": flaky.url("/flaky"),
        "event_types": ["invoice.paid"],
        "retry_policy": {"schedule_seconds": [1, 1, 1]},
    }))
    .await;
    let event = api.send_event("invoice.paid", json!({"amount": 100})).await;
    let paid_id = event["id"].as_str().unwrap().to_owned();
    let id = event["deliveries"][0]["id"].as_str().unwrap().to_owned();
    let delivered = api.wait_status(&id, "delivered", WAIT).await;
    let attempts = delivered["attempts"].as_array().unwrap();
    let codes: Vec<_> = attempts
        .iter()
        .map(|a| (a["attempt"].as_u64().unwrap(), a["status_code"].as_u64().unwrap()))
        .collect();
    assert_eq!(codes, [(1, 500), (2, 500), (3, 200)], "{delivered}");
    let gaps = gaps_ms(attempts);
    eprintln!("LocalStack: the flaky delivery's retries came after {gaps:?} ms (1 s asked)");
    for gap in &gaps {
        assert!(
            *gap >= 900,
            "a 1 s retry came after {gap} ms: the queue's delay was not kept: {delivered}"
        );
    }
    assert_eq!(flaky.count(), 3);
    for got in flaky.requests() {
        assert_eq!(got.header("webhook-id"), Some(paid_id.as_str()));
    }
    assert_eq!(scheduler_table(&clients, &dev.scheduler_table).await, (None, 0));
    wait_queue_empty(&clients, &dev.delivery_queue_url, WAIT).await;

    // An endpoint that always fails, on [1 s, 4 s]: retry 1 on the queue's delay, retry 2
    // (above the 2 s limit) through the scheduler table, then dead.
    let failing = Receiver::start(u32::MAX).await;
    let sub = api
        .subscribe(json!({
            "url": failing.url("/failing"),
            "event_types": ["invoice.failed"],
            "retry_policy": {"schedule_seconds": [1, 4]},
        }))
        .await;
    let event = api.send_event("invoice.failed", json!({"invoice": 9})).await;
    let event_id = event["id"].as_str().unwrap().to_owned();
    let id = event["deliveries"][0]["id"].as_str().unwrap().to_owned();
    let dead = api.wait_status(&id, "dead", WAIT).await;
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
    let gaps = gaps_ms(attempts);
    eprintln!("LocalStack: the dead delivery's retries came after {gaps:?} ms (1 s, 4 s asked)");
    assert!(gaps[0] >= 900, "retry 1 came after {} ms, not ~1 s: {dead}", gaps[0]);
    assert!(gaps[1] >= 3_500, "retry 2 came after {} ms, not ~4 s: {dead}", gaps[1]);
    let (cursor, waiting) = scheduler_table(&clients, &dev.scheduler_table).await;
    assert!(
        cursor.is_some_and(|v| v >= 1),
        "nothing was ever scheduled in {}",
        dev.scheduler_table
    );
    assert_eq!(waiting, 0, "the scheduler moved the retry out of its table");

    // The dead-letter handler (its queue on LocalStack too) prints one email on stderr.
    let start = Instant::now();
    let emails = loop {
        let emails: Vec<_> = dev
            .logged_emails()
            .into_iter()
            .filter(|(to, _, _)| *to == owner)
            .collect();
        if !emails.is_empty() {
            break emails;
        }
        assert!(
            start.elapsed() < WAIT,
            "no `---- email to {owner} ----` on stderr after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Handled and deleted: the dead-letter message does not come back for a second email.
    wait_queue_empty(&clients, &dev.dead_letter_queue_url, WAIT).await;
    let all = dev.logged_emails();
    assert_eq!(emails.len(), 1, "exactly one email: {emails:?}");
    assert_eq!(all.len(), 1, "one email in all: {all:?}");
    let (_, subject, body) = &emails[0];
    let url = sub["url"].as_str().unwrap();
    assert_eq!(
        *subject,
        format!("[Hookwise] Delivery of invoice.failed to {url} failed")
    );
    let replay_route = format!("/v1/deliveries/{id}/replay");
    let replay_url = format!("{}{replay_route}", dev.base);
    for needle in [
        event_id.as_str(),
        "invoice.failed",
        &format!("Delivery:     {id}"),
        url,
        "HTTP 500",
        replay_url.as_str(),
    ] {
        assert!(body.contains(needle), "the email lacks {needle}:\n{body}");
    }

    // Replay: attempt #1 of round 1 through LocalStack's queue, delivered.
    failing.recover();
    let (status, replayed) = api.post(&replay_route, json!({})).await;
    assert_eq!(status, 202, "{replayed}");
    let delivered = api.wait_status(&id, "delivered", WAIT).await;
    let last_attempt = delivered["attempts"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            last_attempt["round"].as_u64(),
            last_attempt["attempt"].as_u64(),
            last_attempt["status_code"].as_u64()
        ),
        (Some(1), Some(1), Some(200)),
        "{delivered}"
    );
    assert_eq!(failing.count(), 4);
    wait_queue_empty(&clients, &dev.delivery_queue_url, WAIT).await;
    wait_queue_empty(&clients, &dev.dead_letter_queue_url, WAIT).await;
    assert_eq!(dev.logged_emails().len(), 1, "no second email after the replay");

    assert_eq!(ses.count(), 0, "--log-email, yet something connected to SES v2");
    dev.assert_clean_shutdown();
}
