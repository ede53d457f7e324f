//! `hookwise scheduler`: what an operator looks at in the scheduler table, in a local data dir
//! or (with `--aws`) a deployed stack's.
//!
//! `set-aside` lists the items the scheduler could not read as retries and moved out of the
//! way of the others (the `SchedulerItemsSetAside` metric and its alarm count them): one line
//! each, plain text.

use std::process::ExitCode;

use clap::Subcommand;
use hookwise_core::ports::SetAsideItem;

use crate::tenant_cmd::Backend;

/// Items listed per request.
const PAGE: u32 = 100;

#[derive(Subcommand)]
pub enum SchedulerCommand {
    /// The items the scheduler set aside because they could not be read as retries, oldest
    /// key first: one line each, `<set aside at>  <key>  <why>  <what it held>` (on DynamoDB
    /// its attributes as DynamoDB JSON). They expire the deliveries' retention after they were
    /// set aside on AWS. A retry one was is queued again once overdue, by the sweep or (on AWS,
    /// for a retry due within 20 minutes of its delivery's creation) the audit of queued
    /// messages; locally, such a retry waits for a replay.
    SetAside {
        #[command(flatten)]
        on: Backend,
    },
}

pub async fn run(cmd: SchedulerCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SchedulerCommand::SetAside { on } => {
            let services = on.services().await?;
            let scheduler = &services.ports().scheduler;
            let mut after: Option<String> = None;
            let mut listed = 0;
            loop {
                let page = scheduler.set_aside(after.as_deref(), PAGE).await?;
                for item in &page {
                    println!("{}", line(item));
                }
                listed += page.len();
                match page.last() {
                    Some(last) if page.len() == PAGE as usize => after = Some(last.key.clone()),
                    _ => break,
                }
            }
            if listed == 0 {
                eprintln!("No scheduler items are set aside.");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One item on one line: its fields two spaces apart, line breaks in them escaped.
fn line(item: &SetAsideItem) -> String {
    let one_line = |text: &str| text.replace('\r', "\\r").replace('\n', "\\n");
    format!(
        "{}  {}  {}  {}",
        item.set_aside_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        one_line(&item.key),
        one_line(&item.error),
        one_line(&item.raw)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_one_line_whatever_it_held() {
        let item = SetAsideItem {
            key: "2031-01-01T08:03#3 x".into(),
            set_aside_at: "2031-01-01T08:04:05.5Z".parse().unwrap(),
            error: "stored item does not decode (due)".into(),
            raw: "{\n \"due\": 1}".into(),
        };
        assert_eq!(
            line(&item),
            "2031-01-01T08:04:05Z  2031-01-01T08:03#3 x  stored item does not decode (due)  {\\n \"due\": 1}"
        );
    }
}
