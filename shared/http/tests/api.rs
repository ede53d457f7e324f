//! The API Router driven in process (tower's `oneshot`) over the in-memory ports.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use chrono::Duration;
use hookwise_core::services::{Config, Services};
use hookwise_core::testing::memory::{status_outcome, Harness, ScriptedSender};
use hookwise_http::api::{MAX_BATCH_BODY_BYTES, MAX_BODY_BYTES};
use hookwise_http::{router, ApiState};
use rand::SeedableRng;
use serde_json::{json, Value};
use tower::ServiceExt;

struct App {
    router: Router,
    harness: Harness,
    /// Tenant A's and tenant B's API keys.
    a: String,
    b: String,
}

/// Endpoints whose URL contains `fail` answer 500; the rest 200.
async fn app() -> App {
    let harness = Harness::new(ScriptedSender::new(|url, _| {
        status_outcome(if url.contains("fail") { 500 } else { 200 })
    }));
    let services = Services::new(
        harness.services.ports().clone(),
        Config::default(),
        rand::rngs::StdRng::seed_from_u64(1),
    );
    let router = router(ApiState::new(Arc::new(services)));
    let (_, a) = harness.tenant("a@example.com").await;
    let (_, b) = harness.tenant("b@example.com").await;
    App { router, harness, a, b }
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
}

impl Reply {
    fn code(&self) -> &str {
        self.body["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("not an error: {}", self.body))
    }
    fn message(&self) -> &str {
        self.body["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("not an error: {}", self.body))
    }
}

impl App {
    async fn send(&self, req: Request<Body>) -> Reply {
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON body")
        };
        Reply { status, headers, body }
    }

    fn request(method: &str, uri: &str, key: Option<&str>) -> axum::http::request::Builder {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(key) = key {
            b = b.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        b
    }

    async fn call(&self, method: &str, uri: &str, key: &str, body: Option<Value>) -> Reply {
        let b = Self::request(method, uri, Some(key));
        let req = match body {
            Some(v) => b
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(v.to_string())),
            None => b.body(Body::empty()),
        };
        self.send(req.unwrap()).await
    }

    async fn raw(&self, method: &str, uri: &str, key: &str, body: &str) -> Reply {
        let req = Self::request(method, uri, Some(key))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap();
        self.send(req).await
    }

    async fn subscribe(&self, key: &str, body: Value) -> Value {
        let r = self.call("POST", "/v1/subscriptions", key, Some(body)).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        r.body
    }

    async fn ingest(&self, key: &str, event_type: &str) -> Value {
        let r = self
            .call(
                "POST",
                "/v1/events",
                key,
                Some(json!({"type": event_type, "payload": {"n": 1}})),
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
        r.body
    }
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("an id").to_owned()
}

// Health and auth

#[tokio::test]
async fn given_no_key_then_healthz_answers_ok() {
    let app = app().await;
    let r = app.send(Request::get("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["status"], "ok");
}

#[tokio::test]
async fn given_no_or_a_wrong_or_a_non_bearer_key_then_the_api_answers_401() {
    let app = app().await;
    let none = app
        .send(Request::get("/v1/subscriptions").body(Body::empty()).unwrap())
        .await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.code(), "unauthorized");
    assert!(none.message().contains("Authorization: Bearer"), "{}", none.message());
    assert_eq!(none.headers[header::WWW_AUTHENTICATE], "Bearer");

    let wrong = app
        .call("GET", "/v1/subscriptions", "hwk_not-a-real-key-at-all", None)
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.message(), "unknown API key");

    let basic = app
        .send(
            Request::get("/v1/events/evt_x")
                .header(header::AUTHORIZATION, format!("Basic {}", app.a))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(basic.status, StatusCode::UNAUTHORIZED);

    let lower = app
        .send(
            Request::get("/v1/subscriptions")
                .header(header::AUTHORIZATION, format!("bearer {}", app.a))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(lower.status, StatusCode::OK, "the scheme is case-insensitive");
}

#[tokio::test]
async fn given_no_key_and_a_bad_body_then_401_comes_before_validation() {
    let app = app().await;
    let req = Request::post("/v1/events")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{nope"))
        .unwrap();
    assert_eq!(app.send(req).await.status, StatusCode::UNAUTHORIZED);
}

// Subscriptions

#[tokio::test]
async fn given_a_new_subscription_then_it_is_created_with_defaults_and_its_secret_shown_once() {
    let app = app().await;
    let created = app.subscribe(&app.a, json!({"url": "https://example.com/hooks"})).await;
    assert!(id(&created).starts_with("sub_"));
    assert!(created["secret"].as_str().unwrap().starts_with("whsec_"));
    assert_eq!(created["url"], "https://example.com/hooks");
    assert_eq!(created["event_types"], json!(["*"]));
    assert_eq!(created["retry_policy"], "standard");
    assert_eq!(created["timeout_ms"], 10_000);
    assert_eq!(created["status"], "active");

    let got = app
        .call("GET", &format!("/v1/subscriptions/{}", id(&created)), &app.a, None)
        .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body["url"], "https://example.com/hooks");
    assert!(got.body.get("secret").is_none(), "no secret on read: {}", got.body);

    let list = app.call("GET", "/v1/subscriptions", &app.a, None).await;
    assert_eq!(list.status, StatusCode::OK);
    let data = list.body["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert!(data[0].get("secret").is_none());
    assert!(
        !list.body.to_string().contains("whsec_"),
        "no secret anywhere in a listing"
    );
}

#[tokio::test]
async fn given_more_subscriptions_than_a_page_then_the_listing_pages_through_them_oldest_first() {
    let app = app().await;
    let mut created = Vec::new();
    for i in 0..5 {
        let sub = app
            .subscribe(&app.a, json!({"url": format!("https://s{i}.example.com/")}))
            .await;
        created.push(id(&sub));
    }
    let mut seen = Vec::new();
    let mut uri = "/v1/subscriptions?limit=2".to_owned();
    loop {
        let page = app.call("GET", &uri, &app.a, None).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let data = page.body["data"].as_array().unwrap();
        assert!(data.len() <= 2, "{}", page.body);
        assert!(data
            .iter()
            .all(|s| s["counts_complete"] == true && s["counts"]["pending"] == 0));
        seen.extend(data.iter().map(id));
        match page.body["next_cursor"].as_str() {
            Some(c) => uri = format!("/v1/subscriptions?limit=2&cursor={c}"),
            None => break,
        }
    }
    created.sort();
    assert_eq!(seen, created, "each once, in creation (id) order");

    for (query, code) in [
        ("limit=0", "invalid_limit"),
        ("limit=101", "invalid_limit"),
        ("cursor=nonsense", "invalid_cursor"),
    ] {
        let r = app
            .call("GET", &format!("/v1/subscriptions?{query}"), &app.a, None)
            .await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, code),
            "{query}"
        );
    }
}

#[tokio::test]
async fn given_a_custom_policy_and_options_then_they_are_stored_as_given() {
    let app = app().await;
    let policy = json!({"schedule_seconds": [1, 1, 1], "jitter": {"proportional": 0.1}, "adaptive": false});
    let created = app
        .subscribe(
            &app.a,
            json!({"url": "https://example.com/h", "event_types": ["invoice.*", "user.created"], "owner_email": "ops@example.com",
                   "retry_policy": policy, "timeout_ms": 2500, "description": "billing"}),
        )
        .await;
    assert_eq!(created["retry_policy"], policy);
    assert_eq!(created["event_types"], json!(["invoice.*", "user.created"]));
    assert_eq!(created["owner_email"], "ops@example.com");
    assert_eq!(created["timeout_ms"], 2500);
    assert_eq!(created["description"], "billing");
    let ledger = app
        .subscribe(
            &app.a,
            json!({"url": "https://example.com/l", "retry_policy": "ledger"}),
        )
        .await;
    assert_eq!(ledger["retry_policy"], "ledger");
}

#[tokio::test]
async fn given_a_patch_then_only_the_fields_sent_change() {
    let app = app().await;
    let created = app
        .subscribe(&app.a, json!({"url": "https://example.com/old", "description": "keep"}))
        .await;
    let uri = format!("/v1/subscriptions/{}", id(&created));
    let patched = app
        .call(
            "PATCH",
            &uri,
            &app.a,
            Some(json!({"url": "https://example.com/new", "status": "disabled"})),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(patched.body["url"], "https://example.com/new");
    assert_eq!(patched.body["status"], "disabled");
    assert_eq!(patched.body["description"], "keep");
    assert!(patched.body.get("secret").is_none());
    assert_eq!(
        app.call("GET", &uri, &app.a, None).await.body["url"],
        "https://example.com/new"
    );

    let bad = app.call("PATCH", &uri, &app.a, Some(json!({"timeout_ms": 0}))).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad.code(), "invalid_timeout");
}

#[tokio::test]
async fn given_null_in_a_patch_then_the_optional_fields_are_removed_and_the_others_kept() {
    let app = app().await;
    let created = app
        .subscribe(
            &app.a,
            json!({"url": "https://example.com/h", "description": "billing", "owner_email": "team@example.com", "timeout_ms": 2500}),
        )
        .await;
    let uri = format!("/v1/subscriptions/{}", id(&created));
    let patched = app
        .call(
            "PATCH",
            &uri,
            &app.a,
            Some(json!({"description": null, "owner_email": null, "timeout_ms": null})),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    let stored = app.call("GET", &uri, &app.a, None).await.body;
    for field in ["description", "owner_email"] {
        assert!(
            stored.get(field).is_none_or(|v| v.is_null()),
            "{field} removed: {stored}"
        );
    }
    assert_eq!(stored["timeout_ms"], 2500, "null leaves a required field as it was");
    assert_eq!(stored["url"], "https://example.com/h");
}

#[tokio::test]
async fn given_a_delete_then_the_subscription_is_gone() {
    let app = app().await;
    let created = app.subscribe(&app.a, json!({"url": "https://example.com/h"})).await;
    let uri = format!("/v1/subscriptions/{}", id(&created));
    let deleted = app.call("DELETE", &uri, &app.a, None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let again = app.call("GET", &uri, &app.a, None).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    assert_eq!(again.code(), "not_found");
    assert_eq!(
        app.call("DELETE", &uri, &app.a, None).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn given_a_rotation_then_a_new_secret_is_shown_and_the_old_one_gets_a_grace_period() {
    let app = app().await;
    let created = app.subscribe(&app.a, json!({"url": "https://example.com/h"})).await;
    let rotated = app
        .call(
            "POST",
            &format!("/v1/subscriptions/{}/rotate-secret", id(&created)),
            &app.a,
            None,
        )
        .await;
    assert_eq!(rotated.status, StatusCode::OK);
    let new_secret = rotated.body["secret"].as_str().unwrap();
    assert!(new_secret.starts_with("whsec_"));
    assert_ne!(new_secret, created["secret"].as_str().unwrap());
    assert!(rotated.body["previous_secret_expires_at"].is_string());
    let got = app
        .call("GET", &format!("/v1/subscriptions/{}", id(&created)), &app.a, None)
        .await;
    assert!(!got.body.to_string().contains("whsec_"));
}

// Validation

#[tokio::test]
async fn given_malformed_json_then_400_says_so() {
    let app = app().await;
    let r = app
        .raw("POST", "/v1/subscriptions", &app.a, r#"{"url": "https://example.com""#)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "malformed_json");
    assert!(r.message().contains("not valid JSON"), "{}", r.message());
    let empty = app.raw("POST", "/v1/events", &app.a, "").await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    assert!(empty.message().contains("empty"));
}

#[tokio::test]
async fn given_wrong_types_then_422_names_the_field() {
    let app = app().await;
    let r = app
        .call("POST", "/v1/subscriptions", &app.a, Some(json!({"url": 123})))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.code(), "invalid_url");
    assert!(
        r.message().contains("`url`") && r.message().contains("expected a string"),
        "{}",
        r.message()
    );

    let r = app
        .call(
            "POST",
            "/v1/subscriptions",
            &app.a,
            Some(json!({"url": "https://e.com", "timeout_ms": "soon"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.code(), "invalid_timeout");

    let r = app
        .call(
            "POST",
            "/v1/subscriptions",
            &app.a,
            Some(json!({"url": "https://e.com", "event_types": ["ok.*", 7]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.message().contains("event_types[1]"), "{}", r.message());

    let r = app.raw("POST", "/v1/subscriptions", &app.a, "[1, 2]").await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.code(), "invalid_body");
}

#[tokio::test]
async fn given_a_non_url_then_422_explains_why() {
    let app = app().await;
    for (url, why) in [
        ("not a url", "not a valid endpoint URL"),
        ("ftp://example.com/x", "http or https"),
    ] {
        let r = app
            .call("POST", "/v1/subscriptions", &app.a, Some(json!({"url": url})))
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{url}");
        assert_eq!(r.code(), "invalid_url");
        assert!(r.message().contains(why), "{}", r.message());
    }
}

#[tokio::test]
async fn given_a_content_filter_then_it_is_shown_as_written_and_a_bad_one_is_422_naming_where() {
    let app = app().await;
    let filter = json!({"data": {"currency": ["EUR"], "amount": [{"numeric": [">=", 100]}]}});
    let created = app
        .subscribe(&app.a, json!({"url": "https://example.com/h", "filter": filter}))
        .await;
    assert_eq!(created["filter"], filter);
    let uri = format!("/v1/subscriptions/{}", id(&created));
    assert_eq!(app.call("GET", &uri, &app.a, None).await.body["filter"], filter);
    let removed = app.call("PATCH", &uri, &app.a, Some(json!({"filter": null}))).await;
    assert_eq!(
        (removed.status, &removed.body["filter"]),
        (StatusCode::OK, &Value::Null)
    );

    for (bad, place) in [
        (
            json!({"data": {"amount": [{"numeric": [">=", "a hundred"]}]}}),
            "data.amount",
        ),
        (json!({"type": [{"wildcard": "invoice.*"}]}), "type"),
        (json!({"type": "invoice.paid"}), "type"),
        (json!({}), ""),
    ] {
        let r = app
            .call(
                "POST",
                "/v1/subscriptions",
                &app.a,
                Some(json!({"url": "https://example.com/h", "filter": bad})),
            )
            .await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_filter"),
            "{bad}"
        );
        assert!(r.message().contains(place), "{bad}: {}", r.message());
        let r = app.call("PATCH", &uri, &app.a, Some(json!({"filter": bad}))).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_filter"),
            "PATCH {bad}"
        );
    }
}

#[tokio::test]
async fn given_custom_headers_then_a_sensitive_value_is_never_shown_again_and_hookwises_own_names_are_422() {
    let app = app().await;
    let created = app
        .subscribe(
            &app.a,
            json!({"url": "https://example.com/h", "headers": {
                "X-Env": "prod", "Authorization": {"value": "Bearer s3cr3t", "sensitive": true}}}),
        )
        .await;
    let shown = json!({"x-env": "prod", "authorization": {"sensitive": true}});
    assert_eq!(created["headers"], shown);
    let uri = format!("/v1/subscriptions/{}", id(&created));
    let read = app.call("GET", &uri, &app.a, None).await;
    assert_eq!(read.body["headers"], shown);
    let listed = app.call("GET", "/v1/subscriptions", &app.a, None).await;
    assert!(!listed.body.to_string().contains("s3cr3t"));
    // What was read back, sent back: the sensitive value is kept.
    let same = app.call("PATCH", &uri, &app.a, Some(json!({"headers": shown}))).await;
    assert_eq!((same.status, same.body["headers"].clone()), (StatusCode::OK, shown));

    for bad in [
        json!({"Content-Type": "text/plain"}),
        json!({"webhook-signature": "v1,x"}),
        json!({"x a": "1"}),
    ] {
        let r = app.call("PATCH", &uri, &app.a, Some(json!({"headers": bad}))).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_header"),
            "{bad}"
        );
    }
    let removed = app.call("PATCH", &uri, &app.a, Some(json!({"headers": null}))).await;
    assert_eq!(removed.body["headers"], json!({}));
}

#[tokio::test]
async fn given_a_test_send_then_202_names_its_one_delivery_and_the_listing_flags_it() {
    let app = app().await;
    let created = app
        .subscribe(
            &app.a,
            json!({"url": "https://example.com/h", "event_types": ["order.*"]}),
        )
        .await;
    let uri = format!("/v1/subscriptions/{}/test", id(&created));
    for body in [
        None,
        Some(json!({})),
        Some(json!({"type": "order.created", "payload": {"order": 7}})),
    ] {
        let sent = app.call("POST", &uri, &app.a, body.clone()).await;
        assert_eq!(sent.status, StatusCode::ACCEPTED, "{body:?}: {}", sent.body);
        let deliveries = sent.body["deliveries"].as_array().unwrap();
        assert_eq!(deliveries.len(), 1);
        assert_eq!(deliveries[0]["subscription_id"], created["id"]);
        let event = app
            .call(
                "GET",
                &format!("/v1/events/{}", sent.body["id"].as_str().unwrap()),
                &app.a,
                None,
            )
            .await;
        assert_eq!(
            (event.body["test"].clone(), event.body["deliveries"][0]["test"].clone()),
            (json!(true), json!(true))
        );
    }
    let listed = app.call("GET", "/v1/deliveries", &app.a, None).await;
    assert!(listed.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["test"] == true));

    let half = app
        .call("POST", &uri, &app.a, Some(json!({"type": "order.created"})))
        .await;
    assert_eq!(
        (half.status, half.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "no_example"),
        "a type the catalogue gives no example"
    );
    let orphan = app.call("POST", &uri, &app.a, Some(json!({"payload": {"a": 1}}))).await;
    assert_eq!(
        (orphan.status, orphan.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_test")
    );
    let theirs = app.call("POST", &uri, &app.b, None).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn given_an_unknown_policy_name_then_422_lists_the_known_ones() {
    let app = app().await;
    let r = app
        .call(
            "POST",
            "/v1/subscriptions",
            &app.a,
            Some(json!({"url": "https://e.com", "retry_policy": "fastest"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.code(), "unknown_retry_policy");
    assert!(
        r.message().contains("fastest") && r.message().contains("standard, ledger, exponential"),
        "{}",
        r.message()
    );
}

#[tokio::test]
async fn given_a_malformed_custom_policy_then_422_points_at_the_bad_part() {
    let app = app().await;
    let bad_jitter = json!({"url": "https://e.com", "retry_policy": {"schedule_seconds": [1], "jitter": "wobbly"}});
    let r = app.call("POST", "/v1/subscriptions", &app.a, Some(bad_jitter)).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.code(), "invalid_retry_policy");
    assert!(
        r.message().contains("retry_policy.jitter") && r.message().contains("wobbly"),
        "{}",
        r.message()
    );

    let bad_delays = json!({"url": "https://e.com", "retry_policy": {"schedule_seconds": ["1m"]}});
    let r = app.call("POST", "/v1/subscriptions", &app.a, Some(bad_delays)).await;
    assert_eq!(r.code(), "invalid_retry_policy");
    assert!(
        r.message().contains("retry_policy.schedule_seconds[0]"),
        "{}",
        r.message()
    );

    let r = app
        .call(
            "POST",
            "/v1/subscriptions",
            &app.a,
            Some(json!({"url": "https://e.com", "retry_policy": 5})),
        )
        .await;
    assert_eq!(r.code(), "invalid_retry_policy");
    assert!(r.message().contains("schedule_seconds"), "{}", r.message());
}

#[tokio::test]
async fn given_missing_or_unknown_fields_then_422_names_them() {
    let app = app().await;
    let r = app
        .call("POST", "/v1/subscriptions", &app.a, Some(json!({"event_types": ["*"]})))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.code(), "missing_field");
    assert!(r.message().contains("`url`"), "{}", r.message());

    let r = app
        .call(
            "POST",
            "/v1/subscriptions",
            &app.a,
            Some(json!({"url": "https://e.com", "secret": "mine"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.code(), "unknown_field");
    assert!(r.message().contains("`secret`"), "{}", r.message());
}

#[tokio::test]
async fn given_a_bad_event_then_422_says_what_is_wrong() {
    let app = app().await;
    let r = app
        .call(
            "POST",
            "/v1/events",
            &app.a,
            Some(json!({"type": "invoice paid", "payload": {}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.code(), "invalid_event_type");
    let r = app
        .call(
            "POST",
            "/v1/events",
            &app.a,
            Some(json!({"type": "invoice.paid", "payload": [1]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.code(), "invalid_payload");
    assert!(r.message().contains("JSON object"));
}

#[tokio::test]
async fn given_a_non_json_content_type_then_415_asks_for_json() {
    let app = app().await;
    let req = App::request("POST", "/v1/events", Some(&app.a))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("type=a"))
        .unwrap();
    let r = app.send(req).await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(r.message().contains("application/json"));
}

#[tokio::test]
async fn given_a_body_over_256_kb_then_413() {
    let app = app().await;
    let big = json!({"type": "a.b", "payload": {"blob": "x".repeat(MAX_BODY_BYTES)}});
    let r = app.call("POST", "/v1/events", &app.a, Some(big)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.code(), "payload_too_large");
    let fits = json!({"type": "a.b", "payload": {"blob": "x".repeat(MAX_BODY_BYTES - 100)}});
    assert_eq!(
        app.call("POST", "/v1/events", &app.a, Some(fits)).await.status,
        StatusCode::ACCEPTED
    );
}

#[tokio::test]
async fn given_unknown_routes_methods_or_ids_then_json_errors() {
    let app = app().await;
    let r = app.call("GET", "/v1/nothing", &app.a, None).await;
    assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"));
    let r = app.call("PUT", "/v1/events", &app.a, None).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
    assert!(r.message().contains("PUT /v1/events"), "{}", r.message());
    let r = app
        .call("GET", "/v1/subscriptions/evt_01J0000000000000000000000", &app.a, None)
        .await;
    assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"));
    assert!(r.message().contains("sub_"), "{}", r.message());
}

// Events

#[tokio::test]
async fn given_an_event_then_202_with_one_delivery_per_matching_subscription() {
    let app = app().await;
    let all = app.subscribe(&app.a, json!({"url": "https://example.com/all"})).await;
    let invoices = app
        .subscribe(
            &app.a,
            json!({"url": "https://example.com/inv", "event_types": ["invoice.*"]}),
        )
        .await;
    app.subscribe(
        &app.a,
        json!({"url": "https://example.com/users", "event_types": ["user.created"]}),
    )
    .await;
    app.subscribe(&app.b, json!({"url": "https://example.com/other-tenant"}))
        .await;

    let accepted = app.ingest(&app.a, "invoice.paid").await;
    assert!(id(&accepted).starts_with("evt_"));
    let mut subs: Vec<_> = accepted["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["subscription_id"].as_str().unwrap().to_owned())
        .collect();
    subs.sort();
    let mut want = vec![id(&all), id(&invoices)];
    want.sort();
    assert_eq!(subs, want);
    assert!(accepted["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["status"] == "pending" && id(d).starts_with("dlv_")));

    let got = app
        .call("GET", &format!("/v1/events/{}", id(&accepted)), &app.a, None)
        .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body["type"], "invoice.paid");
    assert_eq!(got.body["payload"], json!({"n": 1}));
    assert_eq!(got.body["deliveries"].as_array().unwrap().len(), 2);
    assert_eq!(got.body["deliveries"][0]["attempt_count"], 0);
}

#[tokio::test]
async fn given_the_same_idempotency_key_twice_then_one_event_and_no_new_deliveries() {
    let app = app().await;
    app.subscribe(&app.a, json!({"url": "https://example.com/h"})).await;
    let post = |key: &'static str| {
        App::request("POST", "/v1/events", Some(&app.a))
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", key)
            .body(Body::from(
                json!({"type": "order.placed", "payload": {"order": 7}}).to_string(),
            ))
            .unwrap()
    };
    let first = app.send(post("order-7")).await;
    let second = app.send(post("order-7")).await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert_eq!(second.status, StatusCode::ACCEPTED);
    assert_eq!(first.body, second.body, "the same event and deliveries");
    assert!(first.headers.get("idempotent-replayed").is_none());
    assert_eq!(second.headers["idempotent-replayed"], "true");
    let listed = app.call("GET", "/v1/deliveries", &app.a, None).await;
    assert_eq!(listed.body["data"].as_array().unwrap().len(), 1, "one delivery in all");
    // The first request queued its first attempt before storing it; the repeat, answered
    // from the store, queues nothing.
    let queued = app.harness.queue.take_visible();
    assert_eq!(queued.len(), 1, "{queued:?}");

    let other = app.send(post("order-8")).await;
    assert_ne!(id(&other.body), id(&first.body));

    // The same key with another payload is a mistake, not a retry.
    let reused = app
        .send(
            App::request("POST", "/v1/events", Some(&app.a))
                .header(header::CONTENT_TYPE, "application/json")
                .header("idempotency-key", "order-7")
                .body(Body::from(
                    json!({"type": "order.placed", "payload": {"order": 8}}).to_string(),
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.code(), "idempotency_key_reused");
}

// Deliveries, replay, recover

/// Tenant A: one always-failing subscription with two attempts, one event, run until dead.
async fn dead_delivery(app: &App) -> (String, String, String) {
    let sub = app
        .subscribe(
            &app.a,
            json!({"url": "https://example.com/fail", "retry_policy": {"schedule_seconds": [1], "jitter": "none"}}),
        )
        .await;
    let event = app.ingest(&app.a, "invoice.paid").await;
    app.harness.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    let delivery = id(&event["deliveries"][0]);
    (id(&sub), id(&event), delivery)
}

#[tokio::test]
async fn given_a_dead_delivery_then_it_shows_its_attempts_and_can_be_replayed_once() {
    let app = app().await;
    let (_, _, delivery) = dead_delivery(&app).await;
    let got = app
        .call("GET", &format!("/v1/deliveries/{delivery}"), &app.a, None)
        .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body["status"], "dead");
    assert_eq!(got.body["attempt_count"], 2);
    let attempts = got.body["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["attempt"], 1);
    assert_eq!(attempts[0]["status_code"], 500);
    assert!(attempts[0]["next_attempt_at"].is_string());
    assert!(attempts[1]["next_attempt_at"].is_null());
    for field in ["started_at", "duration_ms", "error", "response_excerpt"] {
        assert!(attempts[0].get(field).is_some(), "{field}");
    }
    // The headers each attempt sent: its timestamp is its start; no signature shown.
    let sent = &attempts[1]["request_headers"];
    assert_eq!(sent["webhook-id"], got.body["event_id"]);
    let started: chrono::DateTime<chrono::Utc> = attempts[1]["started_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(sent["webhook-timestamp"], started.timestamp().to_string());
    assert!(sent["webhook-signature"].as_str().unwrap().starts_with("v1,…"));
    assert_eq!(sent["content-type"], "application/json");

    let replayed = app
        .call("POST", &format!("/v1/deliveries/{delivery}/replay"), &app.a, None)
        .await;
    assert_eq!(replayed.status, StatusCode::ACCEPTED);
    assert_eq!(replayed.body["status"], "pending");
    assert_eq!(replayed.body["round"], 1);
    assert_eq!(replayed.body["attempt_count"], 0);
    let again = app
        .call("POST", &format!("/v1/deliveries/{delivery}/replay"), &app.a, None)
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.code(), "conflict");
}

#[tokio::test]
async fn given_a_dead_delivery_then_the_endpoints_stats_count_its_attempts_and_death() {
    let app = app().await;
    let (sub, _, _) = dead_delivery(&app).await;
    // The worker's last counts are written by its process's next tick.
    app.harness.clock.advance(Duration::seconds(6));
    app.harness.services.run_scheduler().await.unwrap();
    let uri = format!("/v1/subscriptions/{sub}/stats?window=1h");
    let r = app.call("GET", &uri, &app.a, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["window"], "1h");
    assert_eq!(
        r.body["attempts"],
        json!({"total": 2, "succeeded": 0, "http_4xx": 0, "http_5xx": 2, "timeout": 0, "error": 0})
    );
    assert_eq!(r.body["success_rate"], 0.0);
    assert_eq!(r.body["dead"], 1);
    assert_eq!(r.body["latency_ms"], json!({"p50": 25, "p95": 25, "p99": 25}));
    let series = r.body["series"].as_array().unwrap();
    assert_eq!(series.len(), 12);
    assert_eq!(series.iter().map(|p| p["attempts"].as_u64().unwrap()).sum::<u64>(), 2);

    let r = app
        .call("GET", &format!("/v1/subscriptions/{sub}/stats"), &app.a, None)
        .await;
    assert_eq!((r.status, r.body["window"].as_str()), (StatusCode::OK, Some("24h")));
    assert_eq!(r.body["series"].as_array().unwrap().len(), 24);
    let r = app
        .call("GET", &format!("/v1/subscriptions/{sub}/stats?window=2h"), &app.a, None)
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_window")
    );
    let r = app.call("GET", &uri, &app.b, None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "another tenant's");
    // A fresh endpoint: nothing counted, no rate.
    let fresh = id(&app.subscribe(&app.a, json!({"url": "https://example.com/new"})).await);
    let r = app
        .call(
            "GET",
            &format!("/v1/subscriptions/{fresh}/stats?window=7d"),
            &app.a,
            None,
        )
        .await;
    assert_eq!(r.body["attempts"]["total"], 0);
    assert_eq!(
        (r.body["success_rate"].clone(), r.body["latency_ms"].clone()),
        (Value::Null, Value::Null)
    );
    assert_eq!(r.body["series"].as_array().unwrap().len(), 28);
}

#[tokio::test]
async fn given_dead_deliveries_then_event_replay_and_subscription_recover_restart_them() {
    let app = app().await;
    let (sub, event, delivery) = dead_delivery(&app).await;
    let r = app
        .call("POST", &format!("/v1/events/{event}/replay"), &app.a, None)
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.body["replayed"][0]["id"], delivery.as_str());

    app.harness.run_for(Duration::seconds(5), Duration::seconds(1)).await;
    let future = app
        .call(
            "POST",
            &format!("/v1/subscriptions/{sub}/recover"),
            &app.a,
            Some(json!({"since": "2099-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(future.status, StatusCode::ACCEPTED);
    assert_eq!(future.body["replayed"], json!([]), "nothing died after 2099");
    let r = app
        .call(
            "POST",
            &format!("/v1/subscriptions/{sub}/recover"),
            &app.a,
            Some(json!({"since": "2000-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.body["replayed"][0]["id"], delivery.as_str());
    assert_eq!(r.body["replayed"][0]["round"], 2);

    let bad = app
        .call(
            "POST",
            &format!("/v1/subscriptions/{sub}/recover"),
            &app.a,
            Some(json!({"since": "yesterday"})),
        )
        .await;
    assert_eq!(
        (bad.status, bad.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_since")
    );
    assert!(bad.message().contains("RFC 3339"), "{}", bad.message());
    let missing = app
        .call(
            "POST",
            &format!("/v1/subscriptions/{sub}/recover"),
            &app.a,
            Some(json!({})),
        )
        .await;
    assert_eq!(
        (missing.status, missing.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "missing_field")
    );
}

#[tokio::test]
async fn given_deliveries_then_they_list_by_status_and_subscription_in_pages() {
    let app = app().await;
    let ok = app.subscribe(&app.a, json!({"url": "https://example.com/ok"})).await;
    let (failing, _, _) = dead_delivery(&app).await;
    for _ in 0..2 {
        app.ingest(&app.a, "user.created").await;
    }
    app.harness.drain_now().await;

    let dead = app.call("GET", "/v1/deliveries?status=dead", &app.a, None).await;
    assert_eq!(dead.status, StatusCode::OK);
    let data = dead.body["data"].as_array().unwrap();
    assert!(!data.is_empty() && data.iter().all(|d| d["status"] == "dead"));

    let mine = app
        .call(
            "GET",
            &format!("/v1/deliveries?subscription_id={}", id(&ok)),
            &app.a,
            None,
        )
        .await;
    let data = mine.body["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    assert!(data
        .iter()
        .all(|d| d["subscription_id"] == id(&ok).as_str() && d["status"] == "delivered"));

    let page1 = app.call("GET", "/v1/deliveries?limit=4", &app.a, None).await;
    assert_eq!(page1.body["data"].as_array().unwrap().len(), 4);
    let cursor = page1.body["next_cursor"].as_str().expect("a next page");
    let page2 = app
        .call("GET", &format!("/v1/deliveries?limit=4&cursor={cursor}"), &app.a, None)
        .await;
    assert_eq!(page2.status, StatusCode::OK, "{}", page2.body);
    let mut ids: Vec<Value> = [&page1, &page2]
        .iter()
        .flat_map(|p| p.body["data"].as_array().unwrap().clone())
        .map(|d| d["id"].clone())
        .collect();
    assert_eq!(ids.len(), 6, "three events, each to `ok` and to the failing {failing}");
    ids.sort_by_key(|v| v.to_string());
    ids.dedup();
    assert_eq!(ids.len(), 6, "no delivery twice across pages");
    assert!(page2.body["next_cursor"].is_null());
}

#[tokio::test]
async fn given_bad_list_parameters_then_422_says_which() {
    let app = app().await;
    for (query, code) in [
        ("limit=abc", "invalid_limit"),
        ("limit=0", "invalid_limit"),
        ("limit=101", "invalid_limit"),
        ("status=lost", "invalid_status"),
        ("subscription_id=nope", "invalid_id"),
        ("cursor=nonsense", "invalid_cursor"),
    ] {
        let r = app.call("GET", &format!("/v1/deliveries?{query}"), &app.a, None).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, code),
            "{query}"
        );
    }
}

// Tenant isolation

#[tokio::test]
async fn given_another_tenants_ids_then_every_route_answers_404_and_nothing_changes() {
    let app = app().await;
    let (sub, event, delivery) = dead_delivery(&app).await;
    let b = app.b.clone();
    for (method, uri, body) in [
        ("GET", format!("/v1/subscriptions/{sub}"), None),
        (
            "PATCH",
            format!("/v1/subscriptions/{sub}"),
            Some(json!({"url": "https://evil.example.com/"})),
        ),
        ("POST", format!("/v1/subscriptions/{sub}/rotate-secret"), None),
        (
            "POST",
            format!("/v1/subscriptions/{sub}/recover"),
            Some(json!({"since": "2000-01-01T00:00:00Z"})),
        ),
        ("DELETE", format!("/v1/subscriptions/{sub}"), None),
        ("GET", format!("/v1/events/{event}"), None),
        ("POST", format!("/v1/events/{event}/replay"), None),
        ("GET", format!("/v1/deliveries/{delivery}"), None),
        ("POST", format!("/v1/deliveries/{delivery}/replay"), None),
    ] {
        let r = app.call(method, &uri, &b, body).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::NOT_FOUND, "not_found"),
            "{method} {uri}"
        );
    }
    assert_eq!(
        app.call("GET", "/v1/subscriptions", &b, None).await.body["data"],
        json!([])
    );
    assert_eq!(
        app.call("GET", "/v1/deliveries", &b, None).await.body["data"],
        json!([])
    );
    // Tenant A's things are as they were.
    let got = app.call("GET", &format!("/v1/subscriptions/{sub}"), &app.a, None).await;
    assert_eq!(got.body["url"], "https://example.com/fail");
    assert_eq!(
        app.call("GET", &format!("/v1/deliveries/{delivery}"), &app.a, None)
            .await
            .body["status"],
        "dead"
    );
}

#[tokio::test(start_paused = true)]
async fn given_a_client_that_never_finishes_its_body_then_it_gets_408_after_the_request_timeout() {
    let app = app().await;
    let never = futures::stream::pending::<Result<Vec<u8>, std::io::Error>>();
    let request = Request::post("/v1/events")
        .header(header::AUTHORIZATION, format!("Bearer {}", app.a))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(never))
        .unwrap();
    let started = tokio::time::Instant::now();
    let response = app.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(started.elapsed(), hookwise_http::api::REQUEST_TIMEOUT);
    let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "request_timeout");
}

// Batch ingest

#[tokio::test]
async fn given_a_batch_then_each_event_is_answered_in_its_place_and_an_invalid_one_fails_alone() {
    let app = app().await;
    let sub = app.subscribe(&app.a, json!({"url": "https://example.com/h"})).await;
    let batch = json!({"events": [
        {"type": "order.placed", "payload": {"order": 1}, "idempotency_key": "order-1"},
        {"type": "Not A Type!", "payload": {}},
        {"type": "order.placed", "payload": [1]},
        {"type": "order.placed", "payload": {}, "priority": 1},
        {"type": "order.placed", "payload": {"exact": 94.0}},
        {"type": "order.placed", "payload": {"order": 2}, "idempotency_key": "order-1"},
    ]});
    let r = app.call("POST", "/v1/events/batch", &app.a, Some(batch.clone())).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    assert_eq!(
        (r.body["accepted"].as_u64(), r.body["failed"].as_u64()),
        (Some(2), Some(4))
    );
    let results = r.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 6, "one result per event, in order");
    assert_eq!(results[0]["replayed"], false);
    assert_eq!(results[0]["deliveries"][0]["subscription_id"], sub["id"]);
    for (i, code) in [
        (1, "invalid_event_type"),
        (2, "invalid_payload"),
        (3, "unknown_field"),
        (5, "idempotency_key_reused"),
    ] {
        assert_eq!(results[i]["error"]["code"], code, "{}", results[i]);
        assert_eq!(results[i]["error"]["status"], 422);
    }
    assert!(
        results[1]["error"]["message"].as_str().unwrap().contains("events[1]"),
        "{}",
        results[1]
    );
    // Stored as sent: the payload is the customer's, number formats and all.
    let exact = app
        .call("GET", &format!("/v1/events/{}", id(&results[4])), &app.a, None)
        .await;
    assert_eq!(exact.body["payload"], json!({"exact": 94.0}));
    assert_eq!(
        app.harness.queue.take_visible().len(),
        2,
        "both accepted events are queued"
    );

    // The same batch again: the keyed event is the same one, the keyless one a new one.
    let again = app.call("POST", "/v1/events/batch", &app.a, Some(batch)).await;
    let results_again = again.body["results"].as_array().unwrap();
    assert_eq!(results_again[0]["replayed"], true);
    assert_eq!(id(&results_again[0]), id(&results[0]));
    assert_ne!(id(&results_again[4]), id(&results[4]));
}

#[tokio::test]
async fn given_a_bad_batch_then_it_is_refused_whole_with_a_reason() {
    let app = app().await;
    let one = json!({"type": "a.b", "payload": {}});
    for (body, code) in [
        (json!({"events": []}), "invalid_batch"),
        (json!({"events": vec![one.clone(); 101]}), "invalid_batch"),
        (json!({}), "missing_field"),
        (json!({"events": [one.clone()], "extra": 1}), "unknown_field"),
    ] {
        let r = app.call("POST", "/v1/events/batch", &app.a, Some(body)).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, code),
            "{}",
            r.body
        );
    }
    // Its body may be 1 MB, four times a single event's, though each payload still fits 256 KB.
    let blob = |n: usize| json!({"type": "a.b", "payload": {"blob": "x".repeat(n)}});
    let fits = json!({"events": [blob(200_000), blob(200_000), blob(200_000)]});
    let r = app.call("POST", "/v1/events/batch", &app.a, Some(fits)).await;
    assert_eq!(
        (r.status, r.body["accepted"].as_u64()),
        (StatusCode::ACCEPTED, Some(3)),
        "{}",
        r.body
    );
    let one_too_big = json!({"events": [blob(MAX_BODY_BYTES), blob(10)]});
    let r = app.call("POST", "/v1/events/batch", &app.a, Some(one_too_big)).await;
    assert_eq!(
        r.body["results"][0]["error"]["code"], "payload_too_large",
        "{}",
        r.body["results"][0]
    );
    assert_eq!(
        r.body["results"][0]["error"]["status"], 413,
        "as a single request's would be"
    );
    assert_eq!(r.body["accepted"], 1);
    let too_big = json!({"events": [blob(MAX_BATCH_BODY_BYTES)]});
    let r = app.call("POST", "/v1/events/batch", &app.a, Some(too_big)).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    // No key, no batch.
    let r = app
        .send(
            App::request("POST", "/v1/events/batch", None)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json!({"events": [one]}).to_string()))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}
