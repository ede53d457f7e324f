//! Signing secrets, sealed at rest by the [`SecretKeeper`](crate::ports::SecretKeeper): made
//! and sealed when a subscription is created or its secret rotated, opened only to sign.

use chrono::{DateTime, Utc};

use super::Services;
use crate::error::Result;
use crate::model::{SealedSecret, Secret, Subscription, SubscriptionId, TenantId};
use crate::ports::SecretContext;

impl Services {
    /// A fresh secret for the subscription `id` of `tenant`, and the same sealed for storing.
    pub(super) async fn new_secret(&self, tenant: &TenantId, id: &SubscriptionId) -> Result<(Secret, SealedSecret)> {
        let secret = Secret::generate(&mut *self.rng());
        let context = SecretContext {
            tenant: tenant.clone(),
            subscription: id.clone(),
        };
        let sealed = self.ports.secrets.seal(&secret, &context).await?;
        Ok((secret, sealed))
    }

    /// Seal the secrets of `sub` stored in plain text (before secrets were sealed), so that
    /// its next write leaves none behind.
    pub(super) async fn seal_plain_secrets(&self, sub: &mut Subscription) -> Result<()> {
        let context = SecretContext::of(sub);
        for slot in std::iter::once(&mut sub.secret).chain(sub.previous_secret.as_mut()) {
            if let Some(plain) = slot.plain() {
                *slot = self.ports.secrets.seal(&plain, &context).await?;
            }
        }
        Ok(())
    }

    /// The secrets that sign a message of `sub` sent at `now` (see
    /// [`Subscription::signing_secrets`]), opened.
    pub(super) async fn open_signing_secrets(&self, sub: &Subscription, now: DateTime<Utc>) -> Result<Vec<Secret>> {
        let context = SecretContext::of(sub);
        let mut opened = Vec::with_capacity(2);
        for sealed in sub.signing_secrets(now) {
            opened.push(match sealed.plain() {
                Some(plain) => plain,
                None => self.ports.secrets.open(sealed, &context).await?,
            });
        }
        Ok(opened)
    }
}
