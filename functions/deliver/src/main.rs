//! `hookwise-deliver`: the delivery queue's SQS batches, via [`hookwise_deliver::handle`].

use std::sync::Arc;

use aws_lambda_events::sqs::SqsEvent;
use lambda_runtime::{run, service_fn, tracing, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing::init_default_subscriber();
    // Once per container: SDK clients, adapters and the HTTP client's connection pool.
    let services = Arc::new(hookwise_deliver::services_from_env().await?);
    run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let services = services.clone();
        async move { Ok::<_, Error>(hookwise_deliver::handle(&services, event.payload).await) }
    }))
    .await
}
