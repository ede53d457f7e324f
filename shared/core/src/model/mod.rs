//! The domain: tenants, subscriptions, events, deliveries and their attempts.

mod catalogue;
mod ids;
#[macro_use]
mod parse;
mod headers;

pub use catalogue::EventTypeDefinition;
pub use headers::{check_value as check_header_value, CustomHeader, HeaderName, HeaderValue, MASKED, MAX_HEADERS};
pub use ids::{DeliveryId, EventId, PortalSessionId, SubscriptionId, TenantId};
pub use parse::{Email, EndpointUrl, EventType, EventTypeFilter, SealedSecret, Secret, HOOKWISE_PREFIX};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::filter::ContentFilter;
use crate::policy::{RetryPolicy, Seconds};

/// One customer account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    /// Who is told when a delivery dies, unless the subscription names someone else.
    pub owner_email: Email,
    /// The `webhook_retries` flag as set for this tenant: on, off, or as the
    /// deployment's rollout decides ([`Deployment::retries_for`]). Off, a failed first attempt
    /// is final. (An older build stored `retries_enabled`, a bool: on or off.)
    #[serde(alias = "retries_enabled", deserialize_with = "RetriesSetting::stored")]
    pub retries: RetriesSetting,
    /// A disabled tenant's keys are refused, and no event is accepted for it; what it had
    /// accepted is still delivered.
    #[serde(default)]
    pub status: TenantStatus,
    pub created_at: DateTime<Utc>,
    /// Its API keys, oldest first: one, or two while a rotation is under way
    /// ([`MAX_API_KEYS`]). A tenant an older build of the DynamoDB store wrote has none
    /// listed here, though its first key works (see `Services::revoke_api_key`).
    #[serde(default)]
    pub api_keys: Vec<ApiKey>,
    /// Moves on every change: what a conditional write of the tenant checks.
    #[serde(default)]
    pub version: u64,
    /// Portal sessions made until this time are refused: "revoke all of its sessions".
    #[serde(default)]
    pub portal_sessions_since: Option<DateTime<Utc>>,
}

impl Tenant {
    /// What writing this copy over `read` does to the keys: the ones it claims (held here,
    /// not there) and the ones it frees (held there, not here).
    pub fn key_changes<'a>(&'a self, read: &'a Tenant) -> (Vec<&'a ApiKey>, Vec<&'a ApiKey>) {
        let missing_from = |from: &'a Tenant, of: &'a Tenant| {
            of.api_keys
                .iter()
                .filter(|k| !from.api_keys.iter().any(|f| f.hash == k.hash))
                .collect()
        };
        (missing_from(read, self), missing_from(self, read))
    }
}

/// A customer's portal session: the dashboard in portal mode, scoped to one tenant, until it
/// expires or is revoked. Its token (`hwp_`, shown once, carried after `#` in the link) is its
/// id and a secret; only the secret's SHA-256 is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortalSession {
    pub id: PortalSessionId,
    pub tenant_id: TenantId,
    /// [`crate::auth::hash_api_key`] of the token's secret.
    pub secret_hash: String,
    /// Reads only: no change, no replay.
    pub read_only: bool,
    pub created_at: DateTime<Utc>,
    pub valid_until: DateTime<Utc>,
}

/// Keys a tenant holds at most: the current one and the one it is rotating to.
pub const MAX_API_KEYS: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TenantStatus {
    #[default]
    Active,
    Disabled,
}

impl TenantStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Disabled => "disabled",
        }
    }
}

/// A tenant's retries flag (`webhook_retries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetriesSetting {
    On,
    Off,
    /// As the deployment's rollout decides for this tenant (a new tenant's setting).
    #[default]
    Rollout,
}

impl RetriesSetting {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::Rollout => "rollout",
        }
    }

    /// As stored: a setting's name, or an older build's `retries_enabled` bool.
    fn stored<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Enabled(bool),
            Setting(RetriesSetting),
        }
        Ok(match Stored::deserialize(d)? {
            Stored::Enabled(true) => Self::On,
            Stored::Enabled(false) => Self::Off,
            Stored::Setting(s) => s,
        })
    }
}

/// What the deployment holds beside its tenants: the operator's keys and the retries rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    /// Operator keys (`hwo_`), oldest first: one, or two while a rotation is under way
    /// ([`MAX_API_KEYS`]). An operator key acts for any tenant.
    #[serde(default)]
    pub operator_keys: Vec<ApiKey>,
    /// The share of the tenants that follow the rollout whose retries are on, 0 to 100.
    pub retries_rollout_percent: u8,
    /// The tenant whose subscriptions to Hookwise's own types (operational webhooks) hear of
    /// every tenant's endpoints, not only its own: the operator's.
    #[serde(default)]
    pub operations_tenant: Option<TenantId>,
    /// Whether a subscription may name only the event types its tenant's catalogue defines
    /// (Hookwise's own, its own and the deployment's): an unknown one is refused.
    #[serde(default)]
    pub strict_catalogue: bool,
    /// Moves on every change: what a conditional write checks (0: never written).
    #[serde(default)]
    pub version: u64,
}

impl Default for Deployment {
    /// No operator key, and every tenant's retries on (the rollout at 100 %).
    fn default() -> Self {
        Self {
            operator_keys: Vec::new(),
            retries_rollout_percent: 100,
            operations_tenant: None,
            strict_catalogue: false,
            version: 0,
        }
    }
}

/// Whether a tenant's retries are on, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveRetries {
    pub enabled: bool,
    pub setting: RetriesSetting,
    /// The tenant's place in the rollout, 0 to 99: it is in while this is below the percentage.
    pub rollout_bucket: u8,
    pub rollout_percent: u8,
}

impl EffectiveRetries {
    /// In words, for an API read and the dashboard.
    pub fn why(&self) -> String {
        match self.setting {
            RetriesSetting::On => "set on for this tenant".into(),
            RetriesSetting::Off => "set off for this tenant".into(),
            RetriesSetting::Rollout if self.enabled => format!(
                "in the rollout: its bucket, {}, is below {} %",
                self.rollout_bucket, self.rollout_percent
            ),
            RetriesSetting::Rollout => format!(
                "not in the rollout yet: its bucket, {}, is not below {} %",
                self.rollout_bucket, self.rollout_percent
            ),
        }
    }
}

impl Deployment {
    /// Whether a delivery's attempts are retried: its tenant's retries (see `retries_for`);
    /// a tenant that is gone keeps the default, on.
    pub fn retries_on(&self, tenant: Option<&Tenant>) -> bool {
        tenant.is_none_or(|t| self.retries_for(t).enabled)
    }

    /// Whether `tenant`'s retries are on: its own setting, or the rollout's word for it.
    pub fn retries_for(&self, tenant: &Tenant) -> EffectiveRetries {
        let bucket = rollout_bucket(&tenant.id);
        let enabled = match tenant.retries {
            RetriesSetting::On => true,
            RetriesSetting::Off => false,
            RetriesSetting::Rollout => bucket < self.retries_rollout_percent,
        };
        EffectiveRetries {
            enabled,
            setting: tenant.retries,
            rollout_bucket: bucket,
            rollout_percent: self.retries_rollout_percent,
        }
    }
}

/// A tenant's place in the rollout, 0 to 99, from a SHA-256 of its id: the same on every
/// host and for ever, so raising the percentage keeps in every tenant that was in.
pub fn rollout_bucket(id: &TenantId) -> u8 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_str().as_bytes());
    let n = u64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 has 32 bytes"));
    (n % 100) as u8
}

/// An API key as stored: its hash (the key itself is shown once, never kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    /// [`crate::auth::hash_api_key`] of the key.
    pub hash: String,
    pub created_at: DateTime<Utc>,
}

impl ApiKey {
    /// What an operator names the key by: the start of its hash (the key is not kept).
    pub fn id(&self) -> &str {
        &self.hash[..self.hash.len().min(12)]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubscriptionStatus {
    Active,
    Disabled,
}

/// How long a rotated-out secret still signs, so consumers can switch without a gap.
pub const SECRET_ROTATION_GRACE_HOURS: i64 = 24;
/// The default total timeout of one delivery attempt.
pub const DEFAULT_TIMEOUT_MS: u32 = 10_000;
pub const MAX_TIMEOUT_MS: u32 = 30_000;
/// The highest per-endpoint rate limit, in POSTs a second.
pub const MAX_RATE_LIMIT: u32 = 10_000;
/// A subscription's `auto_disable_after_hours` unless it says otherwise: five days.
pub const DEFAULT_AUTO_DISABLE_HOURS: u32 = 120;
/// The longest `auto_disable_after_hours`: a year.
pub const MAX_AUTO_DISABLE_HOURS: u32 = 8_760;
/// The `disabled_reason` of a subscription Hookwise disabled because its endpoint kept failing.
pub const DISABLED_FAILING: &str = "failing";

fn default_auto_disable() -> Option<u32> {
    Some(DEFAULT_AUTO_DISABLE_HOURS)
}

/// `None` as 0, and 0 (or null) as `None`.
mod never_is_zero {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(v.unwrap_or(0))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        Ok(Option::<u32>::deserialize(d)?.filter(|h| *h > 0))
    }
}

/// An endpoint and the events it wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscription {
    pub id: SubscriptionId,
    pub tenant_id: TenantId,
    pub url: EndpointUrl,
    pub event_types: Vec<EventTypeFilter>,
    /// The current signing secret, sealed.
    pub secret: SealedSecret,
    /// The secret before the last rotation, still signing until `previous_secret_expires_at`.
    pub previous_secret: Option<SealedSecret>,
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub retry_policy: RetryPolicy,
    pub timeout_ms: u32,
    /// At most this many POSTs a second to the endpoint, across every worker: an attempt
    /// over it waits for the slot the limiter reserves for it. `None`: no limit.
    #[serde(default)]
    pub rate_limit_per_second: Option<u32>,
    /// Hookwise disables it (`disabled_reason` [`DISABLED_FAILING`]) once its endpoint has had
    /// no successful attempt for this long, and tells its owner. `None`: never.
    /// Stored as a number, 0 for never (a store may drop a null, which would then read back
    /// as the default); absent (written before it existed) is the default.
    #[serde(default = "default_auto_disable", with = "never_is_zero")]
    pub auto_disable_after_hours: Option<u32>,
    /// Holds its attempts while its endpoint keeps failing (see [`crate::circuit`]); on
    /// unless turned off, and on for one written before it existed.
    #[serde(default)]
    pub circuit_breaker: crate::circuit::CircuitBreaker,
    pub status: SubscriptionStatus,
    /// Why it was disabled, when Hookwise disabled it (an endpoint answering 410, or failing).
    pub disabled_reason: Option<String>,
    /// Since when it has been active: its creation, or its last re-enabling. `None` on one an
    /// older build wrote (its `created_at` then).
    #[serde(default)]
    pub active_since: Option<DateTime<Utc>>,
    /// Disabled for failing, and its owner not told yet: whoever finds it so sends the email
    /// (the disabling call, or a message of its coming back after that call failed).
    #[serde(default)]
    pub disable_notice_pending: bool,
    /// When a call took the pending email on, to send it: another call leaves it to that one
    /// until [`crate::services::DISABLE_NOTICE_CLAIM`] has passed, so the owner is told once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_notice_claimed_at: Option<DateTime<Utc>>,
    pub owner_email: Option<Email>,
    pub description: Option<String>,
    /// Which events of its types it gets, by their content. Stored as its JSON text, so it
    /// reads back exactly as written on every store.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "filter_as_text")]
    pub filter: Option<ContentFilter>,
    /// Sent with every POST, after Hookwise's own; sensitive values sealed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<CustomHeader>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A subscription's filter as a JSON string in the stored document.
mod filter_as_text {
    use super::ContentFilter;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(filter: &Option<ContentFilter>, s: S) -> Result<S::Ok, S::Error> {
        match filter {
            Some(f) => s.serialize_str(&f.as_json().to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ContentFilter>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        let json = serde_json::from_str(&text).map_err(D::Error::custom)?;
        ContentFilter::parse(json).map(Some).map_err(D::Error::custom)
    }
}

impl Subscription {
    /// The time between two of its attempts under its rate limit, if it has one.
    pub fn slot_interval(&self) -> Option<std::time::Duration> {
        self.rate_limit_per_second
            .filter(|r| *r > 0)
            .map(|r| std::time::Duration::from_secs(1) / r)
    }

    /// When its endpoint's failures started to count towards auto-disable: since it became
    /// active, or its last success if later.
    pub fn failing_since(&self, last_success: Option<DateTime<Utc>>) -> DateTime<Utc> {
        let active = self.active_since.unwrap_or(self.created_at);
        last_success.map_or(active, |s| s.max(active))
    }

    /// Whether `event` is delivered to it: active, one of its event types matches, and so
    /// does its filter, if it has one, on `envelope` (the event's, made once for every
    /// subscription that needs it).
    pub fn wants(&self, event: &Event, envelope: &std::cell::OnceCell<serde_json::Value>) -> bool {
        self.status == SubscriptionStatus::Active
            && self.event_types.iter().any(|f| f.matches(&event.event_type))
            && self
                .filter
                .as_ref()
                .is_none_or(|f| f.matches(envelope.get_or_init(|| event.envelope())))
    }

    /// The secrets that sign a message sent at `now`, sealed: the current one, and the
    /// previous one during its grace period.
    pub fn signing_secrets(&self, now: DateTime<Utc>) -> Vec<&SealedSecret> {
        let mut secrets = vec![&self.secret];
        if let (Some(prev), Some(until)) = (&self.previous_secret, self.previous_secret_expires_at) {
            if now < until {
                secrets.push(prev);
            }
        }
        secrets
    }
}

/// An event as a service handed it to Hookwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: EventId,
    pub tenant_id: TenantId,
    pub event_type: EventType,
    /// A JSON object.
    pub payload: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub idempotency_key: Option<String>,
    /// A test send to one subscription (`Services::send_test`), not an event of the service's.
    #[serde(default, skip_serializing_if = "is_false")]
    pub test: bool,
}

fn is_false(b: &bool) -> bool {
    !b
}

impl Event {
    /// The body a subscriber receives; a test send's says so (`"test": true`).
    pub fn envelope(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "id": self.id,
            "type": self.event_type,
            "timestamp": self.created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "data": self.payload,
        });
        if self.test {
            body["test"] = serde_json::Value::Bool(true);
        }
        body
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// No attempt made yet (or replayed and waiting for its fresh first attempt).
    Pending,
    /// At least one attempt failed; the next is scheduled.
    Retrying,
    Delivered,
    Dead,
}

impl DeliveryStatus {
    pub const ALL: [DeliveryStatus; 4] = [Self::Pending, Self::Retrying, Self::Delivered, Self::Dead];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Retrying => "retrying",
            Self::Delivered => "delivered",
            Self::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Result<Self, crate::error::ValidationError> {
        Self::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| {
            crate::error::ValidationError::new(
                "invalid_status",
                format!("unknown delivery status `{s}`: use pending, retrying, delivered or dead"),
            )
        })
    }

    /// Delivered and dead change only through replay.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Delivered | Self::Dead)
    }
}

/// One event going to one subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: DeliveryId,
    pub tenant_id: TenantId,
    pub event_id: EventId,
    pub subscription_id: SubscriptionId,
    /// Copied from the event so listings need no second read.
    pub event_type: EventType,
    pub status: DeliveryStatus,
    /// Starts at 0; each replay starts a new round with a fresh attempt #1.
    pub round: u32,
    /// Attempts made in this round.
    pub attempts: u32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The soonest its next attempt may be made: the time its schedule (or the endpoint's
    /// `Retry-After`) gave the retry. No attempt is made sooner, whatever message carries it
    /// (a copy sent again at once, an operator's redrive of the dead-letter queue): one that
    /// comes early goes back until then. `next_attempt_at` starts here and only moves later.
    /// None: due at once (a first attempt, a replay's).
    #[serde(default)]
    pub not_before: Option<DateTime<Utc>>,
    /// The delay waited before the latest retry (decorrelated jitter needs it).
    pub last_delay_seconds: Option<Seconds>,
    pub last_status_code: Option<u16>,
    pub last_error: Option<String>,
    /// The give-up time an attempt of this round was held to by the circuit breaker, once
    /// that attempt was made then: the rest of the round's schedule goes out as it comes,
    /// never held again, whichever message (a retry, the sweep's, a redrive) carries it.
    #[serde(default)]
    pub held_until: Option<DateTime<Utc>>,
    /// Of a test send (copied from the event, as its type is).
    #[serde(default, skip_serializing_if = "is_false")]
    pub test: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Delivery {
    /// How long after its delivery's creation a retry may be due and still wait for the
    /// message its attempt queued, outside the sweep ([`Self::awaits_queued_retry`]). The
    /// audit, an hour after the creation, finds one whose message the queue lost: this leaves
    /// it 40 minutes late by then, however late the queue was.
    pub const QUEUED_RETRY_HORIZON: chrono::Duration = chrono::Duration::minutes(20);

    /// Whether the scheduler's sweep (`Store::overdue_deliveries`) looks after this delivery's
    /// next message: a replay's is queued after the state change that called for it, so a
    /// crash between the two would leave the delivery waiting for nothing; and any attempt's
    /// once its next attempt was moved (held, deferred to a rate-limit slot, or queued again
    /// by the sweep or the audit). Not one that waits for the message queued before its state
    /// was written ([`Self::awaits_queued_message`]): that is never missing, and the sweep
    /// would only duplicate it in a backlog; the queue may still lose it (past its retention,
    /// or in a purge), and the scheduler's audit finds it then.
    pub fn is_swept(&self) -> bool {
        !self.status.is_final() && !self.awaits_queued_message()
    }

    /// Waiting for a message queued before its state was written: a first attempt's
    /// ([`Self::awaits_first_message`]) or an early retry's ([`Self::awaits_queued_retry`]).
    /// The scheduler's audit (`Store::awaiting_queued_message`) looks for these.
    pub fn awaits_queued_message(&self) -> bool {
        self.awaits_first_message() || self.awaits_queued_retry()
    }

    /// A retry still waiting for the message its attempt queued before writing it (retrying,
    /// its next attempt where that attempt put it, `not_before`, and due within
    /// [`Self::QUEUED_RETRY_HORIZON`] of the creation, so the audit looks at it after that).
    /// A later retry is the sweep's, its message queued all the same.
    pub fn awaits_queued_retry(&self) -> bool {
        self.status == DeliveryStatus::Retrying
            && self.next_attempt_at == self.not_before
            && self
                .next_attempt_at
                .is_some_and(|at| at <= self.created_at + Self::QUEUED_RETRY_HORIZON)
    }

    /// A first attempt still waiting for the one message its ingest queued (pending, round
    /// 0, its next attempt where the ingest put it).
    pub fn awaits_first_message(&self) -> bool {
        self.status == DeliveryStatus::Pending && self.round == 0 && self.next_attempt_at == Some(self.created_at)
    }

    /// A new delivery of `event` to a subscription: pending, its first attempt due at once.
    pub fn new(id: DeliveryId, event: &Event, subscription_id: SubscriptionId) -> Self {
        Self {
            id,
            tenant_id: event.tenant_id.clone(),
            event_id: event.id.clone(),
            subscription_id,
            event_type: event.event_type.clone(),
            status: DeliveryStatus::Pending,
            round: 0,
            attempts: 0,
            next_attempt_at: Some(event.created_at),
            not_before: None,
            last_delay_seconds: None,
            last_status_code: None,
            last_error: None,
            held_until: None,
            test: event.test,
            created_at: event.created_at,
            updated_at: event.created_at,
        }
    }
}

/// The largest response excerpt kept with an attempt.
pub const EXCERPT_LIMIT: usize = 4096;

/// Cut a response body to [`EXCERPT_LIMIT`] bytes on a character boundary.
pub fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_LIMIT)]);
    let mut end = text.len().min(EXCERPT_LIMIT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The record of one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub delivery_id: DeliveryId,
    pub round: u32,
    /// From 1.
    pub attempt: u32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: u64,
    pub status_code: Option<u16>,
    /// Set when the attempt got no HTTP status: `timeout: ...`, `connect: ...`, `blocked: ...`.
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    /// When the next attempt is due, if there is one.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_is_cut_at_four_kilobytes_on_a_character_boundary() {
        let body = "é".repeat(3000); // 6000 bytes
        let cut = excerpt(body.as_bytes());
        assert!(cut.len() <= EXCERPT_LIMIT);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(excerpt(b"short"), "short");
    }
}
