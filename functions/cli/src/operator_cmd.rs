//! `hookwise operator` (the deployment's operator keys) and `hookwise rollout` (the
//! percentage rollout of the retries flag), in a local data dir or (with `--aws`) a deployed
//! stack's table.
//!
//! An operator key acts for any tenant: the operator routes (`/v1/tenants`, `/v1/rollout`)
//! and every tenant's routes, the tenant named by `Hookwise-Tenant`. It is printed once, by
//! `create-key`, as JSON.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use hookwise_core::model::Deployment;
use hookwise_core::services::KeyRef;
use serde_json::json;

use crate::tenant_cmd::Backend;

#[derive(Subcommand)]
pub enum OperatorCommand {
    /// A new operator key: the first, or a second beside it for a rotation (both work until
    /// one is revoked). Prints {"api_key", "key_id"} (the key is shown only here).
    CreateKey {
        #[command(flatten)]
        on: Backend,
    },
    /// Revoke an operator key, named by the id `show` lists or by the key itself. It answers
    /// 401 at once, and within 30 s on a warm function or `hookwise dev` that used it.
    RevokeKey {
        #[command(flatten)]
        on: Backend,
        #[arg(long, required_unless_present = "api_key", conflicts_with = "api_key")]
        key_id: Option<String>,
        #[arg(long)]
        api_key: Option<String>,
    },
    /// The operator keys (by id; the keys themselves are not kept) and the rollout.
    Show {
        #[command(flatten)]
        on: Backend,
    },
}

/// `hookwise rollout`: show the retries rollout, or move it.
#[derive(Args)]
pub struct RolloutArgs {
    #[command(flatten)]
    on: Backend,
    /// The share of the tenants following the rollout whose retries are on, 0 to 100. A
    /// tenant is in while a stable hash of its id is below it, so raising it keeps in every
    /// tenant that was in. Without it, the rollout is shown.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
    retries_percent: Option<u8>,
}

pub async fn run(cmd: OperatorCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        OperatorCommand::CreateKey { on } => {
            let (deployment, key) = on.services().await?.create_operator_key().await?;
            let key_id = deployment.operator_keys.last().map(|k| k.id());
            println!("{}", json!({"api_key": key, "key_id": key_id}));
            if deployment.operator_keys.len() > 1 {
                eprintln!(
                    "Both operator keys work now. Once your services use the new one: hookwise operator revoke-key --key-id {}",
                    deployment.operator_keys[0].id()
                );
            }
        }
        OperatorCommand::RevokeKey { on, key_id, api_key } => {
            let key = match (key_id, api_key) {
                (Some(id), _) => KeyRef::Id(id),
                (None, key) => KeyRef::Key(key.context("give --key-id or --api-key")?),
            };
            let deployment = on.services().await?.revoke_operator_key(&key).await?;
            print_deployment(&deployment);
            eprintln!("Revoked. A warm function or `hookwise dev` that used it takes it for up to 30 s more.");
        }
        OperatorCommand::Show { on } => print_deployment(&on.services().await?.deployment().await?),
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn rollout(args: RolloutArgs) -> anyhow::Result<ExitCode> {
    let services = args.on.services().await?;
    let deployment = match args.retries_percent {
        Some(percent) => services.set_retries_rollout(percent).await?,
        None => services.deployment().await?,
    };
    println!(
        "retries rollout: {} % of the tenants that follow it",
        deployment.retries_rollout_percent
    );
    Ok(ExitCode::SUCCESS)
}

fn print_deployment(d: &Deployment) {
    if d.operator_keys.is_empty() {
        println!("operator keys:   none (hookwise operator create-key)");
    }
    for (i, k) in d.operator_keys.iter().enumerate() {
        let label = if i == 0 { "operator keys:" } else { "" };
        println!("{label:<16} {}  created {}", k.id(), k.created_at.to_rfc3339());
    }
    println!("retries rollout: {} %", d.retries_rollout_percent);
}
