//! The in-memory ports the service tests use pass the same contract as the real backends.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hookwise_core::ports::{DeliveryQueue, DeliveryTask, PortResult, SchedulerTable, SecretKeeper, Store};
use hookwise_core::testing::contract::ContractBackend;
use hookwise_core::testing::memory::{ManualClock, MemoryQueue, MemoryScheduler, MemorySecrets, MemoryStore};

struct Memory {
    store: MemoryStore,
    queue: MemoryQueue,
    scheduler: MemoryScheduler,
    secrets: MemorySecrets,
    clock: Arc<ManualClock>,
}

async fn memory() -> Memory {
    let clock = Arc::new(ManualClock::new("2030-06-01T11:00:00Z".parse().expect("a valid time")));
    Memory {
        store: MemoryStore::default(),
        queue: MemoryQueue::new(clock.clone(), 900),
        scheduler: MemoryScheduler::default(),
        secrets: MemorySecrets::default(),
        clock,
    }
}

#[async_trait]
impl ContractBackend for Memory {
    fn store(&self) -> &dyn Store {
        &self.store
    }
    fn queue(&self) -> &dyn DeliveryQueue {
        &self.queue
    }
    fn scheduler(&self) -> &dyn SchedulerTable {
        &self.scheduler
    }
    fn secrets(&self) -> &dyn SecretKeeper {
        &self.secrets
    }
    async fn take_visible(&self) -> PortResult<Vec<DeliveryTask>> {
        Ok(self.queue.take_visible())
    }
    async fn take_dead_letters(&self) -> PortResult<Vec<DeliveryTask>> {
        Ok(self.queue.take_dead())
    }
    async fn advance(&self, by: Duration) {
        self.clock
            .advance(chrono::Duration::from_std(by).expect("a short duration"));
    }
}

hookwise_core::store_contract_tests!(memory());
