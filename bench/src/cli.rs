//! The command line: one subcommand per workload, each printing its report (a table, or
//! JSON with `--json -`) and writing it to a JSON file when asked.

use crate::imagenet::{self, ImagenetArgs};
use crate::mdtest::{self, MdtestArgs};
use crate::memfs::{self, MemfsArgs};
use crate::records::{self, RecordsArgs};
use crate::traverse::{self, TraverseArgs};
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
    /// Build a class-per-directory tree of JPEG-sized files, then read it in shuffled
    /// epochs by K workers; optionally emulate accelerators that need a batch every T ms.
    Imagenet(ImagenetArgs),
    /// Build a deep tree and open and read its leaf files in random order.
    Traverse(TraverseArgs),
    /// Write a few large shards, then read small records at random offsets of them, as a
    /// language model's data loader reads a tokenized dataset.
    Records(RecordsArgs),
    /// Mount an in-memory file system through FUSE with the options of Talon's mount, and
    /// serve it until interrupted: the ceiling of a FUSE file system on this machine.
    Memfs(MemfsArgs),
}

/// Runs the workload the command line names; fails if any operation failed.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Mdtest(args) => {
            let report = mdtest::run(&args)?;
            emit(&report, &report.table(), args.json.as_deref())?;
            anyhow::ensure!(report.errors == 0, "{} operations failed", report.errors);
        }
        Command::Imagenet(args) => {
            let report = imagenet::run(&args)?;
            emit(&report, &report.table(), args.json.as_deref())?;
            anyhow::ensure!(report.errors == 0, "{} operations failed", report.errors);
        }
        Command::Traverse(args) => {
            let report = traverse::run(&args)?;
            emit(&report, &report.table(), args.json.as_deref())?;
            anyhow::ensure!(report.errors == 0, "{} operations failed", report.errors);
        }
        Command::Records(args) => {
            let report = records::run(&args)?;
            emit(&report, &report.table(), args.json.as_deref())?;
            anyhow::ensure!(report.errors == 0, "{} operations failed", report.errors);
        }
        Command::Memfs(args) => memfs::run(&args)?,
    }
    Ok(())
}

/// A report table for the terminal: no borders, a header row, every column aligned right
/// (the cells are numbers) with two spaces before it. Print it with [`render`].
pub fn plain_table(header: &[&str]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_header(header.iter().copied());
    for c in t.column_iter_mut() {
        c.set_padding((2, 0));
        c.set_cell_alignment(comfy_table::CellAlignment::Right);
    }
    t
}

/// `t`'s lines, each ending in a newline.
pub fn render(t: &comfy_table::Table) -> String {
    t.lines().map(|l| l + "\n").collect()
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
