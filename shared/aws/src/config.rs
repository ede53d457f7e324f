//! Configuration as data: [`FunctionConfig`] is what every function reads from the
//! environment `template.yaml` sets (the `HOOKWISE_*` variables, documented in
//! `docs/configuration.md`); [`AwsConfig`] is the part the adapters need. The SDK clients
//! are made once, on first use.

use std::time::Duration;

use aws_config::environment::{EnvironmentVariableCredentialsProvider, EnvironmentVariableRegionProvider};
use aws_config::meta::region::ProvideRegion;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use hookwise_core::policy::RetryPolicy;
use hookwise_core::services::Config;
use ipnet::IpNet;
use serde::{Deserialize, Deserializer};

use crate::counter::RequestCounter;
use crate::lazy_client::LazyClient;

/// The environment variables, named where the code and the tests need them. Each is
/// [`ENV_PREFIX`] and a [`FunctionConfig`] field's name in capitals.
pub mod env {
    pub const TABLE: &str = "HOOKWISE_TABLE";
    pub const SCHEDULER_TABLE: &str = "HOOKWISE_SCHEDULER_TABLE";
    pub const DELIVERY_QUEUE_URL: &str = "HOOKWISE_DELIVERY_QUEUE_URL";
    pub const DEAD_LETTER_QUEUE_URL: &str = "HOOKWISE_DEAD_LETTER_QUEUE_URL";
    pub const SENDER_EMAIL: &str = "HOOKWISE_SENDER_EMAIL";
    pub const SECRETS_KEY: &str = "HOOKWISE_SECRETS_KEY";
    pub const QUEUE_MAX_DELAY_SECONDS: &str = "HOOKWISE_QUEUE_MAX_DELAY_SECONDS";
    pub const RETENTION_DAYS: &str = "HOOKWISE_RETENTION_DAYS";
    pub const DEFAULT_RETRY_POLICY: &str = "HOOKWISE_DEFAULT_RETRY_POLICY";
    pub const ALLOWED_TARGET_CIDRS: &str = "HOOKWISE_ALLOWED_TARGET_CIDRS";
    pub const PUBLIC_API_URL: &str = "HOOKWISE_PUBLIC_API_URL";
    pub const DIGEST_WINDOW_SECONDS: &str = "HOOKWISE_DIGEST_WINDOW_SECONDS";
    pub const SERVICE: &str = "HOOKWISE_SERVICE";
    pub const REVEAL_SECRETS: &str = "HOOKWISE_REVEAL_SECRETS";
}

pub const ENV_PREFIX: &str = "HOOKWISE_";
/// SQS's limit on `DelaySeconds`.
pub const SQS_MAX_DELAY_SECONDS: u32 = 900;
pub const DEFAULT_RETENTION_DAYS: u32 = 30;
/// The longest digest window: a day.
pub const MAX_DIGEST_WINDOW_SECONDS: u64 = 86_400;

/// A retention in days as a duration.
pub fn retention_days(days: u32) -> Duration {
    Duration::from_secs(u64::from(days) * 24 * 3600)
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is not set: template.yaml sets it for every function")]
    Missing(String),
    #[error("{0}")]
    Invalid(String),
}

/// Every function's settings, from `HOOKWISE_<FIELD>` (template.yaml's `Globals`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FunctionConfig {
    /// The main table's name.
    pub table: String,
    pub scheduler_table: String,
    pub delivery_queue_url: String,
    pub dead_letter_queue_url: String,
    /// The SES v2 identity dead-delivery emails come from.
    pub sender_email: String,
    /// The KMS key (ARN) that seals the subscriptions' signing secrets.
    pub secrets_key: String,
    /// Lower than 900 only in tests, so the scheduler-table path runs in seconds.
    #[serde(default = "sqs_max_delay")]
    pub queue_max_delay_seconds: u32,
    /// How long events, deliveries and attempts are kept (DynamoDB TTL).
    #[serde(default = "default_retention_days")]
    pub retention_days: u32,
    /// The policy of subscriptions created without one: `standard`, `ledger`, `exponential`.
    #[serde(default = "standard")]
    pub default_retry_policy: String,
    /// Where the API is reached, for the replay instructions in emails.
    #[serde(default)]
    pub public_api_url: Option<String>,
    /// Comma-separated CIDRs the SSRF guard lets deliveries reach.
    #[serde(default, deserialize_with = "comma_separated")]
    pub allowed_target_cidrs: Vec<IpNet>,
    /// An owner gets at most one dead-delivery email per this many seconds.
    #[serde(default = "default_digest_window")]
    pub digest_window_seconds: u64,
    /// The deployment's name (the template sets its stack's): its metrics' `Service`
    /// dimension, so two stacks in one account keep their metrics and alarms apart.
    #[serde(default = "hookwise")]
    pub service: String,
    /// Whether the API shows a signing secret again after it is made (the Ingest function's;
    /// its key-policy grant to decrypt comes with it, template.yaml's `RevealSecrets`).
    #[serde(default)]
    pub reveal_secrets: bool,
}

fn sqs_max_delay() -> u32 {
    SQS_MAX_DELAY_SECONDS
}
fn default_retention_days() -> u32 {
    DEFAULT_RETENTION_DAYS
}
fn default_digest_window() -> u64 {
    Config::default().digest_window.as_secs()
}
fn standard() -> String {
    "standard".into()
}
fn hookwise() -> String {
    "hookwise".into()
}

/// `a, b` as a list; empty as none.
fn comma_separated<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let text = String::deserialize(d)?;
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|e| serde::de::Error::custom(format!("`{s}` is not a CIDR: {e}")))
        })
        .collect()
}

impl FunctionConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::vars())
    }

    /// From any set of variables (a list in tests).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let config: Self = envy::prefixed(ENV_PREFIX).from_iter(vars).map_err(|e| match e {
            envy::Error::MissingValue(field) => ConfigError::Missing(format!("{ENV_PREFIX}{}", field.to_uppercase())),
            envy::Error::Custom(why) => ConfigError::Invalid(why),
        })?;
        config.validate()
    }

    fn validate(self) -> Result<Self, ConfigError> {
        for (name, value) in [
            (env::TABLE, &self.table),
            (env::SCHEDULER_TABLE, &self.scheduler_table),
            (env::DELIVERY_QUEUE_URL, &self.delivery_queue_url),
            (env::DEAD_LETTER_QUEUE_URL, &self.dead_letter_queue_url),
            (env::SENDER_EMAIL, &self.sender_email),
            (env::SECRETS_KEY, &self.secrets_key),
        ] {
            if value.trim().is_empty() {
                return Err(ConfigError::Missing(name.into()));
            }
        }
        if !(1..=SQS_MAX_DELAY_SECONDS).contains(&self.queue_max_delay_seconds) {
            return Err(ConfigError::Invalid(format!(
                "{} is {}: must be 1 to {SQS_MAX_DELAY_SECONDS} (SQS's limit)",
                env::QUEUE_MAX_DELAY_SECONDS,
                self.queue_max_delay_seconds
            )));
        }
        if self.digest_window_seconds > MAX_DIGEST_WINDOW_SECONDS {
            return Err(ConfigError::Invalid(format!(
                "{} is {}: must be 0 to {MAX_DIGEST_WINDOW_SECONDS} (a day)",
                env::DIGEST_WINDOW_SECONDS,
                self.digest_window_seconds
            )));
        }
        let policy = self.retry_policy()?;
        hookwise_core::services::check_retention(&policy, Some(retention_days(self.retention_days))).map_err(|e| {
            ConfigError::Invalid(format!(
                "{} and {}: {}",
                env::DEFAULT_RETRY_POLICY,
                env::RETENTION_DAYS,
                e.message
            ))
        })?;
        Ok(self)
    }

    fn retry_policy(&self) -> Result<RetryPolicy, ConfigError> {
        RetryPolicy::named(self.default_retry_policy.trim())
            .map_err(|e| ConfigError::Invalid(format!("{}: {e}", env::DEFAULT_RETRY_POLICY)))
    }

    /// The adapters' part.
    pub fn aws(&self) -> AwsConfig {
        AwsConfig {
            table: self.table.clone(),
            scheduler_table: self.scheduler_table.clone(),
            delivery_queue_url: self.delivery_queue_url.clone(),
            dead_letter_queue_url: self.dead_letter_queue_url.clone(),
            sender_email: self.sender_email.clone(),
            secrets_key: self.secrets_key.clone(),
            queue_max_delay_seconds: self.queue_max_delay_seconds,
            retention: retention_days(self.retention_days),
        }
    }

    /// The services' part.
    pub fn service_config(&self) -> Config {
        let mut config = Config {
            default_retry_policy: self.retry_policy().expect("validated when read"),
            retention: Some(retention_days(self.retention_days)),
            digest_window: Duration::from_secs(self.digest_window_seconds),
            reveal_secrets: self.reveal_secrets,
            ..Config::default()
        };
        if let Some(url) = self.public_api_url.as_ref().filter(|u| !u.trim().is_empty()) {
            config.public_api_url = url.clone();
        }
        config
    }
}

/// Where the adapters find their tables and queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsConfig {
    pub table: String,
    pub scheduler_table: String,
    pub delivery_queue_url: String,
    pub dead_letter_queue_url: String,
    pub sender_email: String,
    /// The KMS key that seals signing secrets.
    pub secrets_key: String,
    /// At most 900 (SQS's limit); retries due later go through the scheduler table.
    pub queue_max_delay_seconds: u32,
    /// TTL of events, deliveries, attempts and notices after their last change.
    pub retention: Duration,
}

/// The SDK's own hyper 1 client on rustls with ring (one TLS stack in the binary), made
/// ready on first use: see [`OnFirstUse`].
pub fn https_client() -> SharedHttpClient {
    SharedHttpClient::new(OnFirstUse(
        aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https(),
    ))
}

/// An HTTP client whose connector (TLS trust store and all) is built when the first request
/// needs it. The SDK's own also builds a throwaway one (reading and parsing every root
/// certificate) as each SDK client is made, so that the trust store is loaded before any
/// request: work a function's start-up did three times over for nothing. Connectors are
/// still cached, one for each connect and read timeout (one for all three clients).
#[derive(Debug)]
struct OnFirstUse(SharedHttpClient);

impl HttpClient for OnFirstUse {
    fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
        self.0.http_connector(settings, components)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.0.connector_metadata()
    }
}

/// The longest one SDK call may take, its retries included. A delivery keeps back three of
/// these from its invocation's deadline for the writes after its POST
/// (`hookwise_core::services::DEADLINE_MARGIN`); `template.yaml`'s timeouts are built on it.
pub const SDK_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

/// Timeouts short enough that a stuck call fails (retryably) well inside the Lambda's own.
fn timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(2))
        .operation_attempt_timeout(Duration::from_secs(4))
        .operation_timeout(SDK_OPERATION_TIMEOUT)
        .build()
}

/// The standard chain (environment, profile, container and instance credentials), region
/// and `AWS_ENDPOINT_URL` (moto, LocalStack), on [`https_client`].
///
/// Credentials and region the environment holds (Lambda sets `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` and `AWS_REGION` for every function) are
/// taken from it directly. The chain would find them there first too, but building it makes
/// an STS client (for web identity tokens) in each function's start-up.
pub async fn load_sdk_config() -> SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .timeout_config(timeouts());
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() && std::env::var_os("AWS_SECRET_ACCESS_KEY").is_some() {
        loader = loader.credentials_provider(EnvironmentVariableCredentialsProvider::new());
    }
    if let Some(region) = EnvironmentVariableRegionProvider::new().region().await {
        loader = loader.region(region);
    }
    loader.load().await
}

/// The four SDK clients, each made on its first use ([`LazyClient`]) and shared from then on.
#[derive(Clone, Debug)]
pub struct AwsClients {
    pub dynamodb: LazyClient<aws_sdk_dynamodb::Client>,
    pub sqs: LazyClient<aws_sdk_sqs::Client>,
    pub sesv2: LazyClient<aws_sdk_sesv2::Client>,
    pub kms: LazyClient<aws_sdk_kms::Client>,
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
        let mut kms = aws_sdk_kms::config::Builder::from(config);
        if let Some(c) = counter {
            ddb = ddb.interceptor(c.clone());
            sqs = sqs.interceptor(c.clone());
            ses = ses.interceptor(c.clone());
            kms = kms.interceptor(c.clone());
        }
        Self {
            dynamodb: LazyClient::new(move || aws_sdk_dynamodb::Client::from_conf(ddb.build())),
            sqs: LazyClient::new(move || aws_sdk_sqs::Client::from_conf(sqs.build())),
            sesv2: LazyClient::new(move || aws_sdk_sesv2::Client::from_conf(ses.build())),
            kms: LazyClient::new(move || aws_sdk_kms::Client::from_conf(kms.build())),
            counter: counter.cloned(),
        }
    }

    /// Clients for a local endpoint (moto, DynamoDB Local) with fixed test credentials.
    pub async fn for_endpoint(endpoint_url: &str, counter: Option<&RequestCounter>) -> Self {
        Self::for_endpoint_as(endpoint_url, "testing", "testing", counter).await
    }

    /// [`Self::for_endpoint`], signing with this access key (an IAM user of moto's).
    pub async fn for_endpoint_as(
        endpoint_url: &str,
        access_key_id: &str,
        secret_access_key: &str,
        counter: Option<&RequestCounter>,
    ) -> Self {
        let config = aws_config::defaults(BehaviorVersion::latest())
            .http_client(https_client())
            .timeout_config(timeouts())
            .endpoint_url(endpoint_url)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                access_key_id,
                secret_access_key,
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

    /// The required variables, then `extra` over them, less `without`.
    fn vars(extra: &[(&str, &str)], without: &[&str]) -> Vec<(String, String)> {
        let mut v: std::collections::BTreeMap<&str, &str> = [
            (env::TABLE, "main"),
            (env::SCHEDULER_TABLE, "sched"),
            (env::DELIVERY_QUEUE_URL, "http://q/delivery"),
            (env::DEAD_LETTER_QUEUE_URL, "http://q/dlq"),
            (env::SENDER_EMAIL, "hooks@example.com"),
            (env::SECRETS_KEY, "arn:aws:kms:eu-west-1:123456789012:key/k"),
            ("PATH", "/usr/bin"),
        ]
        .into_iter()
        .collect();
        v.extend(extra.iter().copied());
        v.retain(|k, _| !without.contains(k));
        v.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }

    #[test]
    fn given_every_variable_then_the_config_reads_them_with_defaults_for_the_optional_ones() {
        let c = FunctionConfig::from_vars(vars(&[(env::ALLOWED_TARGET_CIDRS, "")], &[])).unwrap();
        let aws = c.aws();
        assert_eq!(aws.table, "main");
        assert_eq!(aws.dead_letter_queue_url, "http://q/dlq");
        assert_eq!(aws.queue_max_delay_seconds, 900);
        assert_eq!(aws.retention, Duration::from_secs(30 * 86_400));
        assert!(c.allowed_target_cidrs.is_empty());
        assert_eq!(c.service_config().default_retry_policy, RetryPolicy::standard());
        assert_eq!(c.service_config().retention, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(c.service_config().digest_window, Duration::from_secs(300));
    }

    #[test]
    fn given_a_missing_or_out_of_range_variable_then_the_error_names_it() {
        let err = FunctionConfig::from_vars(vars(&[], &[env::SCHEDULER_TABLE])).unwrap_err();
        assert!(err.to_string().contains(env::SCHEDULER_TABLE), "{err}");
        let err = FunctionConfig::from_vars(vars(&[], &[env::SECRETS_KEY])).unwrap_err();
        assert!(err.to_string().contains(env::SECRETS_KEY), "{err}");
        let err = FunctionConfig::from_vars(vars(&[(env::TABLE, " ")], &[])).unwrap_err();
        assert!(err.to_string().contains(env::TABLE), "{err}");
        let err = FunctionConfig::from_vars(vars(&[(env::QUEUE_MAX_DELAY_SECONDS, "901")], &[])).unwrap_err();
        assert!(err.to_string().contains(env::QUEUE_MAX_DELAY_SECONDS), "{err}");
        let err = FunctionConfig::from_vars(vars(&[(env::DEFAULT_RETRY_POLICY, "fastest")], &[])).unwrap_err();
        assert!(err.to_string().contains(env::DEFAULT_RETRY_POLICY), "{err}");
        let err = FunctionConfig::from_vars(vars(&[(env::ALLOWED_TARGET_CIDRS, "10.0.0.0/8, nope")], &[])).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
        let err = FunctionConfig::from_vars(vars(&[(env::DIGEST_WINDOW_SECONDS, "86401")], &[])).unwrap_err();
        assert!(err.to_string().contains(env::DIGEST_WINDOW_SECONDS), "{err}");
        // The standard policy can retry for 16.6 days: one day of retention would delete live work.
        let err = FunctionConfig::from_vars(vars(&[(env::RETENTION_DAYS, "1")], &[])).unwrap_err();
        assert!(
            err.to_string().contains("retry_policy") && err.to_string().contains(env::RETENTION_DAYS),
            "{err}"
        );
    }

    #[test]
    fn given_the_optional_variables_then_each_reaches_its_setting() {
        let c = FunctionConfig::from_vars(vars(
            &[
                (env::QUEUE_MAX_DELAY_SECONDS, "5"),
                (env::RETENTION_DAYS, "20"),
                (env::DEFAULT_RETRY_POLICY, "ledger"),
                (env::PUBLIC_API_URL, "https://api.example.com"),
                (env::ALLOWED_TARGET_CIDRS, "10.0.0.0/8, 127.0.0.0/8"),
                (env::DIGEST_WINDOW_SECONDS, "60"),
            ],
            &[],
        ))
        .unwrap();
        let aws = c.aws();
        assert_eq!((aws.queue_max_delay_seconds, aws.retention.as_secs()), (5, 20 * 86_400));
        let services = c.service_config();
        assert_eq!(services.default_retry_policy, RetryPolicy::ledger());
        assert_eq!(services.public_api_url, "https://api.example.com");
        assert_eq!(services.digest_window, Duration::from_secs(60));
        assert_eq!(c.allowed_target_cidrs.len(), 2);
    }
}
