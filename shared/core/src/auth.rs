//! API keys: a tenant's (`hwk_`) and the operator's (`hwo_`), and portal sessions' tokens
//! (`hwp_`); each shown once, stored only as a SHA-256 hash.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine;
use rand::Rng;
use sha2::{Digest, Sha256};

pub const API_KEY_PREFIX: &str = "hwk_";
pub const OPERATOR_KEY_PREFIX: &str = "hwo_";
pub const PORTAL_TOKEN_PREFIX: &str = "hwp_";

/// Whose a key is, by its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// A tenant's: acts for that tenant alone.
    Tenant,
    /// The deployment's operator's: acts for any tenant.
    Operator,
    /// A customer's portal session's token: acts for its tenant, as the dashboard does.
    Portal,
}

impl KeyKind {
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Tenant => API_KEY_PREFIX,
            Self::Operator => OPERATOR_KEY_PREFIX,
            Self::Portal => PORTAL_TOKEN_PREFIX,
        }
    }
}

/// A new key of this kind: its prefix and 24 random bytes, base64url.
pub fn generate_key(kind: KeyKind, rng: &mut impl Rng) -> String {
    format!("{}{}", kind.prefix(), random_secret(rng))
}

/// 24 random bytes, base64url: a key's secret part (32 characters).
pub fn random_secret(rng: &mut impl Rng) -> String {
    let mut bytes = [0u8; 24];
    rng.fill(&mut bytes);
    B64URL.encode(bytes)
}

/// A new tenant API key.
pub fn generate_api_key(rng: &mut impl Rng) -> String {
    generate_key(KeyKind::Tenant, rng)
}

/// Whose `key` is, if it has the form of a key: a prefix, then 16 to 64 base64url characters
/// (a generated one has 32: 24 random bytes; `hookwise dev --api-key` may choose another).
/// Anything else is refused before any lookup, so a flood of junk keys costs no store reads.
pub fn key_kind(key: &str) -> Option<KeyKind> {
    [KeyKind::Tenant, KeyKind::Operator, KeyKind::Portal]
        .into_iter()
        .find(|kind| {
            key.strip_prefix(kind.prefix()).is_some_and(|rest| {
                (16..=64).contains(&rest.len())
                    && rest
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
        })
}

/// Whether `key` has the form of a tenant's API key.
pub fn is_well_formed(key: &str) -> bool {
    key_kind(key) == Some(KeyKind::Tenant)
}

/// What the store keeps and looks keys up by.
pub fn hash_api_key(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_junk_is_not() {
        let rng = &mut rand::rng();
        for _ in 0..100 {
            assert!(is_well_formed(&generate_api_key(rng)));
        }
        assert!(is_well_formed("hwk_my-dev-key-0123456789"));
        let operator = generate_key(KeyKind::Operator, rng);
        assert_eq!(key_kind(&operator), Some(KeyKind::Operator));
        assert!(!is_well_formed(&operator), "an operator key is no tenant's");
        let good = generate_api_key(rng);
        for junk in [
            "",
            "hwk_",
            "hwk_wrong",
            &format!("hwk_{}", "a".repeat(15)),
            &format!("hwk_{}", "a".repeat(65)),
            &good.replace("hwk_", "hwx_"),
            &format!("hwk_{}", "é".repeat(16)),
            &format!("{good}+"),
            &format!("{good} "),
        ] {
            assert!(!is_well_formed(junk), "{junk:?}");
        }
    }
}
