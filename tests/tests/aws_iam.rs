//! Least privilege, exercised and proven: the four function binaries (hosted by `cargo lambda
//! watch`), each signing as an IAM user that holds only its template.yaml policy, on a moto
//! server of this test's own that enforces IAM, behind a recording proxy. Every path of every
//! function runs: ingest and the API's reads and writes, a retry through the scheduler table,
//! a circuit breaker opening, probing, closing and releasing what it held, one turned off
//! while it holds (the API lets go of what it held), a rate-limited
//! backlog, an auto-disable and its email, deliveries that die with an email and a digest,
//! replays of a delivery and an event and a subscription's recovery, a 410 that disables its
//! subscription, a redriven message the dead-letter function puts back on its schedule, and
//! the scheduler's sweep of an overdue delivery.
//!
//! Then every AWS call each function made, as the proxy recorded it, is checked against that
//! function's policy with its resource (`hookwise_tests::iam_policy`): moto checks the action
//! of every request but matches DynamoDB and SES resources against `*`, so a call on a table,
//! index or identity the policy does not name passes there and is refused on AWS. An answer of
//! AccessDenied fails the test too, also one a function only logs. (moto server per test:
//! enforcing is server-wide.)

mod aws_support;

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_support::{AwsEnv, EventSources, Gateway, LambdaHost, SENDER};
use chrono::{DateTime, Utc};
use hookwise_aws::{env, AwsAdapters, AwsClients, AwsConfig};
use hookwise_core::model::{DeliveryId, Email, SubscriptionId};
use hookwise_core::ports::{Clock, DeliveryQueue, DeliveryTask, PortResult, SystemClock};
use hookwise_core::services::{Config, Ports, Services};
use hookwise_http::{HttpSender, SenderConfig};
use hookwise_tests::fault_proxy::{FaultPlan, FaultProxy};
use hookwise_tests::iam_policy::{self, function_policies, Need, Policy, Stack};
use hookwise_tests::Receiver;
use rand::SeedableRng;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(90);
/// The queue's delay limit here: a 5 s retry is a delayed message, a 12 s one goes through
/// the scheduler table.
const MAX_DELAY: u32 = 8;

/// A moto server of this test's own, stopped on drop.
struct Moto {
    child: Child,
    url: String,
}

impl Moto {
    async fn start() -> Self {
        let port = aws_support::free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server starts (scripts/aws-test-services.sh installs it)");
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while reqwest::get(format!("{url}/moto-api/")).await.is_err() {
            assert!(start.elapsed() < Duration::from_secs(30), "moto did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self { child, url }
    }

    /// From now on every request must be signed by a known user, and its policy allow it.
    async fn enforce_iam(&self) {
        let answer = reqwest::Client::new()
            .post(format!("{}/moto-api/reset-auth", self.url))
            .body("0")
            .send()
            .await
            .expect("reset-auth");
        assert!(answer.status().is_success(), "reset-auth: {}", answer.status());
    }

    /// One IAM query-API call, before enforcing (moto does not check the signature then).
    async fn iam(&self, params: &[(&str, &str)]) -> String {
        let mut form = vec![("Version", "2010-05-08")];
        form.extend_from_slice(params);
        let answer = reqwest::Client::new()
            .post(format!("{}/", self.url))
            .header(
                "authorization",
                "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=0",
            )
            .form(&form)
            .send()
            .await
            .expect("an IAM call");
        let status = answer.status();
        let body = answer.text().await.expect("a body");
        assert!(status.is_success(), "IAM {params:?}: {status} {body}");
        body
    }

    /// A user holding `policy` alone; its access key.
    async fn user(&self, name: &str, policy: &Value) -> (String, String) {
        self.iam(&[("Action", "CreateUser"), ("UserName", name)]).await;
        let document = policy.to_string();
        self.iam(&[
            ("Action", "PutUserPolicy"),
            ("UserName", name),
            ("PolicyName", "template"),
            ("PolicyDocument", &document),
        ])
        .await;
        let key = self.iam(&[("Action", "CreateAccessKey"), ("UserName", name)]).await;
        (xml_field(&key, "AccessKeyId"), xml_field(&key, "SecretAccessKey"))
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn xml_field(xml: &str, name: &str) -> String {
    let open = format!("<{name}>");
    let start = xml.find(&open).unwrap_or_else(|| panic!("no {name} in {xml}")) + open.len();
    let end = xml[start..].find('<').unwrap() + start;
    xml[start..end].to_owned()
}

/// A function's template policy as a document for moto, which matches DynamoDB and SES
/// requests against `*` (see the module's comment): SQS statements keep their queues, the
/// others are granted on `*`. moto names an operation's action after the operation, where
/// AWS authorises SendMessageBatch as sqs:SendMessage and TransactWriteItems by its items'
/// actions: moto gets its own names for those two.
fn moto_policy(policy: &Policy) -> Value {
    let statements: Vec<Value> = policy
        .statements
        .iter()
        .map(|s| {
            let mut actions = s.actions.clone();
            if actions.iter().any(|a| a == "sqs:SendMessage") {
                actions.push("sqs:SendMessageBatch".into());
            }
            if actions
                .iter()
                .any(|a| ["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"].contains(&a.as_str()))
            {
                actions.push("dynamodb:TransactWriteItems".into());
            }
            let resource = match actions.iter().all(|a| a.starts_with("sqs:")) {
                true => json!(s.resources),
                false => json!("*"),
            };
            let effect = if s.allow { "Allow" } else { "Deny" };
            json!({"Effect": effect, "Action": actions, "Resource": resource})
        })
        .collect();
    json!({"Version": "2012-10-17", "Statement": statements})
}

async fn clients_as(url: &str, (id, secret): &(String, String)) -> AwsClients {
    AwsClients::for_endpoint_as(url, id, secret, None).await
}

/// A queue that takes every message and sends none: to the sweep, a delivery stored while
/// its message was lost (a crash between the two).
struct LostMessages;

#[async_trait::async_trait]
impl DeliveryQueue for LostMessages {
    fn max_delay_seconds(&self) -> u32 {
        MAX_DELAY
    }
    async fn enqueue(&self, _: &[(DeliveryTask, u32)]) -> PortResult<()> {
        Ok(())
    }
    async fn dead_letter(&self, _: &[DeliveryTask]) -> PortResult<()> {
        Ok(())
    }
}

/// The wall clock, `behind` late.
struct Behind(chrono::Duration);

#[async_trait::async_trait]
impl Clock for Behind {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() - self.0
    }
    async fn sleep_until(&self, _: DateTime<Utc>) {}
}

/// Each function's (action, resource) that the scenarios below need made: that they were
/// recorded shows each path reached AWS (a breaker's release, an auto-disable's email, a
/// digest...). Where a call is made on every tick anyway (the sweep's query), the receivers
/// judge the path: the replay whose message was lost reaches its endpoint only if the
/// sweep re-queued it. Resources by logical id (`Table/index/name` for an index).
const PATHS: &[(&str, &str, &str, &str)] = &[
    ("hookwise-ingest", "sqs:SendMessage", "DeliveryQueue", "ingest"),
    (
        "hookwise-ingest",
        "kms:Encrypt",
        "SecretsKey",
        "a subscription's secret sealed at creation and rotation",
    ),
    (
        "hookwise-deliver",
        "kms:Decrypt",
        "SecretsKey",
        "a secret opened to sign",
    ),
    (
        "hookwise-ingest",
        "kms:Decrypt",
        "SecretsKey",
        "a secret revealed (the stack's RevealSecrets)",
    ),
    (
        "hookwise-ingest",
        "dynamodb:Query",
        "MainTable/index/by-subscription",
        "the API's listings",
    ),
    (
        "hookwise-deliver",
        "dynamodb:PutItem",
        "SchedulerTable",
        "a retry or a held attempt parked in the scheduler table",
    ),
    (
        "hookwise-deliver",
        "dynamodb:Query",
        "SchedulerTable",
        "a closing breaker reading what it held",
    ),
    (
        "hookwise-deliver",
        "dynamodb:BatchWriteItem",
        "SchedulerTable",
        "a closing breaker releasing a page",
    ),
    (
        "hookwise-ingest",
        "dynamodb:Query",
        "SchedulerTable",
        "a breaker turned off reading what it held",
    ),
    (
        "hookwise-ingest",
        "dynamodb:BatchWriteItem",
        "SchedulerTable",
        "a breaker turned off letting go of what it held",
    ),
    ("hookwise-deliver", "ses:SendEmail", "sender", "an auto-disable's email"),
    (
        "hookwise-deliver",
        "dynamodb:Query",
        "MainTable",
        "a tenant's subscriptions read to tell an operational webhook (the auto-disable's)",
    ),
    (
        "hookwise-deliver",
        "sqs:SendMessage",
        "DeadLetterQueue",
        "a delivery dying",
    ),
    (
        "hookwise-scheduler",
        "dynamodb:Query",
        "MainTable/index/overdue",
        "the sweep's query",
    ),
    (
        "hookwise-scheduler",
        "sqs:SendMessage",
        "DeliveryQueue",
        "moving retries and the sweep's re-queue",
    ),
    ("hookwise-scheduler", "ses:SendEmail", "sender", "a digest"),
    (
        "hookwise-dead-letter",
        "ses:SendEmail",
        "sender",
        "a dead delivery's email",
    ),
    (
        "hookwise-dead-letter",
        "sqs:SendMessage",
        "DeliveryQueue",
        "a redriven delivery put back",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn given_each_function_holding_only_its_template_policy_then_every_path_of_it_succeeds() {
    let Some(()) = aws_support::cargo_lambda() else {
        return;
    };
    if aws_support::endpoint(aws_support::MOTO_URL).is_none() {
        return; // moto is not installed (aws_support decided whether that fails)
    }
    let started = Utc::now();
    let moto = Moto::start().await;
    // The functions reach moto through the proxy, which records each call and its answer.
    let proxy = FaultProxy::start(&moto.url, FaultPlan::none()).await;
    proxy.record_calls();
    let env = AwsEnv::at(moto.url.clone(), moto.url.clone(), "iam", None).await;
    let p = &env.provisioned;
    let stack = Stack::new("us-east-1", "123456789012", "iam")
        .parameter("SenderEmail", SENDER)
        .parameter("RevealSecrets", "true")
        .table("MainTable", &p.table)
        .table("SchedulerTable", &p.scheduler_table)
        .queue("DeliveryQueue", &p.delivery_queue_url)
        .queue("DeadLetterQueue", &p.dead_letter_queue_url)
        .key("SecretsKey", &p.secrets_key);
    let template = std::fs::read_to_string(aws_support::workspace_root().join("template.yaml")).unwrap();
    let policies = function_policies(&template, &stack);
    assert_eq!(policies.len(), 4);
    let mut keys = HashMap::new();
    for (binary, policy) in &policies {
        keys.insert(binary.clone(), moto.user(binary, &moto_policy(policy)).await);
    }
    // The operator (this test: the tenant, the event sources' receive and delete) may do all.
    let operator = moto
        .user(
            "operator",
            &json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}),
        )
        .await;
    moto.enforce_iam().await;

    let admin = clients_as(&moto.url, &operator).await;
    let config = AwsConfig {
        queue_max_delay_seconds: MAX_DELAY,
        ..p.config(SENDER)
    };
    let loopback = SenderConfig {
        allow_cidrs: vec!["127.0.0.0/8".parse().unwrap()],
        ..SenderConfig::default()
    };
    let ports =
        AwsAdapters::new(&admin, &config).ports(Arc::new(HttpSender::new(loopback).unwrap()), Arc::new(SystemClock));
    let local = Services::new(ports.clone(), Config::default(), rand::rngs::StdRng::from_os_rng());
    let owner = format!("{}@owner.example", aws_support::unique_prefix("o"));
    let (tenant, key) = local
        .create_tenant(hookwise_core::services::NewTenant::named(
            "iam",
            Email::parse(&owner).unwrap(),
        ))
        .await
        .expect("the operator creates the tenant");

    // The functions sign as their own users, tables and queues on this moto, through the proxy.
    let mut fn_env = env.function_env(MAX_DELAY);
    fn_env.retain(|(k, _)| {
        !k.starts_with("AWS_ACCESS_KEY_ID")
            && !k.starts_with("AWS_SECRET_ACCESS_KEY")
            && !k.starts_with("AWS_ENDPOINT_URL")
    });
    // Every service through the proxy, whatever the environment says for one of them.
    for var in [
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_DYNAMODB",
        "AWS_ENDPOINT_URL_SQS",
        "AWS_ENDPOINT_URL_SESV2",
    ] {
        fn_env.push((var.into(), proxy.url()));
    }
    fn_env.push((env::DIGEST_WINDOW_SECONDS.into(), DIGEST_WINDOW_SECONDS.to_string()));
    fn_env.push((env::REVEAL_SECRETS.into(), "true".into()));
    let host = Arc::new(
        LambdaHost::start_with(&fn_env, |function| {
            let (id, secret) = keys[function].clone();
            vec![
                ("AWS_ACCESS_KEY_ID".to_owned(), id),
                ("AWS_SECRET_ACCESS_KEY".to_owned(), secret),
            ]
        })
        .await,
    );
    let sources = EventSources::start(host.clone(), (*admin.sqs).clone(), p).await;
    let api = Gateway {
        host: host.clone(),
        key,
    };
    let ok = |(status, body): (u16, Value), what: &str| -> Value {
        assert!((200..300).contains(&status), "{what}: {status} {body}");
        body
    };
    let subscribe = |body: Value| api.post("/v1/subscriptions", body);

    // Subscriptions: two that fail once (10 s and 12 s retries, through the scheduler table:
    // the queue's limit here is 8 s), one always down (its 1 s retries on the queue) (dead, emailed, a digest, replayed), one gone (410:
    // disabled by the deliver side), one whose breaker opens, one rate-limited, one failing
    // long enough to be disabled, and one whose breaker is turned off while it holds.
    let flaky = Receiver::start(1).await;
    let later = Receiver::start(1).await;
    let down = Receiver::start(u32::MAX).await;
    let gone = Receiver::start(0).await;
    gone.answer_with(410);
    let tripped = Receiver::start(u32::MAX).await;
    let limited = Receiver::start(0).await;
    let failing = Receiver::start(u32::MAX).await;
    let paused = Receiver::start(u32::MAX).await;
    let no_breaker = json!({"enabled": false});
    let flaky_sub = subscribe(
        json!({"url": flaky.url("/f"), "event_types": ["order.*"], "retry_policy": {"schedule_seconds": [10]}}),
    )
    .await;
    subscribe(json!({"url": later.url("/l"), "event_types": ["refund.*"], "retry_policy": {"schedule_seconds": [12]}}))
        .await;
    let down_sub = subscribe(json!({"url": down.url("/d"), "event_types": ["invoice.*"],
        "retry_policy": {"schedule_seconds": [1]}, "circuit_breaker": no_breaker}))
    .await;
    let gone_sub = subscribe(json!({"url": gone.url("/g"), "event_types": ["user.*"]})).await;
    let tripped_sub = subscribe(
        json!({"url": tripped.url("/t"), "event_types": ["breaker.*"], "auto_disable_after_hours": null,
        "retry_policy": {"schedule_seconds": [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]},
        "circuit_breaker": {"failure_threshold": 2, "probe_interval_seconds": 3}}),
    )
    .await;
    subscribe(json!({"url": limited.url("/r"), "event_types": ["limited.*"], "rate_limit_per_second": 1})).await;
    // Its breaker opens at the first failure and probes only each 10 minutes: what it holds
    // is let go when its breaker is turned off.
    let paused_sub = subscribe(json!({"url": paused.url("/p"), "event_types": ["paused.*"],
        "retry_policy": {"schedule_seconds": [600, 600]},
        "circuit_breaker": {"failure_threshold": 1, "probe_interval_seconds": 600}}))
    .await;
    let disabled_owner = format!("{}@owner.example", aws_support::unique_prefix("d"));
    let failing_sub = subscribe(json!({"url": failing.url("/x"), "event_types": ["failing.*"],
        "owner_email": disabled_owner, "auto_disable_after_hours": 1, "circuit_breaker": no_breaker}))
    .await;
    let flaky_id = flaky_sub["id"].as_str().unwrap();
    ok(
        api.call(
            "PATCH",
            &format!("/v1/subscriptions/{flaky_id}"),
            Some(json!({"description": "flaky"})),
        )
        .await,
        "PATCH",
    );
    let rotated = ok(
        api.call(
            "POST",
            &format!("/v1/subscriptions/{flaky_id}/rotate-secret"),
            Some(json!({})),
        )
        .await,
        "rotate the secret",
    );
    // The stack reveals secrets (RevealSecrets): Ingest opens the one it just sealed.
    let revealed = ok(
        api.call(
            "POST",
            &format!("/v1/subscriptions/{flaky_id}/reveal-secret"),
            Some(json!({})),
        )
        .await,
        "reveal the secret",
    );
    assert_eq!(revealed["secret"], rotated["secret"]);

    // The failing subscription has been active for two hours (the operator moves its start
    // back): its next failed attempt disables it.
    let failing_id = SubscriptionId::parse(failing_sub["id"].as_str().unwrap()).unwrap();
    let mut sub = ports
        .store
        .get_subscription(&tenant.id, &failing_id)
        .await
        .unwrap()
        .expect("the failing subscription");
    let read_at = sub.updated_at;
    sub.active_since = Some(Utc::now() - chrono::Duration::hours(2));
    sub.updated_at = Utc::now();
    ports
        .store
        .replace_subscription(&sub, read_at)
        .await
        .expect("moved back");

    // The operator routes, with an operator key: a tenant of the operator's naming, its
    // change, its keys rotated, the rollout moved, a listing and a batch for two tenants.
    let (_, operator_key) = local.create_operator_key().await.expect("an operator key");
    let operator_api = Gateway {
        host: host.clone(),
        key: operator_key,
    };
    let account = aws_support::unique_prefix("acct").replace(['.', ':'], "-");
    let created = ok(
        operator_api
            .call(
                "POST",
                "/v1/tenants",
                Some(json!({"id": account, "name": "An account", "owner_email": owner})),
            )
            .await,
        "create a tenant",
    );
    ok(
        operator_api
            .call(
                "PATCH",
                &format!("/v1/tenants/{account}"),
                Some(json!({"retries": "on"})),
            )
            .await,
        "change a tenant",
    );
    let rotated = ok(
        operator_api
            .call("POST", &format!("/v1/tenants/{account}/api-keys"), None)
            .await,
        "add a tenant's key",
    );
    let first_key = rotated["api_keys"][0]["id"].as_str().unwrap();
    ok(
        operator_api
            .call("DELETE", &format!("/v1/tenants/{account}/api-keys/{first_key}"), None)
            .await,
        "revoke a tenant's key",
    );
    assert_ne!(created["api_key"], rotated["api_key"]);
    ok(
        operator_api
            .call("PUT", "/v1/rollout", Some(json!({"retries_percent": 100})))
            .await,
        "move the rollout",
    );
    ok(operator_api.call("GET", "/v1/tenants", None).await, "list the tenants");
    let two = json!({"events": [
        {"type": "none.yet", "payload": {}, "tenant": account},
        {"type": "none.yet", "payload": {}, "tenant": tenant.id},
    ]});
    let both = ok(
        operator_api.call("POST", "/v1/events/batch", Some(two)).await,
        "a batch for two tenants",
    );
    assert_eq!(both["accepted"], 2, "{both}");
    ok(
        operator_api
            .call_for(Some(&account), "GET", "/v1/subscriptions", None)
            .await,
        "a tenant's route, for the tenant the operator names",
    );
    // A customer portal link: minted, used, revoked one and all.
    let session = ok(
        operator_api
            .call_for(Some(&account), "POST", "/v1/portal-sessions", Some(json!({})))
            .await,
        "mint a portal link",
    );
    let url = session["url"].as_str().unwrap();
    let portal_api = Gateway {
        host: host.clone(),
        key: url.split_once("#token=").unwrap().1.to_owned(),
    };
    ok(
        portal_api.call("GET", "/v1/deliveries", None).await,
        "the portal's reads",
    );
    let id = session["id"].as_str().unwrap();
    ok(
        operator_api
            .call_for(Some(&account), "DELETE", &format!("/v1/portal-sessions/{id}"), None)
            .await,
        "revoke a portal link",
    );
    assert_eq!(portal_api.call("GET", "/v1/deliveries", None).await.0, 401);
    ok(
        operator_api
            .call_for(Some(&account), "DELETE", "/v1/portal-sessions", None)
            .await,
        "revoke every portal link of a tenant",
    );

    // Ingest: keyed events in a batch, the batch again (answered from the store), one event.
    let keyed = json!({"events": [
        {"type": "order.paid", "payload": {"order": 1}, "idempotency_key": "o-1"},
        {"type": "invoice.failed", "payload": {"invoice": 2}, "idempotency_key": "i-2"},
        {"type": "refund.issued", "payload": {"refund": 4}, "idempotency_key": "r-4"},
    ]});
    let batch = ok(
        api.call("POST", "/v1/events/batch", Some(keyed.clone())).await,
        "a batch",
    );
    assert_eq!(batch["failed"], 0, "{batch}");
    let again = ok(
        api.call("POST", "/v1/events/batch", Some(keyed)).await,
        "the batch again",
    );
    assert_eq!(again["results"][0]["replayed"], true, "{again}");
    api.post("/v1/events", json!({"type": "user.deleted", "payload": {"user": 3}}))
        .await;
    let first_of = |ingested: &Value| ingested["deliveries"][0]["id"].as_str().unwrap().to_owned();
    let order = batch["results"][0].clone();
    let order_delivery = first_of(&order);
    let down_delivery = first_of(&batch["results"][1]);
    let refund_delivery = first_of(&batch["results"][2]);
    let events = |kind: &str, n: usize| {
        let events: Vec<Value> = (0..n)
            .map(|i| json!({"type": format!("{kind}.happened"), "payload": {"n": i}}))
            .collect();
        ok_batch(&api, json!({ "events": events }))
    };
    let tripped_deliveries = events("breaker", 4).await;
    let limited_deliveries = events("limited", 5).await;
    let failing_delivery = events("failing", 1).await.remove(0);
    events("paused", 1).await;

    // The breaker: opened by the first two failures, the other attempts held (a held one
    // gives up after its schedule's 60 s), a probe failing; then the endpoint recovers, a
    // probe closes the breaker and what it held is released.
    let tripped_id = &tripped_sub["id"];
    let start = Instant::now();
    loop {
        let sub = ok(
            api.call(
                "GET",
                &format!("/v1/subscriptions/{}", tripped_id.as_str().unwrap()),
                None,
            )
            .await,
            "the breaker's subscription",
        );
        if sub["circuit"]["state"] != "closed" {
            break;
        }
        assert!(start.elapsed() < WAIT, "the breaker never opened: {sub}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    tripped.recover();

    // Dead and emailed at once; three more die within the digest window that email opened
    // (sent at once, before the waits below), and go out together in one digest, sent by the
    // scheduler when the window has passed.
    api.wait_status(&down_delivery, "dead", WAIT).await;
    wait_mail(&moto.url, &owner, 1).await;
    let digested = events("invoice", 3).await;

    // While the order's delivery waits for its retry (10 s), SQS redrives a message for that
    // attempt to the dead-letter queue: the dead-letter function puts it back on its
    // schedule, a delayed message on the delivery queue.
    api.wait_status(&order_delivery, "retrying", WAIT).await;
    let redriven = hookwise_aws::encode_task(&DeliveryTask {
        delivery_id: DeliveryId::parse(&order_delivery).unwrap(),
        round: 0,
        attempt: 2,
        queued_at: None,
        slot: None,
        tenant_id: None,
        held_until: None,
        redrives: 0,
    });
    admin
        .sqs
        .send_message()
        .queue_url(&p.dead_letter_queue_url)
        .message_body(redriven)
        .send()
        .await
        .expect("a redriven message");
    api.wait_status(&order_delivery, "delivered", WAIT).await;
    api.wait_status(&refund_delivery, "delivered", WAIT).await;

    for d in &digested {
        api.wait_status(d, "dead", WAIT).await;
    }
    wait_mail(&moto.url, &owner, 2).await;

    // The breaker's held attempts were released.
    for d in &tripped_deliveries {
        api.wait_status(d, "delivered", WAIT).await;
    }

    // The paused endpoint's breaker holds its attempts (one failed, opening it; the next is
    // on its way to be the probe in 10 minutes; the others parked): turned off, it lets go
    // of the parked ones at once, through the Ingest function.
    let paused_id = paused_sub["id"].as_str().unwrap();
    let start = Instant::now();
    loop {
        let sub = ok(
            api.call("GET", &format!("/v1/subscriptions/{paused_id}"), None).await,
            "the paused subscription",
        );
        if sub["circuit"]["state"] == "open" {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "the paused endpoint's breaker never opened: {sub}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // (A Deliver process that has not seen a failure yet attempts without reading the
    // breaker: a wave or two may be attempted before the next are held.)
    while ports
        .scheduler
        .held(&SubscriptionId::parse(paused_id).unwrap(), 10)
        .await
        .unwrap()
        .len()
        < 2
    {
        assert!(start.elapsed() < WAIT, "the paused endpoint's breaker held nothing");
        events("paused", 3).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    paused.recover();
    let before = paused.count();
    ok(
        api.call(
            "PATCH",
            &format!("/v1/subscriptions/{paused_id}"),
            Some(json!({"circuit_breaker": {"enabled": false}})),
        )
        .await,
        "the breaker turned off",
    );
    // The two parked arrive now, not in 10 minutes.
    paused.wait_count(before + 2, WAIT).await;

    // The rate-limited backlog drains at its rate.
    for d in &limited_deliveries {
        api.wait_status(d, "delivered", WAIT).await;
    }

    // Disabled for failing, its owner told.
    api.wait_status(&failing_delivery, "dead", WAIT).await;
    let disabled = ok(
        api.call("GET", &format!("/v1/subscriptions/{failing_id}"), None).await,
        "the failing subscription",
    );
    assert_eq!(disabled["status"], "disabled", "{disabled}");
    wait_mail(&moto.url, &disabled_owner, 1).await;

    // Replayed four ways: a delivery, an event, the subscription's recovery, and one whose
    // replay was stored ten minutes ago and its message lost (a crash between the two): the
    // scheduler's sweep finds it overdue and queues it again.
    down.recover();
    let lost = Services::new(
        Ports {
            queue: Arc::new(LostMessages),
            clock: Arc::new(Behind(chrono::Duration::minutes(10))),
            ..ports.clone()
        },
        Config::default(),
        rand::rngs::StdRng::from_os_rng(),
    );
    lost.replay_delivery(&tenant, &DeliveryId::parse(&down_delivery).unwrap())
        .await
        .expect("a replay whose message is lost");
    ok(
        api.call(
            "POST",
            &format!("/v1/deliveries/{}/replay", digested[0]),
            Some(json!({})),
        )
        .await,
        "replay a delivery",
    );
    let digested_event = event_of(&api, &digested[1]).await;
    ok(
        api.call("POST", &format!("/v1/events/{digested_event}/replay"), Some(json!({})))
            .await,
        "replay an event",
    );
    let down_id = down_sub["id"].as_str().unwrap();
    ok(
        api.call(
            "POST",
            &format!("/v1/subscriptions/{down_id}/recover"),
            Some(json!({"since": started.to_rfc3339()})),
        )
        .await,
        "recover a subscription",
    );
    for d in [&down_delivery].into_iter().chain(&digested) {
        api.wait_status(d, "delivered", WAIT).await;
    }

    // 410: the subscription is disabled.
    let gone_id = gone_sub["id"].as_str().unwrap();
    let start = Instant::now();
    loop {
        let sub = ok(
            api.call("GET", &format!("/v1/subscriptions/{gone_id}"), None).await,
            "GET subscription",
        );
        if sub["status"] == "disabled" {
            break;
        }
        assert!(start.elapsed() < WAIT, "the 410 did not disable {gone_id}: {sub}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The API's reads: every listing index, an event, a delivery with its attempts.
    for path in [
        "/v1/subscriptions".to_owned(),
        "/v1/deliveries".to_owned(),
        "/v1/deliveries?status=delivered".to_owned(),
        "/v1/deliveries?status=dead".to_owned(),
        format!("/v1/deliveries?subscription_id={down_id}"),
        format!("/v1/events/{}", order["id"].as_str().unwrap()),
        format!("/v1/deliveries/{order_delivery}"),
    ] {
        ok(api.call("GET", &path, None).await, &path);
    }
    ok(
        api.call("DELETE", &format!("/v1/subscriptions/{gone_id}"), None).await,
        "DELETE",
    );

    // Judged from outside: each receiver got the event of each delivery made to it.
    for (receiver, deliveries) in [
        (&tripped, tripped_deliveries.clone()),
        (&limited, limited_deliveries.clone()),
        (&down, [vec![down_delivery.clone()], digested.clone()].concat()),
    ] {
        let got = received_events(receiver);
        for d in &deliveries {
            let event = event_of(&api, d).await;
            assert!(got.contains(&event), "{d} (event {event}) never reached its endpoint");
        }
    }
    assert!(
        sources.moved_by_scheduler() > 0,
        "the scheduler moved no retry from its table"
    );
    let failures = sources.log.lock().unwrap().failures.clone();
    sources.stop().await;

    // Every call each function made, checked against its policy, resource included.
    let functions: BTreeMap<String, String> = keys.iter().map(|(f, (id, _))| (id.clone(), f.clone())).collect();
    let (seen, problems) = iam_policy::check(&proxy.calls(), &functions, &policies, &stack);
    println!("function            action                   calls  resource");
    for ((function, need), n) in &seen {
        println!("{function:<19} {:<24} {n:>5}  {}", need.action, need.resource);
    }
    let arn = |logical: &str| match logical.split_once("/index/") {
        _ if logical == "sender" => format!("arn:aws:ses:us-east-1:123456789012:identity/{SENDER}"),
        Some((table, index)) => format!("{}/index/{index}", stack.arn(table)),
        None => stack.arn(logical),
    };
    let missing: Vec<String> = PATHS
        .iter()
        .filter(|(function, action, logical, _)| {
            let need = Need {
                action: (*action).to_owned(),
                resource: arn(logical),
            };
            !seen.contains_key(&((*function).to_owned(), need))
        })
        .map(|(function, action, logical, path)| format!("{function} made no {action} on {logical} ({path})"))
        .collect();
    assert!(
        problems.is_empty(),
        "calls the template's policies do not allow:\n{}",
        problems.join("\n")
    );
    assert!(missing.is_empty(), "paths that did not run:\n{}", missing.join("\n"));
    assert!(failures.is_empty(), "a function failed a batch: {failures:?}");
}

/// The digest window the functions run with here.
const DIGEST_WINDOW_SECONDS: u64 = 15;

/// POST a batch; the first delivery's id of each event.
async fn ok_batch(api: &Gateway, batch: Value) -> Vec<String> {
    let out = api.post("/v1/events/batch", batch).await;
    assert_eq!(out["failed"], 0, "{out}");
    out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["deliveries"][0]["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The event a delivery is of.
async fn event_of(api: &Gateway, delivery: &str) -> String {
    let d = api.delivery(delivery).await;
    d["event_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no event_id: {d}"))
        .to_owned()
}

/// Wait until `to` has been sent `n` emails.
async fn wait_mail(moto_url: &str, to: &str, n: usize) {
    let start = Instant::now();
    while aws_support::moto_mail_to(moto_url, to).await.len() < n {
        assert!(start.elapsed() < WAIT, "fewer than {n} emails to {to}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The event ids (`webhook-id`) a receiver got.
fn received_events(receiver: &Receiver) -> Vec<String> {
    receiver
        .requests()
        .iter()
        .filter_map(|r| r.header("webhook-id").map(str::to_owned))
        .collect()
}
