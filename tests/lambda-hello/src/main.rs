//! `lambda-hello`: the baseline of the Lambda start-up benchmark (`scripts/bench-lambda.py`).
//!
//! The smallest function `lambda_runtime` makes: it echoes each event's JSON payload, with
//! no configuration, no SDK clients and no subscriber of its own. Built from the workspace's
//! dependencies and profile, it shows what start-up time, peak RSS and binary size the
//! runtime alone costs; the four functions are measured against it in the same run.

use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

async fn handler(event: LambdaEvent<Value>) -> Result<Value, Error> {
    Ok(event.payload)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    run(service_fn(handler)).await
}
