//! Ingest: store the event and one delivery per matching subscription, then queue them.
//! Also the read side: an event with its deliveries, a delivery with its attempts.

use futures::StreamExt;
use serde::Deserialize;

use super::Services;
use crate::error::{Error, PortError, Result, ValidationError};
use crate::model::*;
use crate::ports::{Created, DeliveryPage, DeliveryQuery};
use crate::state::next_task;

pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;
/// Events in one `POST /v1/events/batch`.
pub const MAX_BATCH: usize = 100;
/// An event's payload, as JSON: what the single-event request's body limit leaves room for.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// Events of a batch written to the store at once.
const STORE_CONCURRENCY: usize = 8;

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
    /// One event: a batch of one.
    pub async fn ingest(&self, tenant: &Tenant, new: NewEvent, idempotency_key: Option<String>) -> Result<Ingested> {
        let mut results = self.ingest_batch(tenant, vec![(new, idempotency_key)]).await?;
        results.pop().expect("one result per event")
    }

    /// Up to [`MAX_BATCH`] events, each with its own result in order: one that is invalid, or
    /// whose key was used for another body, fails alone. The subscriptions are read once,
    /// each event is stored with its deliveries (all or nothing, per event), then every new
    /// delivery is queued in one go. An `Err` is the whole request's: an empty or oversized
    /// batch, or the subscriptions could not be read.
    #[tracing::instrument(name = "ingest", skip_all, fields(tenant_id = %tenant.id, events = batch.len()))]
    pub async fn ingest_batch(
        &self,
        tenant: &Tenant,
        batch: Vec<(NewEvent, Option<String>)>,
    ) -> Result<Vec<Result<Ingested>>> {
        if batch.is_empty() || batch.len() > MAX_BATCH {
            return Err(ValidationError::new("invalid_batch", format!("a batch holds 1 to {MAX_BATCH} events")).into());
        }
        let now = self.now();
        let events: Vec<Result<Event>> = batch
            .into_iter()
            .map(|(new, key)| self.new_event(tenant, new, key, now))
            .collect();
        let subscriptions = if events.iter().any(Result::is_ok) {
            self.kept_subscriptions(&tenant.id).await?
        } else {
            Default::default()
        };
        // Stored before any attempt (seed 000): once this returns, each stored event is durable.
        let stored: Vec<Result<Ingested>> = futures::stream::iter(events)
            .map(|event| async {
                let event = event?;
                let deliveries: Vec<Delivery> = subscriptions
                    .iter()
                    .filter(|s| s.wants(&event.event_type))
                    .map(|s| Delivery::new(DeliveryId::generate(now, &mut *self.rng()), &event, s.id.clone()))
                    .collect();
                match self.ports.store.create_event(&event, &deliveries).await? {
                    Created::Existing(id) => self.repeated(tenant, &id, &event).await,
                    Created::New => Ok(Ingested {
                        event,
                        deliveries,
                        created: true,
                    }),
                }
            })
            .buffered(STORE_CONCURRENCY)
            .collect()
            .await;

        let tasks: Vec<_> = stored
            .iter()
            .flatten()
            .filter(|i| i.created)
            .flat_map(|i| i.deliveries.iter().map(|d| (next_task(d), 0)))
            .collect();
        let Err(err) = self.ports.queue.enqueue(&tasks).await else {
            return Ok(stored);
        };
        // Stored, not queued. With a key the client's retry finishes the job at once (see
        // `repeated`), so that event gets the error; without one a retry would be a second
        // event, so it is accepted and the scheduler's sweep queues its deliveries.
        tracing::warn!(error = %err, "enqueue after ingest failed; a retry with the same Idempotency-Key, or else the sweep, queues the deliveries");
        let retryable = matches!(err, PortError::Retryable { .. });
        Ok(stored
            .into_iter()
            .map(|result| match result {
                Ok(i) if i.created && i.event.idempotency_key.is_some() => Err(if retryable {
                    PortError::retryable("enqueue", err.to_string())
                } else {
                    PortError::permanent("enqueue", err.to_string())
                }
                .into()),
                other => other,
            })
            .collect())
    }

    /// The event as it will be stored, if its input is valid.
    fn new_event(
        &self,
        tenant: &Tenant,
        new: NewEvent,
        idempotency_key: Option<String>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Event> {
        if !new.payload.is_object() {
            return Err(ValidationError::new("invalid_payload", "payload must be a JSON object").into());
        }
        let size = serde_json::to_vec(&new.payload).map_or(usize::MAX, |p| p.len());
        if size > MAX_PAYLOAD_BYTES {
            return Err(ValidationError::new(
                "payload_too_large",
                format!("payload is {size} bytes; at most {} KB", MAX_PAYLOAD_BYTES / 1024),
            )
            .into());
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
        let id = match &idempotency_key {
            Some(key) => EventId::for_key(&tenant.id, key),
            None => EventId::generate(now, &mut *self.rng()),
        };
        Ok(Event {
            id,
            tenant_id: tenant.id.clone(),
            event_type: new.event_type,
            payload: new.payload,
            created_at: now,
            idempotency_key,
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
