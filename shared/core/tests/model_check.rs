//! The model checker: every interleaving, to a bound, of what can happen to three deliveries to
//! one endpoint with a circuit breaker: messages handed out in any order (a delay is another
//! message going first), twice, or back after a handler that failed; the scheduler's ticks;
//! time moving; a failed step (a delivery's write, the breaker's, a queue send, a dead-letter
//! hand-off: the handler stops there and its message comes back); a delivery's write whose
//! answer is lost; the process dying after any of its next one to three writes, POSTs or
//! emails (between any two of a step's, as a crash or a Lambda timing out mid-batch leaves
//! it: between a POST and its record, an email and its own; what it did stays, and it starts
//! again with nothing kept); the endpoint going
//! down and up; the owner turning the breaker off, deleting the subscription, or replaying a
//! dead delivery.
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
//!   longer than [`HELD_AT_MOST`] once the endpoint was up (a probe or a release is always
//!   on its way: within the probe interval, `PROBE_GRACE` and a page's claim);
//! - no delivery whose event the endpoint answered with a 2xx is dead (unless the process
//!   died right after that POST, before its record: then a later attempt decides), and none
//!   is dead with fewer attempts than its schedule gives it (unless given up for its deleted
//!   subscription);
//! - no delivery has had more POSTs than its recorded attempts and one for each duplicated
//!   message or failed step the path holds, in any state along the way.
//!
//! `HOOKWISE_MODEL_DEPTH` sets the bound (default [`DEPTH`]); the figures are printed.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use hookwise_core::circuit::{CircuitBreaker, CircuitState};
use hookwise_core::model::*;
use hookwise_core::policy::{Jitter, RetryPolicy};
use hookwise_core::ports::{Clock, DeliveryQuery, DeliveryTask, QueueMessage, Store};
use hookwise_core::services::{Disposition, NewEvent, NewSubscription, QueueRole, Services};
use hookwise_core::testing::memory::{status_outcome, CrashPoint, Harness, ScriptedSender};

/// Events ingested, one delivery each: three, so that an open breaker holds one while a
/// second waits to be its probe.
const EVENTS: usize = 3;
/// Choices along a path, by default.
const DEPTH: usize = 6;
/// The longest an attempt may stay held once the endpoint is up: the probe interval (3 s),
/// `PROBE_GRACE` (10 s), a release page's claim (60 s) and the fair run's tick (5 s), with
/// room. The schedule's span (330 s) is longer, so an attempt left held till it gives up
/// shows.
const HELD_AT_MOST: i64 = 90;
/// The schedule's attempts: the first and two retries (30 s and 300 s after).
const ATTEMPTS: usize = 3;
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
    h: Harness,
    up: Arc<AtomicBool>,
    /// Events whose POST the endpoint answered with a 2xx.
    answered: Arc<std::sync::Mutex<HashSet<String>>>,
    /// ... of which the process died right after the POST, before recording it.
    died_after: Arc<std::sync::Mutex<HashSet<String>>>,
    tenant: Tenant,
    sub: SubscriptionId,
    receives: HashMap<DeliveryTask, u32>,
    spent: Spent,
}

impl World {
    async fn new() -> Self {
        let up = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let died_after = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let crash: Arc<std::sync::OnceLock<Arc<CrashPoint>>> = Arc::default();
        let (flag, seen, died, point) = (up.clone(), answered.clone(), died_after.clone(), crash.clone());
        let h = Harness::new(ScriptedSender::with_requests(move |request, _| {
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
        let (tenant, _) = h.tenant("owner@example.com").await;
        let new = NewSubscription {
            url: EndpointUrl::parse("https://hooks.example.com/in").unwrap(),
            event_types: vec![EventTypeFilter::all()],
            owner_email: None,
            retry_policy: Some(RetryPolicy::custom(vec![30, 300], Jitter::None, false).unwrap()),
            timeout_ms: None,
            rate_limit_per_second: None,
            auto_disable_after_hours: None,
            circuit_breaker: Some(CircuitBreaker {
                enabled: true,
                failure_threshold: 2,
                probe_interval_seconds: 3,
            }),
            description: None,
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
            h,
            up,
            answered,
            died_after,
            tenant,
            sub,
            receives: HashMap::new(),
            spent: Spent::default(),
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
                self.receive(task).await;
            }
            Action::DeadLetters => {
                let tasks = h.queue.take_dead();
                let messages: Vec<QueueMessage> = tasks.iter().map(|t| message(t, 1)).collect();
                let handled = h.services.handle_messages(QueueRole::DeadLetter, &messages, None).await;
                if handled.contains(&Disposition::Redeliver) {
                    h.queue.redrive(&tasks);
                }
            }
            Action::Tick => {
                // A failed tick is tried again by the next.
                let _ = h.services.run_scheduler().await;
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
                let _ = h.services.update_subscription(&self.tenant, &self.sub, patch).await;
            }
            Action::Delete => {
                self.spent.owner += 1;
                let _ = h.services.delete_subscription(&self.tenant, &self.sub).await;
            }
            Action::Replay => {
                self.spent.replays += 1;
                let dead = self
                    .deliveries()
                    .await
                    .into_iter()
                    .find(|d| d.status == DeliveryStatus::Dead);
                if let Some(d) = dead {
                    let _ = h.services.replay_delivery(&self.tenant, &d.id).await;
                }
            }
        }
    }

    /// A message handed out: deleted when handled, else back after the visibility timeout,
    /// or after its last receive on the dead-letter queue.
    async fn receive(&mut self, task: DeliveryTask) {
        let count = self.receives.entry(task.clone()).or_default();
        *count += 1;
        let count = *count;
        let handled = self
            .h
            .services
            .handle_messages(QueueRole::Delivery, &[message(&task, count)], None)
            .await;
        if handled[0] == Disposition::Redeliver {
            if count >= MAX_RECEIVES {
                self.h.queue.redrive(&[task]);
            } else {
                self.h.queue.put_back(task, self.now() + Duration::seconds(VISIBILITY));
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

    /// The deliveries whose next attempt the breaker holds: parked, or queued to be a probe
    /// (a retry's next attempt moved to its give-up time; a first attempt's is not moved, and
    /// is not counted here).
    async fn held(&self) -> HashSet<String> {
        let mut tasks: Vec<DeliveryTask> = self.h.queue.messages().into_iter().map(|(t, _)| t).collect();
        tasks.extend(
            self.h
                .scheduler
                .held
                .lock()
                .unwrap()
                .iter()
                .map(|(_, i)| i.task.clone()),
        );
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

    /// The fair run to the end: the endpoint `up` or down, no faults left, every message
    /// handled, the scheduler ticking and time moving; then the properties.
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
                let unsettled = unsettled.find(|d| held.contains(d.id.as_str()) && !d.status.is_final());
                if let Some(d) = unsettled
                    .map(|d| d.id.to_string())
                    .or((parked > 0).then(|| "an attempt parked".into()))
                {
                    return Err(format!(
                        "{d}, held by the breaker, not let go {HELD_AT_MOST} s after the endpoint came up"
                    ));
                }
            }
            while !self.visible().is_empty() {
                self.apply(Action::Receive(0)).await;
            }
            self.apply(Action::DeadLetters).await;
            self.apply(Action::Tick).await;
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
            self.h
                .clock
                .set(next.min(self.now() + most).max(self.now() + Duration::seconds(1)));
        }
        self.check_posts().await?;
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

/// A fresh world with `path` applied, checking safety after each step.
async fn replay(path: &[Action]) -> Result<World, String> {
    let mut world = World::new().await;
    for action in path {
        world.apply(*action).await;
        world.check_posts().await?;
    }
    Ok(world)
}

#[tokio::test]
async fn every_interleaving_to_the_bound_settles_with_each_delivery_final_told_once_and_nothing_held() {
    let depth = std::env::var("HOOKWISE_MODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(DEPTH);
    let started = std::time::Instant::now();
    let mut seen = HashSet::new();
    let mut stack: Vec<Vec<Action>> = vec![Vec::new()];
    let (mut states, mut paths) = (0u64, 0u64);
    while let Some(path) = stack.pop() {
        paths += 1;
        let mut world = replay(&path).await.unwrap_or_else(|e| panic!("{e}\n  after {path:?}"));
        if !seen.insert(world.fingerprint().await) {
            continue;
        }
        states += 1;
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
        let mut world = replay(&path).await.expect("as the first time");
        if let Err(e) = world.settle_and_check(false).await {
            panic!("{e}\n  after {path:?} and a fair run to the end, the endpoint down");
        }
    }
    eprintln!(
        "model checker: {states} distinct states to depth {depth} ({paths} paths run), each run on to the end \
         and checked, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(states > 100, "the search explored too little: {states} states");
}
