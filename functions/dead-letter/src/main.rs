//! `hookwise-dead-letter`: the dead-letter queue's SQS batches, via [`hookwise_dead_letter::handle`].

use std::sync::Arc;

use aws_lambda_events::sqs::SqsEvent;
use hookwise_aws::FunctionConfig;
use hookwise_core::ports::NoSender;
use lambda_runtime::{run, service_fn, tracing, Error, LambdaEvent};

// One thread, as every function here: why, in docs/aws.md#start-up.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    tracing::init_default_subscriber();
    let config = FunctionConfig::from_env()?;
    // Metrics as embedded metric format, one log line per invocation.
    let metrics = Arc::new(hookwise_aws::metrics::EmfMetrics::new(&config.service, "dead-letter"));
    let services = Arc::new(config.services(Arc::new(NoSender)).await.with_metrics(metrics));
    run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let services = services.clone();
        async move { Ok::<_, Error>(hookwise_dead_letter::handle(&services, event.payload, event.context.deadline).await) }
    }))
    .await
}
