//! `hookwise dev`: every role in one process on the embedded store — the API, the
//! delivery worker, the scheduler and the dead-letter handler — the same services the
//! Lambda functions run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hookwise_core::model::Email;
use hookwise_core::ports::{DeliveryTask, SystemClock};
use hookwise_core::services::{Config, Ports, Services};
use hookwise_core::Error;
use hookwise_http::{router, ApiState, HttpSender, SenderConfig};
use hookwise_local::{LocalBackend, LocalConfig, QueueName, Received};
use ipnet::IpNet;
use rand::SeedableRng;
use tokio::sync::watch;

/// Where `hookwise dev` keeps the key of its default tenant.
const DEV_KEY_FILE: &str = "dev-api-key";

#[derive(clap::Args)]
pub struct DevArgs {
    /// Address for the API (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where the SQLite file and the email outbox live (not with --aws).
    #[arg(long, default_value = ".hookwise", conflicts_with = "aws")]
    data_dir: PathBuf,
    /// The default tenant's API key; else one is generated once and kept in the data dir.
    #[arg(long, env = "HOOKWISE_API_KEY")]
    api_key: Option<String>,
    /// Who the default tenant's dead-delivery emails go to.
    #[arg(long, default_value = "owner@example.com")]
    owner_email: String,
    /// Let deliveries reach this otherwise refused range (repeatable), e.g. 10.0.0.0/8.
    #[arg(long = "allow-target-cidr", value_name = "CIDR")]
    allow_target_cidr: Vec<IpNet>,
    /// Refuse loopback targets too, as a deployment does.
    #[arg(long)]
    deny_loopback: bool,
    /// Seconds between scheduler ticks (moving due retries, sweeping overdue deliveries).
    #[arg(long, default_value_t = 1)]
    scheduler_interval: u64,
    /// Seconds a received message stays hidden before it is redelivered (if its handler died).
    /// With --aws the queue's own visibility timeout applies (template.yaml's).
    #[arg(long, default_value_t = 120, conflicts_with = "aws")]
    visibility_timeout: u64,
    /// The queue's longest delay; later retries wait in the scheduler table (SQS: 900).
    #[arg(long, default_value_t = 900, hide = true)]
    max_queue_delay: u32,
    /// Deliveries handled at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[command(flatten)]
    aws: crate::dev_aws::AwsFlags,
}

pub async fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    if args.aws.aws {
        let common = crate::dev_aws::Common {
            listen: args.listen,
            api_key: args.api_key.clone(),
            owner_email: args.owner_email.clone(),
            allow_target_cidr: args.allow_target_cidr.clone(),
            deny_loopback: args.deny_loopback,
            scheduler_interval: args.scheduler_interval,
            max_queue_delay: args.max_queue_delay,
            concurrency: args.concurrency,
        };
        return crate::dev_aws::run(common, args.aws).await;
    }
    let owner = Email::parse(&args.owner_email).context("--owner-email")?;
    let mut allow = args.allow_target_cidr.clone();
    if !args.deny_loopback {
        allow.extend(["127.0.0.0/8".parse::<IpNet>()?, "::1/128".parse()?]);
    }

    let backend = LocalBackend::open_with(
        &args.data_dir,
        LocalConfig {
            max_delay_seconds: args.max_queue_delay,
            ..LocalConfig::default()
        },
    )
    .with_context(|| format!("open the data dir {}", args.data_dir.display()))?;
    let sender = HttpSender::new(SenderConfig {
        allow_cidrs: allow,
        ..SenderConfig::default()
    })?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let addr = listener.local_addr()?;

    let backend_arc = Arc::new(backend.clone());
    let ports = Ports {
        store: backend_arc.clone(),
        queue: backend_arc.clone(),
        scheduler: backend_arc.clone(),
        mailer: backend_arc,
        sender: Arc::new(sender),
        clock: Arc::new(SystemClock),
    };
    let config = Config {
        deliver_concurrency: args.concurrency,
        public_api_url: format!("http://{addr}"),
        ..Config::default()
    };
    let services = Arc::new(Services::new(ports, config, rand::rngs::StdRng::from_os_rng()));
    let api_key = default_tenant(&services, &args.data_dir, args.api_key.as_deref(), owner).await?;

    let shutdown = shutdown_signal()?;
    println!("Hookwise dev: listening on http://{addr}");
    println!("data dir:     {}", args.data_dir.display());
    println!("API key:      {api_key}");
    println!("dashboard:    http://{addr}/dashboard");
    println!("try:          curl -H 'Authorization: Bearer {api_key}' http://{addr}/v1/subscriptions");
    if !args.deny_loopback {
        eprintln!(
            "warning: deliveries to loopback (127.0.0.0/8, ::1) are allowed in dev; --deny-loopback refuses them"
        );
    }

    let (stop_tx, stop) = watch::channel(false);
    let visibility = Duration::from_secs(args.visibility_timeout);
    let tick = Duration::from_secs(args.scheduler_interval.max(1));
    let roles = [
        tokio::spawn(delivery_worker(
            services.clone(),
            backend.clone(),
            visibility,
            stop.clone(),
        )),
        tokio::spawn(dead_letter_worker(
            services.clone(),
            backend.clone(),
            visibility,
            stop.clone(),
        )),
        tokio::spawn(scheduler(services.clone(), tick, stop.clone())),
    ];
    serve_until_shutdown(listener, router(ApiState::new(services)), shutdown, stop_tx, roles).await
}

/// Serve the API while the background roles run, until Ctrl-C or SIGTERM; then tell the
/// roles (through `stop_tx`) and the API to stop, and wait for the work in hand to finish.
pub(crate) async fn serve_until_shutdown(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()>,
    stop_tx: watch::Sender<bool>,
    roles: impl IntoIterator<Item = tokio::task::JoinHandle<()>>,
) -> anyhow::Result<ExitCode> {
    let mut api_stop = stop_tx.subscribe();
    let api = axum::serve(listener, app).with_graceful_shutdown(async move { stopped(&mut api_stop).await });
    let api = tokio::spawn(async move { api.await });

    shutdown.await;
    eprintln!("shutting down: finishing the batches in hand");
    let _ = stop_tx.send(true);
    api.await??;
    for role in roles {
        role.await?;
    }
    eprintln!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// The tenant `hookwise dev` serves by default: its key comes from `--api-key`, or the
/// data dir, or is generated and kept there.
async fn default_tenant(
    services: &Services,
    data_dir: &Path,
    given: Option<&str>,
    owner: Email,
) -> anyhow::Result<String> {
    let key_file = data_dir.join(DEV_KEY_FILE);
    let kept = std::fs::read_to_string(&key_file).ok().map(|k| k.trim().to_owned());
    let key = match (given, &kept) {
        (Some(k), _) => k.to_owned(),
        (None, Some(k)) => k.clone(),
        (None, None) => hookwise_core::auth::generate_api_key(&mut rand::rngs::StdRng::from_os_rng()),
    };
    match services.authenticate(&key).await {
        Ok(_) => {}
        Err(Error::Unauthorized) => {
            services
                .create_tenant_with_key("dev", owner, &key)
                .await
                .context("create the dev tenant")?;
        }
        Err(e) => return Err(e).context("look up the dev tenant"),
    }
    if kept.as_deref() != Some(key.as_str()) {
        std::fs::write(&key_file, &key).with_context(|| format!("write {}", key_file.display()))?;
    }
    Ok(key)
}

/// Ctrl-C or SIGTERM. The handlers are installed when this is called, not when the future
/// is first awaited: call it before announcing readiness, or a SIGTERM sent right after the
/// announcement would kill the process instead of stopping it cleanly.
pub(crate) fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt()).context("install the Ctrl-C handler")?;
        let mut term = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

const BATCH: usize = 32;
const IDLE_WAIT: Duration = Duration::from_millis(500);

/// What the deliver Lambda does with an SQS batch: deliver each message, ack the ones that
/// were handled, leave the infrastructure failures to come back after the visibility timeout.
async fn delivery_worker(
    services: Arc<Services>,
    backend: LocalBackend,
    visibility: Duration,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let batch = match backend.receive(BATCH, visibility).await {
            Ok(b) => b,
            Err(err) => {
                tracing::error!(error = %err, "receive from the delivery queue failed");
                idle(&backend, QueueName::Delivery, &mut stop).await;
                continue;
            }
        };
        if batch.is_empty() {
            idle(&backend, QueueName::Delivery, &mut stop).await;
            continue;
        }
        let tasks: Vec<DeliveryTask> = batch.iter().map(|r| r.task.clone()).collect();
        let results = services.deliver_batch(&tasks).await;
        let done: Vec<_> = batch
            .iter()
            .zip(results)
            .filter_map(|(received, result)| match result {
                Ok(_) => Some(received.receipt.clone()),
                Err(err) => {
                    tracing::warn!(delivery_id = %received.task.delivery_id, error = %err, "delivery failed; the message comes back after its visibility timeout");
                    None
                }
            })
            .collect();
        if let Err(err) = backend.ack_many(&done).await {
            tracing::error!(error = %err, "ack failed; those messages will be redelivered (and found stale)");
        }
    }
}

async fn dead_letter_worker(
    services: Arc<Services>,
    backend: LocalBackend,
    visibility: Duration,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let batch: Vec<Received> = match backend.receive_dead(BATCH, visibility).await {
            Ok(b) => b,
            Err(err) => {
                tracing::error!(error = %err, "receive from the dead-letter queue failed");
                idle(&backend, QueueName::DeadLetter, &mut stop).await;
                continue;
            }
        };
        if batch.is_empty() {
            idle(&backend, QueueName::DeadLetter, &mut stop).await;
            continue;
        }
        let tasks: Vec<DeliveryTask> = batch.iter().map(|r| r.task.clone()).collect();
        match services.handle_dead_letters(&tasks).await {
            Ok(report) => {
                if report.emails > 0 {
                    tracing::info!(
                        notified = report.notified,
                        emails = report.emails,
                        "owners told of dead deliveries"
                    );
                }
                let receipts: Vec<_> = batch.iter().map(|r| r.receipt.clone()).collect();
                if let Err(err) = backend.ack_dead_many(&receipts).await {
                    tracing::error!(error = %err, "ack of dead letters failed");
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "dead-letter batch failed; it comes back after its visibility timeout")
            }
        }
    }
}

pub(crate) async fn scheduler(services: Arc<Services>, tick: Duration, mut stop: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stopped(&mut stop) => return,
        }
        if let Err(err) = services.run_scheduler().await {
            tracing::warn!(error = %err, "scheduler tick failed; trying again next tick");
        }
    }
}

/// Sleep until a message may be visible, or shutdown.
async fn idle(backend: &LocalBackend, queue: QueueName, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        result = backend.wait_for_messages(queue, IDLE_WAIT) => {
            if let Err(err) = result {
                tracing::warn!(error = %err, "waiting for messages failed");
                tokio::time::sleep(IDLE_WAIT).await;
            }
        }
        _ = stopped(stop) => {}
    }
}

/// Resolves once shutdown is asked for.
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}
