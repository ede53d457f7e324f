//! The scheduler tick (every minute on AWS): move retries due within the horizon from the
//! scheduler table to the queue with their residual delay, then re-queue deliveries left
//! pending or retrying past their due time (an enqueue that failed after a write).

use chrono::Duration;

use super::Services;
use crate::error::{PortError, Result};
use crate::state::{next_task, requeued};

/// Items handled per query.
const PAGE: u32 = 500;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerReport {
    /// Scheduled retries moved to the queue.
    pub moved: usize,
    /// Overdue deliveries re-queued by the sweep.
    pub requeued: usize,
}

impl Services {
    #[tracing::instrument(name = "scheduler_tick", skip_all, err)]
    pub async fn run_scheduler(&self) -> Result<SchedulerReport> {
        let moved = self.move_due_retries().await?;
        let requeued = self.sweep_overdue().await?;
        if moved + requeued > 0 {
            tracing::info!(moved, requeued, "scheduler tick");
        }
        Ok(SchedulerReport { moved, requeued })
    }

    async fn move_due_retries(&self) -> Result<usize> {
        let max_delay = self.ports.queue.max_delay_seconds();
        // Move only what the queue can hold until it is due: a longer residual delay would be
        // cut to the queue's limit and the retry would come early.
        let horizon = Duration::from_std(self.config.scheduler_horizon)
            .unwrap_or(Duration::minutes(15))
            .min(Duration::seconds(i64::from(max_delay)));
        let mut moved = 0;
        loop {
            let now = self.now();
            let due = self.ports.scheduler.due(now + horizon, PAGE).await?;
            if due.is_empty() {
                return Ok(moved);
            }
            let tasks: Vec<_> = due
                .iter()
                .map(|item| {
                    let residual = ((item.due - now).num_milliseconds().max(0) as u64)
                        .div_ceil(1000)
                        .min(u64::from(max_delay));
                    (item.task.clone(), residual as u32)
                })
                .collect();
            // Queue first, then delete: a crash between the two duplicates a message (which
            // the conditional writes absorb) rather than losing one.
            self.ports.queue.enqueue(&tasks).await?;
            self.ports.scheduler.remove(&due).await?;
            moved += due.len();
            if due.len() < PAGE as usize {
                return Ok(moved);
            }
        }
    }

    async fn sweep_overdue(&self) -> Result<usize> {
        let now = self.now();
        let grace = Duration::from_std(self.config.sweep_grace).unwrap_or(Duration::minutes(5));
        let overdue = self.ports.store.overdue_deliveries(now - grace, PAGE).await?;
        let mut tasks = Vec::new();
        for delivery in overdue {
            match self.ports.store.apply_change(&requeued(&delivery, now)).await {
                Ok(()) => tasks.push((next_task(&delivery), 0)),
                Err(PortError::ConditionFailed(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        self.ports.queue.enqueue(&tasks).await?;
        Ok(tasks.len())
    }
}
