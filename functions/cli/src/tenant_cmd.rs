//! `hookwise tenant`: create, list, show and change tenants, and rotate or revoke their API
//! keys, in a local data dir or (with `--aws`) a deployed stack's table. (The operator routes
//! of the API do the same: `POST /v1/tenants` and the rest.)
//!
//! A key is printed once, by `create` and `rotate-key`, as JSON. The rest prints plain text,
//! or JSON with `--json`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use hookwise_aws::FunctionConfig;
use hookwise_core::model::{Deployment, Email, RetriesSetting, Tenant, TenantId, TenantStatus};
use hookwise_core::ports::{NoSender, SystemClock};
use hookwise_core::services::{Config, KeyRef, NewTenant, Services, TenantPatch};
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
        /// Its id: your own account id (`acct_123`; 1 to 64 letters, digits, `_` or `-`).
        /// Without it, one is made (`ten_...`).
        #[arg(long)]
        id: Option<String>,
        /// The per-account retries flag: on, off, or as the rollout decides (`hookwise rollout`).
        #[arg(long, value_enum, default_value_t = Retries::Rollout)]
        retries: Retries,
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
        /// The per-account retries flag: off, a failed first attempt is final; rollout, as
        /// `hookwise rollout` decides for this tenant.
        #[arg(long, value_enum)]
        retries: Option<Retries>,
        #[arg(long)]
        name: Option<String>,
        /// Who is told when a delivery dies (unless its subscription names someone else).
        #[arg(long)]
        owner_email: Option<String>,
        /// Disabled: its keys are refused and no event is accepted for it (what it had
        /// accepted is still delivered).
        #[arg(long, value_enum)]
        status: Option<Status>,
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
pub enum Retries {
    On,
    Off,
    Rollout,
}

impl From<Retries> for RetriesSetting {
    fn from(r: Retries) -> Self {
        match r {
            Retries::On => Self::On,
            Retries::Off => Self::Off,
            Retries::Rollout => Self::Rollout,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Status {
    Active,
    Disabled,
}

pub async fn run(cmd: TenantCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TenantCommand::Create {
            on,
            name,
            owner_email,
            id,
            retries,
        } => {
            let new = NewTenant {
                id: id.as_deref().map(tenant_id).transpose()?,
                name,
                owner_email: Email::parse(&owner_email).context("--owner-email")?,
                retries: retries.into(),
            };
            let (tenant, key) = on.services().await?.create_tenant(new).await?;
            print_new_key(&tenant, key);
        }
        TenantCommand::List { on, out } => {
            let services = on.services().await?;
            let (tenants, deployment) = (services.all_tenants().await?, services.deployment().await?);
            if out.json {
                let views: Vec<_> = tenants.iter().map(|t| view(t, &deployment)).collect();
                println!("{}", json!(views));
            } else {
                print_table(&tenants, &deployment);
            }
        }
        TenantCommand::Show { on, out, tenant } => {
            let services = on.services().await?;
            let tenant = services.tenant(&tenant_id(&tenant)?).await?;
            out.print(&tenant, &services.deployment().await?);
        }
        TenantCommand::Set {
            on,
            out,
            tenant,
            retries,
            name,
            owner_email,
            status,
        } => {
            let patch = TenantPatch {
                name,
                owner_email: owner_email
                    .map(|e| Email::parse(&e).context("--owner-email"))
                    .transpose()?,
                retries: retries.map(Into::into),
                status: status.map(|s| match s {
                    Status::Active => TenantStatus::Active,
                    Status::Disabled => TenantStatus::Disabled,
                }),
            };
            if patch.name.is_none() && patch.owner_email.is_none() && patch.retries.is_none() && patch.status.is_none()
            {
                anyhow::bail!("nothing to change: give --retries, --name, --owner-email or --status");
            }
            let services = on.services().await?;
            let tenant = services.update_tenant(&tenant_id(&tenant)?, &patch).await?;
            out.print(&tenant, &services.deployment().await?);
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
            let services = on.services().await?;
            let tenant = services.revoke_api_key(&tenant_id(&tenant)?, &key).await?;
            out.print(&tenant, &services.deployment().await?);
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

pub fn tenant_id(text: &str) -> anyhow::Result<TenantId> {
    TenantId::parse(text).with_context(|| format!("`{text}` is not a tenant id"))
}

/// The key just made: shown once.
fn print_new_key(tenant: &Tenant, key: String) {
    let key_id = tenant.api_keys.last().map(|k| k.id());
    println!("{}", json!({"id": tenant.id, "api_key": key, "key_id": key_id}));
}

/// A tenant as the commands print it: the keys by id, never their hashes; its retries as set
/// and as they are (the rollout's word for it).
fn view(t: &Tenant, deployment: &Deployment) -> serde_json::Value {
    let retries = deployment.retries_for(t);
    json!({
        "id": t.id,
        "name": t.name,
        "owner_email": t.owner_email,
        "status": t.status.as_str(),
        "retries": t.retries.as_str(),
        "retries_enabled": retries.enabled,
        "retries_why": retries.why(),
        "created_at": t.created_at,
        "api_keys": t.api_keys.iter().map(|k| json!({"id": k.id(), "created_at": k.created_at})).collect::<Vec<_>>(),
    })
}

impl Output {
    fn print(&self, t: &Tenant, deployment: &Deployment) {
        if self.json {
            println!("{}", view(t, deployment));
            return;
        }
        let retries = deployment.retries_for(t);
        println!("id:          {}", t.id);
        println!("name:        {}", t.name);
        println!("status:      {}", t.status.as_str());
        println!("owner email: {}", t.owner_email);
        println!(
            "retries:     {} ({}: {})",
            on_off(retries.enabled),
            t.retries.as_str(),
            retries.why()
        );
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

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

fn print_table(tenants: &[Tenant], deployment: &Deployment) {
    println!(
        "{:<30} {:<9} {:<15} {:<4} {:<30} NAME",
        "ID", "STATUS", "RETRIES", "KEYS", "OWNER"
    );
    for t in tenants {
        let retries = format!("{} ({})", on_off(deployment.retries_for(t).enabled), t.retries.as_str());
        println!(
            "{:<30} {:<9} {:<15} {:<4} {:<30} {}",
            t.id,
            t.status.as_str(),
            retries,
            t.api_keys.len(),
            t.owner_email,
            t.name
        );
    }
    eprintln!("{} tenant(s)", tenants.len());
}

impl Backend {
    pub async fn services(&self) -> anyhow::Result<Services> {
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
