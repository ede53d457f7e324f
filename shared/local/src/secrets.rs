//! Signing secrets, and header values marked sensitive, sealed at rest: AES-256-GCM under a
//! key kept in `<data-dir>/secrets.key` (mode 0600), beside the database and never in it, so
//! the database file alone (a copy, a backup) reveals no secret. The subscription's tenant and
//! id (and a header value's header name) are the associated data: an envelope copied onto
//! another subscription (or header, or from a header to the signing secret) does not open.
//!
//! An envelope is `local1:` and the base64 of the 12-byte nonce followed by the ciphertext.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hookwise_core::model::SealedSecret;
use hookwise_core::ports::{PortResult, SecretContext, SecretKeeper};
use hookwise_core::PortError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::LocalBackend;

/// The key file's name in the data dir.
pub const KEY_FILE: &str = "secrets.key";
const SCHEME: &str = "local1:";
const NONCE_LEN: usize = 12;

/// The key that seals a data dir's secrets, and where its nonces come from.
pub(crate) struct SecretsKey {
    cipher: Aes256Gcm,
    rng: Mutex<StdRng>,
}

impl SecretsKey {
    fn new(key: [u8; 32]) -> Self {
        Self {
            cipher: Aes256Gcm::new(&Key::<Aes256Gcm>::from(key)),
            rng: Mutex::new(StdRng::from_os_rng()),
        }
    }

    /// A key of its own, kept nowhere: for a database in memory.
    pub(crate) fn random() -> Self {
        Self::new(StdRng::from_os_rng().random())
    }

    /// The data dir's key, made now if it has none. `sample` is a few secrets the database
    /// holds sealed: the key must open one of them (a key file from another data dir opens
    /// none), and must not be missing while there are any (a new key would open none either).
    pub(crate) fn for_data_dir(data_dir: &Path, sample: &[(SecretContext, SealedSecret)]) -> PortResult<Self> {
        let path = data_dir.join(KEY_FILE);
        let failed = |what: &str, e: std::io::Error| PortError::permanent(format!("{what} {}", path.display()), e);
        let key = match std::fs::read_to_string(&path) {
            Ok(text) => Self::from_text(&text).map_err(|why| failed("read the secrets key", why))?,
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(failed("read the secrets key", e)),
            Err(_) if !sample.is_empty() => {
                return Err(PortError::permanent(
                    "open the data dir",
                    format!(
                        "{} is missing, and the database holds signing secrets sealed with it: restore it from \
                         the data dir's backup (without it those subscriptions can never sign again; to start \
                         afresh, move {} aside)",
                        path.display(),
                        crate::DB_FILE
                    ),
                ))
            }
            Err(_) => Self::create(data_dir, &path).map_err(|e| failed("write the secrets key", e))?,
        };
        if !sample.is_empty()
            && !sample
                .iter()
                .any(|(context, sealed)| key.open_text(sealed, context).is_ok())
        {
            return Err(PortError::permanent(
                "open the data dir",
                format!(
                    "{} does not open the signing secrets in {}: it is not the key they were sealed \
                     with (another data dir's?); restore this data dir's own",
                    path.display(),
                    crate::DB_FILE
                ),
            ));
        }
        Ok(key)
    }

    /// A new key at `path`: written whole under a name of its own, then linked into place,
    /// so that a process opening the data dir at the same time reads a whole key, and
    /// whichever links first wins (the other reads the winner's).
    fn create(data_dir: &Path, path: &Path) -> std::io::Result<Self> {
        let key: [u8; 32] = StdRng::from_os_rng().random();
        let n: u64 = StdRng::from_os_rng().random();
        let temp = data_dir.join(format!("{KEY_FILE}.{}-{n:016x}.tmp", std::process::id()));
        let linked =
            write_private(&temp, &format!("{}\n", B64.encode(key))).and_then(|()| std::fs::hard_link(&temp, path));
        let _ = std::fs::remove_file(&temp);
        let key = match linked {
            Ok(()) => Self::new(key),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Self::from_text(&std::fs::read_to_string(path)?)?
            }
            Err(e) => return Err(e),
        };
        // The key must outlive a crash whenever a secret sealed with it does.
        std::fs::File::open(data_dir)?.sync_all()?;
        Ok(key)
    }

    fn from_text(text: &str) -> std::io::Result<Self> {
        let bad = || std::io::Error::other("not the base64 of a 32-byte key");
        let key: [u8; 32] = B64
            .decode(text.trim())
            .ok()
            .and_then(|k| k.try_into().ok())
            .ok_or_else(bad)?;
        Ok(Self::new(key))
    }

    fn seal_text(&self, text: &str, context: &SecretContext) -> PortResult<SealedSecret> {
        let nonce: [u8; NONCE_LEN] = self.rng.lock().unwrap_or_else(|p| p.into_inner()).random();
        let aad = associated_data(context);
        let sealed = self
            .cipher
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: text.as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| PortError::permanent("seal secret", "AES-GCM refused to encrypt"))?;
        let mut envelope = nonce.to_vec();
        envelope.extend(sealed);
        Ok(SealedSecret::envelope(format!("{SCHEME}{}", B64.encode(envelope))))
    }

    fn open_text(&self, sealed: &SealedSecret, context: &SecretContext) -> PortResult<String> {
        let refused = |why: &str| PortError::permanent("open secret", why.to_owned());
        let bytes = sealed
            .as_str()
            .strip_prefix(SCHEME)
            .and_then(|b64| B64.decode(b64).ok())
            .filter(|b| b.len() > NONCE_LEN)
            .ok_or_else(|| refused("not an envelope of this data dir's kind (`local1:`)"))?;
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().expect("split at its length");
        let aad = associated_data(context);
        let plain = self
            .cipher
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| refused("it does not open with this data dir's key for this subscription or header"))?;
        String::from_utf8(plain).map_err(|_| refused("it holds no text"))
    }
}

/// The context as `name=value` lines (ids hold neither `=` nor a line break, nor does a header
/// name). A signing secret's (no header) is `tenant=…\nsubscription=…\n`, as it always was.
fn associated_data(context: &SecretContext) -> String {
    context
        .pairs()
        .iter()
        .map(|(name, value)| format!("{name}={value}\n"))
        .collect()
}

/// A new file only its owner may read, synced to disk.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

#[async_trait]
impl SecretKeeper for LocalBackend {
    async fn seal_text(&self, text: &str, context: &SecretContext) -> PortResult<SealedSecret> {
        self.inner.secrets.seal_text(text, context)
    }

    async fn open_text(&self, sealed: &SealedSecret, context: &SecretContext) -> PortResult<String> {
        self.inner.secrets.open_text(sealed, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookwise_core::model::{Secret, SubscriptionId, TenantId};

    fn context() -> SecretContext {
        SecretContext::new(
            &TenantId::parse("ten_01J0000000000000000000000A").unwrap(),
            &SubscriptionId::parse("sub_01J0000000000000000000000A").unwrap(),
        )
    }

    fn dir() -> std::path::PathBuf {
        let n: u64 = StdRng::from_os_rng().random();
        let dir = std::env::temp_dir().join(format!("hookwise-key-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_key_file_is_made_once_private_and_read_back_after() {
        let dir = dir();
        let first = SecretsKey::for_data_dir(&dir, &[]).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join(KEY_FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let context = context();
        let secret = Secret::generate(&mut StdRng::from_os_rng());
        let sealed = first.seal_text(secret.as_str(), &context).unwrap();
        let again = SecretsKey::for_data_dir(&dir, &[(context.clone(), sealed.clone())]).unwrap();
        assert_eq!(
            again.open_text(&sealed, &context).unwrap(),
            secret.as_str(),
            "the same key read back"
        );
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_damaged_or_foreign_key_is_refused_once_secrets_are_sealed_with_it() {
        let (mine, dir) = (SecretsKey::random(), dir());
        let context = context();
        let sample = (
            context.clone(),
            mine.seal_text(Secret::generate(&mut StdRng::from_os_rng()).as_str(), &context)
                .unwrap(),
        );
        let err = SecretsKey::for_data_dir(&dir, std::slice::from_ref(&sample))
            .err()
            .expect("refused");
        assert!(err.to_string().contains("secrets.key is missing"), "{err}");
        assert!(!dir.join(KEY_FILE).exists(), "no new key made");
        SecretsKey::for_data_dir(&dir, &[]).unwrap();
        let err = SecretsKey::for_data_dir(&dir, &[sample]).err().expect("refused");
        assert!(
            err.to_string().contains("is not the key they were sealed with"),
            "{err}"
        );
        std::fs::write(dir.join(KEY_FILE), "not a key\n").unwrap();
        let err = SecretsKey::for_data_dir(&dir, &[]).err().expect("refused");
        assert!(err.to_string().contains("32-byte key"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A key file's text, and a secret sealed with it (by Python's `cryptography`, not by this
    /// code) under [`context`] with the associated data as it was before header values were
    /// sealed: `tenant=…\nsubscription=…\n`.
    const OLD_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n";
    const OLD_SECRET: &str = "whsec_yMnKy8zNzs/Q0dLT1NXW19jZ2tvc3d7f4OHi4+Tl5uc=";
    const OLD_ENVELOPE: &str = concat!(
        "local1:ZGVmZ2hpamtsbW5vP3OtAxq2L9NQKSbQoCsQjm2TNm7HOMI8/4adcZH5lzziinOk",
        "e3SvS7WaTBSpLv+6eGZ/+wzbMpA8uv46gmqfKbw+"
    );

    #[tokio::test]
    async fn a_secret_sealed_before_header_values_were_still_opens_and_for_its_own_subscription_only() {
        assert_eq!(
            associated_data(&context()),
            "tenant=ten_01J0000000000000000000000A\nsubscription=sub_01J0000000000000000000000A\n"
        );
        let key = SecretsKey::from_text(OLD_KEY).unwrap();
        let sealed = SealedSecret::envelope(OLD_ENVELOPE.to_owned());
        assert_eq!(key.open_text(&sealed, &context()).unwrap(), OLD_SECRET);
        for other in [context().with_header("authorization"), {
            let mut c = context();
            c.subscription = SubscriptionId::parse("sub_01J0000000000000000000000B").unwrap();
            c
        }] {
            assert!(
                matches!(key.open_text(&sealed, &other), Err(PortError::Permanent { .. })),
                "opened under {other:?}"
            );
        }
        // Through the trait too: `open` still gives the secret.
        struct Keeper(SecretsKey);
        #[async_trait]
        impl SecretKeeper for Keeper {
            async fn seal_text(&self, text: &str, context: &SecretContext) -> PortResult<SealedSecret> {
                self.0.seal_text(text, context)
            }
            async fn open_text(&self, sealed: &SealedSecret, context: &SecretContext) -> PortResult<String> {
                self.0.open_text(sealed, context)
            }
        }
        let keeper = Keeper(key);
        assert_eq!(
            keeper.open(&sealed, &context()).await.unwrap(),
            Secret::parse(OLD_SECRET).unwrap()
        );
        // And the data dir's key check takes it as sealed with its key.
        let dir = dir();
        std::fs::write(dir.join(KEY_FILE), OLD_KEY).unwrap();
        assert!(SecretsKey::for_data_dir(&dir, &[(context(), sealed)]).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_header_value_opens_only_under_its_own_header_of_its_own_subscription() {
        let key = SecretsKey::random();
        let header = context().with_header("X-Api-Key");
        assert_eq!(header.header.as_deref(), Some("x-api-key"), "held lowercase");
        assert_eq!(
            associated_data(&header),
            "tenant=ten_01J0000000000000000000000A\nsubscription=sub_01J0000000000000000000000A\nheader=x-api-key\n"
        );
        let value = "Bearer tok_3b1f0c9e2a7d4c58";
        let sealed = key.seal_text(value, &header).unwrap();
        assert!(sealed.as_str().starts_with(SCHEME) && !sealed.as_str().contains("tok_"));
        assert_ne!(sealed, key.seal_text(value, &header).unwrap(), "two seals alike");
        assert_eq!(key.open_text(&sealed, &header).unwrap(), value);
        assert_eq!(
            key.open_text(&sealed, &context().with_header("x-api-key")).unwrap(),
            value
        );
        let secret = key
            .seal_text(Secret::generate(&mut StdRng::from_os_rng()).as_str(), &context())
            .unwrap();
        for (sealed, context) in [
            (&sealed, context()),
            (&sealed, context().with_header("authorization")),
            (&secret, header.clone()),
        ] {
            assert!(
                matches!(key.open_text(sealed, &context), Err(PortError::Permanent { .. })),
                "opened under {context:?}"
            );
        }
    }
}
