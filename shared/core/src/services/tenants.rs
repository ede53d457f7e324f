//! Tenants and their API keys: created, listed, changed by an operator (`hookwise tenant`).
//!
//! A tenant holds one key, or two while it rotates: `rotate_api_key` adds a key beside the
//! current one, and `revoke_api_key` takes one away. A revoked key finds no tenant in the
//! store at once; a warm process that found it in the last `Config::lookup_ttl` (30 s) still
//! takes it until its entry is that old (`lookups`). The same holds for the retries flag.

use super::Services;
use crate::auth::{generate_api_key, hash_api_key, is_well_formed, API_KEY_PREFIX};
use crate::error::{Error, Result, ValidationError};
use crate::model::{ApiKey, Email, Tenant, TenantId, MAX_API_KEYS};
use crate::PortError;

/// What `update_tenant` changes: each field that is set.
#[derive(Debug, Clone, Default)]
pub struct TenantPatch {
    pub name: Option<String>,
    pub owner_email: Option<Email>,
    pub retries_enabled: Option<bool>,
}

/// How an operator names a key to revoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRef {
    /// The id `hookwise tenant show` lists (the start of its hash).
    Id(String),
    /// The key itself.
    Key(String),
}

/// Times a change is tried again when another change to the same tenant landed first.
const UPDATE_TRIES: usize = 5;

impl Services {
    /// A new tenant and its API key (shown once; only its hash is stored).
    pub async fn create_tenant(&self, name: &str, owner_email: Email) -> Result<(Tenant, String)> {
        let key = generate_api_key(&mut *self.rng());
        let tenant = self.create_tenant_with_key(name, owner_email, &key).await?;
        Ok((tenant, key))
    }

    /// A new tenant with a key the operator chose (`hookwise dev --api-key`).
    pub async fn create_tenant_with_key(&self, name: &str, owner_email: Email, api_key: &str) -> Result<Tenant> {
        check_name(name)?;
        check_key_form(api_key)?;
        let now = self.now();
        let tenant = Tenant {
            id: TenantId::generate(now, &mut *self.rng()),
            name: name.trim().to_owned(),
            owner_email,
            retries_enabled: true,
            created_at: now,
            api_keys: vec![ApiKey {
                hash: hash_api_key(api_key),
                created_at: now,
            }],
            version: 0,
        };
        self.ports.store.create_tenant(&tenant).await?;
        Ok(tenant)
    }

    /// The tenant an API key belongs to.
    pub async fn authenticate(&self, api_key: &str) -> Result<Tenant> {
        if !is_well_formed(api_key) {
            return Err(Error::Unauthorized);
        }
        self.tenant_by_api_key(api_key).await?.ok_or(Error::Unauthorized)
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
        self.change_tenant(id, |t| {
            if let Some(name) = &patch.name {
                t.name = name.trim().to_owned();
            }
            if let Some(owner) = &patch.owner_email {
                t.owner_email = owner.clone();
            }
            if let Some(enabled) = patch.retries_enabled {
                t.retries_enabled = enabled;
            }
            Ok(())
        })
        .await
    }

    /// Seed 002's per-account retries flag: off, a failed first attempt is final.
    pub async fn set_tenant_retries(&self, id: &TenantId, enabled: bool) -> Result<Tenant> {
        let patch = TenantPatch {
            retries_enabled: Some(enabled),
            ..TenantPatch::default()
        };
        self.update_tenant(id, &patch).await
    }

    /// A second key beside the current one; both work until one is revoked. Shown once.
    pub async fn rotate_api_key(&self, id: &TenantId) -> Result<(Tenant, String)> {
        let key = generate_api_key(&mut *self.rng());
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
        let named = |k: &ApiKey| match key {
            KeyRef::Id(want) => k.id() == want.as_str(),
            KeyRef::Key(value) => k.hash == hash_api_key(value),
        };
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
                    return Err(Error::NotFound {
                        what: "API key",
                        id: match key {
                            KeyRef::Id(want) => want.clone(),
                            KeyRef::Key(_) => "(the one given)".into(),
                        },
                    });
                }
                Ok(())
            })
            .await?;
        Ok(tenant)
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

fn check_key_form(api_key: &str) -> Result<()> {
    if is_well_formed(api_key) {
        return Ok(());
    }
    Err(ValidationError::new(
        "invalid_api_key",
        format!("an API key is `{API_KEY_PREFIX}` and 16 to 64 letters, digits, `-` or `_`"),
    )
    .into())
}
