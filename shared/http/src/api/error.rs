//! The API's one error shape: `{"error": {"code": "...", "message": "..."}}` with a status
//! that says whose mistake it was. A client's mistake is never a 500.

use std::borrow::Cow;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hookwise_core::{Error, PortError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: Cow<'static, str>,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn unprocessable(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn payload_too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the request body is larger than {} KB ({} KB for POST /v1/events/batch)",
                super::MAX_BODY_BYTES / 1024,
                super::MAX_BATCH_BODY_BYTES / 1024
            ),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(serde_json::json!({"error": {"code": self.code, "message": self.message}}));
        let mut response = (self.status, body).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        match err {
            Error::Validation(v) => Self::unprocessable(v.code, v.message),
            e @ Error::NotFound { .. } => Self::not_found(e.to_string()),
            Error::Conflict(message) => Self::new(StatusCode::CONFLICT, "conflict", message),
            Error::Unauthorized => Self::unauthorized("the API key is missing or unknown"),
            Error::Forbidden { code, message } => Self::new(StatusCode::FORBIDDEN, code, message),
            Error::Port(PortError::ConditionFailed(what)) => {
                tracing::info!(%what, "a concurrent change won");
                Self::new(
                    StatusCode::CONFLICT,
                    "conflict",
                    "the resource changed while the request ran; try again",
                )
            }
            Error::Port(PortError::InvalidCursor(cursor)) => Self::unprocessable(
                "invalid_cursor",
                format!("cursor `{cursor}` is not one this API returned: pass the `next_cursor` of a previous page"),
            ),
            Error::Port(e @ PortError::Retryable { .. }) => {
                tracing::warn!(error = %e, "retryable failure behind the API");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the service is briefly unavailable; try again",
                )
            }
            Error::Port(e @ PortError::Permanent { .. }) => {
                // The details are for the operator's log, not for the client.
                tracing::error!(error = %e, "permanent failure behind the API");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "an internal error occurred",
                )
            }
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;
    use hookwise_core::ValidationError;

    fn mapped(err: Error) -> (StatusCode, String, String) {
        let e = ApiError::from(err);
        (e.status, e.code.into_owned(), e.message)
    }

    #[test]
    fn given_core_errors_then_each_gets_its_status_and_code() {
        let (s, code, msg) = mapped(ValidationError::new("invalid_url", "`x` is not a valid endpoint URL").into());
        assert_eq!(
            (s, code.as_str(), msg.as_str()),
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_url",
                "`x` is not a valid endpoint URL"
            )
        );
        let (s, code, msg) = mapped(Error::not_found("event", "evt_1"));
        assert_eq!((s, code.as_str()), (StatusCode::NOT_FOUND, "not_found"));
        assert!(msg.contains("evt_1"));
        assert_eq!(mapped(Error::conflict("only dead deliveries")).0, StatusCode::CONFLICT);
        assert_eq!(mapped(Error::Unauthorized).0, StatusCode::UNAUTHORIZED);
        assert_eq!(
            mapped(PortError::ConditionFailed("moved".into()).into()).0,
            StatusCode::CONFLICT
        );
    }

    #[test]
    fn given_port_failures_then_retryable_is_503_and_permanent_is_500_without_details() {
        let (s, code, _) = mapped(PortError::retryable("dynamodb", "throttled").into());
        assert_eq!((s, code.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "unavailable"));
        let (s, code, msg) = mapped(PortError::permanent("sqlite", "disk image is malformed at /var/lib/x").into());
        assert_eq!((s, code.as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "internal"));
        assert!(!msg.contains("/var/lib"), "internals stay in the log: {msg}");
    }

    #[tokio::test]
    async fn given_an_error_then_the_body_is_the_one_json_shape() {
        let resp = ApiError::from(Error::Unauthorized).into_response();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(resp.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {"code": "unauthorized", "message": "the API key is missing or unknown"}})
        );
    }
}
