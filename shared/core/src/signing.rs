//! Standard Webhooks signatures (standardwebhooks.com): `v1,` and the base64 of
//! HMAC-SHA256 over `id.timestamp.body`, keyed by the secret's decoded bytes. While a
//! secret rotates, the header carries one signature per secret, separated by spaces.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::model::Secret;

/// How far a timestamp may be from now before verification refuses it.
pub const DEFAULT_TOLERANCE_SECONDS: i64 = 5 * 60;

fn mac(secret: &Secret, msg_id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&secret.key()).expect("HMAC takes a key of any length");
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// One signature: `v1,<base64>`.
pub fn sign(secret: &Secret, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    format!(
        "v1,{}",
        B64.encode(mac(secret, msg_id, timestamp, body).finalize().into_bytes())
    )
}

/// The `webhook-signature` header: one signature per active secret.
pub fn signature_header(secrets: &[Secret], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| sign(s, msg_id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the webhook-timestamp header is not a number")]
    BadTimestamp,
    #[error("the timestamp is more than {0} s from now")]
    OutsideTolerance(i64),
    #[error("no signature matches")]
    NoMatch,
}

/// Verify a received webhook as a consumer would: any `v1` signature in the header that
/// matches, with the timestamp within `tolerance_seconds` of `now_unix`.
pub fn verify(
    secret: &Secret,
    msg_id: &str,
    timestamp: &str,
    signatures: &str,
    body: &[u8],
    now_unix: i64,
    tolerance_seconds: i64,
) -> Result<(), VerifyError> {
    let ts: i64 = timestamp.trim().parse().map_err(|_| VerifyError::BadTimestamp)?;
    if (now_unix - ts).abs() > tolerance_seconds {
        return Err(VerifyError::OutsideTolerance(tolerance_seconds));
    }
    let expected = mac(secret, msg_id, ts, body);
    let matched = signatures
        .split_whitespace()
        .filter_map(|s| s.strip_prefix("v1,"))
        .any(|sig| {
            // verify_slice compares in constant time.
            B64.decode(sig)
                .is_ok_and(|bytes| expected.clone().verify_slice(&bytes).is_ok())
        });
    if matched {
        Ok(())
    } else {
        Err(VerifyError::NoMatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The test vector of the Standard Webhooks specification and its reference libraries.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: i64 = 1_614_265_330;
    const BODY: &str = r#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn secret() -> Secret {
        Secret::parse(SECRET).unwrap()
    }

    #[test]
    fn signs_the_specification_test_vector() {
        assert_eq!(sign(&secret(), MSG_ID, TIMESTAMP, BODY.as_bytes()), SIGNATURE);
    }

    #[test]
    fn verifies_within_tolerance_and_refuses_outside_it() {
        let ok = verify(
            &secret(),
            MSG_ID,
            "1614265330",
            SIGNATURE,
            BODY.as_bytes(),
            TIMESTAMP + 60,
            DEFAULT_TOLERANCE_SECONDS,
        );
        assert_eq!(ok, Ok(()));
        let late = verify(
            &secret(),
            MSG_ID,
            "1614265330",
            SIGNATURE,
            BODY.as_bytes(),
            TIMESTAMP + 301,
            DEFAULT_TOLERANCE_SECONDS,
        );
        assert_eq!(late, Err(VerifyError::OutsideTolerance(300)));
    }

    #[test]
    fn refuses_a_tampered_body_or_another_id() {
        let now = TIMESTAMP;
        assert_eq!(
            verify(&secret(), MSG_ID, "1614265330", SIGNATURE, b"{\"test\": 1}", now, 300),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            verify(
                &secret(),
                "msg_other",
                "1614265330",
                SIGNATURE,
                BODY.as_bytes(),
                now,
                300
            ),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            verify(&secret(), MSG_ID, "soon", SIGNATURE, BODY.as_bytes(), now, 300),
            Err(VerifyError::BadTimestamp)
        );
    }

    #[test]
    fn a_rotating_secret_signs_twice_and_either_verifies() {
        let old = secret();
        let new = Secret::generate(&mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1));
        let header = signature_header(&[new.clone(), old.clone()], MSG_ID, TIMESTAMP, BODY.as_bytes());
        assert_eq!(header.split(' ').count(), 2);
        for s in [&old, &new] {
            assert_eq!(
                verify(
                    s,
                    MSG_ID,
                    &TIMESTAMP.to_string(),
                    &header,
                    BODY.as_bytes(),
                    TIMESTAMP,
                    300
                ),
                Ok(())
            );
        }
    }
}
