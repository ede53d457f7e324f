//! `hookwise`: the command line. Each subcommand lives in its own module.

mod policy_cmd;
mod storm_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "hookwise", version, about = "Durable, signed webhook delivery")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect the retry policies.
    #[command(subcommand)]
    Policy(policy_cmd::PolicyCommand),
    /// Simulate a retry storm for a policy; exit 1 when the peak breaks the deploy gate.
    Storm(storm_cmd::StormArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
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
