//! Tenants and their API keys.

use super::Services;
use crate::auth::{generate_api_key, hash_api_key, is_well_formed, API_KEY_PREFIX};
use crate::error::{Error, Result, ValidationError};
use crate::model::{Email, Tenant, TenantId};

impl Services {
    /// A new tenant and its API key (shown once; only its hash is stored).
    pub async fn create_tenant(&self, name: &str, owner_email: Email) -> Result<(Tenant, String)> {
        let key = generate_api_key(&mut *self.rng());
        let tenant = self.create_tenant_with_key(name, owner_email, &key).await?;
        Ok((tenant, key))
    }

    /// A new tenant with a key the operator chose (`hookwise dev --api-key`).
    pub async fn create_tenant_with_key(&self, name: &str, owner_email: Email, api_key: &str) -> Result<Tenant> {
        let name = name.trim();
        if name.is_empty() || name.len() > 200 {
            return Err(ValidationError::new("invalid_name", "a tenant name must be 1 to 200 characters").into());
        }
        if !is_well_formed(api_key) {
            return Err(ValidationError::new(
                "invalid_api_key",
                format!("an API key is `{API_KEY_PREFIX}` and 16 to 64 letters, digits, `-` or `_`"),
            )
            .into());
        }
        let now = self.now();
        let tenant = Tenant {
            id: TenantId::generate(now, &mut *self.rng()),
            name: name.to_owned(),
            owner_email,
            retries_enabled: true,
            created_at: now,
        };
        self.ports.store.create_tenant(&tenant, &hash_api_key(api_key)).await?;
        Ok(tenant)
    }

    /// The tenant an API key belongs to.
    pub async fn authenticate(&self, api_key: &str) -> Result<Tenant> {
        if !is_well_formed(api_key) {
            return Err(Error::Unauthorized);
        }
        self.tenant_by_api_key(api_key).await?.ok_or(Error::Unauthorized)
    }
}
