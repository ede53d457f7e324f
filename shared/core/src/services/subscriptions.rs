//! Subscriptions: create, read, change, delete, rotate and reveal the signing secret.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;

use super::Services;
use crate::circuit::{Circuit, CircuitBreaker};
use crate::error::{Error, PortError, Result, ValidationError};
use crate::filter::ContentFilter;
use crate::model::*;
use crate::policy::RetryPolicy;
use crate::ports::{DeliveryQuery, SecretContext};

pub const MAX_EVENT_TYPE_FILTERS: usize = 50;
pub const MAX_DESCRIPTION_LEN: usize = 500;

/// `POST /v1/subscriptions`. Fields parse into validated types as they deserialize.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSubscription {
    pub url: EndpointUrl,
    #[serde(default = "all_event_types")]
    pub event_types: Vec<EventTypeFilter>,
    #[serde(default)]
    pub owner_email: Option<Email>,
    #[serde(default)]
    pub retry_policy: Option<RetryPolicy>,
    #[serde(default)]
    pub timeout_ms: Option<u32>,
    #[serde(default)]
    pub rate_limit_per_second: Option<u32>,
    /// Absent: [`DEFAULT_AUTO_DISABLE_HOURS`]; `null`: never.
    #[serde(default, deserialize_with = "present")]
    pub auto_disable_after_hours: Option<Option<u32>>,
    /// Absent: off. Given: on unless `enabled: false`, the default threshold and probe
    /// interval for what it leaves out.
    #[serde(default)]
    pub circuit_breaker: Option<CircuitBreaker>,
    #[serde(default)]
    pub description: Option<String>,
    /// Which of the events its types match it gets, by their content ([`crate::filter`]).
    #[serde(default)]
    pub filter: Option<ContentFilter>,
    /// Custom headers sent with every POST, by name.
    #[serde(default)]
    pub headers: Option<BTreeMap<String, HeaderInput>>,
}

/// A custom header's value as a request gives it: the value, or `{"value", "sensitive"}`.
/// A sensitive one is stored sealed and reads back masked; in a PATCH, a sensitive one
/// without a value keeps the one stored.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum HeaderInput {
    Value(String),
    Detailed(DetailedHeader),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetailedHeader {
    #[serde(default)]
    pub value: Option<String>,
    /// Absent: as the header stored under this name is (so a new value for a sensitive one
    /// stays sealed); else as given.
    #[serde(default)]
    pub sensitive: Option<bool>,
}

impl HeaderInput {
    fn value(&self) -> Option<&str> {
        match self {
            Self::Value(v) => Some(v),
            Self::Detailed(d) => d.value.as_deref(),
        }
    }
}

/// Scheme, host and port: where a request goes.
fn origin(url: &EndpointUrl) -> String {
    url.to_url().origin().ascii_serialization()
}

fn all_event_types() -> Vec<EventTypeFilter> {
    vec![EventTypeFilter::all()]
}

/// `PATCH /v1/subscriptions/{id}`: only the fields present change; `null` removes the
/// optional ones (`owner_email`, `description`) and leaves the others as they are.
/// `status: "active"` re-enables a subscription Hookwise disabled.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionPatch {
    pub url: Option<EndpointUrl>,
    pub event_types: Option<Vec<EventTypeFilter>>,
    /// Absent: unchanged; `null`: removed (emails go to the tenant's owner); else replaced.
    #[serde(default, deserialize_with = "present")]
    pub owner_email: Option<Option<Email>>,
    pub retry_policy: Option<RetryPolicy>,
    pub timeout_ms: Option<u32>,
    /// Absent: unchanged; `null`: no limit; else replaced.
    #[serde(default, deserialize_with = "present")]
    pub rate_limit_per_second: Option<Option<u32>>,
    /// Absent: unchanged; `null`: never disabled for failing; else replaced.
    #[serde(default, deserialize_with = "present")]
    pub auto_disable_after_hours: Option<Option<u32>>,
    /// Absent: unchanged; else replaced (what it leaves out takes the default).
    pub circuit_breaker: Option<CircuitBreaker>,
    /// Absent: unchanged; `null`: removed; else replaced.
    #[serde(default, deserialize_with = "present")]
    pub description: Option<Option<String>>,
    /// Absent: unchanged; `null`: removed (every event its types match); else replaced.
    #[serde(default, deserialize_with = "present")]
    pub filter: Option<Option<ContentFilter>>,
    /// Absent: unchanged; `null`: none; else the whole set replaced (a sensitive header
    /// given without a value keeps the value stored).
    #[serde(default, deserialize_with = "present")]
    pub headers: Option<Option<BTreeMap<String, HeaderInput>>>,
    pub status: Option<SubscriptionStatus>,
}

/// A field that is there, `null` or not: with `#[serde(default)]` an absent field stays
/// `None`, so `Some(None)` is an explicit `null`.
pub(super) fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> std::result::Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

fn check_event_types(types: &[EventTypeFilter]) -> Result<(), ValidationError> {
    if types.is_empty() || types.len() > MAX_EVENT_TYPE_FILTERS {
        return Err(ValidationError::new(
            "invalid_event_types",
            format!("event_types needs 1 to {MAX_EVENT_TYPE_FILTERS} filters (`[\"*\"]` for every event)"),
        ));
    }
    Ok(())
}

/// The `updated_at` of a write based on a copy read at `read_at`: now, and always later than
/// the copy, so every write moves the version even when the clock has not.
pub(crate) fn next_version(read_at: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    now.max(read_at + Duration::nanoseconds(1))
}

/// Refuse a policy that can retry for longer than the store keeps data: retention would
/// delete the delivery, or its event, while it is still retrying.
pub fn check_retention(policy: &RetryPolicy, retention: Option<std::time::Duration>) -> Result<(), ValidationError> {
    let Some(retention) = retention else { return Ok(()) };
    let span = policy.longest_span();
    if span < retention.as_secs_f64() {
        return Ok(());
    }
    Err(ValidationError::new(
        "retry_policy_exceeds_retention",
        format!(
            "retry_policy: `{}` can keep a delivery retrying for up to {:.1} days (every delay at its longest: jitter, \
             adaptive backoff, Retry-After), and data is kept for {:.1} days: shorten the schedule, or raise the \
             retention (RetentionDays)",
            policy.label(),
            span / 86_400.0,
            retention.as_secs_f64() / 86_400.0
        ),
    ))
}

fn check_timeout(ms: u32) -> Result<u32, ValidationError> {
    if ms == 0 || ms > MAX_TIMEOUT_MS {
        return Err(ValidationError::new(
            "invalid_timeout",
            format!("timeout_ms must be 1 to {MAX_TIMEOUT_MS}"),
        ));
    }
    Ok(ms)
}

fn check_rate_limit(limit: Option<u32>) -> Result<Option<u32>, ValidationError> {
    match limit {
        Some(r) if r == 0 || r > MAX_RATE_LIMIT => Err(ValidationError::new(
            "invalid_rate_limit",
            format!("rate_limit_per_second must be 1 to {MAX_RATE_LIMIT}, or null for none"),
        )),
        other => Ok(other),
    }
}

fn check_breaker(breaker: CircuitBreaker) -> Result<CircuitBreaker, ValidationError> {
    match breaker.problem() {
        Some(problem) => Err(ValidationError::new("invalid_circuit_breaker", problem)),
        None => Ok(breaker),
    }
}

fn check_auto_disable(hours: Option<u32>) -> Result<Option<u32>, ValidationError> {
    match hours {
        Some(h) if h == 0 || h > MAX_AUTO_DISABLE_HOURS => Err(ValidationError::new(
            "invalid_auto_disable",
            format!("auto_disable_after_hours must be 1 to {MAX_AUTO_DISABLE_HOURS}, or null for never"),
        )),
        other => Ok(other),
    }
}

fn check_description(d: &str) -> Result<(), ValidationError> {
    if d.chars().count() > MAX_DESCRIPTION_LEN {
        return Err(ValidationError::new(
            "invalid_description",
            format!("description is longer than {MAX_DESCRIPTION_LEN} characters"),
        ));
    }
    Ok(())
}

/// A subscription as the dashboard shows it: its health and its latest deliveries by status.
/// A subscription with its current secret in plain text: what creating it or rotating its
/// secret answers, the only times the secret is shown (the store keeps it sealed).
#[derive(Debug, Clone)]
pub struct SubscriptionWithSecret {
    pub subscription: Subscription,
    pub secret: Secret,
}

#[derive(Debug, Clone)]
pub struct SubscriptionOverview {
    pub subscription: Subscription,
    /// `None` before any attempt.
    pub health: Option<f64>,
    /// Its latest [`Services::COUNTED_DELIVERIES`] deliveries by status: pending, retrying,
    /// delivered, dead, in [`DeliveryStatus::ALL`]'s order.
    pub counts: [u64; 4],
    /// `false` when it has older deliveries than those counted.
    pub counts_complete: bool,
    /// Its endpoint's circuit breaker (closed since its creation if it never opened).
    pub circuit: Circuit,
    /// The attempts its open breaker holds, up to [`Services::COUNTED_HELD`] (so that many
    /// means at least that many).
    pub held: u32,
}

/// A page of a tenant's subscriptions, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubscriptionPage {
    pub items: Vec<Subscription>,
    /// Opaque: pass it as `cursor` for the next page.
    pub next_cursor: Option<String>,
}

impl Services {
    /// How many of a subscription's latest deliveries its overview counts: one page, so an
    /// overview reads a page of deliveries on every backend, however long its history.
    pub const COUNTED_DELIVERIES: u32 = Self::MAX_PAGE;
    /// The most held attempts an overview counts.
    pub const COUNTED_HELD: u32 = Self::MAX_PAGE;

    pub async fn subscription_overview(&self, tenant: &Tenant, id: &SubscriptionId) -> Result<SubscriptionOverview> {
        let subscription = self.get_subscription(tenant, id).await?;
        let health = self.stored_health(id).await?.score(self.now());
        let circuit = self
            .ports
            .store
            .circuit(id)
            .await?
            .unwrap_or_else(|| Circuit::closed(subscription.created_at));
        let latest = DeliveryQuery {
            subscription_id: Some(id.clone()),
            limit: Self::COUNTED_DELIVERIES,
            ..DeliveryQuery::default()
        };
        let page = self.ports.store.list_deliveries(&tenant.id, &latest).await?;
        let mut counts = [0; 4];
        for (slot, status) in counts.iter_mut().zip(DeliveryStatus::ALL) {
            *slot = page.items.iter().filter(|d| d.status == status).count() as u64;
        }
        // What an open breaker holds, counted to a page (a closed one holds nothing to count,
        // and costs no read).
        let held = match circuit.state {
            crate::circuit::CircuitState::Closed => 0,
            _ => self.ports.scheduler.held(id, Self::COUNTED_HELD).await?.len() as u32,
        };
        Ok(SubscriptionOverview {
            subscription,
            health,
            counts,
            counts_complete: page.next_cursor.is_none(),
            circuit,
            held,
        })
    }

    /// The new subscription and its secret (the only time it is shown, with rotation).
    pub async fn create_subscription(&self, tenant: &Tenant, new: NewSubscription) -> Result<SubscriptionWithSecret> {
        check_event_types(&new.event_types)?;
        self.check_subscribed_types(&tenant.id, &new.event_types).await?;
        if let Some(d) = &new.description {
            check_description(d)?;
        }
        let timeout_ms = check_timeout(new.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS))?;
        let rate_limit_per_second = check_rate_limit(new.rate_limit_per_second)?;
        let auto_disable_after_hours =
            check_auto_disable(new.auto_disable_after_hours.unwrap_or(Some(DEFAULT_AUTO_DISABLE_HOURS)))?;
        let circuit_breaker = check_breaker(new.circuit_breaker.unwrap_or_default())?;
        let retry_policy = new
            .retry_policy
            .unwrap_or_else(|| self.config.default_retry_policy.clone());
        check_retention(&retry_policy, self.config.retention)?;
        let now = self.now();
        let id = SubscriptionId::generate(now, &mut *self.rng());
        let (secret, sealed) = self.new_secret(&tenant.id, &id).await?;
        let headers = match new.headers {
            Some(given) => self.stored_headers(&tenant.id, &id, given, &[]).await?,
            None => Vec::new(),
        };
        let sub = Subscription {
            id,
            tenant_id: tenant.id.clone(),
            url: new.url,
            event_types: new.event_types,
            secret: sealed,
            previous_secret: None,
            previous_secret_expires_at: None,
            retry_policy,
            timeout_ms,
            rate_limit_per_second,
            auto_disable_after_hours,
            circuit_breaker,
            status: SubscriptionStatus::Active,
            disabled_reason: None,
            active_since: Some(now),
            disable_notice_pending: false,
            disable_notice_claimed_at: None,
            owner_email: new.owner_email,
            description: new.description,
            filter: new.filter,
            headers,
            created_at: now,
            updated_at: now,
        };
        self.ports.store.create_subscription(&sub).await?;
        self.forget_subscription(&tenant.id, &sub.id);
        Ok(SubscriptionWithSecret {
            subscription: sub,
            secret,
        })
    }

    /// Oldest first. `limit` 0 means 50; above 100 is refused. `cursor` is the previous
    /// page's `next_cursor`.
    pub async fn list_subscriptions(
        &self,
        tenant: &Tenant,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<SubscriptionPage> {
        let limit = match limit {
            0 => Self::DEFAULT_PAGE,
            l if l > Self::MAX_PAGE => {
                return Err(
                    ValidationError::new("invalid_limit", format!("limit must be 1 to {}", Self::MAX_PAGE)).into(),
                )
            }
            l => l,
        };
        let after = cursor
            .map(|c| SubscriptionId::parse(c).map_err(|_| PortError::InvalidCursor(c.to_owned())))
            .transpose()?;
        let mut items = self
            .ports
            .store
            .list_subscriptions(&tenant.id, after.as_ref(), limit + 1)
            .await?;
        let next_cursor = (items.len() > limit as usize).then(|| items[limit as usize - 1].id.to_string());
        items.truncate(limit as usize);
        Ok(SubscriptionPage { items, next_cursor })
    }

    pub async fn get_subscription(&self, tenant: &Tenant, id: &SubscriptionId) -> Result<Subscription> {
        self.ports
            .store
            .get_subscription(&tenant.id, id)
            .await?
            .ok_or_else(|| Error::not_found("subscription", id))
    }

    pub async fn update_subscription(
        &self,
        tenant: &Tenant,
        id: &SubscriptionId,
        patch: SubscriptionPatch,
    ) -> Result<Subscription> {
        let mut sub = self.get_subscription(tenant, id).await?;
        let read_at = sub.updated_at;
        // A sensitive header's value goes only to the host it was given for: moved elsewhere,
        // each must be given again (or the caller could read it at a host of its own).
        let moves_host = patch.url.as_ref().is_some_and(|url| origin(url) != origin(&sub.url));
        let given_values: Vec<String> = match &patch.headers {
            Some(Some(given)) => given
                .iter()
                .filter(|(_, input)| input.value().is_some())
                .map(|(name, _)| name.to_ascii_lowercase())
                .collect(),
            _ => Vec::new(),
        };
        if let Some(url) = patch.url {
            sub.url = url;
        }
        if let Some(types) = patch.event_types {
            check_event_types(&types)?;
            // Only the ones it did not name before: what it names already stays as it is.
            let added: Vec<_> = types.iter().filter(|t| !sub.event_types.contains(t)).cloned().collect();
            self.check_subscribed_types(&tenant.id, &added).await?;
            sub.event_types = types;
        }
        if let Some(email) = patch.owner_email {
            sub.owner_email = email;
        }
        if let Some(policy) = patch.retry_policy {
            check_retention(&policy, self.config.retention)?;
            sub.retry_policy = policy;
        }
        if let Some(ms) = patch.timeout_ms {
            sub.timeout_ms = check_timeout(ms)?;
        }
        if let Some(limit) = patch.rate_limit_per_second {
            sub.rate_limit_per_second = check_rate_limit(limit)?;
        }
        if let Some(hours) = patch.auto_disable_after_hours {
            sub.auto_disable_after_hours = check_auto_disable(hours)?;
        }
        if let Some(breaker) = patch.circuit_breaker {
            sub.circuit_breaker = check_breaker(breaker)?;
        }
        if let Some(d) = patch.description {
            if let Some(d) = &d {
                check_description(d)?;
            }
            sub.description = d;
        }
        if let Some(filter) = patch.filter {
            sub.filter = filter;
        }
        if let Some(headers) = patch.headers {
            sub.headers = match headers {
                Some(given) => self.stored_headers(&tenant.id, &sub.id, given, &sub.headers).await?,
                None => Vec::new(),
            };
        }
        if moves_host {
            let kept = sub
                .headers
                .iter()
                .find(|h| h.is_sensitive() && !given_values.iter().any(|g| g == h.name.as_str()));
            if let Some(kept) = kept {
                return Err(ValidationError::new(
                    "sensitive_header_needs_value",
                    format!(
                        "the URL moves to another host: give the sensitive header `{}` its value again \
                         (in `headers`), or remove it",
                        kept.name
                    ),
                )
                .into());
            }
        }
        let lets_go = patch.circuit_breaker.is_some_and(|b| !b.enabled)
            || patch.status.is_some_and(|s| s != SubscriptionStatus::Active);
        if let Some(status) = patch.status {
            if status == SubscriptionStatus::Active && sub.status != SubscriptionStatus::Active {
                // Its failures count afresh from now: not disabled again at the next one.
                sub.active_since = Some(self.now());
            }
            if status == SubscriptionStatus::Active {
                sub.disabled_reason = None;
                sub.disable_notice_pending = false;
                sub.disable_notice_claimed_at = None;
            }
            sub.status = status;
        }
        let sub = self.replace_as_read(sub, read_at).await?;
        if lets_go {
            // What its breaker held is let go now: released, or settled (disabled).
            self.tend_after_change(&tenant.id, id).await;
        }
        Ok(sub)
    }

    /// Store a changed copy of a subscription, if it is still as it was read at `read_at`;
    /// else 409: a racing change is never reverted, a deleted subscription never revived.
    async fn replace_as_read(&self, mut sub: Subscription, read_at: DateTime<Utc>) -> Result<Subscription> {
        sub.updated_at = next_version(read_at, self.now());
        let result = self.replace_subscription(&mut sub, read_at).await;
        self.forget_subscription(&sub.tenant_id, &sub.id);
        match result {
            Ok(()) => Ok(sub),
            Err(PortError::ConditionFailed(_)) => Err(Error::conflict(format!(
                "subscription {} changed (or was deleted) while this change was being made; read it again and retry",
                sub.id
            ))),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn delete_subscription(&self, tenant: &Tenant, id: &SubscriptionId) -> Result<()> {
        let deleted = self.ports.store.delete_subscription(&tenant.id, id).await;
        self.forget_subscription(&tenant.id, id);
        if deleted? {
            // What its breaker held is settled now (each dies, its owner told).
            self.tend_after_change(&tenant.id, id).await;
            Ok(())
        } else {
            Err(Error::not_found("subscription", id))
        }
    }

    /// A new signing secret; the old one keeps signing alongside it for a grace period (moved
    /// as it is stored, never opened).
    pub async fn rotate_secret(&self, tenant: &Tenant, id: &SubscriptionId) -> Result<SubscriptionWithSecret> {
        let mut sub = self.get_subscription(tenant, id).await?;
        let read_at = sub.updated_at;
        let now = self.now();
        let (secret, sealed) = self.new_secret(&tenant.id, id).await?;
        sub.previous_secret = Some(std::mem::replace(&mut sub.secret, sealed));
        sub.previous_secret_expires_at = Some(now + Duration::hours(SECRET_ROTATION_GRACE_HOURS));
        Ok(SubscriptionWithSecret {
            subscription: self.replace_as_read(sub, read_at).await?,
            secret,
        })
    }

    /// The current signing secret of the subscription `id`, opened again, where the
    /// deployment reveals secrets ([`Config::reveal_secrets`]); else 403
    /// `secrets_not_revealed`. Each reveal is logged; on AWS the keeper's KMS Decrypt (the
    /// tenant and subscription its context) is in CloudTrail, at least once per warm process
    /// and 15 minutes (the keeper keeps what it opened that long).
    ///
    /// [`Config::reveal_secrets`]: super::Config::reveal_secrets
    pub async fn reveal_secret(&self, tenant: &Tenant, id: &SubscriptionId) -> Result<SubscriptionWithSecret> {
        if !self.config.reveal_secrets {
            return Err(Error::forbidden(
                "secrets_not_revealed",
                format!(
                    "this deployment shows a signing secret only when it is made: rotate the secret to get a new \
                     one (the old one keeps signing for {SECRET_ROTATION_GRACE_HOURS} hours)"
                ),
            ));
        }
        let subscription = self.get_subscription(tenant, id).await?;
        let secret = match subscription.secret.plain() {
            Some(plain) => plain,
            None => {
                let context = SecretContext::of(&subscription);
                self.ports.secrets.open(&subscription.secret, &context).await?
            }
        };
        tracing::info!(tenant = %tenant.id, subscription = %id, "signing secret revealed");
        Ok(SubscriptionWithSecret { subscription, secret })
    }

    /// The custom headers `given` as stored: names and values checked, sensitive values
    /// sealed under the subscription and the header's name, and a sensitive one given
    /// without a value kept from `stored`.
    async fn stored_headers(
        &self,
        tenant: &TenantId,
        id: &SubscriptionId,
        given: BTreeMap<String, HeaderInput>,
        stored: &[CustomHeader],
    ) -> Result<Vec<CustomHeader>> {
        if given.len() > MAX_HEADERS {
            return Err(ValidationError::new(
                "invalid_header",
                format!("at most {MAX_HEADERS} custom headers, not {}", given.len()),
            )
            .into());
        }
        let mut headers: Vec<CustomHeader> = Vec::with_capacity(given.len());
        for (name, input) in given {
            let name = HeaderName::parse(&name)?;
            if headers.iter().any(|h| h.name == name) {
                return Err(ValidationError::new(
                    "invalid_header",
                    format!("`{name}` is given twice (header names ignore case)"),
                )
                .into());
            }
            let was_sensitive = stored.iter().any(|h| h.name == name && h.is_sensitive());
            let (value, sensitive) = match input {
                HeaderInput::Value(v) => (Some(v), was_sensitive),
                HeaderInput::Detailed(d) => (d.value, d.sensitive.unwrap_or(was_sensitive)),
            };
            let value = match (value, sensitive) {
                (Some(v), false) => {
                    check_header_value(&name, &v)?;
                    HeaderValue::Plain(v)
                }
                (Some(v), true) => {
                    check_header_value(&name, &v)?;
                    let context = SecretContext::new(tenant, id).with_header(name.as_str());
                    HeaderValue::Sealed(self.ports.secrets.seal_text(&v, &context).await?)
                }
                (None, _) => match stored.iter().find(|h| h.name == name && h.is_sensitive()) {
                    Some(kept) => kept.value.clone(),
                    None => {
                        return Err(ValidationError::new(
                            "invalid_header",
                            format!("`{name}` has no value (only a sensitive header already stored keeps its own)"),
                        )
                        .into())
                    }
                },
            };
            headers.push(CustomHeader { name, value });
        }
        Ok(headers)
    }
}
