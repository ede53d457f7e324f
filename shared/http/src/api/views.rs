//! What the API shows: the model without its internals, and secrets only where asked for.

use chrono::{DateTime, Utc};
use hookwise_core::circuit::{CircuitBreaker, CircuitState};
use hookwise_core::model::*;
use hookwise_core::policy::RetryPolicy;
use hookwise_core::services::{Ingested, SubscriptionWithSecret};
use hookwise_core::stats::{StatsCounts, Summary};
use serde::Serialize;

use super::ApiError;

#[derive(Debug, Serialize)]
pub struct SubscriptionView {
    pub id: SubscriptionId,
    pub url: EndpointUrl,
    pub event_types: Vec<EventTypeFilter>,
    pub retry_policy: RetryPolicy,
    pub timeout_ms: u32,
    pub rate_limit_per_second: Option<u32>,
    pub auto_disable_after_hours: Option<u32>,
    pub circuit_breaker: CircuitBreaker,
    pub status: SubscriptionStatus,
    pub disabled_reason: Option<String>,
    pub owner_email: Option<Email>,
    pub description: Option<String>,
    /// The content filter (an EventBridge event pattern), if it has one.
    pub filter: Option<serde_json::Value>,
    /// Custom headers by name: the value, or `{"sensitive": true}` for one never shown again.
    pub headers: std::collections::BTreeMap<String, serde_json::Value>,
    /// Until when the secret before the last rotation still signs.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Only in the responses to create, rotate-secret and reveal-secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl SubscriptionView {
    /// Without its secret: listings, reads, updates.
    pub fn public(s: Subscription) -> Self {
        Self::build(s, None)
    }

    /// With its current secret: creation, rotation and a reveal only.
    pub fn with_secret(made: SubscriptionWithSecret) -> Self {
        Self::build(made.subscription, Some(made.secret))
    }

    fn build(s: Subscription, secret: Option<Secret>) -> Self {
        Self {
            secret: secret.map(|secret| secret.as_str().to_owned()),
            id: s.id,
            url: s.url,
            event_types: s.event_types,
            retry_policy: s.retry_policy,
            timeout_ms: s.timeout_ms,
            rate_limit_per_second: s.rate_limit_per_second,
            auto_disable_after_hours: s.auto_disable_after_hours,
            circuit_breaker: s.circuit_breaker,
            status: s.status,
            disabled_reason: s.disabled_reason,
            owner_email: s.owner_email,
            description: s.description,
            filter: s.filter.map(serde_json::Value::from),
            headers: s
                .headers
                .iter()
                .map(|h| {
                    let shown = match &h.value {
                        HeaderValue::Plain(v) => serde_json::Value::from(v.as_str()),
                        HeaderValue::Sealed(_) => serde_json::json!({"sensitive": true}),
                    };
                    (h.name.to_string(), shown)
                })
                .collect(),
            previous_secret_expires_at: s.previous_secret_expires_at,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

/// Deliveries of one subscription by status.
#[derive(Debug, Serialize)]
pub struct DeliveryCounts {
    pub pending: u64,
    pub retrying: u64,
    pub delivered: u64,
    pub dead: u64,
}

/// `GET /v1/subscriptions[/{id}]`: a subscription with what the dashboard shows beside it.
#[derive(Debug, Serialize)]
pub struct SubscriptionSummary {
    #[serde(flatten)]
    pub subscription: SubscriptionView,
    /// The endpoint's recent success rate, 0 to 1, newer attempts weighing more; `null`
    /// before any attempt.
    pub health: Option<f64>,
    /// Its latest deliveries (up to `Services::COUNTED_DELIVERIES`) by status.
    pub counts: DeliveryCounts,
    /// `false` when it has older deliveries than those `counts` covers.
    pub counts_complete: bool,
    pub circuit: CircuitView,
    /// What its policy does while the endpoint is down, jitter off.
    pub schedule: ScheduleView,
}

/// A retry policy's timeline with jitter off: each retry's time after the first attempt,
/// and when a delivery that never succeeds is dead (its last attempt's).
#[derive(Debug, Serialize)]
pub struct ScheduleView {
    pub retries_after_seconds: Vec<f64>,
    pub dead_after_seconds: f64,
}

impl ScheduleView {
    pub fn of(policy: &RetryPolicy) -> Self {
        let rows = policy.nominal_schedule();
        Self {
            retries_after_seconds: rows.iter().skip(1).map(|(_, _, at)| *at).collect(),
            dead_after_seconds: rows.last().map_or(0.0, |(_, _, at)| *at),
        }
    }
}

/// An endpoint's circuit breaker as the API shows it.
#[derive(Debug, Serialize)]
pub struct CircuitView {
    /// `closed`, `open` (attempts held but for a probe per interval) or `half_open` (a probe
    /// in flight).
    pub state: &'static str,
    pub since: DateTime<Utc>,
    /// Open or half open: when the next probe may go.
    pub next_probe_at: Option<DateTime<Utc>>,
    /// The attempts it holds, counted to 100 (100: at least that many).
    pub held: u32,
}

impl From<hookwise_core::services::SubscriptionOverview> for SubscriptionSummary {
    fn from(o: hookwise_core::services::SubscriptionOverview) -> Self {
        // In `DeliveryStatus::ALL`'s order.
        let [pending, retrying, delivered, dead] = o.counts;
        let schedule = ScheduleView::of(&o.subscription.retry_policy);
        Self {
            schedule,
            subscription: SubscriptionView::public(o.subscription),
            // A score is a finite fraction; anything else would not be valid JSON.
            health: o.health.filter(|h| h.is_finite()).map(|h| h.clamp(0.0, 1.0)),
            counts: DeliveryCounts {
                pending,
                retrying,
                delivered,
                dead,
            },
            counts_complete: o.counts_complete,
            circuit: CircuitView {
                state: o.circuit.state.as_str(),
                since: o.circuit.since,
                // Closed, it has no probe to come (the field times the release's pages then).
                next_probe_at: o
                    .circuit
                    .next_probe_at
                    .filter(|_| o.circuit.state != CircuitState::Closed),
                held: o.held,
            },
        }
    }
}

#[derive(Debug, Serialize)]
pub struct DeliveryView {
    pub id: DeliveryId,
    pub event_id: EventId,
    pub subscription_id: SubscriptionId,
    pub event_type: EventType,
    pub status: DeliveryStatus,
    /// 0 for the original run, +1 for each replay.
    pub round: u32,
    /// Attempts made in this round.
    pub attempt_count: u32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_status_code: Option<u16>,
    pub last_error: Option<String>,
    /// Of a test send (`POST /v1/subscriptions/{id}/test`).
    pub test: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<Delivery> for DeliveryView {
    fn from(d: Delivery) -> Self {
        Self {
            id: d.id,
            event_id: d.event_id,
            subscription_id: d.subscription_id,
            event_type: d.event_type,
            status: d.status,
            round: d.round,
            attempt_count: d.attempts,
            next_attempt_at: d.next_attempt_at,
            last_status_code: d.last_status_code,
            last_error: d.last_error,
            test: d.test,
            created_at: d.created_at,
            updated_at: d.updated_at,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct AttemptView {
    pub round: u32,
    pub attempt: u32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: u64,
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The headers it sent (its signature's value left out); `null` once its event or
    /// subscription is gone.
    pub request_headers: Option<std::collections::BTreeMap<String, String>>,
}

impl From<Attempt> for AttemptView {
    fn from(a: Attempt) -> Self {
        Self {
            round: a.round,
            attempt: a.attempt,
            started_at: a.started_at,
            duration_ms: a.duration_ms,
            status_code: a.status_code,
            error: a.error,
            response_excerpt: a.response_excerpt,
            next_attempt_at: a.next_attempt_at,
            request_headers: None,
        }
    }
}

/// `GET /v1/deliveries/{id}`: the delivery and every attempt of every round, oldest first.
#[derive(Debug, Serialize)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: DeliveryView,
    pub attempts: Vec<AttemptView>,
}

/// One line of an accepted event: where it is going and how that stands.
#[derive(Debug, Serialize)]
pub struct AcceptedDelivery {
    pub id: DeliveryId,
    pub subscription_id: SubscriptionId,
    pub status: DeliveryStatus,
}

/// `POST /v1/events` → 202.
#[derive(Debug, Serialize)]
pub struct AcceptedEvent {
    pub id: EventId,
    pub deliveries: Vec<AcceptedDelivery>,
}

impl From<&Ingested> for AcceptedEvent {
    fn from(ingested: &Ingested) -> Self {
        Self {
            id: ingested.event.id.clone(),
            deliveries: ingested
                .deliveries
                .iter()
                .map(|d| AcceptedDelivery {
                    id: d.id.clone(),
                    subscription_id: d.subscription_id.clone(),
                    status: d.status,
                })
                .collect(),
        }
    }
}

/// `POST /v1/events/batch` → 202: one result per event, in the order sent.
#[derive(Debug, Serialize)]
pub struct AcceptedBatch {
    pub accepted: usize,
    pub failed: usize,
    pub results: Vec<BatchResult>,
}

/// An event of a batch: accepted (`replayed` when its key named an event already accepted,
/// and nothing new was written), or refused with the error a single request would have got.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum BatchResult {
    Accepted {
        #[serde(flatten)]
        event: AcceptedEvent,
        replayed: bool,
        /// The tenant the event is for.
        tenant: TenantId,
    },
    Failed {
        error: BatchError,
        /// The tenant the event named, where it named one (or the caller's).
        #[serde(skip_serializing_if = "Option::is_none")]
        tenant: Option<TenantId>,
    },
}

impl BatchResult {
    /// Refused with the error a single request would have got.
    pub fn failed(e: ApiError, tenant: Option<TenantId>) -> Self {
        // A payload too large is what a single request's body limit answers with 413.
        let status = if e.code == "payload_too_large" {
            axum::http::StatusCode::PAYLOAD_TOO_LARGE
        } else {
            e.status
        };
        Self::Failed {
            error: BatchError {
                status: status.as_u16(),
                code: e.code.into_owned(),
                message: e.message,
            },
            tenant,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct BatchError {
    /// The status a single `POST /v1/events` would have answered: 422 is the client's to fix,
    /// 503 worth sending again (with the same `idempotency_key`).
    pub status: u16,
    pub code: String,
    pub message: String,
}

/// `GET /v1/events/{id}`.
#[derive(Debug, Serialize)]
pub struct EventView {
    pub id: EventId,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub payload: serde_json::Value,
    pub idempotency_key: Option<String>,
    /// A test send.
    pub test: bool,
    pub created_at: DateTime<Utc>,
    pub deliveries: Vec<DeliveryView>,
}

/// A tenant as the operator routes show it: its keys by id (never their hashes), and its
/// retries as set and as they are.
#[derive(Debug, Serialize)]
pub struct TenantView {
    pub id: TenantId,
    pub name: String,
    pub owner_email: Email,
    pub status: TenantStatus,
    pub retries: RetriesView,
    pub api_keys: Vec<ApiKeyView>,
    pub created_at: DateTime<Utc>,
}

/// A tenant's retries flag: its setting, whether they are on, and why.
#[derive(Debug, Serialize)]
pub struct RetriesView {
    pub setting: RetriesSetting,
    pub enabled: bool,
    pub why: String,
}

#[derive(Debug, Serialize)]
pub struct ApiKeyView {
    pub id: String,
    pub created_at: DateTime<Utc>,
}

impl TenantView {
    pub fn of(t: &Tenant, deployment: &Deployment) -> Self {
        let retries = deployment.retries_for(t);
        Self {
            id: t.id.clone(),
            name: t.name.clone(),
            owner_email: t.owner_email.clone(),
            status: t.status,
            retries: RetriesView {
                setting: t.retries,
                enabled: retries.enabled,
                why: retries.why(),
            },
            api_keys: t
                .api_keys
                .iter()
                .map(|k| ApiKeyView {
                    id: k.id().to_owned(),
                    created_at: k.created_at,
                })
                .collect(),
            created_at: t.created_at,
        }
    }
}

/// A tenant and the API key just made for it: the key is shown this once.
#[derive(Debug, Serialize)]
pub struct NewApiKeyView {
    #[serde(flatten)]
    pub tenant: TenantView,
    pub api_key: String,
}

impl NewApiKeyView {
    pub fn new(tenant: TenantView, api_key: String) -> Self {
        Self { tenant, api_key }
    }
}

/// The retries rollout: the share of the tenants following it whose retries are on.
#[derive(Debug, Serialize)]
pub struct RolloutView {
    pub retries_percent: u8,
}

impl RolloutView {
    pub fn of(d: &Deployment) -> Self {
        Self {
            retries_percent: d.retries_rollout_percent,
        }
    }
}

/// Who hears of every tenant's endpoints (`GET/PUT /v1/operational-webhooks`).
#[derive(Debug, Serialize)]
pub struct OperationsView {
    /// The tenant whose subscriptions to `hookwise.*` types receive every tenant's
    /// operational webhooks, not only its own; `null`: none.
    pub tenant_id: Option<TenantId>,
}

impl OperationsView {
    pub fn of(d: &Deployment) -> Self {
        Self {
            tenant_id: d.operations_tenant.clone(),
        }
    }
}

/// The deployment's catalogue settings (`GET/PUT /v1/catalogue`).
#[derive(Debug, Serialize)]
pub struct CatalogueSettingsView {
    /// Whether a subscription may name only the types its tenant's catalogue defines.
    pub strict: bool,
}

impl CatalogueSettingsView {
    pub fn of(d: &Deployment) -> Self {
        Self {
            strict: d.strict_catalogue,
        }
    }
}

/// A listing: `{"data": [...], "next_cursor": "..." | null}`.
#[derive(Debug, Serialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub next_cursor: Option<String>,
}

/// The answer to a replay or a recover: the deliveries given a fresh attempt #1.
#[derive(Debug, Serialize)]
pub struct Replayed {
    pub replayed: Vec<DeliveryView>,
}

/// An endpoint's statistics over a window (`GET /v1/subscriptions/{id}/stats`).
#[derive(Debug, Serialize)]
pub struct StatsView {
    pub subscription_id: SubscriptionId,
    pub window: &'static str,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub attempts: AttemptCounts,
    /// Succeeded ÷ attempts; `null` with no attempts.
    pub success_rate: Option<f64>,
    /// Percentiles of attempt latency, each the upper bound of the histogram bin it falls in
    /// (`null`: above the last bin, 30 s); `null` with no attempts.
    pub latency_ms: Option<LatencyView>,
    /// Deliveries that went dead.
    pub dead: u64,
    /// The window in steps (5 min for 1h, 1 h for 24h, 6 h for 7d), oldest first.
    pub series: Vec<StatsPoint>,
}

#[derive(Debug, Serialize)]
pub struct AttemptCounts {
    pub total: u64,
    pub succeeded: u64,
    pub http_4xx: u64,
    pub http_5xx: u64,
    pub timeout: u64,
    pub error: u64,
}

impl AttemptCounts {
    fn of(c: &StatsCounts) -> Self {
        Self {
            total: c.attempts(),
            succeeded: c.succeeded,
            http_4xx: c.http_4xx,
            http_5xx: c.http_5xx,
            timeout: c.timeout,
            error: c.error,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct LatencyView {
    pub p50: Option<u32>,
    pub p95: Option<u32>,
    pub p99: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct StatsPoint {
    pub start: DateTime<Utc>,
    pub attempts: u64,
    pub succeeded: u64,
    pub dead: u64,
}

impl StatsView {
    pub fn of(id: &SubscriptionId, s: &Summary) -> Self {
        let p = |q| s.total.latency_percentile(q);
        Self {
            subscription_id: id.clone(),
            window: s.window.as_str(),
            from: s.from,
            to: s.to,
            attempts: AttemptCounts::of(&s.total),
            success_rate: s.success_rate(),
            latency_ms: p(0.5).map(|p50| LatencyView {
                p50,
                p95: p(0.95).flatten(),
                p99: p(0.99).flatten(),
            }),
            dead: s.total.dead,
            series: s
                .series
                .iter()
                .map(|(start, c)| StatsPoint {
                    start: *start,
                    attempts: c.attempts(),
                    succeeded: c.succeeded,
                    dead: c.dead,
                })
                .collect(),
        }
    }
}
