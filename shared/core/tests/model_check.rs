//! The model checker: every interleaving, to a bound, of what can happen to three deliveries to
//! one endpoint with a circuit breaker: messages handed out in any order (a delay is another
//! message going first), twice, before their time, or back after a handler that failed; the
//! scheduler's ticks; time moving; a failed step (a delivery's write, the breaker's, a queue
//! send, a dead-letter hand-off: the handler stops there and its message comes back); a
//! delivery's write whose answer is lost; the process dying after any of its next one to three
//! writes, POSTs or emails (between any two of a step's, as a crash or a Lambda timing out
//! mid-batch leaves it: between a POST and its record, an email and its own; what it did
//! stays, and it starts again with nothing kept); the endpoint going down and up; the owner
//! turning the breaker off, deleting the subscription, or replaying a dead delivery.
//!
//! The search is stateless, with replay: a path is a list of choices, and each path runs from
//! a fresh world (the real services on the in-memory ports, a manual clock, seeded ids), so
//! what is checked is the services as they are, not a model of them. States are told apart by
//! a fingerprint of what decides what happens next (the stored deliveries, attempts and
//! breaker, the queues, the scheduler table, the clock, the endpoint, the faults left), and
//! each state is expanded once. From every state, a fair run to the end (no faults, every
//! message handled and time moving), once with the endpoint up and once with it down, must
//! settle, and then:
//!
//! - every delivery is delivered or dead; its owner told of its last round's death, and of
//!   no round twice (a round replayed before its notice was recorded needs none; a process
//!   that died between an email and its record may send it once more);
//! - the endpoint's breaker is closed (or off), and holds nothing; and no attempt stayed held
//!   longer than [`HELD_AT_MOST`] once the endpoint was up, or once its message came back from
//!   a handler that died (a probe or a release is always on its way: within the probe
//!   interval, `PROBE_GRACE` and a page's claim);
//! - no delivery whose event the endpoint answered with a 2xx is dead (unless the process
//!   died right after that POST, before its record: then a later attempt decides), and none
//!   is dead with fewer attempts than its schedule gives it (unless given up for its deleted
//!   subscription), and none had a retry sooner after the attempt before it than its schedule
//!   says;
//! - no delivery has had more POSTs than its recorded attempts and one for each duplicated
//!   or early message or failed step the path holds, in any state along the way.
//!
//! The same world is checked a second time with the subscription rate-limited ([`LIMITED`]: one
//! POST a second, the breaker still on), so that the limiter is in every step too. There the
//! services wait for an attempt's turn as a worker does (the model moves time on to it, where
//! the manual clock jumps), and the queue may also hand out its visible messages as one batch,
//! handled side by side as a Lambda's batch is: the second waits for its turn while the third
//! finds the send line's next turn beyond `rate_limit::SLOT_WAIT`, and goes back on the queue
//! with a slot of the backlog (so does the fair run). Its states are told apart by the
//! limiter's lines and the last second's POSTs too. Besides all of the above, in every state
//! along every path and after the fair run to the end:
//!
//! - the endpoint never has more POSTs (every one: first attempts, retries, probes, releases,
//!   give-ups, to an endpoint up or down) than its rate limit allows: each comes `k` intervals
//!   (a second over the rate) after the `k`-th before it, less at most the limiter's
//!   [`TOLERANCE`] (a turn may be taken that much after it came, the next keeping its place);
//!   so no window of a second less that holds more than `rate` POSTs (see `check_rate`);
//! - no attempt that waits for a slot it holds (a message carrying its slot, for the attempt
//!   its delivery is due to make) is queued again meanwhile: there is no other message for it
//!   (on the queue, in the scheduler table, parked by the breaker or on the dead-letter queue),
//!   but one for each duplicated message or failed step the path holds.
//!
//! `HOOKWISE_MODEL_DEPTH` sets the bound of both (default [`BREAKER`]'s and [`LIMITED`]'s
//! depths); the figures are printed.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;

use chrono::{DateTime, Duration, Utc};
use hookwise_core::circuit::{CircuitBreaker, CircuitState};
use hookwise_core::model::*;
use hookwise_core::policy::{Jitter, RetryPolicy};
use hookwise_core::ports::{Clock, DeliveryQuery, DeliveryTask, QueueMessage, Store};
use hookwise_core::rate_limit::{Lines, BACKLOG_GONE, TOLERANCE};
use hookwise_core::services::{Disposition, NewEvent, NewSubscription, Ports, QueueRole, Services};
use hookwise_core::testing::memory::{status_outcome, CrashPoint, Harness, ManualClock, ScriptedSender, SteppedClock};

/// Events ingested, one delivery each: three, so that an open breaker holds one while a
/// second waits to be its probe.
const EVENTS: usize = 3;
/// One configuration of the world, and its bound.
#[derive(Clone, Copy, Debug)]
struct Setup {
    name: &'static str,
    /// The subscription's `rate_limit_per_second`.
    rate_limit: Option<u32>,
    /// Choices along a path, by default.
    depth: usize,
}

/// Three deliveries to an endpoint with a circuit breaker, no rate limit.
const BREAKER: Setup = Setup {
    name: "breaker",
    rate_limit: None,
    depth: 6,
};

/// The same, the endpoint limited to one POST a second. One, not two: three attempts of one
/// batch take the send line's turns 0, 1 and 2 s at one a second, and the third's, 2 s ahead,
/// is beyond `rate_limit::SLOT_WAIT` (1 s), so it is deferred to the backlog; at two a second
/// the three turns (0, 0.5 and 1 s) are all within it, and nothing would be. (One attempt at a
/// time, as `Receive` hands them out, never is: each waits for its turn, a second at most, and
/// the next finds the line's next turn a second ahead at most.)
const LIMITED: Setup = Setup {
    name: "rate-limited",
    rate_limit: Some(1),
    depth: 5,
};
/// The longest an attempt may stay held once the endpoint is up: the probe interval (3 s),
/// `PROBE_GRACE` (10 s), a release page's claim (60 s) and the fair run's tick (5 s), with
/// room. The schedule's span (330 s) is longer, so an attempt left held till it gives up
/// shows.
const HELD_AT_MOST: i64 = 90;
/// The schedule's delays, without jitter: the first attempt and two retries.
const SCHEDULE: [u64; 2] = [30, 300];
const ATTEMPTS: usize = SCHEDULE.len() + 1;
/// How long a message a handler did not finish stays hidden (the Deliver queue's).
const VISIBILITY: i64 = 180;
/// Receives before the queue moves a message to the dead-letter queue.
const MAX_RECEIVES: u32 = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Fault {
    DeliveryWrite,
    /// A delivery's write lands, but its answer is lost (the caller sees a timeout).
    DeliveryAnswer,
    CircuitWrite,
    Enqueue,
    DeadLetterSend,
}

/// The faults a path may take (one each path), besides a crash.
const FAULTS: [Fault; 5] = [
    Fault::DeliveryWrite,
    Fault::DeliveryAnswer,
    Fault::CircuitWrite,
    Fault::Enqueue,
    Fault::DeadLetterSend,
];
/// A crash comes after one to this many more writes, POSTs or emails.
const CRASH_AFTER_AT_MOST: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// The queue hands out its n-th visible message (in the order queued).
    Receive(usize),
    /// ... and will hand it out again (SQS delivers at least once).
    Duplicate(usize),
    /// The queue hands out the delayed message due soonest, before its time: a copy sent
    /// again at once, or an operator's redrive of the dead-letter queue. (Shares the
    /// duplicates' budget: one of the two a path.)
    Early,
    /// (Rate-limited world only.) The queue hands out its visible messages (up to three, in
    /// the order queued) as one batch, handled side by side.
    Together,
    /// The dead-letter handler takes its queue.
    DeadLetters,
    /// The scheduler's tick.
    Tick,
    /// Time moves to the next thing due.
    Wait,
    /// The next such step fails.
    Fail(Fault),
    /// The process dies after this many more writes (of the store, the queues, the
    /// scheduler table), POSTs or emails: the step it dies in stops there, and its message
    /// comes back. A Lambda timing out mid-batch dies the same way.
    Crash(u32),
    /// The endpoint goes down (false) or comes up (true).
    Endpoint(bool),
    /// PATCH {"circuit_breaker":{"enabled":false}}.
    BreakerOff,
    Delete,
    /// Replay the first dead delivery.
    Replay,
}

/// What a path may still do: each fault kind and operator action costs one.
#[derive(Clone, Copy, Debug, Default, Hash)]
struct Spent {
    faults: u8,
    crashes: u8,
    duplicates: u8,
    toggles: u8,
    owner: u8,
    replays: u8,
}

struct World {
    setup: Setup,
    h: Harness,
    /// What the services read and wait on, in the rate-limited world (else the manual clock).
    waits: Option<Arc<SteppedClock>>,
    /// When each POST reached the endpoint, in the order sent.
    posted_at: Arc<Mutex<Vec<DateTime<Utc>>>>,
    up: Arc<AtomicBool>,
    /// Events whose POST the endpoint answered with a 2xx.
    answered: Arc<std::sync::Mutex<HashSet<String>>>,
    /// ... of which the process died right after the POST, before recording it.
    died_after: Arc<std::sync::Mutex<HashSet<String>>>,
    tenant: Tenant,
    sub: SubscriptionId,
    receives: HashMap<DeliveryTask, u32>,
    /// When each delivery's message last comes back after a handler that failed or died (its
    /// visibility timeout): a delivery is let go within the bound of that, not of the
    /// endpoint coming up, whatever holds it.
    back_at: HashMap<DeliveryId, DateTime<Utc>>,
    spent: Spent,
    /// Whether an early message on this path was for the attempt its delivery waited for,
    /// before that attempt's time: what the early check exists for.
    came_early: bool,
}

impl World {
    async fn new(setup: Setup) -> Self {
        let up = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let died_after = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let posted_at = Arc::new(Mutex::new(Vec::new()));
        let crash: Arc<std::sync::OnceLock<Arc<CrashPoint>>> = Arc::default();
        let clock: Arc<OnceLock<Arc<ManualClock>>> = Arc::default();
        let (flag, seen, died, point) = (up.clone(), answered.clone(), died_after.clone(), crash.clone());
        let (posted, time) = (posted_at.clone(), clock.clone());
        let mut h = Harness::new(ScriptedSender::with_requests(move |request, _| {
            // Every POST that goes out (a process that died sends none), at the harness's
            // clock: the time the services read, to the millisecond.
            posted.lock().unwrap().extend(time.get().map(|c| c.now()));
            if !flag.load(Ordering::SeqCst) {
                return status_outcome(503);
            }
            let id = request.headers.iter().find(|(k, _)| k == "webhook-id");
            seen.lock().unwrap().extend(id.map(|(_, v)| v.clone()));
            // The process died with this POST, before its record: the 2xx may be lost.
            if point.get().is_some_and(|c| c.crashed()) {
                died.lock().unwrap().extend(id.map(|(_, v)| v.clone()));
            }
            status_outcome(200)
        }));
        assert!(crash.set(h.crash.clone()).is_ok());
        assert!(clock.set(h.clock.clone()).is_ok());
        // Rate-limited, the services wait for an attempt's turn as a worker does, so that
        // handlers side by side interleave: the same services on the same ports (and the
        // harness's seed), but for the clock they wait on.
        let waits = setup.rate_limit.map(|_| {
            // `sleep_until` waits (as a worker waits for its turn) until the model moves time
            // on (`drive`), where the manual clock jumps at once: two handlers of one batch
            // interleave, one waiting for its turn while the other takes the next.
            let waits = Arc::new(SteppedClock::new(h.clock.clone()));
            let ports = Ports {
                clock: waits.clone(),
                ..h.services.ports().clone()
            };
            let rng = rand::SeedableRng::seed_from_u64(42);
            h.services = Services::new(ports, h.services.config().clone(), rng);
            waits
        });
        let (tenant, _) = h.tenant("owner@example.com").await;
        let new = NewSubscription {
            url: EndpointUrl::parse("https://hooks.example.com/in").unwrap(),
            event_types: vec![EventTypeFilter::all()],
            owner_email: None,
            retry_policy: Some(RetryPolicy::custom(SCHEDULE.to_vec(), Jitter::None, false).unwrap()),
            timeout_ms: None,
            rate_limit_per_second: setup.rate_limit,
            auto_disable_after_hours: None,
            circuit_breaker: Some(CircuitBreaker {
                enabled: true,
                failure_threshold: 2,
                probe_interval_seconds: 3,
            }),
            description: None,
            filter: None,
            headers: None,
        };
        let sub = h
            .services
            .create_subscription(&tenant, new)
            .await
            .unwrap()
            .subscription
            .id;
        for n in 0..EVENTS {
            let event: NewEvent =
                serde_json::from_value(serde_json::json!({"type": "order.paid", "payload": {"n": n}})).unwrap();
            h.services.ingest(&tenant, event, None).await.unwrap();
        }
        Self {
            setup,
            h,
            waits,
            posted_at,
            up,
            answered,
            died_after,
            tenant,
            sub,
            receives: HashMap::new(),
            back_at: HashMap::new(),
            spent: Spent::default(),
            came_early: false,
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.h.clock.now()
    }

    fn visible(&self) -> Vec<usize> {
        let now = self.now();
        let messages = self.h.queue.messages();
        (0..messages.len()).filter(|i| messages[*i].1 <= now).collect()
    }

    async fn deliveries(&self) -> Vec<Delivery> {
        let query = DeliveryQuery {
            limit: 100,
            ..Default::default()
        };
        let mut all = self
            .h
            .store
            .list_deliveries(&self.tenant.id, &query)
            .await
            .unwrap()
            .items;
        all.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        all
    }

    fn actions(&self, dead: bool) -> Vec<Action> {
        let visible = self.visible().len();
        let mut actions: Vec<Action> = (0..visible.min(3)).map(Action::Receive).collect();
        if self.spent.duplicates == 0 {
            actions.extend((0..visible.min(2)).map(Action::Duplicate));
            if self.h.queue.messages().len() > visible {
                actions.push(Action::Early);
            }
        }
        if self.waits.is_some() && visible >= 2 {
            actions.push(Action::Together);
        }
        if !self.h.queue.dead_letters().is_empty() {
            actions.push(Action::DeadLetters);
        }
        actions.extend([Action::Tick, Action::Wait]);
        if self.spent.faults == 0 {
            actions.extend(FAULTS.map(Action::Fail));
            actions.extend((1..=CRASH_AFTER_AT_MOST).map(Action::Crash));
        }
        if self.spent.toggles < 2 {
            actions.push(Action::Endpoint(!self.up.load(Ordering::SeqCst)));
        }
        if self.spent.owner == 0 {
            actions.extend([Action::BreakerOff, Action::Delete]);
        }
        if self.spent.replays == 0 && dead {
            actions.push(Action::Replay);
        }
        actions
    }

    async fn apply(&mut self, action: Action) {
        self.step(action).await;
        // A process that died is started again, with nothing kept from before (its caches,
        // its unsaved health samples); its messages come back.
        if self.h.crash.crashed() {
            self.h.crash.disarm();
            let (ports, config) = (self.h.services.ports().clone(), self.h.services.config().clone());
            let rng = rand::SeedableRng::seed_from_u64(u64::from(self.spent.crashes));
            self.h.services = Services::new(ports, config, rng);
        }
    }

    async fn step(&mut self, action: Action) {
        let h = &self.h;
        match action {
            Action::Receive(n) | Action::Duplicate(n) => {
                let (task, _) = h.queue.take_at(self.visible()[n]);
                if matches!(action, Action::Duplicate(_)) {
                    self.spent.duplicates += 1;
                    h.queue.put_back(task.clone(), self.now());
                }
                self.receive(vec![task]).await;
            }
            Action::Early => {
                self.spent.duplicates += 1;
                let now = self.now();
                let messages = h.queue.messages();
                let soonest = (0..messages.len())
                    .filter(|i| messages[*i].1 > now)
                    .min_by_key(|i| messages[*i].1)
                    .expect("a delayed message");
                let (task, _) = h.queue.take_at(soonest);
                let delivery = h.store.get_delivery(&task.delivery_id).await.unwrap();
                self.came_early |= delivery.is_some_and(|d| {
                    hookwise_core::state::is_due_attempt(&d, &task) && d.not_before.is_some_and(|at| at > now)
                });
                self.receive(vec![task]).await;
            }
            Action::Together => {
                let mut taken: Vec<usize> = self.visible().into_iter().take(3).collect();
                taken.reverse();
                let mut tasks: Vec<DeliveryTask> = taken.into_iter().map(|i| h.queue.take_at(i).0).collect();
                tasks.reverse();
                self.receive(tasks).await;
            }
            Action::DeadLetters => {
                let tasks = h.queue.take_dead();
                let messages: Vec<QueueMessage> = tasks.iter().map(|t| message(t, 1)).collect();
                let handling = h.services.handle_messages(QueueRole::DeadLetter, &messages, None);
                let handled = drive(self.waits.as_deref(), handling).await;
                if handled.contains(&Disposition::Redeliver) {
                    h.queue.redrive(&tasks);
                }
            }
            Action::Tick => {
                // A failed tick is tried again by the next.
                let _ = drive(self.waits.as_deref(), h.services.run_scheduler()).await;
            }
            Action::Wait => {
                let next = self.next_due().unwrap_or(self.now() + Duration::seconds(60));
                h.clock.set(next.max(self.now() + Duration::seconds(1)));
            }
            Action::Fail(fault) => {
                self.spent.faults += 1;
                let counter = match fault {
                    Fault::DeliveryWrite => &h.store.failing_delivery_writes,
                    Fault::DeliveryAnswer => &h.store.lost_delivery_answers,
                    Fault::CircuitWrite => &h.store.failing_circuit_writes,
                    Fault::Enqueue => &h.queue.failing_enqueues,
                    Fault::DeadLetterSend => &h.queue.failing_dead_letters,
                };
                counter.store(1, Ordering::SeqCst);
            }
            Action::Crash(writes) => {
                self.spent.faults += 1;
                self.spent.crashes += 1;
                h.crash.arm(writes);
            }
            Action::Endpoint(up) => {
                self.spent.toggles += 1;
                self.up.store(up, Ordering::SeqCst);
            }
            Action::BreakerOff => {
                self.spent.owner += 1;
                let patch = serde_json::from_value(serde_json::json!({"circuit_breaker": {"enabled": false}})).unwrap();
                let updating = h.services.update_subscription(&self.tenant, &self.sub, patch);
                let _ = drive(self.waits.as_deref(), updating).await;
            }
            Action::Delete => {
                self.spent.owner += 1;
                let deleting = h.services.delete_subscription(&self.tenant, &self.sub);
                let _ = drive(self.waits.as_deref(), deleting).await;
            }
            Action::Replay => {
                self.spent.replays += 1;
                let dead = self
                    .deliveries()
                    .await
                    .into_iter()
                    .find(|d| d.status == DeliveryStatus::Dead);
                if let Some(d) = dead {
                    let replaying = h.services.replay_delivery(&self.tenant, &d.id);
                    let _ = drive(self.waits.as_deref(), replaying).await;
                }
            }
        }
    }

    /// Messages handed out in one batch (one, but in the rate-limited world's `Together`):
    /// each deleted when handled, else back after the visibility timeout, or after its last
    /// receive on the dead-letter queue.
    async fn receive(&mut self, tasks: Vec<DeliveryTask>) {
        let mut messages = Vec::new();
        for task in &tasks {
            let count = self.receives.entry(task.clone()).or_default();
            *count += 1;
            messages.push(message(task, *count));
        }
        let handling = self.h.services.handle_messages(QueueRole::Delivery, &messages, None);
        let handled = drive(self.waits.as_deref(), handling).await;
        for ((task, m), handled) in tasks.into_iter().zip(&messages).zip(handled) {
            if handled == Disposition::Redeliver {
                if m.receive_count >= MAX_RECEIVES {
                    self.h.queue.redrive(&[task]);
                } else {
                    let back = self.now() + Duration::seconds(VISIBILITY);
                    self.back_at.insert(task.delivery_id.clone(), back);
                    self.h.queue.put_back(task, back);
                }
            }
        }
    }

    /// The soonest time after now that something becomes due.
    fn next_due(&self) -> Option<DateTime<Utc>> {
        let now = self.now();
        let queued = self.h.queue.messages().into_iter().map(|(_, at)| at);
        let scheduled = self
            .h
            .scheduler
            .items
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.due)
            .collect::<Vec<_>>();
        queued.chain(scheduled).filter(|at| *at > now).min()
    }

    /// What decides what happens next, and the POSTs beyond the attempts so far.
    async fn fingerprint(&self) -> u64 {
        let mut text = format!("{}|{:?}|{}|", self.now(), self.spent, self.up.load(Ordering::SeqCst));
        for d in self.deliveries().await {
            let attempts = self.h.store.attempts(&d.id).await.unwrap().len();
            text.push_str(&format!(
                "{}:{:?}:{}:{}:{:?}:{}|",
                d.id,
                d.status,
                d.round,
                d.attempts,
                d.next_attempt_at,
                self.posts(&d).saturating_sub(attempts)
            ));
        }
        text.push_str(&format!("{:?}|", self.h.store.circuit(&self.sub).await.unwrap()));
        // The endpoint's health (its run of failures opens the breaker), the faults armed and
        // not fired yet, and what the owner has been told.
        let health = self.h.store.endpoint_health(&self.sub).await.unwrap();
        text.push_str(&format!("{}|", health.consecutive_failures()));
        let armed = self.armed().map(|c| c.load(Ordering::SeqCst));
        text.push_str(&format!(
            "{armed:?}|{:?}|{}|",
            self.h.crash.acts_left(),
            self.h.mailer.sent.lock().unwrap().len()
        ));
        let sub = self.h.store.get_subscription(&self.tenant.id, &self.sub).await.unwrap();
        text.push_str(&format!("{:?}|", sub.map(|s| (s.status, s.circuit_breaker.enabled))));
        text.push_str(&format!(
            "{:?}|{:?}|",
            self.h.queue.messages(),
            self.h.queue.dead_letters()
        ));
        let mut receives: Vec<String> = self.receives.iter().map(|r| format!("{r:?}")).collect();
        receives.sort();
        text.push_str(&format!(
            "{:?}|{:?}|{receives:?}",
            self.h.scheduler.items.lock().unwrap(),
            self.h.scheduler.held.lock().unwrap(),
        ));
        // Rate-limited: the limiter's lines (as far as they still matter: see `live`), and
        // the POSTs of the last second, which a POST to come may be too close to.
        if let Some(waits) = &self.waits {
            assert!(waits.next_wake().is_none(), "a handler left waiting");
            let lines = live(self.h.store.rate_lines(&self.sub), self.now());
            let recent: Vec<_> = self
                .posted_at
                .lock()
                .unwrap()
                .iter()
                .filter(|at| self.now() - **at < Duration::seconds(1))
                .copied()
                .collect();
            text.push_str(&format!("|{lines:?}|{recent:?}"));
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut hasher);
        hasher.finish()
    }

    /// The fault counters: how many of the next such steps fail.
    fn armed(&self) -> [&std::sync::atomic::AtomicU32; 5] {
        let (store, queue) = (&self.h.store, &self.h.queue);
        [
            &store.failing_delivery_writes,
            &store.lost_delivery_answers,
            &store.failing_circuit_writes,
            &queue.failing_enqueues,
            &queue.failing_dead_letters,
        ]
    }

    /// The attempts the breaker has parked.
    fn parked(&self) -> Vec<DeliveryTask> {
        let held = self.h.scheduler.held.lock().unwrap();
        held.iter().map(|(_, i)| i.task.clone()).collect()
    }

    /// The deliveries whose next attempt the breaker holds: parked, or queued to be a probe
    /// (its next attempt moved to its give-up time).
    async fn held(&self) -> HashSet<String> {
        let mut tasks: Vec<DeliveryTask> = self.h.queue.messages().into_iter().map(|(t, _)| t).collect();
        tasks.extend(self.parked());
        let mut held = HashSet::new();
        for d in self.deliveries().await {
            let next = |t: &DeliveryTask| t.delivery_id == d.id && t.round == d.round && t.attempt == d.attempts + 1;
            let parked = |t: &DeliveryTask| t.held_until.is_some() && t.held_until == d.next_attempt_at;
            if !d.status.is_final() && tasks.iter().any(|t| next(t) && parked(t)) {
                held.insert(d.id.to_string());
            }
        }
        held
    }

    /// POSTs the endpoint received for `d`'s event.
    fn posts(&self, d: &Delivery) -> usize {
        let requests = self.h.sender.requests.lock().unwrap();
        requests
            .iter()
            .filter(|r| {
                r.headers
                    .iter()
                    .any(|(k, v)| k == "webhook-id" && *v == d.event_id.as_str())
            })
            .count()
    }

    /// Safety, in every state: no delivery POSTed more than its attempts and the extra.
    async fn check_posts(&self) -> Result<(), String> {
        for d in self.deliveries().await {
            let attempts = self.h.store.attempts(&d.id).await.unwrap().len();
            // One for each duplicated message and failed step the path holds.
            let extra = usize::from(self.spent.duplicates) + usize::from(self.spent.faults);
            if self.posts(&d) > attempts + extra {
                return Err(format!("{} POSTs for {attempts} attempts of {}", self.posts(&d), d.id));
            }
        }
        Ok(())
    }

    /// Safety, in every state of the rate-limited world: each POST to the endpoint comes at
    /// least an interval (a second over the rate) after the one before it, and `k` intervals
    /// after the `k`-th before it, but for the limiter's [`TOLERANCE`] (50 ms). The send line
    /// gives turns an interval apart (or, started afresh, later), one to each POST, and an
    /// attempt sends at its turn, or up to [`TOLERANCE`] after it: a turn that far behind
    /// `now` is still given, and the next keeps its place. So no window shorter than a second
    /// less [`TOLERANCE`] holds more than `rate` POSTs, and (at the rates below 20) no second
    /// more than `rate + 1` (the limiter's promise, `rate × 1.1 + 1`, is looser).
    fn check_rate(&self) -> Result<(), String> {
        let Some(rate) = self.setup.rate_limit else {
            return Ok(());
        };
        let interval = Duration::seconds(1) / rate as i32;
        let tolerance = Duration::from_std(TOLERANCE).unwrap();
        let mut posts = self.posted_at.lock().unwrap().clone();
        posts.sort();
        for (i, first) in posts.iter().enumerate() {
            for (k, later) in posts[i + 1..].iter().enumerate() {
                let k = k as i32 + 1;
                if *later - *first < interval * k - tolerance {
                    return Err(format!(
                        "{} POSTs to the endpoint within {} ms ({first} to {later}), over its limit of {rate} a \
                         second: {posts:?}",
                        k + 1,
                        (*later - *first).num_milliseconds()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Safety, in every state of the rate-limited world: an attempt that waits for a slot it
    /// holds (a message carrying it, for the attempt its delivery is due to make) is not
    /// queued again meanwhile, but for one copy for each duplicated message or failed step
    /// the path holds (as in `check_posts`).
    async fn check_slots(&self) -> Result<(), String> {
        if self.waits.is_none() {
            return Ok(());
        }
        let mut tasks: Vec<DeliveryTask> = self.h.queue.messages().into_iter().map(|(t, _)| t).collect();
        tasks.extend(self.h.queue.dead_letters());
        tasks.extend(self.h.scheduler.items.lock().unwrap().iter().map(|i| i.task.clone()));
        tasks.extend(self.parked());
        let extra = usize::from(self.spent.duplicates) + usize::from(self.spent.faults);
        for d in self.deliveries().await {
            if d.status.is_final() {
                continue;
            }
            let copies: Vec<&DeliveryTask> = tasks
                .iter()
                .filter(|t| t.delivery_id == d.id && t.round == d.round && t.attempt == d.attempts + 1)
                .collect();
            if copies.iter().any(|t| t.slot.is_some()) && copies.len() > 1 + extra {
                return Err(format!(
                    "attempt {} of {} (round {}) waits for its slot, queued {} times: {copies:?}",
                    d.attempts + 1,
                    d.id,
                    d.round,
                    copies.len()
                ));
            }
        }
        Ok(())
    }

    /// Every safety property, in a state.
    async fn check_safety(&self) -> Result<(), String> {
        self.check_posts().await?;
        self.check_rate()?;
        self.check_slots().await
    }

    /// The fair run to the end: the endpoint `up` or down, no faults left, every message
    /// handled (rate-limited, in batches side by side), the scheduler ticking and time moving;
    /// then the properties.
    async fn settle_and_check(&mut self, up: bool) -> Result<(), String> {
        self.up.store(up, Ordering::SeqCst);
        for counter in self.armed() {
            counter.store(0, Ordering::SeqCst);
        }
        self.h.crash.disarm();
        let (up_at, give_up) = (self.now(), self.now() + Duration::days(3));
        let held = self.held().await;
        let mut quiet_since = None;
        while self.now() < give_up {
            if up && self.now() - up_at > Duration::seconds(HELD_AT_MOST) {
                let parked = self.h.scheduler.held.lock().unwrap().len();
                let mut unsettled = self.deliveries().await.into_iter();
                // A message back from a handler that died is let go within the bound of its
                // return, not of the endpoint's (a probe that crashed is such a message).
                let returned = |d: &Delivery| {
                    self.back_at
                        .get(&d.id)
                        .is_some_and(|at| self.now() - *at <= Duration::seconds(HELD_AT_MOST))
                };
                let unsettled =
                    unsettled.find(|d| held.contains(d.id.as_str()) && !d.status.is_final() && !returned(d));
                if let Some(d) = unsettled
                    .map(|d| d.id.to_string())
                    .or((parked > 0).then(|| "an attempt parked".into()))
                {
                    return Err(format!(
                        "{d}, held by the breaker, not let go {HELD_AT_MOST} s after the endpoint came up"
                    ));
                }
            }
            // Rate-limited, what is visible goes out in batches, side by side (so the limiter
            // defers attempts here too).
            while !self.visible().is_empty() {
                let together = self.waits.is_some() && self.visible().len() >= 2;
                self.apply(if together { Action::Together } else { Action::Receive(0) })
                    .await;
                self.check_slots().await?;
            }
            self.apply(Action::DeadLetters).await;
            self.check_slots().await?;
            self.apply(Action::Tick).await;
            self.check_slots().await?;
            let settled = self.h.queue.messages().is_empty()
                && self.h.queue.dead_letters().is_empty()
                && self.h.scheduler.items.lock().unwrap().is_empty()
                && self.deliveries().await.iter().all(|d| d.status.is_final());
            match (settled, quiet_since) {
                // An hour of quiet: digests out, nothing left to come.
                (true, Some(since)) if self.now() - since > Duration::hours(1) => break,
                (true, None) => quiet_since = Some(self.now()),
                (false, _) => quiet_since = None,
                _ => {}
            }
            // The tick comes every 5 s while anything is held, else time jumps to what is due.
            let held = !self.h.scheduler.held.lock().unwrap().is_empty();
            let most = Duration::seconds(if held { 5 } else { 300 });
            let next = self.next_due().unwrap_or(self.now() + most);
            // What the tick has just queued to go now (a page released, a probe overdue; every
            // attempt of a page at once, for a limiter to pace) is handled a second later, not
            // after time has jumped past it to the next thing due.
            let next = match !self.visible().is_empty() {
                true => self.now(),
                false => next,
            };
            self.h
                .clock
                .set(next.min(self.now() + most).max(self.now() + Duration::seconds(1)));
        }
        self.check_safety().await?;
        let emails: Vec<String> = self
            .h
            .mailer
            .sent
            .lock()
            .unwrap()
            .iter()
            .map(|m| m.text.clone())
            .collect();
        for d in self.deliveries().await {
            if !d.status.is_final() {
                return Err(format!("{} never settled: {:?}", d.id, d.status));
            }
            // A 2xx is never turned into `dead`, but for one the process died right after
            // (before its record): then a later attempt decides.
            let answered = self.answered.lock().unwrap().contains(d.event_id.as_str());
            let lost = self.died_after.lock().unwrap().contains(d.event_id.as_str());
            if d.status == DeliveryStatus::Dead && answered && !lost {
                return Err(format!(
                    "{} is dead, though the endpoint answered its POST with a 2xx",
                    d.id
                ));
            }
            // Dead of its attempts (not given up for its deleted subscription): all of them.
            let abandoned = d.last_error.as_deref().is_some_and(|e| e.contains("subscription"));
            if d.status == DeliveryStatus::Dead && !abandoned && (d.attempts as usize) < ATTEMPTS {
                return Err(format!(
                    "{} died after {} of its schedule's {ATTEMPTS} attempts",
                    d.id, d.attempts
                ));
            }
            // No retry before its schedule's delay after the attempt before it, whatever
            // message carried it.
            let attempts = self.h.store.attempts(&d.id).await.unwrap();
            for pair in attempts.windows(2).filter(|p| p[0].round == p[1].round) {
                let asked = SCHEDULE.get(pair[0].attempt as usize - 1).copied().unwrap_or(0) as i64;
                let gap = pair[1].started_at - pair[0].started_at;
                if gap < Duration::seconds(asked) {
                    return Err(format!(
                        "{}: attempt {} came {} s after the one before, its schedule asked {asked} s",
                        d.id,
                        pair[1].attempt,
                        gap.num_seconds()
                    ));
                }
            }
            let dead_rounds = d.round as usize + usize::from(d.status == DeliveryStatus::Dead);
            let told = emails
                .iter()
                .map(|t| t.matches(&format!("deliveries/{}/replay", d.id)).count())
                .sum::<usize>();
            // A round replayed before its notice was recorded is not told (the replay is
            // news enough); the last, if dead, always is. A process that dies between an
            // email and its record sends it again (the mail service has no idempotency key).
            let last_dead = usize::from(d.status == DeliveryStatus::Dead);
            if told < last_dead || told > dead_rounds + usize::from(self.spent.crashes) {
                return Err(format!("{} has {dead_rounds} dead rounds, told {told} times", d.id));
            }
        }
        let sub = self.h.store.get_subscription(&self.tenant.id, &self.sub).await.unwrap();
        let circuit = self.h.store.circuit(&self.sub).await.unwrap();
        let breaker_on = sub
            .as_ref()
            .is_some_and(|s| s.circuit_breaker.enabled && s.status == SubscriptionStatus::Active);
        if up && breaker_on && circuit.as_ref().is_some_and(|c| c.state != CircuitState::Closed) {
            return Err(format!(
                "the endpoint is up, but its breaker is {:?}",
                circuit.map(|c| c.state)
            ));
        }
        if !self.h.scheduler.held.lock().unwrap().is_empty() {
            return Err("attempts are still held".into());
        }
        Ok(())
    }
}

fn message(task: &DeliveryTask, receive_count: u32) -> QueueMessage {
    QueueMessage {
        message_id: format!("{}-{}-{}", task.delivery_id, task.round, task.attempt),
        task: Ok(task.clone()),
        redriven: false,
        receive_count,
    }
}

/// Run a call of the services to its end: whenever all it does waits for time (`waits`), time
/// moves on to the first wake. On the manual clock (`None`) nothing waits: it is awaited.
async fn drive<T>(waits: Option<&SteppedClock>, call: impl std::future::Future<Output = T>) -> T {
    let Some(waits) = waits else {
        return call.await;
    };
    let mut call = std::pin::pin!(call);
    loop {
        if let Poll::Ready(done) = futures::poll!(call.as_mut()) {
            return done;
        }
        let at = waits
            .next_wake()
            .expect("a call of the services waits for nothing but time");
        waits.move_to(at);
    }
}

/// The rate-limit lines as far as they decide anything from `now` on (time only moves on): a
/// send line's turn further behind than [`TOLERANCE`] is never given (the line starts afresh
/// at `now`), nor is a backlog's last slot that far behind ever waited behind; and when it is
/// not, or no attempt came back from the backlog for [`BACKLOG_GONE`], the backlog is gone
/// (its time alive is set again whenever it starts afresh or an attempt comes back).
fn live(lines: Lines, now: DateTime<Utc>) -> Lines {
    let behind = now - Duration::from_std(TOLERANCE).unwrap();
    let gone = now - Duration::from_std(BACKLOG_GONE).unwrap();
    let last_slot = lines.last_slot.filter(|at| *at >= behind);
    Lines {
        next_turn: lines.next_turn.filter(|at| *at >= behind),
        last_slot,
        alive: lines.alive.filter(|at| last_slot.is_some() && *at > gone),
    }
}

/// A fresh world with `path` applied, checking safety after each step.
async fn replay(setup: Setup, path: &[Action]) -> Result<World, String> {
    let mut world = World::new(setup).await;
    for action in path {
        world.apply(*action).await;
        world.check_safety().await?;
    }
    Ok(world)
}

/// Every path to the bound (`HOOKWISE_MODEL_DEPTH`, else the setup's), each state expanded
/// once, run on to the end and checked; the figures printed.
async fn explore(setup: Setup) {
    let depth = std::env::var("HOOKWISE_MODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(setup.depth);
    let started = std::time::Instant::now();
    let mut seen = HashSet::new();
    let mut stack: Vec<Vec<Action>> = vec![Vec::new()];
    let (mut states, mut paths, mut deferring, mut early) = (0u64, 0u64, 0u64, 0u64);
    while let Some(path) = stack.pop() {
        paths += 1;
        let mut world = replay(setup, &path)
            .await
            .unwrap_or_else(|e| panic!("{e}\n  after {path:?}"));
        if !seen.insert(world.fingerprint().await) {
            continue;
        }
        states += 1;
        deferring += u64::from(world.h.queue.messages().iter().any(|(t, _)| t.slot.is_some()));
        early += u64::from(world.came_early);
        if path.len() < depth {
            let dead = world
                .deliveries()
                .await
                .iter()
                .any(|d| d.status == DeliveryStatus::Dead);
            for action in world.actions(dead) {
                let mut next = path.clone();
                next.push(action);
                stack.push(next);
            }
        }
        if let Err(e) = world.settle_and_check(true).await {
            panic!("{e}\n  after {path:?} and a fair run to the end, the endpoint up");
        }
        let mut world = replay(setup, &path).await.expect("as the first time");
        if let Err(e) = world.settle_and_check(false).await {
            panic!("{e}\n  after {path:?} and a fair run to the end, the endpoint down");
        }
    }
    let deferred = match setup.rate_limit {
        Some(_) => format!("; in {deferring} an attempt waits on the queue for its slot"),
        None => String::new(),
    };
    eprintln!(
        "model checker ({}): {states} distinct states to depth {depth} ({paths} paths run{deferred}; in {early} a \
         retry's message came before its time), each run on to the end and checked, in {:.1} s",
        setup.name,
        started.elapsed().as_secs_f64()
    );
    assert!(states > 100, "the search explored too little: {states} states");
    // Rate-limited, the limiter must have deferred attempts, or its properties say nothing.
    assert!(
        setup.rate_limit.is_none() || deferring > 0,
        "no attempt was ever deferred"
    );
    // And a retry's message must have come before its time, or the gap property says little.
    assert!(early > 0, "no retry's message ever came early");
}

#[tokio::test]
async fn every_interleaving_to_the_bound_settles_with_each_delivery_final_told_once_and_nothing_held() {
    explore(BREAKER).await;
}

#[tokio::test]
async fn rate_limited_every_interleaving_keeps_the_endpoint_within_its_rate_and_no_slot_queued_twice() {
    explore(LIMITED).await;
}
