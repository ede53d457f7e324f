//! The ingest function: the public API — the very [`hookwise_http::router`] that
//! `hookwise dev` serves with axum — given to `lambda_http::run` behind API Gateway's HTTP
//! API (payload format 2.0).

use std::sync::Arc;

use axum::Router;
use hookwise_core::services::Services;
use hookwise_http::{router, ApiState, PortalConfig};

/// The API on the services, its customer portal as the deployment set it.
pub fn app(services: Arc<Services>, portal: PortalConfig) -> Router {
    router(ApiState::new(services).with_portal(portal))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookwise_core::testing::memory::{Harness, ScriptedSender};
    use lambda_http::tower::ServiceExt;

    #[tokio::test]
    async fn given_the_sample_http_api_event_with_a_real_key_then_the_router_accepts_the_event() {
        let h = Harness::new(ScriptedSender::always(200));
        let (tenant, key) = h.tenant("owner@example.com").await;
        let sub = serde_json::json!({"url": "https://hooks.example.com/in", "event_types": ["invoice.*"]});
        h.services
            .create_subscription(&tenant, serde_json::from_value(sub).unwrap())
            .await
            .unwrap();
        let services = Arc::new(h.services);

        // API Gateway's payload 2.0, as lambda_http parses it on Lambda.
        let sample = include_str!("../../../infra/events/ingest-http-api.json")
            .replace("hwk_example_key_replace_me_000000", &key);
        let request = lambda_http::request::from_str(&sample).expect("an HTTP API v2 event");
        let response = app(services, PortalConfig::default()).oneshot(request).await.unwrap();
        assert_eq!(response.status(), 202);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["deliveries"].as_array().map(Vec::len), Some(1), "{json}");
        assert_eq!(h.queue.take_visible().len(), 1, "the delivery is queued");
    }
}
