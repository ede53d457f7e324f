//! Operational webhooks on in-memory ports: Hookwise's own events about a tenant's endpoints,
//! judged by what the receiving endpoints got.

use chrono::Duration;
use hookwise_core::circuit::CircuitBreaker;
use hookwise_core::model::*;
use hookwise_core::ports::{DeliveryTask, Store};
use hookwise_core::services::{builtin_event_types, Catalogue, EventTypePatch, NewEvent, NewSubscription};
use hookwise_core::testing::memory::{status_outcome, Harness, ScriptedSender};
use hookwise_core::Error;
use serde_json::Value;

const OPS: &str = "https://ops.example.com/hooks";

fn new_sub(url: &str, types: &[&str], schedule: Vec<u64>) -> NewSubscription {
    NewSubscription {
        url: EndpointUrl::parse(url).unwrap(),
        event_types: types.iter().map(|t| EventTypeFilter::parse(t).unwrap()).collect(),
        owner_email: None,
        retry_policy: Some(
            hookwise_core::policy::RetryPolicy::custom(schedule, hookwise_core::policy::Jitter::None, false).unwrap(),
        ),
        timeout_ms: None,
        rate_limit_per_second: None,
        auto_disable_after_hours: None,
        circuit_breaker: Some(CircuitBreaker::off()),
        description: None,
        filter: None,
        headers: None,
    }
}

async fn subscribe(h: &Harness, tenant: &Tenant, new: NewSubscription) -> Subscription {
    h.services.create_subscription(tenant, new).await.unwrap().subscription
}

fn event(t: &str) -> NewEvent {
    NewEvent {
        event_type: EventType::parse(t).unwrap(),
        payload: serde_json::json!({"amount": 42}),
    }
}

/// The envelopes `url` received, as sent (every attempt).
fn received(h: &Harness, url: &str) -> Vec<Value> {
    h.sender
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.url.as_str() == url)
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

/// The distinct events of `event_type` that `url` received (by envelope id).
fn told(h: &Harness, url: &str, event_type: &str) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    received(h, url)
        .into_iter()
        .filter(|e| e["type"] == event_type)
        .filter(|e| seen.insert(e["id"].as_str().unwrap().to_owned()))
        .collect()
}

/// Each envelope's `data` matches its type's schema in the catalogue.
fn assert_matches_its_schema(envelope: &Value) {
    let defs = builtin_event_types();
    let def = defs
        .iter()
        .find(|d| d.name.as_str() == envelope["type"].as_str().unwrap())
        .expect("a built-in type");
    let validator = jsonschema::validator_for(def.schema.as_ref().unwrap()).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&envelope["data"])
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{}: {errors:?}\n{envelope}", def.name);
}

#[tokio::test]
async fn given_a_subscription_to_dead_deliveries_then_each_dead_round_is_told_once_and_star_does_not_hear_it() {
    let h = Harness::new(ScriptedSender::new(|url, _| match url.contains("down") {
        true => status_outcome(503),
        false => status_outcome(200),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let down = subscribe(&h, &tenant, new_sub("https://down.example.com/", &["*"], vec![1])).await;
    let everything = subscribe(&h, &tenant, new_sub("https://all.example.com/", &["*"], vec![1])).await;
    subscribe(&h, &tenant, new_sub(OPS, &["hookwise.delivery.dead"], vec![1])).await;
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.run_for(Duration::seconds(10), Duration::seconds(1)).await;

    let dead = ingested
        .deliveries
        .iter()
        .find(|d| d.subscription_id == down.id)
        .unwrap();
    let told = told(&h, OPS, "hookwise.delivery.dead");
    assert_eq!(told.len(), 1, "one dead round, told once: {told:?}");
    let data = &told[0]["data"];
    assert_eq!(data["delivery_id"], dead.id.as_str());
    assert_eq!(data["subscription_id"], down.id.as_str());
    assert_eq!(data["endpoint_url"], "https://down.example.com/");
    assert_eq!(data["event_type"], "invoice.paid");
    assert_eq!(data["attempts"], 2);
    assert_eq!(data["last_status_code"], 503);
    assert_matches_its_schema(&told[0]);
    assert!(
        received(&h, everything.url.as_str())
            .iter()
            .all(|e| e["type"] == "invoice.paid"),
        "`*` is every type the service sends, not Hookwise's own"
    );
    assert_eq!(h.mailer.sent.lock().unwrap().len(), 1, "the owner's email as before");

    // The dead letter again (its batch came back): stored once, so sent once.
    let again = DeliveryTask {
        delivery_id: dead.id.clone(),
        round: 0,
        attempt: 2,
        queued_at: None,
        slot: None,
        tenant_id: None,
        held_until: None,
        redrives: 0,
    };
    h.services.handle_dead_letters(&[again]).await.unwrap();
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    assert_eq!(self::told(&h, OPS, "hookwise.delivery.dead").len(), 1);

    // A replay's death is another round: told again.
    h.services.replay_delivery(&tenant, &dead.id).await.unwrap();
    h.run_for(Duration::seconds(10), Duration::seconds(1)).await;
    let told = self::told(&h, OPS, "hookwise.delivery.dead");
    assert_eq!(told.len(), 2);
    assert_eq!(told[1]["data"]["round"], 1);
}

#[tokio::test]
async fn given_an_operational_endpoint_that_fails_then_no_event_is_made_about_its_own_failures() {
    // Everything fails: the service's endpoint and the operational one.
    let h = Harness::new(ScriptedSender::always(503));
    let (tenant, _) = h.tenant("owner@example.com").await;
    subscribe(&h, &tenant, new_sub("https://down.example.com/", &["*"], vec![])).await;
    let ops = NewSubscription {
        auto_disable_after_hours: Some(Some(1)),
        circuit_breaker: Some(CircuitBreaker::default()),
        ..new_sub(OPS, &["hookwise.*"], vec![])
    };
    let ops = subscribe(&h, &tenant, ops).await;
    for _ in 0..8 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    h.run_for(Duration::seconds(60), Duration::seconds(1)).await;
    h.clock.advance(Duration::minutes(61));
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.run_for(Duration::seconds(60), Duration::seconds(1)).await;

    // Nine deaths of the service's deliveries told; none of the operational deliveries'
    // deaths, its breaker or its disabling.
    let sent = received(&h, OPS);
    let types: std::collections::BTreeSet<&str> = sent.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["hookwise.delivery.dead"].into(), "{sent:?}");
    assert!(sent.iter().all(|e| e["data"]["event_type"] == "invoice.paid"));
    let stored = h
        .services
        .list_deliveries(&tenant, Default::default())
        .await
        .unwrap()
        .items;
    let about_ops = stored.iter().filter(|d| d.event_type.is_hookwise()).count();
    assert!(about_ops <= 9, "one per dead delivery of the service's: {about_ops}");
    let ops = h.services.get_subscription(&tenant, &ops.id).await.unwrap();
    let breaker = h.store.circuit(&ops.id).await.unwrap();
    assert!(
        breaker.is_some(),
        "its breaker did open: the quiet was chosen, not luck"
    );
}

#[tokio::test]
async fn given_an_endpoint_gone_then_its_disabling_is_told_once_though_its_message_comes_twice() {
    let h = Harness::new(ScriptedSender::new(|url, _| match url.contains("gone") {
        true => status_outcome(410),
        false => status_outcome(200),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let gone = subscribe(&h, &tenant, new_sub("https://gone.example.com/", &["*"], vec![1])).await;
    subscribe(&h, &tenant, new_sub(OPS, &["hookwise.endpoint.*"], vec![1])).await;
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let task = h.queue.take_visible().remove(0);
    h.services.deliver(&task).await.unwrap();
    // The same message again (a duplicate, or its first handler's answer lost).
    h.services.deliver(&task).await.unwrap();
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;

    let told = told(&h, OPS, "hookwise.endpoint.disabled");
    assert_eq!(told.len(), 1, "{told:?}");
    let data = &told[0]["data"];
    assert_eq!(data["reason"], "gone");
    assert_eq!(data["subscription_id"], gone.id.as_str());
    assert_eq!(data["delivery_id"], ingested.deliveries[0].id.as_str());
    assert_matches_its_schema(&told[0]);
    assert!(
        self::told(&h, OPS, "hookwise.delivery.dead").is_empty(),
        "not subscribed to it"
    );
}

#[tokio::test]
async fn given_a_410_whose_telling_fails_then_the_redelivered_message_tells_it() {
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::new(|url, _| match url.contains("gone") {
        true => status_outcome(410),
        false => status_outcome(200),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    subscribe(&h, &tenant, new_sub("https://gone.example.com/", &["*"], vec![1])).await;
    subscribe(&h, &tenant, new_sub(OPS, &["hookwise.endpoint.disabled"], vec![1])).await;
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let task = h.queue.take_visible().remove(0);
    // The disabling's write lands; the telling's enqueue fails.
    h.queue.failing_enqueues.store(1, Ordering::SeqCst);
    assert!(h.services.deliver(&task).await.is_err(), "the message must come back");
    assert_eq!(
        h.queue.dead_letters().len(),
        1,
        "the death is handed on (for its owner's email) before the telling"
    );
    h.services.deliver(&task).await.unwrap();
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    assert_eq!(told(&h, OPS, "hookwise.endpoint.disabled").len(), 1);
}

#[tokio::test]
async fn given_an_endpoint_failing_past_its_auto_disable_time_then_its_disabling_is_told_with_the_email() {
    let h = Harness::new(ScriptedSender::new(|url, _| match url.contains("down") {
        true => status_outcome(500),
        false => status_outcome(200),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let down = NewSubscription {
        auto_disable_after_hours: Some(Some(1)),
        ..new_sub("https://down.example.com/", &["*"], vec![])
    };
    let down = subscribe(&h, &tenant, down).await;
    subscribe(&h, &tenant, new_sub(OPS, &["hookwise.endpoint.disabled"], vec![1])).await;
    h.clock.advance(Duration::minutes(61));
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;

    let told = told(&h, OPS, "hookwise.endpoint.disabled");
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0]["data"]["reason"], "failing");
    assert_eq!(told[0]["data"]["subscription_id"], down.id.as_str());
    assert_eq!(told[0]["data"]["auto_disable_after_hours"], 1);
    assert_matches_its_schema(&told[0]);
    let emails = h.mailer.sent.lock().unwrap();
    assert!(
        emails.iter().any(|m| m.subject.contains("disabled")),
        "the email as before"
    );
}

#[tokio::test]
async fn given_an_endpoint_down_then_up_then_its_breaker_opening_closing_and_recovery_are_told() {
    // The endpoint fails its first 6 POSTs, then succeeds.
    let h = Harness::new(ScriptedSender::new(|url, n| match url.contains("flaky") && n < 6 {
        true => status_outcome(503),
        false => status_outcome(200),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let flaky = NewSubscription {
        circuit_breaker: Some(CircuitBreaker::default()),
        ..new_sub("https://flaky.example.com/", &["*"], vec![10, 60, 120, 300])
    };
    let flaky = subscribe(&h, &tenant, flaky).await;
    subscribe(&h, &tenant, new_sub(OPS, &["hookwise.endpoint.*"], vec![1])).await;
    for _ in 0..6 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    h.run_for(Duration::minutes(15), Duration::seconds(1)).await;

    let opened = told(&h, OPS, "hookwise.endpoint.breaker_opened");
    let closed = told(&h, OPS, "hookwise.endpoint.breaker_closed");
    let recovered = told(&h, OPS, "hookwise.endpoint.recovered");
    assert_eq!(
        (opened.len(), closed.len(), recovered.len()),
        (1, 1, 1),
        "{:?}",
        received(&h, OPS)
    );
    for e in [&opened[0], &closed[0], &recovered[0]] {
        assert_eq!(e["data"]["subscription_id"], flaky.id.as_str());
        assert_matches_its_schema(e);
    }
    assert_eq!(
        opened[0]["data"]["failures"],
        CircuitBreaker::default().failure_threshold
    );
    assert_eq!(closed[0]["data"]["opened_at"], opened[0]["data"]["opened_at"]);
    assert!(recovered[0]["data"]["failures"].as_u64().unwrap() >= 5);
    let stored = h
        .services
        .list_deliveries(&tenant, Default::default())
        .await
        .unwrap()
        .items;
    assert!(
        stored
            .iter()
            .filter(|d| d.subscription_id == flaky.id)
            .all(|d| d.status == DeliveryStatus::Delivered),
        "every held delivery delivered"
    );
}

#[tokio::test]
async fn given_an_operations_tenant_then_it_hears_of_every_tenants_endpoints_and_a_tenant_with_no_subscription_stores_nothing(
) {
    let h = Harness::new(ScriptedSender::new(|url, _| match url.contains("down") {
        true => status_outcome(503),
        false => status_outcome(200),
    }));
    let (customer, _) = h.tenant("customer@example.com").await;
    let (operator, _) = h.tenant("operator@example.com").await;
    subscribe(&h, &customer, new_sub("https://down.example.com/", &["*"], vec![])).await;
    subscribe(&h, &operator, new_sub(OPS, &["hookwise.delivery.dead"], vec![1])).await;

    // Not chosen yet: the operator's subscription hears of its own tenant only.
    h.services.ingest(&customer, event("invoice.paid"), None).await.unwrap();
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    assert!(told(&h, OPS, "hookwise.delivery.dead").is_empty());

    h.services
        .set_operations_tenant(Some(operator.id.clone()))
        .await
        .unwrap();
    h.clock.advance(Duration::seconds(31)); // past the kept copy of the deployment's settings
    h.services.ingest(&customer, event("invoice.paid"), None).await.unwrap();
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    let told = told(&h, OPS, "hookwise.delivery.dead");
    assert_eq!(told.len(), 1);
    assert_eq!(told[0]["data"]["tenant_id"], customer.id.as_str());

    // The customer subscribes to none: its dead deliveries stored no event of Hookwise's.
    let customers = h
        .services
        .list_deliveries(&customer, Default::default())
        .await
        .unwrap()
        .items;
    assert!(customers.iter().all(|d| !d.event_type.is_hookwise()));

    let unknown = TenantId::parse("ten_nobody").unwrap();
    assert!(matches!(
        h.services.set_operations_tenant(Some(unknown)).await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn given_the_catalogue_then_hookwises_own_types_are_listed_with_schemas_and_cannot_be_changed() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    for catalogue in [Catalogue::Deployment, Catalogue::Tenant(tenant.id.clone())] {
        let (types, _) = h.services.list_event_types(&catalogue, None, 0).await.unwrap();
        let names: Vec<&str> = types.iter().map(|d| d.name.as_str()).collect();
        for name in [
            "hookwise.delivery.dead",
            "hookwise.endpoint.breaker_closed",
            "hookwise.endpoint.breaker_opened",
            "hookwise.endpoint.disabled",
            "hookwise.endpoint.recovered",
            "hookwise.ping",
        ] {
            assert!(names.contains(&name), "{name} in {names:?}");
        }
        assert!(types
            .iter()
            .filter(|d| d.name.is_hookwise())
            .all(|d| d.schema.is_some()));
        let name = EventType::parse("hookwise.delivery.dead").unwrap();
        let refused = h
            .services
            .update_event_type(&catalogue, &name, EventTypePatch::default())
            .await;
        assert!(
            matches!(&refused, Err(Error::Validation(v)) if v.code == "reserved_event_type"),
            "{refused:?}"
        );
    }
    let def = h
        .services
        .event_type_for(&tenant, &EventType::parse("hookwise.endpoint.disabled").unwrap())
        .await
        .unwrap();
    assert!(def.example.is_some());
    // Paged: the page after `hookwise.endpoint.disabled` starts after it.
    let after = EventType::parse("hookwise.endpoint.disabled").unwrap();
    let (page, _) = h
        .services
        .list_event_types(&Catalogue::Deployment, Some(&after), 2)
        .await
        .unwrap();
    let names: Vec<&str> = page.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["hookwise.endpoint.recovered", "hookwise.ping"]);
}

#[tokio::test]
async fn given_a_clients_idempotency_key_under_hookwise_then_it_is_refused_so_it_cannot_hide_an_operational_event() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let refused = h
        .services
        .ingest(
            &tenant,
            event("invoice.paid"),
            Some("hookwise.delivery.dead:dlv_1:0".into()),
        )
        .await;
    assert!(
        matches!(&refused, Err(Error::Validation(v)) if v.code == "invalid_idempotency_key"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn given_a_dead_letter_whose_telling_fails_then_the_owner_is_emailed_anyway_and_the_batch_comes_back_to_tell_it()
{
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::new(|url, _| match url.contains("down") {
        true => status_outcome(503),
        false => status_outcome(200),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    subscribe(&h, &tenant, new_sub("https://down.example.com/", &["*"], vec![])).await;
    subscribe(&h, &tenant, new_sub(OPS, &["hookwise.delivery.dead"], vec![1])).await;
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let task = h.queue.take_visible().remove(0);
    h.services.deliver(&task).await.unwrap();
    let dead = h.queue.take_dead();
    assert_eq!(dead.len(), 1);

    // The telling's enqueue fails: the owner's email goes all the same, and the batch fails.
    h.queue.failing_enqueues.store(1, Ordering::SeqCst);
    assert!(
        h.services.handle_dead_letters(&dead).await.is_err(),
        "the batch must come back"
    );
    assert_eq!(h.mailer.sent.lock().unwrap().len(), 1, "the owner's email, not held up");
    // Back again: told now, and no second email.
    h.services.handle_dead_letters(&dead).await.unwrap();
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    assert_eq!(told(&h, OPS, "hookwise.delivery.dead").len(), 1);
    assert_eq!(h.mailer.sent.lock().unwrap().len(), 1);
}

/// A dead-letter batch that comes back (its telling failed) puts the attempts the queue gave up
/// on back on their schedule once, not once per receive: two copies of one attempt would be
/// two workers POSTing it.
#[tokio::test]
async fn given_a_dead_letter_batch_that_comes_back_then_an_attempt_the_queue_gave_up_on_is_queued_once() {
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::new(|url, _| match url.contains("down") {
        true => status_outcome(503),
        false => status_outcome(200),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let down = subscribe(&h, &tenant, new_sub("https://down.example.com/", &["*"], vec![])).await;
    subscribe(
        &h,
        &tenant,
        new_sub("https://up.example.com/", &["invoice.*"], vec![60]),
    )
    .await;
    subscribe(&h, &tenant, new_sub(OPS, &["hookwise.delivery.dead"], vec![1])).await;
    let ingested = h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let to_down = |t: &DeliveryTask| {
        ingested
            .deliveries
            .iter()
            .any(|d| d.id == t.delivery_id && d.subscription_id == down.id)
    };
    let (down, up): (Vec<_>, Vec<_>) = h.queue.take_visible().into_iter().partition(to_down);
    h.services.deliver(&down[0]).await.unwrap();
    // The dead one, and the up endpoint's first attempt as if the queue had given up on it.
    let mut batch = h.queue.take_dead();
    batch.push(up[0].clone());

    // Its telling's write fails twice: the batch comes back twice, then is handled.
    h.store.failing_event_writes.store(2, Ordering::SeqCst);
    let mut receives = 0;
    while h.services.handle_dead_letters(&batch).await.is_err() {
        receives += 1;
        assert!(receives < 5, "the batch keeps failing");
    }
    let queued = h
        .queue
        .messages()
        .into_iter()
        .filter(|(t, _)| t.delivery_id == up[0].delivery_id)
        .count();
    assert_eq!(queued, 1, "the given-up attempt queued once, not once per receive");
}

#[tokio::test]
async fn given_an_auto_disabling_whose_telling_fails_then_its_email_is_sent_all_the_same() {
    use std::sync::atomic::Ordering;
    let h = Harness::new(ScriptedSender::new(|url, _| match url.contains("down") {
        true => status_outcome(500),
        false => status_outcome(200),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let down = NewSubscription {
        auto_disable_after_hours: Some(Some(1)),
        ..new_sub("https://down.example.com/", &["*"], vec![])
    };
    subscribe(&h, &tenant, down).await;
    subscribe(&h, &tenant, new_sub(OPS, &["hookwise.endpoint.disabled"], vec![1])).await;
    h.clock.advance(Duration::minutes(61));
    h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    let task = h.queue.take_visible().remove(0);
    h.queue.failing_enqueues.store(1, Ordering::SeqCst);
    let _ = h.services.deliver(&task).await;
    let emails = h.mailer.sent.lock().unwrap();
    assert!(
        emails.iter().any(|m| m.subject.contains("disabled")),
        "the disabling's email does not wait for its telling: {:?}",
        emails.iter().map(|m| &m.subject).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn given_a_breaker_turned_off_while_open_then_its_closing_is_told() {
    let h = Harness::new(ScriptedSender::new(|url, _| match url.contains("down") {
        true => status_outcome(503),
        false => status_outcome(200),
    }));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let down = NewSubscription {
        circuit_breaker: Some(CircuitBreaker::default()),
        ..new_sub("https://down.example.com/", &["*"], vec![600])
    };
    let down = subscribe(&h, &tenant, down).await;
    subscribe(&h, &tenant, new_sub(OPS, &["hookwise.endpoint.*"], vec![1])).await;
    for _ in 0..6 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    h.run_for(Duration::seconds(20), Duration::seconds(1)).await;
    assert_eq!(told(&h, OPS, "hookwise.endpoint.breaker_opened").len(), 1);
    assert!(told(&h, OPS, "hookwise.endpoint.breaker_closed").is_empty());

    let off = hookwise_core::services::SubscriptionPatch {
        circuit_breaker: Some(CircuitBreaker::off()),
        ..Default::default()
    };
    // Events that come while it is open are held.
    for _ in 0..3 {
        h.services.ingest(&tenant, event("invoice.paid"), None).await.unwrap();
    }
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    let held = h.services.subscription_overview(&tenant, &down.id).await.unwrap().held;
    assert!(held > 0, "the breaker holds what came while it was open");
    h.services.update_subscription(&tenant, &down.id, off).await.unwrap();
    h.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    let closed = told(&h, OPS, "hookwise.endpoint.breaker_closed");
    assert_eq!(closed.len(), 1, "{:?}", received(&h, OPS));
    assert_matches_its_schema(&closed[0]);
}
