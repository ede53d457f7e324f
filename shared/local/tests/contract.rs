//! The backend contract suite, run against SQLite: in memory (one connection) and on a file
//! (where reads go to a second connection).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hookwise_core::ports::{DeliveryQueue, DeliveryTask, PortResult, SchedulerTable, SecretKeeper, Store};
use hookwise_core::testing::contract::ContractBackend;
use hookwise_core::testing::memory::ManualClock;
use hookwise_local::{LocalBackend, LocalConfig, QueueName};

/// A fresh database on a manual clock.
struct Sqlite {
    backend: LocalBackend,
    clock: Arc<ManualClock>,
}

fn sqlite_with(open: fn(LocalConfig) -> PortResult<LocalBackend>) -> Sqlite {
    let clock = Arc::new(ManualClock::new("2030-06-01T11:00:00Z".parse().expect("a valid time")));
    let config = LocalConfig {
        clock: clock.clone(),
        ..LocalConfig::default()
    };
    Sqlite {
        backend: open(config).expect("open"),
        clock,
    }
}

impl Sqlite {
    /// Receive and ack until nothing visible is left.
    async fn take(&self, queue: QueueName) -> PortResult<Vec<DeliveryTask>> {
        let mut tasks = Vec::new();
        loop {
            let batch = match queue {
                QueueName::Delivery => self.backend.receive(10, Duration::from_secs(30)).await?,
                QueueName::DeadLetter => self.backend.receive_dead(10, Duration::from_secs(30)).await?,
            };
            if batch.is_empty() {
                return Ok(tasks);
            }
            let receipts: Vec<_> = batch.iter().map(|r| r.receipt.clone()).collect();
            let acked = match queue {
                QueueName::Delivery => self.backend.ack_many(&receipts).await?,
                QueueName::DeadLetter => self.backend.ack_dead_many(&receipts).await?,
            };
            assert_eq!(acked, receipts.len());
            tasks.extend(batch.into_iter().map(|r| r.task));
        }
    }
}

#[async_trait]
impl ContractBackend for Sqlite {
    fn store(&self) -> &dyn Store {
        &self.backend
    }
    fn sweeps_early_retries(&self) -> bool {
        true
    }
    fn queue(&self) -> &dyn DeliveryQueue {
        &self.backend
    }
    fn scheduler(&self) -> &dyn SchedulerTable {
        &self.backend
    }
    fn secrets(&self) -> &dyn SecretKeeper {
        &self.backend
    }
    async fn take_visible(&self) -> PortResult<Vec<DeliveryTask>> {
        self.take(QueueName::Delivery).await
    }
    async fn take_dead_letters(&self) -> PortResult<Vec<DeliveryTask>> {
        self.take(QueueName::DeadLetter).await
    }
    async fn advance(&self, by: Duration) {
        self.clock
            .advance(chrono::Duration::from_std(by).expect("a short duration"));
    }
}

mod in_memory {
    use super::*;

    async fn sqlite() -> Sqlite {
        sqlite_with(LocalBackend::open_in_memory_with)
    }

    hookwise_core::store_contract_tests!(sqlite());
}

mod on_disk {
    use super::*;

    async fn sqlite() -> Sqlite {
        sqlite_with(LocalBackend::open_temp_with)
    }

    hookwise_core::store_contract_tests!(sqlite());
}
