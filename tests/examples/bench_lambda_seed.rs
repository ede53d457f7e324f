//! The Lambda cold-start benchmark's stage (`scripts/bench-lambda.py`): provisions the stack's
//! tables (on DynamoDB Local) and queues, SES v2 sender and KMS key (on moto) from
//! template.yaml, as the AWS end-to-end tests do (`tests/aws_support`), seeds them, and prints
//! one JSON document on stdout: the functions' environment and, for each round, one real
//! first event per binary.
//!
//! Each round has a tenant of its own (a new owner, so the dead letter's email is not held
//! back by the digest window of an earlier round) with two subscriptions: `order.*` to
//! `<receiver>/ok` and `invoice.*` to `<receiver>/fail` with no retries. Seeding ingests an
//! `order.paid` (its delivery is the round's Deliver event) and an `invoice.failed`, whose one
//! attempt it makes in this process: `/fail` answers 500, the delivery dies and its task goes
//! to the dead-letter queue (the round's DeadLetter record). The events:
//!
//! - `hookwise-ingest`: an HTTP API (payload 2.0) `POST /v1/events` with the tenant's key;
//! - `hookwise-deliver`: an SQS batch of one, the `order.paid` delivery's first attempt as
//!   ingest queued it (its POST goes to `<receiver>/ok`, `webhook-id` the event's id);
//! - `hookwise-scheduler`: the EventBridge tick of `infra/events/scheduler-scheduled.json`;
//! - `hookwise-dead-letter`: an SQS batch of one, the dead `invoice.failed` delivery's task;
//! - `lambda-getitem`: the key of the `order.paid` delivery's item.
//!
//! Needs HOOKWISE_TEST_MOTO_URL and HOOKWISE_TEST_DYNAMODB_LOCAL_URL
//! (`scripts/aws-test-services.sh run -- ...`).
//!
//!   cargo run -p hookwise-tests --example bench_lambda_seed -- --rounds N --receiver http://127.0.0.1:PORT

#[path = "../tests/aws_support/mod.rs"]
mod aws_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_support::{http_api_event, workspace_root, AwsEnv};
use hookwise_aws::decode_task;
use hookwise_core::model::{Email, EventType, Tenant};
use hookwise_core::ports::DeliveryTask;
use hookwise_core::services::{DeliverOutcome, NewEvent, NewTenant, Services};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);
/// The queues' delay limit: template.yaml's (SQS's).
const MAX_DELAY: u32 = 900;

fn usage() -> ! {
    eprintln!("usage: bench_lambda_seed --rounds N --receiver http://127.0.0.1:PORT");
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let (mut rounds, mut receiver) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rounds" => rounds = args.next().and_then(|n| n.parse::<usize>().ok()),
            "--receiver" => receiver = args.next(),
            _ => usage(),
        }
    }
    let (Some(rounds), Some(receiver)) = (rounds, receiver) else {
        usage()
    };
    let started = Instant::now();
    let Some(env) = AwsEnv::new("bench", None).await else {
        eprintln!("bench_lambda_seed: run it under scripts/aws-test-services.sh run -- ...");
        std::process::exit(2)
    };
    let services = env.services(Some(MAX_DELAY));

    let mut seeded = Vec::new();
    for i in 0..rounds {
        let owner = format!("{}@owner.example", aws_support::unique_prefix("o"));
        let (tenant, key) = services
            .create_tenant(NewTenant::named(&format!("bench-{i}"), Email::parse(&owner).unwrap()))
            .await
            .expect("a tenant");
        for sub in [
            json!({"url": format!("{receiver}/ok"), "event_types": ["order.*"]}),
            json!({"url": format!("{receiver}/fail"), "event_types": ["invoice.*"], "retry_policy": {"schedule_seconds": []}}),
        ] {
            services
                .create_subscription(&tenant, serde_json::from_value(sub).unwrap())
                .await
                .expect("a subscription");
        }
        let (ok_event, ok_delivery) = ingest(
            &services,
            &tenant,
            "order.paid",
            json!({"order": i, "amount": 4200, "currency": "EUR"}),
        )
        .await;
        let (_, dead_delivery) = ingest(
            &services,
            &tenant,
            "invoice.failed",
            json!({"invoice": i, "amount": 990}),
        )
        .await;
        seeded.push((owner, key, ok_event, ok_delivery, dead_delivery));
    }

    // The first attempts ingest queued, by delivery: the Deliver events' bodies, and the
    // invoice deliveries' attempts to make here.
    let sqs = &env.clients.sqs;
    let delivery_queue = &env.provisioned.delivery_queue_url;
    let queued = receive(sqs, delivery_queue, 2 * rounds).await;
    let dead_tasks: Vec<DeliveryTask> = seeded
        .iter()
        .map(|s| decode_task(&queued[&s.4].1).expect("a task"))
        .collect();
    for (outcome, task) in services.deliver_batch(&dead_tasks).await.into_iter().zip(&dead_tasks) {
        let outcome = outcome.expect("the attempt is made");
        assert!(
            matches!(outcome, DeliverOutcome::Dead),
            "{}: not dead after its one attempt: {outcome:?}",
            task.delivery_id
        );
    }
    let dead_letter_queue = &env.provisioned.dead_letter_queue_url;
    let dead_letters = receive(sqs, dead_letter_queue, rounds).await;

    let tick: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("infra/events/scheduler-scheduled.json")).unwrap(),
    )
    .unwrap();
    let rounds: Vec<Value> = seeded
        .iter()
        .enumerate()
        .map(|(i, (owner, key, ok_event, ok_delivery, dead_delivery))| {
            let body = json!({"type": "order.paid", "payload": {"order": 1000 + i, "amount": 4200, "currency": "EUR"}});
            json!({
                "hookwise-ingest": {"event": http_api_event("POST", "/v1/events", key, Some(&body))},
                "hookwise-deliver": {
                    "event": sqs_event(delivery_queue, &queued[ok_delivery]),
                    "webhook_id": ok_event,
                    "delivery_id": ok_delivery,
                },
                "hookwise-scheduler": {"event": tick},
                "hookwise-dead-letter": {
                    "event": sqs_event(dead_letter_queue, &dead_letters[dead_delivery]),
                    "owner": owner,
                    "delivery_id": dead_delivery,
                },
                "lambda-getitem": {"event": {"pk": format!("DLV#{ok_delivery}"), "sk": "#DELIVERY"}},
            })
        })
        .collect();

    // template.yaml's Globals pointed at these resources: DynamoDB Local for the tables, moto
    // for the rest; the log level and format stay the bench's (a deployment's).
    let function_env: serde_json::Map<String, Value> = env
        .function_env(MAX_DELAY)
        .into_iter()
        .filter(|(k, _)| k != "RUST_LOG" && k != "AWS_LAMBDA_LOG_FORMAT")
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    let doc = json!({
        "moto_url": env.moto_url,
        "dynamodb_url": env.dynamodb_url,
        "env": function_env,
        "rounds": rounds,
    });
    println!("{doc}");
    eprintln!(
        "bench_lambda_seed: {} rounds seeded in {:.1} s",
        seeded.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Ingests one event of `event_type` for `tenant`: (its id, its one delivery's id).
async fn ingest(services: &Services, tenant: &Tenant, event_type: &str, payload: Value) -> (String, String) {
    let new = NewEvent {
        event_type: EventType::parse(event_type).unwrap(),
        payload,
    };
    let ingested = services.ingest(tenant, new, None).await.expect("ingest");
    assert_eq!(ingested.deliveries.len(), 1, "one subscription matches {event_type}");
    (ingested.event.id.to_string(), ingested.deliveries[0].id.to_string())
}

/// `want` messages from `queue`, by their task's delivery id: (message id, body).
async fn receive(sqs: &aws_sdk_sqs::Client, queue: &str, want: usize) -> HashMap<String, (String, String)> {
    let mut found = HashMap::new();
    let start = Instant::now();
    while found.len() < want {
        assert!(
            start.elapsed() < WAIT,
            "only {} of {want} messages on {queue}",
            found.len()
        );
        let out = sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(3600)
            .send()
            .await
            .expect("receive");
        for m in out.messages.unwrap_or_default() {
            let body = m.body().expect("a body").to_owned();
            let task = decode_task(&body).expect("a task");
            found.insert(task.delivery_id.to_string(), (m.message_id().unwrap().to_owned(), body));
        }
    }
    found
}

/// An SQS event of one record, as Lambda's event source mapping hands it to the function.
fn sqs_event(queue_url: &str, (message_id, body): &(String, String)) -> Value {
    let name = queue_url.rsplit('/').next().unwrap_or_default();
    json!({"Records": [{
        "messageId": message_id, "receiptHandle": "handled-by-the-bench", "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1796015220000",
            "SenderId": "AROAEXAMPLE:hookwise", "ApproximateFirstReceiveTimestamp": "1796015220012"},
        "messageAttributes": {}, "eventSource": "aws:sqs",
        "eventSourceARN": format!("arn:aws:sqs:us-east-1:123456789012:{name}"), "awsRegion": "us-east-1",
    }]})
}
