//! The event-type catalogue through the API: the operator defines the deployment's types, a
//! tenant its own (which win for its events), a portal reads them and defines none, and an
//! event that does not match its type's schema is 422 with where and why.

mod support;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::Router;
use hookwise_core::services::{Config, Services};
use hookwise_core::testing::memory::{Harness, ScriptedSender};
use hookwise_http::{router, ApiState};
use rand::SeedableRng;
use serde_json::{json, Value};

struct App {
    router: Router,
    _harness: Harness,
    operator: String,
    a: String,
    a_id: String,
    b: String,
}

async fn app() -> App {
    let harness = Harness::new(ScriptedSender::always(200));
    let services = Services::new(
        harness.services.ports().clone(),
        Config::default(),
        rand::rngs::StdRng::seed_from_u64(1),
    );
    let (_, operator) = services.create_operator_key().await.unwrap();
    let (a_tenant, a) = harness.tenant("a@example.com").await;
    let (_, b) = harness.tenant("b@example.com").await;
    App {
        router: router(ApiState::new(Arc::new(services))),
        _harness: harness,
        operator,
        a,
        a_id: a_tenant.id.to_string(),
        b,
    }
}

impl App {
    async fn call(
        &self,
        method: &str,
        uri: &str,
        key: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        support::call(&self.router, method, uri, key, headers, body).await
    }
}

fn code(body: &Value) -> &str {
    body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error: {body}"))
}

#[tokio::test]
async fn given_the_operators_and_a_tenants_types_then_each_tenant_sees_its_own_over_the_deployments() {
    let app = app().await;
    let paid = json!({
        "name": "invoice.paid", "description": "Paid in full.",
        "schema": {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer", "minimum": 1}}},
        "example": {"amount": 4200}
    });
    // The operator, naming no tenant, defines the deployment's.
    let (status, made) = app
        .call("POST", "/v1/event-types", &app.operator, &[], Some(paid.clone()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(
        (made["scope"].clone(), made["validate"].clone()),
        (json!("deployment"), json!(true))
    );
    let (status, again) = app
        .call("POST", "/v1/event-types", &app.operator, &[], Some(paid))
        .await;
    assert_eq!((status, code(&again)), (StatusCode::CONFLICT, "conflict"));

    // Both tenants meet it; an event that does not match is 422 with where and which keyword.
    for key in [&app.a, &app.b] {
        let (status, r) = app
            .call(
                "POST",
                "/v1/events",
                key,
                &[],
                Some(json!({"type": "invoice.paid", "payload": {"amount": 0}})),
            )
            .await;
        assert_eq!(
            (status, code(&r)),
            (StatusCode::UNPROCESSABLE_ENTITY, "payload_invalid")
        );
        let message = r["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("`/amount`") && message.contains("`minimum`"),
            "{message}"
        );
    }
    // Tenant a defines its own, looser: it wins for a's events only.
    let (status, own) = app
        .call(
            "POST",
            "/v1/event-types",
            &app.a,
            &[],
            Some(json!({"name": "invoice.paid", "description": "ours"})),
        )
        .await;
    assert_eq!((status, own["scope"].clone()), (StatusCode::CREATED, json!("tenant")));
    let loose = json!({"type": "invoice.paid", "payload": {"amount": 0}});
    assert_eq!(
        app.call("POST", "/v1/events", &app.a, &[], Some(loose.clone())).await.0,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        app.call("POST", "/v1/events", &app.b, &[], Some(loose)).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    let (_, read) = app.call("GET", "/v1/event-types/invoice.paid", &app.a, &[], None).await;
    assert_eq!(read["description"], "ours");
    let (_, read) = app.call("GET", "/v1/event-types/invoice.paid", &app.b, &[], None).await;
    assert_eq!(read["description"], "Paid in full.");
    // The operator acting for a (the header) sees a's; without it, the deployment's.
    let (_, read) = app
        .call(
            "GET",
            "/v1/event-types/invoice.paid",
            &app.operator,
            &[("Hookwise-Tenant", &app.a_id)],
            None,
        )
        .await;
    assert_eq!(read["scope"], "tenant");
    let (status, missing) = app
        .call("GET", "/v1/event-types/order.created", &app.b, &[], None)
        .await;
    assert_eq!((status, code(&missing)), (StatusCode::NOT_FOUND, "not_found"));

    // A listing, paged.
    for name in ["a.one", "b.two", "c.three"] {
        app.call(
            "POST",
            "/v1/event-types",
            &app.operator,
            &[],
            Some(json!({"name": name})),
        )
        .await;
    }
    let (_, page) = app.call("GET", "/v1/event-types?limit=2", &app.b, &[], None).await;
    let names: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a.one", "b.two"]);
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, rest) = app
        .call(
            "GET",
            &format!("/v1/event-types?limit=100&cursor={cursor}"),
            &app.b,
            &[],
            None,
        )
        .await;
    let names: Vec<&str> = rest["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    // Hookwise's own types are in every catalogue, in name order.
    assert_eq!(
        names,
        [
            "c.three",
            "hookwise.delivery.dead",
            "hookwise.endpoint.breaker_closed",
            "hookwise.endpoint.breaker_opened",
            "hookwise.endpoint.disabled",
            "hookwise.endpoint.recovered",
            "hookwise.ping",
            "invoice.paid"
        ]
    );
    assert!(rest["data"][1]["schema"].is_object());
    assert_eq!(rest["data"][1]["scope"], "hookwise");
    let (status, refused) = app
        .call(
            "PATCH",
            "/v1/event-types/hookwise.ping",
            &app.operator,
            &[],
            Some(json!({"description": "mine"})),
        )
        .await;
    assert_eq!(
        (status, code(&refused)),
        (StatusCode::UNPROCESSABLE_ENTITY, "reserved_event_type")
    );
}

#[tokio::test]
async fn given_a_portal_then_it_reads_the_catalogue_and_defines_nothing() {
    let app = app().await;
    app.call(
        "POST",
        "/v1/event-types",
        &app.operator,
        &[],
        Some(json!({"name": "invoice.paid", "example": {"amount": 1}})),
    )
    .await;
    let (status, session) = app
        .call("POST", "/v1/portal-sessions", &app.a, &[], Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let url = session["url"].as_str().unwrap();
    let token = url
        .split_once("#token=")
        .unwrap()
        .1
        .split('&')
        .next()
        .unwrap()
        .to_owned();
    let (status, listed) = app.call("GET", "/v1/event-types", &token, &[], None).await;
    assert_eq!(status, StatusCode::OK);
    let paid = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "invoice.paid")
        .unwrap();
    assert_eq!(paid["example"], json!({"amount": 1}));
    let (status, refused) = app
        .call("POST", "/v1/event-types", &token, &[], Some(json!({"name": "x.y"})))
        .await;
    assert_eq!(
        (status, code(&refused)),
        (StatusCode::FORBIDDEN, "portal_cannot_define")
    );
    let (status, refused) = app
        .call(
            "PATCH",
            "/v1/event-types/invoice.paid",
            &token,
            &[],
            Some(json!({"deprecated": true})),
        )
        .await;
    assert_eq!(
        (status, code(&refused)),
        (StatusCode::FORBIDDEN, "portal_cannot_define")
    );

    // A test send: the type's example, yes; a payload of the portal's own, no.
    let (_, sub) = app
        .call(
            "POST",
            "/v1/subscriptions",
            &app.a,
            &[],
            Some(json!({"url": "https://example.com/h"})),
        )
        .await;
    let test = format!("/v1/subscriptions/{}/test", sub["id"].as_str().unwrap());
    let (status, sent) = app
        .call("POST", &test, &token, &[], Some(json!({"type": "invoice.paid"})))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{sent}");
    let (status, refused) = app
        .call(
            "POST",
            &test,
            &token,
            &[],
            Some(json!({"type": "invoice.paid", "payload": {"amount": 9}})),
        )
        .await;
    assert_eq!((status, code(&refused)), (StatusCode::FORBIDDEN, "portal_cannot_send"));
}

#[tokio::test]
async fn given_bad_definitions_then_422_names_the_problem() {
    let app = app().await;
    for (body, expected) in [
        (json!({"name": "a.b", "schema": {"type": "nope"}}), "invalid_schema"),
        (
            json!({"name": "a.b", "schema": {"required": ["id"]}, "example": {}}),
            "invalid_example",
        ),
        (json!({"name": "hookwise.ping"}), "reserved_event_type"),
        (json!({"name": "not a type"}), "invalid_name"),
    ] {
        let (status, r) = app
            .call("POST", "/v1/event-types", &app.a, &[], Some(body.clone()))
            .await;
        assert_eq!(
            (status, code(&r)),
            (StatusCode::UNPROCESSABLE_ENTITY, expected),
            "{body}"
        );
    }
}

#[tokio::test]
async fn given_the_operator_makes_the_catalogue_strict_then_a_subscription_to_an_unknown_type_is_422() {
    let app = app().await;
    let op = app.operator.as_str();
    let (status, body) = app.call("GET", "/v1/catalogue", op, &[], None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"strict": false})));
    let (status, body) = app
        .call("PUT", "/v1/catalogue", &app.a, &[], Some(json!({"strict": true})))
        .await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "operator_only"));
    let (status, body) = app.call("PUT", "/v1/catalogue", op, &[], Some(json!({}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, body) = app
        .call("PUT", "/v1/catalogue", op, &[], Some(json!({"strict": true})))
        .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"strict": true})));

    let (status, _) = app
        .call(
            "POST",
            "/v1/event-types",
            op,
            &[],
            Some(json!({"name": "invoice.paid"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let sub = |types: Value| json!({"url": "https://a.example.com/", "event_types": types});
    let (status, body) = app
        .call(
            "POST",
            "/v1/subscriptions",
            &app.a,
            &[],
            Some(sub(json!(["invoice.paid", "invoice.voided"]))),
        )
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "unknown_event_type")
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("`invoice.voided`"), "{message}");
    let (status, body) = app
        .call(
            "POST",
            "/v1/subscriptions",
            &app.a,
            &[],
            Some(sub(json!(["invoice.paid", "order.*"]))),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}
