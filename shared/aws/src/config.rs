//! Configuration: table and queue names from the environment (what `template.yaml` sets), a
//! builder for tests, and the SDK clients built once.

use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::http::SharedHttpClient;

use crate::counter::RequestCounter;

/// The environment variables the functions read. `template.yaml` sets them in `Globals`.
pub mod env {
    /// The main table's name.
    pub const TABLE: &str = "HOOKWISE_TABLE";
    pub const SCHEDULER_TABLE: &str = "HOOKWISE_SCHEDULER_TABLE";
    pub const DELIVERY_QUEUE_URL: &str = "HOOKWISE_DELIVERY_QUEUE_URL";
    pub const DEAD_LETTER_QUEUE_URL: &str = "HOOKWISE_DEAD_LETTER_QUEUE_URL";
    /// The SES v2 identity dead-delivery emails come from.
    pub const SENDER_EMAIL: &str = "HOOKWISE_SENDER_EMAIL";
    /// Optional: lower than 900 only in tests, so the scheduler-table path runs in seconds.
    pub const QUEUE_MAX_DELAY_SECONDS: &str = "HOOKWISE_QUEUE_MAX_DELAY_SECONDS";
    /// Optional: how long events, deliveries and attempts are kept (DynamoDB TTL). 30 by default.
    pub const RETENTION_DAYS: &str = "HOOKWISE_RETENTION_DAYS";
    /// Read by the functions rather than this crate, named here so the template and the
    /// code agree.
    pub const LOG: &str = "HOOKWISE_LOG";
    pub const DEFAULT_RETRY_POLICY: &str = "HOOKWISE_DEFAULT_RETRY_POLICY";
    /// Comma-separated CIDRs the SSRF guard lets deliveries reach.
    pub const ALLOWED_TARGET_CIDRS: &str = "HOOKWISE_ALLOWED_TARGET_CIDRS";
    pub const PUBLIC_API_URL: &str = "HOOKWISE_PUBLIC_API_URL";
}

/// SQS's limit on `DelaySeconds`.
pub const SQS_MAX_DELAY_SECONDS: u32 = 900;
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is not set: template.yaml sets it for every function")]
    Missing(&'static str),
    #[error("{name} is `{value}`: {why}")]
    Invalid {
        name: &'static str,
        value: String,
        why: String,
    },
}

/// Where the adapters find their tables and queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsConfig {
    pub table: String,
    pub scheduler_table: String,
    pub delivery_queue_url: String,
    pub dead_letter_queue_url: String,
    pub sender_email: String,
    /// At most 900 (SQS's limit); retries due later go through the scheduler table.
    pub queue_max_delay_seconds: u32,
    /// TTL of events, deliveries, attempts and notices after their last change.
    pub retention: Duration,
}

impl AwsConfig {
    pub fn builder() -> AwsConfigBuilder {
        AwsConfigBuilder::default()
    }

    /// From the variables in [`env`].
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From any lookup of the variables in [`env`] (a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let required = |name: &'static str| {
            get(name)
                .filter(|v| !v.trim().is_empty())
                .ok_or(ConfigError::Missing(name))
        };
        let mut b = AwsConfig::builder()
            .table(required(env::TABLE)?)
            .scheduler_table(required(env::SCHEDULER_TABLE)?)
            .delivery_queue_url(required(env::DELIVERY_QUEUE_URL)?)
            .dead_letter_queue_url(required(env::DEAD_LETTER_QUEUE_URL)?)
            .sender_email(required(env::SENDER_EMAIL)?);
        if let Some(v) = get(env::QUEUE_MAX_DELAY_SECONDS).filter(|v| !v.is_empty()) {
            let n = v.parse().map_err(|e: std::num::ParseIntError| ConfigError::Invalid {
                name: env::QUEUE_MAX_DELAY_SECONDS,
                value: v.clone(),
                why: e.to_string(),
            })?;
            b = b.queue_max_delay_seconds(n);
        }
        if let Some(v) = get(env::RETENTION_DAYS).filter(|v| !v.is_empty()) {
            let days: u64 = v.parse().map_err(|e: std::num::ParseIntError| ConfigError::Invalid {
                name: env::RETENTION_DAYS,
                value: v.clone(),
                why: e.to_string(),
            })?;
            b = b.retention(Duration::from_secs(days * 24 * 3600));
        }
        b.build()
    }
}

#[derive(Debug, Clone, Default)]
pub struct AwsConfigBuilder {
    table: Option<String>,
    scheduler_table: Option<String>,
    delivery_queue_url: Option<String>,
    dead_letter_queue_url: Option<String>,
    sender_email: Option<String>,
    queue_max_delay_seconds: Option<u32>,
    retention: Option<Duration>,
}

impl AwsConfigBuilder {
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = Some(name.into());
        self
    }
    pub fn scheduler_table(mut self, name: impl Into<String>) -> Self {
        self.scheduler_table = Some(name.into());
        self
    }
    pub fn delivery_queue_url(mut self, url: impl Into<String>) -> Self {
        self.delivery_queue_url = Some(url.into());
        self
    }
    pub fn dead_letter_queue_url(mut self, url: impl Into<String>) -> Self {
        self.dead_letter_queue_url = Some(url.into());
        self
    }
    pub fn sender_email(mut self, from: impl Into<String>) -> Self {
        self.sender_email = Some(from.into());
        self
    }
    pub fn queue_max_delay_seconds(mut self, seconds: u32) -> Self {
        self.queue_max_delay_seconds = Some(seconds);
        self
    }
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    pub fn build(self) -> Result<AwsConfig, ConfigError> {
        let max_delay = self.queue_max_delay_seconds.unwrap_or(SQS_MAX_DELAY_SECONDS);
        if !(1..=SQS_MAX_DELAY_SECONDS).contains(&max_delay) {
            return Err(ConfigError::Invalid {
                name: env::QUEUE_MAX_DELAY_SECONDS,
                value: max_delay.to_string(),
                why: format!("must be 1 to {SQS_MAX_DELAY_SECONDS} (SQS's limit)"),
            });
        }
        Ok(AwsConfig {
            table: self.table.ok_or(ConfigError::Missing(env::TABLE))?,
            scheduler_table: self.scheduler_table.ok_or(ConfigError::Missing(env::SCHEDULER_TABLE))?,
            delivery_queue_url: self
                .delivery_queue_url
                .ok_or(ConfigError::Missing(env::DELIVERY_QUEUE_URL))?,
            dead_letter_queue_url: self
                .dead_letter_queue_url
                .ok_or(ConfigError::Missing(env::DEAD_LETTER_QUEUE_URL))?,
            sender_email: self.sender_email.ok_or(ConfigError::Missing(env::SENDER_EMAIL))?,
            queue_max_delay_seconds: max_delay,
            retention: self.retention.unwrap_or(DEFAULT_RETENTION),
        })
    }
}

/// The SDK's own hyper 1 client on rustls with ring: one TLS stack in the binary.
pub fn https_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// Timeouts short enough that a stuck call fails (retryably) inside the Lambda's own.
fn timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(25))
        .build()
}

/// The standard chain (environment, profile, container and instance credentials), region
/// and `AWS_ENDPOINT_URL` (moto, LocalStack), on [`https_client`].
pub async fn load_sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .timeout_config(timeouts())
        .load()
        .await
}

/// The three SDK clients, built once per container.
#[derive(Clone, Debug)]
pub struct AwsClients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub sesv2: aws_sdk_sesv2::Client,
    /// Counting the clients' requests, when built with a counter.
    pub counter: Option<RequestCounter>,
}

impl AwsClients {
    pub async fn from_env() -> Self {
        Self::new(&load_sdk_config().await, None)
    }

    /// Clients on `config`; with a `counter`, every request they send is counted.
    pub fn new(config: &SdkConfig, counter: Option<&RequestCounter>) -> Self {
        let mut ddb = aws_sdk_dynamodb::config::Builder::from(config);
        let mut sqs = aws_sdk_sqs::config::Builder::from(config);
        let mut ses = aws_sdk_sesv2::config::Builder::from(config);
        if let Some(c) = counter {
            ddb = ddb.interceptor(c.clone());
            sqs = sqs.interceptor(c.clone());
            ses = ses.interceptor(c.clone());
        }
        Self {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(ddb.build()),
            sqs: aws_sdk_sqs::Client::from_conf(sqs.build()),
            sesv2: aws_sdk_sesv2::Client::from_conf(ses.build()),
            counter: counter.cloned(),
        }
    }

    /// Clients for a local endpoint (moto, DynamoDB Local) with fixed test credentials.
    pub async fn for_endpoint(endpoint_url: &str, counter: Option<&RequestCounter>) -> Self {
        let config = aws_config::defaults(BehaviorVersion::latest())
            .http_client(https_client())
            .timeout_config(timeouts())
            .endpoint_url(endpoint_url)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                "testing",
                "testing",
                None,
                None,
                "hookwise-test",
            ))
            .load()
            .await;
        Self::new(&config, counter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = [
            (env::TABLE, "main"),
            (env::SCHEDULER_TABLE, "sched"),
            (env::DELIVERY_QUEUE_URL, "http://q/delivery"),
            (env::DEAD_LETTER_QUEUE_URL, "http://q/dlq"),
            (env::SENDER_EMAIL, "hooks@example.com"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        for (k, v) in extra {
            m.insert((*k).to_owned(), (*v).to_owned());
        }
        m
    }

    #[test]
    fn given_every_variable_then_the_config_reads_them_with_defaults_for_the_optional_ones() {
        let m = vars(&[]);
        let c = AwsConfig::from_lookup(|k| m.get(k).cloned()).unwrap();
        assert_eq!(c.table, "main");
        assert_eq!(c.dead_letter_queue_url, "http://q/dlq");
        assert_eq!(c.queue_max_delay_seconds, 900);
        assert_eq!(c.retention, DEFAULT_RETENTION);
    }

    #[test]
    fn given_a_missing_or_out_of_range_variable_then_the_error_names_it() {
        let mut m = vars(&[]);
        m.remove(env::SCHEDULER_TABLE);
        let err = AwsConfig::from_lookup(|k| m.get(k).cloned()).unwrap_err();
        assert!(err.to_string().contains(env::SCHEDULER_TABLE), "{err}");
        let m = vars(&[(env::QUEUE_MAX_DELAY_SECONDS, "901")]);
        let err = AwsConfig::from_lookup(|k| m.get(k).cloned()).unwrap_err();
        assert!(err.to_string().contains(env::QUEUE_MAX_DELAY_SECONDS), "{err}");
        let m = vars(&[(env::QUEUE_MAX_DELAY_SECONDS, "5"), (env::RETENTION_DAYS, "2")]);
        let c = AwsConfig::from_lookup(|k| m.get(k).cloned()).unwrap();
        assert_eq!((c.queue_max_delay_seconds, c.retention.as_secs()), (5, 2 * 86_400));
    }
}
