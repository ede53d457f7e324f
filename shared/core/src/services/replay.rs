//! Replay: a dead delivery gets a fresh attempt #1 in a new round. Per delivery, per event,
//! and per subscription for the deliveries that died since a time.

use chrono::{DateTime, Utc};

use super::Services;
use crate::error::{Error, PortError, Result};
use crate::model::*;
use crate::ports::DeliveryQuery;
use crate::state::{next_task, replay};

impl Services {
    #[tracing::instrument(name = "replay", skip_all, fields(tenant_id = %tenant.id, delivery_id = %id))]
    pub async fn replay_delivery(&self, tenant: &Tenant, id: &DeliveryId) -> Result<Delivery> {
        let (delivery, _) = self.get_delivery(tenant, id).await?;
        if delivery.status != DeliveryStatus::Dead {
            return Err(Error::conflict(format!(
                "delivery {id} is {}; only dead deliveries can be replayed",
                delivery.status.as_str()
            )));
        }
        let mut replayed = self.replay_all(vec![delivery]).await?;
        replayed
            .pop()
            .ok_or_else(|| Error::conflict(format!("delivery {id} changed while it was being replayed; try again")))
    }

    /// Every dead delivery of the event.
    #[tracing::instrument(name = "replay", skip_all, fields(tenant_id = %tenant.id, event_id = %id))]
    pub async fn replay_event(&self, tenant: &Tenant, id: &EventId) -> Result<Vec<Delivery>> {
        let found = self.get_event(tenant, id).await?;
        let dead = found
            .deliveries
            .into_iter()
            .filter(|d| d.status == DeliveryStatus::Dead)
            .collect();
        self.replay_all(dead).await
    }

    /// Replay the subscription's deliveries that died at or after `since`.
    #[tracing::instrument(name = "recover", skip_all, fields(tenant_id = %tenant.id, subscription_id = %id, %since))]
    pub async fn recover_subscription(
        &self,
        tenant: &Tenant,
        id: &SubscriptionId,
        since: DateTime<Utc>,
    ) -> Result<Vec<Delivery>> {
        let dead = self.dead_since(tenant, id, since).await?;
        self.replay_all(dead).await
    }

    /// The subscription's deliveries that died at or after `since`: what a recover from then
    /// would replay (its preview).
    pub async fn dead_since(
        &self,
        tenant: &Tenant,
        id: &SubscriptionId,
        since: DateTime<Utc>,
    ) -> Result<Vec<Delivery>> {
        self.get_subscription(tenant, id).await?;
        let mut dead = Vec::new();
        let mut query = DeliveryQuery {
            status: Some(DeliveryStatus::Dead),
            subscription_id: Some(id.clone()),
            limit: Self::MAX_PAGE,
            cursor: None,
        };
        loop {
            let page = self.ports.store.list_deliveries(&tenant.id, &query).await?;
            dead.extend(page.items.into_iter().filter(|d| d.updated_at >= since));
            match page.next_cursor {
                Some(c) => query.cursor = Some(c),
                None => break,
            }
        }
        Ok(dead)
    }

    /// Replays those still dead; a delivery that moved meanwhile is left out.
    async fn replay_all(&self, dead: Vec<Delivery>) -> Result<Vec<Delivery>> {
        let now = self.now();
        let mut replayed = Vec::new();
        for delivery in dead {
            let Some(change) = replay(&delivery, now) else { continue };
            match self.ports.store.apply_change(&change).await {
                Ok(()) => {
                    tracing::info!(delivery_id = %change.next.id, event_id = %change.next.event_id, round = change.next.round, "replayed");
                    replayed.push(change.next)
                }
                Err(PortError::ConditionFailed(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let tasks: Vec<_> = replayed.iter().map(|d| (next_task(d), 0)).collect();
        if let Err(err) = self.ports.queue.enqueue(&tasks).await {
            // They are pending and due now: the sweep queues them.
            tracing::warn!(error = %err, "enqueue after replay failed; the sweep will pick the deliveries up");
        }
        Ok(replayed)
    }
}
