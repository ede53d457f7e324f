//! Endpoint statistics ([`crate::stats`]): each attempt and each delivery that went dead is
//! counted in the process that saw it, and its counts are added to the stored buckets at most
//! every [`HEALTH_SAVE_EVERY`] per endpoint and process (as its health is saved): by the next
//! attempt then, at the end of a batch, or by a scheduler tick of the same process (a
//! long-running host's). One write per endpoint, process and few seconds, however many
//! attempts: what the figures cost. A Lambda container's last counts wait for its next batch.
//!
//! The figures are a count, not a ledger (the deliveries and their attempts are that): counts
//! a process holds when it stops, or whose write fails, are lost, at most a few seconds'
//! worth of one endpoint's attempts; a write retried after its answer was lost counts twice.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::lookups::HEALTH_SAVE_EVERY;
use super::Services;
use crate::error::Result;
use crate::metrics;
use crate::model::{SubscriptionId, Tenant};
use crate::stats::{bucket_of, StatsCounts, Summary, Window};

/// An endpoint's counts not yet stored, by bucket, and when they were last written.
#[derive(Default)]
pub(super) struct Unsaved {
    buckets: BTreeMap<DateTime<Utc>, StatsCounts>,
    saved_at: Option<DateTime<Utc>>,
}

impl Unsaved {
    fn due(&self, now: DateTime<Utc>) -> bool {
        let every = chrono::Duration::from_std(HEALTH_SAVE_EVERY).unwrap_or_default();
        !self.buckets.is_empty() && self.saved_at.is_none_or(|at| now - at >= every)
    }
}

/// Endpoints a process keeps the time of their last write for, beyond those it holds counts
/// for (a bound on memory: past it, those times are forgotten, and such an endpoint's next
/// count is written at once).
const MAX_KEPT: usize = 10_000;

impl Services {
    /// Count `counts` (an attempt's, or a death) against the endpoint at `at`; write what it
    /// holds for the endpoint if its last write is a few seconds old.
    pub(super) async fn count_stats(&self, sub: &SubscriptionId, at: DateTime<Utc>, counts: StatsCounts) {
        let now = self.now();
        let due = {
            let mut kept = self.kept_stats();
            let unsaved = kept.entry(sub.clone()).or_default();
            unsaved.buckets.entry(bucket_of(at)).or_default().add(&counts);
            unsaved.due(now)
        };
        if due {
            self.save_stats(sub, now).await;
        }
    }

    /// Write every endpoint's counts whose last write is a few seconds old (at the end of a
    /// batch, on a tick), so the counts of an endpoint's last attempts do not wait for its
    /// next one.
    pub(crate) async fn save_due_stats(&self) {
        let now = self.now();
        let due: Vec<SubscriptionId> = self
            .kept_stats()
            .iter()
            .filter(|(_, u)| u.due(now))
            .map(|(id, _)| id.clone())
            .collect();
        use futures::StreamExt;
        const AT_ONCE: usize = 8;
        futures::stream::iter(due)
            .for_each_concurrent(AT_ONCE, |sub| async move { self.save_stats(&sub, now).await })
            .await;
    }

    /// Add the endpoint's unsaved counts to the stored ones. Best effort: a failed write is
    /// logged and counted, and its counts dropped (written again, they could count twice).
    async fn save_stats(&self, sub: &SubscriptionId, now: DateTime<Utc>) {
        let buckets = {
            let mut kept = self.kept_stats();
            let Some(unsaved) = kept.remove(sub) else {
                return;
            };
            // The endpoint's entry stays, to hold the time of this write.
            kept.insert(
                sub.clone(),
                Unsaved {
                    buckets: BTreeMap::new(),
                    saved_at: Some(now),
                },
            );
            if kept.len() > MAX_KEPT {
                kept.retain(|_, u| !u.buckets.is_empty());
            }
            unsaved.buckets
        };
        if buckets.is_empty() {
            return;
        }
        let counts: Vec<_> = buckets.into_iter().collect();
        if let Err(err) = self.ports.store.add_endpoint_stats(sub, &counts).await {
            self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
            tracing::warn!(error = %err, subscription_id = %sub, "could not save endpoint statistics");
        }
    }

    fn kept_stats(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<SubscriptionId, Unsaved>> {
        self.lookups.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `GET /v1/subscriptions/{id}/stats`: the endpoint's figures over `window`, ending now.
    /// What processes hold unwritten (a few seconds' worth) is not in them yet.
    pub async fn subscription_stats(&self, tenant: &Tenant, id: &SubscriptionId, window: Window) -> Result<Summary> {
        let sub = self.get_subscription(tenant, id).await?;
        let now = self.now();
        let from = bucket_of(now - window.length());
        let buckets = self.ports.store.endpoint_stats(&sub.id, from).await?;
        Ok(Summary::of(window, now, &buckets))
    }
}
