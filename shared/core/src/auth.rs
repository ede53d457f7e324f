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

/// What the store keeps and looks keys up by.
pub fn hash_api_key(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
