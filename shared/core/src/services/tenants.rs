//! Tenants and their API keys, and the deployment's own settings: its operator keys and
//! the retries rollout. Changed by an operator, through `hookwise tenant`, `hookwise
//! operator` and `hookwise rollout`, or the operator routes of the API.
//!
//! A tenant holds one key, or two while it rotates: `rotate_api_key` adds a key beside the
//! current one, and `revoke_api_key` takes one away; the deployment's operator keys work the
//! same way. A revoked key is refused by the store at once; a warm process that found it in
//! the last `Config::lookup_ttl` (30 s) still takes it until its entry is that old
//! (`lookups`). The same holds for the retries flag and the rollout.

use super::Services;
use crate::auth::{generate_key, hash_api_key, key_kind, KeyKind};
use crate::error::{Error, Result, ValidationError};
use crate::model::{
    ApiKey, Deployment, EffectiveRetries, Email, RetriesSetting, Tenant, TenantId, TenantStatus, MAX_API_KEYS,
};
use crate::PortError;

/// A tenant to create.
#[derive(Debug, Clone)]
pub struct NewTenant {
    /// The id the operator chose (its own account id, `acct_123`); none, a generated one.
    pub id: Option<TenantId>,
    pub name: String,
    pub owner_email: Email,
    pub retries: RetriesSetting,
}

impl NewTenant {
    /// A tenant with a generated id, following the rollout.
    pub fn named(name: &str, owner_email: Email) -> Self {
        Self {
            id: None,
            name: name.to_owned(),
            owner_email,
            retries: RetriesSetting::default(),
        }
    }
}

/// What `update_tenant` changes: each field that is set.
#[derive(Debug, Clone, Default)]
pub struct TenantPatch {
    pub name: Option<String>,
    pub owner_email: Option<Email>,
    pub retries: Option<RetriesSetting>,
    pub status: Option<TenantStatus>,
}

/// How an operator names a key to revoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRef {
    /// The id `hookwise tenant show` lists (the start of its hash).
    Id(String),
    /// The key itself.
    Key(String),
}

impl KeyRef {
    fn names(&self, k: &ApiKey) -> bool {
        match self {
            KeyRef::Id(want) => k.id() == want.as_str(),
            KeyRef::Key(value) => k.hash == hash_api_key(value),
        }
    }

    fn not_found(&self) -> Error {
        Error::NotFound {
            what: "API key",
            id: match self {
                KeyRef::Id(want) => want.clone(),
                KeyRef::Key(_) => "(the one given)".into(),
            },
        }
    }
}

/// Who a key belongs to.
#[derive(Debug, Clone)]
pub enum Caller {
    /// A tenant's own key: it acts for that tenant alone.
    Tenant(Tenant),
    /// An operator key: it acts for any tenant, and on the operator routes.
    Operator,
    /// A customer's portal session: it acts for its tenant alone, as the dashboard does
    /// (no events sent; with `read_only`, nothing changed).
    Portal { tenant: Tenant, read_only: bool },
}

/// Times a change is tried again when another change to the same value landed first.
const UPDATE_TRIES: usize = 5;

impl Services {
    /// A new tenant and its API key (shown once; only its hash is stored).
    pub async fn create_tenant(&self, new: NewTenant) -> Result<(Tenant, String)> {
        let key = generate_key(KeyKind::Tenant, &mut *self.rng());
        let tenant = self.create_tenant_with_key(new, &key).await?;
        Ok((tenant, key))
    }

    /// A new tenant with a key the operator chose (`hookwise dev --api-key`).
    pub async fn create_tenant_with_key(&self, new: NewTenant, api_key: &str) -> Result<Tenant> {
        check_name(&new.name)?;
        check_key_form(api_key, KeyKind::Tenant)?;
        let now = self.now();
        let tenant = Tenant {
            id: new.id.unwrap_or_else(|| TenantId::generate(now, &mut *self.rng())),
            name: new.name.trim().to_owned(),
            owner_email: new.owner_email,
            retries: new.retries,
            status: TenantStatus::Active,
            created_at: now,
            api_keys: vec![ApiKey {
                hash: hash_api_key(api_key),
                created_at: now,
            }],
            version: 0,
            portal_sessions_since: None,
        };
        match self.ports.store.create_tenant(&tenant).await {
            Ok(()) => Ok(tenant),
            Err(PortError::ConditionFailed(_)) => Err(Error::conflict(format!(
                "a tenant `{}` exists already (or its key is in use)",
                tenant.id
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Who a key belongs to: a tenant (refused while the tenant is disabled) or the operator.
    pub async fn identify(&self, key: &str) -> Result<Caller> {
        match key_kind(key) {
            Some(KeyKind::Tenant) => {
                let by_key = self.tenant_by_api_key(key).await?.ok_or(Error::Unauthorized)?;
                // The tenant's own item, not the copy its key's entry holds: a key an older
                // build stored is not rewritten when the tenant changes (a disabling among
                // them).
                let tenant = self.kept_tenant(&by_key.id).await?.unwrap_or(by_key);
                active(&tenant)?;
                Ok(Caller::Tenant(tenant))
            }
            Some(KeyKind::Operator) => {
                let hash = hash_api_key(key);
                let known = |d: &Deployment| d.operator_keys.iter().any(|k| k.hash == hash);
                // Only a key found is taken from what this process keeps: a new one works
                // at once (as a tenant's key does); a revoked one within the time to live.
                if known(&self.kept_deployment().await?) {
                    return Ok(Caller::Operator);
                }
                self.forget_deployment();
                match known(&self.kept_deployment().await?) {
                    true => Ok(Caller::Operator),
                    false => Err(Error::Unauthorized),
                }
            }
            Some(KeyKind::Portal) => self.portal_caller(key).await,
            None => Err(Error::Unauthorized),
        }
    }

    /// The tenant an operator acts for: as kept, and active.
    pub async fn tenant_for_operator(&self, id: &TenantId) -> Result<Tenant> {
        let tenant = self
            .kept_tenant(id)
            .await?
            .ok_or_else(|| Error::not_found("tenant", id))?;
        active(&tenant)?;
        Ok(tenant)
    }

    /// A page of tenants, by id, after `after`.
    pub async fn list_tenants(&self, after: Option<&TenantId>, limit: u32) -> Result<Vec<Tenant>> {
        let limit = limit.clamp(1, Self::MAX_PAGE);
        Ok(self.ports.store.list_tenants(after, limit).await?)
    }

    /// Whether a tenant's retries are on, and why (read afresh).
    pub async fn effective_retries(&self, tenant: &Tenant) -> Result<EffectiveRetries> {
        Ok(self.ports.store.deployment().await?.retries_for(tenant))
    }

    /// The deployment's settings as stored now.
    pub async fn deployment(&self) -> Result<Deployment> {
        Ok(self.ports.store.deployment().await?)
    }

    /// The retries rollout: the share of the tenants that follow it whose retries are on. A
    /// tenant is in while its bucket (`model::rollout_bucket`) is below the percentage, so
    /// raising it keeps in every tenant that was in.
    pub async fn set_retries_rollout(&self, percent: u8) -> Result<Deployment> {
        if percent > 100 {
            return Err(ValidationError::new("invalid_percent", "the rollout is a percentage: 0 to 100").into());
        }
        self.change_deployment(|d| {
            d.retries_rollout_percent = percent;
            Ok(())
        })
        .await
    }

    /// The tenant whose subscriptions to Hookwise's own types hear of every tenant's
    /// endpoints (`None`: no tenant does; each hears of its own).
    pub async fn set_operations_tenant(&self, tenant: Option<TenantId>) -> Result<Deployment> {
        if let Some(id) = &tenant {
            if self.ports.store.get_tenant(id).await?.is_none() {
                return Err(Error::not_found("tenant", id));
            }
        }
        self.change_deployment(|d| {
            d.operations_tenant = tenant.clone();
            Ok(())
        })
        .await
    }

    /// Whether subscriptions may name only the types in their tenant's catalogue. Turned on,
    /// it applies to the subscriptions created or given new `event_types` from then on.
    pub async fn set_strict_catalogue(&self, strict: bool) -> Result<Deployment> {
        self.change_deployment(|d| {
            d.strict_catalogue = strict;
            Ok(())
        })
        .await
    }

    /// A new operator key (shown once): the first, or a second beside it for a rotation.
    pub async fn create_operator_key(&self) -> Result<(Deployment, String)> {
        let key = generate_key(KeyKind::Operator, &mut *self.rng());
        let added = ApiKey {
            hash: hash_api_key(&key),
            created_at: self.now(),
        };
        let deployment = self
            .change_deployment(|d| {
                if d.operator_keys.len() >= MAX_API_KEYS {
                    return Err(Error::conflict(format!(
                        "the deployment holds {MAX_API_KEYS} operator keys already: revoke one first"
                    )));
                }
                d.operator_keys.push(added.clone());
                Ok(())
            })
            .await?;
        Ok((deployment, key))
    }

    /// Take an operator key away: it answers 401 from now on (after at most `lookup_ttl` in
    /// a warm process that used it).
    pub async fn revoke_operator_key(&self, key: &KeyRef) -> Result<Deployment> {
        self.change_deployment(|d| {
            let before = d.operator_keys.len();
            d.operator_keys.retain(|k| !key.names(k));
            match d.operator_keys.len() < before {
                true => Ok(()),
                false => Err(key.not_found()),
            }
        })
        .await
    }

    /// Read the deployment's settings, change them, and write them if nobody else did
    /// meanwhile (else again).
    async fn change_deployment(&self, change: impl Fn(&mut Deployment) -> Result<()>) -> Result<Deployment> {
        for _ in 0..UPDATE_TRIES {
            let read = self.ports.store.deployment().await?;
            let mut next = read.clone();
            change(&mut next)?;
            next.version = read.version + 1;
            match self.ports.store.put_deployment(&next, &read).await {
                Ok(()) => {
                    self.forget_deployment();
                    return Ok(next);
                }
                Err(PortError::ConditionFailed(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::conflict(
            "the deployment's settings kept changing under this change: try again",
        ))
    }

    /// The tenant a tenant's API key belongs to.
    pub async fn authenticate(&self, api_key: &str) -> Result<Tenant> {
        match self.identify(api_key).await? {
            Caller::Tenant(tenant) => Ok(tenant),
            Caller::Operator | Caller::Portal { .. } => Err(Error::Unauthorized),
        }
    }

    /// A tenant as stored now (not as a warm process keeps it).
    pub async fn tenant(&self, id: &TenantId) -> Result<Tenant> {
        self.ports.store.get_tenant(id).await?.ok_or_else(|| Error::NotFound {
            what: "tenant",
            id: id.to_string(),
        })
    }

    /// Every tenant, by id.
    pub async fn all_tenants(&self) -> Result<Vec<Tenant>> {
        let mut all: Vec<Tenant> = Vec::new();
        loop {
            let page = self
                .ports
                .store
                .list_tenants(all.last().map(|t| &t.id), Self::MAX_PAGE)
                .await?;
            let last_page = page.len() < Self::MAX_PAGE as usize;
            all.extend(page);
            if last_page {
                return Ok(all);
            }
        }
    }

    /// Change a tenant's settings: what the patch names, the rest as it is.
    pub async fn update_tenant(&self, id: &TenantId, patch: &TenantPatch) -> Result<Tenant> {
        if let Some(name) = &patch.name {
            check_name(name)?;
        }
        let now = self.now();
        self.change_tenant(id, |t| {
            if let Some(name) = &patch.name {
                t.name = name.trim().to_owned();
            }
            if let Some(owner) = &patch.owner_email {
                t.owner_email = owner.clone();
            }
            if let Some(retries) = patch.retries {
                t.retries = retries;
            }
            if let Some(status) = patch.status {
                // Disabling also ends its portal links: re-enabled, the old ones stay dead.
                if status == TenantStatus::Disabled && t.status != TenantStatus::Disabled {
                    t.portal_sessions_since = Some(now);
                }
                t.status = status;
            }
            Ok(())
        })
        .await
    }

    /// The per-account retries flag: on, off, or as the rollout decides.
    pub async fn set_tenant_retries(&self, id: &TenantId, retries: RetriesSetting) -> Result<Tenant> {
        let patch = TenantPatch {
            retries: Some(retries),
            ..TenantPatch::default()
        };
        self.update_tenant(id, &patch).await
    }

    /// A second key beside the current one; both work until one is revoked. Shown once.
    pub async fn rotate_api_key(&self, id: &TenantId) -> Result<(Tenant, String)> {
        let key = generate_key(KeyKind::Tenant, &mut *self.rng());
        let added = ApiKey {
            hash: hash_api_key(&key),
            created_at: self.now(),
        };
        let tenant = self
            .change_tenant(id, |t| {
                if t.api_keys.len() >= MAX_API_KEYS {
                    return Err(Error::Conflict(format!(
                        "tenant `{}` holds {MAX_API_KEYS} keys already: revoke one first",
                        t.id
                    )));
                }
                t.api_keys.push(added.clone());
                Ok(())
            })
            .await?;
        Ok((tenant, key))
    }

    /// Take a key away: it answers 401 from now on (after at most `lookup_ttl` in a warm
    /// process that used it). A key named by its value may be one an older build stored
    /// without listing it on its tenant; it is revoked all the same.
    pub async fn revoke_api_key(&self, id: &TenantId, key: &KeyRef) -> Result<Tenant> {
        let named = |k: &ApiKey| key.names(k);
        let unlisted = match key {
            KeyRef::Key(value) => self
                .ports
                .store
                .tenant_by_api_key(&hash_api_key(value))
                .await?
                .filter(|t| &t.id == id && !t.api_keys.iter().any(named))
                .map(|t| ApiKey {
                    hash: hash_api_key(value),
                    created_at: t.created_at,
                }),
            KeyRef::Id(_) => None,
        };
        let tenant = self
            .change_tenant_from(id, |read, next| {
                if let Some(unlisted) = &unlisted {
                    // On the copy read and not on the next one: the store takes it away.
                    read.api_keys.push(unlisted.clone());
                    return Ok(());
                }
                let before = next.api_keys.len();
                next.api_keys.retain(|k| !named(k));
                if next.api_keys.len() == before {
                    return Err(key.not_found());
                }
                Ok(())
            })
            .await?;
        Ok(tenant)
    }

    /// [`Self::change_tenant`] with a change that cannot fail.
    pub(super) async fn change_tenant_now(&self, id: &TenantId, change: impl Fn(&mut Tenant)) -> Result<Tenant> {
        self.change_tenant(id, |t| {
            change(t);
            Ok(())
        })
        .await
    }

    async fn change_tenant(&self, id: &TenantId, change: impl Fn(&mut Tenant) -> Result<()>) -> Result<Tenant> {
        self.change_tenant_from(id, |_, next| change(next)).await
    }

    /// Read the tenant, change it, and write it if nobody else did meanwhile (else again).
    /// `change` gets the copy read too, for a key the store must take away though unlisted.
    async fn change_tenant_from(
        &self,
        id: &TenantId,
        change: impl Fn(&mut Tenant, &mut Tenant) -> Result<()>,
    ) -> Result<Tenant> {
        for _ in 0..UPDATE_TRIES {
            let mut read = self.tenant(id).await?;
            let mut next = read.clone();
            change(&mut read, &mut next)?;
            next.version = read.version + 1;
            match self.ports.store.update_tenant(&next, &read).await {
                Ok(()) => {
                    self.forget_tenant(&read);
                    return Ok(next);
                }
                Err(PortError::ConditionFailed(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Conflict(format!(
            "tenant `{id}` kept changing under this change: try again"
        )))
    }
}

fn check_name(name: &str) -> Result<()> {
    let name = name.trim();
    if name.is_empty() || name.len() > 200 {
        return Err(ValidationError::new("invalid_name", "a tenant name must be 1 to 200 characters").into());
    }
    Ok(())
}

fn check_key_form(key: &str, kind: KeyKind) -> Result<()> {
    if key_kind(key) == Some(kind) {
        return Ok(());
    }
    Err(ValidationError::new(
        "invalid_api_key",
        format!(
            "an API key is `{}` and 16 to 64 letters, digits, `-` or `_`",
            kind.prefix()
        ),
    )
    .into())
}

/// A disabled tenant is refused: 403, not 401 (its key is known).
pub(super) fn active(tenant: &Tenant) -> Result<()> {
    match tenant.status {
        TenantStatus::Active => Ok(()),
        TenantStatus::Disabled => Err(Error::forbidden(
            "tenant_disabled",
            format!("tenant `{}` is disabled", tenant.id),
        )),
    }
}
