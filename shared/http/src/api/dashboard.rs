//! What the Router serves besides JSON: the OpenAPI document and the dashboard. Both are
//! built into the binary, so they work wherever the API runs and fetch nothing from outside.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::HeaderName;
use axum::response::IntoResponse;

/// The checked-in OpenAPI 3.1 document of the whole API.
pub const OPENAPI_JSON: &str = include_str!("../../openapi.json");

const INDEX_HTML: &str = include_str!("../../dashboard/index.html");
const APP_JS: &str = include_str!("../../dashboard/app.js");
const APP_CSS: &str = include_str!("../../dashboard/app.css");

/// Scripts, styles and API calls from this origin only; no inline script; framed by
/// `frame_ancestors` (the dashboard: by none).
pub(super) fn csp(frame_ancestors: &str) -> String {
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors {frame_ancestors}"
    )
}

type Asset = ([(HeaderName, String); 5], &'static str);

fn asset(content_type: &'static str, body: &'static str) -> Asset {
    asset_with(content_type, body, csp("'none'"))
}

fn asset_with(content_type: &'static str, body: &'static str, csp: String) -> Asset {
    (
        [
            (CONTENT_TYPE, content_type.to_owned()),
            // Assets change with the binary; revalidating is cheap and avoids a stale page.
            (CACHE_CONTROL, "no-cache".to_owned()),
            (HeaderName::from_static("content-security-policy"), csp),
            (HeaderName::from_static("x-content-type-options"), "nosniff".to_owned()),
            // The page never puts a key in a URL, and sends no referrer anywhere either.
            (HeaderName::from_static("referrer-policy"), "no-referrer".to_owned()),
        ],
        body,
    )
}

/// The dashboard's page under another CSP (the portal's).
pub(super) fn page_with(csp: String) -> impl IntoResponse {
    asset_with("text/html; charset=utf-8", INDEX_HTML, csp)
}

pub async fn openapi() -> impl IntoResponse {
    asset("application/json", OPENAPI_JSON)
}

pub async fn page() -> impl IntoResponse {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

pub async fn script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", APP_JS)
}

pub async fn stylesheet() -> impl IntoResponse {
    asset("text/css; charset=utf-8", APP_CSS)
}
