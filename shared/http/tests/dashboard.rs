//! The dashboard as the Router serves it, and the subscription overview it shows.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use chrono::Duration;
use hookwise_core::services::{Config, Services};
use hookwise_core::testing::memory::{status_outcome, Harness, ScriptedSender};
use hookwise_http::api::ROUTES;
use hookwise_http::{router, ApiState};
use rand::SeedableRng;
use serde_json::{json, Value};
use tower::ServiceExt;

/// Endpoints whose URL contains `fail` answer 500; the rest 200.
async fn app() -> (Router, Harness, String) {
    let harness = Harness::new(ScriptedSender::new(|url, _| {
        status_outcome(if url.contains("fail") { 500 } else { 200 })
    }));
    let services = Services::new(
        harness.services.ports().clone(),
        Config::default(),
        rand::rngs::StdRng::seed_from_u64(7),
    );
    let (_, key) = harness.tenant("a@example.com").await;
    (router(ApiState::new(Arc::new(services))), harness, key)
}

async fn get(app: &Router, uri: &str, key: Option<&str>) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut req = Request::get(uri);
    if let Some(key) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let resp = app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn call(app: &Router, method: &str, uri: &str, key: &str, body: Value) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn given_no_key_then_the_dashboard_and_its_assets_are_served_with_a_strict_content_security_policy() {
    let (app, _, _) = app().await;
    for (path, content_type) in [
        ("/dashboard", "text/html; charset=utf-8"),
        ("/dashboard/app.js", "text/javascript; charset=utf-8"),
        ("/dashboard/app.css", "text/css; charset=utf-8"),
    ] {
        let (status, headers, body) = get(&app, path, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("default-src 'none'")
                && csp.contains("script-src 'self'")
                && csp.contains("connect-src 'self'"),
            "{csp}"
        );
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert!(!body.trim().is_empty(), "{path} is empty");
    }
}

#[tokio::test]
async fn given_the_dashboard_page_then_every_asset_it_loads_is_served_by_the_router_and_nothing_comes_from_outside() {
    let (app, _, _) = app().await;
    let (_, _, html) = get(&app, "/dashboard", None).await;
    // `src="..."` and `href="..."` of the page: relative, and in the route table.
    let mut assets = 0;
    for attr in ["src=\"", "href=\""] {
        for piece in html.split(attr).skip(1) {
            let target = &piece[..piece.find('"').unwrap()];
            if target.starts_with('#') {
                continue;
            }
            assert!(!target.contains("//"), "the page loads {target} from elsewhere");
            let path = format!("/{target}");
            assert!(
                ROUTES.iter().any(|(m, p)| *m == "GET" && *p == path),
                "{path} is not served"
            );
            assets += 1;
        }
    }
    assert_eq!(assets, 2, "the script and the stylesheet");
    let (_, _, js) = get(&app, "/dashboard/app.js", None).await;
    let (_, _, css) = get(&app, "/dashboard/app.css", None).await;
    for (name, text) in [("index.html", &html), ("app.js", &js), ("app.css", &css)] {
        // (The SVG namespace is a name, not an address: nothing is loaded from it.)
        let text = text.replace("http://www.w3.org/2000/svg", "");
        for outside in ["http://", "https://", "@import", "url(", "localStorage"] {
            assert!(!text.contains(outside), "{name} contains `{outside}`");
        }
    }
    // The key is kept in sessionStorage and sent as a header, never put in a URL.
    assert!(js.contains("sessionStorage.setItem(KEY_STORAGE, key)"));
    assert!(js.contains("Authorization: `Bearer ${state.key}`"));
    assert!(!js.contains("searchParams.set(\"key") && !js.contains("location.hash ="));
}

#[tokio::test]
async fn given_the_dashboard_page_then_every_form_control_has_a_label() {
    let (app, _, _) = app().await;
    let (_, _, html) = get(&app, "/dashboard", None).await;
    for tag in ["<input", "<select"] {
        for piece in html.split(tag).skip(1) {
            let attrs = &piece[..piece.find('>').unwrap()];
            let id = attrs
                .split("id=\"")
                .nth(1)
                .map(|s| &s[..s.find('"').unwrap()])
                .expect("a control with an id");
            assert!(html.contains(&format!("<label for=\"{id}\"")), "#{id} has no label");
        }
    }
}

#[tokio::test]
async fn given_deliveries_in_every_state_then_the_subscription_list_and_read_show_health_and_counts_by_status() {
    let (app, harness, key) = app().await;
    let (s, good) = call(
        &app,
        "POST",
        "/v1/subscriptions",
        &key,
        json!({"url": "https://ok.example.com/h"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let (_, bad) = call(
        &app,
        "POST",
        "/v1/subscriptions",
        &key,
        json!({"url": "https://fail.example.com/h", "retry_policy": {"schedule_seconds": [60]}}),
    )
    .await;
    let (good, bad) = (
        good["id"].as_str().unwrap().to_owned(),
        bad["id"].as_str().unwrap().to_owned(),
    );

    // Before any attempt: no health, everything pending.
    let (_, body) = call(&app, "POST", "/v1/events", &key, json!({"type": "a.b", "payload": {}})).await;
    assert_eq!(body["deliveries"].as_array().unwrap().len(), 2);
    let (status, _, listed) = get(&app, "/v1/subscriptions", Some(&key)).await;
    assert_eq!(status, StatusCode::OK);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    for sub in listed["data"].as_array().unwrap() {
        assert_eq!(sub["health"], Value::Null, "{sub}");
        assert_eq!(
            sub["counts"],
            json!({"pending": 1, "retrying": 0, "delivered": 0, "dead": 0})
        );
        assert!(sub.get("secret").is_none(), "no secret in a listing");
    }

    // One attempt each: the good one delivered, the bad one retrying; then the bad one dies.
    harness.drain_now().await;
    let (_, _, read) = get(&app, &format!("/v1/subscriptions/{bad}"), Some(&key)).await;
    let read: Value = serde_json::from_str(&read).unwrap();
    assert_eq!(
        read["counts"],
        json!({"pending": 0, "retrying": 1, "delivered": 0, "dead": 0})
    );
    assert_eq!(read["health"], 0.0);
    assert_eq!(read["circuit"]["state"], "closed", "one failure does not open it");
    assert_eq!(
        read["circuit_breaker"],
        json!({"enabled": true, "failure_threshold": 5, "probe_interval_seconds": 30}),
        "on by default"
    );
    harness.run_for(Duration::minutes(3), Duration::seconds(30)).await;
    call(&app, "POST", "/v1/events", &key, json!({"type": "a.b", "payload": {}})).await;

    let (_, _, listed) = get(&app, "/v1/subscriptions", Some(&key)).await;
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let by_id = |id: &str| {
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .unwrap()
            .clone()
    };
    let (g, b) = (by_id(&good), by_id(&bad));
    assert_eq!(
        g["counts"],
        json!({"pending": 1, "retrying": 0, "delivered": 1, "dead": 0})
    );
    // Every attempt succeeded; older successes weigh a little less (λ = 0.1/hour).
    let health = g["health"].as_f64().unwrap();
    assert!(health > 0.9 && health <= 1.0, "{health}");
    assert_eq!(
        b["counts"],
        json!({"pending": 1, "retrying": 0, "delivered": 0, "dead": 1})
    );
    assert_eq!(b["health"], 0.0);
    assert_eq!(b["url"], "https://fail.example.com/h");
    assert_eq!(
        b["retry_policy"],
        json!({"schedule_seconds": [60], "jitter": "none", "adaptive": false})
    );
}
