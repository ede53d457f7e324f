//! Least privilege, exercised: the four function binaries (hosted by `cargo lambda watch`),
//! each signing as an IAM user that holds only its template.yaml policy, on a moto server of
//! this test's own that enforces IAM. Every path of every function runs: ingest and the API's
//! reads and writes, a retry through the scheduler table, a delivery that dies and its email,
//! a replay, a 410 that disables its subscription, and a redriven message the dead-letter
//! function puts back on its schedule. A missing action is an `AccessDenied`, which a
//! function reports as a failed batch or the API as a 5xx: the test fails on either.
//!
//! moto checks the action of every request, and for SQS the queue too; for DynamoDB and
//! SES it checks actions only (resources are matched against `*`), so those statements are
//! granted on `*` here. Their resources are checked statically, for wildcards, by
//! `bootstrap.rs`'s template test. (moto server per test: enforcing is server-wide.)

mod aws_support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_support::{AwsEnv, EventSources, Gateway, LambdaHost, SENDER};
use hookwise_aws::{AwsAdapters, AwsClients, AwsConfig};
use hookwise_core::model::Email;
use hookwise_core::ports::SystemClock;
use hookwise_core::services::{Config, Services};
use hookwise_http::{HttpSender, SenderConfig};
use hookwise_tests::Receiver;
use rand::SeedableRng;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

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

/// Each function binary's policy in template.yaml, as an IAM policy document for moto: SQS
/// statements on the provisioned queues, the others on `*` (see the module's comment).
fn template_policies(queue_arns: &HashMap<String, String>) -> HashMap<String, Value> {
    let yaml = std::fs::read_to_string(aws_support::workspace_root().join("template.yaml")).unwrap();
    let doc: Yaml = serde_yaml_ng::from_str(&yaml).unwrap();
    let mut policies = HashMap::new();
    for (_, resource) in doc["Resources"].as_mapping().unwrap() {
        if resource["Type"].as_str() != Some("AWS::Serverless::Function") {
            continue;
        }
        let binary = resource["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap();
        // `Role: !GetAtt <role>.Arn`, and the role's inline policies.
        let role = match &resource["Properties"]["Role"] {
            Yaml::Tagged(t) => t.value.as_str().unwrap().trim_end_matches(".Arn"),
            other => panic!("{binary}'s Role: {other:?}"),
        };
        let mut statements = Vec::new();
        for policy in doc["Resources"][role]["Properties"]["Policies"].as_sequence().unwrap() {
            for statement in policy["PolicyDocument"]["Statement"].as_sequence().unwrap() {
                let mut actions: Vec<&str> = statement["Action"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap())
                    .collect();
                // moto names an operation's action after the operation; AWS authorises
                // SendMessageBatch as sqs:SendMessage, and TransactWriteItems by its items'
                // actions. So moto gets its own names for those two.
                if actions.contains(&"sqs:SendMessage") {
                    actions.push("sqs:SendMessageBatch");
                }
                if actions
                    .iter()
                    .any(|a| ["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"].contains(a))
                {
                    actions.push("dynamodb:TransactWriteItems");
                }
                let resource = if actions.iter().all(|a| a.starts_with("sqs:")) {
                    let named: Vec<&Yaml> = match &statement["Resource"] {
                        Yaml::Sequence(list) => list.iter().collect(),
                        one => vec![one],
                    };
                    json!(named.iter().map(|r| queue_arn(r, queue_arns)).collect::<Vec<_>>())
                } else {
                    json!("*")
                };
                statements.push(json!({"Effect": "Allow", "Action": actions, "Resource": resource}));
            }
        }
        policies.insert(
            binary.to_owned(),
            json!({"Version": "2012-10-17", "Statement": statements}),
        );
    }
    policies
}

/// `!GetAtt SomeQueue.Arn` as the provisioned queue's ARN.
fn queue_arn(resource: &Yaml, queue_arns: &HashMap<String, String>) -> String {
    let Yaml::Tagged(tagged) = resource else {
        panic!("an SQS resource is !GetAtt <queue>.Arn: {resource:?}")
    };
    let target = tagged.value.as_str().and_then(|t| t.strip_suffix(".Arn")).unwrap();
    queue_arns
        .get(target)
        .unwrap_or_else(|| panic!("no queue {target} provisioned"))
        .clone()
}

async fn clients_as(url: &str, (id, secret): &(String, String)) -> AwsClients {
    AwsClients::for_endpoint_as(url, id, secret, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn given_each_function_holding_only_its_template_policy_then_every_path_of_it_succeeds() {
    let Some(()) = aws_support::cargo_lambda() else {
        return;
    };
    if aws_support::endpoint(aws_support::MOTO_URL).is_none() {
        return; // moto is not installed (aws_support decided whether that fails)
    }
    let moto = Moto::start().await;
    let env = AwsEnv::at(moto.url.clone(), moto.url.clone(), "iam", None).await;
    let p = &env.provisioned;
    let queue_arns: HashMap<String, String> = [
        ("DeliveryQueue", &p.delivery_queue_url),
        ("DeadLetterQueue", &p.dead_letter_queue_url),
    ]
    .into_iter()
    .map(|(id, url)| {
        let name = url.rsplit('/').next().unwrap();
        (id.to_owned(), format!("arn:aws:sqs:us-east-1:123456789012:{name}"))
    })
    .collect();
    let policies = template_policies(&queue_arns);
    assert_eq!(policies.len(), 4);
    let mut keys = HashMap::new();
    for (binary, policy) in &policies {
        keys.insert(binary.clone(), moto.user(binary, policy).await);
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
    let local = Services::new(
        AwsAdapters::new(&admin, &config).ports(Arc::new(HttpSender::new(loopback).unwrap()), Arc::new(SystemClock)),
        Config::default(),
        rand::rngs::StdRng::from_os_rng(),
    );
    let owner = format!("{}@owner.example", aws_support::unique_prefix("o"));
    let (_, key) = local
        .create_tenant("iam", Email::parse(&owner).unwrap())
        .await
        .expect("the operator creates the tenant");

    // The functions sign as their own users, tables and queues on this moto.
    let mut fn_env = env.function_env(MAX_DELAY);
    fn_env.retain(|(k, _)| !k.starts_with("AWS_ACCESS_KEY_ID") && !k.starts_with("AWS_SECRET_ACCESS_KEY"));
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

    // Subscriptions: two that fail once (a 5 s retry on the queue, a 12 s one through the
    // scheduler table), one always down (dead, emailed, replayed), one gone (410: disabled by
    // the deliver side).
    let flaky = Receiver::start(1).await;
    let later = Receiver::start(1).await;
    let down = Receiver::start(u32::MAX).await;
    let gone = Receiver::start(0).await;
    gone.answer_with(410);
    let flaky_sub = api
        .post(
            "/v1/subscriptions",
            json!({"url": flaky.url("/f"), "event_types": ["order.*"], "retry_policy": {"schedule_seconds": [5]}}),
        )
        .await;
    api.post(
        "/v1/subscriptions",
        json!({"url": later.url("/l"), "event_types": ["refund.*"], "retry_policy": {"schedule_seconds": [12]}}),
    )
    .await;
    let down_sub = api
        .post(
            "/v1/subscriptions",
            json!({"url": down.url("/d"), "event_types": ["invoice.*"], "retry_policy": {"schedule_seconds": [1]}}),
        )
        .await;
    let gone_sub = api
        .post(
            "/v1/subscriptions",
            json!({"url": gone.url("/g"), "event_types": ["user.*"]}),
        )
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
    ok(
        api.call(
            "POST",
            &format!("/v1/subscriptions/{flaky_id}/rotate-secret"),
            Some(json!({})),
        )
        .await,
        "rotate the secret",
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
    let order = batch["results"][0].clone();
    let order_delivery = order["deliveries"][0]["id"].as_str().unwrap().to_owned();
    let down_delivery = batch["results"][1]["deliveries"][0]["id"].as_str().unwrap().to_owned();
    let refund_delivery = batch["results"][2]["deliveries"][0]["id"].as_str().unwrap().to_owned();

    // While the order's delivery waits for its retry (5 s), SQS redrives a message for that
    // attempt to the dead-letter queue: the dead-letter function puts it back on its
    // schedule, a delayed message on the delivery queue.
    api.wait_status(&order_delivery, "retrying", WAIT).await;
    let redriven = hookwise_aws::encode_task(&hookwise_core::ports::DeliveryTask {
        delivery_id: hookwise_core::model::DeliveryId::parse(&order_delivery).unwrap(),
        round: 0,
        attempt: 2,
        queued_at: None,
        slot: None,
        tenant_id: None,
        held_until: None,
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

    // Dead, emailed, replayed.
    api.wait_status(&down_delivery, "dead", WAIT).await;
    let start = Instant::now();
    while aws_support::moto_mail_to(&moto.url, &owner).await.is_empty() {
        assert!(start.elapsed() < WAIT, "no email to {owner}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    down.recover();
    ok(
        api.call(
            "POST",
            &format!("/v1/deliveries/{down_delivery}/replay"),
            Some(json!({})),
        )
        .await,
        "replay",
    );
    api.wait_status(&down_delivery, "delivered", WAIT).await;

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
    let down_id = down_sub["id"].as_str().unwrap();
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

    assert!(
        sources.moved_by_scheduler() > 0,
        "the scheduler moved no retry from its table"
    );
    assert!(
        sources.log.lock().unwrap().failures.is_empty(),
        "a function failed a batch (an action its policy lacks?): {:?}",
        sources.log.lock().unwrap().failures
    );
    sources.stop().await;
}
