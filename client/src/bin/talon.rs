//! The `talon` command. Parses arguments, sets up logging, and hands over to
//! `talon_client::cli::run`.

use clap::Parser;
use talon_client::cli::{run, Cli};

/// Rust's allocations go to jemalloc; RocksDB's (memtables, cached blocks) stay with the C
/// library's malloc, which `talon_meta::malloc` keeps within the node's budget. Alternated
/// with the C library's malloc on a fresh `talon up`, mdtest's creates and removes through
/// the mount were a tenth or more faster for less CPU, with a peak resident memory within a
/// few MiB of glibc's (bench/README.md, "Rust's allocations through jemalloc").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Colours only on a terminal: a log redirected to a file stays plain text.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("talon: start runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(cli));
    std::process::ExitCode::from(code.clamp(0, 255) as u8)
}
