//! The public API: one axum [`Router`] for `hookwise dev` (`axum::serve`) and Lambda
//! (`lambda_http::run`). JSON in and out; every error is `{"error": {"code", "message"}}`.
//! The same Router serves the dashboard (`/dashboard`) and the OpenAPI document
//! (`/v1/openapi.json`), so both work wherever the API does.

mod catalogue;
mod dashboard;
mod error;
mod extract;
mod handlers;
mod operator;
mod portal;
mod views;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{on, MethodFilter};
use axum::Router;
use hookwise_core::services::Services;
use tower_http::trace::TraceLayer;

pub use dashboard::OPENAPI_JSON;
pub use error::{ApiError, ApiResult};
pub use extract::{parse_json, ApiJson, Authenticated};
pub use portal::PortalConfig;
pub use views::*;

/// The largest request body accepted (the event payload limit): larger is 413.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// `POST /v1/events/batch`'s body: up to 100 events.
pub const MAX_BATCH_BODY_BYTES: usize = 1024 * 1024;

/// The longest one request may take, reading its body included: past it the client gets 408
/// and the connection is free, so a slow client cannot hold up shutdown.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn time_limit(request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::response::IntoResponse;
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!("the request took longer than {} s", REQUEST_TIMEOUT.as_secs()),
        )
        .into_response(),
    }
}

/// What every handler shares: the services, built once by the host, and the portal's
/// settings.
#[derive(Clone)]
pub struct ApiState {
    pub services: Arc<Services>,
    pub portal: Arc<PortalConfig>,
}

impl ApiState {
    /// The services, and a portal without framing or branding.
    pub fn new(services: Arc<Services>) -> Self {
        Self {
            services,
            portal: Arc::new(PortalConfig::default()),
        }
    }

    pub fn with_portal(self, portal: PortalConfig) -> Self {
        Self {
            portal: Arc::new(portal),
            ..self
        }
    }
}

/// The route table, written once: it builds the Router and lists [`ROUTES`], which the
/// spec-in-step test compares with `openapi.json` both ways.
macro_rules! route_table {
    ($($method:ident $path:literal => $handler:path $(, $layer:expr)?;)*) => {
        /// Every `(METHOD, path)` the Router serves, paths in axum's (and OpenAPI's) `{id}` form.
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        fn add_routes(router: Router<ApiState>) -> Router<ApiState> {
            router$(.route($path, on(MethodFilter::$method, $handler)$(.layer($layer))?))*
        }
    };
}

route_table! {
    GET    "/healthz"                              => handlers::healthz;
    GET    "/v1/openapi.json"                      => dashboard::openapi;
    GET    "/dashboard"                            => dashboard::page;
    GET    "/dashboard/app.js"                     => dashboard::script;
    GET    "/dashboard/app.css"                    => dashboard::stylesheet;
    GET    "/dashboard/branding.json"              => portal::branding;
    GET    "/portal"                               => portal::page;
    POST   "/v1/subscriptions"                     => handlers::create_subscription;
    GET    "/v1/subscriptions"                     => handlers::list_subscriptions;
    GET    "/v1/subscriptions/{id}"                => handlers::get_subscription;
    PATCH  "/v1/subscriptions/{id}"                => handlers::update_subscription;
    DELETE "/v1/subscriptions/{id}"                => handlers::delete_subscription;
    POST   "/v1/subscriptions/{id}/rotate-secret"  => handlers::rotate_secret;
    POST   "/v1/subscriptions/{id}/reveal-secret"  => handlers::reveal_secret;
    POST   "/v1/subscriptions/{id}/test"           => handlers::send_test;
    POST   "/v1/subscriptions/{id}/recover"        => handlers::recover_subscription;
    GET    "/v1/subscriptions/{id}/recover"        => handlers::preview_recover;
    GET    "/v1/subscriptions/{id}/stats"          => handlers::subscription_stats;
    POST   "/v1/events"                            => handlers::ingest_event;
    POST   "/v1/events/batch"                      => handlers::ingest_batch, DefaultBodyLimit::max(MAX_BATCH_BODY_BYTES);
    GET    "/v1/events/{id}"                       => handlers::get_event;
    POST   "/v1/events/{id}/replay"                => handlers::replay_event;
    GET    "/v1/deliveries"                        => handlers::list_deliveries;
    GET    "/v1/deliveries/{id}"                   => handlers::get_delivery;
    POST   "/v1/deliveries/{id}/replay"            => handlers::replay_delivery;
    POST   "/v1/event-types"                       => catalogue::create_event_type;
    GET    "/v1/event-types"                       => catalogue::list_event_types;
    GET    "/v1/event-types/{id}"                  => catalogue::get_event_type;
    PATCH  "/v1/event-types/{id}"                  => catalogue::update_event_type;
    GET    "/v1/tenant"                            => operator::current_tenant;
    POST   "/v1/tenants"                           => operator::create_tenant;
    GET    "/v1/tenants"                           => operator::list_tenants;
    GET    "/v1/tenants/{id}"                      => operator::get_tenant;
    PATCH  "/v1/tenants/{id}"                      => operator::update_tenant;
    POST   "/v1/tenants/{id}/api-keys"             => operator::create_tenant_key;
    DELETE "/v1/tenants/{id}/api-keys/{key_id}"    => operator::revoke_tenant_key;
    GET    "/v1/rollout"                           => operator::get_rollout;
    PUT    "/v1/rollout"                           => operator::set_rollout;
    GET    "/v1/operational-webhooks"              => operator::get_operations;
    PUT    "/v1/operational-webhooks"              => operator::set_operations;
    GET    "/v1/catalogue"                         => operator::get_catalogue_settings;
    PUT    "/v1/catalogue"                         => operator::set_catalogue_settings;
    POST   "/v1/portal-sessions"                   => portal::create_session;
    DELETE "/v1/portal-sessions"                   => portal::revoke_sessions;
    DELETE "/v1/portal-sessions/{id}"              => portal::revoke_session;
}

/// The whole API. `GET /healthz`, the OpenAPI document and the dashboard's assets need no
/// key; everything else under `/v1` needs `Authorization: Bearer <key>`: a tenant's key sees
/// only its tenant; an operator key acts for the tenant `Hookwise-Tenant` names, and alone
/// may use the operator routes (`/v1/tenants`, `/v1/rollout`, `/v1/operational-webhooks`,
/// `/v1/catalogue`).
pub fn router(state: ApiState) -> Router {
    add_routes(Router::new())
        .fallback(handlers::no_route)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .layer(axum::middleware::from_fn(time_limit))
        .with_state(state)
}
