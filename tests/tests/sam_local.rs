//! `sam local`, offline: the four functions as SAM runs them, each in a Docker container of
//! the x86_64 local build, on tables in DynamoDB Local and queues and SES v2 in moto, all on
//! 127.0.0.1. `sam local invoke` of each function with the sample events of `infra/events/`,
//! exactly as shipped, then `sam local start-api` answering `POST /v1/events` and the
//! dashboard.
//!
//! The sample events name deliveries this test makes real: it seeds the tenant whose key the
//! ingest event carries, under a fixed id, and three subscriptions under fixed ids, so the
//! ingest event (its `Idempotency-Key` fixes the event's id, and the event's and the
//! subscriptions' ids its deliveries') creates exactly the deliveries the SQS events name.
//! Invoked in order they do what the pipeline does: ingest stores and queues three
//! deliveries; deliver delivers one to a receiver and kills the other (its endpoint fails,
//! its policy allows no retry), handing it to the dead-letter queue; dead-letter emails the
//! dead one's owner and puts the third, whose message SQS gave up on, back on the queue; the
//! scheduler moves a retry due from its table to the queue.
//!
//! Run by `scripts/sam-local.sh test`, which starts Docker, builds the image and the local
//! build and sets HOOKWISE_TEST_SAM_LOCAL=1; without it the test skips, with it anything
//! missing fails it.

mod aws_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use aws_support::{workspace_root, AwsEnv, DYNAMODB_LOCAL_URL, MOTO_URL, SENDER};
use hookwise_aws::{decode_task, env};
use hookwise_core::auth::hash_api_key;
use hookwise_core::model::{
    ApiKey, DeliveryId, DeliveryStatus, Email, EventId, Subscription, SubscriptionId, Tenant, TenantId,
};
use hookwise_core::ports::{DeliveryTask, ScheduledTask, SecretContext};
use hookwise_core::services::Services;
use hookwise_tests::{Api, Receiver, TempDir};
use serde_json::{json, Value};

/// Set to 1 by scripts/sam-local.sh once Docker, the image and the local build are ready.
const READY: &str = "HOOKWISE_TEST_SAM_LOCAL";
/// The seeded tenant and subscriptions: the ids the sample events' deliveries derive from.
const TENANT: &str = "ten_01JDX3S6G0TENANT0000000001";
const SUB_ACCEPTS: &str = "sub_01JDX3S6G0ACCEPTS000000001";
const SUB_DEAD: &str = "sub_01JDX3S6G0DEAD000000000002";
const SUB_REDRIVE: &str = "sub_01JDX3S6G0REDR1VE000000003";
/// One `sam local` command's limit (the first one also builds SAM's rapid image).
const SAM_WAIT: Duration = Duration::from_secs(240);

/// What scripts/sam-local.sh prepared.
struct SamLocal {
    /// Its sam (the pinned one, with `--docker-network host` working).
    sam: PathBuf,
    /// The local build's template.
    template: PathBuf,
    /// The env file for this test's tables, queues and ports.
    env_file: PathBuf,
    /// Where sam itself asks STS for the account id (moto): it asks before every command.
    sts_url: String,
}

/// `None` (skip) unless scripts/sam-local.sh runs this test; then whatever is missing fails.
fn prepared() -> Option<(PathBuf, PathBuf)> {
    if std::env::var(READY).ok().as_deref() != Some("1") {
        eprintln!("SKIPPED: {READY} is not set; `scripts/sam-local.sh test` runs this test (Docker, sam local)");
        return None;
    }
    for var in [MOTO_URL, DYNAMODB_LOCAL_URL] {
        assert!(
            std::env::var(var).is_ok_and(|v| !v.is_empty()),
            "{var} is not set, but {READY}=1: run it inside scripts/aws-test-services.sh (`scripts/sam-local.sh test` does)"
        );
    }
    let path = |var: &str| {
        let path = PathBuf::from(std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set, but {READY}=1")));
        assert!(path.exists(), "{var}={} does not exist", path.display());
        path
    };
    Some((path("HOOKWISE_SAM_LOCAL_SAM"), path("HOOKWISE_SAM_LOCAL_TEMPLATE")))
}

impl SamLocal {
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let root = workspace_root();
        let mut cmd = tokio::process::Command::new(&self.sam);
        cmd.args(args)
            .args(["--config-file", root.join("samconfig.toml").to_str().unwrap()])
            .args(["--config-env", "local", "--template", self.template.to_str().unwrap()])
            .args(["--env-vars", self.env_file.to_str().unwrap()])
            .current_dir(&root)
            // The functions sign with what sam finds here: DynamoDB Local keeps a database
            // per access key, and the tables were made with this one.
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            // Not AWS's STS (off this machine, and minutes of retries when unreachable).
            .env("AWS_ENDPOINT_URL_STS", &self.sts_url)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("SAM_CLI_TELEMETRY", "0")
            .kill_on_drop(true);
        cmd
    }

    /// `sam local invoke function --event infra/events/<event>`: the function's answer.
    async fn invoke(&self, function: &str, event: &str) -> Value {
        let event = workspace_root().join("infra/events").join(event);
        let started = Instant::now();
        let run = self
            .command(&["local", "invoke", function, "--event", event.to_str().unwrap()])
            .stdin(Stdio::null())
            .output();
        let out = tokio::time::timeout(SAM_WAIT, run)
            .await
            .unwrap_or_else(|_| panic!("sam local invoke {function} took over {SAM_WAIT:?}"))
            .expect("sam runs");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        // sam prints the function's answer on stdout, the container's logs on stderr.
        let answer = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| serde_json::from_str::<Value>(l).ok());
        let report = stderr
            .lines()
            .find(|l| l.starts_with("REPORT"))
            .unwrap_or("no REPORT line");
        eprintln!(
            "sam local invoke {function}: {:.1?} ({})",
            started.elapsed(),
            report.trim()
        );
        match answer {
            Some(answer) if out.status.success() && answer.get("errorType").is_none() => answer,
            _ => panic!(
                "sam local invoke {function} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
                out.status,
                tail(&stderr, 60)
            ),
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The tasks an SQS sample event carries, as (delivery, round, attempt).
fn sample_tasks(event: &str) -> Vec<(String, u32, u32)> {
    let sample = read_json(&workspace_root().join("infra/events").join(event));
    sample["Records"]
        .as_array()
        .expect("Records")
        .iter()
        .map(|r| {
            let task = decode_task(r["body"].as_str().expect("a body")).expect("a task");
            let tenant = task.tenant_id.as_ref().map(|t| t.as_str());
            assert!(
                tenant.is_none_or(|t| t == TENANT),
                "{event}: a task of another tenant: {task:?}"
            );
            task_key(&task)
        })
        .collect()
}

fn task_key(t: &DeliveryTask) -> (String, u32, u32) {
    (t.delivery_id.to_string(), t.round, t.attempt)
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// infra/env.json with this run's values: the same names (the local build declared them).
fn write_env_file(env: &AwsEnv, api_base: &str, dir: &Path) -> PathBuf {
    let p = &env.provisioned;
    let ours = json!({
        "AWS_ENDPOINT_URL": env.moto_url,
        "AWS_ENDPOINT_URL_DYNAMODB": env.dynamodb_url,
        env::TABLE: p.table,
        env::SCHEDULER_TABLE: p.scheduler_table,
        env::DELIVERY_QUEUE_URL: p.delivery_queue_url,
        env::DEAD_LETTER_QUEUE_URL: p.dead_letter_queue_url,
        env::SENDER_EMAIL: SENDER,
        env::SECRETS_KEY: p.secrets_key,
        env::ALLOWED_TARGET_CIDRS: "127.0.0.0/8",
        env::PUBLIC_API_URL: api_base,
        "RUST_LOG": "info",
    });
    let shipped = read_json(&workspace_root().join("infra/env.json"));
    let names = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        names(&shipped["Parameters"]),
        names(&ours),
        "infra/env.json and this test set the same variables"
    );
    let path = dir.join("env.json");
    std::fs::write(&path, json!({ "Parameters": ours }).to_string()).unwrap();
    path
}

/// The tenant under `TENANT`, holding `api_key`: made as a stand-in (every field the service
/// fills), then written again under the sample's id and key.
async fn seed_tenant(services: &Services, owner: &str, api_key: &str) -> Tenant {
    let (stand_in, _) = services
        .create_tenant(hookwise_core::services::NewTenant::named(
            "sam local samples",
            Email::parse(owner).unwrap(),
        ))
        .await
        .expect("a tenant");
    let tenant = Tenant {
        id: TenantId::parse(TENANT).unwrap(),
        api_keys: vec![ApiKey {
            hash: hash_api_key(api_key),
            created_at: stand_in.created_at,
        }],
        ..stand_in
    };
    services
        .ports()
        .store
        .create_tenant(&tenant)
        .await
        .expect("the sample tenant");
    tenant
}

/// A subscription as the API creates it from `new`, then moved to the fixed `id` (its secret
/// sealed again for that id: an envelope opens only for the subscription it was sealed for).
async fn seed_subscription(services: &Services, tenant: &Tenant, id: &str, new: Value) -> Subscription {
    let store = &services.ports().store;
    let made = services
        .create_subscription(tenant, serde_json::from_value(new).unwrap())
        .await
        .expect("a subscription");
    store
        .delete_subscription(&tenant.id, &made.subscription.id)
        .await
        .expect("delete");
    let id = SubscriptionId::parse(id).unwrap();
    let context = SecretContext::new(&tenant.id, &id);
    let sub = Subscription {
        id,
        secret: services
            .ports()
            .secrets
            .seal(&made.secret, &context)
            .await
            .expect("seal"),
        ..made.subscription
    };
    store.create_subscription(&sub).await.expect("the sample subscription");
    sub
}

/// The messages on the queue, received and deleted, as tasks: at least `expect` of them (a
/// message sent with a delay shows up late), then whatever else is there.
async fn drain(env: &AwsEnv, queue_url: &str, expect: usize) -> Vec<(String, u32, u32)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    loop {
        let out = env
            .clients
            .sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("receive");
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() && (tasks.len() >= expect || started.elapsed() > Duration::from_secs(20)) {
            return sorted(tasks);
        }
        for m in messages {
            tasks.push(task_key(&decode_task(m.body().unwrap_or_default()).expect("a task")));
            env.clients
                .sqs
                .delete_message()
                .queue_url(queue_url)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send()
                .await
                .expect("delete");
        }
    }
}

async fn status_of(services: &Services, id: &str) -> DeliveryStatus {
    services
        .ports()
        .store
        .get_delivery(&DeliveryId::parse(id).unwrap())
        .await
        .expect("read a delivery")
        .unwrap_or_else(|| panic!("delivery {id} is stored"))
        .status
}

/// Containers of this machine's Docker that scripts/sam-local.sh's sam made and left.
fn sam_containers() -> String {
    let out = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", "label=hookwise.sam-local"])
        .output()
        .expect("docker runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn given_sam_local_and_the_sample_events_then_each_function_does_its_part_and_start_api_serves_the_api() {
    let Some((sam, template)) = prepared() else {
        return;
    };
    let began = Instant::now();
    let env = AwsEnv::new("samlocal", None).await.expect("moto and DynamoDB Local");
    let dir = TempDir::new("sam-local");
    let api_port = aws_support::free_port();
    let api_base = format!("http://127.0.0.1:{api_port}");
    let sam = SamLocal {
        sam,
        template,
        env_file: write_env_file(&env, &api_base, &dir.0),
        sts_url: env.moto_url.clone(),
    };
    let p = env.provisioned.clone();

    // The seeded tenant and subscriptions the sample events' deliveries derive from.
    let ingest_sample = read_json(&workspace_root().join("infra/events/ingest-http-api.json"));
    let api_key = ingest_sample["headers"]["authorization"]
        .as_str()
        .and_then(|a| a.strip_prefix("Bearer "))
        .expect("the sample's API key")
        .to_owned();
    let idempotency_key = ingest_sample["headers"]["idempotency-key"].as_str().unwrap();
    let owner = format!("{}@owner.example", aws_support::unique_prefix("sam"));
    let local = env.services(None);
    let accepts = Receiver::start(0).await;
    let down = Receiver::start(u32::MAX).await;
    let tenant = seed_tenant(&local, &owner, &api_key).await;
    let wanted = |url: String| json!({"url": url, "event_types": ["invoice.*"]});
    seed_subscription(&local, &tenant, SUB_ACCEPTS, wanted(accepts.url("/accepts"))).await;
    let mut dead_sub = wanted(down.url("/down"));
    dead_sub["retry_policy"] = json!({"schedule_seconds": []}); // one attempt, no retry
    seed_subscription(&local, &tenant, SUB_DEAD, dead_sub).await;
    seed_subscription(&local, &tenant, SUB_REDRIVE, wanted(accepts.url("/redrive"))).await;

    let event_id = EventId::for_key(&tenant.id, idempotency_key);
    let delivery = |sub: &str| DeliveryId::for_event(&event_id, &SubscriptionId::parse(sub).unwrap()).to_string();
    let (d_accepts, d_dead, d_redrive) = (delivery(SUB_ACCEPTS), delivery(SUB_DEAD), delivery(SUB_REDRIVE));
    let first = |id: &String| (id.clone(), 0, 1);
    assert_eq!(
        sample_tasks("deliver-sqs.json"),
        [first(&d_accepts), first(&d_dead)],
        "infra/events/deliver-sqs.json names the first attempts of the deliveries the sample ingest makes \
         (if their ids' derivation changed, write these ids into it)"
    );
    assert_eq!(
        sample_tasks("dead-letter-sqs.json"),
        [first(&d_dead), first(&d_redrive)],
        "infra/events/dead-letter-sqs.json names the dead delivery's hand-off and the third delivery's first attempt"
    );
    eprintln!(
        "seeded: tenant {TENANT}, its three subscriptions ({:.1?})",
        began.elapsed()
    );

    // Ingest: the event and its three deliveries stored, their first attempts queued.
    let answer = sam.invoke("IngestFunction", "ingest-http-api.json").await;
    assert_eq!(answer["statusCode"], 202, "{answer}");
    let body: Value = serde_json::from_str(answer["body"].as_str().expect("a body")).unwrap();
    assert_eq!(body["id"], event_id.as_str(), "{body}");
    let ids: BTreeSet<String> = body["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        ids,
        BTreeSet::from([d_accepts.clone(), d_dead.clone(), d_redrive.clone()])
    );
    for id in &ids {
        assert_eq!(status_of(&local, id).await, DeliveryStatus::Pending, "{id}");
    }
    assert_eq!(
        drain(&env, &p.delivery_queue_url, ids.len()).await,
        sorted(ids.iter().map(first).collect()),
        "the first attempts are queued"
    );

    // Deliver: one delivered, signed, to the receiver; the other dead at its only attempt and
    // handed to the dead-letter queue.
    let answer = sam.invoke("DeliverFunction", "deliver-sqs.json").await;
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    assert_eq!(accepts.count(), 1, "one webhook to the accepting endpoint");
    let webhook = &accepts.requests()[0];
    assert_eq!(webhook.header("webhook-id"), Some(event_id.as_str()));
    assert!(webhook
        .header("webhook-signature")
        .is_some_and(|s| s.starts_with("v1,")));
    assert_eq!(webhook.json()["data"]["invoice"], "in_1042");
    assert_eq!(down.count(), 1, "one attempt at the failing endpoint");
    assert_eq!(status_of(&local, &d_accepts).await, DeliveryStatus::Delivered);
    assert_eq!(status_of(&local, &d_dead).await, DeliveryStatus::Dead);
    assert_eq!(drain(&env, &p.dead_letter_queue_url, 1).await, [first(&d_dead)]);
    let queued = drain(&env, &p.delivery_queue_url, 0).await;
    assert!(queued.is_empty(), "no retry queued: {queued:?}");

    // Dead-letter: the owner's email about the dead delivery, in moto's SES v2; the delivery
    // SQS gave up on (not dead) back on the queue.
    let answer = sam.invoke("DeadLetterFunction", "dead-letter-sqs.json").await;
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    let mails = aws_support::moto_mail_to(&env.moto_url, &owner).await;
    assert_eq!(mails.len(), 1, "one email to {owner}: {mails:?}");
    assert!(
        mails[0].to_string().contains(&d_dead),
        "the email names {d_dead}: {}",
        mails[0]
    );
    assert_eq!(
        drain(&env, &p.delivery_queue_url, 1).await,
        [first(&d_redrive)],
        "rescheduled"
    );

    // Scheduler: a retry due from the scheduler table moved to the queue.
    let retry = decode_task(&json!({"delivery_id": d_redrive, "round": 0, "attempt": 2}).to_string()).unwrap();
    local
        .ports()
        .scheduler
        .schedule(&ScheduledTask {
            task: retry.clone(),
            due: chrono::Utc::now() - chrono::Duration::seconds(1),
        })
        .await
        .expect("schedule a retry");
    let answer = sam.invoke("SchedulerFunction", "scheduler-scheduled.json").await;
    assert_eq!(answer["moved"], 1, "{answer}");
    assert_eq!(drain(&env, &p.delivery_queue_url, 1).await, [task_key(&retry)]);

    // start-api: the HTTP API on 127.0.0.1, the ingest function behind it.
    let started = Instant::now();
    let log = dir.0.join("start-api.log");
    let mut server = sam
        .command(&[
            "local",
            "start-api",
            "--host",
            "127.0.0.1",
            "--port",
            &api_port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.0.join("start-api.err")).unwrap())
        .spawn()
        .expect("sam local start-api starts");
    let http = reqwest::Client::new();
    let dashboard = loop {
        if let Ok(resp) = http.get(format!("{api_base}/dashboard")).send().await {
            break resp;
        }
        if let Some(status) = server.try_wait().unwrap() {
            panic!(
                "sam local start-api exited ({status}):\n{}",
                tail(
                    &std::fs::read_to_string(dir.0.join("start-api.err")).unwrap_or_default(),
                    60
                )
            );
        }
        assert!(
            started.elapsed() < SAM_WAIT,
            "sam local start-api did not listen on {api_base}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!("sam local start-api: listening after {:.1?}", started.elapsed());
    assert_eq!(dashboard.status(), 200);
    let html = dashboard.text().await.unwrap();
    assert!(html.contains("<html") || html.contains("<!doctype html"), "{html:.200}");
    let api = Api {
        base: api_base.clone(),
        key: api_key.clone(),
        http,
    };
    let event = api.send_event("invoice.paid", json!({"invoice": "in_1043"})).await;
    let ids: Vec<String> = event["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 3, "one delivery per subscription: {event}");
    for id in &ids {
        assert_eq!(api.delivery(id).await["status"], "pending");
    }
    assert_eq!(
        drain(&env, &p.delivery_queue_url, ids.len()).await,
        sorted(ids.iter().map(first).collect()),
        "queued"
    );
    eprintln!(
        "sam local start-api: POST /v1/events, GET /v1/deliveries/{{id}} and /dashboard answered ({:.1?})",
        started.elapsed()
    );

    // SIGTERM, which sam handles by stopping and removing its warm containers. (Ctrl-C's
    // SIGINT works too, but a shell makes the commands it starts in the background ignore it.)
    let pid = server.id().expect("a pid").to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
    assert!(
        stopped.is_ok(),
        "sam local start-api did not stop on SIGTERM within 60 s"
    );
    let left = sam_containers();
    assert!(
        left.is_empty(),
        "sam left containers behind ({left}); its log:\n{}",
        tail(
            &std::fs::read_to_string(dir.0.join("start-api.err")).unwrap_or_default(),
            80
        )
    );
    eprintln!("sam local: everything in {:.1?}", began.elapsed());
}
