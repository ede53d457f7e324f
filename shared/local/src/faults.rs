//! Fault injection for the chaos suite (`hookwise dev --faults SPEC`, hidden): the store's and
//! the queues' calls fail the way a remote store and queue do, at the one place every call
//! goes through (`LocalBackend::call`, the writing thread's commit, the queue's receive).
//!
//! A [`FaultSpec`] is `key=value` pairs separated by commas:
//!
//! - `seed=N`: seeds the one RNG that decides every fault (default 0), so a run that makes
//!   its calls in the same order meets the same faults.
//! - `call-error=P`: a call fails before it runs, with a retryable error; nothing written
//!   (a throttle).
//! - `lost-answer=P`: a call that wrote commits, then its caller gets a retryable error
//!   instead of the answer (a timeout after the write). An email's row is spared: an email
//!   has no idempotency key, and a caller told it failed sends it again (as on SES).
//! - `duplicate=P`: a message received is left visible, so the next receive hands it out
//!   again (counted when it is).
//! - `early=P`: a receive of the delivery queue also hands out the delayed message due
//!   soonest, before its time.
//! - `abort-after-rows=N`: the process aborts (`std::process::abort`) right after the commit
//!   that holds the first call writing `N` rows or more, before any of its calls is answered.
//!   A 150-subscription event's ingest writes about 300 in one call, and nothing else in a
//!   quiet run writes half as many, so it aims the crash at that ingest.
//!
//! Each probability is per call (`call-error`, `lost-answer`), per message received
//! (`duplicate`) or per receive (`early`). Faults are injected only once the backend is
//! armed (`LocalBackend::arm_faults`: `hookwise dev` arms it once it serves, so its start-up
//! never meets one). Every fault that fires is counted, and, for a data dir, appended as a
//! line `<kind> <call>` to `<data-dir>/faults.log` (one `write` each, so a process killed
//! with SIGKILL has them all on file). Without a spec there is no injector: a call pays
//! for one `Option` check.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use hookwise_core::ports::PortResult;
use hookwise_core::PortError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Where the fired faults are appended, in the data dir.
pub const FAULTS_LOG: &str = "faults.log";

/// A kind of fault, as the spec and `faults.log` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    CallError,
    LostAnswer,
    Duplicate,
    Early,
    Abort,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::CallError,
        FaultKind::LostAnswer,
        FaultKind::Duplicate,
        FaultKind::Early,
        FaultKind::Abort,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::CallError => "call-error",
            FaultKind::LostAnswer => "lost-answer",
            FaultKind::Duplicate => "duplicate",
            FaultKind::Early => "early",
            FaultKind::Abort => "abort",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What to inject; parsed from `seed=11,call-error=0.02,...` (see the module's doc).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultSpec {
    pub seed: u64,
    pub call_error: f64,
    pub lost_answer: f64,
    pub duplicate: f64,
    pub early: f64,
    pub abort_after_rows: Option<u64>,
}

impl FaultSpec {
    /// The kinds this spec can inject.
    pub fn kinds(&self) -> Vec<FaultKind> {
        FaultKind::ALL
            .into_iter()
            .filter(|kind| match kind {
                FaultKind::CallError => self.call_error > 0.0,
                FaultKind::LostAnswer => self.lost_answer > 0.0,
                FaultKind::Duplicate => self.duplicate > 0.0,
                FaultKind::Early => self.early > 0.0,
                FaultKind::Abort => self.abort_after_rows.is_some(),
            })
            .collect()
    }
}

impl FromStr for FaultSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut spec = FaultSpec::default();
        let mut seen = HashSet::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not `key=value`"))?;
            let (key, value) = (key.trim(), value.trim());
            if !seen.insert(key.to_owned()) {
                return Err(format!("`{key}` is given twice"));
            }
            let probability = || match value.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
                _ => Err(format!("`{key}={value}`: a probability is a number from 0 to 1")),
            };
            match key {
                "seed" => {
                    spec.seed = value
                        .parse()
                        .map_err(|_| format!("`seed={value}`: a seed is a whole number"))?
                }
                "call-error" => spec.call_error = probability()?,
                "lost-answer" => spec.lost_answer = probability()?,
                "duplicate" => spec.duplicate = probability()?,
                "early" => spec.early = probability()?,
                "abort-after-rows" => match value.parse::<u64>() {
                    Ok(n) if n > 0 => spec.abort_after_rows = Some(n),
                    _ => return Err(format!("`abort-after-rows={value}`: a number of rows, 1 or more")),
                },
                other => {
                    return Err(format!(
                        "unknown fault `{other}` (known: seed, call-error, lost-answer, duplicate, early, abort-after-rows)"
                    ))
                }
            }
        }
        if seen.is_empty() {
            return Err("no faults given (e.g. `seed=1,call-error=0.02`)".into());
        }
        Ok(spec)
    }
}

/// The spec back as text, every key given.
impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed={},call-error={},lost-answer={},duplicate={},early={}",
            self.seed, self.call_error, self.lost_answer, self.duplicate, self.early
        )?;
        if let Some(n) = self.abort_after_rows {
            write!(f, ",abort-after-rows={n}")?;
        }
        Ok(())
    }
}

/// What befalls one call, drawn before it runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Fate {
    /// Fail it before it runs.
    pub fail: bool,
    /// Lose its answer if it writes.
    pub lose: bool,
    /// Count the rows it writes (for `lose` and `abort-after-rows`).
    pub watch: bool,
}

/// The draws of one receive, made before its call (which may run twice: `each_alone`), so
/// both runs decide the same.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReceiveDraws {
    seed: u64,
    duplicate: f64,
    early: f64,
}

impl ReceiveDraws {
    /// The receive's own RNG; `leave_visible` and `hand_out_early` draw from it in order.
    pub fn rng(&self) -> StdRng {
        StdRng::seed_from_u64(self.seed)
    }

    /// Leave this received message visible (a duplicate to come)?
    pub fn leave_visible(&self, rng: &mut StdRng) -> bool {
        rng.random::<f64>() < self.duplicate
    }

    /// Hand out the delayed message due soonest as well?
    pub fn hand_out_early(&self, rng: &mut StdRng) -> bool {
        rng.random::<f64>() < self.early
    }
}

/// A running injector: the spec, its RNG, the counts and the log.
pub(crate) struct Injector {
    spec: FaultSpec,
    armed: AtomicBool,
    rng: Mutex<StdRng>,
    counts: Mutex<BTreeMap<FaultKind, u64>>,
    log: Option<Mutex<File>>,
    /// Messages left visible (by id, with what they carry), counted as duplicates when they
    /// are received again.
    left_visible: Mutex<HashMap<i64, String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Injector {
    /// An injector for `spec`, logging to `<data_dir>/faults.log` when there is a data dir.
    pub fn new(spec: FaultSpec, data_dir: Option<&Path>) -> PortResult<Self> {
        let log = match data_dir {
            Some(dir) => {
                let path = dir.join(FAULTS_LOG);
                let file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| PortError::permanent(format!("open {}", path.display()), e))?;
                Some(Mutex::new(file))
            }
            None => None,
        };
        Ok(Self {
            rng: Mutex::new(StdRng::seed_from_u64(spec.seed)),
            spec,
            armed: AtomicBool::new(false),
            counts: Mutex::new(BTreeMap::new()),
            log,
            left_visible: Mutex::new(HashMap::new()),
        })
    }

    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    /// Draw a call's fate. Every armed call takes the same two draws, so one probability's
    /// change does not shift the other's sequence. `may_lose`: a write whose answer may be
    /// lost.
    pub fn fate(&self, may_lose: bool) -> Fate {
        if !self.armed() {
            return Fate::default();
        }
        let (fail, lose): (f64, f64) = {
            let mut rng = lock(&self.rng);
            (rng.random(), rng.random())
        };
        Fate {
            fail: fail < self.spec.call_error,
            lose: may_lose && lose < self.spec.lost_answer,
            watch: self.spec.abort_after_rows.is_some() || may_lose,
        }
    }

    /// The draws of one receive, or `None` when the queue faults are off.
    pub fn receive_draws(&self) -> Option<ReceiveDraws> {
        if !self.armed() || (self.spec.duplicate <= 0.0 && self.spec.early <= 0.0) {
            return None;
        }
        Some(ReceiveDraws {
            seed: lock(&self.rng).random(),
            duplicate: self.spec.duplicate,
            early: self.spec.early,
        })
    }

    /// A receive handed out the messages `received`, of which it left `left` visible and
    /// handed out `early` before their time (each with what it carries, for the log): count
    /// the duplicates (those left visible before, received again) and the early ones.
    pub fn received(
        &self,
        what: &str,
        received: impl Iterator<Item = i64>,
        left: Vec<(i64, String)>,
        early: Vec<(i64, String)>,
    ) {
        let again: Vec<String> = {
            let mut waiting = lock(&self.left_visible);
            let again = received.filter_map(|id| waiting.remove(&id)).collect();
            waiting.extend(left);
            again
        };
        for carries in again {
            self.fired(FaultKind::Duplicate, &format!("{what}: {carries}"));
        }
        for (_, carries) in early {
            self.fired(FaultKind::Early, &format!("{what}: {carries}"));
        }
    }

    /// A batch has committed: abort now if one of its calls (`what`, rows written) wrote
    /// `abort-after-rows` or more. Runs before any of its calls is answered.
    pub fn committed(&self, calls: impl Iterator<Item = (&'static str, u64)>) {
        let Some(limit) = self.spec.abort_after_rows.filter(|_| self.armed()) else {
            return;
        };
        for (what, rows) in calls {
            if rows >= limit {
                self.fired(FaultKind::Abort, &format!("after `{what}` committed {rows} rows"));
                std::process::abort();
            }
        }
    }

    /// Count a fault that fired, and append it to the log.
    pub fn fired(&self, kind: FaultKind, what: &str) {
        *lock(&self.counts).entry(kind).or_default() += 1;
        if let Some(log) = &self.log {
            // One write of the whole line: whole lines, whatever kills the process.
            let line = format!("{kind} {what}\n");
            if let Err(e) = lock(log).write_all(line.as_bytes()) {
                tracing::warn!(error = %e, "could not log an injected fault");
            }
        }
    }

    pub fn counts(&self) -> BTreeMap<FaultKind, u64> {
        lock(&self.counts).clone()
    }
}

/// The error of a call failed before it ran.
pub(crate) fn call_error(what: &'static str) -> PortError {
    PortError::retryable(what, "injected fault: the call failed before it ran (nothing written)")
}

/// The error of a call whose answer was lost after it committed.
pub(crate) fn lost_answer(what: &'static str) -> PortError {
    PortError::retryable(what, "injected fault: the answer was lost after the call committed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LocalBackend, LocalConfig};
    use hookwise_core::model::DeliveryId;
    use hookwise_core::ports::{DeliveryQueue, DeliveryTask};
    use std::time::Duration;

    /// An in-memory backend injecting `spec`, armed.
    fn faulty(spec: &str) -> LocalBackend {
        let backend = LocalBackend::open_in_memory_with(LocalConfig {
            faults: Some(spec.parse().unwrap()),
            ..LocalConfig::default()
        })
        .unwrap();
        backend.arm_faults();
        backend
    }

    fn task(n: u64) -> DeliveryTask {
        DeliveryTask {
            delivery_id: DeliveryId::generate("2030-06-01T11:00:00Z".parse().unwrap(), &mut StdRng::seed_from_u64(n)),
            round: 0,
            attempt: 1,
            queued_at: None,
            slot: None,
            tenant_id: None,
            held_until: None,
            redrives: 0,
        }
    }

    const HIDDEN: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_failed_call_wrote_nothing_and_a_lost_answer_everything() {
        let backend = faulty("seed=5,call-error=0.5");
        let mut ok = 0;
        for n in 0..40 {
            match backend.enqueue(&[(task(n), 0)]).await {
                Ok(()) => ok += 1,
                Err(e) => assert!(matches!(e, PortError::Retryable { .. }), "{e}"),
            }
        }
        let queued = loop {
            if let Ok(n) = backend.queue_len(crate::QueueName::Delivery).await {
                break n;
            }
        };
        assert_eq!(queued, ok, "only the calls answered Ok wrote");
        assert!((5..35).contains(&ok), "{ok} of 40 at 0.5");
        assert!(backend.fault_counts()[&FaultKind::CallError] >= 5);

        let backend = faulty("lost-answer=1");
        let lost = backend.enqueue(&[(task(1), 0)]).await.unwrap_err();
        assert!(matches!(lost, PortError::Retryable { .. }), "{lost}");
        assert_eq!(
            backend.queue_len(crate::QueueName::Delivery).await.unwrap(),
            1,
            "written"
        );
        assert_eq!(backend.fault_counts()[&FaultKind::LostAnswer], 1);
        // A call that wrote nothing has no answer to lose (nor does a read).
        assert!(
            backend.receive(10, HIDDEN).await.is_err(),
            "a receive hides its message"
        );
        assert!(backend.receive(10, HIDDEN).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_duplicate_is_received_again_and_an_early_message_before_its_time() {
        let backend = faulty("duplicate=1");
        backend.enqueue(&[(task(1), 0)]).await.unwrap();
        let first = backend.receive(10, HIDDEN).await.unwrap();
        let again = backend.receive(10, HIDDEN).await.unwrap();
        assert_eq!((first.len(), again.len()), (1, 1));
        assert_eq!(first[0].task, again[0].task);
        assert_eq!(again[0].receive_count, 2);
        assert_eq!(backend.fault_counts()[&FaultKind::Duplicate], 1);
        // The first receipt is stale now: only the second deletes it.
        assert!(!backend.ack(&first[0].receipt).await.unwrap());
        assert!(backend.ack(&again[0].receipt).await.unwrap());

        let backend = faulty("early=1");
        backend.enqueue(&[(task(2), 600), (task(3), 60)]).await.unwrap();
        let early = backend.receive(10, HIDDEN).await.unwrap();
        assert_eq!(early.len(), 1, "one a receive");
        assert_eq!(early[0].task, task(3), "the one due soonest");
        assert_eq!(backend.fault_counts()[&FaultKind::Early], 1);
    }

    #[test]
    fn a_spec_parses_every_key_and_prints_back() {
        let spec: FaultSpec = "seed=11, call-error=0.04,lost-answer=0.02,duplicate=0.05,early=0.5,abort-after-rows=150"
            .parse()
            .unwrap();
        assert_eq!(
            spec,
            FaultSpec {
                seed: 11,
                call_error: 0.04,
                lost_answer: 0.02,
                duplicate: 0.05,
                early: 0.5,
                abort_after_rows: Some(150),
            }
        );
        assert_eq!(spec.to_string().parse::<FaultSpec>().unwrap(), spec);
        assert_eq!(spec.kinds(), FaultKind::ALL.to_vec());
        let some: FaultSpec = "duplicate=1".parse().unwrap();
        assert_eq!(some.kinds(), vec![FaultKind::Duplicate]);
    }

    #[test]
    fn a_bad_spec_is_an_error_that_says_what_is_wrong() {
        for (text, says) in [
            ("", "no faults"),
            ("call-error", "not `key=value`"),
            ("call-error=1.5", "from 0 to 1"),
            ("early=often", "from 0 to 1"),
            ("seed=-1", "whole number"),
            ("abort-after-rows=0", "1 or more"),
            ("typo=0.1", "unknown fault `typo`"),
            ("early=0.1,early=0.2", "given twice"),
        ] {
            let err = text.parse::<FaultSpec>().unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn nothing_fires_until_armed_and_the_same_seed_draws_the_same_fates() {
        let spec: FaultSpec = "seed=3,call-error=0.3,lost-answer=0.3".parse().unwrap();
        let injector = Injector::new(spec.clone(), None).unwrap();
        assert!((0..100).all(|_| injector.fate(true) == Fate::default()));
        let fates = |injector: &Injector| (0..200).map(|_| injector.fate(true)).collect::<Vec<_>>();
        injector.arm();
        let first = fates(&injector);
        let again = Injector::new(spec, None).unwrap();
        again.arm();
        assert_eq!(first, fates(&again));
        let failed = first.iter().filter(|f| f.fail).count();
        assert!((30..90).contains(&failed), "{failed} of 200 at 0.3");
        assert!(first.iter().any(|f| f.lose) && first.iter().all(|f| f.watch));
        // A read's answer is never lost.
        assert!((0..200).all(|_| !injector.fate(false).lose));
    }

    #[test]
    fn duplicates_count_when_received_again_and_the_log_has_a_line_per_fault() {
        let dir = tempfile::tempdir().unwrap();
        let injector = Injector::new("duplicate=0.5,early=0.5".parse().unwrap(), Some(dir.path())).unwrap();
        injector.arm();
        let carries = |ids: &[i64]| ids.iter().map(|id| (*id, format!("m{id}"))).collect::<Vec<_>>();
        injector.received("receive", [1, 2, 3].into_iter(), carries(&[2, 3]), Vec::new());
        assert_eq!(
            injector.counts().get(&FaultKind::Duplicate),
            None,
            "not received again yet"
        );
        injector.received("receive", [2, 4].into_iter(), Vec::new(), carries(&[4]));
        injector.received("receive", [2].into_iter(), Vec::new(), Vec::new());
        let counts = injector.counts();
        assert_eq!(counts[&FaultKind::Duplicate], 1, "2 once; 3 never came back");
        assert_eq!(counts[&FaultKind::Early], 1);
        let log = std::fs::read_to_string(dir.path().join(FAULTS_LOG)).unwrap();
        assert_eq!(log, "duplicate receive: m2\nearly receive: m4\n");
    }
}
