//! Hookwise on AWS APIs, end to end: the four compiled function binaries hosted by
//! `cargo lambda watch`, tables on DynamoDB Local and queues and SES v2 on moto (all made
//! from template.yaml), an SQS event-source emulator and a scheduler timer in the test, and
//! a real receiving HTTP server. (What a delivered event costs is `tests/cost.rs`.)
//!
//! Run by scripts/aws-e2e.sh; without moto, DynamoDB Local or cargo-lambda the tests skip,
//! unless HOOKWISE_TEST_REQUIRE_AWS=1 (the script sets it), when they fail.

mod aws_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_support::{AwsEnv, EventSources, Gateway, LambdaHost, Launcher};
use hookwise_aws::decode_task;
use hookwise_core::model::Email;
use hookwise_core::ports::DeliveryTask;
use hookwise_tests::Receiver;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
/// The queue's delay limit in this test: a 5 s retry must go through the scheduler table.
const MAX_DELAY: u32 = 2;

async fn moto_mail(moto_url: &str) -> String {
    reqwest::get(format!("{moto_url}/moto-api/data.json"))
        .await
        .expect("moto's data")
        .text()
        .await
        .expect("a body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn given_the_functions_under_cargo_lambda_watch_then_flaky_dead_replayed_and_duplicated_deliveries_behave() {
    flaky_dead_replayed_and_duplicated(Launcher::Native).await;
}

/// The artifact `sam deploy` ships, run: each function's arm64 `bootstrap` as `sam build`
/// made it, under qemu-user, with the template's environment, through the same paths (an
/// API request for ingest, SQS batches for deliver POSTing to a receiver and for the
/// dead-letter function emailing, the scheduler's ticks moving a retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn given_the_arm64_artifacts_under_qemu_then_flaky_dead_replayed_and_duplicated_deliveries_behave() {
    let Some(launcher) = Launcher::arm64() else {
        return;
    };
    let started = Instant::now();
    flaky_dead_replayed_and_duplicated(launcher).await;
    eprintln!(
        "the arm64 artifacts under qemu: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

async fn flaky_dead_replayed_and_duplicated(launcher: Launcher) {
    let Some(()) = aws_support::cargo_lambda() else {
        return;
    };
    let Some(env) = AwsEnv::new("e2e", None).await else {
        return;
    };
    let owner = format!("{}@owner.example", aws_support::unique_prefix("o"));
    let local = env.services(Some(MAX_DELAY));
    let (_, key) = local
        .create_tenant(hookwise_core::services::NewTenant::named(
            "e2e",
            Email::parse(&owner).unwrap(),
        ))
        .await
        .expect("tenant");

    let host = Arc::new(LambdaHost::start_launched(&launcher, &env.function_env(MAX_DELAY), |_| Vec::new()).await);
    let sources = EventSources::start(host.clone(), (*env.clients.sqs).clone(), &env.provisioned).await;
    let api = Gateway {
        host: host.clone(),
        key,
    };

    // A flaky endpoint: two 500s, then 200.
    let flaky = Receiver::start(2).await;
    let created = api.post("/v1/subscriptions", json!({"url": flaky.url("/flaky"), "event_types": ["order.*"], "retry_policy": {"schedule_seconds": [1, 1, 1]}})).await;
    let secret = created["secret"]
        .as_str()
        .expect("the new subscription's secret")
        .to_owned();
    let event = api
        .post("/v1/events", json!({"type": "order.paid", "payload": {"order": 7}}))
        .await;
    let id = event["deliveries"][0]["id"].as_str().unwrap().to_owned();
    let delivered = api.wait_status(&id, "delivered", WAIT).await;
    let codes: Vec<_> = delivered["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["attempt"].as_u64().unwrap(), a["status_code"].as_u64().unwrap()))
        .collect();
    assert_eq!(codes, [(1, 500), (2, 500), (3, 200)]);
    assert_eq!(flaky.count(), 3);
    assert_eq!(flaky.requests()[2].header("webhook-id"), event["id"].as_str());
    // Signed with the secret the API answered, which the table holds only sealed with KMS.
    assert!(
        flaky.requests().iter().all(|r| r.signed_with(&secret)),
        "a webhook that does not verify with the subscription's secret"
    );
    assert_no_secret_stored(&env, &secret).await;

    // SQS delivers at least once: the message of attempt 3, twice more.
    let body = sources
        .bodies("delivery")
        .into_iter()
        .find(|b| decode_task(b).is_ok_and(|t| t.delivery_id.as_str() == id && t.attempt == 3))
        .expect("attempt 3's message");
    let seen = |s: &EventSources| s.bodies("delivery").iter().filter(|b| **b == body).count();
    let before = seen(&sources);
    for _ in 0..2 {
        env.clients
            .sqs
            .send_message()
            .queue_url(&env.provisioned.delivery_queue_url)
            .message_body(&body)
            .send()
            .await
            .expect("send a duplicate");
    }
    let start = Instant::now();
    while seen(&sources) < before + 2 {
        assert!(
            start.elapsed() < WAIT,
            "the duplicates were not handed to the deliver function"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let task: DeliveryTask = decode_task(&body).unwrap();
    let attempts = local.ports().store.attempts(&task.delivery_id).await.expect("attempts");
    let numbers: Vec<u32> = attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, [1, 2, 3], "no second record of any attempt number");
    assert_eq!(flaky.count(), 3, "no second POST for a duplicate");

    // Always failing, on [1 s, 5 s]: the 5 s retry is above the queue's 2 s limit, so it
    // waits in the scheduler table until the scheduler moves it; then dead, then email.
    let down = Receiver::start(u32::MAX).await;
    api.post(
        "/v1/subscriptions",
        json!({"url": down.url("/down"), "event_types": ["invoice.*"], "retry_policy": {"schedule_seconds": [1, 5]}}),
    )
    .await;
    let moved_before = sources.moved_by_scheduler();
    let event = api
        .post(
            "/v1/events",
            json!({"type": "invoice.failed", "payload": {"invoice": 9}}),
        )
        .await;
    let event_id = event["id"].as_str().unwrap().to_owned();
    let id = event["deliveries"][0]["id"].as_str().unwrap().to_owned();
    let dead = api.wait_status(&id, "dead", WAIT).await;
    assert_eq!(dead["attempts"].as_array().unwrap().len(), 3, "{dead}");
    assert!(
        sources.moved_by_scheduler() > moved_before,
        "the scheduler moved no retry from its table: {:?}",
        sources.log.lock().unwrap().scheduler
    );

    let start = Instant::now();
    let mail = loop {
        let data = moto_mail(&env.moto_url).await;
        if data.contains(&owner) && data.contains(&id) {
            break data;
        }
        assert!(
            start.elapsed() < WAIT,
            "no SES v2 email to {owner} about {id} in moto's data.json"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        mail.contains(&event_id) && mail.contains("invoice.failed"),
        "the email names the event"
    );
    assert_eq!(
        mail.matches(&format!("Delivery:     {id}")).count(),
        1,
        "one email for one dead delivery"
    );

    // Replay: a fresh attempt #1 of round 1, delivered once the endpoint is back.
    down.recover();
    let (status, replayed) = api
        .call("POST", &format!("/v1/deliveries/{id}/replay"), Some(json!({})))
        .await;
    assert_eq!(status, 202, "{replayed}");
    let redelivered = api.wait_status(&id, "delivered", WAIT).await;
    let last = redelivered["attempts"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            last["round"].as_u64(),
            last["attempt"].as_u64(),
            last["status_code"].as_u64()
        ),
        (Some(1), Some(1), Some(200))
    );

    assert!(
        sources.log.lock().unwrap().failures.is_empty(),
        "no infrastructure failure was reported: {:?}",
        sources.log.lock().unwrap().failures
    );
    sources.stop().await;
}

/// Every item of the main table read raw: none holds a signing secret in plain text, and the
/// subscriptions hold theirs as KMS envelopes.
async fn assert_no_secret_stored(env: &AwsEnv, secret: &str) {
    let items = env
        .clients
        .dynamodb
        .scan()
        .table_name(&env.provisioned.table)
        .send()
        .await
        .expect("scan the main table")
        .items
        .unwrap_or_default();
    let text = format!("{items:?}");
    let key = secret.trim_start_matches("whsec_");
    assert!(
        !text.contains("whsec_") && !text.contains(key),
        "a secret in plain text in the table"
    );
    let sealed: Vec<_> = items
        .iter()
        .filter_map(|item| item.get("secret")?.as_s().ok())
        .collect();
    assert!(
        !sealed.is_empty() && sealed.iter().all(|s| s.starts_with("kms1:")),
        "secrets not sealed with KMS: {sealed:?}"
    );
}

/// `hookwise tenant --aws` on the stack's table, with the variables the template gives the
/// functions; the real ingest function answers with the keys it changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn given_the_tenant_commands_on_the_stack_then_the_ingest_function_takes_a_rotated_key_and_refuses_a_revoked_one_within_its_cache_time(
) {
    let Some(()) = aws_support::cargo_lambda() else {
        return;
    };
    let Some(env) = AwsEnv::new("tenant", None).await else {
        return;
    };
    let fn_env = env.function_env(MAX_DELAY);
    let cli = |args: &[&str]| hookwise_tests::tenant_cli_json(&[args, &["--aws"][..]].concat(), &fn_env);
    let created = cli(&["create", "--name", "Dora", "--owner-email", "dora@example.com"]);
    let id = created["id"].as_str().unwrap().to_owned();
    let old_key = created["api_key"].as_str().unwrap().to_owned();

    let host = Arc::new(LambdaHost::start(&fn_env).await);
    let status = |key: &str| {
        let api = Gateway {
            host: host.clone(),
            key: key.to_owned(),
        };
        async move { api.call("GET", "/v1/subscriptions", None).await.0 }
    };
    assert_eq!(status(&old_key).await, 200);

    let set = cli(&["set", &id, "--retries", "off", "--json"]);
    assert_eq!(set["retries_enabled"], json!(false));
    let listed = cli(&["list", "--json"]);
    assert!(
        listed.as_array().unwrap().iter().any(|t| t["id"] == json!(id)),
        "{listed}"
    );

    let rotated = cli(&["rotate-key", &id]);
    let new_key = rotated["api_key"].as_str().unwrap().to_owned();
    assert_eq!((status(&old_key).await, status(&new_key).await), (200, 200));

    let revoked = cli(&["revoke-key", &id, "--api-key", &old_key, "--json"]);
    assert_eq!(revoked["api_keys"].as_array().unwrap().len(), 1, "{revoked}");
    // The warm function found the old key a moment ago: it takes it for up to 30 s more.
    let started = Instant::now();
    while status(&old_key).await != 401 {
        assert!(
            started.elapsed() < Duration::from_secs(35),
            "the revoked key still works"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("the revoked key answered 401 after {:?}", started.elapsed());
    assert_eq!(status(&new_key).await, 200);
}
