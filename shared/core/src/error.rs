//! Errors callers branch on. Permanent ones (validation, not found, conflict) are the
//! client's to fix; retryable ones are infrastructure (throttling, timeouts, 5xx) and must
//! reach SQS as a batch item failure rather than be swallowed.

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Input that does not parse: a stable machine code and a message a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    pub code: &'static str,
    pub message: String,
}

impl ValidationError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// What an adapter (store, queue, mailer) reports. The kind survives the mapping from the
/// SDK or SQLite error, so a stale message is told apart from throttling.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// A conditional write found the item in another state: a stale or duplicate message.
    #[error("condition failed: {0}")]
    ConditionFailed(String),
    /// Throttling, timeouts, 5xx, a busy database: trying again later may work.
    #[error("{what}: {source}")]
    Retryable {
        what: String,
        #[source]
        source: BoxError,
    },
    /// A listing cursor the store did not hand out: the caller's mistake, not the store's.
    #[error("`{0}` is not a cursor this API returned")]
    InvalidCursor(String),
    /// Misconfiguration, access denied, corrupt data: trying again will not help.
    #[error("{what}: {source}")]
    Permanent {
        what: String,
        #[source]
        source: BoxError,
    },
}

impl PortError {
    pub fn retryable(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Retryable {
            what: what.into(),
            source: source.into(),
        }
    }

    pub fn permanent(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Permanent {
            what: what.into(),
            source: source.into(),
        }
    }

    /// This error again, for one of several callers that a single failure answers: as
    /// retryable as it was (anything else is permanent for them), its message as the source.
    pub fn copy_for(&self, what: impl Into<String>) -> Self {
        match self {
            Self::Retryable { .. } => Self::retryable(what, self.to_string()),
            _ => Self::permanent(what, self.to_string()),
        }
    }
}

/// The error of a service call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error("{what} `{id}` not found")]
    NotFound { what: &'static str, id: String },
    #[error("{0}")]
    Conflict(String),
    /// No API key, or one that names no tenant.
    #[error("missing or unknown API key")]
    Unauthorized,
    /// A known caller that may not do this (a tenant key on an operator route, a disabled
    /// tenant): `code` says which.
    #[error("{message}")]
    Forbidden { code: &'static str, message: String },
    #[error(transparent)]
    Port(#[from] PortError),
}

impl Error {
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::Conflict(message.into())
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::Forbidden {
            code,
            message: message.into(),
        }
    }

    pub fn not_found(what: &'static str, id: impl ToString) -> Self {
        Self::NotFound {
            what,
            id: id.to_string(),
        }
    }

    /// Whether the same call may succeed later (SQS should redeliver the message).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Port(PortError::Retryable { .. }))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
