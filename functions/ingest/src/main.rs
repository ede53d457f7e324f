//! `hookwise-ingest`: the public API on Lambda behind API Gateway's HTTP API.

use std::sync::Arc;

use hookwise_aws::FunctionConfig;
use hookwise_core::ports::NoSender;
use lambda_http::{run, tracing, Error};

// One thread, as every function here: why, in docs/aws.md#start-up.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    tracing::init_default_subscriber();
    // Once per container: SDK clients and adapters; the Router shares them across requests.
    // The API never POSTs to an endpoint (deliveries are queued).
    let services = Arc::new(FunctionConfig::from_env()?.services(Arc::new(NoSender)).await);
    let portal = hookwise_http::PortalConfig::from_env()?;
    run(hookwise_ingest::app(services, portal)).await
}
