//! The public API: one axum [`Router`] for `hookwise dev` (`axum::serve`) and Lambda
//! (`lambda_http::run`). JSON in and out; every error is `{"error": {"code", "message"}}`.

mod error;
mod extract;
mod handlers;
mod views;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use hookwise_core::services::Services;
use tower_http::trace::TraceLayer;

pub use error::{ApiError, ApiResult};
pub use extract::{parse_json, ApiJson, Authenticated};
pub use views::*;

/// The largest request body accepted (the event payload limit): larger is 413.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// What every handler shares: the services, built once by the host.
#[derive(Clone)]
pub struct ApiState {
    pub services: Arc<Services>,
}

impl ApiState {
    pub fn new(services: Arc<Services>) -> Self {
        Self { services }
    }
}

/// The whole API. `GET /healthz` needs no key; everything under `/v1` needs
/// `Authorization: Bearer <api key>` and sees only that key's tenant.
pub fn router(state: ApiState) -> Router {
    use handlers::*;
    Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/v1/subscriptions",
            post(create_subscription).get(list_subscriptions),
        )
        .route(
            "/v1/subscriptions/{id}",
            get(get_subscription)
                .patch(update_subscription)
                .delete(delete_subscription),
        )
        .route("/v1/subscriptions/{id}/rotate-secret", post(rotate_secret))
        .route("/v1/subscriptions/{id}/recover", post(recover_subscription))
        .route("/v1/events", post(ingest_event))
        .route("/v1/events/{id}", get(get_event))
        .route("/v1/events/{id}/replay", post(replay_event))
        .route("/v1/deliveries", get(list_deliveries))
        .route("/v1/deliveries/{id}", get(get_delivery))
        .route("/v1/deliveries/{id}/replay", post(replay_delivery))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
