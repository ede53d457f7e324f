use aws_lambda_events::sqs::SqsEvent;
use hookwise_aws::encode_task;
use hookwise_core::model::*;
use hookwise_core::policy::{Jitter, RetryPolicy};
use hookwise_core::ports::{DeliveryTask, Store};
use hookwise_core::services::{NewEvent, NewSubscription};
use hookwise_core::testing::memory::{Harness, ScriptedSender};

use super::*;

/// An SQS event as Lambda sends it, one record per (message id, body).
fn sqs_event(messages: &[(&str, String)]) -> SqsEvent {
    let records: Vec<_> = messages
        .iter()
        .map(|(id, body)| {
            serde_json::json!({
                "messageId": id, "receiptHandle": format!("rh-{id}"), "body": body,
                "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
                "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:delivery", "awsRegion": "us-east-1"
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({ "Records": records })).expect("an SQS event")
}

/// The message ids a batch response sends back to SQS.
fn failed_ids(out: &aws_lambda_events::sqs::SqsBatchResponse) -> Vec<&str> {
    out.batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect()
}

async fn one_queued_delivery(h: &Harness) -> DeliveryTask {
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = NewSubscription {
        url: EndpointUrl::parse("https://hooks.example.com/in").unwrap(),
        event_types: vec![EventTypeFilter::parse("*").unwrap()],
        owner_email: None,
        retry_policy: Some(RetryPolicy::custom(vec![1], Jitter::None, false).unwrap()),
        timeout_ms: None,
        rate_limit_per_second: None,
        auto_disable_after_hours: None,
        circuit_breaker: None,
        description: None,
        filter: None,
        headers: None,
    };
    h.services.create_subscription(&tenant, sub).await.unwrap();
    let event = NewEvent {
        event_type: EventType::parse("invoice.paid").unwrap(),
        payload: serde_json::json!({"n": 1}),
    };
    h.services.ingest(&tenant, event, None).await.unwrap();
    let mut tasks = h.queue.take_visible();
    assert_eq!(tasks.len(), 1);
    tasks.remove(0)
}

#[tokio::test]
async fn given_a_deliverable_message_and_a_duplicate_then_both_succeed_and_one_request_is_made() {
    let h = Harness::new(ScriptedSender::always(200));
    let task = one_queued_delivery(&h).await;
    let body = encode_task(&task);
    let out = handle(
        &h.services,
        sqs_event(&[("m-1", body.clone()), ("m-2", body)]),
        h.deadline_in(60),
    )
    .await;
    assert!(out.batch_item_failures.is_empty(), "{out:?}");
    assert_eq!(
        h.sender.requests.lock().unwrap().len(),
        1,
        "the duplicate is stale, not a second POST"
    );
    let d = h.store.get_delivery(&task.delivery_id).await.unwrap().unwrap();
    assert_eq!(d.status, DeliveryStatus::Delivered);
}

#[tokio::test]
async fn given_a_failing_endpoint_then_the_message_is_done_and_the_retry_is_queued_not_redelivered() {
    let h = Harness::new(ScriptedSender::always(500));
    let task = one_queued_delivery(&h).await;
    let out = handle(
        &h.services,
        sqs_event(&[("m-1", encode_task(&task))]),
        h.deadline_in(60),
    )
    .await;
    assert!(
        out.batch_item_failures.is_empty(),
        "an endpoint's failure is the retry policy's business: {out:?}"
    );
    assert_eq!(h.queue.log.lock().unwrap().last().map(|(t, _)| t.attempt), Some(2));
}

#[tokio::test]
async fn given_a_body_that_is_not_a_task_then_only_that_message_is_reported() {
    let h = Harness::new(ScriptedSender::always(200));
    let task = one_queued_delivery(&h).await;
    let out = handle(
        &h.services,
        sqs_event(&[("good", encode_task(&task)), ("bad", "{\"hello\":1}".into())]),
        h.deadline_in(60),
    )
    .await;
    let ids = failed_ids(&out);
    assert_eq!(ids, ["bad"]);
    let json = serde_json::to_value(&out).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"batchItemFailures": [{"itemIdentifier": "bad"}]}),
        "the wire shape Lambda reads"
    );
}

#[tokio::test]
async fn given_any_infrastructure_error_then_the_message_comes_back_and_outcomes_do_not() {
    let h = Harness::new(ScriptedSender::always(500));
    let task = one_queued_delivery(&h).await;
    h.store.unavailable.store(true, std::sync::atomic::Ordering::SeqCst);
    let out = handle(
        &h.services,
        sqs_event(&[("m-1", encode_task(&task))]),
        h.deadline_in(60),
    )
    .await;
    let failed = failed_ids(&out);
    assert_eq!(failed, ["m-1"], "a store failure is SQS's to redeliver");
    h.store.unavailable.store(false, std::sync::atomic::Ordering::SeqCst);
    let out = handle(
        &h.services,
        sqs_event(&[("m-1", encode_task(&task))]),
        h.deadline_in(60),
    )
    .await;
    assert!(
        out.batch_item_failures.is_empty(),
        "an endpoint's 500 is an outcome: {out:?}"
    );
}

#[tokio::test]
async fn given_an_invocation_deadline_then_each_post_fits_in_it_and_one_that_cannot_start_goes_back_unattempted() {
    let h = Harness::new(ScriptedSender::always(200));
    let task = one_queued_delivery(&h).await;
    let margin = hookwise_core::services::DEADLINE_MARGIN.as_secs() as i64;

    // Less than a second left after the margin: no POST, the message comes back as it was.
    let out = handle(
        &h.services,
        sqs_event(&[("m-1", encode_task(&task))]),
        h.deadline_in(margin),
    )
    .await;
    let failed = failed_ids(&out);
    assert_eq!(failed, ["m-1"]);
    assert!(h.sender.requests.lock().unwrap().is_empty(), "not attempted");
    let d = h.store.get_delivery(&task.delivery_id).await.unwrap().unwrap();
    assert_eq!(
        (d.status, d.attempts),
        (DeliveryStatus::Pending, 0),
        "no attempt recorded"
    );

    // Five seconds left after the margin: the subscription's 10 s timeout is cut to 5.
    let out = handle(
        &h.services,
        sqs_event(&[("m-1", encode_task(&task))]),
        h.deadline_in(margin + 5),
    )
    .await;
    assert!(out.batch_item_failures.is_empty(), "{out:?}");
    let requests = h.sender.requests.lock().unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].timeout, std::time::Duration::from_secs(5));
}
