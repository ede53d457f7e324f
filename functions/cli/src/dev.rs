//! `hookwise dev` on the embedded store: one SQLite file (store, both queues, scheduler
//! table, email outbox) in the data dir, and the HTTP sender. The rest is `dev_host`'s.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hookwise_core::ports::SystemClock;
use hookwise_core::services::{Config, Services};
use hookwise_http::{HttpSender, SenderConfig};
use hookwise_local::{DataDirLock, FaultSpec, LocalBackend, LocalConfig, QueueName, Synchronous};
use rand::SeedableRng;

use crate::dev_host::{ensure_tenant, serve, CommonArgs, Ready};

/// The scheduler's lease holder of `hookwise dev` (local and `--aws`): one name per machine,
/// so a dev restarted after a crash takes back the lease its last run held, without waiting
/// for it. Locally one process owns the data dir; with `--aws`, two devs on one machine and
/// one stack's tables would share the name, and so the lease.
pub(crate) fn dev_scheduler_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "this machine".into());
    format!("hookwise dev on {host}")
}

/// Where `hookwise dev` keeps the key of its default tenant.
const DEV_KEY_FILE: &str = "dev-api-key";
/// How long an idle worker waits for a message before looking again (and for shutdown).
const RECEIVE_WAIT: Duration = Duration::from_millis(500);

/// The flags of the embedded-store mode.
#[derive(clap::Args, Debug, Clone)]
pub struct LocalArgs {
    /// Where the SQLite file and the email outbox live (not with --aws).
    #[arg(long, default_value = ".hookwise", conflicts_with = "aws")]
    pub data_dir: PathBuf,
    /// Seconds a received message stays hidden before it is redelivered (if its handler died).
    /// With --aws the queue's own visibility timeout applies (template.yaml's).
    #[arg(long, default_value_t = 120, conflicts_with = "aws")]
    pub visibility_timeout: u64,
    /// SQLite's `synchronous`: `full` (every commit is on disk before it is answered) or
    /// `normal` (survives a killed process, not a power cut; for measuring what `full` costs).
    #[arg(long, default_value = "full", value_parser = synchronous, conflicts_with = "aws", hide = true)]
    pub synchronous: Synchronous,
    /// Faults to inject into the store's and the queues' calls once serving, for the chaos
    /// suite: `seed=N,call-error=P,lost-answer=P,duplicate=P,early=P,abort-after-rows=N`
    /// (hookwise-local's `faults` module); each fired fault is a line of `<data-dir>/faults.log`.
    #[arg(long, value_name = "SPEC", value_parser = |s: &str| s.parse::<FaultSpec>(), conflicts_with = "aws", hide = true)]
    pub faults: Option<FaultSpec>,
}

fn synchronous(value: &str) -> Result<Synchronous, String> {
    match value {
        "full" => Ok(Synchronous::Full),
        "normal" => Ok(Synchronous::Normal),
        other => Err(format!("`{other}` is not `full` or `normal`")),
    }
}

pub async fn run(args: CommonArgs, local: LocalArgs) -> anyhow::Result<ExitCode> {
    // Held until the process ends: one `hookwise dev` per data dir.
    let _owner = DataDirLock::acquire(&local.data_dir)?;
    let config = LocalConfig {
        max_delay_seconds: args.max_queue_delay,
        synchronous: local.synchronous,
        faults: local.faults.clone(),
        ..LocalConfig::default()
    };
    let backend = LocalBackend::open_with(&local.data_dir, config)
        .with_context(|| format!("open the data dir {}", local.data_dir.display()))?;
    // What the previous owner had received and not finished (it was killed) goes again now,
    // not after its visibility timeout.
    let released = backend
        .release_in_flight()
        .await
        .context("release the previous run's messages")?;
    if released > 0 {
        eprintln!("{released} message(s) the previous run had in hand are queued again");
    }
    let sender = HttpSender::new(SenderConfig {
        allow_cidrs: args.allowed_targets(),
        max_idle_per_host: args.attempts_in_flight(),
        ..SenderConfig::default()
    })?;
    let (listener, addr) = args.bind().await?;

    let ports = backend.ports(Arc::new(sender), Arc::new(SystemClock));
    let defaults = Config::default();
    let config = Config {
        deliver_concurrency: args.concurrency,
        public_api_url: format!("http://{addr}"),
        digest_window: args.digest_window.map_or(defaults.digest_window, Duration::from_secs),
        scheduler_holder: Some(dev_scheduler_holder()),
        reveal_secrets: args.reveal_secrets,
        ..defaults
    };
    let services = Arc::new(Services::new(ports, config, rand::rngs::StdRng::from_os_rng()));
    let api_key = kept_api_key(&local.data_dir, args.api_key.as_deref())?;
    let tenant = ensure_tenant(&services, &api_key, &args.owner_email).await?.id;

    // Faults from here on: the start-up above never meets one.
    backend.arm_faults();
    let mut details = vec![("data dir", local.data_dir.display().to_string())];
    if let Some(spec) = &local.faults {
        details.push(("faults", spec.to_string()));
    }

    let visibility = Duration::from_secs(local.visibility_timeout);
    let ready = Ready {
        services,
        listener,
        delivery: backend.consumer(QueueName::Delivery, visibility),
        dead_letter: backend.consumer(QueueName::DeadLetter, visibility),
        title: format!("Hookwise dev: listening on http://{addr}"),
        details,
        tenant,
        api_key,
    };
    serve(ready, &args, RECEIVE_WAIT).await
}

/// The default tenant's key: from `--api-key`, or the data dir, or generated; kept in the
/// data dir either way.
fn kept_api_key(data_dir: &Path, given: Option<&str>) -> anyhow::Result<String> {
    let key_file = data_dir.join(DEV_KEY_FILE);
    let kept = std::fs::read_to_string(&key_file).ok().map(|k| k.trim().to_owned());
    let key = match (given, &kept) {
        (Some(k), _) => k.to_owned(),
        (None, Some(k)) => k.clone(),
        (None, None) => hookwise_core::auth::generate_api_key(&mut rand::rngs::StdRng::from_os_rng()),
    };
    if kept.as_deref() != Some(key.as_str()) {
        std::fs::write(&key_file, &key).with_context(|| format!("write {}", key_file.display()))?;
    }
    Ok(key)
}
