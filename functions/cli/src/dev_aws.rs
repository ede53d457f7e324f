//! `hookwise dev --aws`: the same one-process runner as `hookwise dev` — API, delivery
//! worker, dead-letter handler, scheduler — on AWS APIs instead of SQLite: DynamoDB, SQS and
//! SES v2 at `AWS_ENDPOINT_URL` (LocalStack, moto) or real AWS. The workers do what Lambda's
//! SQS event source mapping and the functions do: poll, handle the batch, delete what was
//! handled, leave infrastructure failures to come back after the visibility timeout.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hookwise_aws::bootstrap::{provision, TemplateResources};
use hookwise_aws::{decode_task, AwsAdapters, AwsClients, AwsConfig};
use hookwise_core::model::Email;
use hookwise_core::ports::{DeliveryTask, Mailer, OutgoingEmail, PortResult, SystemClock};
use hookwise_core::services::{Config, Services};
use hookwise_core::Error;
use hookwise_http::{router, ApiState, HttpSender, SenderConfig};
use ipnet::IpNet;
use rand::SeedableRng;
use tokio::sync::watch;

// The runner's skeleton is shared with the SQLite mode.
use crate::dev::{scheduler, serve_until_shutdown, shutdown_signal, stopped};

/// The flags `hookwise dev` takes for AWS APIs (flattened into its own arguments).
#[derive(clap::Args, Debug, Clone)]
pub struct AwsFlags {
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

/// What `hookwise dev` shares between its SQLite and AWS modes.
#[derive(Debug, Clone)]
pub struct Common {
    pub listen: SocketAddr,
    pub api_key: Option<String>,
    pub owner_email: String,
    pub allow_target_cidr: Vec<IpNet>,
    pub deny_loopback: bool,
    pub scheduler_interval: u64,
    pub max_queue_delay: u32,
    pub concurrency: usize,
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

pub async fn run(args: Common, aws: AwsFlags) -> anyhow::Result<ExitCode> {
    let owner = Email::parse(&args.owner_email).context("--owner-email")?;
    let mut allow = args.allow_target_cidr.clone();
    if !args.deny_loopback {
        allow.extend(["127.0.0.0/8".parse::<IpNet>()?, "::1/128".parse()?]);
    }
    // The standard chain: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_DYNAMODB, ..._SQS, ..._SESV2),
    // AWS_REGION, credentials.
    let clients = AwsClients::from_env().await;
    let config = if aws.provision {
        let yaml =
            std::fs::read_to_string(&aws.template).with_context(|| format!("read {}", aws.template.display()))?;
        let resources = TemplateResources::parse(&yaml)?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis();
        let made = provision(&clients, &resources, &format!("{}-{stamp}", aws.aws_prefix))
            .await
            .map_err(|e| anyhow::anyhow!("provision from {}: {e}", aws.template.display()))?;
        if !aws.log_email {
            if let Err(e) = clients
                .sesv2
                .create_email_identity()
                .email_identity(&aws.sender_email)
                .send()
                .await
            {
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
        made.config(&aws.sender_email)
            .queue_max_delay_seconds(args.max_queue_delay)
            .build()?
    } else {
        AwsConfig::from_env().context("the tables and queues (or pass --provision)")?
    };

    let adapters = AwsAdapters::new(&clients, &config);
    let sender = HttpSender::new(SenderConfig {
        allow_cidrs: allow,
        ..SenderConfig::default()
    })?;
    let mut ports = adapters.ports(Arc::new(sender), Arc::new(SystemClock));
    if aws.log_email {
        ports.mailer = Arc::new(LogMailer);
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let core = Config {
        deliver_concurrency: args.concurrency,
        public_api_url: format!("http://{addr}"),
        ..Config::default()
    };
    let services = Arc::new(Services::new(ports, core, rand::rngs::StdRng::from_os_rng()));

    let api_key = args
        .api_key
        .clone()
        .unwrap_or_else(|| hookwise_core::auth::generate_api_key(&mut rand::rngs::StdRng::from_os_rng()));
    match services.authenticate(&api_key).await {
        Ok(_) => {}
        Err(Error::Unauthorized) => {
            services
                .create_tenant_with_key("dev", owner, &api_key)
                .await
                .context("create the dev tenant")?;
        }
        Err(e) => return Err(e).context("look up the dev tenant"),
    }

    let shutdown = shutdown_signal()?;
    println!("Hookwise dev (AWS APIs): listening on http://{addr}");
    println!("tables:       {} / {}", config.table, config.scheduler_table);
    println!(
        "queues:       {} / {}",
        config.delivery_queue_url, config.dead_letter_queue_url
    );
    println!("API key:      {api_key}");
    println!("try:          curl -H 'Authorization: Bearer {api_key}' http://{addr}/v1/subscriptions");

    let (stop_tx, stop) = watch::channel(false);
    let roles = [
        tokio::spawn(poll_queue(
            services.clone(),
            clients.clone(),
            config.delivery_queue_url.clone(),
            Role::Deliver,
            stop.clone(),
        )),
        tokio::spawn(poll_queue(
            services.clone(),
            clients.clone(),
            config.dead_letter_queue_url.clone(),
            Role::DeadLetter,
            stop.clone(),
        )),
        tokio::spawn(scheduler(
            services.clone(),
            Duration::from_secs(args.scheduler_interval.max(1)),
            stop.clone(),
        )),
    ];
    serve_until_shutdown(listener, router(ApiState::new(services)), shutdown, stop_tx, roles).await
}

#[derive(Clone, Copy)]
enum Role {
    Deliver,
    DeadLetter,
}

/// Lambda's SQS event source mapping in one loop: receive up to 10, handle, delete the
/// handled ones; the rest come back after the queue's visibility timeout.
async fn poll_queue(
    services: Arc<Services>,
    clients: AwsClients,
    url: String,
    role: Role,
    mut stop: watch::Receiver<bool>,
) {
    let sqs = &clients.sqs;
    while !*stop.borrow() {
        let received = tokio::select! {
            r = sqs.receive_message().queue_url(&url).max_number_of_messages(10).wait_time_seconds(2).send() => r,
            _ = stopped(&mut stop) => return,
        };
        let messages = match received {
            Ok(out) => out.messages.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, queue = %url, "receive failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut handled = Vec::new();
        let mut tasks: Vec<DeliveryTask> = Vec::new();
        let mut receipts = Vec::new();
        for m in &messages {
            match decode_task(m.body().unwrap_or_default()) {
                Ok(t) => {
                    tasks.push(t);
                    receipts.push(m.receipt_handle().unwrap_or_default().to_owned());
                }
                Err(e) => {
                    tracing::error!(error = %e, "a message that is not a delivery task; leaving it to the queue's redrive")
                }
            }
        }
        match role {
            Role::Deliver => {
                for (receipt, result) in receipts.into_iter().zip(services.deliver_batch(&tasks).await) {
                    match result {
                        Ok(_) => handled.push(receipt),
                        Err(e) => {
                            tracing::warn!(error = %e, "delivery failed; the message comes back after its visibility timeout")
                        }
                    }
                }
            }
            Role::DeadLetter => match services.handle_dead_letters(&tasks).await {
                Ok(_) => handled = receipts,
                Err(e) => {
                    tracing::warn!(error = %e, "dead-letter batch failed; it comes back after its visibility timeout")
                }
            },
        }
        for receipt in handled {
            if let Err(e) = sqs
                .delete_message()
                .queue_url(&url)
                .receipt_handle(receipt)
                .send()
                .await
            {
                tracing::warn!(error = %e, "delete failed; the message will be redelivered (and found stale)");
            }
        }
    }
}
