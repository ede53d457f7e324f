//! Signing secrets, sealed at rest by the [`SecretKeeper`](crate::ports::SecretKeeper): made
//! and sealed when a subscription is created or its secret rotated, opened only to sign.

use chrono::{DateTime, Utc};

use super::Services;
use crate::error::{PortError, Result};
use crate::model::{SealedSecret, Secret, Subscription, SubscriptionId, TenantId};
use crate::ports::{PortResult, SecretContext};

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

    /// Every write of a changed subscription: [`Store::replace_subscription`] of `sub` over
    /// the copy read at `read_at`, a secret an older build stored in plain text sealed first,
    /// so that no write leaves one behind.
    ///
    /// [`Store::replace_subscription`]: crate::ports::Store::replace_subscription
    pub(super) async fn replace_subscription(&self, sub: &mut Subscription, read_at: DateTime<Utc>) -> PortResult<()> {
        let context = SecretContext::of(sub);
        for slot in std::iter::once(&mut sub.secret).chain(sub.previous_secret.as_mut()) {
            if let Some(plain) = slot.plain() {
                *slot = self.ports.secrets.seal(&plain, &context).await?;
            }
        }
        self.ports.store.replace_subscription(sub, read_at).await
    }

    /// Seal every signing secret an older build stored in plain text, in every listed
    /// tenant's subscriptions: an operator's one-off after upgrading (each subscription's next
    /// write would seal its own). How many subscriptions it wrote sealed.
    pub async fn seal_stored_secrets(&self) -> Result<usize> {
        const PAGE: u32 = 100;
        let mut sealed = 0;
        for tenant in self.all_tenants().await? {
            let mut after: Option<SubscriptionId> = None;
            loop {
                let page = self
                    .ports
                    .store
                    .list_subscriptions(&tenant.id, after.as_ref(), PAGE)
                    .await?;
                after = page.last().map(|s| s.id.clone());
                for mut sub in page.iter().cloned() {
                    let plain = std::iter::once(&sub.secret)
                        .chain(sub.previous_secret.as_ref())
                        .any(|s| s.plain().is_some());
                    if !plain {
                        continue;
                    }
                    let read_at = sub.updated_at;
                    sub.updated_at = super::subscriptions::next_version(read_at, self.now());
                    let result = self.replace_subscription(&mut sub, read_at).await;
                    self.forget_subscription(&sub.tenant_id, &sub.id);
                    match result {
                        Ok(()) => sealed += 1,
                        // Changed or deleted since it was read: that write sealed it.
                        Err(PortError::ConditionFailed(_)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                if page.len() < PAGE as usize {
                    break;
                }
            }
        }
        Ok(sealed)
    }

    /// The secrets that sign a message of `sub` sent at `now` (see
    /// [`Subscription::signing_secrets`]), opened. A keeper that cannot answer now (KMS
    /// throttled or unreachable, the key disabled) is an error, for the message to come back.
    /// An envelope that will never open (`Permanent`: sealed under another key or
    /// subscription, or damaged) is [`Opened::Never`] when it is the current secret: no
    /// attempt can be signed. A previous secret that will never open is left out, so that a
    /// rotation gets a subscription past it.
    pub(super) async fn open_signing_secrets(&self, sub: &Subscription, now: DateTime<Utc>) -> Result<Opened> {
        let context = SecretContext::of(sub);
        let mut opened = Vec::with_capacity(2);
        for (n, sealed) in sub.signing_secrets(now).into_iter().enumerate() {
            if let Some(plain) = sealed.plain() {
                opened.push(plain);
                continue;
            }
            match self.ports.secrets.open(sealed, &context).await {
                Ok(secret) => opened.push(secret),
                Err(PortError::Permanent { source, .. }) if n == 0 => {
                    return Ok(Opened::Never(format!("its signing secret cannot be opened: {source}")));
                }
                Err(PortError::Permanent { source, .. }) => {
                    tracing::warn!(subscription = %sub.id, error = %source,
                        "the previous signing secret cannot be opened; signing with the current one alone");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Opened::Secrets(opened))
    }
}

/// A subscription's signing secrets, opened: see [`Services::open_signing_secrets`].
pub(super) enum Opened {
    Secrets(Vec<Secret>),
    /// Its current secret will never open, for this reason.
    Never(String),
}
