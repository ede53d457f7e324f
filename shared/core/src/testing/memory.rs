//! In-memory ports for tests: a store, a queue, a scheduler table and a mailer that keep
//! everything in a mutex, a sender that answers from a script, and a clock you move by hand.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use rand::SeedableRng;

use crate::circuit::Circuit;
use crate::error::PortError;
use crate::health::EndpointHealth;
use crate::model::*;
use crate::ports::*;
use crate::services::{Config, NewTenant, Ports, Services};
use crate::stats::StatsCounts;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
struct StoreData {
    tenants: HashMap<TenantId, Tenant>,
    keys: HashMap<String, TenantId>,
    subscriptions: Vec<Subscription>,
    events: Vec<Event>,
    deliveries: Vec<Delivery>,
    attempts: Vec<Attempt>,
    health: HashMap<SubscriptionId, EndpointHealth>,
    stats: HashMap<SubscriptionId, BTreeMap<DateTime<Utc>, crate::stats::StatsCounts>>,
    /// Each rate-limited endpoint's next free slot.
    rate_lines: HashMap<SubscriptionId, crate::rate_limit::Lines>,
    circuits: HashMap<SubscriptionId, Circuit>,
    /// Dead rounds' notices: to whom, and whether sent.
    notices: HashMap<(DeliveryId, u32), (Email, DeadNotice, bool)>,
    digests: HashMap<Email, MemoryDigest>,
    deployment: Deployment,
    portal_sessions: HashMap<PortalSessionId, PortalSession>,
    /// The event-type catalogue by scope (`None`: the deployment's) and name, in name order
    /// within a scope.
    event_types: BTreeMap<(Option<TenantId>, EventType), EventTypeDefinition>,
}

/// An owner's emails: when the last went out, and the claim on the next.
#[derive(Default)]
struct MemoryDigest {
    last_sent: Option<DateTime<Utc>>,
    claimed_at: Option<DateTime<Utc>>,
    /// A failed email's owner is not tried again before this.
    retry_at: Option<DateTime<Utc>>,
}

#[derive(Default)]
pub struct MemoryStore {
    data: Mutex<StoreData>,
    /// While set, reading a delivery fails as a throttled backend would (retryable).
    pub unavailable: std::sync::atomic::AtomicBool,
    /// The next this many reads of a delivery find none, as while its ingest still writes it.
    pub unseen_delivery_reads: std::sync::atomic::AtomicU32,
    /// The next this many subscription writes fail (retryable).
    pub failing_subscription_writes: std::sync::atomic::AtomicU32,
    /// The next this many subscription writes land, but answer that the copy changed, as the
    /// SDK's retry of a write whose answer was lost does.
    pub lost_subscription_answers: std::sync::atomic::AtomicU32,
    /// `Some(k)`: the subscription write after the next `k` finds its copy edited by another
    /// call just before (its version moved on, nothing else).
    pub edit_before_subscription_write: Mutex<Option<usize>>,
    /// The next this many event writes fail (retryable), writing nothing.
    pub failing_event_writes: std::sync::atomic::AtomicU32,
    /// The next this many circuit breaker writes fail (retryable), writing nothing.
    pub failing_circuit_writes: std::sync::atomic::AtomicU32,
    /// The next this many delivery changes (`apply_change`) fail (retryable), writing nothing.
    pub failing_delivery_writes: std::sync::atomic::AtomicU32,
    /// The next this many delivery changes land, but answer with a retryable error, as a
    /// write whose answer was lost does.
    pub lost_delivery_answers: std::sync::atomic::AtomicU32,
    /// The next this many `finish_digest` calls fail (retryable), writing nothing.
    pub failing_digest_finishes: std::sync::atomic::AtomicU32,
    /// The next this many pages of the audit of queued messages fail (retryable).
    pub failing_audits: std::sync::atomic::AtomicU32,
    /// Lookups of API keys so far.
    pub api_key_reads: std::sync::atomic::AtomicU32,
    /// Reads of one event (`get_event`) so far.
    pub event_reads: std::sync::atomic::AtomicU32,
    /// `Some((clock, late, n))`: the next `n` rate-limit turns are answered `late` after they
    /// were asked, on `clock`, as a busy table answers a contended write.
    #[allow(clippy::type_complexity)]
    pub late_rate_answers: Mutex<Option<(Arc<dyn Clock>, Duration, u32)>>,
    pub crash: Arc<CrashPoint>,
}

impl MemoryStore {
    /// An endpoint's rate-limit lines as they stand (never used: the default), for a model
    /// checker to tell its states apart by.
    pub fn rate_lines(&self, sub: &SubscriptionId) -> crate::rate_limit::Lines {
        lock(&self.data).rate_lines.get(sub).copied().unwrap_or_default()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn create_tenant(&self, tenant: &Tenant) -> PortResult<()> {
        self.crash.act("create tenant")?;
        let mut d = lock(&self.data);
        if d.tenants.contains_key(&tenant.id) || tenant.api_keys.iter().any(|k| d.keys.contains_key(&k.hash)) {
            return Err(PortError::ConditionFailed("tenant id or API key already in use".into()));
        }
        for key in &tenant.api_keys {
            d.keys.insert(key.hash.clone(), tenant.id.clone());
        }
        d.tenants.insert(tenant.id.clone(), tenant.clone());
        Ok(())
    }
    async fn tenant_by_api_key(&self, api_key_hash: &str) -> PortResult<Option<Tenant>> {
        self.api_key_reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let d = lock(&self.data);
        Ok(d.keys.get(api_key_hash).and_then(|id| d.tenants.get(id)).cloned())
    }
    async fn list_tenants(&self, after: Option<&TenantId>, limit: u32) -> PortResult<Vec<Tenant>> {
        let d = lock(&self.data);
        let mut all: Vec<Tenant> = d
            .tenants
            .values()
            .filter(|t| after.is_none_or(|a| t.id.as_str() > a.as_str()))
            .cloned()
            .collect();
        all.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        all.truncate(limit as usize);
        Ok(all)
    }
    async fn update_tenant(&self, tenant: &Tenant, read: &Tenant) -> PortResult<()> {
        self.crash.act("update tenant")?;
        let mut d = lock(&self.data);
        if d.tenants.get(&tenant.id).map(|t| t.version) != Some(read.version) {
            return Err(PortError::ConditionFailed(format!(
                "tenant `{}` changed or is gone",
                tenant.id
            )));
        }
        let (claimed, freed) = tenant.key_changes(read);
        if claimed.iter().any(|k| d.keys.contains_key(&k.hash)) {
            return Err(PortError::ConditionFailed("API key already in use".into()));
        }
        for key in freed {
            d.keys.remove(&key.hash);
        }
        for key in claimed {
            d.keys.insert(key.hash.clone(), tenant.id.clone());
        }
        d.tenants.insert(tenant.id.clone(), tenant.clone());
        Ok(())
    }
    async fn get_tenant(&self, id: &TenantId) -> PortResult<Option<Tenant>> {
        Ok(lock(&self.data).tenants.get(id).cloned())
    }
    async fn deployment(&self) -> PortResult<Deployment> {
        Ok(lock(&self.data).deployment.clone())
    }
    async fn create_portal_session(&self, session: &PortalSession) -> PortResult<()> {
        self.crash.act("create portal session")?;
        let mut d = lock(&self.data);
        if d.portal_sessions.contains_key(&session.id) {
            return Err(PortError::ConditionFailed("portal session id in use".into()));
        }
        d.portal_sessions.insert(session.id.clone(), session.clone());
        Ok(())
    }
    async fn portal_session(&self, id: &PortalSessionId) -> PortResult<Option<PortalSession>> {
        Ok(lock(&self.data).portal_sessions.get(id).cloned())
    }
    async fn delete_portal_session(&self, id: &PortalSessionId) -> PortResult<bool> {
        self.crash.act("delete portal session")?;
        Ok(lock(&self.data).portal_sessions.remove(id).is_some())
    }
    async fn put_deployment(&self, next: &Deployment, read: &Deployment) -> PortResult<()> {
        self.crash.act("put deployment")?;
        let mut d = lock(&self.data);
        if d.deployment.version != read.version {
            return Err(PortError::ConditionFailed("the deployment's settings changed".into()));
        }
        d.deployment = next.clone();
        Ok(())
    }
    async fn put_event_type(&self, def: &EventTypeDefinition, read_at: Option<DateTime<Utc>>) -> PortResult<()> {
        self.crash.act("put event type")?;
        let mut d = lock(&self.data);
        let key = (def.tenant_id.clone(), def.name.clone());
        match (d.event_types.get(&key), read_at) {
            (None, None) => {}
            (Some(stored), Some(read_at)) if stored.updated_at == read_at => {}
            (Some(_), None) => {
                return Err(PortError::ConditionFailed(format!("event type `{}` exists", def.name)));
            }
            (_, Some(_)) => {
                return Err(PortError::ConditionFailed(format!(
                    "event type `{}` changed since it was read, or is gone",
                    def.name
                )));
            }
        }
        d.event_types.insert(key, def.clone());
        Ok(())
    }
    async fn event_type(&self, tenant: Option<&TenantId>, name: &EventType) -> PortResult<Option<EventTypeDefinition>> {
        Ok(lock(&self.data)
            .event_types
            .get(&(tenant.cloned(), name.clone()))
            .cloned())
    }
    async fn list_event_types(
        &self,
        tenant: Option<&TenantId>,
        after: Option<&EventType>,
        limit: u32,
    ) -> PortResult<Vec<EventTypeDefinition>> {
        // In name order within a scope: the map's order.
        Ok(lock(&self.data)
            .event_types
            .iter()
            .filter(|((scope, name), _)| scope.as_ref() == tenant && after.is_none_or(|a| name > a))
            .take(limit as usize)
            .map(|(_, def)| def.clone())
            .collect())
    }
    async fn create_subscription(&self, sub: &Subscription) -> PortResult<()> {
        self.crash.act("create subscription")?;
        let mut d = lock(&self.data);
        if d.subscriptions.iter().any(|s| s.id == sub.id) {
            return Err(PortError::ConditionFailed(format!("subscription `{}` exists", sub.id)));
        }
        d.subscriptions.push(sub.clone());
        Ok(())
    }
    async fn replace_subscription(&self, sub: &Subscription, read_at: DateTime<Utc>) -> PortResult<()> {
        self.crash.act("replace subscription")?;
        if take_one(&self.failing_subscription_writes) {
            return Err(PortError::retryable(
                "replace subscription",
                "throttled (failing_subscription_writes)",
            ));
        }
        let edit_now = {
            let mut edit = lock(&self.edit_before_subscription_write);
            let now = *edit == Some(0);
            *edit = edit.and_then(|k| k.checked_sub(1));
            now
        };
        let mut d = lock(&self.data);
        let stored = d
            .subscriptions
            .iter_mut()
            .find(|s| s.id == sub.id && s.tenant_id == sub.tenant_id);
        match stored {
            Some(s) if edit_now => {
                s.updated_at += chrono::Duration::microseconds(1);
                Err(PortError::ConditionFailed(format!(
                    "subscription `{}` changed since it was read (edit_before_subscription_write)",
                    sub.id
                )))
            }
            Some(s) if s.updated_at == read_at => {
                *s = sub.clone();
                if take_one(&self.lost_subscription_answers) {
                    return Err(PortError::ConditionFailed(format!(
                        "subscription `{}` changed since it was read (lost_subscription_answers)",
                        sub.id
                    )));
                }
                Ok(())
            }
            Some(_) => Err(PortError::ConditionFailed(format!(
                "subscription `{}` changed since it was read",
                sub.id
            ))),
            None => Err(PortError::ConditionFailed(format!("subscription `{}` is gone", sub.id))),
        }
    }
    async fn get_subscription(&self, tenant: &TenantId, id: &SubscriptionId) -> PortResult<Option<Subscription>> {
        Ok(lock(&self.data)
            .subscriptions
            .iter()
            .find(|s| &s.id == id && &s.tenant_id == tenant)
            .cloned())
    }
    async fn list_subscriptions(
        &self,
        tenant: &TenantId,
        after: Option<&SubscriptionId>,
        limit: u32,
    ) -> PortResult<Vec<Subscription>> {
        let mut subs: Vec<_> = lock(&self.data)
            .subscriptions
            .iter()
            .filter(|s| &s.tenant_id == tenant && after.is_none_or(|a| &s.id > a))
            .cloned()
            .collect();
        subs.sort_by(|a, b| a.id.cmp(&b.id));
        subs.truncate(limit as usize);
        Ok(subs)
    }
    async fn delete_subscription(&self, tenant: &TenantId, id: &SubscriptionId) -> PortResult<bool> {
        self.crash.act("delete subscription")?;
        let mut d = lock(&self.data);
        let before = d.subscriptions.len();
        d.subscriptions.retain(|s| !(&s.id == id && &s.tenant_id == tenant));
        Ok(d.subscriptions.len() < before)
    }
    async fn create_event(&self, event: &Event, deliveries: &[Delivery]) -> PortResult<Created> {
        self.crash.act("create event")?;
        if take_one(&self.failing_event_writes) {
            return Err(PortError::retryable("create event", "throttled (failing_event_writes)"));
        }
        let mut d = lock(&self.data);
        if let Some(key) = &event.idempotency_key {
            if let Some(e) = d
                .events
                .iter()
                .find(|e| e.tenant_id == event.tenant_id && e.idempotency_key.as_ref() == Some(key))
            {
                return Ok(Created::Existing(e.id.clone()));
            }
        }
        d.events.push(event.clone());
        d.deliveries.extend(deliveries.iter().cloned());
        Ok(Created::New)
    }
    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> PortResult<Option<Event>> {
        self.event_reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(lock(&self.data)
            .events
            .iter()
            .find(|e| &e.id == id && &e.tenant_id == tenant)
            .cloned())
    }
    async fn event_deliveries(&self, tenant: &TenantId, event: &EventId) -> PortResult<Vec<Delivery>> {
        Ok(lock(&self.data)
            .deliveries
            .iter()
            .filter(|d| &d.event_id == event && &d.tenant_id == tenant)
            .cloned()
            .collect())
    }
    async fn get_delivery(&self, id: &DeliveryId) -> PortResult<Option<Delivery>> {
        if self.unavailable.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(PortError::retryable(
                "get delivery",
                "throttled (MemoryStore::unavailable)",
            ));
        }
        if take_one(&self.unseen_delivery_reads) {
            return Ok(None);
        }
        Ok(lock(&self.data).deliveries.iter().find(|d| &d.id == id).cloned())
    }
    async fn list_deliveries(&self, tenant: &TenantId, q: &DeliveryQuery) -> PortResult<DeliveryPage> {
        // Newest first by `(created_at, id)`; the cursor is the previous page's last pair.
        let after = match &q.cursor {
            None => None,
            Some(c) => Some(
                c.split_once('.')
                    .and_then(|(at, id)| {
                        Some((
                            DateTime::from_timestamp_nanos(at.parse().ok()?),
                            DeliveryId::parse(id).ok()?,
                        ))
                    })
                    .ok_or_else(|| PortError::InvalidCursor(c.clone()))?,
            ),
        };
        let d = lock(&self.data);
        let mut items: Vec<Delivery> = d
            .deliveries
            .iter()
            .filter(|x| &x.tenant_id == tenant)
            .filter(|x| q.status.is_none_or(|s| x.status == s))
            .filter(|x| q.subscription_id.as_ref().is_none_or(|s| &x.subscription_id == s))
            .filter(|x| after.as_ref().is_none_or(|(at, id)| (x.created_at, &x.id) < (*at, id)))
            .cloned()
            .collect();
        items.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        let limit = if q.limit == 0 { 50 } else { q.limit.min(100) } as usize;
        let next_cursor = (items.len() > limit).then(|| {
            let last = &items[limit - 1];
            format!("{}.{}", last.created_at.timestamp_nanos_opt().unwrap_or(0), last.id)
        });
        items.truncate(limit);
        Ok(DeliveryPage { items, next_cursor })
    }
    async fn apply_change(&self, change: &DeliveryChange) -> PortResult<()> {
        self.crash.act("apply change")?;
        if take_one(&self.failing_delivery_writes) {
            return Err(PortError::retryable(
                "apply change",
                "throttled (failing_delivery_writes)",
            ));
        }
        let mut d = lock(&self.data);
        let Some(idx) = d.deliveries.iter().position(|x| x.id == change.next.id) else {
            return Err(PortError::ConditionFailed("no such delivery".into()));
        };
        if !change.expected.holds_for(&d.deliveries[idx]) {
            return Err(PortError::ConditionFailed("delivery changed".into()));
        }
        if let Some(a) = &change.attempt {
            if d.attempts
                .iter()
                .any(|x| x.delivery_id == a.delivery_id && x.round == a.round && x.attempt == a.attempt)
            {
                return Err(PortError::ConditionFailed("attempt already recorded".into()));
            }
            d.attempts.push(a.clone());
        }
        d.deliveries[idx] = change.next.clone();
        if take_one(&self.lost_delivery_answers) {
            return Err(PortError::retryable(
                "apply change",
                "timed out (lost_delivery_answers)",
            ));
        }
        Ok(())
    }
    async fn attempts(&self, delivery: &DeliveryId) -> PortResult<Vec<Attempt>> {
        Ok(lock(&self.data)
            .attempts
            .iter()
            .filter(|a| &a.delivery_id == delivery)
            .cloned()
            .collect())
    }
    async fn overdue_deliveries(&self, due_before: DateTime<Utc>, limit: u32) -> PortResult<Vec<Delivery>> {
        Ok(lock(&self.data)
            .deliveries
            .iter()
            .filter(|d| d.is_swept())
            .filter(|d| d.next_attempt_at.is_some_and(|t| t < due_before))
            .take(limit as usize)
            .cloned()
            .collect())
    }
    async fn awaiting_queued_message(
        &self,
        created: std::ops::Range<DateTime<Utc>>,
        after: Option<&str>,
        limit: u32,
    ) -> PortResult<AuditPage> {
        if take_one(&self.failing_audits) {
            return Err(PortError::retryable(
                "audit first attempts",
                "throttled (failing_audits)",
            ));
        }
        // In creation order; a page's place is its last delivery's `{created_at}#{id}`.
        let place = |d: &Delivery| format!("{}#{}", d.created_at.timestamp_nanos_opt().unwrap_or(i64::MAX), d.id);
        let mut found: Vec<Delivery> = lock(&self.data)
            .deliveries
            .iter()
            .filter(|d| created.contains(&d.created_at) && d.awaits_queued_message())
            .cloned()
            .collect();
        found.sort_by_key(|d| (d.created_at, d.id.to_string()));
        let page: Vec<Delivery> = found
            .into_iter()
            .filter(|d| after.is_none_or(|a| place_after(&place(d), a)))
            .take(limit.max(1) as usize)
            .collect();
        let next = (page.len() == limit.max(1) as usize).then(|| place(page.last().unwrap()));
        Ok(AuditPage { deliveries: page, next })
    }
    async fn limit_rate(
        &self,
        sub: &SubscriptionId,
        interval: std::time::Duration,
        now: DateTime<Utc>,
        arrival: crate::rate_limit::Arrival,
    ) -> PortResult<crate::rate_limit::Verdict> {
        self.crash.act("take a rate-limit turn")?;
        let verdict = {
            let mut d = lock(&self.data);
            let lines = d.rate_lines.get(sub).copied().unwrap_or_default();
            let (verdict, after) = crate::rate_limit::admit(lines, interval, now, arrival);
            d.rate_lines.insert(sub.clone(), after);
            verdict
        };
        let late = {
            let mut late = lock(&self.late_rate_answers);
            let answer = late.as_ref().map(|(clock, by, _)| (clock.clone(), *by));
            if let Some((_, _, n)) = late.as_mut() {
                *n -= 1;
                if *n == 0 {
                    *late = None;
                }
            }
            answer
        };
        if let Some((clock, by)) = late {
            clock.sleep_until(now + by).await;
        }
        Ok(verdict)
    }
    async fn circuit(&self, sub: &SubscriptionId) -> PortResult<Option<Circuit>> {
        Ok(lock(&self.data).circuits.get(sub).cloned())
    }
    async fn put_circuit(&self, sub: &SubscriptionId, circuit: &Circuit, read: Option<&Circuit>) -> PortResult<()> {
        self.crash.act("put circuit")?;
        if take_one(&self.failing_circuit_writes) {
            return Err(PortError::retryable(
                "put circuit",
                "throttled (failing_circuit_writes)",
            ));
        }
        let mut d = lock(&self.data);
        if d.circuits.get(sub).map(|c| c.version) != read.map(|r| r.version) {
            return Err(PortError::ConditionFailed(
                "the circuit breaker changed since it was read".into(),
            ));
        }
        d.circuits.insert(sub.clone(), circuit.clone());
        Ok(())
    }
    async fn endpoint_health(&self, sub: &SubscriptionId) -> PortResult<EndpointHealth> {
        Ok(lock(&self.data).health.get(sub).cloned().unwrap_or_default())
    }
    async fn save_endpoint_health(&self, sub: &SubscriptionId, health: &EndpointHealth) -> PortResult<()> {
        self.crash.act("save endpoint health")?;
        let mut d = lock(&self.data);
        let saved = EndpointHealth {
            version: health.version + 1,
            ..health.clone()
        };
        let stored = d.health.get(sub);
        if stored == Some(&saved) {
            // This very save again (its answer lost): done.
            return Ok(());
        }
        if stored.map_or(0, |h| h.version) != health.version {
            return Err(PortError::ConditionFailed(
                "endpoint health saved since it was read".into(),
            ));
        }
        d.health.insert(sub.clone(), saved);
        Ok(())
    }
    async fn add_endpoint_stats(
        &self,
        sub: &SubscriptionId,
        counts: &[(DateTime<Utc>, StatsCounts)],
    ) -> PortResult<()> {
        // Not one of the process's acts: statistics are best effort, and a write of them
        // would use up the crash points the model checker places after the writes that count.
        let mut d = lock(&self.data);
        let buckets = d.stats.entry(sub.clone()).or_default();
        for (start, c) in counts {
            buckets.entry(*start).or_default().add(c);
        }
        Ok(())
    }
    async fn endpoint_stats(
        &self,
        sub: &SubscriptionId,
        from: DateTime<Utc>,
    ) -> PortResult<Vec<(DateTime<Utc>, StatsCounts)>> {
        let d = lock(&self.data);
        let buckets = d.stats.get(sub).into_iter().flat_map(|b| b.range(from..));
        Ok(buckets.map(|(at, c)| (*at, *c)).collect())
    }
    async fn queue_dead_notice(&self, owner: &Email, notice: &DeadNotice) -> PortResult<bool> {
        self.crash.act("queue dead notice")?;
        let mut d = lock(&self.data);
        let key = (notice.delivery_id.clone(), notice.round);
        if d.notices.contains_key(&key) {
            return Ok(false);
        }
        d.notices.insert(key, (owner.clone(), notice.clone(), false));
        Ok(true)
    }
    async fn due_digests(&self, now: DateTime<Utc>, window_start: DateTime<Utc>, limit: u32) -> PortResult<Vec<Email>> {
        let d = lock(&self.data);
        let mut owners: Vec<Email> = d
            .notices
            .values()
            .filter(|(owner, _, sent)| {
                let digest = d.digests.get(owner);
                !sent
                    && digest.and_then(|g| g.last_sent).is_none_or(|t| t <= window_start)
                    && digest.and_then(|g| g.retry_at).is_none_or(|t| t <= now)
            })
            .map(|(owner, _, _)| owner.clone())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        owners.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        owners.truncate(limit as usize);
        Ok(owners)
    }
    async fn claim_digest(
        &self,
        owner: &Email,
        now: DateTime<Utc>,
        window_start: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> PortResult<Option<DigestClaim>> {
        self.crash.act("claim digest")?;
        let mut d = lock(&self.data);
        let notices: Vec<DeadNotice> = d
            .notices
            .values()
            .filter(|(o, _, sent)| o == owner && !sent)
            .map(|(_, n, _)| n.clone())
            .collect();
        let digest = d.digests.entry(owner.clone()).or_default();
        if notices.is_empty()
            || digest.last_sent.is_some_and(|t| t > window_start)
            || digest.retry_at.is_some_and(|t| t > now)
            || digest.claimed_at.is_some_and(|t| t >= stale_before)
        {
            return Ok(None);
        }
        digest.claimed_at = Some(now);
        Ok(Some(DigestClaim::new(owner.clone(), notices, now, 0)))
    }
    async fn finish_digest(&self, claim: &DigestClaim) -> PortResult<()> {
        self.crash.act("finish digest")?;
        if take_one(&self.failing_digest_finishes) {
            return Err(PortError::retryable(
                "finish digest",
                "throttled (failing_digest_finishes)",
            ));
        }
        let mut d = lock(&self.data);
        for n in &claim.notices {
            if let Some(notice) = d.notices.get_mut(&(n.delivery_id.clone(), n.round)) {
                notice.2 = true;
            }
        }
        let digest = d.digests.entry(claim.owner.clone()).or_default();
        if digest.claimed_at == Some(claim.claimed_at) {
            *digest = MemoryDigest {
                last_sent: Some(claim.claimed_at),
                ..MemoryDigest::default()
            };
        }
        Ok(())
    }
    async fn release_digest(&self, claim: &DigestClaim, retry_at: DateTime<Utc>) -> PortResult<()> {
        self.crash.act("release digest")?;
        let mut d = lock(&self.data);
        let digest = d.digests.entry(claim.owner.clone()).or_default();
        if digest.claimed_at == Some(claim.claimed_at) {
            digest.claimed_at = None;
            digest.retry_at = Some(retry_at);
        }
        Ok(())
    }
}

/// Whether two held items are of one attempt (a held attempt's key on every backend).
fn same_attempt(a: &ScheduledTask, b: &ScheduledTask) -> bool {
    (&a.task.delivery_id, a.task.round, a.task.attempt) == (&b.task.delivery_id, b.task.round, b.task.attempt)
}

/// A process dying at a chosen point, shared by every in-memory port of a [`Harness`]: once
/// armed with `k`, the next `k` things it does that others see (a write to the store, a
/// queue or the scheduler table, a POST, an email) happen, and every one after them fails,
/// until disarmed. So a handler stops between any two of them as a crash would leave it
/// (between a POST and its record, an email and its own): what it did stays, nothing after
/// happens.
#[derive(Default)]
pub struct CrashPoint {
    acts_left: Mutex<Option<u32>>,
}

impl CrashPoint {
    /// The process dies after `acts` more writes, POSTs or emails.
    pub fn arm(&self, acts: u32) {
        *lock(&self.acts_left) = Some(acts);
    }

    /// A fresh process: everything works again.
    pub fn disarm(&self) {
        *lock(&self.acts_left) = None;
    }

    /// What it may still do before it dies, if armed.
    pub fn acts_left(&self) -> Option<u32> {
        *lock(&self.acts_left)
    }

    /// Whether the process has died.
    pub fn crashed(&self) -> bool {
        *lock(&self.acts_left) == Some(0)
    }

    /// One write, POST or email: `Err` once the process has died.
    fn act(&self, what: &'static str) -> PortResult<()> {
        match lock(&self.acts_left).as_mut() {
            Some(0) => Err(PortError::retryable(what, "the process died (CrashPoint)")),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// Counts down a "fail the next N calls" setting: `true` if this call is to fail.
fn take_one(n: &std::sync::atomic::AtomicU32) -> bool {
    n.fetch_update(
        std::sync::atomic::Ordering::SeqCst,
        std::sync::atomic::Ordering::SeqCst,
        |v| v.checked_sub(1),
    )
    .is_ok()
}

/// A queue whose messages become visible at `now + delay` on the shared [`ManualClock`].
pub struct MemoryQueue {
    clock: Arc<ManualClock>,
    max_delay: u32,
    ready: Mutex<Vec<(DeliveryTask, DateTime<Utc>)>>,
    dead: Mutex<Vec<DeliveryTask>>,
    /// Every (task, delay) ever enqueued, for assertions.
    pub log: Mutex<Vec<(DeliveryTask, u32)>>,
    /// The next this many dead-letter hand-offs fail (retryable).
    pub failing_dead_letters: std::sync::atomic::AtomicU32,
    /// The next this many enqueues fail (retryable), as a crash between a store write and
    /// the queue send would leave things.
    pub failing_enqueues: std::sync::atomic::AtomicU32,
    pub crash: Arc<CrashPoint>,
}

impl MemoryQueue {
    pub fn new(clock: Arc<ManualClock>, max_delay: u32) -> Self {
        Self {
            clock,
            max_delay,
            ready: Mutex::default(),
            dead: Mutex::default(),
            log: Mutex::default(),
            failing_dead_letters: Default::default(),
            failing_enqueues: Default::default(),
            crash: Default::default(),
        }
    }

    /// Remove and return the messages visible now.
    pub fn take_visible(&self) -> Vec<DeliveryTask> {
        let now = self.clock.now();
        let mut ready = lock(&self.ready);
        let (due, later): (Vec<_>, Vec<_>) = ready.drain(..).partition(|(_, at)| *at <= now);
        *ready = later;
        due.into_iter().map(|(t, _)| t).collect()
    }

    pub fn take_dead(&self) -> Vec<DeliveryTask> {
        std::mem::take(&mut *lock(&self.dead))
    }

    pub fn pending(&self) -> usize {
        lock(&self.ready).len()
    }

    /// Every message on the queue and when it is (or was) visible, in the order queued.
    pub fn messages(&self) -> Vec<(DeliveryTask, DateTime<Utc>)> {
        lock(&self.ready).clone()
    }

    /// Remove the `index`-th message of [`Self::messages`].
    pub fn take_at(&self, index: usize) -> (DeliveryTask, DateTime<Utc>) {
        lock(&self.ready).remove(index)
    }

    /// Put a message back, visible at `at` (its receiver did not finish with it), unlogged.
    pub fn put_back(&self, task: DeliveryTask, at: DateTime<Utc>) {
        lock(&self.ready).push((task, at));
    }

    /// The queue's own redrive to its dead-letter queue (no process's send: it fails
    /// nothing, whatever the crash point says).
    pub fn redrive(&self, tasks: &[DeliveryTask]) {
        lock(&self.dead).extend(tasks.iter().cloned());
    }

    /// The dead-letter queue's messages, left on it.
    pub fn dead_letters(&self) -> Vec<DeliveryTask> {
        lock(&self.dead).clone()
    }
}

#[async_trait]
impl DeliveryQueue for MemoryQueue {
    fn max_delay_seconds(&self) -> u32 {
        self.max_delay
    }
    async fn enqueue(&self, tasks: &[(DeliveryTask, u32)]) -> PortResult<()> {
        self.crash.act("enqueue")?;
        if take_one(&self.failing_enqueues) {
            return Err(PortError::retryable("enqueue", "unavailable (failing_enqueues)"));
        }
        if let Some((_, delay)) = tasks.iter().find(|(_, d)| *d > self.max_delay) {
            return Err(PortError::permanent(
                "enqueue",
                format!("a delay of {delay} s exceeds the queue's limit of {} s", self.max_delay),
            ));
        }
        let now = self.clock.now();
        for (task, delay) in tasks {
            lock(&self.ready).push((task.clone(), now + Duration::seconds((*delay).into())));
            lock(&self.log).push((task.clone(), *delay));
        }
        Ok(())
    }
    async fn dead_letter(&self, tasks: &[DeliveryTask]) -> PortResult<()> {
        self.crash.act("dead letter")?;
        if take_one(&self.failing_dead_letters) {
            return Err(PortError::retryable(
                "dead letter",
                "unavailable (failing_dead_letters)",
            ));
        }
        lock(&self.dead).extend(tasks.iter().cloned());
        Ok(())
    }
}

/// An item of a [`MemoryScheduler`] that cannot be read as a task (as another backend's
/// row whose document does not parse): `due_page` sets it aside once it is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableItem {
    pub due: DateTime<Utc>,
    pub key: String,
    pub raw: String,
}

#[derive(Default)]
pub struct MemoryScheduler {
    /// While set, `held` answers this long after its read, and `release` writes this long
    /// after it is called, on this clock (as calls over a network take time), so workers
    /// side by side interleave inside a release.
    #[allow(clippy::type_complexity)]
    pub latency: Mutex<Option<(Arc<dyn Clock>, Duration)>>,
    pub items: Mutex<Vec<ScheduledTask>>,
    pub held: Mutex<Vec<(SubscriptionId, ScheduledTask)>>,
    /// The endpoints `holding` lists.
    pub holding: Mutex<std::collections::BTreeMap<SubscriptionId, TenantId>>,
    /// The scheduler's lease: its holder, and until when.
    pub lease: Mutex<Option<(String, DateTime<Utc>)>>,
    /// Where the audit of queued messages has got to.
    pub audit: Mutex<Option<AuditPosition>>,
    /// The last endpoint the scheduler tended.
    pub tend: Mutex<Option<SubscriptionId>>,
    /// Items in the table that cannot be read, and those `due_page` set aside.
    pub unreadable: Mutex<Vec<UnreadableItem>>,
    pub aside: Mutex<Vec<SetAsideItem>>,
    /// The next this many `due_page` calls fail (retryable), as a throttled table would.
    pub failing_dues: std::sync::atomic::AtomicU32,
    pub crash: Arc<CrashPoint>,
}

impl MemoryScheduler {
    async fn take_time(&self) {
        let latency = lock(&self.latency).clone();
        if let Some((clock, latency)) = latency {
            clock.sleep_until(clock.now() + latency).await;
        }
    }
}

#[async_trait]
impl SchedulerTable for MemoryScheduler {
    async fn schedule(&self, item: &ScheduledTask) -> PortResult<()> {
        self.crash.act("schedule")?;
        // The same item scheduled twice is one item (as on the other backends).
        let mut items = lock(&self.items);
        if !items.contains(item) {
            items.push(item.clone());
        }
        Ok(())
    }
    async fn due_page(&self, now: DateTime<Utc>, until: DateTime<Utc>, limit: u32) -> PortResult<DuePage> {
        if take_one(&self.failing_dues) {
            return Err(PortError::retryable("scheduler due", "throttled (failing_dues)"));
        }
        let unreadable: Vec<UnreadableItem> = lock(&self.unreadable)
            .iter()
            .filter(|i| i.due <= until)
            .cloned()
            .collect();
        if !unreadable.is_empty() {
            self.crash.act("set aside")?;
            lock(&self.unreadable).retain(|i| !unreadable.contains(i));
            let mut aside = lock(&self.aside);
            for item in &unreadable {
                aside.retain(|a| a.key != item.key);
                aside.push(SetAsideItem {
                    key: item.key.clone(),
                    set_aside_at: now,
                    error: "cannot be read as a task (MemoryScheduler::unreadable)".into(),
                    raw: item.raw.clone(),
                });
            }
        }
        let mut due: Vec<_> = lock(&self.items).iter().filter(|i| i.due <= until).cloned().collect();
        due.sort_by_key(|i| i.due);
        due.truncate(limit as usize);
        Ok(DuePage {
            tasks: due,
            set_aside: unreadable.len(),
        })
    }
    async fn set_aside(&self, after: Option<&str>, limit: u32) -> PortResult<Vec<SetAsideItem>> {
        let mut aside: Vec<SetAsideItem> = lock(&self.aside)
            .iter()
            .filter(|a| after.is_none_or(|after| a.key.as_str() > after))
            .cloned()
            .collect();
        aside.sort_by(|a, b| a.key.cmp(&b.key));
        aside.truncate(limit as usize);
        Ok(aside)
    }
    async fn remove(&self, items: &[ScheduledTask]) -> PortResult<()> {
        self.crash.act("remove scheduled")?;
        lock(&self.items).retain(|i| !items.contains(i));
        Ok(())
    }
    async fn hold(&self, tenant: &TenantId, sub: &SubscriptionId, item: &ScheduledTask) -> PortResult<()> {
        self.crash.act("hold")?;
        {
            let mut held = lock(&self.held);
            held.retain(|(s, i)| !(s == sub && same_attempt(i, item)));
            held.push((sub.clone(), item.clone()));
            held.sort_by_key(|(_, i)| (i.task.delivery_id.clone(), i.task.round, i.task.attempt));
        }
        // Parked, then listed (as the other backends): see `Services::tend_breaker`.
        lock(&self.holding).insert(sub.clone(), tenant.clone());
        self.schedule(item).await
    }
    async fn held(&self, sub: &SubscriptionId, limit: u32) -> PortResult<Vec<ScheduledTask>> {
        let page: Vec<_> = lock(&self.held)
            .iter()
            .filter(|(s, _)| s == sub)
            .map(|(_, i)| i.clone())
            .take(limit as usize)
            .collect();
        // Read, then answered a moment later: what it read may have changed meanwhile.
        self.take_time().await;
        Ok(page)
    }
    async fn release(&self, sub: &SubscriptionId, items: &[ScheduledTask]) -> PortResult<()> {
        self.crash.act("release")?;
        self.take_time().await;
        // By attempt, as every backend keys a held attempt: whatever give-up time it was read
        // with.
        lock(&self.held).retain(|(s, i)| !(s == sub && items.iter().any(|r| same_attempt(i, r))));
        Ok(())
    }
    async fn holding(&self, after: Option<&SubscriptionId>, limit: u32) -> PortResult<Vec<Holding>> {
        Ok(lock(&self.holding)
            .iter()
            .filter(|(s, _)| after.is_none_or(|a| *s > a))
            .take(limit as usize)
            .map(|(s, t)| Holding {
                subscription_id: s.clone(),
                tenant_id: t.clone(),
            })
            .collect())
    }
    async fn stop_holding(&self, sub: &SubscriptionId) -> PortResult<()> {
        self.crash.act("stop holding")?;
        lock(&self.holding).remove(sub);
        Ok(())
    }

    async fn take_lease(&self, holder: &str, now: DateTime<Utc>, until: DateTime<Utc>) -> PortResult<bool> {
        self.crash.act("take lease")?;
        let mut lease = lock(&self.lease);
        if lease.as_ref().is_some_and(|(h, u)| h != holder && *u > now) {
            return Ok(false);
        }
        *lease = Some((holder.to_owned(), until));
        Ok(true)
    }

    async fn end_lease(&self, holder: &str, now: DateTime<Utc>) -> PortResult<()> {
        self.crash.act("end lease")?;
        let mut lease = lock(&self.lease);
        if let Some((h, until)) = lease.as_mut() {
            if h == holder {
                *until = now;
            }
        }
        Ok(())
    }
    async fn audit_position(&self) -> PortResult<Option<AuditPosition>> {
        Ok(lock(&self.audit).clone())
    }
    async fn save_audit_position(&self, position: &AuditPosition) -> PortResult<()> {
        self.crash.act("save the audit's position")?;
        *lock(&self.audit) = Some(position.clone());
        Ok(())
    }
    async fn tend_position(&self) -> PortResult<Option<SubscriptionId>> {
        Ok(lock(&self.tend).clone())
    }
    async fn save_tend_position(&self, after: Option<&SubscriptionId>) -> PortResult<()> {
        self.crash.act("save the tending's position")?;
        *lock(&self.tend) = after.cloned();
        Ok(())
    }
}

/// Whether the place `a` (`{nanos}#{id}`) comes after `b`, in creation order.
fn place_after(a: &str, b: &str) -> bool {
    let split = |p: &str| {
        let (t, id) = p.split_once('#').unwrap_or((p, ""));
        (t.parse::<i64>().unwrap_or(i64::MIN), id.to_owned())
    };
    split(a) > split(b)
}

#[derive(Default)]
pub struct MemoryMailer {
    pub sent: Mutex<Vec<OutgoingEmail>>,
    /// Recipients refused once each (as SES refuses an address), then accepted.
    pub refusing_once: Mutex<HashSet<String>>,
    pub crash: Arc<CrashPoint>,
}

#[async_trait]
impl Mailer for MemoryMailer {
    async fn send(&self, email: &OutgoingEmail) -> PortResult<()> {
        self.crash.act("send email")?;
        if lock(&self.refusing_once).remove(email.to.as_str()) {
            return Err(PortError::permanent(
                "send email",
                format!("{} refused (refusing_once)", email.to),
            ));
        }
        lock(&self.sent).push(email.clone());
        Ok(())
    }
}

/// Seals a secret or a header's value by keeping it and answering `memory:<n>`: an envelope
/// that shows nothing and opens only under the context it was sealed with. Counts its opens.
#[derive(Default)]
pub struct MemorySecrets {
    sealed: Mutex<Vec<(SecretContext, String)>>,
    pub opens: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl SecretKeeper for MemorySecrets {
    async fn seal_text(&self, text: &str, context: &SecretContext) -> PortResult<SealedSecret> {
        let mut sealed = lock(&self.sealed);
        sealed.push((context.clone(), text.to_owned()));
        Ok(SealedSecret::envelope(format!("memory:{}", sealed.len() - 1)))
    }

    async fn open_text(&self, sealed: &SealedSecret, context: &SecretContext) -> PortResult<String> {
        self.opens.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let kept = sealed
            .as_str()
            .strip_prefix("memory:")
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| lock(&self.sealed).get(n).cloned());
        match kept {
            Some((ctx, text)) if ctx == *context => Ok(text),
            Some(_) => Err(PortError::permanent("open secret", "sealed under another context")),
            None => Err(PortError::permanent(
                "open secret",
                "not an envelope this keeper sealed",
            )),
        }
    }
}

/// Answers each POST from a script: the n-th request to a URL gets `script(url, n)`.
pub struct ScriptedSender {
    /// The answer to a request, given every request before it.
    #[allow(clippy::type_complexity)]
    script: Box<dyn Fn(&WebhookRequest, &[WebhookRequest]) -> SendOutcome + Send + Sync>,
    pub requests: Mutex<Vec<WebhookRequest>>,
    /// Once it has died, nothing goes out.
    pub crash: Arc<CrashPoint>,
}

impl ScriptedSender {
    pub fn new(script: impl Fn(&str, usize) -> SendOutcome + Send + Sync + 'static) -> Self {
        Self {
            script: Box::new(move |request, before| {
                let url = request.url.as_str();
                script(url, before.iter().filter(|r| r.url.as_str() == url).count())
            }),
            requests: Mutex::default(),
            crash: Default::default(),
        }
    }

    /// Each message answered by its own count: its n-th POST (by `webhook-id`, from 0) gets
    /// `script(n)`.
    pub fn per_message(script: impl Fn(usize) -> SendOutcome + Send + Sync + 'static) -> Self {
        fn id(r: &WebhookRequest) -> Option<&str> {
            r.headers
                .iter()
                .find(|(k, _)| k == "webhook-id")
                .map(|(_, v)| v.as_str())
        }
        Self {
            script: Box::new(move |request, before| script(before.iter().filter(|r| id(r) == id(request)).count())),
            requests: Mutex::default(),
            crash: Default::default(),
        }
    }

    /// Each request answered by `script(request, every request before it)`.
    pub fn with_requests(
        script: impl Fn(&WebhookRequest, &[WebhookRequest]) -> SendOutcome + Send + Sync + 'static,
    ) -> Self {
        Self {
            script: Box::new(script),
            requests: Mutex::default(),
            crash: Default::default(),
        }
    }

    /// Every URL answers `status`.
    pub fn always(status: u16) -> Self {
        Self::new(move |_, _| status_outcome(status))
    }
}

pub fn status_outcome(status: u16) -> SendOutcome {
    SendOutcome {
        status_code: Some(status),
        error: None,
        response_excerpt: Some(String::new()),
        duration_ms: 5,
        retry_after: None,
    }
}

#[async_trait]
impl Sender for ScriptedSender {
    async fn send(&self, request: WebhookRequest) -> SendOutcome {
        if self.crash.act("POST").is_err() {
            return SendOutcome {
                error: Some((SendErrorKind::Connect, "the process died (CrashPoint)".into())),
                status_code: None,
                response_excerpt: None,
                ..status_outcome(0)
            };
        }
        let mut requests = lock(&self.requests);
        let outcome = (self.script)(&request, &requests);
        requests.push(request);
        outcome
    }
}

/// A clock that moves only when told.
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self { now: Mutex::new(start) }
    }
    pub fn advance(&self, by: Duration) {
        *lock(&self.now) += by;
    }
    pub fn set(&self, to: DateTime<Utc>) {
        *lock(&self.now) = to;
    }
}

#[async_trait]
impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *lock(&self.now)
    }
    /// Time moves on to `at` at once: a test waits for nothing.
    async fn sleep_until(&self, at: DateTime<Utc>) {
        let mut now = lock(&self.now);
        *now = (*now).max(at);
    }
}

/// A clock for runs with workers side by side: time moves only when [`Self::advance`] moves
/// it, and `sleep_until` waits for that, as a real worker waits, where [`ManualClock`]'s
/// jumps (moving time on for every worker at once).
pub struct SteppedClock {
    pub manual: Arc<ManualClock>,
    sleepers: Mutex<Vec<(DateTime<Utc>, std::task::Waker)>>,
}

impl SteppedClock {
    pub fn new(manual: Arc<ManualClock>) -> Self {
        Self {
            manual,
            sleepers: Mutex::default(),
        }
    }

    /// When the first worker waiting wakes.
    pub fn next_wake(&self) -> Option<DateTime<Utc>> {
        lock(&self.sleepers).iter().map(|(at, _)| *at).min()
    }

    /// Move time on, and wake whoever was waiting for it.
    pub fn advance(&self, by: Duration) {
        self.move_to(self.manual.now() + by);
    }

    /// Move time on to `at` (never back), and wake whoever was waiting for it.
    pub fn move_to(&self, at: DateTime<Utc>) {
        self.manual.set(at.max(self.manual.now()));
        let now = self.manual.now();
        let woken: Vec<_> = {
            let mut sleepers = lock(&self.sleepers);
            let (due, waiting) = sleepers.drain(..).partition(|(at, _)| *at <= now);
            *sleepers = waiting;
            due
        };
        for (_, waker) in woken {
            waker.wake();
        }
    }
}

#[async_trait]
impl Clock for SteppedClock {
    fn now(&self) -> DateTime<Utc> {
        self.manual.now()
    }
    async fn sleep_until(&self, at: DateTime<Utc>) {
        std::future::poll_fn(|cx| {
            if self.manual.now() >= at {
                return std::task::Poll::Ready(());
            }
            lock(&self.sleepers).push((at, cx.waker().clone()));
            std::task::Poll::Pending
        })
        .await
    }
}

/// Run each of `workers` until it waits for a [`SteppedClock`] to move, or is done (done ones
/// are dropped): one step of a run that drives workers side by side.
pub async fn run_until_waiting<F: std::future::Future>(workers: &mut futures::stream::FuturesUnordered<F>) {
    std::future::poll_fn(|cx| {
        while let std::task::Poll::Ready(Some(_)) = futures::StreamExt::poll_next_unpin(workers, cx) {}
        std::task::Poll::Ready(())
    })
    .await
}

/// A metrics recorder that keeps what it was given, by name, for a test to look at
/// ([`Harness::recording`]).
#[derive(Default)]
pub struct RecordedMetrics {
    pub counts: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// How many times each was timed.
    pub times: Mutex<std::collections::BTreeMap<&'static str, usize>>,
    pub flushes: std::sync::atomic::AtomicU32,
}

impl crate::metrics::Recorder for RecordedMetrics {
    fn count(&self, name: &'static str, n: u64) {
        *lock(&self.counts).entry(name).or_default() += n;
    }
    fn time(&self, name: &'static str, _: std::time::Duration) {
        *lock(&self.times).entry(name).or_default() += 1;
    }
    fn flush(&self) {
        self.flushes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl RecordedMetrics {
    /// The sum counted under `name` (0: none).
    pub fn count_of(&self, name: &str) -> u64 {
        lock(&self.counts).get(name).copied().unwrap_or(0)
    }
}

/// Services on in-memory ports, with handles to each port.
pub struct Harness {
    pub services: Services,
    pub store: Arc<MemoryStore>,
    pub queue: Arc<MemoryQueue>,
    pub scheduler: Arc<MemoryScheduler>,
    pub mailer: Arc<MemoryMailer>,
    pub secrets: Arc<MemorySecrets>,
    pub sender: Arc<ScriptedSender>,
    pub clock: Arc<ManualClock>,
    /// Shared by the ports above: arm it to kill the process at a write.
    pub crash: Arc<CrashPoint>,
    /// How many times each message was handed out (`run_as_a_worker_for`).
    pub receives: Mutex<HashMap<DeliveryTask, u32>>,
}

impl Harness {
    /// The same harness, its services' metrics recorded.
    pub fn recording(self) -> (Self, Arc<RecordedMetrics>) {
        let recorded = Arc::new(RecordedMetrics::default());
        let services = self.services.with_metrics(recorded.clone());
        (Self { services, ..self }, recorded)
    }

    /// A Lambda invocation deadline (milliseconds since the epoch) `seconds` ahead of the
    /// harness's clock.
    pub fn deadline_in(&self, seconds: i64) -> u64 {
        (self.clock.now() + Duration::seconds(seconds)).timestamp_millis() as u64
    }

    pub fn new(sender: ScriptedSender) -> Self {
        Self::with_config(sender, Config::default(), 900)
    }

    pub fn with_config(sender: ScriptedSender, config: Config, queue_max_delay: u32) -> Self {
        let clock = Arc::new(ManualClock::new("2026-01-01T00:00:00Z".parse().expect("a valid time")));
        Self::on_clock(sender, config, queue_max_delay, clock.clone(), clock)
    }

    /// Services whose workers wait for time to move ([`SteppedClock`]): a run drives them side
    /// by side, moving time with the clock returned.
    pub fn stepped(sender: ScriptedSender, config: Config) -> (Self, Arc<SteppedClock>) {
        let manual = Arc::new(ManualClock::new("2026-01-01T00:00:00Z".parse().expect("a valid time")));
        let stepped = Arc::new(SteppedClock::new(manual.clone()));
        (Self::on_clock(sender, config, 900, manual, stepped.clone()), stepped)
    }

    /// `clock` is what the services read and wait on; `manual`, the time it reads.
    fn on_clock(
        sender: ScriptedSender,
        config: Config,
        queue_max_delay: u32,
        manual: Arc<ManualClock>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        // One process: one crash point for every port.
        let crash = Arc::new(CrashPoint::default());
        let store = Arc::new(MemoryStore {
            crash: crash.clone(),
            ..MemoryStore::default()
        });
        let queue = Arc::new(MemoryQueue {
            crash: crash.clone(),
            ..MemoryQueue::new(manual.clone(), queue_max_delay)
        });
        let scheduler = Arc::new(MemoryScheduler {
            crash: crash.clone(),
            ..MemoryScheduler::default()
        });
        let mailer = Arc::new(MemoryMailer {
            crash: crash.clone(),
            ..MemoryMailer::default()
        });
        let secrets = Arc::new(MemorySecrets::default());
        let sender = Arc::new(ScriptedSender {
            crash: crash.clone(),
            ..sender
        });
        let ports = Ports {
            store: store.clone(),
            queue: queue.clone(),
            store_with_queue: None,
            scheduler: scheduler.clone(),
            mailer: mailer.clone(),
            secrets: secrets.clone(),
            sender: sender.clone(),
            clock,
        };
        let services = Services::new(ports, config, rand::rngs::StdRng::seed_from_u64(42));
        Self {
            services,
            store,
            queue,
            scheduler,
            mailer,
            secrets,
            sender,
            clock: manual,
            crash,
            receives: Mutex::default(),
        }
    }

    /// A tenant and its API key.
    pub async fn tenant(&self, owner: &str) -> (Tenant, String) {
        self.services
            .create_tenant(NewTenant::named("test", Email::parse(owner).expect("a valid email")))
            .await
            .expect("tenant created")
    }

    /// Run every worker until nothing is due now: deliveries, then the dead-letter handler.
    /// Returns how many queue messages were handled.
    pub async fn drain_now(&self) -> usize {
        let mut handled = 0;
        loop {
            self.services.run_scheduler().await.expect("scheduler");
            let tasks = self.queue.take_visible();
            let dead = self.queue.take_dead();
            if tasks.is_empty() && dead.is_empty() {
                return handled;
            }
            handled += tasks.len();
            for r in self.services.deliver_batch(&tasks).await {
                r.expect("delivery handled");
            }
            self.services
                .handle_dead_letters(&dead)
                .await
                .expect("dead letters handled");
        }
    }

    /// As [`Self::run_for`], with each message going through `handle_messages` as a host's
    /// worker hands it over: one sent back (its handler failed) is received again
    /// `visibility` later, its receive count one more. So a handler's error is a message
    /// coming back, not a failed test.
    pub async fn run_as_a_worker_for(&self, total: Duration, step: Duration, visibility: Duration) {
        use crate::services::{Disposition, QueueRole};
        let end = self.clock.now() + total;
        loop {
            loop {
                self.services.run_scheduler().await.expect("scheduler");
                let tasks = self.queue.take_visible();
                let dead = self.queue.take_dead();
                if tasks.is_empty() && dead.is_empty() {
                    break;
                }
                let messages: Vec<QueueMessage> = {
                    let mut receives = lock(&self.receives);
                    tasks
                        .iter()
                        .map(|task| {
                            let count = receives.entry(task.clone()).or_default();
                            *count += 1;
                            QueueMessage {
                                message_id: format!("{}-{}-{}", task.delivery_id, task.round, task.attempt),
                                task: Ok(task.clone()),
                                redriven: false,
                                receive_count: *count,
                            }
                        })
                        .collect()
                };
                let handled = self
                    .services
                    .handle_messages(QueueRole::Delivery, &messages, None)
                    .await;
                for (task, disposition) in tasks.into_iter().zip(handled) {
                    if disposition == Disposition::Redeliver {
                        self.queue.put_back(task, self.clock.now() + visibility);
                    }
                }
                self.services
                    .handle_dead_letters(&dead)
                    .await
                    .expect("dead letters handled");
            }
            if self.clock.now() >= end {
                return;
            }
            self.clock.advance(step);
        }
    }

    /// Advance the clock step by step for `total`, draining after each step.
    pub async fn run_for(&self, total: Duration, step: Duration) {
        let end = self.clock.now() + total;
        self.drain_now().await;
        while self.clock.now() < end {
            self.clock.advance(step);
            self.drain_now().await;
        }
    }
}
