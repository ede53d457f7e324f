//! Custom headers: static headers a subscription sends with every POST, for the receiver's
//! own gateway or routing (`Authorization`, `X-Tenant`...). A value marked sensitive is
//! stored sealed, as the signing secret is, and never shown again.

use serde::{Deserialize, Serialize};

use super::SealedSecret;
use crate::error::ValidationError;

/// At most this many custom headers per subscription.
pub const MAX_HEADERS: usize = 20;
pub const MAX_NAME_LEN: usize = 64;
pub const MAX_VALUE_LEN: usize = 1024;

/// Names Hookwise sets itself, or that belong to the connection rather than the request.
const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "user-agent",
    "idempotency-key",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "proxy-authorization",
    "proxy-connection",
];

/// A header name: an HTTP token, kept lowercase (names are case-insensitive).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HeaderName(String);
string_newtype!(HeaderName);

impl HeaderName {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let bad = |why: String| ValidationError::new("invalid_header", why);
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if s.is_empty() || s.len() > MAX_NAME_LEN || !s.chars().all(token) {
            return Err(bad(format!(
                "`{s}` is not a header name: 1 to {MAX_NAME_LEN} letters, digits or !#$%&'*+-.^_`|~"
            )));
        }
        let name = s.to_ascii_lowercase();
        if RESERVED.contains(&name.as_str()) || name.starts_with("webhook-") {
            return Err(bad(format!(
                "`{s}` is set by Hookwise or the connection, not by a subscription: \
                 not host, content-length, content-type, user-agent, idempotency-key, webhook-*, or a hop-by-hop header"
            )));
        }
        Ok(Self(name))
    }
}

/// A header value: visible ASCII and spaces, no line breaks.
pub fn check_value(name: &HeaderName, value: &str) -> Result<(), ValidationError> {
    let visible = |c: char| c == ' ' || c == '\t' || c.is_ascii_graphic();
    if value.is_empty() || value.len() > MAX_VALUE_LEN || !value.chars().all(visible) {
        return Err(ValidationError::new(
            "invalid_header",
            format!("the value of `{name}` must be 1 to {MAX_VALUE_LEN} visible ASCII characters or spaces"),
        ));
    }
    Ok(())
}

/// One custom header as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CustomHeader {
    pub name: HeaderName,
    #[serde(flatten)]
    pub value: HeaderValue,
}

/// A stored value: as written, or sealed ([`crate::ports::SecretKeeper::seal_text`] under
/// the subscription and the header's name) for a sensitive one.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderValue {
    Plain(String),
    Sealed(SealedSecret),
}

impl std::fmt::Debug for HeaderValue {
    // A sensitive value is never printed, not even sealed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Plain(v) => f.debug_tuple("Plain").field(v).finish(),
            Self::Sealed(_) => f.write_str("Sealed(…)"),
        }
    }
}

impl CustomHeader {
    pub fn is_sensitive(&self) -> bool {
        matches!(self.value, HeaderValue::Sealed(_))
    }

    /// The value as shown after it was written: a sensitive one masked.
    pub fn shown(&self) -> &str {
        match &self.value {
            HeaderValue::Plain(v) => v,
            HeaderValue::Sealed(_) => MASKED,
        }
    }
}

/// What a sensitive value reads as.
pub const MASKED: &str = "********";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_header_names_then_tokens_are_kept_lowercase_and_hookwises_own_are_refused() {
        assert_eq!(HeaderName::parse("X-Api-Key").unwrap().as_str(), "x-api-key");
        assert_eq!(HeaderName::parse("Authorization").unwrap().as_str(), "authorization");
        for bad in [
            "",
            "x api",
            "x:y",
            "Content-Type",
            "HOST",
            "webhook-id",
            "Webhook-Signature",
            "user-agent",
            "transfer-encoding",
        ] {
            let err = HeaderName::parse(bad).unwrap_err();
            assert_eq!(err.code, "invalid_header", "{bad}");
        }
        assert!(HeaderName::parse(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }

    #[test]
    fn given_values_then_line_breaks_and_control_characters_are_refused() {
        let name = HeaderName::parse("x-env").unwrap();
        assert!(check_value(&name, "prod eu-1").is_ok());
        for bad in [
            "",
            "a\r\nx-injected: 1",
            "a\nb",
            "\u{0}",
            "é",
            &"v".repeat(MAX_VALUE_LEN + 1),
        ] {
            assert!(check_value(&name, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn given_a_sealed_value_then_debug_and_shown_reveal_nothing() {
        let h = CustomHeader {
            name: HeaderName::parse("authorization").unwrap(),
            value: HeaderValue::Sealed(SealedSecret::envelope("local1:abc".into())),
        };
        assert_eq!(h.shown(), MASKED);
        assert!(!format!("{h:?}").contains("local1"));
        let stored = serde_json::to_value(&h).unwrap();
        assert_eq!(
            stored,
            serde_json::json!({"name": "authorization", "sealed": "local1:abc"})
        );
        assert_eq!(serde_json::from_value::<CustomHeader>(stored).unwrap(), h);
    }
}
