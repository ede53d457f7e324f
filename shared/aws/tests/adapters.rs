//! What the contract suite does not cover: SES v2 mail reaching moto, the request counter,
//! how SDK errors map to retryable or permanent, the scheduler table never skipping a
//! minute, the held items an older build keyed by their give-up time, and its setting aside
//! an item that does not decode.

mod support;

use std::collections::HashMap;

use chrono::{Duration, TimeZone, Utc};
use hookwise_aws::AwsClients;
use hookwise_aws::RequestCounter;
use hookwise_core::model::{DeliveryId, Email};
use hookwise_core::ports::{DeliveryTask, Mailer, OutgoingEmail, ScheduledTask, SchedulerTable, Store};
use hookwise_core::PortError;

fn task(at: chrono::DateTime<Utc>) -> ScheduledTask {
    ScheduledTask {
        task: DeliveryTask {
            delivery_id: DeliveryId::generate(at, &mut rand::rng()),
            round: 0,
            attempt: 2,
            queued_at: None,
            slot: None,
            tenant_id: None,
            held_until: None,
            redrives: 0,
        },
        due: at,
    }
}

/// The emulators' clients and adapters, or `None` (the test passes over) where DynamoDB Local
/// or moto is not running.
async fn dynamodb_env() -> Option<support::Env> {
    let dynamodb = support::endpoint(support::DYNAMODB_LOCAL_URL)?;
    let moto = support::endpoint(support::MOTO_URL)?;
    Some(support::env(&moto, &dynamodb, None).await)
}

/// The scheduler table's partition (minute and shard) `task` was scheduled in.
async fn partition_of(env: &support::Env, task: &ScheduledTask) -> String {
    let table = env.adapters.scheduler.table_name();
    let scan = env
        .clients
        .dynamodb
        .scan()
        .table_name(table)
        .send()
        .await
        .expect("scan");
    let id = aws_sdk_dynamodb::types::AttributeValue::S(task.task.delivery_id.to_string());
    scan.items()
        .iter()
        .find(|i| i.get("delivery_id") == Some(&id))
        .and_then(|i| i.get("bucket"))
        .and_then(|b| b.as_s().ok())
        .expect("the task's item")
        .clone()
}

#[tokio::test]
async fn given_a_verified_sender_when_the_mailer_sends_then_moto_records_the_email() {
    let Some(moto) = support::endpoint(support::MOTO_URL) else {
        return;
    };
    let env = support::env(&moto, &moto, None).await;
    env.clients
        .sesv2
        .create_email_identity()
        .email_identity(support::SENDER)
        .send()
        .await
        .expect("verify the sender on moto");

    let marker = support::unique_prefix();
    let email = OutgoingEmail {
        to: Email::parse("owner@acme.example").unwrap(),
        subject: format!("[Hookwise] Delivery failed {marker}"),
        text: "A webhook could not be delivered.".into(),
    };
    env.adapters.mailer.send(&email).await.expect("send");

    let data = reqwest::get(format!("{moto}/moto-api/data.json"))
        .await
        .expect("moto data")
        .text()
        .await
        .expect("body");
    assert!(data.contains(&marker), "the email's subject is not in moto's data.json");
    assert!(
        data.contains("owner@acme.example"),
        "the recipient is not in moto's data.json"
    );
}

#[tokio::test]
async fn given_an_unverified_sender_then_sending_fails_permanently() {
    let Some(moto) = support::endpoint(support::MOTO_URL) else {
        return;
    };
    let env = support::env(&moto, &moto, None).await;
    let mailer = hookwise_aws::SesMailer::new(
        env.clients.sesv2.clone(),
        &format!("{}@nowhere.example", support::unique_prefix()),
    );
    let email = OutgoingEmail {
        to: Email::parse("owner@acme.example").unwrap(),
        subject: "x".into(),
        text: "y".into(),
    };
    match mailer.send(&email).await {
        Err(PortError::Permanent { .. }) => {}
        other => panic!("expected a permanent error, got {other:?}"),
    }
}

#[tokio::test]
async fn given_a_counter_then_every_request_and_its_capacity_is_counted() {
    let Some(ddb) = support::endpoint(support::DYNAMODB_LOCAL_URL) else {
        return;
    };
    let Some(moto) = support::endpoint(support::MOTO_URL) else {
        return;
    };
    let counter = RequestCounter::new();
    let env = support::env(&moto, &ddb, Some(&counter)).await;
    counter.reset();

    let health = hookwise_core::health::EndpointHealth::default();
    let sub = hookwise_core::model::SubscriptionId::generate(Utc::now(), &mut rand::rng());
    env.adapters
        .store
        .save_endpoint_health(&sub, &health)
        .await
        .expect("save");
    env.adapters.store.endpoint_health(&sub).await.expect("read");
    use hookwise_core::ports::DeliveryQueue;
    env.adapters
        .queue
        .enqueue(&[(task(Utc::now()).task, 0)])
        .await
        .expect("enqueue");

    let counts = counter.snapshot();
    assert_eq!(counts.service_total("dynamodb"), 2, "{counts:?}");
    assert_eq!(counts.service_total("sqs"), 1, "{counts:?}");
    assert!(
        counts.write_units >= 1.0 && counts.read_units > 0.0,
        "capacity was not counted: {counts:?}"
    );
}

#[tokio::test]
async fn given_a_missing_table_the_error_is_permanent_and_given_no_server_it_is_retryable() {
    let Some(moto) = support::endpoint(support::MOTO_URL) else {
        return;
    };
    let clients = AwsClients::for_endpoint(&moto, None).await;
    let config = hookwise_aws::AwsConfig {
        table: "no-such-table".into(),
        scheduler_table: "no-such-table".into(),
        delivery_queue_url: format!("{moto}/123456789012/no-such-queue"),
        dead_letter_queue_url: format!("{moto}/123456789012/no-such-queue"),
        sender_email: support::SENDER.into(),
        secrets_key: "no-such-key".into(),
        queue_max_delay_seconds: 900,
        retention: std::time::Duration::from_secs(30 * 86_400),
    };
    let store = hookwise_aws::DynamoStore::new(clients.dynamodb.clone(), &config);
    match store
        .get_delivery(&DeliveryId::generate(Utc::now(), &mut rand::rng()))
        .await
    {
        Err(PortError::Permanent { .. }) => {}
        other => panic!("a missing table: expected permanent, got {other:?}"),
    }

    // A port nothing listens on: the request cannot be dispatched.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = AwsClients::for_endpoint(&format!("http://127.0.0.1:{port}"), None).await;
    let store = hookwise_aws::DynamoStore::new(dead.dynamodb.clone(), &config);
    match store
        .get_delivery(&DeliveryId::generate(Utc::now(), &mut rand::rng()))
        .await
    {
        Err(e @ PortError::Retryable { .. }) => assert!(hookwise_core::Error::from(e).is_retryable()),
        other => panic!("no server: expected retryable, got {other:?}"),
    }
}

async fn scheduler_never_skips_a_minute(dynamodb_url: &str, moto_url: &str) {
    let env = support::env(moto_url, dynamodb_url, None).await;
    let scheduler = &env.adapters.scheduler;
    let t0 = Utc.with_ymd_and_hms(2031, 1, 1, 8, 0, 0).unwrap();

    // A task from a minute long past (a tick that never ran) is still due hours later.
    let missed = task(t0 + Duration::seconds(5));
    scheduler.schedule(&missed).await.expect("schedule");
    let much_later = t0 + Duration::hours(6);
    assert_eq!(scheduler.due(much_later, 10).await.expect("due"), vec![missed.clone()]);
    scheduler.remove(std::slice::from_ref(&missed)).await.expect("remove");
    // The emptied minute is forgotten by this tick ...
    assert!(scheduler.due(much_later, 10).await.expect("due").is_empty());
    // ... and a task scheduled into it again is found again.
    let again = task(t0 + Duration::seconds(30));
    scheduler.schedule(&again).await.expect("schedule");
    let later = task(t0 + Duration::minutes(90));
    scheduler.schedule(&later).await.expect("schedule");
    assert_eq!(
        scheduler.due(much_later, 10).await.expect("due"),
        vec![again.clone(), later.clone()]
    );
    scheduler.remove(&[again, later]).await.expect("remove");

    // A table written before the shards: one cursor, partitions named by the minute alone.
    // Its task comes due beside the sharded ones, and goes when removed.
    let old = task(t0 + Duration::minutes(3));
    let minute = "2031-01-01T08:03";
    let ddb = &env.clients.dynamodb;
    let table = scheduler.table_name();
    let attr = |v: &str| aws_sdk_dynamodb::types::AttributeValue::S(v.to_owned());
    ddb.put_item()
        .table_name(table)
        .item("bucket", attr(minute))
        .item(
            "due_key",
            attr(&format!(
                "{}#{}#0#2",
                old.due.format("%Y-%m-%dT%H:%M:%S%.9fZ"),
                old.task.delivery_id
            )),
        )
        .item(
            "due",
            attr(&old.due.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)),
        )
        .item("delivery_id", attr(old.task.delivery_id.as_str()))
        .item("round", aws_sdk_dynamodb::types::AttributeValue::N("0".into()))
        .item("attempt", aws_sdk_dynamodb::types::AttributeValue::N("2".into()))
        .send()
        .await
        .expect("an unsharded task");
    ddb.put_item()
        .table_name(table)
        .item("bucket", attr("#CURSOR"))
        .item("due_key", attr("#CURSOR"))
        .item(
            "pending",
            aws_sdk_dynamodb::types::AttributeValue::Ss(vec![minute.into()]),
        )
        .item("version", aws_sdk_dynamodb::types::AttributeValue::N("7".into()))
        .send()
        .await
        .expect("the unsharded cursor");
    let new = task(t0 + Duration::minutes(3) + Duration::seconds(1));
    scheduler.schedule(&new).await.expect("schedule");
    assert_eq!(
        scheduler.due(much_later, 10).await.expect("due"),
        vec![old.clone(), new.clone()]
    );
    scheduler.remove(&[old, new]).await.expect("remove");
    assert!(
        scheduler.due(much_later, 10).await.expect("due").is_empty(),
        "both removed"
    );
    let left = ddb
        .get_item()
        .table_name(table)
        .key("bucket", attr("#CURSOR"))
        .key("due_key", attr("#CURSOR"))
        .send()
        .await
        .expect("read the old cursor");
    let pending = left.item().and_then(|i| i.get("pending"));
    assert!(pending.is_none(), "the emptied minute left the old cursor: {pending:?}");
}

/// The scheduler table's TTL: a task and a held attempt expire their retention after they
/// were due; the lease, the cursors and the list of endpoints holding attempts never.
#[tokio::test]
async fn given_a_task_and_a_held_attempt_then_each_expires_its_retention_after_it_is_due() {
    let Some(env) = dynamodb_env().await else {
        return;
    };
    let scheduler = &env.adapters.scheduler;
    let t0 = Utc.with_ymd_and_hms(2031, 1, 1, 8, 0, 0).unwrap();
    let scheduled = task(t0 + Duration::minutes(20));
    scheduler.schedule(&scheduled).await.expect("schedule");
    let sub = hookwise_core::model::SubscriptionId::parse("sub_01KZZZZZZZZZZZZZZZZZZZZZZZ").unwrap();
    let held = task(t0 + Duration::hours(5));
    let tenant = hookwise_core::model::TenantId::parse("ten_01KZZZZZZZZZZZZZZZZZZZZZZZ").unwrap();
    scheduler.hold(&tenant, &sub, &held).await.expect("hold");
    assert!(scheduler
        .take_lease("t", t0, t0 + Duration::seconds(90))
        .await
        .expect("lease"));

    let retention = hookwise_aws::config::retention_days(hookwise_aws::config::DEFAULT_RETENTION_DAYS).as_secs() as i64;
    let items = env
        .clients
        .dynamodb
        .scan()
        .table_name(scheduler.table_name())
        .send()
        .await
        .expect("scan the scheduler table");
    let mut seen = 0;
    for item in items.items() {
        let key = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
        let (bucket, due_key) = (key("bucket"), key("due_key"));
        let expires = item
            .get("expires_at")
            .and_then(|v| v.as_n().ok())
            .map(|n| n.parse::<i64>().unwrap());
        if bucket.starts_with('#') {
            assert_eq!(
                expires, None,
                "{bucket}: the cursors, the lease and the holding list do not expire"
            );
            continue;
        }
        let due = if due_key.contains(held.task.delivery_id.as_str()) {
            held.due
        } else {
            scheduled.due
        };
        assert_eq!(expires, Some(due.timestamp() + retention), "{bucket} {due_key}");
        seen += 1;
    }
    assert_eq!(seen, 3, "the task, the held item and its scheduled copy");
}

#[tokio::test]
async fn given_a_task_in_a_minute_no_tick_looked_at_then_a_later_tick_finds_it_on_moto() {
    let Some(moto) = support::endpoint(support::MOTO_URL) else {
        return;
    };
    scheduler_never_skips_a_minute(&moto, &moto).await;
}

#[tokio::test]
async fn given_a_task_in_a_minute_no_tick_looked_at_then_a_later_tick_finds_it_on_dynamodb_local() {
    let Some(ddb) = support::endpoint(support::DYNAMODB_LOCAL_URL) else {
        return;
    };
    let Some(moto) = support::endpoint(support::MOTO_URL) else {
        return;
    };
    scheduler_never_skips_a_minute(&ddb, &moto).await;
}

/// A held attempt an older build keyed by its give-up time lists before those keyed by their
/// attempt, and a release of it deletes it.
#[tokio::test]
async fn given_an_attempt_an_older_build_held_at_its_give_up_time_then_it_lists_first_and_its_release_deletes_it() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let Some(env) = dynamodb_env().await else {
        return;
    };
    let scheduler = &env.adapters.scheduler;
    let (ddb, table) = (&env.clients.dynamodb, scheduler.table_name());
    let t0 = Utc.with_ymd_and_hms(2031, 1, 1, 8, 0, 0).unwrap();
    let sub = hookwise_core::model::SubscriptionId::parse("sub_01KZZZZZZZZZZZZZZZZZZZZZZY").unwrap();
    let tenant = hookwise_core::model::TenantId::parse("ten_01KZZZZZZZZZZZZZZZZZZZZZZY").unwrap();
    // The older build's item: made as this build makes it, then moved to the key that build
    // gave it, its give-up time first.
    let old = task(t0 + Duration::hours(5));
    scheduler.hold(&tenant, &sub, &old).await.expect("hold");
    let bucket = AttributeValue::S(format!("HELD#{sub}"));
    let found = ddb
        .query()
        .table_name(table)
        .key_condition_expression("#b = :b")
        .expression_attribute_names("#b", "bucket")
        .expression_attribute_values(":b", bucket.clone())
        .send()
        .await
        .expect("query");
    let [item] = found.items() else {
        panic!("one held item: {found:?}")
    };
    let mut item = item.clone();
    ddb.delete_item()
        .table_name(table)
        .key("bucket", bucket.clone())
        .key("due_key", item["due_key"].clone())
        .send()
        .await
        .expect("delete");
    let by_due = format!(
        "{}#{}#{}#{}",
        old.due.format("%Y-%m-%dT%H:%M:%S%.9fZ"),
        old.task.delivery_id,
        old.task.round,
        old.task.attempt
    );
    item.insert("due_key".into(), AttributeValue::S(by_due));
    ddb.put_item()
        .table_name(table)
        .set_item(Some(item))
        .send()
        .await
        .expect("put");
    // Held since by this build: an older delivery's id sorts after the older build's key.
    let new = ScheduledTask {
        task: DeliveryTask {
            delivery_id: DeliveryId::generate(t0 - Duration::days(1), &mut rand::rng()),
            ..task(t0).task
        },
        due: t0 + Duration::hours(1),
    };
    scheduler.hold(&tenant, &sub, &new).await.expect("hold");

    assert_eq!(
        scheduler.held(&sub, 10).await.expect("held"),
        vec![old.clone(), new.clone()]
    );
    scheduler
        .release(&sub, std::slice::from_ref(&old))
        .await
        .expect("release");
    assert_eq!(scheduler.held(&sub, 10).await.expect("held"), vec![new.clone()]);
    scheduler.release(&sub, &[new]).await.expect("release");
    assert!(scheduler.held(&sub, 10).await.expect("held").is_empty());
}

#[tokio::test]
async fn given_a_held_item_that_does_not_decode_then_it_is_set_aside_and_the_attempt_held_beside_it_is_listed() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let Some(env) = dynamodb_env().await else {
        return;
    };
    let scheduler = &env.adapters.scheduler;
    let t0 = Utc.with_ymd_and_hms(2031, 1, 1, 8, 0, 0).unwrap();
    let sub = hookwise_core::model::SubscriptionId::parse("sub_01KZZZZZZZZZZZZZZZZZZZZZZX").unwrap();
    let tenant = hookwise_core::model::TenantId::parse("ten_01KZZZZZZZZZZZZZZZZZZZZZZX").unwrap();
    let good = task(t0 + Duration::hours(1));
    scheduler.hold(&tenant, &sub, &good).await.expect("hold");
    env.clients
        .dynamodb
        .put_item()
        .table_name(scheduler.table_name())
        .item("bucket", AttributeValue::S(format!("HELD#{sub}")))
        .item("due_key", AttributeValue::S("del_garbage#0#2".into()))
        .item("due", AttributeValue::S("not a time".into()))
        .send()
        .await
        .expect("an item that does not decode");

    // The item that does not decode lists first: a page of one is the good one, not none.
    assert_eq!(scheduler.held(&sub, 1).await.expect("held"), vec![good.clone()]);
    let aside = scheduler.set_aside(None, 10).await.expect("list");
    assert_eq!(
        aside.iter().map(|a| a.key.as_str()).collect::<Vec<_>>(),
        [format!("HELD#{sub} del_garbage#0#2").as_str()]
    );
    assert_eq!(scheduler.held(&sub, 10).await.expect("held"), vec![good]);
    assert_eq!(scheduler.set_aside(None, 10).await.expect("list").len(), 1, "once");
}

/// A page of a minute's items that all fail to decode may have tasks behind it: the minute
/// is not forgotten, and its tasks come due on the next call.
#[tokio::test]
async fn given_a_full_page_of_items_that_do_not_decode_before_a_task_then_the_task_still_comes_due() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let Some(env) = dynamodb_env().await else {
        return;
    };
    let scheduler = &env.adapters.scheduler;
    let (ddb, table) = (&env.clients.dynamodb, scheduler.table_name());
    let attr = |v: &str| AttributeValue::S(v.to_owned());
    let t0 = Utc.with_ymd_and_hms(2031, 1, 1, 8, 0, 0).unwrap();
    let good = task(t0 + Duration::seconds(30));
    scheduler.schedule(&good).await.expect("schedule");
    let bucket = partition_of(&env, &good).await;
    for i in 0..4 {
        ddb.put_item()
            .table_name(table)
            .item("bucket", attr(&bucket))
            .item(
                "due_key",
                attr(&format!("2031-01-01T08:00:0{i}.000000000Z#del_garbage#0#2")),
            )
            .item("due", attr("not a time"))
            .send()
            .await
            .expect("an item that does not decode");
    }

    let now = t0 + Duration::hours(1);
    let page = scheduler.due_page(now, now, 4).await.expect("due");
    assert_eq!((page.tasks.len(), page.set_aside), (0, 4), "a page's worth set aside");
    let page = scheduler.due_page(now, now, 4).await.expect("due again");
    assert_eq!((page.tasks, page.set_aside), (vec![good], 0), "the minute was kept");
}

/// An item in a due minute that does not decode (here, a `due` that is no time) is set
/// aside: the task beside it comes due, the item is listed as set aside, with why and what it
/// held, and is gone from its minute; a minute that held only such an item is forgotten.
#[tokio::test]
async fn given_an_item_that_does_not_decode_in_a_due_minute_then_it_is_set_aside_and_the_task_beside_it_comes_due() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let Some(env) = dynamodb_env().await else {
        return;
    };
    let scheduler = &env.adapters.scheduler;
    let (ddb, table) = (&env.clients.dynamodb, scheduler.table_name());
    let attr = |v: &str| AttributeValue::S(v.to_owned());
    let t0 = Utc.with_ymd_and_hms(2031, 1, 1, 8, 0, 0).unwrap();
    let good = task(t0 + Duration::seconds(30));
    scheduler.schedule(&good).await.expect("schedule");
    // The good task's partition: its minute and shard.
    let bucket = partition_of(&env, &good).await;
    let garbage_key = "2031-01-01T08:00:10.000000000Z#del_garbage#0#2";
    ddb.put_item()
        .table_name(table)
        .item("bucket", attr(&bucket))
        .item("due_key", attr(garbage_key))
        .item("due", attr("not a time"))
        .item("delivery_id", attr("del_garbage"))
        .send()
        .await
        .expect("an item that does not decode");
    // A minute holding nothing else, listed by the unsharded cursor as an older build would.
    let lone_minute = "2031-01-01T08:03";
    ddb.put_item()
        .table_name(table)
        .item("bucket", attr(lone_minute))
        .item("due_key", attr("2031-01-01T08:03:00.000000000Z#x"))
        .send()
        .await
        .expect("a lone item that does not decode");
    ddb.put_item()
        .table_name(table)
        .item("bucket", attr("#CURSOR"))
        .item("due_key", attr("#CURSOR"))
        .item("pending", AttributeValue::Ss(vec![lone_minute.into()]))
        .item("version", AttributeValue::N("1".into()))
        .send()
        .await
        .expect("the unsharded cursor");

    let now = t0 + Duration::hours(1);
    let page = scheduler.due_page(now, now, 10).await.expect("due");
    assert_eq!(page.tasks, vec![good.clone()], "the task comes due all the same");
    assert_eq!(page.set_aside, 2);
    let aside = scheduler.set_aside(None, 10).await.expect("list");
    let keys: Vec<_> = aside.iter().map(|a| a.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            format!("{bucket} {garbage_key}").as_str(),
            "2031-01-01T08:03 2031-01-01T08:03:00.000000000Z#x"
        ]
    );
    assert_eq!(aside[0].set_aside_at, now);
    assert!(aside[0].error.contains("due"), "why: {}", aside[0].error);
    assert!(
        aside[0].raw.contains(r#""due":{"S":"not a time"}"#),
        "what it held: {}",
        aside[0].raw
    );
    assert_eq!(scheduler.set_aside(Some(keys[0]), 10).await.expect("after").len(), 1);
    let left = ddb
        .get_item()
        .table_name(table)
        .key("bucket", attr(&bucket))
        .key("due_key", attr(garbage_key))
        .consistent_read(true)
        .send()
        .await
        .expect("read its old place");
    assert!(left.item().is_none(), "gone from its minute");

    let again = scheduler.due_page(now, now, 10).await.expect("due again");
    assert_eq!((again.tasks, again.set_aside), (vec![good], 0), "set aside once");
    let cursor = ddb
        .get_item()
        .table_name(table)
        .key("bucket", attr("#CURSOR"))
        .key("due_key", attr("#CURSOR"))
        .consistent_read(true)
        .send()
        .await
        .expect("read the unsharded cursor");
    let pending = cursor.item().and_then(|i| i.get("pending"));
    assert!(pending.is_none(), "the emptied minute is forgotten: {pending:?}");
}

#[test]
fn given_the_test_script_requires_the_services_then_a_missing_url_fails_the_test() {
    // Run in a child so this process's environment stays as it is.
    if std::env::var("HOOKWISE_TEST_CHILD").is_ok() {
        support::endpoint("HOOKWISE_TEST_NO_SUCH_URL");
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "given_the_test_script_requires_the_services_then_a_missing_url_fails_the_test",
            "--nocapture",
        ])
        .env("HOOKWISE_TEST_CHILD", "1")
        .env(support::REQUIRE, "1")
        .output()
        .unwrap();
    assert!(
        !status.status.success(),
        "a required but missing endpoint must fail the test"
    );
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("HOOKWISE_TEST_NO_SUCH_URL")
            || String::from_utf8_lossy(&status.stderr).contains("HOOKWISE_TEST_NO_SUCH_URL")
    );
}

#[tokio::test]
async fn given_a_message_on_sqs_the_consumer_port_receives_returns_and_acks_it() {
    use hookwise_core::ports::{DeliveryQueue, QueueConsumer};
    let Some(moto) = support::endpoint(support::MOTO_URL) else {
        return;
    };
    let env = support::env(&moto, &moto, None).await;
    let url = &env.provisioned.delivery_queue_url;
    let consumer = hookwise_aws::SqsConsumer::connect(env.clients.sqs.clone(), url)
        .await
        .unwrap();
    assert_eq!(
        consumer.visibility_timeout(),
        std::time::Duration::from_secs(360),
        "template.yaml's"
    );

    let t = task(Utc::now()).task;
    env.adapters.queue.enqueue(&[(t.clone(), 0)]).await.unwrap();
    let wait = std::time::Duration::from_secs(2);
    let got = consumer.receive(10, wait).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.task, Ok(t.clone()));
    assert!(
        consumer
            .receive(10, std::time::Duration::ZERO)
            .await
            .unwrap()
            .is_empty(),
        "hidden while handled"
    );
    consumer
        .change_visibility(&[got[0].receipt.clone()], std::time::Duration::ZERO)
        .await
        .unwrap();
    let again = consumer.receive(10, wait).await.unwrap();
    assert_eq!(again.len(), 1, "returned for redelivery");
    consumer.ack(&[again[0].receipt.clone()]).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        consumer
            .receive(10, std::time::Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty(),
        "deleted"
    );
}

/// SQS fair queues: a task's tenant is its message's group on the standard queue.
#[tokio::test]
async fn given_a_task_of_a_tenant_then_its_message_carries_the_tenant_as_its_message_group() {
    use aws_sdk_sqs::types::MessageSystemAttributeName;
    use hookwise_core::ports::DeliveryQueue;
    let Some(moto) = support::endpoint(support::MOTO_URL) else {
        return;
    };
    let env = support::env(&moto, &moto, None).await;
    let tenant = hookwise_core::model::TenantId::generate(Utc::now(), &mut rand::rng());
    let t = hookwise_core::ports::DeliveryTask {
        tenant_id: Some(tenant.clone()),
        ..task(Utc::now()).task
    };
    env.adapters.queue.enqueue(&[(t, 0)]).await.unwrap();
    let out = env
        .clients
        .sqs
        .receive_message()
        .queue_url(&env.provisioned.delivery_queue_url)
        .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap();
    let messages = out.messages.unwrap_or_default();
    assert_eq!(messages.len(), 1);
    let group = messages[0]
        .attributes
        .as_ref()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .cloned();
    assert_eq!(group.as_deref(), Some(tenant.as_str()));
}

/// An `order.created` event of `tenant` at `at` with payload `{"n": n}`: with a key, its id
/// derived from it as the services derive it.
fn order_event(
    tenant: &hookwise_core::model::TenantId,
    at: chrono::DateTime<Utc>,
    key: Option<&str>,
    n: i64,
) -> hookwise_core::model::Event {
    use hookwise_core::model::*;
    Event {
        id: match key {
            Some(key) => EventId::for_key(tenant, key),
            None => EventId::generate(at, &mut rand::rng()),
        },
        tenant_id: tenant.clone(),
        event_type: EventType::parse("order.created").unwrap(),
        payload: serde_json::json!({ "n": n }),
        created_at: at,
        idempotency_key: key.map(str::to_owned),
        test: false,
    }
}

/// `event` stored with its one delivery to `sub` (its id as the services derive it).
async fn stored_with_delivery(
    store: &hookwise_aws::DynamoStore,
    event: &hookwise_core::model::Event,
    sub: &hookwise_core::model::SubscriptionId,
) -> hookwise_core::model::Delivery {
    use hookwise_core::model::*;
    let d = Delivery::new(DeliveryId::for_event(&event.id, sub), event, sub.clone());
    assert_eq!(
        store
            .create_event(event, std::slice::from_ref(&d))
            .await
            .expect("create"),
        hookwise_core::ports::Created::New
    );
    d
}

/// Fails the requests of one DynamoDB operation once lit, after letting a number through: a
/// call dies half way, as a crash or a throttling spell between its requests would leave it.
#[derive(Debug, Clone)]
struct OperationFuse(&'static str, std::sync::Arc<std::sync::atomic::AtomicI64>);

impl OperationFuse {
    /// Not lit.
    fn new(operation: &'static str) -> Self {
        Self(operation, std::sync::Arc::new((-1).into()))
    }

    /// Let `passes` more requests through, then fail every one.
    fn light(&self, passes: i64) {
        self.1.store(passes, std::sync::atomic::Ordering::SeqCst);
    }

    fn put_out(&self) {
        self.1.store(-1, std::sync::atomic::Ordering::SeqCst);
    }

    /// A store whose requests go through this fuse.
    fn store(&self, env: &support::Env) -> hookwise_aws::DynamoStore {
        hookwise_aws::DynamoStore::new(
            aws_sdk_dynamodb::Client::from_conf(
                env.clients
                    .dynamodb
                    .config()
                    .to_builder()
                    .interceptor(self.clone())
                    .build(),
            ),
            &env.config,
        )
    }
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for OperationFuse {
    fn name(&self) -> &'static str {
        "OperationFuse"
    }

    fn read_before_transmit(
        &self,
        _context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        use std::sync::atomic::Ordering::SeqCst;
        let hit = cfg
            .load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
            .is_some_and(|m| m.name() == self.0);
        // Lit with passes left: take one (never below 0, so the fuse stays lit).
        let passed = || self.1.fetch_update(SeqCst, SeqCst, |n| (n > 0).then(|| n - 1)).is_ok();
        if hit && self.1.load(SeqCst) >= 0 && !passed() {
            return Err(format!("the fuse is lit: no {} gets through", self.0).into());
        }
        Ok(())
    }
}

/// One event item that does not decode among an ingest's keyed events: read as not found, the
/// others found (one bad item does not make the whole batch look new).
#[tokio::test]
async fn given_an_event_item_that_does_not_decode_then_get_events_finds_the_others() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use hookwise_core::model::*;
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    let store = &env.adapters.store;
    let now = Utc::now();
    let tenant = TenantId::generate(now, &mut rand::rng());
    let sub = SubscriptionId::generate(now, &mut rand::rng());
    let good = order_event(&tenant, now, Some("k-good"), 1);
    stored_with_delivery(store, &good, &sub).await;
    let bad = order_event(&tenant, now, Some("k-bad"), 2);
    env.clients
        .dynamodb
        .put_item()
        .table_name(store.table_name())
        .item("pk", AttributeValue::S(format!("EVT#{}", bad.id)))
        .item("sk", AttributeValue::S("#EVENT".into()))
        .item("doc", AttributeValue::S("not an event".into()))
        .send()
        .await
        .expect("an item that does not decode");

    assert_eq!(
        store
            .get_events(&tenant, &[bad.id.clone(), good.id.clone()])
            .await
            .expect("read"),
        vec![None, Some(good)]
    );
}

/// An ingest that wrote its 150 deliveries and died before its event (the commit point).
#[tokio::test]
async fn given_an_ingest_that_died_before_its_event_then_none_of_its_deliveries_is_seen_and_a_retry_with_its_key_commits_them(
) {
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    use hookwise_core::model::*;
    use hookwise_core::ports::{Created, DeliveryQuery};
    let fuse = OperationFuse::new("PutItem");
    let fused = fuse.store(&env);
    let store = &env.adapters.store;
    let rng = &mut rand::rng();
    let now = Utc::now();
    let tenant = TenantId::generate(now, rng);
    let subs: Vec<SubscriptionId> = (0..150).map(|_| SubscriptionId::generate(now, rng)).collect();
    let event = |key: Option<&str>, at| order_event(&tenant, at, key, 1);
    // As the services name them: derived from the event's and the subscription's ids.
    let deliveries = |e: &Event| -> Vec<Delivery> {
        subs.iter()
            .map(|s| Delivery::new(DeliveryId::for_event(&e.id, s), e, s.clone()))
            .collect()
    };
    let seen = |ds: &[Delivery]| {
        let ds = ds.to_vec();
        async move {
            let mut n = 0;
            for d in &ds {
                n += usize::from(store.get_delivery(&d.id).await.expect("get").is_some());
            }
            n
        }
    };
    let listed = || async {
        let all = store
            .list_deliveries(&tenant, &DeliveryQuery::default())
            .await
            .expect("list");
        let one = store
            .list_deliveries(
                &tenant,
                &DeliveryQuery {
                    subscription_id: Some(subs[7].clone()),
                    ..DeliveryQuery::default()
                },
            )
            .await
            .expect("list one subscription's");
        (all.items.len(), one.items.len())
    };
    let stored_items = |ds: &[Delivery]| {
        let keys: Vec<String> = ds.iter().map(|d| format!("DLV#{}", d.id)).collect();
        let client = env.clients.dynamodb.clone();
        let table = env.config.table.clone();
        async move {
            let mut n = 0;
            for pk in keys {
                let out = client
                    .get_item()
                    .table_name(&table)
                    .key("pk", aws_sdk_dynamodb::types::AttributeValue::S(pk))
                    .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("#DELIVERY".into()))
                    .send()
                    .await
                    .expect("raw get");
                n += usize::from(out.item.is_some());
            }
            n
        }
    };

    // With a key: the 150 deliveries are written, the event is not.
    let first = event(Some("big-1"), now);
    let first_deliveries = deliveries(&first);
    fuse.light(150);
    let died = fused.create_event(&first, &first_deliveries).await;
    assert!(died.is_err(), "the fuse let the event through: {died:?}");
    fuse.put_out();
    assert_eq!(
        stored_items(&first_deliveries).await,
        150,
        "the deliveries are written first"
    );
    assert_eq!(seen(&first_deliveries).await, 0, "but not seen without their event");
    assert_eq!(listed().await, (0, 0));
    assert_eq!(store.get_event(&tenant, &first.id).await.expect("get event"), None);
    assert!(store
        .event_deliveries(&tenant, &first.id)
        .await
        .expect("read")
        .is_empty());

    // The client's retry, with the same key, commits them all.
    let retry = event(Some("big-1"), now + Duration::seconds(2));
    assert_eq!(
        store.create_event(&retry, &deliveries(&retry)).await.expect("retry"),
        Created::New
    );
    assert_eq!(seen(&first_deliveries).await, 150);
    assert_eq!(
        listed().await,
        (50, 1),
        "a page of the tenant's, and the subscription's one"
    );
    assert_eq!(
        store.event_deliveries(&tenant, &first.id).await.expect("read").len(),
        150
    );

    // Without a key nothing retries it: its deliveries stay unseen, and the sweep does not
    // look after them (their messages, sent first, are dropped once old).
    let lost = event(None, now + Duration::seconds(3));
    let lost_deliveries = deliveries(&lost);
    fuse.light(150);
    assert!(fused.create_event(&lost, &lost_deliveries).await.is_err());
    fuse.put_out();
    assert_eq!(stored_items(&lost_deliveries).await, 150);
    assert_eq!(seen(&lost_deliveries).await, 0);
    let swept = store
        .overdue_deliveries(now + Duration::days(1), 1000)
        .await
        .expect("overdue");
    assert!(!swept.iter().any(|d| d.tenant_id == tenant));
    let listed_ids: Vec<DeliveryId> = store
        .list_deliveries(
            &tenant,
            &DeliveryQuery {
                limit: 100,
                ..DeliveryQuery::default()
            },
        )
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert!(lost_deliveries.iter().all(|d| !listed_ids.contains(&d.id)));
}

/// The sweep's pace on DynamoDB Local (the figure is printed; the test checks that every
/// stranded delivery is queued exactly once).
#[tokio::test]
async fn given_5000_stranded_deliveries_on_dynamodb_local_then_the_sweep_requeues_each_once() {
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    use hookwise_core::model::*;
    use std::sync::Arc;
    let store = &env.adapters.store;
    let rng = &mut rand::rng();
    // Replayed ten minutes ago, their messages lost (a replay queues after its state change).
    let then = Utc::now() - Duration::minutes(10);
    let tenant = TenantId::generate(then, rng);
    let subs: Vec<SubscriptionId> = (0..50).map(|_| SubscriptionId::generate(then, rng)).collect();
    let started = std::time::Instant::now();
    for _ in 0..100 {
        let e = Event {
            id: EventId::generate(then, rng),
            tenant_id: tenant.clone(),
            event_type: EventType::parse("order.created").unwrap(),
            payload: serde_json::json!({"n": 1}),
            created_at: then,
            idempotency_key: None,
            test: false,
        };
        let ds: Vec<Delivery> = subs
            .iter()
            .map(|s| Delivery {
                round: 1,
                ..Delivery::new(DeliveryId::generate(then, rng), &e, s.clone())
            })
            .collect();
        store.create_event(&e, &ds).await.expect("create event");
    }
    let stored_in = started.elapsed();

    // The queue in memory: moto's SQS slows down past a few thousand messages, and the
    // figure wanted is the store's.
    let queue = Arc::new(hookwise_core::testing::memory::MemoryQueue::new(
        Arc::new(hookwise_core::testing::memory::ManualClock::new(Utc::now())),
        900,
    ));
    let services = hookwise_core::services::Services::new(
        hookwise_core::services::Ports {
            queue: queue.clone(),
            ..env.adapters.ports(
                Arc::new(hookwise_core::ports::NoSender),
                Arc::new(hookwise_core::ports::SystemClock),
            )
        },
        hookwise_core::services::Config::default(),
        rand::SeedableRng::seed_from_u64(7),
    );
    let started = std::time::Instant::now();
    let mut ticks = 0;
    let mut requeued = 0;
    while requeued < 5000 && ticks < 20 {
        requeued += services.run_scheduler().await.expect("tick").requeued;
        ticks += 1;
    }
    let swept_in = started.elapsed();
    assert_eq!(requeued, 5000, "after {ticks} ticks");
    assert_eq!(services.run_scheduler().await.expect("tick").requeued, 0, "each once");
    let mut queued: Vec<DeliveryId> = queue
        .log
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _)| t.delivery_id.clone())
        .collect();
    queued.sort();
    queued.dedup();
    let queued = queued.len();
    assert_eq!(queued, 5000);
    println!(
        "sweep on DynamoDB Local: 5000 stranded deliveries (stored in {:.1} s) re-queued in {:.1} s, {ticks} tick(s), {:.0} deliveries/s",
        stored_in.as_secs_f64(),
        swept_in.as_secs_f64(),
        5000.0 / swept_in.as_secs_f64()
    );
}

#[tokio::test]
async fn given_a_replay_late_in_an_events_life_then_the_event_is_kept_for_the_new_round() {
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    use hookwise_core::model::*;
    let store = &env.adapters.store;
    let retention = Duration::from_std(env.config.retention).unwrap();
    let rng = &mut rand::rng();
    let created = Utc::now() - retention + Duration::days(1); // a day left to live
    let event = Event {
        id: EventId::generate(created, rng),
        tenant_id: TenantId::generate(created, rng),
        event_type: EventType::parse("order.created").unwrap(),
        payload: serde_json::json!({}),
        created_at: created,
        idempotency_key: None,
        test: false,
    };
    let d = Delivery::new(
        DeliveryId::generate(created, rng),
        &event,
        SubscriptionId::generate(created, rng),
    );
    store.create_event(&event, std::slice::from_ref(&d)).await.unwrap();
    let expiry = || async {
        let out = env
            .clients
            .dynamodb
            .get_item()
            .table_name(&env.config.table)
            .key(
                "pk",
                aws_sdk_dynamodb::types::AttributeValue::S(format!("EVT#{}", event.id)),
            )
            .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("#EVENT".into()))
            .send()
            .await
            .unwrap();
        let item = out.item.expect("the event");
        item["expires_at"].as_n().unwrap().parse::<i64>().unwrap()
    };
    assert_eq!(expiry().await, (created + retention).timestamp());

    // Dead, then replayed now: the new round may retry for up to the retention.
    let dead = Delivery {
        status: DeliveryStatus::Dead,
        next_attempt_at: None,
        updated_at: created + Duration::hours(1),
        ..d.clone()
    };
    store
        .apply_change(&hookwise_core::ports::DeliveryChange {
            expected: hookwise_core::ports::Expected::of(&d),
            next: dead.clone(),
            attempt: None,
        })
        .await
        .unwrap();
    let now = Utc::now();
    let replay = hookwise_core::state::replay(&dead, now).expect("a dead delivery replays");
    store.apply_change(&replay).await.unwrap();
    assert_eq!(expiry().await, (now + retention).timestamp());
    // A later change of the same round leaves it alone.
    let again = hookwise_core::state::requeued(&replay.next, now, now + Duration::minutes(30));
    store.apply_change(&again).await.unwrap();
    assert_eq!(expiry().await, (now + retention).timestamp());
}

#[tokio::test]
async fn given_an_email_whose_finish_dies_half_way_then_the_owners_window_holds_and_what_was_left_goes_in_the_next() {
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    use hookwise_core::model::*;
    use hookwise_core::ports::DeadNotice;
    let fuse = OperationFuse::new("DeleteItem");
    let fused = fuse.store(&env);
    let store = &env.adapters.store;
    let rng = &mut rand::rng();
    let t = Utc.with_ymd_and_hms(2031, 3, 1, 9, 0, 0).unwrap();
    let owner = Email::parse(&format!("o{}@acme.example", rand::random::<u32>())).unwrap();
    let notice = |rng: &mut rand::rngs::ThreadRng| DeadNotice {
        delivery_id: DeliveryId::generate(t, rng),
        round: 0,
        tenant_id: TenantId::generate(t, rng),
        subscription_id: SubscriptionId::generate(t, rng),
        died_at: t,
    };
    for n in [notice(rng), notice(rng)] {
        assert!(store.queue_dead_notice(&owner, &n).await.unwrap());
    }
    let claim_at = |at: chrono::DateTime<Utc>| {
        store.claim_digest(&owner, at, at - Duration::minutes(5), at - Duration::minutes(1))
    };
    let claim = claim_at(t).await.unwrap().expect("claimed");
    assert_eq!(claim.notices.len(), 2);

    // The email went out; then finishing it fails at its deletes.
    fuse.light(0);
    assert!(fused.finish_digest(&claim).await.is_err());
    fuse.put_out();

    // The owner's window holds all the same: no second email within it.
    let later = t + Duration::minutes(2);
    assert!(claim_at(later).await.unwrap().is_none(), "within the window");
    assert!(!store
        .due_digests(later, later - Duration::minutes(5), 100)
        .await
        .unwrap()
        .contains(&owner));
    // After it, what was not cleared goes in the next email (told again, never lost), then
    // nothing is left.
    let next = claim_at(t + Duration::minutes(5))
        .await
        .unwrap()
        .expect("the next window");
    assert_eq!(next.notices, claim.notices);
    store.finish_digest(&next).await.unwrap();
    assert!(claim_at(t + Duration::minutes(20)).await.unwrap().is_none());
    assert!(!store
        .due_digests(t + Duration::minutes(20), t + Duration::minutes(15), 100)
        .await
        .unwrap()
        .contains(&owner));
}

#[tokio::test]
async fn attempts_are_logged_on_the_delivery_spilled_past_8_kb_and_read_with_an_older_builds_records() {
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    use hookwise_core::model::*;
    use hookwise_core::ports::{DeliveryChange, Expected};
    let store = &env.adapters.store;
    let rng = &mut rand::rng();
    let now = Utc::now();
    let tenant = TenantId::generate(now, rng);
    let event = Event {
        id: EventId::generate(now, rng),
        tenant_id: tenant.clone(),
        event_type: EventType::parse("order.created").unwrap(),
        payload: serde_json::json!({"n": 1}),
        created_at: now,
        idempotency_key: None,
        test: false,
    };
    let mut delivery = Delivery::new(
        DeliveryId::generate(now, rng),
        &event,
        SubscriptionId::generate(now, rng),
    );
    store
        .create_event(&event, std::slice::from_ref(&delivery))
        .await
        .expect("create");

    // An older build's record of attempt 1, one item of its own.
    let ddb = &env.clients.dynamodb;
    let attr = |v: &str| aws_sdk_dynamodb::types::AttributeValue::S(v.to_owned());
    let num = |v: u32| aws_sdk_dynamodb::types::AttributeValue::N(v.to_string());
    let started = |n: u32| now + Duration::seconds(i64::from(n));
    ddb.put_item()
        .table_name(&env.config.table)
        .item("pk", attr(&format!("DLV#{}", delivery.id)))
        .item("sk", attr("ATT#0000000000#0000000001"))
        .item("kind", attr("attempt"))
        .item("delivery_id", attr(delivery.id.as_str()))
        .item("round", num(0))
        .item("attempt", num(1))
        .item("started_at", attr(&started(1).to_rfc3339()))
        .item("duration_ms", num(5))
        .item("status_code", num(500))
        .item("error", aws_sdk_dynamodb::types::AttributeValue::Null(true))
        .item("response_excerpt", attr("old"))
        .item("next_attempt_at", aws_sdk_dynamodb::types::AttributeValue::Null(true))
        .send()
        .await
        .expect("an older build's attempt");
    delivery.attempts = 1;
    delivery.status = DeliveryStatus::Retrying;
    store
        .apply_change(&DeliveryChange {
            expected: Expected {
                status: DeliveryStatus::Pending,
                round: 0,
                attempts: 0,
            },
            next: delivery.clone(),
            attempt: None,
        })
        .await
        .expect("the older build's state change");

    // Attempts 2..=13, each answered with 4 KB of error page.
    let mut expected = vec![store.attempts(&delivery.id).await.expect("read")[0].clone()];
    assert_eq!(expected[0].response_excerpt.as_deref(), Some("old"));
    for n in 2..=13 {
        let before = Expected::of(&delivery);
        delivery.attempts = n;
        delivery.updated_at = started(n);
        let attempt = Attempt {
            delivery_id: delivery.id.clone(),
            round: 0,
            attempt: n,
            started_at: started(n),
            duration_ms: 7,
            status_code: Some(503),
            error: None,
            response_excerpt: Some(format!("{n:04}").repeat(1000)),
            next_attempt_at: Some(started(n + 1)),
        };
        store
            .apply_change(&DeliveryChange {
                expected: before,
                next: delivery.clone(),
                attempt: Some(attempt.clone()),
            })
            .await
            .expect("apply");
        expected.push(attempt);
        // The same attempt again (a duplicate message) is refused: it is recorded once.
        let again = store
            .apply_change(&DeliveryChange {
                expected: before,
                next: Delivery {
                    last_error: Some("a duplicate".into()),
                    ..delivery.clone()
                },
                attempt: Some(expected[expected.len() - 1].clone()),
            })
            .await;
        assert!(matches!(again, Err(PortError::ConditionFailed(_))), "{again:?}");
    }
    assert_eq!(store.attempts(&delivery.id).await.expect("read"), expected);
    assert_eq!(
        store.get_delivery(&delivery.id).await.expect("get"),
        Some(delivery.clone())
    );

    // The delivery item stayed small enough to write cheaply: the log moved out.
    let item = ddb
        .get_item()
        .table_name(&env.config.table)
        .key("pk", attr(&format!("DLV#{}", delivery.id)))
        .key("sk", attr("#DELIVERY"))
        .send()
        .await
        .expect("raw item")
        .item
        .expect("the delivery item");
    let size: usize = item.iter().map(|(k, v)| k.len() + format!("{v:?}").len()).sum();
    assert!(size < 16 * 1024, "the delivery item is {size} bytes");
}

/// A tenant's and a subscription's deliveries spread over the listing shards; those an older
/// build wrote under the unsharded keys are listed with them.
#[tokio::test]
async fn given_deliveries_on_every_listing_shard_and_some_an_older_build_wrote_then_listings_page_through_each_once_newest_first(
) {
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    use aws_sdk_dynamodb::types::AttributeValue;
    use hookwise_core::model::*;
    use hookwise_core::ports::DeliveryQuery;
    let store = &env.adapters.store;
    let client = &env.clients.dynamodb;
    let table = &env.config.table;
    let rng = &mut rand::rng();
    let t = Utc.with_ymd_and_hms(2031, 5, 1, 9, 0, 0).unwrap();
    let tenant = TenantId::generate(t, rng);
    let sub = SubscriptionId::generate(t, rng);
    let index_key = |d: &Delivery, attr: &str| {
        let client = client.clone();
        let (table, id, attr) = (table.clone(), d.id.clone(), attr.to_owned());
        async move {
            let out = client
                .get_item()
                .table_name(table)
                .key("pk", AttributeValue::S(format!("DLV#{id}")))
                .key("sk", AttributeValue::S("#DELIVERY".into()))
                .send()
                .await
                .expect("raw get");
            out.item
                .and_then(|i| i.get(&attr).cloned())
                .and_then(|v| v.as_s().ok().cloned())
                .unwrap()
        }
    };
    // Deliveries until every shard holds some: their ids are random, so a fixed count (90)
    // left a shard empty about one run in twenty. At least 90, at most 600.
    let mut made = Vec::new();
    let mut shards = std::collections::HashSet::new();
    let every = hookwise_aws::store::LISTING_SHARDS as usize;
    for i in 0..600 {
        if i >= 90 && shards.len() == every {
            break;
        }
        let event = order_event(&tenant, t + Duration::seconds(i), None, i);
        let d = stored_with_delivery(store, &event, &sub).await;
        shards.insert(index_key(&d, "gsi_tenant").await);
        made.push(d);
    }
    assert_eq!(shards.len(), every, "{} deliveries reach every shard", made.len());

    // Every third as an older build wrote it: the tenant's and subscription's keys unsharded.
    for d in made.iter().step_by(3) {
        client
            .update_item()
            .table_name(table)
            .key("pk", AttributeValue::S(format!("DLV#{}", d.id)))
            .key("sk", AttributeValue::S("#DELIVERY".into()))
            .update_expression("SET gsi_tenant = :t, gsi_subscription = :s")
            .expression_attribute_values(":t", AttributeValue::S(tenant.to_string()))
            .expression_attribute_values(":s", AttributeValue::S(format!("{tenant}#{sub}")))
            .send()
            .await
            .expect("write as an older build");
    }

    let newest_first: Vec<DeliveryId> = made.iter().rev().map(|d| d.id.clone()).collect();
    for subscription_id in [None, Some(sub.clone())] {
        let mut listed = Vec::new();
        let mut cursor = None;
        loop {
            let page = store
                .list_deliveries(
                    &tenant,
                    &DeliveryQuery {
                        subscription_id: subscription_id.clone(),
                        limit: 25,
                        cursor,
                        ..DeliveryQuery::default()
                    },
                )
                .await
                .expect("list");
            assert!(page.items.len() <= 25);
            listed.extend(page.items.into_iter().map(|d| d.id));
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(listed, newest_first, "by subscription: {}", subscription_id.is_some());
    }
}

/// Two leftovers an index or an older build can hand the adapter: a key named twice in one
/// read (DynamoDB refuses a `BatchGetItem` that does), and an event an older build left half
/// written in `overdue` (the sweep takes it out of the index, once).
#[tokio::test]
async fn given_a_key_named_twice_and_an_old_builds_unfinished_event_then_reads_and_the_sweep_go_on() {
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    use aws_sdk_dynamodb::types::AttributeValue;
    use hookwise_core::model::*;
    let store = &env.adapters.store;
    let client = &env.clients.dynamodb;
    let table = &env.config.table;
    let rng = &mut rand::rng();
    let t = Utc.with_ymd_and_hms(2031, 6, 1, 9, 0, 0).unwrap();
    let tenant = TenantId::generate(t, rng);
    let sub = SubscriptionId::generate(t, rng);
    let event = order_event(&tenant, t, None, 1);
    let d = stored_with_delivery(store, &event, &sub).await;
    let event_key = [
        ("pk", AttributeValue::S(format!("EVT#{}", event.id))),
        ("sk", AttributeValue::S("#EVENT".into())),
    ];
    let mut update = client
        .update_item()
        .table_name(table)
        .update_expression("SET delivery_ids = :ids, gsi_due_shard = :shard, gsi_due = :due")
        .expression_attribute_values(
            ":ids",
            AttributeValue::L(vec![
                AttributeValue::S(d.id.to_string()),
                AttributeValue::S(d.id.to_string()),
            ]),
        )
        .expression_attribute_values(":shard", AttributeValue::S("DUE#0".into()))
        .expression_attribute_values(
            ":due",
            AttributeValue::S(format!("2031-06-01T08:00:00.000000Z#{}", event.id)),
        );
    for (name, value) in event_key.clone() {
        update = update.key(name, value);
    }
    update
        .send()
        .await
        .expect("the event as an older build might have left it");

    let listed = store
        .event_deliveries(&tenant, &event.id)
        .await
        .expect("a key named twice is read (once)");
    assert!(!listed.is_empty() && listed.iter().all(|x| x == &d), "{listed:?}");

    let swept = store
        .overdue_deliveries(t + Duration::days(1), 100)
        .await
        .expect("overdue");
    assert!(
        swept.iter().all(|x| x.tenant_id != tenant),
        "an event is not a delivery"
    );
    let mut get = client.get_item().table_name(table);
    for (name, value) in event_key {
        get = get.key(name, value);
    }
    let item = get.send().await.expect("raw get").item.expect("the event");
    assert!(
        !item.contains_key("gsi_due_shard"),
        "the sweep took it out of the index"
    );
}

/// A key used again after its first event expired (the retention), while that event's
/// delivery, which retried for longer, is still stored: the new event is delivered afresh.
#[tokio::test]
async fn given_a_key_used_again_after_its_event_expired_but_not_its_delivery_then_the_new_event_is_delivered() {
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    use aws_sdk_dynamodb::types::AttributeValue;
    use hookwise_core::model::*;
    use hookwise_core::ports::Created;
    let store = &env.adapters.store;
    let client = &env.clients.dynamodb;
    let table = &env.config.table;
    let rng = &mut rand::rng();
    let t = Utc.with_ymd_and_hms(2031, 7, 1, 9, 0, 0).unwrap();
    let tenant = TenantId::generate(t, rng);
    let sub = SubscriptionId::generate(t, rng);
    let keyed = |at| order_event(&tenant, at, Some("order-9"), 9);
    let first = keyed(t);
    let d = stored_with_delivery(store, &first, &sub).await;
    // Delivered on its third attempt, long ago; then its event expired (TTL deleted it).
    client
        .update_item()
        .table_name(table)
        .key("pk", AttributeValue::S(format!("DLV#{}", d.id)))
        .key("sk", AttributeValue::S("#DELIVERY".into()))
        .update_expression("SET #st = :delivered, attempts = :three")
        .expression_attribute_names("#st", "status")
        .expression_attribute_values(":delivered", AttributeValue::S("delivered".into()))
        .expression_attribute_values(":three", AttributeValue::N("3".into()))
        .send()
        .await
        .expect("delivered");
    client
        .delete_item()
        .table_name(table)
        .key("pk", AttributeValue::S(format!("EVT#{}", first.id)))
        .key("sk", AttributeValue::S("#EVENT".into()))
        .send()
        .await
        .expect("the event expired");

    let again = keyed(t + Duration::days(40));
    let fresh = Delivery::new(DeliveryId::for_event(&again.id, &sub), &again, sub.clone());
    assert_eq!(fresh.id, d.id, "the same key names the same delivery");
    assert_eq!(
        store.create_event(&again, std::slice::from_ref(&fresh)).await.unwrap(),
        Created::New
    );
    let stored = store.get_delivery(&d.id).await.unwrap().expect("the delivery");
    assert_eq!(stored, fresh, "a new delivery, due for its first attempt");
    assert_eq!(
        store.event_deliveries(&tenant, &again.id).await.unwrap(),
        vec![fresh.clone()]
    );

    // While its event is there, an attempted delivery is left as it is (a racing request).
    client
        .update_item()
        .table_name(table)
        .key("pk", AttributeValue::S(format!("DLV#{}", d.id)))
        .key("sk", AttributeValue::S("#DELIVERY".into()))
        .update_expression("SET #st = :delivered, attempts = :one")
        .expression_attribute_names("#st", "status")
        .expression_attribute_values(":delivered", AttributeValue::S("delivered".into()))
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .send()
        .await
        .expect("delivered");
    let racing = keyed(t + Duration::days(40) + Duration::seconds(1));
    assert_eq!(
        store.create_event(&racing, std::slice::from_ref(&fresh)).await.unwrap(),
        Created::Existing(again.id.clone())
    );
    let kept = store.get_delivery(&d.id).await.unwrap().unwrap();
    assert_eq!((kept.status, kept.attempts), (DeliveryStatus::Delivered, 1));
}

/// A tenant an older build wrote: its item and its one key's copy, with neither a version
/// nor its keys listed, and no entry in the directory. A change lists it and versions it;
/// its key, named by value, is revoked like any other.
#[tokio::test]
async fn given_a_tenant_an_older_build_wrote_then_its_key_can_be_revoked_and_a_change_lists_it() {
    let Some(env) = support::dynamodb_local_env().await else {
        return;
    };
    use aws_sdk_dynamodb::types::AttributeValue;
    use hookwise_core::model::*;
    use hookwise_core::services::{KeyRef, Services};
    // A process of its own: nothing kept from another's lookups.
    let process = || {
        Services::new(
            env.adapters.ports(
                std::sync::Arc::new(hookwise_core::ports::NoSender),
                std::sync::Arc::new(hookwise_core::ports::SystemClock),
            ),
            hookwise_core::services::Config::default(),
            rand::SeedableRng::from_os_rng(),
        )
    };
    let services = process();
    let rng = &mut rand::rng();
    let id = TenantId::generate(Utc::now(), rng);
    let key = hookwise_core::auth::generate_api_key(rng);
    let old_item = |pk: String, sk: &str, kind: &str| {
        HashMap::from([
            ("pk".to_owned(), AttributeValue::S(pk)),
            ("sk".to_owned(), AttributeValue::S(sk.into())),
            ("kind".to_owned(), AttributeValue::S(kind.into())),
            ("id".to_owned(), AttributeValue::S(id.to_string())),
            ("name".to_owned(), AttributeValue::S("Old".into())),
            ("owner_email".to_owned(), AttributeValue::S("old@example.com".into())),
            ("retries_enabled".to_owned(), AttributeValue::Bool(true)),
            (
                "created_at".to_owned(),
                AttributeValue::S("2026-01-01T00:00:00Z".into()),
            ),
        ])
    };
    let hash = hookwise_core::auth::hash_api_key(&key);
    for item in [
        old_item(format!("TEN#{id}"), "#TENANT", "tenant"),
        old_item(format!("KEY#{hash}"), "#KEY", "api_key"),
    ] {
        env.clients
            .dynamodb
            .put_item()
            .table_name(&env.config.table)
            .set_item(Some(item))
            .send()
            .await
            .expect("write as an older build");
    }
    let listed = || async { services.all_tenants().await.unwrap().iter().any(|t| t.id == id) };
    assert_eq!(services.authenticate(&key).await.unwrap().id, id);
    let old = services.tenant(&id).await.unwrap();
    assert!(old.api_keys.is_empty());
    // Its `retries_enabled` flag reads as the setting it was: on, not left to the rollout.
    assert_eq!(old.retries, RetriesSetting::On);
    assert!(!listed().await, "an older build listed no tenants");

    // Named by id it is unknown (its tenant does not list it); by value, it goes.
    let (rotated, new_key) = services.rotate_api_key(&id).await.unwrap();
    assert_eq!((rotated.version, rotated.api_keys.len()), (1, 1));
    assert!(listed().await, "a change lists it");
    // Disabled, its old key (whose entry the change did not rewrite) is refused too.
    let disable = |status| hookwise_core::services::TenantPatch {
        status: Some(status),
        ..Default::default()
    };
    services
        .update_tenant(&id, &disable(TenantStatus::Disabled))
        .await
        .unwrap();
    assert!(matches!(
        process().identify(&key).await,
        Err(hookwise_core::Error::Forbidden {
            code: "tenant_disabled",
            ..
        })
    ));
    services
        .update_tenant(&id, &disable(TenantStatus::Active))
        .await
        .unwrap();
    let revoked = services.revoke_api_key(&id, &KeyRef::Key(key.clone())).await.unwrap();
    assert_eq!(revoked.api_keys, rotated.api_keys);
    let fresh = process();
    assert!(matches!(
        fresh.authenticate(&key).await,
        Err(hookwise_core::Error::Unauthorized)
    ));
    assert_eq!(fresh.authenticate(&new_key).await.unwrap().id, id);
}
