//! Newtypes that validate on parse, so the rest of the code never sees a bad URL, event
//! type, email or secret.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::ValidationError;

macro_rules! string_newtype {
    ($name:ident) => {
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::parse(&s)
            }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }
    };
}

/// An endpoint to POST webhooks to: absolute `http` or `https`, with a host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EndpointUrl(String);
string_newtype!(EndpointUrl);

impl EndpointUrl {
    pub const MAX_LEN: usize = 2048;

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let bad = |why: &str| ValidationError::new("invalid_url", format!("`{s}` is not a valid endpoint URL: {why}"));
        if s.len() > Self::MAX_LEN {
            return Err(bad("longer than 2048 characters"));
        }
        let url = url::Url::parse(s).map_err(|e| bad(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("the scheme must be http or https"));
        }
        match url.host() {
            None => return Err(bad("it has no host")),
            Some(url::Host::Domain(d)) if d.is_empty() || !valid_hostname(d) => {
                return Err(bad("the host must be a DNS name or an IP address"))
            }
            Some(_) => {}
        }
        if url.fragment().is_some() {
            return Err(bad("a fragment (#...) is never sent, so it is not allowed"));
        }
        Ok(Self(url.to_string()))
    }

    pub fn to_url(&self) -> url::Url {
        url::Url::parse(&self.0).expect("validated on parse")
    }
}

/// Letters, digits, `-` and `_` in dot-separated labels (what DNS can resolve).
fn valid_hostname(host: &str) -> bool {
    host.trim_end_matches('.').split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

/// An event type such as `invoice.paid`: dot-separated segments of letters, digits, `_`, `-`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EventType(String);
string_newtype!(EventType);

fn valid_segments(s: &str) -> bool {
    s.split('.')
        .all(|seg| !seg.is_empty() && seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
}

impl EventType {
    pub const MAX_LEN: usize = 128;

    /// One of Hookwise's own types (under [`HOOKWISE_PREFIX`]).
    pub fn is_hookwise(&self) -> bool {
        self.0.starts_with(HOOKWISE_PREFIX)
    }

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        if s.is_empty() || s.len() > Self::MAX_LEN || !valid_segments(s) {
            return Err(ValidationError::new(
                "invalid_event_type",
                format!("`{s}` is not a valid event type: use 1 to 128 characters of dot-separated segments of letters, digits, `_` and `-`, such as `invoice.paid`"),
            ));
        }
        Ok(Self(s.to_owned()))
    }
}

/// Which event types a subscription wants: `*` (all), an exact type, or a prefix such as
/// `invoice.*` (every type under `invoice.`). Hookwise's own types (under `hookwise.`) are
/// matched only by a filter that names them (`hookwise.*`, `hookwise.delivery.dead`): `*`
/// means every type the sending service sends.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EventTypeFilter(String);

/// Hookwise's own event types are under this prefix: its test pings and its operational
/// webhooks. A sending service may not send or define one.
pub const HOOKWISE_PREFIX: &str = "hookwise.";
string_newtype!(EventTypeFilter);

impl EventTypeFilter {
    pub fn all() -> Self {
        Self("*".into())
    }

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let ok = s == "*"
            || match s.strip_suffix(".*") {
                Some(prefix) => valid_segments(prefix),
                None => EventType::parse(s).is_ok(),
            };
        if !ok || s.len() > EventType::MAX_LEN {
            return Err(ValidationError::new(
                "invalid_event_type_filter",
                format!("`{s}` is not a valid event type filter: use `*`, an event type such as `invoice.paid`, or a prefix such as `invoice.*`"),
            ));
        }
        Ok(Self(s.to_owned()))
    }

    /// Whether it asks for Hookwise's own types (and so for no event about its own endpoint).
    pub fn names_hookwise(&self) -> bool {
        self.0.starts_with(HOOKWISE_PREFIX)
    }

    /// The one type it names, unless it is a pattern (`*`, `invoice.*`).
    pub fn exact(&self) -> Option<EventType> {
        match self.0.ends_with('*') {
            true => None,
            false => EventType::parse(&self.0).ok(),
        }
    }

    pub fn matches(&self, event_type: &EventType) -> bool {
        let t = event_type.as_str();
        if event_type.is_hookwise() && !self.names_hookwise() {
            return false;
        }
        match self.0.as_str() {
            "*" => true,
            f => match f.strip_suffix('*') {
                Some(prefix_with_dot) => t.starts_with(prefix_with_dot),
                None => f == t,
            },
        }
    }
}

/// An email address, checked for shape (one `@`, a dotted domain, no spaces).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Email(String);
string_newtype!(Email);

impl Email {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let bad = || ValidationError::new("invalid_email", format!("`{s}` is not a valid email address"));
        let (local, domain) = s.split_once('@').ok_or_else(bad)?;
        let domain_ok = domain.contains('.')
            && domain
                .split('.')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        let local_ok = !local.is_empty()
            && local.len() <= 64
            && !local.chars().any(|c| c.is_whitespace() || c == '@' || c.is_control());
        if s.len() > 254 || !local_ok || !domain_ok {
            return Err(bad());
        }
        Ok(Self(s.to_owned()))
    }
}

/// A Standard Webhooks signing secret: `whsec_` and the base64 of 24 to 64 random bytes.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Secret(String);
string_newtype!(Secret);

impl std::fmt::Debug for Secret {
    // Never print a secret, not even in a debug log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(whsec_…)")
    }
}

impl Secret {
    pub const PREFIX: &'static str = "whsec_";

    pub fn generate(rng: &mut impl Rng) -> Self {
        let mut key = [0u8; 32];
        rng.fill(&mut key);
        Self(format!("{}{}", Self::PREFIX, B64.encode(key)))
    }

    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let bad = |why: &str| ValidationError::new("invalid_secret", format!("not a valid signing secret: {why}"));
        let body = s
            .strip_prefix(Self::PREFIX)
            .ok_or_else(|| bad("it must start with `whsec_`"))?;
        let key = B64
            .decode(body)
            .map_err(|_| bad("the part after `whsec_` must be base64"))?;
        if !(24..=64).contains(&key.len()) {
            return Err(bad("the key must be 24 to 64 bytes"));
        }
        Ok(Self(s.to_owned()))
    }

    /// The HMAC key the secret encodes.
    pub fn key(&self) -> Vec<u8> {
        B64.decode(&self.0[Self::PREFIX.len()..]).expect("validated on parse")
    }
}

/// A signing secret as it is stored: an envelope a [`SecretKeeper`](crate::ports::SecretKeeper)
/// sealed (`<scheme>:<ciphertext>`, the scheme the keeper's), or, stored before secrets were
/// sealed, the secret itself (`whsec_…`), which is sealed on the subscription's next change.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SealedSecret(String);

impl std::fmt::Debug for SealedSecret {
    // The scheme only: an envelope is harmless, a legacy plain secret is not.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = self.0.split_once(':').map_or("whsec_", |(scheme, _)| scheme);
        write!(f, "SealedSecret({scheme}…)")
    }
}

impl SealedSecret {
    /// An envelope a keeper made.
    pub fn envelope(text: String) -> Self {
        Self(text)
    }

    /// A secret stored as it was before secrets were sealed: in plain text. For tests of what
    /// an older build left behind; nothing else stores one.
    #[cfg(any(test, feature = "testing"))]
    pub fn unsealed(secret: &Secret) -> Self {
        Self(secret.0.clone())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The secret, if it is stored in plain text (written before secrets were sealed).
    pub fn plain(&self) -> Option<Secret> {
        self.0
            .starts_with(Secret::PREFIX)
            .then(|| Secret::parse(&self.0).ok())
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_absolute_http_with_a_host() {
        assert!(EndpointUrl::parse("https://example.com/hooks").is_ok());
        assert!(EndpointUrl::parse("http://127.0.0.1:9000/x").is_ok());
        for bad in [
            "example.com",
            "ftp://example.com",
            "not a url",
            "https://",
            "https://a.com/#frag",
            "",
            "http://a*b/",
            "http://a..b/",
        ] {
            let err = EndpointUrl::parse(bad).unwrap_err();
            assert_eq!(err.code, "invalid_url", "{bad}");
        }
    }

    #[test]
    fn event_types_are_dotted_segments() {
        assert!(EventType::parse("invoice.paid").is_ok());
        assert!(EventType::parse("user_created-v2").is_ok());
        for bad in ["", "invoice..paid", ".x", "x.", "a b", "invoice.*", &"a".repeat(129)] {
            assert!(EventType::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn filters_match_all_exact_and_prefix() {
        let t = |s| EventType::parse(s).unwrap();
        let f = |s| EventTypeFilter::parse(s).unwrap();
        assert!(f("*").matches(&t("anything.at.all")));
        assert!(f("invoice.paid").matches(&t("invoice.paid")));
        assert!(!f("invoice.paid").matches(&t("invoice.paid.late")));
        assert!(f("invoice.*").matches(&t("invoice.paid")));
        assert!(f("invoice.*").matches(&t("invoice.paid.late")));
        assert!(!f("invoice.*").matches(&t("invoice")));
        assert!(!f("invoice.*").matches(&t("invoices.paid")));
        for bad in ["", "in*", "*.paid", "invoice.", "a..*"] {
            assert!(EventTypeFilter::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn emails_need_a_local_part_and_a_dotted_domain() {
        assert!(Email::parse("ops@example.com").is_ok());
        for bad in [
            "",
            "ops",
            "ops@",
            "@example.com",
            "ops@example",
            "o ps@example.com",
            "a@b@c.com",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_round_trip_and_are_never_printed() {
        let mut rng = rand::rng();
        let s = Secret::generate(&mut rng);
        assert_eq!(Secret::parse(s.as_str()).unwrap(), s);
        assert_eq!(s.key().len(), 32);
        assert!(!format!("{s:?}").contains(&s.as_str()[6..]));
        assert!(Secret::parse("whsec_").is_err());
        assert!(Secret::parse("sk_abc").is_err());
        assert!(Secret::parse("whsec_!!!").is_err());
    }
}
