//! `hookwise storm`: the retry-storm calculator. Being written.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct StormArgs {}

pub fn run(_args: StormArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("hookwise storm is not built yet")
}
