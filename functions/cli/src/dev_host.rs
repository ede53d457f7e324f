//! What `hookwise dev` shares between its two modes, the embedded store (`dev.rs`) and AWS
//! APIs (`dev_aws.rs`): the common flags, and everything after the adapters are built (the
//! default tenant, the ready lines, running every role until Ctrl-C or SIGTERM). It knows
//! neither mode: both depend on it, not the other way round.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hookwise_core::model::{Email, Tenant, TenantId};
use hookwise_core::ports::QueueConsumer;
use hookwise_core::services::{NewTenant, Services};
use hookwise_core::Error;
use hookwise_runner::{run_host, CancellationToken, HostConfig};
use ipnet::IpNet;
use tokio::net::TcpListener;

/// Delivery batches handled at once. A batch whose attempts wait for their rate-limit slots
/// (a second at most) must not hold up the next: with four at once, one worker paces up to
/// ~128 attempts a second.
const BATCHES_IN_FLIGHT: usize = 4;

/// The flags both modes take.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Address for the API (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The default tenant's API key; else one is generated (and, on the embedded store,
    /// kept in the data dir).
    #[arg(long, env = "HOOKWISE_API_KEY")]
    pub api_key: Option<String>,
    /// Who the default tenant's dead-delivery emails go to.
    #[arg(long, default_value = "owner@example.com", value_parser = |s: &str| Email::parse(s).map_err(|e| e.to_string()))]
    pub owner_email: Email,
    /// Let deliveries reach this otherwise refused range (repeatable), e.g. 10.0.0.0/8.
    #[arg(long = "allow-target-cidr", value_name = "CIDR")]
    pub allow_target_cidr: Vec<IpNet>,
    /// Refuse loopback targets too, as a deployment does.
    #[arg(long)]
    pub deny_loopback: bool,
    /// Seconds between scheduler ticks (moving due retries, sweeping overdue deliveries).
    #[arg(long, default_value_t = 1)]
    pub scheduler_interval: u64,
    /// The queue's longest delay; later retries wait in the scheduler table (SQS: 900).
    #[arg(long, default_value_t = 900, hide = true)]
    pub max_queue_delay: u32,
    /// Deliveries handled at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Seconds an owner waits between dead-delivery emails (default 300; with `--aws` and no
    /// `--provision`, HOOKWISE_DIGEST_WINDOW_SECONDS).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub digest_window: Option<u64>,
    /// Let the API and the dashboard show an endpoint's signing secret again after it is
    /// made (`POST /v1/subscriptions/{id}/reveal-secret`); else only rotating gives one.
    #[arg(long, env = "HOOKWISE_REVEAL_SECRETS")]
    pub reveal_secrets: bool,
}

impl CommonArgs {
    /// The ranges deliveries may reach: the allowed ones, and loopback unless denied.
    pub fn allowed_targets(&self) -> Vec<IpNet> {
        let mut allow = self.allow_target_cidr.clone();
        if !self.deny_loopback {
            allow.extend([
                "127.0.0.0/8".parse::<IpNet>().expect("a CIDR"),
                "::1/128".parse().expect("a CIDR"),
            ]);
        }
        allow
    }

    /// The most attempts in flight at once, and so the idle connections worth keeping per
    /// endpoint: fewer, and a busy endpoint's connections are closed and opened again.
    pub fn attempts_in_flight(&self) -> usize {
        self.concurrency.max(1) * BATCHES_IN_FLIGHT
    }

    pub async fn bind(&self) -> anyhow::Result<(TcpListener, SocketAddr)> {
        let listener = TcpListener::bind(self.listen)
            .await
            .with_context(|| format!("listen on {}", self.listen))?;
        let addr = listener.local_addr()?;
        Ok((listener, addr))
    }
}

/// The tenant `hookwise dev` serves: the one with `key`, created if there is none.
pub async fn ensure_tenant(services: &Services, key: &str, owner: &Email) -> anyhow::Result<Tenant> {
    match services.authenticate(key).await {
        Ok(tenant) => Ok(tenant),
        Err(Error::Unauthorized) => services
            .create_tenant_with_key(NewTenant::named("dev", owner.clone()), key)
            .await
            .context("create the dev tenant"),
        Err(e) => Err(e).context("look up the dev tenant"),
    }
}

/// A mode's adapters, ready to run.
pub struct Ready<D, L> {
    pub services: Arc<Services>,
    pub listener: TcpListener,
    pub delivery: D,
    pub dead_letter: L,
    /// The first ready line, e.g. `Hookwise dev: listening on http://…`.
    pub title: String,
    /// The mode's own lines (data dir, tables, queues), as (label, value).
    pub details: Vec<(&'static str, String)>,
    /// The default tenant and its API key.
    pub tenant: TenantId,
    pub api_key: String,
}

/// Print the ready lines, then run every role until Ctrl-C or SIGTERM.
pub async fn serve<D, L>(ready: Ready<D, L>, args: &CommonArgs, receive_wait: Duration) -> anyhow::Result<ExitCode>
where
    D: QueueConsumer + 'static,
    L: QueueConsumer + 'static,
{
    // Before the ready lines: a SIGTERM right after them must stop the process cleanly.
    let stop: CancellationToken = hookwise_runner::cancel_on_signals().context("install the signal handlers")?;
    let portal = hookwise_http::PortalConfig::from_env().map_err(anyhow::Error::msg)?;
    let addr = ready.listener.local_addr()?;
    let key = &ready.api_key;
    println!("{}", ready.title);
    for (label, value) in &ready.details {
        println!("{:<14}{value}", format!("{label}:"));
    }
    println!("tenant:       {}", ready.tenant);
    println!("API key:      {key}");
    println!("dashboard:    http://{addr}/dashboard");
    // A day's portal link for the default tenant: the dashboard as its customer sees it.
    let tenant = ready
        .services
        .tenant(&ready.tenant)
        .await
        .context("read the default tenant")?;
    let (_, token) = ready
        .services
        .create_portal_session(&tenant, Some(hookwise_core::services::PORTAL_SESSION_MAX), false)
        .await
        .context("make the default tenant's portal link")?;
    println!("portal:       http://{addr}/portal#token={token}");
    println!("try:          curl -H 'Authorization: Bearer {key}' http://{addr}/v1/subscriptions");
    if !args.deny_loopback {
        eprintln!(
            "warning: deliveries to loopback (127.0.0.0/8, ::1) are allowed in dev; --deny-loopback refuses them"
        );
    }
    let config = HostConfig {
        batch_size: 32,
        receive_wait,
        batches_in_flight: BATCHES_IN_FLIGHT,
        scheduler_tick: Duration::from_secs(args.scheduler_interval.max(1)),
        portal,
    };
    run_host(
        ready.services,
        ready.listener,
        ready.delivery,
        ready.dead_letter,
        config,
        stop,
    )
    .await?;
    eprintln!("stopped");
    Ok(ExitCode::SUCCESS)
}
