//! `hookwise tenant create`: a tenant and its API key, in a local data dir or (with `--aws`)
//! a deployed stack's table; printed as JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Subcommand;
use hookwise_aws::FunctionConfig;
use hookwise_core::model::Email;
use hookwise_core::ports::{NoSender, SystemClock};
use hookwise_core::services::{Config, Ports, Services};
use hookwise_local::LocalBackend;
use rand::SeedableRng;

#[derive(Subcommand)]
pub enum TenantCommand {
    /// Create a tenant; prints {"id", "api_key"} (the key is shown only here).
    Create {
        #[arg(long, default_value = ".hookwise")]
        data_dir: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        owner_email: String,
        /// Create it in the deployed stack's DynamoDB table instead (HOOKWISE_TABLE and the
        /// other variables the template sets, AWS credentials and region from the usual chain).
        #[arg(long)]
        aws: bool,
    },
}

pub async fn run(cmd: TenantCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TenantCommand::Create {
            data_dir,
            name,
            owner_email,
            aws,
        } => {
            let owner = Email::parse(&owner_email).context("--owner-email")?;
            let services = if aws {
                FunctionConfig::from_env()
                    .context("the AWS stack")?
                    .services(Arc::new(NoSender))
                    .await
            } else {
                local_services(&data_dir)?
            };
            let (tenant, key) = services.create_tenant(&name, owner).await?;
            println!("{}", serde_json::json!({"id": tenant.id, "api_key": key}));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Services on a local data dir, for operator commands that don't deliver anything.
fn local_services(data_dir: &std::path::Path) -> anyhow::Result<Services> {
    let backend =
        Arc::new(LocalBackend::open(data_dir).with_context(|| format!("open the data dir {}", data_dir.display()))?);
    let ports = Ports {
        store: backend.clone(),
        queue: backend.clone(),
        scheduler: backend.clone(),
        mailer: backend,
        sender: Arc::new(NoSender),
        clock: Arc::new(SystemClock),
    };
    Ok(Services::new(
        ports,
        Config::default(),
        rand::rngs::StdRng::from_os_rng(),
    ))
}
