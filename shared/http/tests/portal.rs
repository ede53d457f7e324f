//! The customer portal's sessions through the API: minted by a tenant's key or an operator
//! key, scoped to one tenant, refused once expired or revoked, never able to send events,
//! use the operator routes or, read-only, change anything or see a secret; the portal page
//! framed only by the origins allowed.

mod support;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use chrono::Duration;
use hookwise_core::services::{Config, Services};
use hookwise_core::testing::memory::{Harness, ScriptedSender};
use hookwise_http::{router, ApiState, PortalConfig};
use rand::SeedableRng;
use serde_json::{json, Value};
use tower::ServiceExt;

struct App {
    router: Router,
    harness: Harness,
    operator: String,
    /// Two tenants' keys.
    a: String,
    b: String,
}

async fn app(portal: PortalConfig) -> App {
    app_with(portal, Config::default()).await
}

async fn app_with(portal: PortalConfig, config: Config) -> App {
    let harness = Harness::new(ScriptedSender::always(500));
    let services = Services::new(
        harness.services.ports().clone(),
        config,
        rand::rngs::StdRng::seed_from_u64(1),
    );
    let (_, operator) = services.create_operator_key().await.unwrap();
    let (_, a) = harness.tenant("a@example.com").await;
    let (_, b) = harness.tenant("b@example.com").await;
    App {
        router: router(ApiState::new(Arc::new(services)).with_portal(portal)),
        harness,
        operator,
        a,
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

    /// A portal session minted with `key`: its JSON and its token.
    async fn session(&self, key: &str, headers: &[(&str, &str)], body: Value) -> (Value, String) {
        let (status, session) = self.call("POST", "/v1/portal-sessions", key, headers, Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{session}");
        let url = session["url"].as_str().unwrap();
        let after = url.split_once("#token=").expect("the token after #").1;
        let token = after.split('&').next().unwrap().to_owned();
        assert_eq!(after.contains("&read_only=1"), session["read_only"] == true, "{url}");
        (session, token)
    }
}

fn code(body: &Value) -> &str {
    body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error: {body}"))
}

#[tokio::test]
async fn given_a_portal_link_then_it_acts_for_its_tenant_as_the_dashboard_does_and_nothing_more() {
    let app = app(PortalConfig::default()).await;
    let (session, token) = app.session(&app.a, &[], json!({})).await;
    assert!(
        session["url"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:8080/portal#token=hwp_"),
        "{session}"
    );
    assert!(!session["url"].as_str().unwrap()[..session["url"].as_str().unwrap().find('#').unwrap()].contains("hwp_"));

    // Its tenant's endpoints and deliveries, as the dashboard shows them.
    let sub =
        json!({"url": "https://hooks.example.com/a", "event_types": ["*"], "retry_policy": {"schedule_seconds": []}});
    let (status, created) = app.call("POST", "/v1/subscriptions", &token, &[], Some(sub)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, _) = app.call("GET", "/v1/subscriptions", &token, &[], None).await;
    assert_eq!(status, StatusCode::OK);

    // Never events, the operator routes, or portal links of its own.
    let (status, body) = app
        .call(
            "POST",
            "/v1/events",
            &token,
            &[],
            Some(json!({"type": "a.b", "payload": {}})),
        )
        .await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "portal_cannot_send"));
    let batch = json!({"events": [{"type": "a.b", "payload": {}}]});
    let (status, body) = app.call("POST", "/v1/events/batch", &token, &[], Some(batch)).await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "portal_cannot_send"));
    for uri in ["/v1/tenants", "/v1/rollout", "/v1/operational-webhooks"] {
        let (status, body) = app.call("GET", uri, &token, &[], None).await;
        assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "operator_only"), "{uri}");
    }
    let (status, body) = app
        .call("POST", "/v1/portal-sessions", &token, &[], Some(json!({})))
        .await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "portal_cannot_mint"));

    // Another tenant's ids are not found; its name in the header is refused.
    let ev = {
        let (status, body) = app
            .call(
                "POST",
                "/v1/events",
                &app.b,
                &[],
                Some(json!({"type": "a.b", "payload": {}})),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        body
    };
    let (status, _) = app
        .call(
            "GET",
            &format!("/v1/events/{}", ev["id"].as_str().unwrap()),
            &token,
            &[],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn given_portal_links_then_a_read_only_one_changes_nothing_and_expired_or_revoked_ones_get_401() {
    let app = app(PortalConfig::default()).await;
    // Minted by the operator for tenant A: read-only, a minute.
    let tenant_a = app.call("GET", "/v1/subscriptions", &app.a, &[], None).await;
    assert_eq!(tenant_a.0, StatusCode::OK);
    let a_id = app.harness.services.authenticate(&app.a).await.unwrap().id.to_string();
    let (read_only, token) = app
        .session(
            &app.operator,
            &[("Hookwise-Tenant", &a_id)],
            json!({"read_only": true, "ttl_seconds": 60}),
        )
        .await;
    assert_eq!(read_only["read_only"], true);
    let (status, _) = app.call("GET", "/v1/deliveries", &token, &[], None).await;
    assert_eq!(status, StatusCode::OK);
    let sub = json!({"url": "https://hooks.example.com/a"});
    let (status, body) = app.call("POST", "/v1/subscriptions", &token, &[], Some(sub)).await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "read_only"));
    let (status, body) = app
        .call(
            "POST",
            "/v1/deliveries/dlv_01J0000000000000000000000A/replay",
            &token,
            &[],
            None,
        )
        .await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "read_only"));

    // Expired: 401.
    app.harness.clock.advance(Duration::seconds(61));
    let (status, _) = app.call("GET", "/v1/deliveries", &token, &[], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Revoked one at a time, then all at once.
    let (one, first) = app.session(&app.a, &[], json!({})).await;
    let (_, second) = app.session(&app.a, &[], json!({})).await;
    let (status, _) = app
        .call(
            "DELETE",
            &format!("/v1/portal-sessions/{}", one["id"].as_str().unwrap()),
            &app.a,
            &[],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.call("GET", "/v1/deliveries", &first, &[], None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.call("GET", "/v1/deliveries", &second, &[], None).await.0,
        StatusCode::OK
    );
    // Another tenant cannot revoke A's.
    let (_, third) = app.session(&app.a, &[], json!({})).await;
    let (status, _) = app
        .call(
            "DELETE",
            &format!("/v1/portal-sessions/{}", one["id"].as_str().unwrap()),
            &app.b,
            &[],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app.call("DELETE", "/v1/portal-sessions", &app.a, &[], None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for token in [&second, &third] {
        assert_eq!(
            app.call("GET", "/v1/deliveries", token, &[], None).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    app.harness.clock.advance(Duration::seconds(1));
    let (_, after) = app.session(&app.a, &[], json!({})).await;
    assert_eq!(
        app.call("GET", "/v1/deliveries", &after, &[], None).await.0,
        StatusCode::OK,
        "a new one works"
    );

    // Disabling the tenant ends its links; re-enabled, they stay dead.
    for status in ["disabled", "active"] {
        let (code, _) = app
            .call(
                "PATCH",
                &format!("/v1/tenants/{a_id}"),
                &app.operator,
                &[],
                Some(json!({"status": status})),
            )
            .await;
        assert_eq!(code, StatusCode::OK);
    }
    assert_eq!(
        app.call("GET", "/v1/deliveries", &after, &[], None).await.0,
        StatusCode::UNAUTHORIZED
    );

    let (status, body) = app
        .call(
            "POST",
            "/v1/portal-sessions",
            &app.a,
            &[],
            Some(json!({"ttl_seconds": 90000})),
        )
        .await;
    assert_eq!((status, code(&body)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_ttl"));
}

#[tokio::test]
async fn given_allowed_origins_then_only_the_portal_page_may_be_framed_by_them_and_it_carries_the_branding() {
    let portal = PortalConfig {
        frame_ancestors: vec!["https://app.example.com".into()],
        name: Some("Northwind Webhooks".into()),
        accent: Some("#0b7285".into()),
        ..PortalConfig::default()
    };
    let app = app(portal).await;
    let get = |uri: &'static str| {
        let router = app.router.clone();
        async move {
            let resp = router
                .oneshot(Request::get(uri).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let csp = resp
                .headers()
                .get("content-security-policy")
                .map(|v| v.to_str().unwrap().to_owned());
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
            (csp, String::from_utf8(bytes.to_vec()).unwrap())
        }
    };
    let (csp, _) = get("/portal").await;
    assert!(csp.unwrap().ends_with("frame-ancestors https://app.example.com"));
    let (csp, _) = get("/dashboard").await;
    assert!(
        csp.unwrap().ends_with("frame-ancestors 'none'"),
        "the dashboard is never framed"
    );
    let (_, branding) = get("/dashboard/branding.json").await;
    let branding: Value = serde_json::from_str(&branding).unwrap();
    assert_eq!(
        branding,
        json!({"name": "Northwind Webhooks", "accent": "#0b7285", "logo": null, "reveals_secrets": false})
    );
}

#[tokio::test]
async fn given_a_deployment_that_reveals_secrets_then_a_portal_link_shows_its_endpoints_secret_and_a_read_only_one_does_not(
) {
    let reveals = Config {
        reveal_secrets: true,
        ..Config::default()
    };
    let revealing = app_with(PortalConfig::default(), reveals).await;
    let (status, made) = revealing
        .call(
            "POST",
            "/v1/subscriptions",
            &revealing.a,
            &[],
            Some(json!({"url": "https://example.com/h"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let reveal = format!("/v1/subscriptions/{}/reveal-secret", made["id"].as_str().unwrap());
    let (_, token) = revealing.session(&revealing.a, &[], json!({})).await;
    let (status, shown) = revealing.call("POST", &reveal, &token, &[], Some(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["secret"], made["secret"]);
    assert!(shown["secret"].as_str().unwrap().starts_with("whsec_"));

    let (_, read_only) = revealing.session(&revealing.a, &[], json!({"read_only": true})).await;
    let (status, refused) = revealing.call("POST", &reveal, &read_only, &[], Some(json!({}))).await;
    assert_eq!((status, code(&refused)), (StatusCode::FORBIDDEN, "read_only"));
    let (status, refused) = revealing
        .call("POST", &reveal, &revealing.b, &[], Some(json!({})))
        .await;
    assert_eq!(
        (status, code(&refused)),
        (StatusCode::NOT_FOUND, "not_found"),
        "another tenant's"
    );

    // A deployment that does not reveal them says how to get a new one.
    let plain = app(PortalConfig::default()).await;
    let (_, made) = plain
        .call(
            "POST",
            "/v1/subscriptions",
            &plain.a,
            &[],
            Some(json!({"url": "https://example.com/h"})),
        )
        .await;
    let reveal = format!("/v1/subscriptions/{}/reveal-secret", made["id"].as_str().unwrap());
    let (status, refused) = plain.call("POST", &reveal, &plain.a, &[], Some(json!({}))).await;
    assert_eq!(
        (status, code(&refused)),
        (StatusCode::FORBIDDEN, "secrets_not_revealed")
    );
    assert!(
        refused["error"]["message"].as_str().unwrap().contains("rotate"),
        "{refused}"
    );
}
