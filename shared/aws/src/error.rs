//! SDK errors to `PortError`, keeping their kind: a failed condition is a stale or duplicate
//! message, throttling / 5xx / timeouts / dispatch failures may pass, the rest will not.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_smithy_runtime_api::http::Response;
use aws_smithy_types::error::display::DisplayErrorContext;
use hookwise_core::PortError;

/// Error codes that mean "slow down" or "try again", across DynamoDB, SQS and SES.
const TRANSIENT_CODES: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "LimitExceededException",
    "TransactionConflictException",
    "TransactionInProgressException",
    "InternalServerError",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "RequestTimeout",
    "RequestTimeoutException",
    "AWS.SimpleQueueService.RequestThrottled",
    "KmsThrottled",
];

/// Whether a service error's code or HTTP status says a later try may work.
fn transient(code: Option<&str>, status: u16) -> bool {
    status >= 500 || status == 429 || code.is_some_and(|c| TRANSIENT_CODES.contains(&c))
}

/// The error as an operator needs it: the service's error code, HTTP status and message
/// (`SdkError`'s own Display says only "service error"), or for a timeout or a connection
/// failure the whole chain of causes. It is seen after the SDK's own retries (standard mode:
/// up to 3 attempts for throttling and transient errors).
pub(crate) fn describe<E>(err: &SdkError<E, Response>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match err {
        SdkError::ServiceError(service) => format!(
            "{} (HTTP {}): {}",
            service.err().code().unwrap_or("no error code"),
            service.raw().status().as_u16(),
            service.err().message().unwrap_or("no message")
        ),
        other => DisplayErrorContext(other).to_string(),
    }
}

/// Any operation's error.
pub(crate) fn classify<E>(what: &str, err: SdkError<E, Response>) -> PortError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let what = what.to_owned();
    let described = describe(&err);
    match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            PortError::retryable(what, described)
        }
        SdkError::ServiceError(service) => {
            let code = service.err().code();
            if code == Some("ConditionalCheckFailedException") {
                return PortError::ConditionFailed(format!(
                    "{what}: {}",
                    service.err().message().unwrap_or("condition failed")
                ));
            }
            if transient(code, service.raw().status().as_u16()) {
                PortError::retryable(what, described)
            } else {
                PortError::permanent(what, described)
            }
        }
        _ => PortError::permanent(what, described),
    }
}

/// A failed `TransactWriteItems`: which items' conditions failed, or the error it maps to.
pub(crate) enum TxFailure {
    /// Indexes (into the request's items) whose condition failed; empty when the service
    /// said "condition failed" without saying which.
    Condition(Vec<usize>),
    Other(PortError),
}

pub(crate) fn classify_transaction(what: &str, err: SdkError<TransactWriteItemsError, Response>) -> TxFailure {
    if let SdkError::ServiceError(service) = &err {
        if let TransactWriteItemsError::TransactionCanceledException(cancelled) = service.err() {
            let reasons = cancelled.cancellation_reasons();
            let failed: Vec<usize> = reasons
                .iter()
                .enumerate()
                .filter(|(_, r)| r.code() == Some("ConditionalCheckFailed"))
                .map(|(i, _)| i)
                .collect();
            if !failed.is_empty() {
                return TxFailure::Condition(failed);
            }
            let transient_reason = reasons.iter().any(|r| {
                matches!(
                    r.code(),
                    Some(
                        "TransactionConflict"
                            | "ThrottlingError"
                            | "ProvisionedThroughputExceeded"
                            | "RequestLimitExceeded"
                    )
                )
            });
            // Some emulators give no reasons, only the message DynamoDB writes them into.
            let message = cancelled.message().unwrap_or_default();
            if reasons.is_empty() && message.contains("ConditionalCheckFailed") {
                return TxFailure::Condition(Vec::new());
            }
            let described = format!("{} (reasons: {reasons:?})", describe(&err));
            if transient_reason || message.contains("TransactionConflict") {
                return TxFailure::Other(PortError::retryable(what, described));
            }
            return TxFailure::Other(PortError::permanent(what, described));
        }
    }
    TxFailure::Other(classify(what, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_and_server_errors_are_transient_and_validation_is_not() {
        assert!(transient(Some("ProvisionedThroughputExceededException"), 400));
        assert!(transient(Some("ThrottlingException"), 400));
        assert!(transient(None, 503));
        assert!(transient(Some("Whatever"), 500));
        assert!(!transient(Some("ValidationException"), 400));
        assert!(!transient(Some("AccessDeniedException"), 400));
        assert!(!transient(Some("ResourceNotFoundException"), 400));
    }

    fn service_error(
        code: &str,
        status: u16,
    ) -> SdkError<aws_sdk_dynamodb::operation::get_item::GetItemError, Response> {
        let meta = aws_smithy_types::error::ErrorMetadata::builder()
            .code(code)
            .message("slow down")
            .build();
        let raw = Response::new(
            aws_smithy_runtime_api::http::StatusCode::try_from(status).unwrap(),
            aws_smithy_types::body::SdkBody::empty(),
        );
        SdkError::service_error(aws_sdk_dynamodb::operation::get_item::GetItemError::generic(meta), raw)
    }

    #[test]
    fn given_throttling_then_the_error_names_the_aws_error_code_and_is_retryable() {
        let err = classify(
            "get delivery",
            service_error("ProvisionedThroughputExceededException", 400),
        );
        assert!(matches!(err, PortError::Retryable { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("ProvisionedThroughputExceededException"), "{text}");
        assert!(text.contains("HTTP 400") && text.contains("slow down"), "{text}");

        let err = classify("get delivery", service_error("AccessDeniedException", 400));
        assert!(matches!(err, PortError::Permanent { .. }), "{err:?}");
        assert!(err.to_string().contains("AccessDeniedException"), "{err}");
    }
}
