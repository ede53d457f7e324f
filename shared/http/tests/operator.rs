//! Many customer accounts behind one service, through the API: an operator key creates and
//! manages tenants, acts for any of them with `Hookwise-Tenant`, sends one batch for several,
//! and moves the retries rollout; a tenant's key can do none of that.

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
    operator: String,
}

async fn app() -> App {
    let harness = Harness::new(ScriptedSender::always(200));
    let services = Services::new(
        harness.services.ports().clone(),
        Config::default(),
        rand::rngs::StdRng::seed_from_u64(1),
    );
    let (_, operator) = services.create_operator_key().await.unwrap();
    App {
        router: router(ApiState::new(Arc::new(services))),
        operator,
    }
}

impl App {
    /// `(status, body)` of a request with `key` and, if given, `Hookwise-Tenant: tenant`.
    async fn call(
        &self,
        method: &str,
        uri: &str,
        key: &str,
        tenant: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let headers: Vec<(&str, &str)> = tenant.map(|t| ("Hookwise-Tenant", t)).into_iter().collect();
        support::call(&self.router, method, uri, key, &headers, body).await
    }

    /// A tenant of the operator's making, with the id given: its API key.
    async fn account(&self, id: &str) -> String {
        let body = json!({"id": id, "name": format!("Account {id}"), "owner_email": "owner@example.com"});
        let (status, tenant) = self.call("POST", "/v1/tenants", &self.operator, None, Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{tenant}");
        assert_eq!(tenant["id"], id);
        tenant["api_key"].as_str().unwrap().to_owned()
    }
}

fn code(body: &Value) -> &str {
    body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error: {body}"))
}

#[tokio::test]
async fn given_an_operator_key_then_tenants_are_created_listed_read_changed_and_disabled() {
    let app = app().await;
    let op = app.operator.as_str();
    let key = app.account("acct_1").await;
    app.account("acct_2").await;

    let (status, again) = app
        .call(
            "POST",
            "/v1/tenants",
            op,
            None,
            Some(json!({"id": "acct_1", "name": "Again", "owner_email": "a@example.com"})),
        )
        .await;
    assert_eq!((status, code(&again)), (StatusCode::CONFLICT, "conflict"));
    let (status, bad) = app
        .call(
            "POST",
            "/v1/tenants",
            op,
            None,
            Some(json!({"id": "acct#1", "name": "Bad", "owner_email": "a@example.com"})),
        )
        .await;
    assert_eq!((status, code(&bad)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_id"));

    let (status, page) = app.call("GET", "/v1/tenants?limit=1", op, None, None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["data"][0]["id"], "acct_1");
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, next) = app
        .call("GET", &format!("/v1/tenants?limit=1&cursor={cursor}"), op, None, None)
        .await;
    assert_eq!(next["data"][0]["id"], "acct_2");

    let (status, read) = app.call("GET", "/v1/tenants/acct_1", op, None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["retries"]["setting"], "rollout");
    assert_eq!(read["retries"]["enabled"], true);
    assert_eq!(read["api_keys"].as_array().unwrap().len(), 1);
    assert!(read.get("api_key").is_none(), "a key is shown once");

    let (status, changed) = app
        .call(
            "PATCH",
            "/v1/tenants/acct_1",
            op,
            None,
            Some(json!({"retries": "off", "status": "disabled"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(
        (changed["retries"]["enabled"].clone(), changed["status"].clone()),
        (json!(false), json!("disabled"))
    );
    // Disabled: its own key is refused, and the operator cannot act for it.
    let (status, refused) = app.call("GET", "/v1/subscriptions", &key, None, None).await;
    assert_eq!((status, code(&refused)), (StatusCode::FORBIDDEN, "tenant_disabled"));
    let (status, refused) = app.call("GET", "/v1/subscriptions", op, Some("acct_1"), None).await;
    assert_eq!((status, code(&refused)), (StatusCode::FORBIDDEN, "tenant_disabled"));
    let (status, _) = app.call("GET", "/v1/tenants/acct_none", op, None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn given_a_tenants_key_then_the_operator_routes_and_other_tenants_are_refused() {
    let app = app().await;
    let key = app.account("acct_1").await;
    app.account("acct_2").await;
    for (method, uri) in [
        ("GET", "/v1/tenants"),
        ("GET", "/v1/tenants/acct_1"),
        ("GET", "/v1/rollout"),
        ("GET", "/v1/operational-webhooks"),
    ] {
        let (status, body) = app.call(method, uri, &key, None, None).await;
        assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "operator_only"), "{uri}");
    }
    let (status, body) = app.call("GET", "/v1/subscriptions", &key, Some("acct_2"), None).await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "tenant_mismatch"));
    let (status, _) = app.call("GET", "/v1/subscriptions", &key, Some("acct_1"), None).await;
    assert_eq!(status, StatusCode::OK, "its own tenant, named");
    // The operator must name a tenant, a well-formed one that exists.
    let op = app.operator.as_str();
    let (status, body) = app.call("GET", "/v1/subscriptions", op, None, None).await;
    assert_eq!((status, code(&body)), (StatusCode::BAD_REQUEST, "tenant_required"));
    let (status, body) = app.call("GET", "/v1/subscriptions", op, Some("acct 2"), None).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_tenant_header")
    );
    let (status, _) = app.call("GET", "/v1/subscriptions", op, Some("acct_9"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A made-up operator key is no key at all.
    let (status, _) = app
        .call("GET", "/v1/tenants", &format!("hwo_{}", "x".repeat(32)), None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// One service posts every account's events with one key: a subscription made for a tenant
/// through the operator sees that tenant's events only, and a batch names each event's
/// tenant, each result saying which.
#[tokio::test]
async fn given_one_operator_key_then_it_acts_for_each_tenant_and_a_batch_names_each_events_tenant() {
    let app = app().await;
    let op = app.operator.as_str();
    let key_1 = app.account("acct_1").await;
    app.account("acct_2").await;
    let sub = json!({"url": "https://hooks.example.com/a", "event_types": ["order.*"]});
    for tenant in ["acct_1", "acct_2"] {
        let (status, body) = app
            .call("POST", "/v1/subscriptions", op, Some(tenant), Some(sub.clone()))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let batch = json!({"events": [
        {"type": "order.paid", "payload": {"n": 1}, "tenant": "acct_1"},
        {"type": "order.paid", "payload": {"n": 2}, "tenant": "acct_2"},
        {"type": "order.paid", "payload": {"n": 3}},
        {"type": "order.paid", "payload": {"n": 4}, "tenant": "acct_nobody"},
        {"type": "order.paid", "payload": {"n": 5}, "tenant": "acct_1"},
    ]});
    let (status, body) = app
        .call("POST", "/v1/events/batch", op, Some("acct_2"), Some(batch))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let results = body["results"].as_array().unwrap();
    let tenants: Vec<&str> = results.iter().map(|r| r["tenant"].as_str().unwrap_or("-")).collect();
    assert_eq!(tenants, ["acct_1", "acct_2", "acct_2", "acct_nobody", "acct_1"]);
    assert_eq!(results[3]["error"]["status"], 404);
    assert_eq!((body["accepted"].clone(), body["failed"].clone()), (json!(4), json!(1)));

    // Each event is its tenant's: acct_1's key finds its two and not acct_2's.
    let (status, _) = app
        .call(
            "GET",
            &format!("/v1/events/{}", results[0]["id"].as_str().unwrap()),
            &key_1,
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app
        .call(
            "GET",
            &format!("/v1/events/{}", results[1]["id"].as_str().unwrap()),
            &key_1,
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A tenant's key may name only itself in a batch: in the header, the whole batch is refused.
    let (status, body) = app
        .call(
            "POST",
            "/v1/events/batch",
            &key_1,
            Some("acct_2"),
            Some(json!({"events": [{"type": "a.b", "payload": {}}]})),
        )
        .await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "tenant_mismatch"));
    let batch = json!({"events": [
        {"type": "order.paid", "payload": {}, "tenant": "acct_2"},
        {"type": "order.paid", "payload": {}},
    ]});
    let (status, body) = app.call("POST", "/v1/events/batch", &key_1, None, Some(batch)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["results"][0]["error"]["code"], "tenant_mismatch");
    assert_eq!(body["results"][1]["tenant"], "acct_1");
}

#[tokio::test]
async fn given_an_operations_tenant_then_the_operator_chooses_reads_and_clears_it() {
    let app = app().await;
    let op = app.operator.as_str();
    app.account("acct_ops").await;
    let (status, body) = app.call("GET", "/v1/operational-webhooks", op, None, None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"tenant_id": null})));
    let chosen = json!({"tenant_id": "acct_ops"});
    let (status, body) = app
        .call("PUT", "/v1/operational-webhooks", op, None, Some(chosen.clone()))
        .await;
    assert_eq!((status, body), (StatusCode::OK, chosen.clone()));
    let (_, body) = app.call("GET", "/v1/operational-webhooks", op, None, None).await;
    assert_eq!(body, chosen);
    let (status, body) = app
        .call(
            "PUT",
            "/v1/operational-webhooks",
            op,
            None,
            Some(json!({"tenant_id": "acct_none"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = app
        .call(
            "PUT",
            "/v1/operational-webhooks",
            op,
            None,
            Some(json!({"tenant_id": "not an id"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, body) = app
        .call(
            "PUT",
            "/v1/operational-webhooks",
            op,
            None,
            Some(json!({"tenant_id": null})),
        )
        .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"tenant_id": null})));
    let (status, body) = app
        .call("PUT", "/v1/operational-webhooks", op, None, Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "`{{}}` is a mistake: {body}");
}

#[tokio::test]
async fn given_the_rollout_and_a_tenants_keys_then_the_operator_moves_and_rotates_them() {
    let app = app().await;
    let op = app.operator.as_str();
    let old = app.account("acct_1").await;
    let (status, body) = app
        .call("PUT", "/v1/rollout", op, None, Some(json!({"retries_percent": 10})))
        .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"retries_percent": 10})));
    let (status, body) = app
        .call("PUT", "/v1/rollout", op, None, Some(json!({"retries_percent": 101})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (_, read) = app.call("GET", "/v1/tenants/acct_1", op, None, None).await;
    assert!(read["retries"]["why"].as_str().unwrap().contains("10 %"), "{read}");

    let (status, rotated) = app.call("POST", "/v1/tenants/acct_1/api-keys", op, None, None).await;
    assert_eq!(status, StatusCode::CREATED, "{rotated}");
    let new = rotated["api_key"].as_str().unwrap();
    let old_id = rotated["api_keys"][0]["id"].as_str().unwrap();
    for key in [old.as_str(), new] {
        let (status, _) = app.call("GET", "/v1/subscriptions", key, None, None).await;
        assert_eq!(status, StatusCode::OK, "both keys work during a rotation");
    }
    let (status, _) = app
        .call(
            "DELETE",
            &format!("/v1/tenants/acct_1/api-keys/{old_id}"),
            op,
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.call("GET", "/v1/subscriptions", &old, None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "revoked");
    let (status, _) = app.call("GET", "/v1/subscriptions", new, None, None).await;
    assert_eq!(status, StatusCode::OK);
}
