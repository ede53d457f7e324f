//! Extractors whose rejections speak the API's error shape: the tenant behind the bearer
//! key, a JSON body with the failing field named, query strings and ids in the path.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use hookwise_core::model::{Tenant, TenantId};
use hookwise_core::services::Caller;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::ApiState;

/// The header naming the tenant an operator key acts for.
pub const TENANT_HEADER: &str = "hookwise-tenant";

/// The tenant a request acts for: the one whose API key came as `Authorization: Bearer
/// <key>`, or, with an operator key, the one the `Hookwise-Tenant` header names.
pub struct Authenticated(pub Tenant);

impl<S> FromRequestParts<S> for Authenticated
where
    ApiState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let state = ApiState::from_ref(state);
        let caller = identify(parts, &state).await?;
        portal_may(parts, &caller)?;
        let named = named_tenant(parts)?;
        acting_for(&state, caller, named.as_ref()).await.map(Self)
    }
}

/// What a portal session may do: what its dashboard does. It sends no events, and a
/// read-only one changes nothing (no replay either).
fn portal_may(parts: &Parts, caller: &Caller) -> Result<(), ApiError> {
    let Caller::Portal { read_only, .. } = caller else {
        return Ok(());
    };
    let path = parts.uri.path().trim_end_matches('/');
    if parts.method == Method::POST && (path.ends_with("/v1/events") || path.ends_with("/v1/events/batch")) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "portal_cannot_send",
            "a portal session cannot send events",
        ));
    }
    if *read_only && !matches!(parts.method, Method::GET | Method::HEAD) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "read_only",
            "this portal session is read-only",
        ));
    }
    Ok(())
}

/// The tenant a caller acts for: a tenant key's or a portal session's own (a header naming
/// another is refused), or the one an operator key names.
pub async fn acting_for(state: &ApiState, caller: Caller, named: Option<&TenantId>) -> Result<Tenant, ApiError> {
    match (caller, named) {
        (Caller::Tenant(tenant) | Caller::Portal { tenant, .. }, None) => Ok(tenant),
        (Caller::Tenant(tenant) | Caller::Portal { tenant, .. }, Some(id)) if *id == tenant.id => Ok(tenant),
        (Caller::Tenant(tenant) | Caller::Portal { tenant, .. }, Some(id)) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "tenant_mismatch",
            format!(
                "this key acts for tenant `{}` alone, not `{id}` (only an operator key names its tenant)",
                tenant.id
            ),
        )),
        (Caller::Operator, Some(id)) => Ok(state.services.tenant_for_operator(id).await?),
        (Caller::Operator, None) => Err(ApiError::bad_request(
            "tenant_required",
            "an operator key acts for the tenant the `Hookwise-Tenant` header names: name one",
        )),
    }
}

/// A caller of the operator routes (`/v1/tenants`, `/v1/rollout`, `/v1/operational-webhooks`, `/v1/catalogue`): an operator key.
pub struct Operator;

impl<S> FromRequestParts<S> for Operator
where
    ApiState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match identify(parts, &ApiState::from_ref(state)).await? {
            Caller::Operator => Ok(Self),
            Caller::Tenant(_) | Caller::Portal { .. } => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "operator_only",
                "this route takes an operator key (`hookwise operator create-key`), not a tenant's",
            )),
        }
    }
}

/// Who called, with the tenant the header names if any: for a route where each item may
/// name its own (`POST /v1/events/batch`).
pub struct Identified {
    pub caller: Caller,
    pub named: Option<TenantId>,
}

impl<S> FromRequestParts<S> for Identified
where
    ApiState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let caller = identify(parts, &ApiState::from_ref(state)).await?;
        portal_may(parts, &caller)?;
        Ok(Self {
            caller,
            named: named_tenant(parts)?,
        })
    }
}

/// The caller behind the bearer key: a tenant or the operator.
async fn identify(parts: &Parts, state: &ApiState) -> Result<Caller, ApiError> {
    let how = "send your API key as `Authorization: Bearer <key>`";
    let header = parts
        .headers
        .get(AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized(format!("no API key: {how}")))?;
    let value = header
        .to_str()
        .map_err(|_| ApiError::unauthorized(format!("unreadable Authorization header: {how}")))?;
    let key = match value.trim().split_once(' ') {
        Some((scheme, key)) if scheme.eq_ignore_ascii_case("bearer") && !key.trim().is_empty() => key.trim(),
        _ => {
            return Err(ApiError::unauthorized(format!(
                "the Authorization header is not a bearer token: {how}"
            )))
        }
    };
    match state.services.identify(key).await {
        Ok(caller) => Ok(caller),
        Err(hookwise_core::Error::Unauthorized) => Err(ApiError::unauthorized("unknown API key")),
        Err(e) => Err(e.into()),
    }
}

/// The tenant `Hookwise-Tenant` names, if the header is there.
fn named_tenant(parts: &Parts) -> Result<Option<TenantId>, ApiError> {
    let Some(value) = parts.headers.get(TENANT_HEADER) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default().trim();
    TenantId::parse(text)
        .map(Some)
        .map_err(|e| ApiError::bad_request("invalid_tenant_header", format!("Hookwise-Tenant: {}", e.message)))
}

/// A JSON body. Syntax errors are 400; a body that parses but does not fit (wrong types,
/// missing or unknown fields, invalid values) is 422 naming the field.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if let Some(ct) = req.headers().get(CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or_default().to_ascii_lowercase();
            let mime = ct.split(';').next().unwrap_or_default().trim();
            if !(mime == "application/json" || mime.ends_with("+json")) {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    format!("the body must be JSON, sent with `Content-Type: application/json` (got `{mime}`)"),
                ));
            }
        }
        let bytes = Bytes::from_request(req, state).await.map_err(body_rejection)?;
        parse_json(&bytes).map(Self)
    }
}

/// A JSON body that may be left out: none (or only whitespace) is `None`; else as [`ApiJson`].
pub struct OptionalJson<T>(pub Option<T>);

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(body_rejection)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(None));
        }
        let ApiJson(value) = ApiJson::from_request(Request::from_parts(parts, bytes.into()), state).await?;
        Ok(Self(Some(value)))
    }
}

fn body_rejection(r: BytesRejection) -> ApiError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::payload_too_large()
    } else {
        ApiError::bad_request("unreadable_body", r.body_text())
    }
}

/// Bytes to `T` in two steps, so a syntax error (400) is told apart from a misfit (422).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "malformed_json",
            "the request body is empty: send a JSON object",
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request("malformed_json", format!("the request body is not valid JSON: {e}")))?;
    parse_value(value, "the request body")
}

/// A JSON object (`what` names it in the error) to `T`: 422 if it does not fit.
pub fn parse_value<T: DeserializeOwned>(mut value: serde_json::Value, what: &str) -> Result<T, ApiError> {
    let Some(fields) = value.as_object_mut() else {
        return Err(ApiError::unprocessable(
            "invalid_body",
            format!("{what} must be a JSON object"),
        ));
    };
    // Event payloads are the customer's data and go out exactly as they came in (a batch's
    // events are parsed one by one, each the same way).
    for (_, field) in fields
        .iter_mut()
        .filter(|(name, _)| !matches!(name.as_str(), "payload" | "events"))
    {
        whole_numbers_as_integers(field);
    }
    serde_path_to_error::deserialize(&value).map_err(misfit)
}

/// JSON has one number type: `94.0` is the integer 94 to JSON Schema and to many clients
/// (Python's `json.dumps(94.0)`), while serde refuses it for a `u32`. Whole numbers small
/// enough to be exact become integers, so `"timeout_ms": 5000.0` means 5000.
fn whole_numbers_as_integers(value: &mut serde_json::Value) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    match value {
        serde_json::Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < EXACT) {
                *value = if f >= 0.0 {
                    serde_json::Value::from(f as u64)
                } else {
                    serde_json::Value::from(f as i64)
                };
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        serde_json::Value::Object(map) => map.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
    }
}

/// The error for a body that is JSON but not the expected shape, with a code that matches
/// the core's validation codes where a field has one.
fn misfit(err: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = err.path().to_string();
    let message = err.inner().to_string();
    let field = path.split(['.', '[']).next().unwrap_or_default();
    if field == "retry_policy" {
        if message.starts_with("unknown retry policy") {
            return ApiError::unprocessable("unknown_retry_policy", message);
        }
        return ApiError::unprocessable("invalid_retry_policy", format!("`{path}`: {message}"));
    }
    if message.starts_with("unknown field") {
        return ApiError::unprocessable("unknown_field", message);
    }
    if message.starts_with("missing field") {
        let at = if path == "." {
            String::new()
        } else {
            format!(" in `{path}`")
        };
        return ApiError::unprocessable("missing_field", format!("{message}{at}"));
    }
    let code = match field {
        "url" => "invalid_url",
        "type" => "invalid_event_type",
        "event_types" => "invalid_event_type_filter",
        "owner_email" => "invalid_email",
        "timeout_ms" => "invalid_timeout",
        "rate_limit_per_second" => "invalid_rate_limit",
        "auto_disable_after_hours" => "invalid_auto_disable",
        "circuit_breaker" => "invalid_circuit_breaker",
        "description" => "invalid_description",
        "status" => "invalid_status",
        "payload" => "invalid_payload",
        "since" => "invalid_since",
        "id" | "tenant" => "invalid_id",
        "name" => "invalid_name",
        "retries" => "invalid_retries",
        "retries_percent" => "invalid_percent",
        "filter" => "invalid_filter",
        "headers" => "invalid_header",
        _ => "invalid_body",
    };
    ApiError::unprocessable(code, format!("`{path}`: {message}"))
}

/// A query string; a malformed one is 400.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Self(q.0))
            .map_err(|r: QueryRejection| ApiError::bad_request("invalid_query", r.body_text()))
    }
}

/// An id from the path. One that is not even well-formed names nothing: 404.
pub fn path_id<T>(raw: &str, parse: fn(&str) -> Result<T, hookwise_core::ValidationError>) -> Result<T, ApiError> {
    parse(raw).map_err(|e| ApiError::not_found(e.message))
}

/// A route's two segments (`{id}` and `{key_id}`), still unparsed.
pub struct PathPair(pub String, pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathPair {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map(|p| Self(p.0 .0, p.0 .1))
            .map_err(|r| ApiError::not_found(r.body_text()))
    }
}

/// The one `{id}` segment of a route, still unparsed (see [`path_id`]).
pub struct PathId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|p| Self(p.0))
            .map_err(|r| ApiError::not_found(r.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, serde::Deserialize)]
    struct Body {
        timeout_ms: u32,
        delays: Vec<u64>,
        offset: i64,
        payload: serde_json::Value,
    }

    #[test]
    fn given_whole_numbers_written_as_floats_then_they_parse_as_integers_but_the_payload_is_untouched() {
        let b: Body =
            parse_json(br#"{"timeout_ms": 5000.0, "delays": [1.0, 2], "offset": -3.0, "payload": {"amount": 1.0}}"#)
                .unwrap();
        assert_eq!((b.timeout_ms, b.delays, b.offset), (5000, vec![1, 2], -3));
        assert_eq!(b.payload, json!({"amount": 1.0}));
        assert!(b.payload["amount"].is_f64());
    }

    #[test]
    fn given_a_fraction_then_it_is_still_refused_for_an_integer_field() {
        let err =
            parse_json::<Body>(br#"{"timeout_ms": 5000.5, "delays": [], "offset": 0, "payload": {}}"#).unwrap_err();
        assert_eq!(err.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(err.message.contains("timeout_ms"), "{}", err.message);
    }
}
