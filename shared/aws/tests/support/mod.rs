//! Shared by the AWS test files: endpoints from the environment, fresh resources made from
//! template.yaml, and a contract backend on them.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use hookwise_aws::bootstrap::{provision, Provisioned, TemplateResources};
use hookwise_aws::{decode_task, AwsAdapters, AwsClients, AwsConfig, RequestCounter};
use hookwise_core::ports::{DeliveryQueue, DeliveryTask, PortResult, SchedulerTable, SecretKeeper, Store};
use hookwise_core::testing::contract::ContractBackend;
use hookwise_core::PortError;

pub const MOTO_URL: &str = "HOOKWISE_TEST_MOTO_URL";
pub const DYNAMODB_LOCAL_URL: &str = "HOOKWISE_TEST_DYNAMODB_LOCAL_URL";
/// Set by scripts/aws-test-services.sh: a missing URL is then a failure, not a skip.
pub const REQUIRE: &str = "HOOKWISE_TEST_REQUIRE_AWS";
pub const SENDER: &str = "hookwise@example.com";

/// The URL in `var`, or `None` after saying why the test is skipped. Panics instead when
/// the test script asked for the services.
pub fn endpoint(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var(REQUIRE).is_ok_and(|v| v == "1") => {
            panic!("{var} is not set, but {REQUIRE}=1: scripts/aws-test-services.sh should have started the service")
        }
        _ => {
            eprintln!("SKIPPED: {var} is not set; run `scripts/aws-test-services.sh run -- cargo test -p hookwise-aws` to test on moto and DynamoDB Local");
            None
        }
    }
}

pub fn template() -> TemplateResources {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml");
    let yaml = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    TemplateResources::parse(&yaml).expect("template.yaml parses")
}

/// A prefix no other test (or test run on the same server) uses.
pub fn unique_prefix() -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "hwt-{}-{:x}-{}",
        std::process::id(),
        nanos % 0xffff_ffff,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Tables on `dynamodb_url`, queues and SES on `moto_url` (DynamoDB Local has no SQS).
pub struct Env {
    pub clients: AwsClients,
    pub provisioned: Provisioned,
    pub config: AwsConfig,
    pub adapters: AwsAdapters,
    pub moto_url: String,
}

pub async fn env(moto_url: &str, dynamodb_url: &str, counter: Option<&RequestCounter>) -> Env {
    let moto = AwsClients::for_endpoint(moto_url, counter).await;
    let dynamodb = AwsClients::for_endpoint(dynamodb_url, counter).await;
    let clients = AwsClients {
        dynamodb: dynamodb.dynamodb,
        ..moto
    };
    let provisioned = provision(&clients, &template(), &unique_prefix())
        .await
        .expect("tables and queues from template.yaml");
    let config = hookwise_aws::AwsConfig {
        queue_max_delay_seconds: 5,
        ..provisioned.config(SENDER)
    };
    let adapters = AwsAdapters::new(&clients, &config);
    Env {
        clients,
        provisioned,
        config,
        adapters,
        moto_url: moto_url.to_owned(),
    }
}

pub struct AwsBackend {
    pub env: Env,
}

impl AwsBackend {
    async fn drain(&self, url: &str) -> PortResult<Vec<DeliveryTask>> {
        let sqs = &self.env.clients.sqs;
        let mut tasks = Vec::new();
        loop {
            let out = sqs
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .send()
                .await
                .map_err(|e| PortError::retryable("receive", e))?;
            let messages = out.messages.unwrap_or_default();
            if messages.is_empty() {
                return Ok(tasks);
            }
            for m in messages {
                tasks.push(decode_task(m.body().unwrap_or_default()).map_err(|e| PortError::permanent("decode", e))?);
                sqs.delete_message()
                    .queue_url(url)
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .send()
                    .await
                    .map_err(|e| PortError::retryable("delete", e))?;
            }
        }
    }
}

#[async_trait]
impl ContractBackend for AwsBackend {
    fn store(&self) -> &dyn Store {
        &*self.env.adapters.store
    }
    fn queue(&self) -> &dyn DeliveryQueue {
        &*self.env.adapters.queue
    }
    fn scheduler(&self) -> &dyn SchedulerTable {
        &*self.env.adapters.scheduler
    }
    fn secrets(&self) -> &dyn SecretKeeper {
        &*self.env.adapters.secrets
    }
    async fn take_visible(&self) -> PortResult<Vec<DeliveryTask>> {
        self.drain(&self.env.provisioned.delivery_queue_url).await
    }
    async fn take_dead_letters(&self) -> PortResult<Vec<DeliveryTask>> {
        self.drain(&self.env.provisioned.dead_letter_queue_url).await
    }
    async fn advance(&self, by: Duration) {
        tokio::time::sleep(by).await;
    }
}

/// Everything on moto.
pub async fn moto_backend() -> Option<AwsBackend> {
    let moto = endpoint(MOTO_URL)?;
    Some(AwsBackend {
        env: env(&moto, &moto, None).await,
    })
}

/// Tables on DynamoDB Local, queues on moto.
pub async fn dynamodb_local_env() -> Option<Env> {
    let ddb = endpoint(DYNAMODB_LOCAL_URL)?;
    let moto = endpoint(MOTO_URL)?;
    Some(env(&moto, &ddb, None).await)
}

/// Tables on DynamoDB Local, queues on moto.
pub async fn dynamodb_local_backend() -> Option<AwsBackend> {
    Some(AwsBackend {
        env: dynamodb_local_env().await?,
    })
}
