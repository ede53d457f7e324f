//! `hookwise dev --aws`: the same one-process runner as `hookwise dev` on AWS APIs instead of
//! SQLite: DynamoDB, SQS and SES v2 at `AWS_ENDPOINT_URL` (LocalStack, moto) or real AWS.
//! The workers do what Lambda's SQS event source mapping and the functions do.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hookwise_aws::bootstrap::{provision, verify_sender, TemplateResources};
use hookwise_aws::{AwsAdapters, AwsClients, AwsConfig, FunctionConfig, SqsConsumer};
use hookwise_core::ports::{Mailer, OutgoingEmail, PortResult, SystemClock};
use hookwise_core::services::{Config, Services};
use hookwise_http::{HttpSender, SenderConfig};
use rand::SeedableRng;

use crate::dev_host::{ensure_tenant, serve, CommonArgs, Ready};

/// SQS's longest long poll is 20 s; a short one keeps shutdown quick.
const RECEIVE_WAIT: Duration = Duration::from_secs(2);

/// The flags of the AWS mode.
#[derive(clap::Args, Debug, Clone)]
pub struct AwsArgs {
    /// Run on AWS APIs — DynamoDB, SQS, SES v2 at AWS_ENDPOINT_URL (LocalStack, moto) or
    /// real AWS — instead of the embedded SQLite store.
    #[arg(long)]
    pub aws: bool,
    /// With --aws: create fresh tables and queues from template.yaml instead of reading
    /// HOOKWISE_TABLE, HOOKWISE_DELIVERY_QUEUE_URL, ... from the environment.
    #[arg(long, requires = "aws")]
    pub provision: bool,
    #[arg(long, requires = "aws", default_value = "template.yaml")]
    pub template: PathBuf,
    /// Names of provisioned resources start with this (then a timestamp).
    #[arg(long, requires = "aws", default_value = "hookwise-dev")]
    pub aws_prefix: String,
    /// With --provision: the SES v2 identity emails come from (verified on the endpoint).
    #[arg(long, requires = "aws", default_value = "hookwise@example.com")]
    pub sender_email: String,
    /// With --aws: print dead-delivery emails to stderr instead of sending them through
    /// SES v2 (LocalStack's free edition has no SES v2).
    #[arg(long, requires = "aws")]
    pub log_email: bool,
}

/// Dead-delivery emails on stderr: for endpoints without SES v2.
struct LogMailer;

#[async_trait::async_trait]
impl Mailer for LogMailer {
    async fn send(&self, email: &OutgoingEmail) -> PortResult<()> {
        eprintln!(
            "---- email to {} ----\nSubject: {}\n\n{}\n---- end of email ----",
            email.to, email.subject, email.text
        );
        Ok(())
    }
}

pub async fn run(args: CommonArgs, aws: AwsArgs) -> anyhow::Result<ExitCode> {
    // The standard chain: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_DYNAMODB, ..._SQS, ..._SESV2),
    // AWS_REGION, credentials.
    let clients = AwsClients::from_env().await;
    // Provisioned: fresh resources and the defaults. Else the stack's, with the settings its
    // functions read (default policy, retention, allowed targets, public URL).
    let (config, service_config, mut allow, public_url) = if aws.provision {
        let config = provisioned(&clients, &aws, args.max_queue_delay).await?;
        let services = Config {
            retention: Some(config.retention),
            ..Config::default()
        };
        (config, services, Vec::new(), None)
    } else {
        let env = FunctionConfig::from_env().context("the tables and queues (or pass --provision)")?;
        (
            env.aws(),
            env.service_config(),
            env.allowed_target_cidrs.clone(),
            env.public_api_url.clone(),
        )
    };
    allow.extend(args.allowed_targets());

    let sender = HttpSender::new(SenderConfig {
        allow_cidrs: allow,
        max_idle_per_host: args.attempts_in_flight(),
        ..SenderConfig::default()
    })?;
    let mut ports = AwsAdapters::new(&clients, &config).ports(Arc::new(sender), Arc::new(SystemClock));
    if aws.log_email {
        ports.mailer = Arc::new(LogMailer);
    }
    let (listener, addr) = args.bind().await?;
    let public_api_url = public_url.unwrap_or_else(|| format!("http://{addr}"));
    let core = Config {
        deliver_concurrency: args.concurrency,
        public_api_url,
        scheduler_holder: Some(crate::dev::dev_scheduler_holder()),
        digest_window: args
            .digest_window
            .map_or(service_config.digest_window, Duration::from_secs),
        reveal_secrets: args.reveal_secrets || service_config.reveal_secrets,
        ..service_config
    };
    let services = Arc::new(Services::new(ports, core, rand::rngs::StdRng::from_os_rng()));
    let api_key = args
        .api_key
        .clone()
        .unwrap_or_else(|| hookwise_core::auth::generate_api_key(&mut rand::rngs::StdRng::from_os_rng()));
    let tenant = ensure_tenant(&services, &api_key, &args.owner_email).await?.id;

    let delivery = SqsConsumer::connect(clients.sqs.clone(), &config.delivery_queue_url).await;
    let dead_letter = SqsConsumer::connect(clients.sqs.clone(), &config.dead_letter_queue_url).await;
    let ready = Ready {
        services,
        listener,
        delivery: delivery.context("the delivery queue")?,
        dead_letter: dead_letter.context("the dead-letter queue")?,
        title: format!("Hookwise dev (AWS APIs): listening on http://{addr}"),
        details: vec![
            ("tables", format!("{} / {}", config.table, config.scheduler_table)),
            (
                "queues",
                format!("{} / {}", config.delivery_queue_url, config.dead_letter_queue_url),
            ),
        ],
        tenant,
        api_key,
    };
    serve(ready, &args, RECEIVE_WAIT).await
}

/// Fresh tables and queues from the template, and the sender verified on SES v2.
async fn provisioned(clients: &AwsClients, aws: &AwsArgs, max_queue_delay: u32) -> anyhow::Result<AwsConfig> {
    let limit = hookwise_aws::config::SQS_MAX_DELAY_SECONDS;
    anyhow::ensure!(
        (1..=limit).contains(&max_queue_delay),
        "--max-queue-delay must be 1 to {limit} (SQS's limit)"
    );
    let yaml = std::fs::read_to_string(&aws.template).with_context(|| format!("read {}", aws.template.display()))?;
    let resources = TemplateResources::parse(&yaml)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let made = provision(clients, &resources, &format!("{}-{stamp}", aws.aws_prefix))
        .await
        .map_err(|e| anyhow::anyhow!("provision from {}: {e}", aws.template.display()))?;
    if !aws.log_email {
        if let Err(e) = verify_sender(clients, &aws.sender_email).await {
            eprintln!(
                "warning: could not verify {} with SES v2 ({e}); emails may fail: --log-email prints them instead",
                aws.sender_email
            );
        }
    }
    println!("provisioned: reuse them with");
    println!(
        "  export HOOKWISE_TABLE={} HOOKWISE_SCHEDULER_TABLE={}",
        made.table, made.scheduler_table
    );
    println!(
        "  export HOOKWISE_DELIVERY_QUEUE_URL={} HOOKWISE_DEAD_LETTER_QUEUE_URL={}",
        made.delivery_queue_url, made.dead_letter_queue_url
    );
    println!(
        "  export HOOKWISE_SECRETS_KEY={} HOOKWISE_SENDER_EMAIL={}",
        made.secrets_key, aws.sender_email
    );
    Ok(AwsConfig {
        queue_max_delay_seconds: max_queue_delay,
        ..made.config(&aws.sender_email)
    })
}
