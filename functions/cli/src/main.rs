//! `hookwise`: the command line. Each subcommand lives in its own module.

mod dev;
mod dev_aws;
mod dev_host;
mod operator_cmd;
mod policy_cmd;
mod scheduler_cmd;
mod storm_chart;
mod storm_cmd;
mod tenant_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

// `hookwise dev` allocates per request and per delivery on several threads; mimalloc does
// that for less CPU than glibc's malloc (measured by scripts/bench-delivery.sh).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "hookwise", version, about = "Durable, signed webhook delivery")]
struct Cli {
    /// What to log, as a tracing filter (`warn`, `info,hookwise_core=debug`).
    #[arg(long, global = true, env = "HOOKWISE_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect the retry policies.
    #[command(subcommand)]
    Policy(policy_cmd::PolicyCommand),
    /// Run Hookwise locally: API, delivery worker, scheduler and dead-letter handler on an
    /// embedded store (no AWS, no Docker).
    Dev(DevArgs),
    /// Manage tenants, in a local data dir or (with --aws) a deployed stack.
    #[command(subcommand)]
    Tenant(tenant_cmd::TenantCommand),
    /// Manage the deployment's operator keys (they act for any tenant).
    #[command(subcommand)]
    Operator(operator_cmd::OperatorCommand),
    /// Show or move the percentage rollout of the retries flag.
    Rollout(operator_cmd::RolloutArgs),
    /// Look into the scheduler table: the items it set aside.
    #[command(subcommand)]
    Scheduler(scheduler_cmd::SchedulerCommand),
    /// Simulate a retry storm for a policy; exit 1 when the peak breaks the deploy gate.
    Storm(storm_cmd::StormArgs),
}

/// `hookwise dev`'s flags: the common ones and each mode's own.
#[derive(clap::Args)]
struct DevArgs {
    #[command(flatten)]
    common: dev_host::CommonArgs,
    #[command(flatten)]
    local: dev::LocalArgs,
    #[command(flatten)]
    aws: dev_aws::AwsArgs,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = match tracing_subscriber::EnvFilter::try_new(&cli.log) {
        Ok(filter) => filter,
        Err(err) => {
            eprintln!(
                "error: --log / HOOKWISE_LOG `{}` is not a tracing filter: {err}",
                cli.log
            );
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Dev(args) if args.aws.aws => runtime().and_then(|rt| rt.block_on(dev_aws::run(args.common, args.aws))),
        Command::Dev(args) => runtime().and_then(|rt| rt.block_on(dev::run(args.common, args.local))),
        Command::Tenant(cmd) => runtime().and_then(|rt| rt.block_on(tenant_cmd::run(cmd))),
        Command::Operator(cmd) => runtime().and_then(|rt| rt.block_on(operator_cmd::run(cmd))),
        Command::Rollout(args) => runtime().and_then(|rt| rt.block_on(operator_cmd::rollout(args))),
        Command::Scheduler(cmd) => runtime().and_then(|rt| rt.block_on(scheduler_cmd::run(cmd))),
        Command::Policy(cmd) => policy_cmd::run(cmd),
        Command::Storm(args) => storm_cmd::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
