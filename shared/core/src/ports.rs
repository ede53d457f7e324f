//! The ports: what the services need from the outside world, in domain types only.
//! SQLite (`hookwise-local`) and AWS (`hookwise-aws`) implement them; tests use the
//! in-memory ones in `testing`.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::circuit::Circuit;
use crate::error::PortError;
use crate::health::EndpointHealth;
use crate::model::*;
use crate::policy::Seconds;
use crate::stats::StatsCounts;

pub type PortResult<T> = Result<T, PortError>;

/// What `Store::create_event` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    New,
    /// The tenant already had an event with this idempotency key: nothing was written.
    Existing(EventId),
}

/// The state a conditional change expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expected {
    pub status: DeliveryStatus,
    pub round: u32,
    pub attempts: u32,
}

impl Expected {
    pub fn of(d: &Delivery) -> Self {
        Self {
            status: d.status,
            round: d.round,
            attempts: d.attempts,
        }
    }

    pub fn holds_for(&self, d: &Delivery) -> bool {
        *self == Self::of(d)
    }
}

/// A delivery's move to a new state, applied only if it is still as `expected`, together
/// with the record of the attempt that caused it (if any). A stale or duplicate message
/// finds the delivery changed and gets `PortError::ConditionFailed`: it cannot move a
/// delivery backwards or record the same attempt twice.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryChange {
    pub expected: Expected,
    /// The whole new state (same id, tenant, event and subscription).
    pub next: Delivery,
    pub attempt: Option<Attempt>,
}

/// Filters for a tenant's deliveries, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryQuery {
    pub status: Option<DeliveryStatus>,
    pub subscription_id: Option<SubscriptionId>,
    pub limit: u32,
    /// Opaque: the `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryPage {
    pub items: Vec<Delivery>,
    pub next_cursor: Option<String>,
}

/// Durable state: tenants, subscriptions, events, deliveries, attempts, endpoint health.
#[async_trait]
pub trait Store: Send + Sync {
    /// A new tenant and its `api_keys` (hashes: keys are never stored). `ConditionFailed` if
    /// its id or one of its keys is in use.
    async fn create_tenant(&self, tenant: &Tenant) -> PortResult<()>;
    /// The tenant holding the key whose [`crate::auth::hash_api_key`] this is.
    async fn tenant_by_api_key(&self, api_key_hash: &str) -> PortResult<Option<Tenant>>;
    async fn get_tenant(&self, id: &TenantId) -> PortResult<Option<Tenant>>;
    /// Tenants by id, the first `limit` after `after`.
    async fn list_tenants(&self, after: Option<&TenantId>, limit: u32) -> PortResult<Vec<Tenant>>;
    /// Replace a tenant that is still as `read` (its `version`; `tenant.version` is the next),
    /// and its keys with it: a key in `tenant.api_keys` and not in `read.api_keys` is claimed
    /// (`ConditionFailed` if in use), one in `read.api_keys` and not in `tenant.api_keys`
    /// finds no tenant from now on. `ConditionFailed` if the tenant changed since or is gone.
    async fn update_tenant(&self, tenant: &Tenant, read: &Tenant) -> PortResult<()>;
    /// The deployment's settings: its operator keys and its rollout (`Deployment::default()`
    /// until first written).
    async fn deployment(&self) -> PortResult<Deployment>;
    /// Replace the deployment's settings if they are still as `read` (its `version`; 0:
    /// never written); `ConditionFailed` if they changed since.
    async fn put_deployment(&self, next: &Deployment, read: &Deployment) -> PortResult<()>;
    /// A new portal session (`ConditionFailed` if its id is taken).
    async fn create_portal_session(&self, session: &PortalSession) -> PortResult<()>;
    /// A portal session by id, expired or not (the store may drop one a while after
    /// `valid_until`).
    async fn portal_session(&self, id: &PortalSessionId) -> PortResult<Option<PortalSession>>;
    /// Revoke a portal session; whether there was one.
    async fn delete_portal_session(&self, id: &PortalSessionId) -> PortResult<bool>;

    /// Write an event type's definition: a new one when `read_at` is `None`
    /// (`ConditionFailed` if its scope has one of that name), else a change of the copy whose
    /// `updated_at` was `read_at` (`ConditionFailed` if it changed since). The scope is
    /// `def.tenant_id`: a tenant's, or the deployment's.
    async fn put_event_type(&self, def: &EventTypeDefinition, read_at: Option<DateTime<Utc>>) -> PortResult<()>;
    /// The definition named `name` in a scope (`None`: the deployment's).
    async fn event_type(&self, tenant: Option<&TenantId>, name: &EventType) -> PortResult<Option<EventTypeDefinition>>;
    /// A scope's definitions in name order, after `after`, at most `limit` (1 to 100).
    async fn list_event_types(
        &self,
        tenant: Option<&TenantId>,
        after: Option<&EventType>,
        limit: u32,
    ) -> PortResult<Vec<EventTypeDefinition>>;

    /// A new subscription; `ConditionFailed` if one with its id exists.
    async fn create_subscription(&self, sub: &Subscription) -> PortResult<()>;
    /// Replace a subscription that is still as it was read: `read_at` is the `updated_at` of
    /// the copy the change started from (every write moves `updated_at`, so it is the
    /// version). `ConditionFailed` if it changed since or is gone: a racing write is not
    /// reverted, and a deleted subscription stays deleted.
    async fn replace_subscription(&self, sub: &Subscription, read_at: DateTime<Utc>) -> PortResult<()>;
    async fn get_subscription(&self, tenant: &TenantId, id: &SubscriptionId) -> PortResult<Option<Subscription>>;
    /// In id order, which is creation order (ids begin with their creation time): at most
    /// `limit`, those after `after`.
    async fn list_subscriptions(
        &self,
        tenant: &TenantId,
        after: Option<&SubscriptionId>,
        limit: u32,
    ) -> PortResult<Vec<Subscription>>;
    /// `false` if there was none.
    async fn delete_subscription(&self, tenant: &TenantId, id: &SubscriptionId) -> PortResult<bool>;

    /// Store the event and its deliveries so that they are seen together or not at all:
    /// until the call succeeds, no read returns, lists or hands on any of them (a store
    /// without transactions may write deliveries first and keep them unseen until its
    /// event is written). An event whose idempotency key the tenant already used stores
    /// nothing anyone sees. A keyed event's id is
    /// [`EventId::for_key`] of its tenant and key (the services make it so), so a store may
    /// let the id stand for the key.
    async fn create_event(&self, event: &Event, deliveries: &[Delivery]) -> PortResult<Created>;
    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> PortResult<Option<Event>>;
    /// The tenant's events of `ids`, in their order: `None` for one not stored (or another
    /// tenant's). A store that can read many in one request overrides this.
    async fn get_events(&self, tenant: &TenantId, ids: &[EventId]) -> PortResult<Vec<Option<Event>>> {
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            found.push(self.get_event(tenant, id).await?);
        }
        Ok(found)
    }
    async fn event_deliveries(&self, tenant: &TenantId, event: &EventId) -> PortResult<Vec<Delivery>>;

    /// By id alone: the worker reads deliveries named in queue messages.
    async fn get_delivery(&self, id: &DeliveryId) -> PortResult<Option<Delivery>>;
    async fn list_deliveries(&self, tenant: &TenantId, query: &DeliveryQuery) -> PortResult<DeliveryPage>;
    /// See [`DeliveryChange`]: `PortError::ConditionFailed` when the delivery moved on.
    async fn apply_change(&self, change: &DeliveryChange) -> PortResult<()>;
    /// Every attempt of every round, in the order they were made.
    async fn attempts(&self, delivery: &DeliveryId) -> PortResult<Vec<Attempt>>;
    /// Deliveries the sweep looks after ([`Delivery::is_swept`]: a later retry, pending after
    /// a replay, or one whose next attempt was moved) whose next attempt was due before
    /// `due_before`.
    async fn overdue_deliveries(&self, due_before: DateTime<Utc>, limit: u32) -> PortResult<Vec<Delivery>>;
    /// A page of the audit of queued messages: of the deliveries created in `created`, after
    /// `after` (a [`AuditPage::next`] this store handed out; `None`: from the start), those
    /// seen (committed) that wait for a message queued before their state was written
    /// ([`Delivery::awaits_queued_message`]). About `limit` deliveries are looked at per
    /// call, so a page may hold none and still have a next.
    async fn awaiting_queued_message(
        &self,
        created: std::ops::Range<DateTime<Utc>>,
        after: Option<&str>,
        limit: u32,
    ) -> PortResult<AuditPage>;

    /// The rate limiter: the verdict of [`crate::rate_limit::admit`] on an attempt to `sub`'s
    /// endpoint arriving at `now`, two slots `interval` apart, decided on the endpoint's
    /// stored lines, and the lines it returns stored, shared by every worker and process on
    /// the store: no two verdicts name one turn or one slot. (SQLite and memory decide in one
    /// step; DynamoDB in conditional writes, where lines moving between two of them can make
    /// a verdict one a moment later would give.)
    async fn limit_rate(
        &self,
        sub: &SubscriptionId,
        interval: std::time::Duration,
        now: DateTime<Utc>,
        arrival: crate::rate_limit::Arrival,
    ) -> PortResult<crate::rate_limit::Verdict>;

    /// The endpoint's circuit breaker; `None` if none was ever stored (closed).
    async fn circuit(&self, sub: &SubscriptionId) -> PortResult<Option<Circuit>>;
    /// Store `circuit` if the stored one is still `read` (by its version; `None`: none stored).
    /// `ConditionFailed` if another write came first.
    async fn put_circuit(&self, sub: &SubscriptionId, circuit: &Circuit, read: Option<&Circuit>) -> PortResult<()>;

    async fn endpoint_health(&self, sub: &SubscriptionId) -> PortResult<EndpointHealth>;
    /// Written only over the copy `health` was read from (its `version`; 0: none stored), as
    /// the next version: `ConditionFailed` if another save came first (read it again, merge).
    async fn save_endpoint_health(&self, sub: &SubscriptionId, health: &EndpointHealth) -> PortResult<()>;

    /// Add `counts` to the endpoint's stored statistics, each to the bucket starting when it
    /// says ([`crate::stats::bucket_of`]): added, not written over, so counts from processes
    /// side by side all land. Kept for [`crate::stats::STATS_RETENTION`] at least.
    async fn add_endpoint_stats(&self, sub: &SubscriptionId, counts: &[(DateTime<Utc>, StatsCounts)])
        -> PortResult<()>;
    /// The endpoint's buckets starting at or after `from`, oldest first.
    async fn endpoint_stats(
        &self,
        sub: &SubscriptionId,
        from: DateTime<Utc>,
    ) -> PortResult<Vec<(DateTime<Utc>, StatsCounts)>>;

    /// Record a dead round's notice for its owner's next email (`owner` is who is told).
    /// `false` when this round's notice is already recorded, waiting or sent: each dead
    /// round is told once.
    async fn queue_dead_notice(&self, owner: &Email, notice: &DeadNotice) -> PortResult<bool>;
    /// Owners with notices waiting whose last email went out at or before `window_start`
    /// (or never), and whose failed email is not held back past `now`: the ones whose next
    /// email may go now.
    async fn due_digests(&self, now: DateTime<Utc>, window_start: DateTime<Utc>, limit: u32) -> PortResult<Vec<Email>>;
    /// Claim `owner`'s next email at `now`, with every notice waiting for it (oldest death
    /// first). `None` unless notices wait, the last email went out at or before
    /// `window_start`, no failed email holds it back past `now`, and no claim made after
    /// `stale_before` holds it (an older claim was left by a handler that died before it sent
    /// its email).
    async fn claim_digest(
        &self,
        owner: &Email,
        now: DateTime<Utc>,
        window_start: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> PortResult<Option<DigestClaim>>;
    /// The claimed email went out: its notices are sent, and the owner's window starts at
    /// the claim's time. A claim taken over meanwhile changes nothing of the owner's.
    async fn finish_digest(&self, claim: &DigestClaim) -> PortResult<()>;
    /// The claimed email could not be sent: the claim is given back and its notices wait,
    /// the owner neither due nor claimable before `retry_at` (so owners whose emails keep
    /// failing do not hold up the others).
    async fn release_digest(&self, claim: &DigestClaim, retry_at: DateTime<Utc>) -> PortResult<()>;
}

/// A dead delivery's round, told to its owner in their next email.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadNotice {
    pub delivery_id: DeliveryId,
    pub round: u32,
    pub tenant_id: TenantId,
    pub subscription_id: SubscriptionId,
    /// When the delivery died (its `updated_at`): a recover from here replays it.
    pub died_at: DateTime<Utc>,
}

/// An owner's next email, claimed by one handler: what it is to carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestClaim {
    pub owner: Email,
    /// Oldest death first.
    pub notices: Vec<DeadNotice>,
    /// The claim's time: it names the claim, and becomes the owner's last email's.
    pub claimed_at: DateTime<Utc>,
    /// How many notices the owner's record had counted when claimed, for a backend that
    /// checks none came since (DynamoDB); 0 elsewhere.
    pub counted: u64,
}

impl DigestClaim {
    /// The claim, its notices put oldest death first.
    pub fn new(owner: Email, mut notices: Vec<DeadNotice>, claimed_at: DateTime<Utc>, counted: u64) -> Self {
        notices.sort_by(|a, b| (a.died_at, &a.delivery_id).cmp(&(b.died_at, &b.delivery_id)));
        Self {
            owner,
            notices,
            claimed_at,
            counted,
        }
    }
}

/// One message on the delivery queue: make this attempt of this delivery.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeliveryTask {
    pub delivery_id: DeliveryId,
    pub round: u32,
    pub attempt: u32,
    /// Set on a message queued before the state it is for is written (a first attempt's,
    /// before its delivery is stored; a retry's, before its attempt's write): when it was
    /// first queued, so a worker that does not find that state yet knows how long it has
    /// been looking (see `Services::look_again_later`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_at: Option<DateTime<Utc>>,
    /// Set on an attempt the endpoint's rate limit deferred: the slot the limiter reserved for
    /// it. Its worker waits for the slot and sends, without reserving another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<DateTime<Utc>>,
    /// The delivery's tenant: the group its queue is fair by (one tenant's backlog does not
    /// hold up another's). A message an older build queued has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<TenantId>,
    /// Set on an attempt its endpoint's open circuit breaker held: when it gives up if still
    /// held (where its retry schedule would have ended). Kept through a release; once reached,
    /// kept by the delivery ([`Delivery::held_until`]) and so by every message after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until: Option<DateTime<Utc>>,
    /// How many times the dead-letter handler has put this attempt back on its schedule after
    /// the queue gave up on its message (see `Services::handle_dead_letters`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub redrives: u32,
}

impl DeliveryTask {
    /// What this attempt, made at `at`, passes on to its delivery's `held_until`: its own if
    /// it was made at its give-up time or later (its retries are never held again), none if
    /// it was released (or probed) before then (held again, its retries give up on the rest
    /// of their schedule).
    pub fn held_until_after(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.held_until.filter(|until| at >= *until)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The delivery queue and its dead-letter queue.
#[async_trait]
pub trait DeliveryQueue: Send + Sync {
    /// The longest delay a message may carry (SQS: 900 s); later retries go through the
    /// scheduler table.
    fn max_delay_seconds(&self) -> u32;
    /// Each task with its delay in seconds, at most `max_delay_seconds`.
    async fn enqueue(&self, tasks: &[(DeliveryTask, u32)]) -> PortResult<()>;
    /// Hand dead deliveries to the dead-letter handler.
    async fn dead_letter(&self, tasks: &[DeliveryTask]) -> PortResult<()>;
}

/// A store that holds the delivery queue too (the embedded one): it writes each event with
/// its first attempts' messages in one transaction, and a batch's events in one call, so an
/// ingest waits for one commit instead of two per event and leaves no message behind for an
/// event it did not store.
#[async_trait]
pub trait StoreWithQueue: Send + Sync {
    /// For each write, [`Store::create_event`] and, when the event is new,
    /// [`DeliveryQueue::enqueue`] of its tasks: all or nothing per event (one that fails
    /// undoes only its own writes). One result per write, in order.
    async fn create_events_queued(&self, writes: &[EventWrite<'_>]) -> Vec<PortResult<Created>>;
}

/// An event to store with its deliveries, and the messages of their first attempts.
#[derive(Debug, Clone, Copy)]
pub struct EventWrite<'a> {
    pub event: &'a Event,
    pub deliveries: &'a [Delivery],
    pub tasks: &'a [(DeliveryTask, u32)],
}

/// One message taken from a queue, as every queue hands it over: the backend's id (for
/// logs and for Lambda's batch response), the task it carries or why it does not decode, and
/// whether the queue's own redrive moved it here after too many receives.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueMessage {
    pub message_id: String,
    pub task: Result<DeliveryTask, String>,
    /// SQS marks a message it moved to the dead-letter queue (`DeadLetterQueueSourceArn`).
    pub redriven: bool,
    /// How many times the queue has handed the message out, this time included (SQS's
    /// `ApproximateReceiveCount`). Above 1, an earlier receiver did not finish with it.
    pub receive_count: u32,
}

/// A message received from a [`QueueConsumer`], with the receipt that acknowledges it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received<R> {
    pub receipt: R,
    pub message: QueueMessage,
}

/// The receiving end of a queue (the delivery queue or its dead-letter queue): what a
/// long-running worker drains. SQS and the SQLite queue implement it; on Lambda the event
/// source mapping does this part and hands the function the messages.
#[async_trait]
pub trait QueueConsumer: Send + Sync {
    type Receipt: Clone + Send + Sync;
    /// Up to `max` messages, each hidden from other consumers for the queue's visibility
    /// timeout; waits up to `wait` for the first one to arrive.
    async fn receive(&self, max: usize, wait: Duration) -> PortResult<Vec<Received<Self::Receipt>>>;
    /// Done with these: delete them. A receipt that is stale (the message came back and was
    /// received again) deletes nothing.
    async fn ack(&self, receipts: &[Self::Receipt]) -> PortResult<()>;
    /// Keep these hidden for `hidden_for` from now: to return them for redelivery later, or
    /// to extend a message still being worked on past its visibility timeout. The receive
    /// count is unchanged.
    async fn change_visibility(&self, receipts: &[Self::Receipt], hidden_for: Duration) -> PortResult<()>;
    /// How long a received message stays hidden unless told otherwise.
    fn visibility_timeout(&self) -> Duration;
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScheduledTask {
    pub task: DeliveryTask,
    pub due: DateTime<Utc>,
}

/// An endpoint listed by [`SchedulerTable::holding`]: its subscription, and whose it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holding {
    pub subscription_id: SubscriptionId,
    pub tenant_id: TenantId,
}

/// A page of [`Store::awaiting_queued_message`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditPage {
    pub deliveries: Vec<Delivery>,
    /// Where the next page starts (opaque, the store's own); `None`: the range is done.
    pub next: Option<String>,
}

/// How far the audit of queued messages has got: every delivery created before `from` is
/// audited; the range `from..to` is being audited, up to `after` (an [`AuditPage::next`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPosition {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub after: Option<String>,
}

/// What [`SchedulerTable::due_page`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DuePage {
    /// The items due, earliest first.
    pub tasks: Vec<ScheduledTask>,
    /// Items among them that could not be read, set aside ([`SchedulerTable::set_aside`]).
    pub set_aside: usize,
}

/// An item of the scheduler table that could not be read as a task, moved out of the way
/// of the tasks due with it ([`SchedulerTable::due_page`]) and kept for an operator
/// (`hookwise scheduler set-aside`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAsideItem {
    /// Where it was, in the backend's own terms (DynamoDB: its partition and sort key;
    /// SQLite: its row's key); the listing's order and its `after`.
    pub key: String,
    /// When it was set aside.
    pub set_aside_at: DateTime<Utc>,
    /// Why it could not be read.
    pub error: String,
    /// What it held, as stored (DynamoDB: its attributes as DynamoDB JSON; SQLite: the
    /// row's document).
    pub raw: String,
}

/// Retries due later than the queue can delay, kept until they are near.
#[async_trait]
pub trait SchedulerTable: Send + Sync {
    async fn schedule(&self, item: &ScheduledTask) -> PortResult<()>;
    /// Items due at or before `until`, earliest first, at most `limit`. An item found there
    /// that cannot be read as a task is set aside (listed by [`Self::set_aside`], stamped
    /// `now`, gone from where it was) and counted, and the rest is returned: one bad item
    /// never stops the others.
    async fn due_page(&self, now: DateTime<Utc>, until: DateTime<Utc>, limit: u32) -> PortResult<DuePage>;
    /// The tasks of [`Self::due_page`], what it sets aside stamped `until` (for tests and
    /// tools; the scheduler counts what is set aside, at its clock's time).
    async fn due(&self, until: DateTime<Utc>, limit: u32) -> PortResult<Vec<ScheduledTask>> {
        Ok(self.due_page(until, until, limit).await?.tasks)
    }
    async fn remove(&self, items: &[ScheduledTask]) -> PortResult<()>;
    /// The items [`Self::due_page`] set aside, by key: at most `limit`, those after `after`.
    async fn set_aside(&self, after: Option<&str>, limit: u32) -> PortResult<Vec<SetAsideItem>>;

    /// Park an attempt held by `sub`'s open circuit breaker until it is released, and
    /// schedule it at `item.due` (when it gives up if still held). The same attempt (delivery,
    /// round, attempt) held twice is held once, at the later call's `due`. From then `sub` (of `tenant`) is listed by [`Self::holding`] until
    /// [`Self::stop_holding`], so the scheduler tends every endpoint that holds anything.
    async fn hold(&self, tenant: &TenantId, sub: &SubscriptionId, item: &ScheduledTask) -> PortResult<()>;
    /// Up to `limit` of `sub`'s held attempts, by attempt: the oldest delivery first.
    async fn held(&self, sub: &SubscriptionId, limit: u32) -> PortResult<Vec<ScheduledTask>>;
    /// No longer held (their scheduled copies stay, and find them moved on when due).
    async fn release(&self, sub: &SubscriptionId, items: &[ScheduledTask]) -> PortResult<()>;
    /// The endpoints listed since they held an attempt ([`Self::hold`]), by subscription id:
    /// at most `limit`, those after `after`.
    async fn holding(&self, after: Option<&SubscriptionId>, limit: u32) -> PortResult<Vec<Holding>>;
    /// `sub` is no longer listed by [`Self::holding`] (until its next `hold`).
    async fn stop_holding(&self, sub: &SubscriptionId) -> PortResult<()>;

    /// Take the scheduler's lease for `holder` until `until`, unless someone else holds it
    /// past `now`; `false` if they do. A lease that expired is anyone's, so a tick that died
    /// holding it stops nobody for longer than its lease. One tick at a time runs on it.
    async fn take_lease(&self, holder: &str, now: DateTime<Utc>, until: DateTime<Utc>) -> PortResult<bool>;
    /// Give the lease back at `now`, if `holder` still holds it (else nothing changes).
    async fn end_lease(&self, holder: &str, now: DateTime<Utc>) -> PortResult<()>;

    /// Where the audit of queued messages has got to; `None` before its first tick.
    async fn audit_position(&self) -> PortResult<Option<AuditPosition>>;
    /// Store it (only the tick holding the lease writes it).
    async fn save_audit_position(&self, position: &AuditPosition) -> PortResult<()>;

    /// The last endpoint the scheduler tended ([`Self::holding`]'s order), so the next tick
    /// goes on after it; `None`: from the first.
    async fn tend_position(&self) -> PortResult<Option<SubscriptionId>>;
    /// Store it (only the tick holding the lease writes it).
    async fn save_tend_position(&self, after: Option<&SubscriptionId>) -> PortResult<()>;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutgoingEmail {
    pub to: Email,
    pub subject: String,
    pub text: String,
}

#[async_trait]
pub trait Mailer: Send + Sync {
    async fn send(&self, email: &OutgoingEmail) -> PortResult<()>;
}

/// Whose a sealed value is: a subscription's signing secret, or (with `header`) the value of
/// one of its custom headers marked sensitive. The keeper binds the envelope to it (KMS's
/// encryption context, AES-GCM's associated data): sealed for one subscription, or one header
/// of it, it opens for no other, nor as the signing secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretContext {
    pub tenant: TenantId,
    pub subscription: SubscriptionId,
    /// The lowercase name of the header whose value is sealed; `None` for the signing secret.
    pub header: Option<String>,
}

impl SecretContext {
    /// The context of the signing secret of `tenant`'s subscription `subscription` (one not
    /// made yet, say).
    pub fn new(tenant: &TenantId, subscription: &SubscriptionId) -> Self {
        Self {
            tenant: tenant.clone(),
            subscription: subscription.clone(),
            header: None,
        }
    }

    /// The context of `sub`'s signing secret.
    pub fn of(sub: &Subscription) -> Self {
        Self::new(&sub.tenant_id, &sub.id)
    }

    /// The context of the value of `sub`'s header `name` (any case: header names are not
    /// case-sensitive, and the context holds it lowercase).
    pub fn for_header(sub: &Subscription, name: &str) -> Self {
        Self::of(sub).with_header(name)
    }

    /// This subscription's context for the value of its header `name` (any case, held
    /// lowercase).
    pub fn with_header(self, name: &str) -> Self {
        Self {
            header: Some(name.to_ascii_lowercase()),
            ..self
        }
    }

    /// The context as names and values, in this order: `tenant`, `subscription`, then
    /// `header` if it is a header's. (A signing secret's are what they were before headers
    /// had values sealed: envelopes sealed then still open.)
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        let mut pairs = vec![
            ("tenant", self.tenant.as_str()),
            ("subscription", self.subscription.as_str()),
        ];
        if let Some(header) = &self.header {
            pairs.push(("header", header.as_str()));
        }
        pairs
    }
}

/// Keeps signing secrets, and header values marked sensitive, sealed at rest: KMS on AWS, a
/// key file in the data dir locally. Only sending opens one; the API shows a secret only
/// when it makes it.
#[async_trait]
pub trait SecretKeeper: Send + Sync {
    /// `text` sealed under `context`, as an envelope that names its scheme. `text` is not
    /// empty and at most 4096 bytes (KMS seals no more).
    async fn seal_text(&self, text: &str, context: &SecretContext) -> PortResult<SealedSecret>;
    /// The text in an envelope this keeper sealed under `context`. `Permanent` only if this
    /// envelope will never open (sealed under another context or key, or damaged): deliveries
    /// then die rather than retry. A key it cannot use now (disabled, access denied, its
    /// service down) is `Retryable`, however long that lasts: an operator fixes that.
    async fn open_text(&self, sealed: &SealedSecret, context: &SecretContext) -> PortResult<String>;

    /// `secret` sealed under `context` (see [`seal_text`](Self::seal_text)).
    async fn seal(&self, secret: &Secret, context: &SecretContext) -> PortResult<SealedSecret> {
        self.seal_text(secret.as_str(), context).await
    }
    /// The secret in an envelope this keeper sealed under `context`: as
    /// [`open_text`](Self::open_text), and `Permanent` if what it holds is no signing secret.
    async fn open(&self, sealed: &SealedSecret, context: &SecretContext) -> PortResult<Secret> {
        let text = self.open_text(sealed, context).await?;
        Secret::parse(&text).map_err(|_| PortError::permanent("open secret", "it holds no signing secret"))
    }
}

/// One signed POST, ready to go.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookRequest {
    pub url: EndpointUrl,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

/// Why an attempt got no HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SendErrorKind {
    Timeout,
    Connect,
    /// The SSRF guard refused the resolved address.
    Blocked,
    Other,
}

impl SendErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Connect => "connect",
            Self::Blocked => "blocked",
            Self::Other => "error",
        }
    }
}

/// What happened to one POST.
#[derive(Debug, Clone, PartialEq)]
pub struct SendOutcome {
    pub status_code: Option<u16>,
    pub error: Option<(SendErrorKind, String)>,
    /// At most [`crate::model::EXCERPT_LIMIT`] bytes of the response body.
    pub response_excerpt: Option<String>,
    pub duration_ms: u64,
    /// `Retry-After` in seconds, when a 429 or 503 carried one.
    pub retry_after: Option<Seconds>,
}

impl SendOutcome {
    pub fn is_success(&self) -> bool {
        self.status_code.is_some_and(|s| (200..300).contains(&s))
    }

    /// The error as it is recorded: `timeout: ...`, or `HTTP 503`.
    pub fn describe(&self) -> String {
        match (&self.error, self.status_code) {
            (Some((kind, msg)), _) => format!("{}: {}", kind.as_str(), msg),
            (None, Some(code)) => format!("HTTP {code}"),
            (None, None) => "no response".into(),
        }
    }
}

/// POSTs webhooks. Never fails as a call: every failure is an outcome to record.
#[async_trait]
pub trait Sender: Send + Sync {
    async fn send(&self, request: WebhookRequest) -> SendOutcome;
}

/// The sender of a host that never POSTs (the API, the scheduler, the dead-letter handler):
/// every call is an error outcome, so a wiring mistake shows up as a recorded failure.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSender;

#[async_trait]
impl Sender for NoSender {
    async fn send(&self, _request: WebhookRequest) -> SendOutcome {
        SendOutcome {
            status_code: None,
            error: Some((SendErrorKind::Other, "this host does not send webhooks".into())),
            response_excerpt: None,
            duration_ms: 0,
            retry_after: None,
        }
    }
}

#[async_trait]
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
    /// Wait until `at` (an attempt's rate-limit slot); at once if it has passed.
    async fn sleep_until(&self, at: DateTime<Utc>);
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
    async fn sleep_until(&self, at: DateTime<Utc>) {
        if let Ok(wait) = (at - Utc::now()).to_std() {
            tokio::time::sleep(wait).await;
        }
    }
}
