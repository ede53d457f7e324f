//! `hookwise-deliver`: the delivery queue's SQS batches, via [`hookwise_deliver::handle`].

use std::sync::Arc;

use aws_lambda_events::sqs::SqsEvent;
use hookwise_aws::FunctionConfig;
use hookwise_http::{HttpSender, SenderConfig};
use lambda_runtime::{run, service_fn, tracing, Error, LambdaEvent};

// One thread, as every function here: why, in docs/aws.md#start-up.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    tracing::init_default_subscriber();
    let config = FunctionConfig::from_env()?;
    // Once per container: SDK clients, adapters and the HTTP client's connection pool.
    let sender = HttpSender::new(SenderConfig {
        allow_cidrs: config.allowed_target_cidrs.clone(),
        ..Default::default()
    })?;
    // Metrics as embedded metric format, one log line per invocation.
    let metrics = Arc::new(hookwise_aws::metrics::EmfMetrics::new(&config.service, "deliver"));
    let services = Arc::new(config.services(Arc::new(sender)).await.with_metrics(metrics));
    run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let services = services.clone();
        async move { Ok::<_, Error>(hookwise_deliver::handle(&services, event.payload, event.context.deadline).await) }
    }))
    .await
}
