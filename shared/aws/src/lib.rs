//! Hookwise on AWS: the core's ports on DynamoDB, SQS and SES v2.
//!
//! - [`DynamoStore`]: the main table (single-table design, see [`store`] for the keys).
//! - [`DynamoScheduler`]: the scheduler table, one partition per due minute.
//! - [`SqsQueue`]: the delivery queue (`DelaySeconds` up to 900) and its dead-letter queue.
//! - [`SesMailer`]: SES v2 `SendEmail` from a configured address.
//! - [`KmsSecrets`]: signing secrets sealed with the stack's KMS key.
//!
//! Build the SDK clients once per Lambda container with [`AwsClients::from_env`], the
//! adapters with [`AwsAdapters::new`], and hand [`AwsAdapters::ports`] to the services.
//! Every SDK error keeps its kind on the way out: a failed condition is
//! [`PortError::ConditionFailed`](hookwise_core::PortError), throttling, 5xx and timeouts are
//! `Retryable`, the rest `Permanent`.

#[cfg(feature = "provision")]
pub mod bootstrap;
pub mod config;
pub mod counter;
mod error;
mod item;
pub mod lazy_client;
pub mod mailer;
pub mod metrics;
pub mod queue;
mod recent;
pub mod scheduler;
pub mod secrets;
pub mod services;
pub mod sqs_event;
pub mod store;

use std::sync::Arc;

use hookwise_core::ports::{Clock, Sender};
use hookwise_core::services::Ports;

pub use config::{env, AwsClients, AwsConfig, ConfigError, FunctionConfig};
pub use counter::{stored_bytes, RequestCounter, RequestCounts};
pub use lazy_client::LazyClient;
pub use mailer::SesMailer;
pub use queue::{decode_task, encode_task, SqsConsumer, SqsQueue};
pub use scheduler::DynamoScheduler;
pub use secrets::KmsSecrets;
pub use sqs_event::handle_sqs_event;
pub use store::DynamoStore;

/// The AWS adapters, built once and shared.
#[derive(Clone)]
pub struct AwsAdapters {
    pub store: Arc<DynamoStore>,
    pub scheduler: Arc<DynamoScheduler>,
    pub queue: Arc<SqsQueue>,
    pub mailer: Arc<SesMailer>,
    pub secrets: Arc<KmsSecrets>,
}

impl AwsAdapters {
    pub fn new(clients: &AwsClients, config: &AwsConfig) -> Self {
        Self {
            store: Arc::new(DynamoStore::new(clients.dynamodb.clone(), config).with_counter(clients.counter.clone())),
            scheduler: Arc::new(DynamoScheduler::new(
                clients.dynamodb.clone(),
                &config.scheduler_table,
                config.retention,
            )),
            queue: Arc::new(SqsQueue::new(clients.sqs.clone(), config)),
            mailer: Arc::new(SesMailer::new(clients.sesv2.clone(), &config.sender_email)),
            secrets: Arc::new(KmsSecrets::new(clients.kms.clone(), &config.secrets_key)),
        }
    }

    /// The services' ports: these adapters plus an HTTP sender and a clock.
    pub fn ports(&self, sender: Arc<dyn Sender>, clock: Arc<dyn Clock>) -> Ports {
        Ports {
            store: self.store.clone(),
            queue: self.queue.clone(),
            // SQS and DynamoDB: queued first, then stored.
            store_with_queue: None,
            scheduler: self.scheduler.clone(),
            mailer: self.mailer.clone(),
            secrets: self.secrets.clone(),
            sender,
            clock,
        }
    }
}
