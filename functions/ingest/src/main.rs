//! `hookwise-ingest`: the public API on Lambda behind API Gateway's HTTP API.

use std::sync::Arc;

use lambda_http::{run, tracing, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing::init_default_subscriber();
    // Once per container: SDK clients and adapters; the Router shares them across requests.
    let services = Arc::new(hookwise_ingest::services_from_env().await?);
    run(hookwise_ingest::app(services)).await
}
