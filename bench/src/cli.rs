//! The command line: one subcommand per workload, each printing its report (a table, or
//! JSON with `--json -`) and writing it to a JSON file when asked.

use crate::mdtest::{self, MdtestArgs};
use anyhow::Context;
use serde::Serialize;
use std::path::Path;

/// `talon-bench`: mdtest and AI-loader workloads over any mounted path or Talon's library.
#[derive(clap::Parser, Debug)]
#[command(name = "talon-bench", version, about)]
pub struct Cli {
    /// The workload.
    #[command(subcommand)]
    pub command: Command,
}

/// The workloads.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// IOR mdtest's metadata workload (same flags, phases and SUMMARY table).
    Mdtest(MdtestArgs),
}

/// Runs the workload the command line names; fails if any operation failed.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Mdtest(args) => {
            let report = mdtest::run(&args)?;
            emit(&report, &report.table(), args.json.as_deref())?;
            anyhow::ensure!(report.errors == 0, "{} operations failed", report.errors);
        }
    }
    Ok(())
}

/// Prints `table` (or the JSON when `json` is `-`) and writes the JSON file if asked.
pub fn emit<R: Serialize>(report: &R, table: &str, json: Option<&Path>) -> anyhow::Result<()> {
    match json {
        Some(p) if p == Path::new("-") => {
            println!(
                "{}",
                serde_json::to_string_pretty(report).context("encode the report")?
            );
        }
        Some(p) => {
            print!("{table}");
            let text = serde_json::to_string_pretty(report).context("encode the report")?;
            std::fs::write(p, text + "\n")
                .with_context(|| format!("write the report to {}", p.display()))?;
        }
        None => print!("{table}"),
    }
    Ok(())
}
