//! Signing secrets, sealed at rest by the [`SecretKeeper`](crate::ports::SecretKeeper): made
//! and sealed when a subscription is created or its secret rotated, opened only to sign.

use chrono::{DateTime, Utc};

use super::Services;
use crate::error::{PortError, Result};
use crate::model::{HeaderValue, SealedSecret, Secret, Subscription, SubscriptionId, TenantId};
use crate::ports::{PortResult, SecretContext};

impl Services {
    /// A fresh secret for the subscription `id` of `tenant`, and the same sealed for storing.
    pub(super) async fn new_secret(&self, tenant: &TenantId, id: &SubscriptionId) -> Result<(Secret, SealedSecret)> {
        let secret = Secret::generate(&mut *self.rng());
        let context = SecretContext::new(tenant, id);
        let sealed = self.ports.secrets.seal(&secret, &context).await?;
        Ok((secret, sealed))
    }

    /// Every write of a changed subscription: [`Store::replace_subscription`] of `sub` over
    /// the copy read at `read_at`, a secret an older build stored in plain text sealed first,
    /// so that no write leaves one behind. Sealing that one is best effort: if the keeper
    /// cannot now, the write (a disabling, say) goes ahead with it as it was, and the next
    /// write seals it.
    ///
    /// [`Store::replace_subscription`]: crate::ports::Store::replace_subscription
    pub(super) async fn replace_subscription(&self, sub: &mut Subscription, read_at: DateTime<Utc>) -> PortResult<()> {
        if let Err(e) = self.seal_plain_secrets(sub).await {
            tracing::warn!(subscription = %sub.id, error = %e,
                "could not seal a secret stored in plain text; written as it was");
        }
        self.ports.store.replace_subscription(sub, read_at).await
    }

    /// Seal the secrets of `sub` an older build stored in plain text.
    async fn seal_plain_secrets(&self, sub: &mut Subscription) -> PortResult<()> {
        let context = SecretContext::of(sub);
        for slot in std::iter::once(&mut sub.secret).chain(sub.previous_secret.as_mut()) {
            if let Some(plain) = slot.plain() {
                *slot = self.ports.secrets.seal(&plain, &context).await?;
            }
        }
        Ok(())
    }

    /// Seal every signing secret an older build stored in plain text, in every listed
    /// tenant's subscriptions: an operator's one-off after upgrading (each subscription's next
    /// write would seal its own). Fails on the first one it cannot seal.
    pub async fn seal_stored_secrets(&self) -> Result<SealReport> {
        const PAGE: u32 = 100;
        let mut report = SealReport::default();
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
                    self.seal_plain_secrets(&mut sub).await?;
                    let read_at = sub.updated_at;
                    sub.updated_at = super::subscriptions::next_version(read_at, self.now());
                    let result = self.ports.store.replace_subscription(&sub, read_at).await;
                    self.forget_subscription(&sub.tenant_id, &sub.id);
                    match result {
                        Ok(()) => report.sealed += 1,
                        // Changed or deleted since it was read: run it again to be sure.
                        Err(PortError::ConditionFailed(_)) => report.changed_meanwhile += 1,
                        Err(e) => return Err(e.into()),
                    }
                }
                if page.len() < PAGE as usize {
                    break;
                }
            }
        }
        Ok(report)
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

impl Services {
    /// Its custom headers as sent, sensitive values opened (the keeper keeps them as it
    /// keeps secrets). `Err(why)` when one will never open (sealed under another key or
    /// subscription, or damaged): no attempt can carry it.
    pub(super) async fn open_custom_headers(
        &self,
        sub: &Subscription,
    ) -> Result<std::result::Result<Vec<(String, String)>, String>> {
        let mut opened = Vec::with_capacity(sub.headers.len());
        for header in &sub.headers {
            let value = match &header.value {
                HeaderValue::Plain(v) => v.clone(),
                HeaderValue::Sealed(sealed) => {
                    let context = SecretContext::for_header(sub, header.name.as_str());
                    match self.ports.secrets.open_text(sealed, &context).await {
                        Ok(v) => v,
                        Err(PortError::Permanent { source, .. }) => {
                            return Ok(Err(format!("its header `{}` cannot be opened: {source}", header.name)))
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            opened.push((header.name.to_string(), value));
        }
        Ok(Ok(opened))
    }
}

/// What [`Services::seal_stored_secrets`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SealReport {
    /// Subscriptions written with their secrets sealed.
    pub sealed: usize,
    /// Subscriptions that changed while it ran, and were left as that change left them.
    pub changed_meanwhile: usize,
}

/// A subscription's signing secrets, opened: see [`Services::open_signing_secrets`].
pub(super) enum Opened {
    Secrets(Vec<Secret>),
    /// Its current secret will never open, for this reason.
    Never(String),
}
