//! The services: what Hookwise does, written once against the ports and run by every host
//! (the Lambda functions, `hookwise dev`, the tests).

mod breaker;
mod catalogue;
mod consume;
mod dead_letter;
mod deliver;
mod events;
mod lookups;
mod notices;
mod operational;
mod portal;
mod replay;
mod scheduler;
mod secrets;
mod stats;
mod subscriptions;
mod tenants;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;

use crate::metrics::{NoMetrics, Recorder};
use crate::policy::RetryPolicy;

use crate::ports::{Clock, DeliveryQueue, Mailer, SchedulerTable, SecretKeeper, Sender, Store, StoreWithQueue};

pub use breaker::CIRCUIT_TTL;
pub use catalogue::{Catalogue, EventTypePatch, NewEventType};
pub use consume::{Disposition, QueueRole};
pub use dead_letter::DeadLetterReport;
pub use deliver::{DeliverOutcome, DISABLE_NOTICE_CLAIM, EARLY_COPY_LAG, EARLY_SKEW, WRITE_WINDOW};
pub use events::{EventWithDeliveries, Ingested, NewEvent, MAX_BATCH, MAX_PAYLOAD_BYTES, PING};
pub use lookups::HEALTH_SAVE_EVERY;
pub use notices::DIGEST_LISTED;
pub use operational::{
    builtin_event_type, builtin_event_types, is_operational, BREAKER_CLOSED, BREAKER_OPENED, DELIVERY_DEAD,
    ENDPOINT_DISABLED, ENDPOINT_RECOVERED,
};
pub use portal::{PORTAL_SESSION_DEFAULT, PORTAL_SESSION_MAX};
pub use scheduler::SchedulerReport;
pub use secrets::SealReport;
pub use subscriptions::{
    check_retention, NewSubscription, SubscriptionOverview, SubscriptionPage, SubscriptionPatch, SubscriptionWithSecret,
};
pub use tenants::{Caller, KeyRef, NewTenant, TenantPatch};

/// The adapters the services run on.
#[derive(Clone)]
pub struct Ports {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn DeliveryQueue>,
    /// The store and the queue as one, where one backend holds both: ingest then writes each
    /// event with its messages at once instead of queueing first (see `ingest_batch`).
    pub store_with_queue: Option<Arc<dyn StoreWithQueue>>,
    pub scheduler: Arc<dyn SchedulerTable>,
    pub mailer: Arc<dyn Mailer>,
    /// Seals the signing secrets the store keeps, opens them to sign.
    pub secrets: Arc<dyn SecretKeeper>,
    pub sender: Arc<dyn Sender>,
    pub clock: Arc<dyn Clock>,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The scheduler moves retries due within this window onto the queue (15 minutes,
    /// SQS's delay limit).
    pub scheduler_horizon: Duration,
    /// A pending or retrying delivery this long overdue is re-queued by the sweep.
    pub sweep_grace: Duration,
    /// How long the sweep gives a message it re-queued before it looks at that delivery
    /// again: long enough for the queue to have handled it or given up on it (SQS: the
    /// visibility timeout, 6 minutes, times 5 receives), so a backlog older than the grace
    /// is not answered with a duplicate message every tick.
    pub requeue_wait: Duration,
    /// A delivery still waiting this long after its creation for a message queued before
    /// its state was written (its first attempt's, or an early retry's:
    /// [`crate::model::Delivery::awaits_queued_message`]) is taken for lost (the queue dropped
    /// it past its retention, or in a purge), and the scheduler's audit queues it again.
    /// Longer than the backlogs the queue is expected to hold: in a longer one each such
    /// delivery gets one more message, which its conditional writes absorb (and from then
    /// the sweep looks after it). Well past `Delivery::QUEUED_RETRY_HORIZON`, so an early
    /// retry is overdue when the audit looks.
    pub queued_message_audit_age: Duration,
    /// How long one scheduler tick may go on moving retries and sweeping, page after page
    /// (the Scheduler function has 60 s).
    pub scheduler_budget: Duration,
    /// How long a tick holds the scheduler's lease (one tick at a time): longer than a tick
    /// can run (the Scheduler function's 60 s timeout), so a live tick never loses it, and a
    /// tick that died holds up the next ones no longer than this.
    pub scheduler_lease: Duration,
    /// Who holds that lease: a fixed name lets a process that died holding it take it back
    /// at once when it starts again (`hookwise dev`, one name per machine); none, a fresh name
    /// per tick (the Scheduler function, whose invocations are strangers).
    pub scheduler_holder: Option<String>,
    /// Deliveries handled at once in a batch.
    pub deliver_concurrency: usize,
    /// What a delivery keeps back from its host's deadline (a Lambda invocation's) for the
    /// store writes after its POST: the POST's timeout is cut to what is left after it.
    pub deadline_margin: Duration,
    /// An owner gets at most one email per window: the deliveries that die after one email
    /// wait for the window to pass, then go out together in one digest.
    pub digest_window: Duration,
    /// An owner's email claimed this long ago and never sent is claimed again: its handler
    /// died between claiming it and sending it. Longer than sending an email takes.
    pub notice_claim_timeout: Duration,
    /// How long a warm process keeps the tenants and subscriptions it looked up
    /// (`lookups`): what another process changes is seen within this.
    pub lookup_ttl: Duration,
    /// Where the API is reached, for the replay instructions in emails.
    pub public_api_url: String,
    /// The policy of a subscription created without one.
    pub default_retry_policy: RetryPolicy,
    /// How long the store keeps events, deliveries and attempts (DynamoDB's TTL); `None`
    /// keeps them. A policy that can retry for longer is refused: retention must never
    /// delete a delivery, or its event, while it is still retrying.
    pub retention: Option<Duration>,
    /// Whether a tenant may read an endpoint's signing secret again after it was made
    /// ([`Services::reveal_secret`]). Off, a secret is shown only when it is made (create,
    /// rotate). On AWS the stack's `RevealSecrets` parameter turns it on together with the
    /// key policy that lets the Ingest function decrypt.
    pub reveal_secrets: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            scheduler_horizon: Duration::from_secs(15 * 60),
            sweep_grace: Duration::from_secs(5 * 60),
            requeue_wait: Duration::from_secs(30 * 60),
            queued_message_audit_age: Duration::from_secs(60 * 60),
            scheduler_budget: Duration::from_secs(40),
            scheduler_lease: Duration::from_secs(90),
            scheduler_holder: None,
            deliver_concurrency: 32,
            deadline_margin: DEADLINE_MARGIN,
            digest_window: Duration::from_secs(5 * 60),
            notice_claim_timeout: Duration::from_secs(60),
            lookup_ttl: Duration::from_secs(30),
            public_api_url: "http://127.0.0.1:8080".into(),
            default_retry_policy: RetryPolicy::standard(),
            retention: None,
            reveal_secrets: false,
        }
    }
}

/// What follows a POST, each store call bounded by the AWS SDK's operation timeout (5 s,
/// `hookwise-aws`): the attempt with the state change, endpoint health and its statistics,
/// the retry's enqueue, and at times an operational webhook told (a few calls more).
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(20);
/// The time a Lambda batch must have left to write its statistics at its end.
pub const STATS_SPARE_TIME: Duration = Duration::from_secs(5);
/// A POST given less time than this is not started: its message goes back, unattempted.
pub const SHORTEST_POST: Duration = Duration::from_secs(1);

pub struct Services {
    ports: Ports,
    config: Config,
    lookups: lookups::Lookups,
    metrics: Arc<dyn Recorder>,
    // Held only between awaits, never across one.
    rng: Mutex<StdRng>,
}

impl Services {
    /// `rng` seeds ids, secrets, API keys and jitter: from the OS in production, fixed in tests.
    pub fn new(ports: Ports, config: Config, rng: StdRng) -> Self {
        Self {
            ports,
            config,
            lookups: lookups::Lookups::new(),
            metrics: Arc::new(NoMetrics),
            rng: Mutex::new(rng),
        }
    }

    /// Whether [`Services::reveal_secret`] shows a secret again (the deployment's choice).
    pub fn reveals_secrets(&self) -> bool {
        self.config.reveal_secrets
    }

    /// Record the services' metrics ([`crate::metrics`]) into `recorder`.
    pub fn with_metrics(mut self, recorder: Arc<dyn Recorder>) -> Self {
        self.metrics = recorder;
        self
    }

    /// Publish the metrics recorded since the last flush (a host calls it at the end of each
    /// unit of work: a Lambda invocation).
    pub fn flush_metrics(&self) {
        self.metrics.flush();
    }

    pub fn ports(&self) -> &Ports {
        &self.ports
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    fn rng(&self) -> MutexGuard<'_, StdRng> {
        self.rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.ports.clock.now()
    }
}
