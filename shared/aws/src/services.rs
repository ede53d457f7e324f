//! The services on the AWS adapters, configured from the environment the template sets:
//! what every function (and `hookwise tenant create --aws`) builds once per process.

use std::sync::Arc;

use hookwise_core::policy::RetryPolicy;
use hookwise_core::ports::{Sender, SystemClock};
use hookwise_core::services::{Config, Services};
use rand::SeedableRng;

use crate::{env, AwsAdapters, AwsClients, AwsConfig};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service settings from `HOOKWISE_DEFAULT_RETRY_POLICY` (a policy name) and
/// `HOOKWISE_PUBLIC_API_URL` (for the replay instructions in emails); unset means the default.
pub fn service_config(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, BoxError> {
    let mut config = Config::default();
    if let Some(name) = lookup(env::DEFAULT_RETRY_POLICY).filter(|v| !v.trim().is_empty()) {
        config.default_retry_policy =
            RetryPolicy::named(name.trim()).map_err(|e| format!("{}: {e}", env::DEFAULT_RETRY_POLICY))?;
    }
    if let Some(url) = lookup(env::PUBLIC_API_URL).filter(|v| !v.trim().is_empty()) {
        config.public_api_url = url;
    }
    Ok(config)
}

/// Tables, queues and service settings from the environment; SDK clients from the standard
/// chain (which honours `AWS_ENDPOINT_URL`).
pub async fn services_from_env(sender: Arc<dyn Sender>) -> Result<Services, BoxError> {
    let aws = AwsConfig::from_env()?;
    let config = service_config(|k| std::env::var(k).ok())?;
    let clients = AwsClients::from_env().await;
    let ports = AwsAdapters::new(&clients, &aws).ports(sender, Arc::new(SystemClock));
    Ok(Services::new(ports, config, rand::rngs::StdRng::from_os_rng()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_policy_and_public_url_come_from_the_environment() {
        let config = service_config(|k| match k {
            env::DEFAULT_RETRY_POLICY => Some("ledger".into()),
            env::PUBLIC_API_URL => Some("https://api.example.com".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(config.default_retry_policy, RetryPolicy::ledger());
        assert_eq!(config.public_api_url, "https://api.example.com");
        assert_eq!(
            service_config(|_| None).unwrap().default_retry_policy,
            RetryPolicy::standard()
        );
        let err = service_config(|k| (k == env::DEFAULT_RETRY_POLICY).then(|| "fastest".into())).unwrap_err();
        assert!(err.to_string().contains("HOOKWISE_DEFAULT_RETRY_POLICY"), "{err}");
    }
}
