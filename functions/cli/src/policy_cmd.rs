//! `hookwise policy show NAME [--json]`: a named policy's schedule with jitter off.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use hookwise_core::policy::{RetryPolicy, POLICY_NAMES};
use serde_json::json;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Print a policy's schedule: attempt, delay before it, time since the first attempt.
    Show {
        /// standard, ledger or exponential
        name: String,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the named policies.
    List,
}

pub fn run(cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::List => {
            for name in POLICY_NAMES {
                let p = RetryPolicy::named(name)?;
                println!(
                    "{name:<12} {} attempts, jitter {}, adaptive {}",
                    p.max_attempts(),
                    p.jitter.label(),
                    if p.adaptive { "on" } else { "off" }
                );
            }
        }
        PolicyCommand::Show { name, json } => {
            let policy = RetryPolicy::named(&name).context("policy show")?;
            let rows = policy.nominal_schedule();
            let dead_after = rows.last().map_or(0.0, |r| r.2);
            if json {
                let attempts: Vec<_> = rows
                    .iter()
                    .map(|(n, d, c)| json!({"attempt": n, "delay_seconds": *d as u64, "cumulative_seconds": *c as u64}))
                    .collect();
                let doc = json!({"policy": name, "attempts": attempts, "dead_after_seconds": dead_after as u64});
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!(
                    "policy {name}: {} attempts, jitter {} (off below), adaptive {}",
                    policy.max_attempts(),
                    policy.jitter.label(),
                    if policy.adaptive { "on" } else { "off" }
                );
                println!("{:>7}  {:>20}  {:>24}", "attempt", "delay", "since first");
                for (n, d, c) in rows {
                    println!("{n:>7}  {:>20}  {:>24}", human(d), human(c));
                }
                println!(
                    "dead when attempt {} fails: {} after the first",
                    policy.max_attempts(),
                    human(dead_after)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `0`, `1m`, `2h 36m`, `3d 10h 36m` alongside the exact seconds.
fn human(seconds: f64) -> String {
    let s = seconds as u64;
    let (d, h, m, sec) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60, s % 60);
    let mut parts = Vec::new();
    if d > 0 {
        parts.push(format!("{d}d"));
    }
    if h > 0 {
        parts.push(format!("{h}h"));
    }
    if m > 0 {
        parts.push(format!("{m}m"));
    }
    if sec > 0 || parts.is_empty() {
        parts.push(format!("{sec}s"));
    }
    format!("{} ({s} s)", parts.join(" "))
}
