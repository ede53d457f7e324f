//! API keys: shown once, stored only as a SHA-256 hash.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine;
use rand::Rng;
use sha2::{Digest, Sha256};

pub const API_KEY_PREFIX: &str = "hwk_";

pub fn generate_api_key(rng: &mut impl Rng) -> String {
    let mut bytes = [0u8; 24];
    rng.fill(&mut bytes);
    format!("{API_KEY_PREFIX}{}", B64URL.encode(bytes))
}

/// Whether `key` has the form of an API key: the prefix, then 16 to 64 base64url characters
/// (a generated one has 32: 24 random bytes; `hookwise dev --api-key` may choose another).
/// Anything else is refused before any lookup, so a flood of junk keys costs no store reads.
pub fn is_well_formed(key: &str) -> bool {
    key.strip_prefix(API_KEY_PREFIX).is_some_and(|rest| {
        (16..=64).contains(&rest.len())
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
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
