//! The event-type catalogue: definitions in the deployment's and a tenant's catalogue, a
//! payload refused where its type's schema says so (nothing stored), the example a test send
//! sends, and a definition's change seen at once by this process.

use hookwise_core::model::*;
use hookwise_core::services::{Catalogue, EventTypePatch, NewEvent, NewEventType, NewSubscription, SubscriptionPatch};
use hookwise_core::testing::memory::{Harness, ScriptedSender};
use hookwise_core::Error;
use serde_json::json;

fn invoice_paid() -> NewEventType {
    serde_json::from_value(json!({
        "name": "invoice.paid",
        "description": "An invoice was paid in full.",
        "schema": {
            "type": "object",
            "required": ["invoice", "amount"],
            "properties": {"invoice": {"type": "string"}, "amount": {"type": "integer", "minimum": 1}}
        },
        "example": {"invoice": "in_1", "amount": 4200}
    }))
    .unwrap()
}

fn event(t: &str, payload: serde_json::Value) -> NewEvent {
    NewEvent {
        event_type: EventType::parse(t).unwrap(),
        payload,
    }
}

fn refusal(err: Error) -> (String, String) {
    match err {
        Error::Validation(v) => (v.code.to_owned(), v.message),
        other => panic!("not a validation error: {other:?}"),
    }
}

#[tokio::test]
async fn given_a_deployment_type_with_a_schema_then_a_payload_that_does_not_match_is_refused_and_nothing_stored() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub: NewSubscription = serde_json::from_value(json!({"url": "https://a.example.com/"})).unwrap();
    h.services.create_subscription(&tenant, sub).await.unwrap();
    h.services
        .create_event_type(&Catalogue::Deployment, invoice_paid())
        .await
        .unwrap();

    let bad = h
        .services
        .ingest(
            &tenant,
            event("invoice.paid", json!({"invoice": "in_2", "amount": 0})),
            None,
        )
        .await
        .unwrap_err();
    let (code, message) = refusal(bad);
    assert_eq!(code, "payload_invalid");
    assert!(
        message.contains("`/amount`") && message.contains("`minimum`"),
        "{message}"
    );
    let missing = h
        .services
        .ingest(&tenant, event("invoice.paid", json!({"amount": 5})), None)
        .await
        .unwrap_err();
    assert!(refusal(missing).1.contains("`required`"));
    h.drain_now().await;
    assert!(
        h.sender.requests.lock().unwrap().is_empty(),
        "nothing stored, nothing sent"
    );

    // A matching one goes; a type the catalogue does not define is taken as it comes.
    h.services
        .ingest(
            &tenant,
            event("invoice.paid", json!({"invoice": "in_3", "amount": 5})),
            None,
        )
        .await
        .unwrap();
    h.services
        .ingest(&tenant, event("order.created", json!({"anything": true})), None)
        .await
        .unwrap();
    // In a batch, the one that does not match fails alone.
    let mut results = h
        .services
        .ingest_batch(
            &tenant,
            vec![
                (event("invoice.paid", json!({"invoice": "in_4", "amount": 1})), None),
                (event("invoice.paid", json!({"invoice": 4})), None),
            ],
        )
        .await
        .unwrap();
    assert!(results[0].is_ok());
    assert_eq!(refusal(results.remove(1).unwrap_err()).0, "payload_invalid");
    h.drain_now().await;
    assert_eq!(h.sender.requests.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn given_a_tenants_own_definition_or_validation_off_then_it_is_the_one_its_events_meet() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let (other, _) = h.tenant("other@example.com").await;
    h.services
        .create_event_type(&Catalogue::Deployment, invoice_paid())
        .await
        .unwrap();
    let loose = event("invoice.paid", json!({"paid": true}));
    assert!(h.services.ingest(&tenant, loose.clone(), None).await.is_err());

    // The tenant's own definition, without a schema, is the one its events meet; the other
    // tenant still meets the deployment's. Seen at once: this process forgot what it kept.
    let own: NewEventType = serde_json::from_value(json!({"name": "invoice.paid", "description": "ours"})).unwrap();
    h.services
        .create_event_type(&Catalogue::Tenant(tenant.id.clone()), own)
        .await
        .unwrap();
    h.services.ingest(&tenant, loose.clone(), None).await.unwrap();
    assert!(h.services.ingest(&other, loose.clone(), None).await.is_err());

    // Validation turned off on the deployment's: the other tenant's goes too.
    let off = EventTypePatch {
        validate: Some(false),
        ..Default::default()
    };
    let changed = h
        .services
        .update_event_type(&Catalogue::Deployment, &EventType::parse("invoice.paid").unwrap(), off)
        .await
        .unwrap();
    assert!(!changed.validate);
    h.services.ingest(&other, loose, None).await.unwrap();

    // The tenant's listing: its own and the deployment's, one of each name, its own winning.
    let (listed, next) = h
        .services
        .list_event_types(&Catalogue::Tenant(tenant.id.clone()), None, 0)
        .await
        .unwrap();
    assert_eq!(next, None);
    let defined: Vec<_> = listed.iter().filter(|d| !d.name.is_hookwise()).collect();
    assert_eq!(defined.len(), 1);
    assert_eq!(defined[0].tenant_id.as_ref(), Some(&tenant.id));
}

#[tokio::test]
async fn given_a_keyed_event_stored_before_its_type_got_a_schema_then_its_retry_is_answered_from_the_store() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let loose = event("invoice.paid", json!({"paid": true}));
    let first = h
        .services
        .ingest(&tenant, loose.clone(), Some("k-1".into()))
        .await
        .unwrap();
    // The schema arrives between the event and the client's retry (whose answer was lost).
    h.services
        .create_event_type(&Catalogue::Deployment, invoice_paid())
        .await
        .unwrap();
    let retry = h
        .services
        .ingest(&tenant, loose.clone(), Some("k-1".into()))
        .await
        .unwrap();
    assert_eq!((retry.event.id, retry.created), (first.event.id, false));
    // A new event of that payload is held to the schema.
    let err = h.services.ingest(&tenant, loose, Some("k-2".into())).await.unwrap_err();
    assert_eq!(refusal(err).0, "payload_invalid");
    // Hookwise's own types are not a tenant's to send.
    let err = h
        .services
        .ingest(&tenant, event("hookwise.ping", json!({})), None)
        .await
        .unwrap_err();
    assert_eq!(refusal(err).0, "reserved_event_type");
}

#[tokio::test]
async fn given_bad_definitions_then_each_is_refused_naming_why() {
    let h = Harness::new(ScriptedSender::always(200));
    let deployment = Catalogue::Deployment;
    for (body, code) in [
        (
            json!({"name": "a.b", "schema": {"type": "no-such-type"}}),
            "invalid_schema",
        ),
        (json!({"name": "a.b", "schema": 42}), "invalid_schema"),
        (
            json!({"name": "a.b", "schema": {"type": "object", "required": ["id"]}, "example": {"other": 1}}),
            "invalid_example",
        ),
        (json!({"name": "a.b", "example": [1, 2]}), "invalid_example"),
        (json!({"name": "hookwise.ping"}), "reserved_event_type"),
        // A backreference needs backtracking: the linear-time engine refuses it.
        (
            json!({"name": "a.b", "schema": {"type": "string", "pattern": "^(a+)\\1$"}}),
            "invalid_schema",
        ),
        (
            json!({"name": "a.b", "example": {"big": "x".repeat(17 * 1024)}}),
            "invalid_example",
        ),
    ] {
        let new: NewEventType = serde_json::from_value(body.clone()).unwrap();
        let err = h.services.create_event_type(&deployment, new).await.unwrap_err();
        assert_eq!(refusal(err).0, code, "{body}");
    }
    h.services.create_event_type(&deployment, invoice_paid()).await.unwrap();
    assert!(matches!(
        h.services.create_event_type(&deployment, invoice_paid()).await,
        Err(Error::Conflict(_))
    ));
    // A change must leave the example valid against the schema.
    let stricter = EventTypePatch {
        schema: Some(Some(json!({"type": "object", "required": ["currency"]}))),
        ..Default::default()
    };
    let err = h
        .services
        .update_event_type(&deployment, &EventType::parse("invoice.paid").unwrap(), stricter)
        .await
        .unwrap_err();
    assert_eq!(refusal(err).0, "invalid_example");
}

#[tokio::test]
async fn given_a_type_with_an_example_then_a_test_send_of_that_type_sends_the_example() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    let sub = h
        .services
        .create_subscription(
            &tenant,
            serde_json::from_value(json!({"url": "https://a.example.com/"})).unwrap(),
        )
        .await
        .unwrap()
        .subscription;
    h.services
        .create_event_type(&Catalogue::Deployment, invoice_paid())
        .await
        .unwrap();
    let paid = EventType::parse("invoice.paid").unwrap();
    let sent = h.services.send_test(&tenant, &sub.id, Some(paid), None).await.unwrap();
    assert_eq!(sent.event.payload, json!({"invoice": "in_1", "amount": 4200}));
    let unknown = EventType::parse("order.created").unwrap();
    let err = h
        .services
        .send_test(&tenant, &sub.id, Some(unknown), None)
        .await
        .unwrap_err();
    assert_eq!(refusal(err).0, "no_example");
    // A payload given for a type with a schema is held to it, as any event's.
    let paid = EventType::parse("invoice.paid").unwrap();
    let err = h
        .services
        .send_test(&tenant, &sub.id, Some(paid), Some(json!({"amount": -1})))
        .await
        .unwrap_err();
    assert_eq!(refusal(err).0, "payload_invalid");
}

#[tokio::test]
async fn given_a_strict_catalogue_then_a_subscription_may_name_only_defined_types_and_patterns() {
    let h = Harness::new(ScriptedSender::always(200));
    let (tenant, _) = h.tenant("owner@example.com").await;
    h.services
        .create_event_type(&Catalogue::Deployment, invoice_paid())
        .await
        .unwrap();
    let own: NewEventType = serde_json::from_value(json!({"name": "order.created"})).unwrap();
    h.services
        .create_event_type(&Catalogue::Tenant(tenant.id.clone()), own)
        .await
        .unwrap();
    let new = |types: serde_json::Value| -> NewSubscription {
        serde_json::from_value(json!({"url": "https://a.example.com/", "event_types": types})).unwrap()
    };
    // Not strict (the default): any name goes, but under `hookwise.` only Hookwise's own.
    let err = h
        .services
        .create_subscription(&tenant, new(json!(["hookwise.delivery.deadd"])))
        .await
        .unwrap_err();
    assert_eq!(refusal(err).0, "unknown_event_type");
    let loose = h
        .services
        .create_subscription(&tenant, new(json!(["invoice.voided"])))
        .await
        .unwrap()
        .subscription;

    h.services.set_strict_catalogue(true).await.unwrap();
    let err = h
        .services
        .create_subscription(&tenant, new(json!(["invoice.paid", "invoice.voided", "refund.made"])))
        .await
        .unwrap_err();
    let (code, message) = refusal(err);
    assert_eq!(code, "unknown_event_type");
    assert!(message.contains("`invoice.voided`, `refund.made`"), "{message}");
    assert!(!message.contains("invoice.paid"), "{message}");
    // The deployment's, the tenant's own, Hookwise's own, and patterns are all accepted.
    let types = json!([
        "invoice.paid",
        "order.created",
        "hookwise.delivery.dead",
        "refund.*",
        "*"
    ]);
    h.services.create_subscription(&tenant, new(types)).await.unwrap();
    // Another tenant does not meet this tenant's own types.
    let (other, _) = h.tenant("other@example.com").await;
    let err = h
        .services
        .create_subscription(&other, new(json!(["order.created"])))
        .await
        .unwrap_err();
    assert_eq!(refusal(err).0, "unknown_event_type");
    // A type a change adds is held to it; a change of anything else is not.
    let patch: SubscriptionPatch =
        serde_json::from_value(json!({"event_types": ["invoice.voided", "refund.made"]})).unwrap();
    let err = h
        .services
        .update_subscription(&tenant, &loose.id, patch)
        .await
        .unwrap_err();
    assert_eq!(refusal(err).0, "unknown_event_type");
    let patch: SubscriptionPatch = serde_json::from_value(json!({"description": "kept as it was"})).unwrap();
    h.services.update_subscription(&tenant, &loose.id, patch).await.unwrap();
    // What it named before strictness stays, sent again beside a new, defined one (as the
    // dashboard sends every field of an edit).
    let patch: SubscriptionPatch =
        serde_json::from_value(json!({"event_types": ["invoice.voided", "invoice.paid"]})).unwrap();
    h.services.update_subscription(&tenant, &loose.id, patch).await.unwrap();

    h.services.set_strict_catalogue(false).await.unwrap();
    let patch: SubscriptionPatch = serde_json::from_value(json!({"event_types": ["refund.made"]})).unwrap();
    h.services.update_subscription(&tenant, &loose.id, patch).await.unwrap();
}
