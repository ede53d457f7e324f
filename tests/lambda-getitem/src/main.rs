//! `lambda-getitem`: the SDK baseline of the Lambda start-up benchmark (`scripts/bench-lambda.py`).
//!
//! The fair floor for a function that talks to DynamoDB: the SDK's configuration loaded the
//! ordinary way (`aws_config::defaults`, its standard credential and region chain, and
//! `AWS_ENDPOINT_URL_DYNAMODB` / `AWS_ENDPOINT_URL`), one DynamoDB client made in init, and
//! one `GetItem` per invocation. The table is `HOOKWISE_TABLE` (as the template gives every
//! function); the event names the item: `{"pk": "...", "sk": "..."}`. The answer says whether
//! it was there: `{"found": true}`. Built from the workspace's dependencies, features and
//! profile, on the HTTP client hookwise-aws uses, so it costs what the SDK itself costs.

use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::{json, Value};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let table = std::env::var("HOOKWISE_TABLE").map_err(|_| "HOOKWISE_TABLE is not set")?;
    // Without the SDK's default features there is no default HTTP client: the one hookwise-aws
    // picks (the SDK's own hyper 1 client, rustls on ring).
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let config = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .load()
        .await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    run(service_fn(move |event: LambdaEvent<Value>| {
        let (client, table) = (client.clone(), table.clone());
        async move {
            let key = |name: &str| {
                event.payload[name]
                    .as_str()
                    .map(|v| AttributeValue::S(v.to_owned()))
                    .ok_or_else(|| format!("the event has no string `{name}`"))
            };
            let item = client
                .get_item()
                .table_name(table)
                .key("pk", key("pk")?)
                .key("sk", key("sk")?)
                .send()
                .await?;
            Ok::<_, Error>(json!({"found": item.item.is_some()}))
        }
    }))
    .await
}
