//! Customers' portal sessions: a link that opens the dashboard in portal mode, scoped to one
//! tenant, for an hour by default and a day at most. Minted by an operator key for any tenant
//! or by a tenant's key for its own; revoked one at a time, or all of a tenant's at once.
//!
//! Sessions are stored, not signed: a revocation needs no list of its own, and a portal's
//! traffic is a person's clicks, so the read each request costs is nothing. The token
//! (`hwp_`, then the session's ULID and a secret) is shown once; only the secret's SHA-256 is
//! kept. What a session may do is the dashboard's: read, change its tenant's endpoints,
//! replay (not with a read-only one); never send events or use the operator routes (see
//! `hookwise_http`'s `Authenticated`).

use chrono::Duration;

use super::{Caller, Services};
use crate::auth::{hash_api_key, random_secret, KeyKind};
use crate::error::{Error, Result, ValidationError};
use crate::model::{PortalSession, PortalSessionId, Tenant, TenantId};

/// A session's life when none is asked for.
pub const PORTAL_SESSION_DEFAULT: Duration = Duration::hours(1);
/// The longest a session may live.
pub const PORTAL_SESSION_MAX: Duration = Duration::hours(24);

impl Services {
    /// A new portal session for `tenant` and its token (shown once), valid for `ttl` (the
    /// default if none; a minute to a day).
    pub async fn create_portal_session(
        &self,
        tenant: &Tenant,
        ttl: Option<Duration>,
        read_only: bool,
    ) -> Result<(PortalSession, String)> {
        let ttl = ttl.unwrap_or(PORTAL_SESSION_DEFAULT);
        if ttl < Duration::minutes(1) || ttl > PORTAL_SESSION_MAX {
            return Err(ValidationError::new(
                "invalid_ttl",
                "a portal session lives from 60 to 86 400 seconds (a day)",
            )
            .into());
        }
        let now = self.now();
        let (id, secret) = {
            let mut rng = self.rng();
            (PortalSessionId::generate(now, &mut *rng), random_secret(&mut *rng))
        };
        let session = PortalSession {
            id: id.clone(),
            tenant_id: tenant.id.clone(),
            secret_hash: hash_api_key(&secret),
            read_only,
            created_at: now,
            valid_until: now + ttl,
        };
        self.ports.store.create_portal_session(&session).await?;
        let ulid = &id.as_str()[PortalSessionId::PREFIX.len()..];
        Ok((session, format!("{}{ulid}{secret}", KeyKind::Portal.prefix())))
    }

    /// Revoke one of `tenant`'s portal sessions: its link answers 401 from now on.
    pub async fn revoke_portal_session(&self, tenant: &TenantId, id: &PortalSessionId) -> Result<()> {
        let session = self.ports.store.portal_session(id).await?;
        if session.is_none_or(|s| &s.tenant_id != tenant) {
            return Err(Error::not_found("portal session", id));
        }
        self.ports.store.delete_portal_session(id).await?;
        Ok(())
    }

    /// Revoke every portal session of `tenant` made until now.
    pub async fn revoke_portal_sessions(&self, tenant: &TenantId) -> Result<Tenant> {
        let now = self.now();
        self.change_tenant_now(tenant, |t| t.portal_sessions_since = Some(now))
            .await
    }

    /// The caller behind a portal token: its session, if it is one, not expired, not
    /// revoked, of an active tenant (read afresh: a revocation counts at once).
    pub(super) async fn portal_caller(&self, token: &str) -> Result<Caller> {
        let rest = &token[KeyKind::Portal.prefix().len()..];
        let (ulid, secret) = rest.split_at_checked(26).ok_or(Error::Unauthorized)?;
        let id =
            PortalSessionId::parse(&format!("{}{ulid}", PortalSessionId::PREFIX)).map_err(|_| Error::Unauthorized)?;
        let session = self
            .ports
            .store
            .portal_session(&id)
            .await?
            .filter(|s| s.secret_hash == hash_api_key(secret) && s.valid_until > self.now())
            .ok_or(Error::Unauthorized)?;
        let tenant = self
            .ports
            .store
            .get_tenant(&session.tenant_id)
            .await?
            .filter(|t| t.portal_sessions_since.is_none_or(|since| session.created_at > since))
            .ok_or(Error::Unauthorized)?;
        super::tenants::active(&tenant)?;
        Ok(Caller::Portal {
            tenant,
            read_only: session.read_only,
        })
    }
}
