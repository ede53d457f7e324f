//! One process, every role: the API, the delivery worker, the dead-letter worker and the
//! scheduler tick, on whatever adapters the host built, until shutdown.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use hookwise_core::ports::QueueConsumer;
use hookwise_core::services::{QueueRole, Services};
use hookwise_http::{router, ApiState};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::worker::{run_worker, ServicesHandler, WorkerConfig};

#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Messages per receive, on both queues.
    pub batch_size: usize,
    /// How long a receive waits for a first message.
    pub receive_wait: Duration,
    /// Batches handled at once, per queue.
    pub batches_in_flight: usize,
    /// Between scheduler runs (moving due retries, sweeping overdue deliveries).
    pub scheduler_tick: Duration,
    /// The customer portal's framing and branding.
    pub portal: hookwise_http::PortalConfig,
}

/// A token cancelled on Ctrl-C or SIGTERM. The handlers are installed when this is called,
/// not later: call it before announcing readiness, or a SIGTERM sent right after the
/// announcement would kill the process instead of stopping it.
pub fn cancel_on_signals() -> io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let cancel = token.clone();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            cancel.cancel();
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        cancel.cancel();
    });
    Ok(token)
}

/// Serve the API on `listener` and drain both queues, with a scheduler tick, until `stop`
/// is cancelled; then stop taking work, finish the batches and requests in hand, and return.
pub async fn run_host<D, L>(
    services: Arc<Services>,
    listener: TcpListener,
    delivery: D,
    dead_letter: L,
    config: HostConfig,
    stop: CancellationToken,
) -> io::Result<()>
where
    D: QueueConsumer + 'static,
    L: QueueConsumer + 'static,
{
    let worker = |name, role| {
        let handler = ServicesHandler {
            services: services.clone(),
            role,
        };
        let config = WorkerConfig {
            name,
            batch_size: config.batch_size,
            wait: config.receive_wait,
            batches_in_flight: config.batches_in_flight,
        };
        (handler, config, stop.clone())
    };
    let (handler, worker_config, token) = worker("delivery", QueueRole::Delivery);
    let delivering = tokio::spawn(run_worker(delivery, handler, worker_config, token));
    let (handler, worker_config, token) = worker("dead-letter", QueueRole::DeadLetter);
    let dead_letters = tokio::spawn(run_worker(dead_letter, handler, worker_config, token));
    let scheduling = tokio::spawn(tick_scheduler(services.clone(), config.scheduler_tick, stop.clone()));

    let api_stop = stop.clone();
    let api = axum::serve(listener, router(ApiState::new(services).with_portal(config.portal)))
        .with_graceful_shutdown(async move { api_stop.cancelled().await });
    let serving = tokio::spawn(async move { api.await });

    stop.cancelled().await;
    tracing::info!("shutting down: finishing the batches in hand");
    serving.await.map_err(io::Error::other)??;
    for role in [delivering, dead_letters, scheduling] {
        role.await.map_err(io::Error::other)?;
    }
    Ok(())
}

/// [`Services::run_scheduler`] every `every`, until `stop`.
pub async fn tick_scheduler(services: Arc<Services>, every: Duration, stop: CancellationToken) {
    let mut interval = tokio::time::interval(every.max(Duration::from_millis(100)));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.cancelled() => return,
        }
        if let Err(error) = services.run_scheduler().await {
            tracing::warn!(%error, "scheduler tick failed; trying again next tick");
        }
    }
}
