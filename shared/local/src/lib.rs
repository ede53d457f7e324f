//! Hookwise's embedded backend: one SQLite file holds the store, the delivery queue and its
//! dead-letter queue (with delay and visibility timeout, like SQS), the scheduler table and
//! the email outbox (each mail also an `.eml` file).
//!
//! [`LocalBackend`] implements every core port ([`Store`], [`DeliveryQueue`],
//! [`SchedulerTable`], [`Mailer`], [`SecretKeeper`] with the key file `secrets.key`); each queue's receiving end is a [`LocalConsumer`]
//! (the core's `QueueConsumer` port, which the runner's worker loop drains). A
//! [`DataDirLock`] makes one process the owner of a data dir's queues.
//!
//! One connection for writes, owned by one thread. Calls queue up for it; it runs whatever
//! has queued as one transaction (a failed call undoes only its own writes: see
//! [`each_alone`]) and answers every call after the commit. SQLite serialises writers
//! anyway; this way concurrent callers share a commit instead of each paying for one, and
//! the async runtime never waits on the disk or on another process's lock.
//!
//! Reads of a database file go to a second connection on a thread of its own: WAL lets it
//! read the last commit while the writer's next one waits for the disk, so a read never
//! waits for an fsync. It sees only what has committed (and so is durable), and everything
//! a caller was told has committed. An in-memory database has one connection for both.
//!
//! [`Store`]: hookwise_core::ports::Store
//! [`DeliveryQueue`]: hookwise_core::ports::DeliveryQueue
//! [`SchedulerTable`]: hookwise_core::ports::SchedulerTable
//! [`Mailer`]: hookwise_core::ports::Mailer
//! [`SecretKeeper`]: hookwise_core::ports::SecretKeeper

mod faults;
mod lock;
mod outbox;
mod queue;
mod scheduler;
mod schema;
mod secrets;
mod store;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hookwise_core::ports::{Clock, PortResult, Sender, SystemClock};
use hookwise_core::services::Ports;
use hookwise_core::PortError;
use rusqlite::{Connection, ErrorCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{oneshot, Notify};

pub use faults::{FaultKind, FaultSpec, FAULTS_LOG};
pub use lock::DataDirLock;
pub use outbox::SentEmail;
pub use queue::{LocalConsumer, QueueName, Receipt, Received};
pub use secrets::KEY_FILE;

/// The database file inside the data dir.
pub const DB_FILE: &str = "hookwise.db";
/// The directory of `.eml` files inside the data dir.
pub const OUTBOX_DIR: &str = "outbox";
/// SQS's limit on a message's delay, which the local queue copies by default.
pub const DEFAULT_MAX_DELAY_SECONDS: u32 = 900;
/// How often a message may be received before it moves to the dead-letter queue (SQS's
/// redrive policy `maxReceiveCount`).
pub const DEFAULT_MAX_RECEIVE_COUNT: u32 = 5;
/// How long a writer waits for another process holding the database (e.g. `hookwise
/// tenant create` while `hookwise dev` runs) before the call fails as retryable.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The most calls one transaction takes, so the first caller in a burst is not kept long.
const MAX_BATCH: usize = 256;

/// How a [`LocalBackend`] behaves; the defaults copy SQS and SES.
#[derive(Clone)]
pub struct LocalConfig {
    /// Drives queue delays and visibility, outbox dates and notice claims. Tests pass a
    /// manual clock.
    pub clock: Arc<dyn Clock>,
    /// The longest delay `enqueue` accepts; later retries go through the scheduler table.
    pub max_delay_seconds: u32,
    /// A delivery-queue message received this many times without an ack moves to the
    /// dead-letter queue on the next `receive`; `None` never moves it.
    pub max_receive_count: Option<u32>,
    /// The `From:` of outbox mail.
    pub mail_from: String,
    /// How hard a commit waits for the disk.
    pub synchronous: Synchronous,
    /// Faults to inject, for the chaos suite (see [`FaultSpec`]); none by default. They start
    /// once the backend is armed ([`LocalBackend::arm_faults`]).
    pub faults: Option<FaultSpec>,
}

/// SQLite's `synchronous` setting, in WAL mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit reaches the disk before it returns: an event answered 202 survives a
    /// power cut.
    #[default]
    Full,
    /// Commits survive a killed process but a power cut can roll back the last ones. For
    /// measuring what `Full` costs.
    Normal,
}

impl Synchronous {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            max_delay_seconds: DEFAULT_MAX_DELAY_SECONDS,
            max_receive_count: Some(DEFAULT_MAX_RECEIVE_COUNT),
            mail_from: "Hookwise <hookwise@hookwise.local>".into(),
            synchronous: Synchronous::Full,
            faults: None,
        }
    }
}

impl std::fmt::Debug for LocalConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalConfig")
            .field("max_delay_seconds", &self.max_delay_seconds)
            .field("max_receive_count", &self.max_receive_count)
            .field("mail_from", &self.mail_from)
            .field("synchronous", &self.synchronous)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

/// The embedded backend. Cheap to clone: clones share one connection.
#[derive(Clone)]
pub struct LocalBackend {
    inner: Arc<Inner>,
}

struct Inner {
    /// To the writing connection's thread; `None` only while dropping.
    jobs: Option<mpsc::Sender<Box<dyn Job>>>,
    thread: Option<JoinHandle<()>>,
    /// To the reading connection's thread, for a database file; `None` in memory (reads
    /// go to the writer) and while dropping.
    reads: Option<mpsc::Sender<Box<dyn Job>>>,
    reader: Option<JoinHandle<()>>,
    config: LocalConfig,
    /// Where `.eml` files go; `None` for an in-memory backend (mail is kept as rows only).
    outbox_dir: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    delivery_ready: Notify,
    dead_ready: Notify,
    secrets: secrets::SecretsKey,
    /// The fault injector, when the config names faults.
    faults: Option<Arc<faults::Injector>>,
    // Dropped after `Drop for Inner` has closed the connection.
    _temp: Option<TempDirGuard>,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("data_dir", &self.inner.data_dir)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl LocalBackend {
    /// Open (or create) `<data_dir>/hookwise.db` and `<data_dir>/outbox/` with the default
    /// config (wall clock, 900 s max delay).
    pub fn open(data_dir: &Path) -> PortResult<Self> {
        Self::open_with(data_dir, LocalConfig::default())
    }

    pub fn open_with(data_dir: &Path, config: LocalConfig) -> PortResult<Self> {
        Self::open_dir(data_dir, config, None)
    }

    /// A database in memory and no outbox directory: mail is kept as rows only. For tests.
    pub fn open_in_memory() -> PortResult<Self> {
        Self::open_in_memory_with(LocalConfig::default())
    }

    pub fn open_in_memory_with(config: LocalConfig) -> PortResult<Self> {
        let conn = Connection::open_in_memory().map_err(|e| db_err("open an in-memory database", e))?;
        schema::prepare(&conn, config.synchronous)?;
        Self::from_parts(conn, None, secrets::SecretsKey::random(), config, None, None, None)
    }

    /// A fresh data dir under the system's temp dir, removed when the last clone is
    /// dropped. For tests that want real files (the `.eml` outbox).
    pub fn open_temp() -> PortResult<Self> {
        Self::open_temp_with(LocalConfig::default())
    }

    pub fn open_temp_with(config: LocalConfig) -> PortResult<Self> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hookwise-{}-{}-{}",
            std::process::id(),
            Utc::now().timestamp_nanos_opt().unwrap_or_default(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let guard = TempDirGuard(dir.clone());
        Self::open_dir(&dir, config, Some(guard))
    }

    fn open_dir(data_dir: &Path, config: LocalConfig, temp: Option<TempDirGuard>) -> PortResult<Self> {
        let outbox_dir = data_dir.join(OUTBOX_DIR);
        std::fs::create_dir_all(&outbox_dir)
            .map_err(|e| PortError::permanent(format!("create the outbox directory {}", outbox_dir.display()), e))?;
        let path = data_dir.join(DB_FILE);
        let conn = Connection::open(&path).map_err(|e| db_err("open the database", e))?;
        schema::prepare(&conn, config.synchronous)?;
        let secrets = secrets::SecretsKey::for_data_dir(data_dir, &schema::sealed_secrets_sample(&conn)?)?;
        // Opened after `prepare`, so it finds the tables made and upgraded.
        let reader = Connection::open(&path).map_err(|e| db_err("open the database for reading", e))?;
        schema::prepare_reader(&reader)?;
        Self::from_parts(
            conn,
            Some(reader),
            secrets,
            config,
            Some(outbox_dir),
            Some(data_dir.to_owned()),
            temp,
        )
    }

    fn from_parts(
        conn: Connection,
        reader: Option<Connection>,
        secrets: secrets::SecretsKey,
        config: LocalConfig,
        outbox_dir: Option<PathBuf>,
        data_dir: Option<PathBuf>,
        temp: Option<TempDirGuard>,
    ) -> PortResult<Self> {
        let faults = match &config.faults {
            Some(spec) => Some(Arc::new(faults::Injector::new(spec.clone(), data_dir.as_deref())?)),
            None => None,
        };
        let (jobs, queue) = mpsc::channel();
        let committed = faults.clone();
        let thread = std::thread::Builder::new()
            .name("hookwise-sqlite".into())
            .spawn(move || serve(conn, queue, run_batch, committed))
            .map_err(|e| PortError::permanent("start the database thread", e))?;
        let (reads, reader) = match reader {
            Some(conn) => {
                let (reads, queue) = mpsc::channel();
                let thread = std::thread::Builder::new()
                    .name("hookwise-reads".into())
                    .spawn(move || serve(conn, queue, run_reads, None))
                    .map_err(|e| PortError::permanent("start the database's reading thread", e))?;
                (Some(reads), Some(thread))
            }
            None => (None, None),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                jobs: Some(jobs),
                thread: Some(thread),
                reads,
                reader,
                config,
                outbox_dir,
                data_dir,
                delivery_ready: Notify::new(),
                dead_ready: Notify::new(),
                secrets,
                faults,
                _temp: temp,
            }),
        })
    }

    /// The services' ports: this backend for every one but the sender and the clock.
    pub fn ports(&self, sender: Arc<dyn Sender>, clock: Arc<dyn Clock>) -> Ports {
        let shared = Arc::new(self.clone());
        Ports {
            store: shared.clone(),
            queue: shared.clone(),
            // One SQLite transaction holds an event and its messages.
            store_with_queue: Some(shared.clone()),
            scheduler: shared.clone(),
            mailer: shared.clone(),
            secrets: shared,
            sender,
            clock,
        }
    }

    /// The data dir, unless the database is in memory.
    pub fn data_dir(&self) -> Option<&Path> {
        self.inner.data_dir.as_deref()
    }

    /// Where `.eml` files are written, unless the database is in memory.
    pub fn outbox_dir(&self) -> Option<&Path> {
        self.inner.outbox_dir.as_deref()
    }

    pub fn config(&self) -> &LocalConfig {
        &self.inner.config
    }

    /// Start injecting the config's faults (none without a [`FaultSpec`]).
    pub fn arm_faults(&self) {
        if let Some(faults) = &self.inner.faults {
            faults.arm();
        }
    }

    /// The faults injected so far, by kind (empty without a [`FaultSpec`]).
    pub fn fault_counts(&self) -> std::collections::BTreeMap<FaultKind, u64> {
        self.inner.faults.as_ref().map(|f| f.counts()).unwrap_or_default()
    }

    fn now(&self) -> DateTime<Utc> {
        self.inner.config.clock.now()
    }

    /// Run `f` on the connection's thread, in a transaction with whatever else is queued;
    /// an `Err` from `f` undoes its writes. Answers once the transaction has committed.
    /// `f` may run twice (the second time from the same state): when another call of its
    /// transaction fails, [`each_alone`] runs them all again.
    async fn with_conn<T, F>(&self, what: &'static str, f: F) -> PortResult<T>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> PortResult<T> + Send + 'static,
    {
        self.call(what, Access::Write, f).await
    }

    /// [`with_conn`](Self::with_conn) for a write whose answer an injected fault never
    /// loses: an email's row (an email has no idempotency key, and a caller told it failed
    /// sends it again).
    async fn with_conn_kept<T, F>(&self, what: &'static str, f: F) -> PortResult<T>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> PortResult<T> + Send + 'static,
    {
        self.call(what, Access::WriteKept, f).await
    }

    /// Run `f`, which only reads, on the reading connection (see the crate's doc): it sees
    /// what has committed, never what a failed batch undid.
    async fn with_read<T, F>(&self, what: &'static str, f: F) -> PortResult<T>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> PortResult<T> + Send + 'static,
    {
        self.call(what, Access::Read, f).await
    }

    /// Queue `f` for the writing or the reading connection. `f` is `Fn` because a write may
    /// run twice ([`each_alone`]); reads take the same bound, so one [`Call`] serves both.
    ///
    /// With a [`FaultSpec`], a call may fail before it is queued, and a write's answer may
    /// be lost after it committed (see `faults`).
    async fn call<T, F>(&self, what: &'static str, access: Access, f: F) -> PortResult<T>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> PortResult<T> + Send + 'static,
    {
        let fate = match &self.inner.faults {
            Some(faults) => faults.fate(access == Access::Write),
            None => faults::Fate::default(),
        };
        if fate.fail {
            self.fired(FaultKind::CallError, what);
            return Err(faults::call_error(what));
        }
        let stopped = || PortError::permanent(what, "the database thread has stopped");
        let jobs = match (&self.inner.reads, access) {
            (Some(reads), Access::Read) => Some(reads),
            _ => self.inner.jobs.as_ref(),
        };
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Call {
            what,
            f,
            result: None,
            reply,
            watch: fate.watch,
            rows: 0,
        });
        jobs.ok_or_else(stopped)?.send(job).map_err(|_| stopped())?;
        let (answer, rows) = answer.await.map_err(|_| stopped())?;
        if fate.lose && rows > 0 && answer.is_ok() {
            self.fired(FaultKind::LostAnswer, what);
            return Err(faults::lost_answer(what));
        }
        answer
    }

    /// Count an injected fault (there is an injector: only it decides one).
    fn fired(&self, kind: FaultKind, what: &str) {
        if let Some(faults) = &self.inner.faults {
            faults.fired(kind, what);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel ends the thread; waiting for it closes the database before
        // anyone reopens it (or the temp dir goes).
        self.reads.take();
        self.jobs.take();
        for thread in [self.reader.take(), self.thread.take()].into_iter().flatten() {
            let _ = thread.join();
        }
    }
}

/// Which connection a call goes to, and what an injected fault may do to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// The reading connection (the writing one in memory).
    Read,
    /// The writing connection.
    Write,
    /// The writing connection, and its answer is never lost (see `with_conn_kept`).
    WriteKept,
}

/// One call waiting for the connection.
trait Job: Send {
    /// Run inside the batch's transaction (a write perhaps twice: see [`each_alone`]);
    /// `false` when the call failed and its writes must be undone.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answer the caller, once the batch's fate is known.
    fn finish(self: Box<Self>, batch: &Result<(), BatchFailure>);
    /// What the call does, and the rows its last run wrote (0 unless watched).
    fn written(&self) -> (&'static str, u64);
}

struct Call<T, F> {
    what: &'static str,
    f: F,
    result: Option<PortResult<T>>,
    /// The answer, and the rows the call wrote (when watched).
    reply: oneshot::Sender<(PortResult<T>, u64)>,
    /// Count the rows it writes: only for injected faults.
    watch: bool,
    rows: u64,
}

impl<T, F> Job for Call<T, F>
where
    T: Send,
    F: Fn(&Connection) -> PortResult<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        // A bug in one call must not take the thread (and every later call) down with it.
        let (what, f) = (self.what, &self.f);
        let before = if self.watch { conn.total_changes() } else { 0 };
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(conn)))
            .unwrap_or_else(|_| Err(PortError::permanent(what, "the database call panicked")));
        if self.watch {
            self.rows = conn.total_changes().saturating_sub(before);
        }
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn finish(self: Box<Self>, batch: &Result<(), BatchFailure>) {
        let answer = match (self.result, batch) {
            // A failed call reports its own error; nothing of it was kept either way.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(failure)) => Err(failure.to_port_error(self.what)),
            (None, Ok(())) => Err(PortError::permanent(self.what, "the call never ran")),
        };
        // The caller may have gone away (its future dropped); nothing to tell then.
        let _ = self.reply.send((answer, self.rows));
    }

    fn written(&self) -> (&'static str, u64) {
        (self.what, self.rows)
    }
}

/// Why a whole batch failed; each caller gets it as its own `PortError`.
struct BatchFailure {
    retryable: bool,
    message: String,
}

impl BatchFailure {
    fn of(e: rusqlite::Error) -> Self {
        let retryable = matches!(
            e.sqlite_error_code(),
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
        );
        Self {
            retryable,
            message: e.to_string(),
        }
    }

    fn to_port_error(&self, what: &'static str) -> PortError {
        if self.retryable {
            PortError::retryable(what, self.message.clone())
        } else {
            PortError::permanent(what, self.message.clone())
        }
    }
}

/// How a connection's thread runs what has queued as one transaction.
type RunBatch = fn(&Connection, &mut [Box<dyn Job>]) -> Result<(), BatchFailure>;

/// A connection's thread: take what has queued, run it as one transaction (`run_batch` on
/// the writing connection, `run_reads` on the reading one), answer. With an injector, a
/// commit may abort the process before it is answered (`abort-after-rows`).
fn serve(conn: Connection, queue: mpsc::Receiver<Box<dyn Job>>, run: RunBatch, faults: Option<Arc<faults::Injector>>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let outcome = run(&conn, &mut batch);
        if let (Ok(()), Some(faults)) = (&outcome, &faults) {
            faults.committed(batch.iter().map(|job| job.written()));
        }
        for job in batch {
            job.finish(&outcome);
        }
    }
}

/// Reads in one read transaction, so a call that reads several rows sees them as of one
/// commit.
fn run_reads(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Result<(), BatchFailure> {
    run_cached(conn, "BEGIN").map_err(BatchFailure::of)?;
    for job in batch.iter_mut() {
        job.run(conn);
    }
    // Ending a read transaction writes nothing; a failure here changes no answer.
    let _ = run_cached(conn, "COMMIT");
    Ok(())
}

fn run_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Result<(), BatchFailure> {
    // IMMEDIATE takes the write lock up front (waiting up to the busy timeout for another
    // process), so no statement inside can meet SQLITE_BUSY halfway.
    run_cached(conn, "BEGIN IMMEDIATE").map_err(BatchFailure::of)?;
    let ran = each_alone(conn, batch.len(), |i| if batch[i].run(conn) { Ok(()) } else { Err(()) });
    match ran.and_then(|_| run_cached(conn, "COMMIT")) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(BatchFailure::of(e))
        }
    }
}

/// Run `f` for items `0..n` in order, each all or nothing: a failed item's writes are
/// undone, and only its own. The results, in order.
///
/// A savepoint around each item would do that, at a price paid on every item: a savepoint
/// saves each page its item changes before changing it, and that was a fifth of the
/// database thread's time under load (the delivery bench, `make bench`). Items nearly always
/// succeed, so they first run together inside one savepoint; only if one fails is that
/// rolled back and all of them run again, each in a savepoint of its own. So `f` may run an
/// item twice, the second time from the state before the first.
pub(crate) fn each_alone<T, E>(
    conn: &Connection,
    n: usize,
    mut f: impl FnMut(usize) -> Result<T, E>,
) -> rusqlite::Result<Vec<Result<T, E>>> {
    run_cached(conn, "SAVEPOINT together")?;
    let mut results = Vec::with_capacity(n);
    for i in 0..n {
        match f(i) {
            Ok(value) => results.push(Ok(value)),
            Err(_) => {
                run_cached(conn, "ROLLBACK TO together")?;
                results = (0..n)
                    .map(|i| in_savepoint(conn, || f(i)))
                    .collect::<rusqlite::Result<_>>()?;
                break;
            }
        }
    }
    run_cached(conn, "RELEASE together")?;
    Ok(results)
}

/// Run `f` in a savepoint: when it fails, its writes are undone and nothing else.
fn in_savepoint<T, E>(conn: &Connection, f: impl FnOnce() -> Result<T, E>) -> rusqlite::Result<Result<T, E>> {
    run_cached(conn, "SAVEPOINT alone")?;
    let result = f();
    if result.is_err() {
        run_cached(conn, "ROLLBACK TO alone")?;
    }
    run_cached(conn, "RELEASE alone")?;
    Ok(result)
}

/// A statement without parameters or rows, prepared once: a batch runs a few per call, and
/// parsing them each time was a good part of the connection thread's work.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// Removes a temp data dir.
struct TempDirGuard(PathBuf);

impl Drop for TempDirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A busy or locked database may work on the next try; anything else will not.
pub(crate) fn db_err(what: impl Into<String>, e: rusqlite::Error) -> PortError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => PortError::retryable(what, e),
        _ => PortError::permanent(what, e),
    }
}

pub(crate) fn is_constraint_violation(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation)
}

/// Time as an integer column: nanoseconds since the epoch, so ordering matches
/// `DateTime`'s to the nanosecond. Times beyond 1677..2262 clamp to the ends.
pub(crate) fn nanos(t: DateTime<Utc>) -> i64 {
    t.timestamp_nanos_opt()
        .unwrap_or(if t.timestamp() < 0 { i64::MIN } else { i64::MAX })
}

pub(crate) fn from_nanos(n: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(n)
}

pub(crate) fn to_json<T: Serialize>(what: &'static str, value: &T) -> PortResult<String> {
    serde_json::to_string(value).map_err(|e| PortError::permanent(format!("encode {what}"), e))
}

/// A row that does not decode is corrupt data: a permanent error, never a panic.
pub(crate) fn from_json<T: DeserializeOwned>(what: &'static str, text: &str) -> PortResult<T> {
    serde_json::from_str(text).map_err(|e| PortError::permanent(format!("decode a stored {what}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::ffi;

    #[test]
    fn busy_and_locked_databases_are_retryable_and_other_errors_permanent() {
        let busy = rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_BUSY), None);
        let locked = rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_LOCKED), None);
        let corrupt = rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_CORRUPT), None);
        assert!(matches!(db_err("x", busy), PortError::Retryable { .. }));
        assert!(matches!(db_err("x", locked), PortError::Retryable { .. }));
        assert!(matches!(db_err("x", corrupt), PortError::Permanent { .. }));
        assert!(matches!(
            db_err("x", rusqlite::Error::QueryReturnedNoRows),
            PortError::Permanent { .. }
        ));
    }

    #[test]
    fn nanosecond_columns_round_trip_and_clamp_out_of_range_times() {
        let t = DateTime::parse_from_rfc3339("2031-02-03T04:05:06.123456789Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(from_nanos(nanos(t)), t);
        let far = DateTime::parse_from_rfc3339("9999-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(nanos(far), i64::MAX);
    }

    /// A connection with a table `t (n INTEGER PRIMARY KEY)`, in a transaction.
    fn table_in_transaction() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY); BEGIN")
            .unwrap();
        conn
    }

    fn rows(conn: &Connection) -> Vec<i64> {
        let mut stmt = conn.prepare("SELECT n FROM t ORDER BY n").unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    /// Item `i` inserts `10 * i` and `10 * i + 1`, counting its runs; it fails after its
    /// first insert when `fails(i)`.
    fn insert_pairs<'a>(
        conn: &'a Connection,
        runs: &'a mut [u32],
        fails: impl Fn(usize) -> bool + 'a,
    ) -> impl FnMut(usize) -> Result<usize, String> + 'a {
        move |i| {
            runs[i] += 1;
            let n = 10 * i as i64;
            conn.execute("INSERT INTO t (n) VALUES (?1)", [n])
                .map_err(|e| e.to_string())?;
            if fails(i) {
                return Err(format!("item {i} failed"));
            }
            conn.execute("INSERT INTO t (n) VALUES (?1)", [n + 1])
                .map_err(|e| e.to_string())?;
            Ok(i)
        }
    }

    #[test]
    fn items_that_all_succeed_run_once_each() {
        let conn = table_in_transaction();
        let mut runs = [0; 3];
        let results = each_alone(&conn, 3, insert_pairs(&conn, &mut runs, |_| false)).unwrap();
        assert_eq!(results, vec![Ok(0), Ok(1), Ok(2)]);
        assert_eq!(runs, [1, 1, 1]);
        assert_eq!(rows(&conn), [0, 1, 10, 11, 20, 21]);
    }

    #[test]
    fn a_failed_item_undoes_only_its_own_writes_and_the_rest_run_again_from_the_start() {
        let conn = table_in_transaction();
        let mut runs = [0; 4];
        let results = each_alone(&conn, 4, insert_pairs(&conn, &mut runs, |i| i == 1 || i == 3)).unwrap();
        assert_eq!(
            results,
            vec![Ok(0), Err("item 1 failed".into()), Ok(2), Err("item 3 failed".into())]
        );
        // Items 0 and 1 ran together first; after 1 failed, all four ran alone.
        assert_eq!(runs, [2, 2, 1, 1]);
        assert_eq!(
            rows(&conn),
            [0, 1, 20, 21],
            "the failed items' first inserts are undone"
        );
        // Everything is still in the caller's transaction, under its control.
        conn.execute_batch("ROLLBACK").unwrap();
        assert!(rows(&conn).is_empty());
    }

    #[test]
    fn a_failed_call_in_a_batch_undoes_only_its_own_writes() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY)").unwrap();
        let call = |n: i64, fail: bool| -> Box<dyn Job> {
            let (reply, _answer) = oneshot::channel();
            Box::new(Call {
                what: "insert",
                f: move |conn: &Connection| {
                    conn.execute("INSERT INTO t (n) VALUES (?1)", [n])
                        .map_err(|e| db_err("insert", e))?;
                    if fail {
                        return Err(PortError::permanent("insert", "refused"));
                    }
                    Ok(())
                },
                result: None,
                reply,
                watch: false,
                rows: 0,
            })
        };
        let mut batch = vec![call(1, false), call(2, true), call(3, false)];
        assert!(run_batch(&conn, &mut batch).is_ok());
        assert_eq!(rows(&conn), [1, 3], "committed without the failed call's insert");
    }

    #[test]
    fn temp_backends_remove_their_directory_when_dropped() {
        let backend = LocalBackend::open_temp().unwrap();
        let dir = backend.data_dir().unwrap().to_owned();
        assert!(dir.join(DB_FILE).exists());
        assert!(dir.join(OUTBOX_DIR).is_dir());
        drop(backend);
        assert!(!dir.exists());
    }
}
