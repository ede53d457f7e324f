//! Ingest: store the event and one delivery per matching subscription, then queue them.
//! Also the read side: an event with its deliveries, a delivery with its attempts.

use futures::StreamExt;
use serde::Deserialize;

use super::deliver::EARLY_COPY_LAG;
use super::Services;
use crate::error::{Error, PortError, Result, ValidationError};
use crate::model::*;
use crate::ports::{Created, DeliveryPage, DeliveryQuery, EventWrite, StoreWithQueue};
use crate::state::queued_ahead_task;

pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;
/// Events in one `POST /v1/events/batch`.
pub const MAX_BATCH: usize = 100;
/// An event's payload, as JSON: what the single-event request's body limit leaves room for.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// Events of a batch answered at once (a key stored before is read back).
const STORE_CONCURRENCY: usize = 8;
/// First attempts queued before their events are stored, and events stored after them, at a
/// time: as many messages as one request to SQS holds. A group's events are written all at
/// once: each message waits for its own event's write, and the batch for one write a group.
const QUEUE_GROUP: usize = 10;

/// `POST /v1/events`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewEvent {
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub payload: serde_json::Value,
}

/// The type of a test send that names none.
pub const PING: &str = "hookwise.ping";

/// An event and one delivery to each subscription given. Ids derived from the event's and
/// the subscription's: a re-run of the same ingest names, and queues, the same deliveries.
pub(super) fn plan<'a>(event: Event, subscriptions: impl Iterator<Item = &'a Subscription>) -> (Event, Vec<Delivery>) {
    let deliveries = subscriptions
        .map(|s| Delivery::new(DeliveryId::for_event(&event.id, &s.id), &event, s.id.clone()))
        .collect();
    (event, deliveries)
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
    /// whose key was used for another body, fails alone. The subscriptions are read once; a
    /// few events at a time, their deliveries' first attempts are queued, *then* each event
    /// is stored with its deliveries (`queue_then_write`). Where one backend holds the store
    /// and the queue ([`Ports::store_with_queue`]), each event is written with its messages
    /// instead, all or nothing, the batch's events in one call. An `Err` is the whole
    /// request's: an empty or oversized batch, or the subscriptions could not be read.
    ///
    /// [`Ports::store_with_queue`]: super::Ports::store_with_queue
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
            .map(|(new, key)| {
                if new.event_type.is_hookwise() {
                    return Err(super::catalogue::reserved(&new.event_type).into());
                }
                self.new_event(tenant, new, key, now)
            })
            .collect();
        let subscriptions = if events.iter().any(Result::is_ok) {
            self.kept_subscriptions(&tenant.id).await?
        } else {
            Default::default()
        };
        let planned = events
            .into_iter()
            .map(|event| {
                event.map(|event| {
                    let envelope = std::cell::OnceCell::new();
                    let wanted: Vec<&Subscription> =
                        subscriptions.iter().filter(|s| s.wants(&event, &envelope)).collect();
                    plan(event, wanted.into_iter())
                })
            })
            .collect();
        self.store_and_queue(tenant, planned, now).await
    }

    /// `POST /v1/subscriptions/{id}/test`: an event to this one subscription, whatever its
    /// event types and filter, through the same pipeline as any event (signed, retried,
    /// counted); the event and its delivery are flagged `test`. The event: a `hookwise.ping`
    /// without a type; a type's example in the catalogue without a payload; else as given.
    pub async fn send_test(
        &self,
        tenant: &Tenant,
        id: &SubscriptionId,
        event_type: Option<EventType>,
        payload: Option<serde_json::Value>,
    ) -> Result<Ingested> {
        let subscription = self.get_subscription(tenant, id).await?;
        if subscription.status != SubscriptionStatus::Active {
            return Err(Error::conflict(format!(
                "subscription {id} is disabled: resume it to send it a test"
            )));
        }
        let new = match (event_type, payload) {
            (None, None) => NewEvent {
                event_type: EventType::parse(PING).expect("a valid type"),
                payload: serde_json::json!({
                    "message": "A test from Hookwise: your endpoint is reachable and can verify the signature.",
                    "subscription_id": id,
                }),
            },
            (Some(event_type), Some(payload)) => NewEvent { event_type, payload },
            (Some(event_type), None) => {
                let example = match self.event_type_for(tenant, &event_type).await {
                    Ok(def) => def.example,
                    Err(Error::NotFound { .. }) => None,
                    Err(e) => return Err(e),
                };
                let payload = example.ok_or_else(|| {
                    ValidationError::new(
                        "no_example",
                        format!("`{event_type}` has no example in the catalogue: give a `payload`"),
                    )
                })?;
                NewEvent { event_type, payload }
            }
            (None, Some(_)) => {
                return Err(ValidationError::new("invalid_test", "a test's `payload` needs its `type`").into())
            }
        };
        let now = self.now();
        let mut event = self.new_event(tenant, new, None, now)?;
        event.test = true;
        let planned = vec![Ok(plan(event, std::iter::once(&subscription)))];
        let mut results = self.store_and_queue(tenant, planned, now).await?;
        results.pop().expect("one result per event")
    }

    /// The rest of an ingest, once each event's deliveries are planned.
    pub(super) async fn store_and_queue(
        &self,
        tenant: &Tenant,
        planned: Vec<Result<(Event, Vec<Delivery>)>>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<Result<Ingested>>> {
        let seen = self.stored_before(tenant, &planned).await;
        // Only a new event meets the catalogue: a retry of one stored before is answered from
        // the store whatever its type's schema says now (a 422 would tell the client nothing
        // was stored, and it would send it again as a new event).
        let mut planned = planned;
        let new_events = planned.iter().zip(&seen).filter(|(_, seen)| seen.is_none());
        let types: std::collections::HashSet<&EventType> = new_events
            .filter_map(|(plan, _)| plan.as_ref().ok().map(|(event, _)| &event.event_type))
            .collect();
        self.read_event_types(&tenant.id, types).await?;
        for (plan, seen) in planned.iter_mut().zip(&seen) {
            if let (Ok((event, _)), None) = (&*plan, seen) {
                if let Err(refused) = self.check_payload(&tenant.id, &event.event_type, &event.payload).await {
                    *plan = Err(refused);
                }
            }
        }
        let written = match self.ports.store_with_queue.as_deref() {
            Some(both) => write_together(both, &planned, &seen, now).await,
            None => self.queue_then_write(&planned, &seen).await,
        };
        Ok(futures::stream::iter(planned.into_iter().zip(seen).zip(written))
            .map(|((plan, seen), written)| async move {
                let (event, deliveries) = plan?;
                if let Some(stored) = seen {
                    return self.repeated(tenant, stored, &event).await;
                }
                let created = written.expect("every new event is written or refused")?;
                match created {
                    Created::Existing(id) => {
                        let stored = self
                            .ports
                            .store
                            .get_event(&tenant.id, &id)
                            .await?
                            .ok_or_else(|| Error::not_found("event", &id))?;
                        self.repeated(tenant, stored, &event).await
                    }
                    Created::New => Ok(Ingested {
                        event,
                        deliveries,
                        created: true,
                    }),
                }
            })
            .buffered(STORE_CONCURRENCY)
            .collect()
            .await)
    }

    /// A keyed event stored before (the client's retry) is answered from the store, with
    /// nothing sent and nothing written: a retry of a large fan-out does not queue its
    /// messages again. One read for the batch's keyed events (a strongly consistent one); a
    /// failed read counts as none found: each write's own key check still holds.
    async fn stored_before(&self, tenant: &Tenant, planned: &[Result<(Event, Vec<Delivery>)>]) -> Vec<Option<Event>> {
        let keyed: Vec<(usize, EventId)> = planned
            .iter()
            .enumerate()
            .filter_map(|(i, plan)| match plan {
                Ok((event, _)) if event.idempotency_key.is_some() => Some((i, event.id.clone())),
                _ => None,
            })
            .collect();
        let mut seen: Vec<Option<Event>> = planned.iter().map(|_| None).collect();
        if keyed.is_empty() {
            return seen;
        }
        let ids: Vec<EventId> = keyed.iter().map(|(_, id)| id.clone()).collect();
        match self.ports.store.get_events(&tenant.id, &ids).await {
            Ok(found) => {
                for ((i, _), event) in keyed.into_iter().zip(found) {
                    seen[i] = event;
                }
            }
            Err(error) => tracing::warn!(%error, "could not read whether the batch's keyed events were stored before"),
        }
        seen
    }

    /// Where the queue is not the store's: the first attempts of a few events are queued, then
    /// those events are stored, each with its deliveries (all or nothing, per event); then the
    /// next few. Queued first, nothing stored can wait for a message that was never sent; a
    /// few at a time, a message waits for its own event's write, not the whole batch's (a
    /// worker that gets a message before its delivery is stored looks again, and copies it
    /// for a little later: `not_stored_yet`). A few that could not be queued are stored not
    /// at all and get the error, as does every event after them: a retry, with or without a
    /// key, is safe. What became of each event, in the batch's order (`None` for one that is
    /// invalid or was stored before).
    async fn queue_then_write(
        &self,
        planned: &[Result<(Event, Vec<Delivery>)>],
        seen: &[Option<Event>],
    ) -> Vec<Option<std::result::Result<Created, PortError>>> {
        let mut written: Vec<_> = planned.iter().map(|_| None).collect();
        let mut refused: Option<PortError> = None;
        for few in queue_groups(planned, seen) {
            if refused.is_none() {
                // Each stamped with when it is queued: a worker looks for its delivery only so
                // long after that (`get_delivery_of`).
                let now = self.now();
                let tasks: Vec<_> = few
                    .first_attempts
                    .iter()
                    .map(|d| (queued_ahead_task(d, now), 0))
                    .collect();
                if let Err(err) = self.ports.queue.enqueue(&tasks).await {
                    tracing::warn!(error = %err, "enqueue before ingest failed; those events and the rest of the batch were not stored");
                    refused = Some(err);
                }
            }
            if let Some(err) = &refused {
                for i in few.events {
                    written[i] = Some(Err(err.copy_for("enqueue")));
                }
                continue;
            }
            // (The futures are built first: a closure in the stream trips the `Send` check.)
            let writes: Vec<_> = few
                .events
                .iter()
                .map(|&i| async move {
                    let (event, deliveries) = planned[i].as_ref().expect("a planned event");
                    (i, self.ports.store.create_event(event, deliveries).await)
                })
                .collect();
            for (i, created) in futures::future::join_all(writes).await {
                written[i] = Some(created);
            }
        }
        written
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
            if key.starts_with(HOOKWISE_PREFIX) {
                // Hookwise's own events' keys: a client's could hide one.
                return Err(ValidationError::new(
                    "invalid_idempotency_key",
                    format!("Idempotency-Key may not start with `{HOOKWISE_PREFIX}`: those are Hookwise's own"),
                )
                .into());
            }
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
            test: false,
        })
    }

    /// The same `Idempotency-Key` again; `stored` is the event stored under it. With the same
    /// type and payload it is the client's retry: it gets the first event (if the read before
    /// the send missed it, its deliveries' first attempts were queued again, harmlessly: the
    /// conditional writes absorb a message too many). With
    /// another type or payload it is a mistake, refused rather than answered with the first
    /// event.
    async fn repeated(&self, tenant: &Tenant, stored: Event, new: &Event) -> Result<Ingested> {
        let id = &stored.id;
        if stored.event_type != new.event_type || stored.payload != new.payload {
            return Err(ValidationError::new(
                "idempotency_key_reused",
                format!(
                    "Idempotency-Key was used for event {id} with another type or payload; a new event needs a new key"
                ),
            )
            .into());
        }
        let deliveries = self.ports.store.event_deliveries(&tenant.id, id).await?;
        self.queue_first_again(&deliveries).await;
        Ok(Ingested {
            event: stored,
            deliveries,
            created: false,
        })
    }

    /// A client sends an event again when its first try's answer did not come, and that try
    /// may have lost its messages (a crash, a purge, a message dropped as for a delivery not
    /// stored while the try's writes were slow). So each first attempt of the stored event
    /// still waiting for the message queued before it gets a copy, queued to arrive
    /// [`EARLY_COPY_LAG`] after the delivery's creation (and the delivery moved, as the audit
    /// moves it, so the sweep looks after it if that copy is lost too): made then, not at the
    /// audit's horizon. Where the first message got through, the attempt is recorded by then
    /// and the copy is stale; it costs a receive. Not where one database holds the store and
    /// the queue: nothing queued there is lost. Best effort: the audit is still there.
    async fn queue_first_again(&self, deliveries: &[Delivery]) {
        if self.ports.store_with_queue.is_some() {
            return;
        }
        let now = self.now();
        let waiting: Vec<Delivery> = deliveries
            .iter()
            .filter(|d| d.awaits_first_message())
            .cloned()
            .collect();
        let Some(oldest) = waiting.iter().map(|d| d.created_at).min() else {
            return;
        };
        let max_delay = i64::from(self.ports.queue.max_delay_seconds());
        let delay = (oldest + EARLY_COPY_LAG - now).num_seconds().clamp(0, max_delay) as u32;
        match self.requeue(&waiting, delay).await {
            Ok(queued) => tracing::warn!(
                queued,
                "a retried ingest found first attempts still waiting for their message; queued again"
            ),
            Err(error) => {
                self.metrics.count(crate::metrics::BEST_EFFORT_FAILURES, 1);
                tracing::warn!(%error, "could not queue a retried ingest's waiting first attempts again; the audit will");
            }
        }
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

    /// The headers each attempt sent, as its subscriber received them (`webhook_request` at
    /// the attempt's start), the signature's value and sensitive custom headers' values left
    /// out: what a customer reads to see why an attempt failed. The custom headers are the
    /// subscription's as they are now. `None` once the event or the subscription is gone.
    pub async fn attempt_headers(
        &self,
        delivery: &Delivery,
        attempts: &[Attempt],
    ) -> Result<Option<Vec<Vec<(String, String)>>>> {
        let (event, sub) = futures::try_join!(
            async {
                Ok(self
                    .ports
                    .store
                    .get_event(&delivery.tenant_id, &delivery.event_id)
                    .await?)
            },
            self.kept_subscription(&delivery.tenant_id, &delivery.subscription_id),
        )?;
        let (Some(event), Some(sub)) = (event, sub) else {
            return Ok(None);
        };
        // As the subscription's headers are now: a sensitive value masked.
        let custom: Vec<(String, String)> = sub
            .headers
            .iter()
            .map(|h| (h.name.to_string(), h.shown().to_owned()))
            .collect();
        let sent = attempts.iter().map(|a| {
            super::deliver::webhook_request(&sub, &[], &custom, &event, a.started_at)
                .headers
                .into_iter()
                .map(|(name, value)| match name.as_str() {
                    "webhook-signature" => (name, "v1,… (the signature, made with the endpoint's secret)".to_owned()),
                    _ => (name, value),
                })
                .collect()
        });
        Ok(Some(sent.collect()))
    }

    pub const MAX_PAGE: u32 = 100;
    pub const DEFAULT_PAGE: u32 = 50;

    /// Newest first. `limit` 0 means 50; above 100 is refused.
    pub async fn list_deliveries(&self, tenant: &Tenant, mut query: DeliveryQuery) -> Result<DeliveryPage> {
        if query.limit > Self::MAX_PAGE {
            return Err(ValidationError::new("invalid_limit", format!("limit must be 1 to {}", Self::MAX_PAGE)).into());
        }
        if query.limit == 0 {
            query.limit = Self::DEFAULT_PAGE;
        }
        Ok(self.ports.store.list_deliveries(&tenant.id, &query).await?)
    }
}

/// Every event of a batch that is to be stored, with its first attempts' messages, in one
/// call to a store that holds the queue: what became of each, in the batch's order (`None`
/// for an event that is invalid or was stored before).
async fn write_together(
    both: &dyn StoreWithQueue,
    planned: &[Result<(Event, Vec<Delivery>)>],
    seen: &[Option<Event>],
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<Option<std::result::Result<Created, PortError>>> {
    let to_write: Vec<(usize, &Event, &[Delivery], Vec<_>)> = planned
        .iter()
        .zip(seen)
        .enumerate()
        .filter_map(|(i, (plan, seen))| match (plan, seen) {
            (Ok((event, deliveries)), None) => {
                let tasks = deliveries.iter().map(|d| (queued_ahead_task(d, now), 0)).collect();
                Some((i, event, deliveries.as_slice(), tasks))
            }
            _ => None,
        })
        .collect();
    let writes: Vec<EventWrite<'_>> = to_write
        .iter()
        .map(|(_, event, deliveries, tasks)| EventWrite {
            event,
            deliveries,
            tasks,
        })
        .collect();
    let mut results = both.create_events_queued(&writes).await.into_iter();
    let mut written: Vec<_> = planned.iter().map(|_| None).collect();
    for (i, ..) in &to_write {
        written[*i] = results.next();
    }
    written
}

/// The batch's new events in groups whose first attempts make one queue request (at most
/// [`QUEUE_GROUP`] messages and events; an event with more deliveries is a group of its own),
/// in the batch's order. One message per delivery, though a key given twice in a batch names
/// it twice.
fn queue_groups<'a>(planned: &'a [Result<(Event, Vec<Delivery>)>], seen: &[Option<Event>]) -> Vec<QueueGroup<'a>> {
    let mut named = std::collections::HashSet::new();
    let mut groups: Vec<QueueGroup> = Vec::new();
    for (i, (plan, seen)) in planned.iter().zip(seen).enumerate() {
        let (Ok((_, deliveries)), None) = (plan, seen) else {
            continue;
        };
        let first_attempts: Vec<&Delivery> = deliveries.iter().filter(|d| named.insert(&d.id)).collect();
        match groups.last_mut() {
            Some(last)
                if last.first_attempts.len() + first_attempts.len() <= QUEUE_GROUP
                    && last.events.len() < QUEUE_GROUP =>
            {
                last.events.push(i);
                last.first_attempts.extend(first_attempts);
            }
            _ => groups.push(QueueGroup {
                events: vec![i],
                first_attempts,
            }),
        }
    }
    groups
}

/// Events of a batch (by index) and the deliveries whose first attempts are queued for them.
struct QueueGroup<'a> {
    events: Vec<usize>,
    first_attempts: Vec<&'a Delivery>,
}
