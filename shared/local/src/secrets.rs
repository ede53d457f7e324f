//! Signing secrets sealed at rest: AES-256-GCM under a key kept in `<data-dir>/secrets.key`
//! (mode 0600), beside the database and never in it, so the database file alone (a copy, a
//! backup) reveals no secret. The subscription's tenant and id are the associated data: an
//! envelope copied onto another subscription does not open.
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
use hookwise_core::model::{SealedSecret, Secret};
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
        if !sample.is_empty() && !sample.iter().any(|(context, sealed)| key.open(sealed, context).is_ok()) {
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

    fn seal(&self, secret: &Secret, context: &SecretContext) -> PortResult<SealedSecret> {
        let nonce: [u8; NONCE_LEN] = self.rng.lock().unwrap_or_else(|p| p.into_inner()).random();
        let aad = associated_data(context);
        let sealed = self
            .cipher
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: secret.as_str().as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| PortError::permanent("seal secret", "AES-GCM refused to encrypt"))?;
        let mut envelope = nonce.to_vec();
        envelope.extend(sealed);
        Ok(SealedSecret::envelope(format!("{SCHEME}{}", B64.encode(envelope))))
    }

    fn open(&self, sealed: &SealedSecret, context: &SecretContext) -> PortResult<Secret> {
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
            .map_err(|_| refused("it does not open with this data dir's key for this subscription"))?;
        String::from_utf8(plain)
            .ok()
            .and_then(|s| Secret::parse(&s).ok())
            .ok_or_else(|| refused("it holds no signing secret"))
    }
}

/// The context as `name=value` lines (ids hold neither `=` nor a line break).
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
    async fn seal(&self, secret: &Secret, context: &SecretContext) -> PortResult<SealedSecret> {
        self.inner.secrets.seal(secret, context)
    }

    async fn open(&self, sealed: &SealedSecret, context: &SecretContext) -> PortResult<Secret> {
        self.inner.secrets.open(sealed, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let context = SecretContext {
            tenant: hookwise_core::model::TenantId::parse("ten_01J0000000000000000000000A").unwrap(),
            subscription: hookwise_core::model::SubscriptionId::parse("sub_01J0000000000000000000000A").unwrap(),
        };
        let secret = Secret::generate(&mut StdRng::from_os_rng());
        let sealed = first.seal(&secret, &context).unwrap();
        let again = SecretsKey::for_data_dir(&dir, &[(context.clone(), sealed.clone())]).unwrap();
        assert_eq!(again.open(&sealed, &context).unwrap(), secret, "the same key read back");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_damaged_or_foreign_key_is_refused_once_secrets_are_sealed_with_it() {
        let (mine, dir) = (SecretsKey::random(), dir());
        let context = SecretContext {
            tenant: hookwise_core::model::TenantId::parse("ten_01J0000000000000000000000A").unwrap(),
            subscription: hookwise_core::model::SubscriptionId::parse("sub_01J0000000000000000000000A").unwrap(),
        };
        let sample = (
            context.clone(),
            mine.seal(&Secret::generate(&mut StdRng::from_os_rng()), &context)
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
}
