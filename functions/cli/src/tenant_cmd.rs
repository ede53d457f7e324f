//! `hookwise tenant`: create, list, show and change tenants, and rotate or revoke their API
//! keys, in a local data dir or (with `--aws`) a deployed stack's table.
//!
//! A key is printed once, by `create` and `rotate-key`, as JSON. The rest prints plain text,
//! or JSON with `--json`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use hookwise_aws::FunctionConfig;
use hookwise_core::model::{Email, Tenant, TenantId};
use hookwise_core::ports::{NoSender, SystemClock};
use hookwise_core::services::{Config, KeyRef, Services, TenantPatch};
use hookwise_local::LocalBackend;
use rand::SeedableRng;
use serde_json::json;

#[derive(Subcommand)]
pub enum TenantCommand {
    /// Create a tenant; prints {"id", "api_key", "key_id"} (the key is shown only here).
    Create {
        #[command(flatten)]
        on: Backend,
        #[arg(long)]
        name: String,
        #[arg(long)]
        owner_email: String,
    },
    /// Every tenant, by id.
    List {
        #[command(flatten)]
        on: Backend,
        #[command(flatten)]
        out: Output,
    },
    /// One tenant: its settings and its keys (by id; the keys themselves are not kept).
    Show {
        #[command(flatten)]
        on: Backend,
        #[command(flatten)]
        out: Output,
        tenant: String,
    },
    /// Change a tenant's settings.
    Set {
        #[command(flatten)]
        on: Backend,
        #[command(flatten)]
        out: Output,
        tenant: String,
        /// Seed 002's per-account flag: off, a failed first attempt is final.
        #[arg(long)]
        retries: Option<OnOff>,
        #[arg(long)]
        name: Option<String>,
        /// Who is told when a delivery dies (unless its subscription names someone else).
        #[arg(long)]
        owner_email: Option<String>,
    },
    /// A new key beside the current one; both work until one is revoked. Prints
    /// {"id", "api_key", "key_id"} (the key is shown only here).
    RotateKey {
        #[command(flatten)]
        on: Backend,
        tenant: String,
    },
    /// Revoke a key, named by the id `show` lists or by the key itself. It answers 401 at
    /// once, and within 30 s on a warm function or `hookwise dev` that used it.
    RevokeKey {
        #[command(flatten)]
        on: Backend,
        #[command(flatten)]
        out: Output,
        tenant: String,
        #[arg(long, required_unless_present = "api_key", conflicts_with = "api_key")]
        key_id: Option<String>,
        /// The key itself (also revokes a key an older build did not list on its tenant).
        #[arg(long)]
        api_key: Option<String>,
    },
    /// Seal every signing secret an older build stored in plain text (once, after upgrading;
    /// each subscription's next change would seal its own). Prints how many were sealed.
    SealSecrets {
        #[command(flatten)]
        on: Backend,
    },
}

/// Where the tenants are.
#[derive(Args)]
pub struct Backend {
    #[arg(long, default_value = ".hookwise")]
    data_dir: PathBuf,
    /// The deployed stack's DynamoDB table instead (HOOKWISE_TABLE and the other variables
    /// the template sets; AWS credentials and region from the usual chain).
    #[arg(long)]
    aws: bool,
}

#[derive(Args)]
pub struct Output {
    /// JSON instead of plain text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

pub async fn run(cmd: TenantCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TenantCommand::Create { on, name, owner_email } => {
            let owner = Email::parse(&owner_email).context("--owner-email")?;
            let (tenant, key) = on.services().await?.create_tenant(&name, owner).await?;
            print_new_key(&tenant, key);
        }
        TenantCommand::List { on, out } => {
            let tenants = on.services().await?.all_tenants().await?;
            if out.json {
                println!("{}", json!(tenants.iter().map(view).collect::<Vec<_>>()));
            } else {
                print_table(&tenants);
            }
        }
        TenantCommand::Show { on, out, tenant } => {
            let tenant = on.services().await?.tenant(&tenant_id(&tenant)?).await?;
            out.print(&tenant);
        }
        TenantCommand::Set {
            on,
            out,
            tenant,
            retries,
            name,
            owner_email,
        } => {
            let patch = TenantPatch {
                name,
                owner_email: owner_email
                    .map(|e| Email::parse(&e).context("--owner-email"))
                    .transpose()?,
                retries_enabled: retries.map(|r| matches!(r, OnOff::On)),
            };
            if patch.name.is_none() && patch.owner_email.is_none() && patch.retries_enabled.is_none() {
                anyhow::bail!("nothing to change: give --retries, --name or --owner-email");
            }
            let tenant = on.services().await?.update_tenant(&tenant_id(&tenant)?, &patch).await?;
            out.print(&tenant);
        }
        TenantCommand::RotateKey { on, tenant } => {
            let (tenant, key) = on.services().await?.rotate_api_key(&tenant_id(&tenant)?).await?;
            print_new_key(&tenant, key);
            eprintln!(
                "Both keys work now. Once your clients use the new one: hookwise tenant revoke-key {} --key-id {}",
                tenant.id,
                tenant.api_keys[0].id()
            );
        }
        TenantCommand::RevokeKey {
            on,
            out,
            tenant,
            key_id,
            api_key,
        } => {
            let key = match (key_id, api_key) {
                (Some(id), _) => KeyRef::Id(id),
                (None, key) => KeyRef::Key(key.context("give --key-id or --api-key")?),
            };
            let tenant = on.services().await?.revoke_api_key(&tenant_id(&tenant)?, &key).await?;
            out.print(&tenant);
            eprintln!("Revoked. A warm function or `hookwise dev` that used it takes it for up to 30 s more.");
        }
        TenantCommand::SealSecrets { on } => {
            let report = on.services().await?.seal_stored_secrets().await?;
            println!(
                "sealed the plain-text signing secrets of {} subscription(s)",
                report.sealed
            );
            if report.changed_meanwhile > 0 {
                eprintln!(
                    "{} subscription(s) changed while this ran and were left as changed: run it again",
                    report.changed_meanwhile
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn tenant_id(text: &str) -> anyhow::Result<TenantId> {
    TenantId::parse(text).with_context(|| format!("`{text}` is not a tenant id"))
}

/// The key just made: shown once.
fn print_new_key(tenant: &Tenant, key: String) {
    let key_id = tenant.api_keys.last().map(|k| k.id());
    println!("{}", json!({"id": tenant.id, "api_key": key, "key_id": key_id}));
}

/// A tenant as the commands print it: the keys by id, never their hashes.
fn view(t: &Tenant) -> serde_json::Value {
    json!({
        "id": t.id,
        "name": t.name,
        "owner_email": t.owner_email,
        "retries_enabled": t.retries_enabled,
        "created_at": t.created_at,
        "api_keys": t.api_keys.iter().map(|k| json!({"id": k.id(), "created_at": k.created_at})).collect::<Vec<_>>(),
    })
}

impl Output {
    fn print(&self, t: &Tenant) {
        if self.json {
            println!("{}", view(t));
            return;
        }
        println!("id:          {}", t.id);
        println!("name:        {}", t.name);
        println!("owner email: {}", t.owner_email);
        println!("retries:     {}", if t.retries_enabled { "on" } else { "off" });
        println!("created:     {}", t.created_at.to_rfc3339());
        if t.api_keys.is_empty() {
            println!("api keys:    none listed (a key made by an older build: revoke it with --api-key)");
        }
        for (i, k) in t.api_keys.iter().enumerate() {
            let label = if i == 0 { "api keys:" } else { "" };
            println!("{label:<12} {}  created {}", k.id(), k.created_at.to_rfc3339());
        }
    }
}

fn print_table(tenants: &[Tenant]) {
    println!("{:<30} {:<7} {:<4} {:<30} NAME", "ID", "RETRIES", "KEYS", "OWNER");
    for t in tenants {
        let retries = if t.retries_enabled { "on" } else { "off" };
        println!(
            "{:<30} {:<7} {:<4} {:<30} {}",
            t.id,
            retries,
            t.api_keys.len(),
            t.owner_email,
            t.name
        );
    }
    eprintln!("{} tenant(s)", tenants.len());
}

impl Backend {
    async fn services(&self) -> anyhow::Result<Services> {
        if self.aws {
            return Ok(FunctionConfig::from_env()
                .context("the AWS stack")?
                .services(Arc::new(NoSender))
                .await);
        }
        local_services(&self.data_dir)
    }
}

/// Services on a local data dir, for operator commands that don't deliver anything.
fn local_services(data_dir: &std::path::Path) -> anyhow::Result<Services> {
    let backend = LocalBackend::open(data_dir).with_context(|| format!("open the data dir {}", data_dir.display()))?;
    let ports = backend.ports(Arc::new(NoSender), Arc::new(SystemClock));
    Ok(Services::new(
        ports,
        Config::default(),
        rand::rngs::StdRng::from_os_rng(),
    ))
}
