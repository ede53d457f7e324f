//! Ingest: store the event and one delivery per matching subscription, then queue them.
//! Also the read side: an event with its deliveries, a delivery with its attempts.

use serde::Deserialize;

use super::Services;
use crate::error::{Error, Result, ValidationError};
use crate::model::*;
use crate::ports::{Created, DeliveryPage, DeliveryQuery};
use crate::state::next_task;

pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// `POST /v1/events`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewEvent {
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub payload: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct Ingested {
    pub event: Event,
    pub deliveries: Vec<Delivery>,
    /// `false` when the idempotency key named an existing event and nothing was written.
    pub created: bool,
}

#[derive(Debug, Clone)]
pub struct EventWithDeliveries {
    pub event: Event,
    pub deliveries: Vec<Delivery>,
}

impl Services {
    #[tracing::instrument(name = "ingest", skip_all,
        fields(tenant_id = %tenant.id, event_type = %new.event_type, event_id = tracing::field::Empty))]
    pub async fn ingest(&self, tenant: &Tenant, new: NewEvent, idempotency_key: Option<String>) -> Result<Ingested> {
        if !new.payload.is_object() {
            return Err(ValidationError::new("invalid_payload", "payload must be a JSON object").into());
        }
        if let Some(key) = &idempotency_key {
            if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN {
                return Err(ValidationError::new(
                    "invalid_idempotency_key",
                    "Idempotency-Key must be 1 to 255 characters",
                )
                .into());
            }
        }
        let now = self.now();
        let event = Event {
            id: EventId::generate(now, &mut *self.rng()),
            tenant_id: tenant.id.clone(),
            event_type: new.event_type,
            payload: new.payload,
            created_at: now,
            idempotency_key,
        };
        tracing::Span::current().record("event_id", tracing::field::display(&event.id));
        let subscriptions = self.ports.store.list_subscriptions(&tenant.id).await?;
        let deliveries: Vec<Delivery> = subscriptions
            .iter()
            .filter(|s| s.wants(&event.event_type))
            .map(|s| Delivery::new(DeliveryId::generate(now, &mut *self.rng()), &event, s.id.clone()))
            .collect();

        // Stored before any attempt (seed 000): once this returns, the event is durable.
        if let Created::Existing(id) = self.ports.store.create_event(&event, &deliveries).await? {
            return self.repeated(tenant, &id, &event).await;
        }
        let tasks: Vec<_> = deliveries.iter().map(|d| (next_task(d), 0)).collect();
        if let Err(err) = self.ports.queue.enqueue(&tasks).await {
            // Stored, not queued. With a key the client's retry finishes the job at once (see
            // `repeated`), so it gets the error; without one a retry would be a second event,
            // so it gets its 202 and the scheduler's sweep queues the deliveries.
            if event.idempotency_key.is_some() {
                tracing::warn!(event_id = %event.id, error = %err, "enqueue after ingest failed; the client's retry with its Idempotency-Key queues the deliveries");
                return Err(err.into());
            }
            tracing::warn!(event_id = %event.id, error = %err, "enqueue after ingest failed; the sweep will pick the deliveries up");
        }
        Ok(Ingested {
            event,
            deliveries,
            created: true,
        })
    }

    /// The same `Idempotency-Key` again. With the same type and payload it is the client's
    /// retry: it gets the first event, and the first attempts of deliveries still waiting for
    /// one are queued again, since the first request may have died between storing them and
    /// queueing them (a message too many is harmless: the conditional writes absorb it); if
    /// that fails too, the client gets the error and retries again. With
    /// another type or payload it is a mistake, refused rather than answered with the
    /// first event.
    async fn repeated(&self, tenant: &Tenant, id: &EventId, new: &Event) -> Result<Ingested> {
        let existing = self.get_event(tenant, id).await?;
        if existing.event.event_type != new.event_type || existing.event.payload != new.payload {
            return Err(ValidationError::new(
                "idempotency_key_reused",
                format!(
                    "Idempotency-Key was used for event {id} with another type or payload; a new event needs a new key"
                ),
            )
            .into());
        }
        let waiting: Vec<_> = existing
            .deliveries
            .iter()
            .filter(|d| d.status == DeliveryStatus::Pending && d.round == 0 && d.attempts == 0)
            .map(|d| (next_task(d), 0))
            .collect();
        if let Err(err) = self.ports.queue.enqueue(&waiting).await {
            tracing::warn!(event_id = %id, error = %err, "enqueue on a repeated ingest failed; the client's next retry queues the deliveries");
            return Err(err.into());
        }
        Ok(Ingested {
            event: existing.event,
            deliveries: existing.deliveries,
            created: false,
        })
    }

    pub async fn get_event(&self, tenant: &Tenant, id: &EventId) -> Result<EventWithDeliveries> {
        let event = self
            .ports
            .store
            .get_event(&tenant.id, id)
            .await?
            .ok_or_else(|| Error::not_found("event", id))?;
        let deliveries = self.ports.store.event_deliveries(&tenant.id, id).await?;
        Ok(EventWithDeliveries { event, deliveries })
    }

    /// A tenant's delivery (another tenant's id is not found) and every attempt of it.
    pub async fn get_delivery(&self, tenant: &Tenant, id: &DeliveryId) -> Result<(Delivery, Vec<Attempt>)> {
        let delivery = self
            .ports
            .store
            .get_delivery(id)
            .await?
            .filter(|d| d.tenant_id == tenant.id)
            .ok_or_else(|| Error::not_found("delivery", id))?;
        let attempts = self.ports.store.attempts(id).await?;
        Ok((delivery, attempts))
    }

    pub const MAX_PAGE: u32 = 100;

    /// Newest first. `limit` 0 means 50; above 100 is refused.
    pub async fn list_deliveries(&self, tenant: &Tenant, mut query: DeliveryQuery) -> Result<DeliveryPage> {
        if query.limit > Self::MAX_PAGE {
            return Err(ValidationError::new("invalid_limit", format!("limit must be 1 to {}", Self::MAX_PAGE)).into());
        }
        if query.limit == 0 {
            query.limit = 50;
        }
        Ok(self.ports.store.list_deliveries(&tenant.id, &query).await?)
    }
}
