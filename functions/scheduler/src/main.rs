//! `hookwise-scheduler`: one tick per EventBridge schedule event, via [`hookwise_scheduler::handle`].

use std::sync::Arc;

use hookwise_aws::FunctionConfig;
use hookwise_core::ports::NoSender;
use lambda_runtime::{run, service_fn, tracing, Error, LambdaEvent};
use serde_json::Value;

// One thread, as every function here: why, in docs/aws.md#start-up.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    tracing::init_default_subscriber();
    let config = FunctionConfig::from_env()?;
    // Metrics as embedded metric format, one log line per invocation.
    let metrics = Arc::new(hookwise_aws::metrics::EmfMetrics::new(&config.service, "scheduler"));
    let services = Arc::new(config.services(Arc::new(NoSender)).await.with_metrics(metrics));
    run(service_fn(move |event: LambdaEvent<Value>| {
        let services = services.clone();
        async move {
            hookwise_scheduler::handle(&services, &event.payload)
                .await
                .map_err(Error::from)
        }
    }))
    .await
}
