//! What the hot paths read on every request and every attempt — an API key's tenant, a
//! tenant, a subscription, a tenant's subscriptions — kept in the warm process for
//! `Config::lookup_ttl` (30 s), so a busy endpoint costs no read per event for them.
//!
//! Only what was found is kept: a new tenant or API key works at once, and a delivery whose
//! subscription is not in the cache reads it from the store. What another process changes
//! is seen within the time to live: a subscription deleted or disabled there stops
//! receiving within 30 s, and one created there receives the events ingested here from at
//! most 30 s on; a secret rotated there signs from at most 30 s on (the old one signs through
//! its grace period meanwhile). This process's own subscription writes forget what they
//! change at once.
//! Paths that read to write (PATCH, rotate-secret, the 410's disabling) read the store.
//!
//! Endpoint health is kept the same way, with the samples this process recorded since it
//! last saved them: a save (read the stored samples, add these, write; a save ending a stored
//! run of failures closes the endpoint's breaker first) happens at most every
//! `HEALTH_SAVE_EVERY` per endpoint and process, not on every attempt. Health is advisory: two
//! processes saving the same endpoint at the same moment can drop one's samples, and a
//! process that stops holds its unsaved ones.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use super::operational::{FailureRun, Operational};
use super::Services;
use crate::auth::hash_api_key;
use crate::error::{PortError, Result};
use crate::health::{EndpointHealth, HealthSample};
use crate::metrics;
use crate::model::*;

/// Entries a map holds before it starts afresh (a bound on memory, not a tuning knob).
const MAX_ENTRIES: usize = 10_000;
/// The most often one process saves one endpoint's health.
pub const HEALTH_SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// Tries of a save of endpoint health whose read another process's save overtook.
const HEALTH_SAVE_TRIES: u32 = 3;

/// An endpoint's health as this process knows it: read at `read_at`, with the samples it
/// recorded since its last save (`unsaved`, in `health` too).
#[derive(Clone)]
struct KeptHealth {
    health: EndpointHealth,
    read_at: DateTime<Utc>,
    unsaved: Vec<HealthSample>,
    saved_at: Option<DateTime<Utc>>,
}

impl KeptHealth {
    /// Nothing read or recorded yet (so the next look reads the store).
    fn unread() -> Self {
        Self {
            health: EndpointHealth::default(),
            read_at: DateTime::<Utc>::MIN_UTC,
            unsaved: Vec::new(),
            saved_at: None,
        }
    }
}

/// Values found at a time, each good until `ttl` after it.
pub(super) struct Kept<K, V> {
    entries: Mutex<HashMap<K, (DateTime<Utc>, V)>>,
}

impl<K: Eq + Hash, V: Clone> Kept<K, V> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (DateTime<Utc>, V)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn get(&self, key: &K, fresh_after: DateTime<Utc>) -> Option<V> {
        self.lock()
            .get(key)
            .filter(|(at, _)| *at > fresh_after)
            .map(|(_, v)| v.clone())
    }

    /// Keep `value`, read since `generation` was `read_in`, unless a forget came meanwhile:
    /// then it may be older than what was written.
    pub(super) fn put(&self, key: K, value: V, now: DateTime<Utc>, generation: &AtomicU64, read_in: u64) {
        let mut entries = self.lock();
        if generation.load(Ordering::SeqCst) != read_in {
            return;
        }
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(key, (now, value));
    }

    pub(super) fn forget(&self, key: &K) {
        self.lock().remove(key);
    }

    pub(super) fn clear(&self) {
        self.lock().clear();
    }
}

pub(crate) struct Lookups {
    /// Bumped by every forget, before it forgets: a read that started before it keeps nothing.
    pub(super) generation: AtomicU64,
    tenants_by_key: Kept<String, Tenant>,
    tenants: Kept<TenantId, Tenant>,
    subscriptions: Kept<(TenantId, SubscriptionId), Subscription>,
    tenant_subscriptions: Kept<TenantId, Arc<Vec<Subscription>>>,
    health: Mutex<HashMap<SubscriptionId, KeptHealth>>,
    /// Endpoints' statistics counted by this process and not yet added to the stored ones.
    pub(super) stats: Mutex<HashMap<SubscriptionId, super::stats::Unsaved>>,
    /// Endpoints' circuit breakers (`None`: none stored), for `breaker::CIRCUIT_TTL`.
    pub(super) circuits: Kept<SubscriptionId, Option<crate::circuit::Circuit>>,
    /// The deployment's settings: its operator keys and its rollout.
    deployment: Kept<(), Deployment>,
    /// The catalogue's definition a tenant's events of a type meet, compiled (`None`: none).
    pub(super) event_types: Kept<(TenantId, EventType), Option<Arc<super::catalogue::Resolved>>>,
}

impl Lookups {
    pub(crate) fn new() -> Self {
        Self {
            generation: AtomicU64::new(0),
            tenants_by_key: Kept::new(),
            tenants: Kept::new(),
            subscriptions: Kept::new(),
            tenant_subscriptions: Kept::new(),
            health: Mutex::new(HashMap::new()),
            stats: Mutex::new(HashMap::new()),
            circuits: Kept::new(),
            deployment: Kept::new(),
            event_types: Kept::new(),
        }
    }

    /// Where forgetting has got to: a value read from here on may be kept.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

impl Services {
    /// When an entry found before is too old to use.
    pub(super) fn kept_after(&self) -> DateTime<Utc> {
        self.now() - chrono::Duration::from_std(self.config.lookup_ttl).unwrap_or_default()
    }

    pub(crate) async fn tenant_by_api_key(&self, api_key: &str) -> Result<Option<Tenant>> {
        let hash = hash_api_key(api_key);
        if let Some(t) = self.lookups.tenants_by_key.get(&hash, self.kept_after()) {
            return Ok(Some(t));
        }
        let read_in = self.lookups.generation.load(Ordering::SeqCst);
        let found = self.ports.store.tenant_by_api_key(&hash).await?;
        if let Some(t) = &found {
            let l = &self.lookups;
            l.tenants_by_key
                .put(hash, t.clone(), self.now(), &l.generation, read_in);
        }
        Ok(found)
    }

    pub(crate) async fn kept_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        if let Some(t) = self.lookups.tenants.get(id, self.kept_after()) {
            return Ok(Some(t));
        }
        let read_in = self.lookups.generation.load(Ordering::SeqCst);
        let found = self.ports.store.get_tenant(id).await?;
        if let Some(t) = &found {
            let l = &self.lookups;
            l.tenants.put(id.clone(), t.clone(), self.now(), &l.generation, read_in);
        }
        Ok(found)
    }

    pub(crate) async fn kept_subscription(
        &self,
        tenant: &TenantId,
        id: &SubscriptionId,
    ) -> Result<Option<Subscription>> {
        let key = (tenant.clone(), id.clone());
        if let Some(s) = self.lookups.subscriptions.get(&key, self.kept_after()) {
            return Ok(Some(s));
        }
        let read_in = self.lookups.generation.load(Ordering::SeqCst);
        let found = self.ports.store.get_subscription(tenant, id).await?;
        if let Some(s) = &found {
            let l = &self.lookups;
            l.subscriptions.put(key, s.clone(), self.now(), &l.generation, read_in);
        }
        Ok(found)
    }

    pub(crate) async fn kept_subscriptions(&self, tenant: &TenantId) -> Result<Arc<Vec<Subscription>>> {
        if let Some(list) = self.lookups.tenant_subscriptions.get(tenant, self.kept_after()) {
            return Ok(list);
        }
        let read_in = self.lookups.generation.load(Ordering::SeqCst);
        let mut all = Vec::new();
        loop {
            let page = self
                .ports
                .store
                .list_subscriptions(tenant, all.last().map(|s: &Subscription| &s.id), Self::MAX_PAGE)
                .await?;
            let last_page = page.len() < Self::MAX_PAGE as usize;
            all.extend(page);
            if last_page {
                break;
            }
        }
        let list = Arc::new(all);
        let l = &self.lookups;
        l.tenant_subscriptions
            .put(tenant.clone(), list.clone(), self.now(), &l.generation, read_in);
        Ok(list)
    }

    /// This process changed (or deleted) a subscription: forget it, and its tenant's list.
    pub(crate) fn forget_subscription(&self, tenant: &TenantId, id: &SubscriptionId) {
        self.lookups.generation.fetch_add(1, Ordering::SeqCst);
        self.lookups.subscriptions.forget(&(tenant.clone(), id.clone()));
        self.lookups.tenant_subscriptions.forget(tenant);
    }

    /// This process changed a tenant: forget it, and what its keys (as `read`) found.
    /// The deployment's settings, as kept (an operator key revoked elsewhere, or the rollout
    /// moved, is seen within the time to live).
    pub(crate) async fn kept_deployment(&self) -> Result<Deployment> {
        if let Some(d) = self.lookups.deployment.get(&(), self.kept_after()) {
            return Ok(d);
        }
        let read_in = self.lookups.generation.load(Ordering::SeqCst);
        let found = self.ports.store.deployment().await?;
        let l = &self.lookups;
        l.deployment.put((), found.clone(), self.now(), &l.generation, read_in);
        Ok(found)
    }

    /// This process changed the catalogue: forget every type's kept definition (a change
    /// to the deployment's reaches every tenant's).
    pub(crate) fn forget_event_types(&self) {
        self.lookups.generation.fetch_add(1, Ordering::SeqCst);
        self.lookups.event_types.clear();
    }

    pub(crate) fn forget_deployment(&self) {
        self.lookups.generation.fetch_add(1, Ordering::SeqCst);
        self.lookups.deployment.forget(&());
    }

    pub(crate) fn forget_tenant(&self, read: &Tenant) {
        self.lookups.generation.fetch_add(1, Ordering::SeqCst);
        self.lookups.tenants.forget(&read.id);
        for key in &read.api_keys {
            self.lookups.tenants_by_key.forget(&key.hash);
        }
    }

    fn kept_healths(&self) -> std::sync::MutexGuard<'_, HashMap<SubscriptionId, KeptHealth>> {
        self.lookups.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The endpoint's health: as kept, or read afresh (with this process's unsaved samples).
    pub(crate) async fn kept_health(&self, sub: &SubscriptionId) -> Result<EndpointHealth> {
        let kept_after = self.kept_after();
        if let Some(k) = self.kept_healths().get(sub).filter(|k| k.read_at > kept_after) {
            return Ok(k.health.clone());
        }
        let mut health = self.ports.store.endpoint_health(sub).await?;
        let now = self.now();
        let mut kept = self.kept_healths();
        if kept.len() >= MAX_ENTRIES {
            kept.retain(|_, k| !k.unsaved.is_empty());
        }
        let entry = kept.entry(sub.clone()).or_insert_with(KeptHealth::unread);
        health.merge(&entry.unsaved);
        entry.health = health.clone();
        entry.read_at = now;
        Ok(health)
    }

    /// How many of the endpoint's latest attempts failed in a row, as this process knows (no
    /// read).
    pub(crate) fn kept_failures(&self, sub: &SubscriptionId) -> u32 {
        self.kept_healths()
            .get(sub)
            .map_or(0, |k| k.health.consecutive_failures())
    }

    /// The endpoint's health as stored, with this process's unsaved samples: for the API's
    /// views, which must not lag behind another process's attempts by the time to live.
    pub(crate) async fn stored_health(&self, sub: &SubscriptionId) -> Result<EndpointHealth> {
        let mut health = self.ports.store.endpoint_health(sub).await?;
        if let Some(k) = self.kept_healths().get(sub) {
            health.merge(&k.unsaved);
        }
        Ok(health)
    }

    /// Record an attempt's outcome against its endpoint; save what is unsaved if the last
    /// save is `HEALTH_SAVE_EVERY` old (or there was none). Failing to save is logged, not
    /// fatal: health is advisory.
    pub(crate) async fn record_health(&self, sub: &Subscription, sample: HealthSample) {
        let now = self.now();
        let due = {
            let mut kept = self.kept_healths();
            let entry = kept.entry(sub.id.clone()).or_insert_with(KeptHealth::unread);
            entry.health.record(sample);
            entry.unsaved.push(sample);
            let every = chrono::Duration::from_std(HEALTH_SAVE_EVERY).unwrap_or_default();
            entry.saved_at.is_none_or(|at| now - at >= every)
        };
        if due {
            if let Err(err) = self.save_health(sub, now).await {
                self.metrics.count(metrics::BEST_EFFORT_FAILURES, 1);
                tracing::warn!(error = %err, subscription_id = %sub.id, "could not save endpoint health");
            }
        }
    }

    /// Add this process's unsaved samples to the stored ones. A save that ends a stored run
    /// of failures with a success closes the endpoint's breaker first, if it is left open
    /// (`close_after_success`).
    pub(super) async fn save_health(&self, sub: &Subscription, now: DateTime<Utc>) -> Result<()> {
        let id = &sub.id;
        let unsaved = match self.kept_healths().get_mut(id) {
            Some(k) if !k.unsaved.is_empty() => {
                k.saved_at = Some(now);
                std::mem::take(&mut k.unsaved)
            }
            _ => return Ok(()),
        };
        let saved = async {
            for _ in 0..HEALTH_SAVE_TRIES {
                let mut stored = self.ports.store.endpoint_health(id).await?;
                let failures = stored.consecutive_failures();
                let run = FailureRun {
                    failures,
                    // The run's first failure (the window's first, if the run is longer).
                    failing_since: stored
                        .samples
                        .get(stored.samples.len() - failures as usize)
                        .map(|s| s.at),
                    after_success: stored.last_success_at,
                };
                stored.merge(&unsaved);
                let mut recovered = None;
                if failures > 0 && stored.consecutive_failures() == 0 {
                    // Once stored, the success tells every process the breaker is closed (none
                    // reads it), so it is made so before: an open breaker nobody reads would
                    // stay open, for the next failure to find past its probe time and re-open.
                    self.close_after_success(sub).await?;
                    // The first success after the run's last failure.
                    let last_failure = stored.samples.iter().filter(|s| !s.success).map(|s| s.at).max();
                    let first_success = stored
                        .samples
                        .iter()
                        .filter(|s| s.success && last_failure.is_none_or(|f| s.at > f))
                        .map(|s| s.at)
                        .min();
                    if failures >= sub.circuit_breaker.failure_threshold {
                        recovered = first_success.map(|at| Operational::recovered(sub, run, at));
                    }
                }
                match self.ports.store.save_endpoint_health(id, &stored).await {
                    Ok(()) => {
                        stored.version += 1;
                        return Ok((stored, recovered));
                    }
                    // Another process saved first: its samples are read, and these merged in, again.
                    Err(PortError::ConditionFailed(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err::<_, crate::Error>(PortError::retryable("save endpoint health", "other saves kept coming first").into())
        };
        match saved.await {
            Ok((stored, recovered)) => {
                self.tell_best_effort(&sub.tenant_id, recovered.flatten()).await;
                if let Some(k) = self.kept_healths().get_mut(id) {
                    // Samples recorded while saving stay unsaved, and in the kept health.
                    let mut health = stored;
                    health.merge(&k.unsaved);
                    k.health = health;
                    k.read_at = now;
                }
                Ok(())
            }
            Err(err) => {
                // Kept for the next save.
                if let Some(k) = self.kept_healths().get_mut(id) {
                    let mut back = unsaved;
                    back.append(&mut k.unsaved);
                    k.unsaved = back;
                }
                Err(err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_read_before_a_forget_is_not_kept_after_it() {
        let kept: Kept<u32, &str> = Kept::new();
        let generation = AtomicU64::new(0);
        let now = Utc::now();
        let read_in = generation.load(Ordering::SeqCst);
        // A write and its forget land while the read is on its way...
        generation.fetch_add(1, Ordering::SeqCst);
        kept.forget(&1);
        // ...so what the read found is not kept.
        kept.put(1, "old", now, &generation, read_in);
        assert_eq!(kept.get(&1, now - chrono::Duration::seconds(1)), None);
        // A read that started after the forget is.
        let read_in = generation.load(Ordering::SeqCst);
        kept.put(1, "new", now, &generation, read_in);
        assert_eq!(kept.get(&1, now - chrono::Duration::seconds(1)), Some("new"));
    }
}
