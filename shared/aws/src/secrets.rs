//! Signing secrets, and header values marked sensitive, sealed with the stack's KMS key
//! (`SecretsKey` in template.yaml): KMS `Encrypt` and `Decrypt` with the subscription's tenant
//! and id (and a header value's header name) as the encryption context, so a table reader, an
//! export or a restore sees no secret, and an envelope copied onto another subscription (or
//! header, or from a header to the signing secret) does not open. Ingest may only seal;
//! Deliver seals and opens, and no other principal may open (the key's policy).
//!
//! An envelope is `kms1:` and the base64 of KMS's ciphertext blob (which names the key).
//! A warm Deliver keeps what it opened for [`KEEP_FOR`]: one `Decrypt` per subscription and
//! secret (or header value) every 15 minutes, not one per delivery.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::Client;
use aws_smithy_types::base64;
use hookwise_core::model::SealedSecret;
use hookwise_core::ports::{PortResult, SecretContext, SecretKeeper};
use hookwise_core::PortError;

use crate::error::classify;
use crate::lazy_client::LazyClient;

const SCHEME: &str = "kms1:";
/// How long an opened secret (or header value) is used without asking KMS again: a key
/// disabled or a grant revoked stops signing within this. (At $0.03 per 10,000 requests, 100 subscriptions
/// on 5 warm containers make 1.5 million a month: $4.40.)
const KEEP_FOR: Duration = Duration::from_secs(15 * 60);
/// The most opened secrets and header values kept (two secrets per subscription at most, and
/// its sensitive headers' values).
const MAX_KEPT: usize = 10_000;

/// What an opened text is kept under: the whole context and the envelope, so that an
/// envelope opens from what is kept under its own context only.
type KeptId = (SecretContext, String);

#[derive(Clone, Debug)]
pub struct KmsSecrets {
    client: LazyClient<Client>,
    /// The key's ARN (or id, or alias): what seals, and the only key an envelope opens with.
    key: String,
    opened: Arc<Mutex<HashMap<KeptId, (Instant, String)>>>,
}

impl KmsSecrets {
    pub fn new(client: impl Into<LazyClient<Client>>, key: &str) -> Self {
        Self {
            client: client.into(),
            key: key.to_owned(),
            opened: Arc::default(),
        }
    }

    fn kept(&self, id: &KeptId) -> Option<String> {
        let opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        opened
            .get(id)
            .filter(|(at, _)| at.elapsed() < KEEP_FOR)
            .map(|(_, text)| text.clone())
    }

    fn keep(&self, id: KeptId, text: &str) {
        let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        if opened.len() >= MAX_KEPT {
            opened.retain(|_, (at, _)| at.elapsed() < KEEP_FOR);
            if opened.len() >= MAX_KEPT {
                opened.clear();
            }
        }
        opened.insert(id, (Instant::now(), text.to_owned()));
    }
}

fn context_map(context: &SecretContext) -> HashMap<String, String> {
    context
        .pairs()
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

#[async_trait]
impl SecretKeeper for KmsSecrets {
    async fn seal_text(&self, text: &str, context: &SecretContext) -> PortResult<SealedSecret> {
        let out = self
            .client
            .encrypt()
            .key_id(&self.key)
            .plaintext(Blob::new(text.as_bytes()))
            .set_encryption_context(Some(context_map(context)))
            .send()
            .await
            .map_err(|e| classify("seal secret (KMS Encrypt)", e))?;
        let blob = out
            .ciphertext_blob()
            .ok_or_else(|| PortError::permanent("seal secret (KMS Encrypt)", "KMS answered no ciphertext"))?;
        Ok(SealedSecret::envelope(format!(
            "{SCHEME}{}",
            base64::encode(blob.as_ref())
        )))
    }

    async fn open_text(&self, sealed: &SealedSecret, context: &SecretContext) -> PortResult<String> {
        // The context is part of what is kept: an envelope opens under its own only.
        let id = (context.clone(), sealed.as_str().to_owned());
        if let Some(text) = self.kept(&id) {
            return Ok(text);
        }
        let refused = |why: &str| PortError::permanent("open secret (KMS Decrypt)", why.to_owned());
        let blob = sealed
            .as_str()
            .strip_prefix(SCHEME)
            .and_then(|b64| base64::decode(b64).ok())
            .ok_or_else(|| refused("not an envelope of KMS's kind (`kms1:`)"))?;
        let out = self
            .client
            .decrypt()
            .key_id(&self.key)
            .ciphertext_blob(Blob::new(blob))
            .set_encryption_context(Some(context_map(context)))
            .send()
            .await
            .map_err(|e| {
                // The envelope is at fault only here (damaged, or sealed for another
                // subscription or header); anything else (another key configured, the key disabled
                // or pending deletion, access denied, KMS down) an operator can fix, and then it
                // opens.
                let never = e
                    .as_service_error()
                    .is_some_and(|e| e.is_invalid_ciphertext_exception());
                match classify("open secret (KMS Decrypt)", e) {
                    PortError::Permanent { what, source } if !never => PortError::Retryable { what, source },
                    other => other,
                }
            })?;
        let text = out
            .plaintext()
            .and_then(|p| String::from_utf8(p.as_ref().to_vec()).ok())
            .ok_or_else(|| refused("it holds no text"))?;
        self.keep(id, &text);
        Ok(text)
    }
}
