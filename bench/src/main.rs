//! The `talon-bench` command: parses the flags and runs the workload (see the library).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    talon_bench::cli::run(talon_bench::cli::Cli::parse())
}
