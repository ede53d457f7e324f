//! Operational webhooks: Hookwise's own events about a tenant's endpoints, sent to the
//! tenant's subscriptions that name them (and to the deployment's operations tenant, if the
//! operator chose one) through the same pipeline as any event: signed, retried, counted.
//!
//! Each is an event stored under an idempotency key made from what it is about, so telling
//! it again (a dead-letter batch that comes back, a 410's message received twice) stores it
//! once. A tenant with no subscription to it stores nothing. None is ever about an
//! operational subscription's own endpoint, nor about a delivery of one of Hookwise's own
//! events: an operational endpoint that fails makes no events about its failures, so no
//! failure feeds on itself. The owner's emails are sent as before, whatever is subscribed.
//!
//! How sure each is: a dead delivery's and a 410's disabling are told by the handler that
//! must finish (the dead-letter batch, the 410's message), after the owner's email or the
//! death's hand-off, so an error brings them back until told. A disabling for failing is
//! told after its email, and a breaker's opening and closing and an endpoint's recovery
//! right after the write that made them: best effort, an error is logged and counted, and a
//! process that dies in between does not tell it.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::Services;
use crate::circuit::Circuit;
use crate::error::{Error, Result};
use crate::metrics;
use crate::model::*;

pub const DELIVERY_DEAD: &str = "hookwise.delivery.dead";
pub const ENDPOINT_DISABLED: &str = "hookwise.endpoint.disabled";
pub const BREAKER_OPENED: &str = "hookwise.endpoint.breaker_opened";
pub const BREAKER_CLOSED: &str = "hookwise.endpoint.breaker_closed";
pub const ENDPOINT_RECOVERED: &str = "hookwise.endpoint.recovered";

/// Whether a subscription receives Hookwise's own events: then none is made about it.
pub fn is_operational(sub: &Subscription) -> bool {
    sub.event_types.iter().any(EventTypeFilter::names_hookwise)
}

/// One of Hookwise's own events, before it is stored.
pub(super) struct Operational {
    pub event_type: &'static str,
    /// What makes it this one: the same thing told again has the same key.
    pub key: String,
    pub data: Value,
}

impl Operational {
    /// A delivery went dead (`round`: its round of attempts, a replay being another). None
    /// for a delivery of one of Hookwise's own events, or to an operational subscription.
    pub fn delivery_dead(delivery: &Delivery, sub: Option<&Subscription>) -> Option<Self> {
        if delivery.event_type.is_hookwise() || sub.is_some_and(is_operational) {
            return None;
        }
        Some(Self {
            event_type: DELIVERY_DEAD,
            key: format!("{DELIVERY_DEAD}:{}:{}", delivery.id, delivery.round),
            data: json!({
                "tenant_id": delivery.tenant_id,
                "subscription_id": delivery.subscription_id,
                "endpoint_url": sub.map(|s| s.url.as_str()),
                "delivery_id": delivery.id,
                "event_id": delivery.event_id,
                "event_type": delivery.event_type,
                "round": delivery.round,
                "attempts": delivery.attempts,
                "last_status_code": delivery.last_status_code,
                "last_error": delivery.last_error,
                "died_at": at(delivery.updated_at),
            }),
        })
    }

    /// A subscription disabled because its endpoint answered 410 Gone to `delivery`.
    pub fn disabled_gone(sub: &Subscription, delivery: &Delivery) -> Option<Self> {
        Self::disabled(sub, json!({"reason": "gone", "delivery_id": delivery.id}))
    }

    /// A subscription disabled because its endpoint has not succeeded since `since`.
    pub fn disabled_failing(sub: &Subscription, since: DateTime<Utc>, hours: u32) -> Option<Self> {
        Self::disabled(
            sub,
            json!({"reason": "failing", "failing_since": at(since), "auto_disable_after_hours": hours}),
        )
    }

    /// One per time it was active: each disabling ends one (`active_since`), so a disabling
    /// told again (however it is found) has the key of the first telling.
    fn disabled(sub: &Subscription, why: Value) -> Option<Self> {
        let active = sub.active_since.unwrap_or(sub.created_at);
        let mut data = about(sub);
        data.as_object_mut()?.extend(why.as_object()?.clone());
        Self::about_endpoint(
            sub,
            ENDPOINT_DISABLED,
            format!("{ENDPOINT_DISABLED}:{}:{}", sub.id, at(active)),
            data,
        )
    }

    /// The endpoint's breaker opened (from closed) after `failures` failed in a row.
    pub fn breaker_opened(sub: &Subscription, opened: &Circuit, failures: u32) -> Option<Self> {
        let mut data = about(sub);
        data["failures"] = failures.into();
        data["opened_at"] = at(opened.since).into();
        data["next_probe_at"] = opened.next_probe_at.map(at).into();
        Self::about_endpoint(
            sub,
            BREAKER_OPENED,
            format!("{BREAKER_OPENED}:{}:{}", sub.id, at(opened.since)),
            data,
        )
    }

    /// The endpoint's breaker closed (a probe, or an attempt past it, succeeded).
    pub fn breaker_closed(sub: &Subscription, was: Option<&Circuit>, closed: &Circuit) -> Option<Self> {
        let mut data = about(sub);
        data["opened_at"] = was.map(|c| at(c.since)).into();
        data["closed_at"] = at(closed.since).into();
        Self::about_endpoint(
            sub,
            BREAKER_CLOSED,
            format!("{BREAKER_CLOSED}:{}:{}", sub.id, at(closed.since)),
            data,
        )
    }

    /// The endpoint succeeded at `when` after `failures` failed attempts in a row, the first
    /// at `failing_since`.
    pub fn recovered(sub: &Subscription, run: FailureRun, when: DateTime<Utc>) -> Option<Self> {
        let mut data = about(sub);
        data["failures"] = run.failures.into();
        data["failing_since"] = run.failing_since.map(at).into();
        data["last_success_at"] = run.after_success.map(at).into();
        data["recovered_at"] = at(when).into();
        let key = recovered_key(
            &sub.id,
            run.after_success.or(sub.active_since).unwrap_or(sub.created_at),
        );
        Self::about_endpoint(sub, ENDPOINT_RECOVERED, key, data)
    }

    /// None about an operational subscription's own endpoint.
    fn about_endpoint(sub: &Subscription, event_type: &'static str, key: String, data: Value) -> Option<Self> {
        (!is_operational(sub)).then_some(Self { event_type, key, data })
    }
}

/// A run of failures, as the stored health shows it when a success ends it.
pub(super) struct FailureRun {
    /// Its length, as far as the health window holds it ([`crate::health`]'s last 50
    /// samples: a longer run reads as 50).
    pub failures: u32,
    /// Its first failure the window still holds.
    pub failing_since: Option<DateTime<Utc>>,
    /// The endpoint's last success before it, if any: what marks the run for good.
    pub after_success: Option<DateTime<Utc>>,
}

/// A recovery's key: the run it ends, marked by the success before it (or, for an endpoint
/// that never succeeded, the time its subscription became active, or was made), which stays the same
/// however long the run and whichever process sees it end: two processes tell it once.
fn recovered_key(sub: &SubscriptionId, run_after: DateTime<Utc>) -> String {
    format!("{ENDPOINT_RECOVERED}:{sub}:{}", at(run_after))
}

/// What every event about an endpoint says of it.
fn about(sub: &Subscription) -> Value {
    json!({
        "tenant_id": sub.tenant_id,
        "subscription_id": sub.id,
        "endpoint_url": sub.url.as_str(),
    })
}

fn at(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Services {
    /// Tell `what` (if anything: see its constructors), about `tenant`'s endpoint: to the
    /// tenant's subscriptions that want it, and to the operations tenant's. An `Err` is a
    /// store or queue error: telling it again is safe.
    pub(super) async fn tell(&self, tenant: &TenantId, what: Option<Operational>) -> Result<()> {
        let Some(what) = what else {
            return Ok(());
        };
        let deployment = self.kept_deployment().await?;
        let mut to = vec![tenant.clone()];
        to.extend(deployment.operations_tenant.filter(|o| o != tenant));
        // Each recipient is told, whatever became of the other's telling.
        let mut failed = None;
        for recipient in &to {
            if let Err(error) = self.tell_one(recipient, &what).await {
                failed.get_or_insert(error);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// [`tell`](Self::tell), best effort: an error is logged and counted.
    pub(super) async fn tell_best_effort(&self, tenant: &TenantId, what: Option<Operational>) {
        let event_type = what.as_ref().map(|w| w.event_type);
        if let Err(error) = self.tell(tenant, what).await {
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(%error, %tenant, ?event_type, "could not send an operational webhook");
        }
    }

    async fn tell_one(&self, recipient: &TenantId, what: &Operational) -> Result<()> {
        let Some(tenant) = self.kept_tenant(recipient).await? else {
            return Ok(());
        };
        if tenant.status != TenantStatus::Active {
            return Ok(());
        }
        let now = self.now();
        let event = Event {
            id: EventId::for_key(&tenant.id, &what.key),
            tenant_id: tenant.id.clone(),
            event_type: EventType::parse(what.event_type).expect("Hookwise's own types are valid"),
            payload: what.data.clone(),
            created_at: now,
            idempotency_key: Some(what.key.clone()),
            test: false,
        };
        let subscriptions = self.kept_subscriptions(&tenant.id).await?;
        let envelope = std::cell::OnceCell::new();
        let wanted: Vec<&Subscription> = subscriptions.iter().filter(|s| s.wants(&event, &envelope)).collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let planned = vec![Ok(super::events::plan(event, wanted.into_iter()))];
        let told = self.store_and_queue(&tenant, planned, now).await?;
        match told.into_iter().next().expect("one result per event") {
            Ok(_) => Ok(()),
            // Told before, when what it is about read differently (its endpoint's URL since
            // changed, say): that one stands.
            Err(Error::Validation(v)) if v.code == "idempotency_key_reused" => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Hookwise's own types as the catalogue lists them, for every tenant: each with its schema
/// and an example.
pub fn builtin_event_types() -> Vec<EventTypeDefinition> {
    let common = |extra: Value, required: &[&str]| {
        let mut properties = json!({
            "tenant_id": {"type": "string"},
            "subscription_id": {"type": "string"},
            "endpoint_url": {"type": ["string", "null"], "format": "uri"},
        });
        properties
            .as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        let mut all = vec!["tenant_id", "subscription_id", "endpoint_url"];
        all.extend_from_slice(required);
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "required": all,
            "properties": properties,
        })
    };
    let time = json!({"type": "string", "format": "date-time"});
    let maybe_time = json!({"type": ["string", "null"], "format": "date-time"});
    let example_sub = json!({
        "tenant_id": "ten_01hzy3k5qf8v9w2x4y6z8a0b1c",
        "subscription_id": "sub_01hzy3m7rg9x0y2z4a6b8c0d2e",
        "endpoint_url": "https://example.com/webhooks",
    });
    let with = |extra: Value| {
        let mut v = example_sub.clone();
        v.as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        v
    };
    let defs = [
        (
            super::events::PING,
            "A test send to one endpoint (`POST /v1/subscriptions/{id}/test` without a type).",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "required": ["message", "subscription_id"],
                "properties": {"message": {"type": "string"}, "subscription_id": {"type": "string"}},
            }),
            json!({
                "message": "A test from Hookwise: your endpoint is reachable and can verify the signature.",
                "subscription_id": "sub_01hzy3m7rg9x0y2z4a6b8c0d2e",
            }),
        ),
        (
            DELIVERY_DEAD,
            "A delivery ran out of attempts (or its endpoint answered 410, or its subscription was disabled): it will not be sent again unless replayed.",
            common(
                json!({
                    "delivery_id": {"type": "string"},
                    "event_id": {"type": "string"},
                    "event_type": {"type": "string"},
                    "round": {"type": "integer", "minimum": 0},
                    "attempts": {"type": "integer", "minimum": 0},
                    "last_status_code": {"type": ["integer", "null"]},
                    "last_error": {"type": ["string", "null"]},
                    "died_at": time.clone(),
                }),
                &["delivery_id", "event_id", "event_type", "round", "attempts", "died_at"],
            ),
            with(json!({
                "delivery_id": "dlv_01hzy3p9sh0y1z3a5b7c9d1e3f",
                "event_id": "evt_01hzy3n8rh0y1z3a5b7c9d1e3f",
                "event_type": "invoice.paid",
                "round": 0,
                "attempts": 9,
                "last_status_code": 503,
                "last_error": null,
                "died_at": "2026-12-06T09:30:00.000Z",
            })),
        ),
        (
            ENDPOINT_DISABLED,
            "Hookwise disabled a subscription: its endpoint answered 410 Gone (`reason: gone`), or has not succeeded for its `auto_disable_after_hours` (`reason: failing`).",
            common(
                json!({
                    "reason": {"enum": ["gone", "failing"]},
                    "delivery_id": {"type": "string"},
                    "failing_since": time.clone(),
                    "auto_disable_after_hours": {"type": "integer", "minimum": 1},
                }),
                &["reason"],
            ),
            with(json!({
                "reason": "failing",
                "failing_since": "2026-12-03T09:30:00.000Z",
                "auto_disable_after_hours": 72,
            })),
        ),
        (
            BREAKER_OPENED,
            "An endpoint's circuit breaker opened after its attempts failed in a row: its attempts are held, and one probe is sent at `next_probe_at`.",
            common(
                json!({
                    "failures": {"type": "integer", "minimum": 1},
                    "opened_at": time.clone(),
                    "next_probe_at": maybe_time.clone(),
                }),
                &["failures", "opened_at"],
            ),
            with(json!({
                "failures": 5,
                "opened_at": "2026-12-06T09:30:00.000Z",
                "next_probe_at": "2026-12-06T09:30:30.000Z",
            })),
        ),
        (
            BREAKER_CLOSED,
            "An endpoint's circuit breaker closed: a probe succeeded (or the breaker was turned off while open), and what it held is being released.",
            common(
                json!({"opened_at": maybe_time.clone(), "closed_at": time.clone()}),
                &["closed_at"],
            ),
            with(json!({
                "opened_at": "2026-12-06T09:30:00.000Z",
                "closed_at": "2026-12-06T09:42:00.000Z",
            })),
        ),
        (
            ENDPOINT_RECOVERED,
            "An endpoint succeeded again after a run of failed attempts as long as would open its circuit breaker.",
            common(
                json!({
                    "failures": {"type": "integer", "minimum": 1},
                    "failing_since": maybe_time,
                    "last_success_at": maybe_time,
                    "recovered_at": time,
                }),
                &["failures", "recovered_at"],
            ),
            with(json!({
                "failures": 12,
                "failing_since": "2026-12-06T09:30:00.000Z",
                "last_success_at": "2026-12-06T09:29:30.000Z",
                "recovered_at": "2026-12-06T09:42:00.000Z",
            })),
        ),
    ];
    let epoch = DateTime::<Utc>::UNIX_EPOCH;
    defs.into_iter()
        .map(|(name, description, schema, example)| EventTypeDefinition {
            name: EventType::parse(name).expect("Hookwise's own types are valid"),
            tenant_id: None,
            description: description.into(),
            schema: Some(schema),
            example: Some(example),
            // Hookwise's own events are built to match (the tests check each one); a mismatch
            // must not hold up the handler that tells it.
            validate: false,
            deprecated: false,
            created_at: epoch,
            updated_at: epoch,
        })
        .collect()
}

/// The built-in definition of one of Hookwise's own types.
pub fn builtin_event_type(name: &EventType) -> Option<EventTypeDefinition> {
    builtin_event_types().into_iter().find(|d| &d.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovery_is_keyed_by_the_run_it_ends_so_two_processes_tell_it_once() {
        let t = |s: &str| -> DateTime<Utc> { s.parse().unwrap() };
        let created = t("2026-12-06T08:00:00Z");
        let mut sub = Subscription {
            id: SubscriptionId::parse("sub_01hzy3m7rg9x0y2z4a6b8c0d2e").unwrap(),
            tenant_id: crate::model::TenantId::parse("ten_a").unwrap(),
            url: crate::model::EndpointUrl::parse("https://a.example.com/").unwrap(),
            event_types: vec![EventTypeFilter::all()],
            secret: crate::model::SealedSecret::unsealed(
                &crate::model::Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap(),
            ),
            previous_secret: None,
            previous_secret_expires_at: None,
            retry_policy: crate::policy::RetryPolicy::standard(),
            timeout_ms: crate::model::DEFAULT_TIMEOUT_MS,
            status: crate::model::SubscriptionStatus::Active,
            rate_limit_per_second: None,
            auto_disable_after_hours: None,
            circuit_breaker: Default::default(),
            active_since: Some(created),
            disable_notice_pending: false,
            disable_notice_claimed_at: None,
            disabled_reason: None,
            owner_email: None,
            description: None,
            filter: None,
            headers: Vec::new(),
            created_at: created,
            updated_at: created,
        };
        let run = |failures, since: &str, after: Option<&str>| FailureRun {
            failures,
            failing_since: Some(t(since)),
            after_success: after.map(t),
        };
        let key = |sub: &Subscription, r, when| Operational::recovered(sub, r, t(when)).unwrap().key;
        // Two processes, each with its own first success; and a run longer than the window,
        // whose first failure the window no longer holds: the same run, one key.
        let one = key(
            &sub,
            run(12, "2026-12-06T09:30:00Z", Some("2026-12-06T09:29:00Z")),
            "2026-12-06T09:40:00Z",
        );
        let other = key(
            &sub,
            run(12, "2026-12-06T09:30:00Z", Some("2026-12-06T09:29:00Z")),
            "2026-12-06T09:40:02Z",
        );
        let slid = key(
            &sub,
            run(50, "2026-12-06T09:35:00Z", Some("2026-12-06T09:29:00Z")),
            "2026-12-06T09:40:03Z",
        );
        assert_eq!((&one, &one), (&other, &slid));
        let next_run = key(
            &sub,
            run(5, "2026-12-06T10:30:00Z", Some("2026-12-06T09:40:00Z")),
            "2026-12-06T10:40:00Z",
        );
        assert_ne!(one, next_run);
        // Never a success: the run began when the subscription became active.
        let first = key(&sub, run(5, "2026-12-06T08:01:00Z", None), "2026-12-06T08:10:00Z");
        assert!(first.ends_with("2026-12-06T08:00:00.000Z"), "{first}");
        sub.active_since = None;
        let unknown = key(&sub, run(5, "2026-12-06T08:01:00Z", None), "2026-12-06T08:10:00Z");
        assert!(unknown.ends_with("2026-12-06T08:00:00.000Z"), "its creation: {unknown}");
    }

    #[test]
    fn every_builtin_example_matches_its_schema() {
        for def in builtin_event_types() {
            let schema = def.schema.as_ref().expect("a schema");
            let validator = jsonschema::validator_for(schema).expect("compiles");
            let example = def.example.as_ref().expect("an example");
            let errors: Vec<String> = validator.iter_errors(example).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{}: {errors:?}", def.name);
        }
    }
}
