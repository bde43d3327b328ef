//! `talon-jepsen`: run a workload against a fresh cluster under faults and print a verdict,
//! or check a recorded history again.
//!
//! Exit status: 0 when the history is valid, 1 when the checker found anomalies, 2 when
//! the run could not reach a verdict.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;
use talon_jepsen::history::read_history;
use talon_jepsen::nemesis::{NemesisKind, ScheduleMode};
use talon_jepsen::run::RunConfig;
use talon_jepsen::workload::WorkloadKind;

#[derive(Parser)]
#[command(
    name = "talon-jepsen",
    about = "Fault injection on a real Talon cluster"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a cluster, run a workload under faults, check the history.
    Run(Box<RunArgs>),
    /// Check a recorded history (history.jsonl) again.
    Check {
        /// The workload that produced it.
        #[arg(long, value_enum)]
        workload: WorkloadKind,
        /// Check leniently (see `run --lenient`).
        #[arg(long)]
        lenient: bool,
        /// The history file.
        history: PathBuf,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The workload.
    #[arg(long, value_enum)]
    workload: WorkloadKind,
    /// Fault kinds, comma-separated (default: all). `none` runs without faults.
    #[arg(long, value_delimiter = ',')]
    nemesis: Vec<String>,
    /// `each`: every kind in turn; `random`: random kinds, sometimes two at once.
    #[arg(long, value_enum, default_value = "random")]
    schedule: ScheduleMode,
    /// Seed of every random choice (default: from the clock; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds workers run.
    #[arg(long, default_value_t = 30)]
    time: u64,
    /// Most operations.
    #[arg(long, default_value_t = 1_000_000)]
    ops: u64,
    /// Number of nodes.
    #[arg(long, default_value_t = 5)]
    nodes: u64,
    /// Replicas per partition.
    #[arg(long, default_value_t = 3)]
    replication: u32,
    /// Number of partitions.
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// Number of workers.
    #[arg(long, default_value_t = 6)]
    concurrency: u64,
    /// Operations per register or checkpoint key.
    #[arg(long, default_value_t = 15)]
    ops_per_key: u64,
    /// Checkpoint size in KiB.
    #[arg(long, default_value_t = 5 * 1024 + 12)]
    checkpoint_kib: usize,
    /// Shortest and longest time a fault is held, seconds.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    hold: Vec<f64>,
    /// Quiet seconds between faults.
    #[arg(long, default_value_t = 1.5)]
    quiet: f64,
    /// The talon-meta binary (default: $TALON_META_BIN, else next to this binary).
    #[arg(long)]
    meta_bin: Option<PathBuf>,
    /// Directory for the run's temporary working directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the working directory (history, node logs and data) even when valid.
    #[arg(long)]
    keep: bool,
    /// The `talon` binary, for `set-fuse` (default: $TALON_BIN, else next to this binary).
    #[arg(long)]
    talon_bin: Option<PathBuf>,
    /// Size of each node's data file system (a tmpfs) when disk faults are on, MiB.
    #[arg(long, default_value_t = 2048)]
    disk_mib: u64,
    /// Check leniently: answers Talon's client may have guessed after a lost reply (a
    /// rename's ENOENT or EEXIST, an unlink's success) count as unknown (finding F1).
    #[arg(long)]
    lenient: bool,
    /// Snapshot partitions after this many log entries, so that nodes back from a fault
    /// are sent snapshots (default: 300 when the crash fault is on, which can crash a node
    /// inside a snapshot install; else the server's own).
    #[arg(long)]
    snapshot_every: Option<u64>,
    /// The nodes' log filter, in `RUST_LOG` syntax (for example
    /// `warn,openraft=debug`); the logs are in the kept working directory. The default
    /// keeps the trace of strict reads (target `talon_meta::strict_reads`).
    #[arg(long, default_value = talon_jepsen::run::DEFAULT_NODE_LOG)]
    node_log: String,
    /// The nodes' relaxed staleness bound, ms (default: the server's, 2000). A client reads
    /// what it changed from the leader for twice the bound, then from any replica: a short
    /// bound makes reads of its own changes reach followers right after a failover.
    #[arg(long)]
    staleness_ms: Option<u64>,
    /// The nodes' unlinked grace, ms (default: the server's, 30000): how long a replaced
    /// or unlinked file, and the chunks a rewrite in place took out, are kept before they
    /// are reclaimed. A short one makes the reclaims run within a run.
    #[arg(long)]
    unlinked_grace_ms: Option<u64>,
}

fn meta_bin(arg: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = arg.or_else(|| std::env::var_os("TALON_META_BIN").map(PathBuf::from)) {
        return Ok(p);
    }
    let exe = std::env::current_exe().context("find this binary")?;
    let p = exe
        .parent()
        .context("find this binary's directory")?
        .join("talon-meta");
    anyhow::ensure!(
        p.exists(),
        "no talon-meta next to {} (build it with `cargo build -p talon-meta`, or pass --meta-bin)",
        exe.display()
    );
    Ok(p)
}

fn config(a: RunArgs) -> anyhow::Result<RunConfig> {
    let mut c = RunConfig::new(a.workload, meta_bin(a.meta_bin)?);
    c.nemeses = if a.nemesis.is_empty() {
        NemesisKind::ALL.to_vec()
    } else if a.nemesis.iter().any(|n| n == "none") {
        Vec::new()
    } else {
        a.nemesis
            .iter()
            .map(|n| {
                <NemesisKind as clap::ValueEnum>::from_str(n, true)
                    .map_err(|e| anyhow::anyhow!("--nemesis {n}: {e}"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    c.mode = a.schedule;
    c.seed = match a.seed {
        Some(s) => s,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    };
    c.time = Duration::from_secs(a.time);
    c.ops = a.ops;
    c.nodes = a.nodes;
    c.replication = a.replication;
    c.partitions = a.partitions;
    c.concurrency = a.concurrency.max(1);
    c.ops_per_key = a.ops_per_key;
    c.checkpoint_bytes = a.checkpoint_kib * 1024;
    anyhow::ensure!(a.hold.len() == 2, "--hold takes MIN,MAX");
    c.timing.hold_min = Duration::from_secs_f64(a.hold[0]);
    c.timing.hold_max = Duration::from_secs_f64(a.hold[1]);
    c.timing.quiet = Duration::from_secs_f64(a.quiet);
    c.dir = a.dir;
    c.keep = a.keep;
    c.lenient = a.lenient;
    c.disk_mib = a.disk_mib;
    c.node_log = a.node_log;
    c.staleness_ms = a.staleness_ms;
    c.unlinked_grace_ms = a.unlinked_grace_ms;
    c.snapshot_every = a
        .snapshot_every
        .or_else(|| c.nemeses.contains(&NemesisKind::Crash).then_some(300));
    c.talon_bin = match a
        .talon_bin
        .or_else(|| std::env::var_os("TALON_BIN").map(PathBuf::from))
    {
        Some(p) => p,
        None => std::env::current_exe()
            .context("find this binary")?
            .parent()
            .context("find this binary's directory")?
            .join("talon"),
    };
    Ok(c)
}

async fn interrupted() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("talon-jepsen: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn real_main() -> anyhow::Result<bool> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Check {
            workload,
            lenient,
            history,
        } => {
            let events = read_history(&history)?;
            let v = workload.check(&events, lenient);
            println!("checked: {}", v.checked);
            for a in &v.anomalies {
                println!("ANOMALY: {a}");
            }
            println!("verdict: {}", if v.valid { "VALID" } else { "INVALID" });
            Ok(v.valid)
        }
        Cmd::Run(args) => {
            let cfg = config(*args)?;
            // Before any thread exists: only threads started afterwards share the namespace.
            let ns = talon_jepsen::net::enter_private_netns()?;
            // Colours only on a terminal, as the nodes' logs.
            tracing_subscriber::fmt()
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "warn".into()),
                )
                .with_writer(std::io::stderr)
                .init();
            println!(
                "talon-jepsen: workload {} seed {} (network namespace {})",
                cfg.workload.name(),
                cfg.seed,
                ns.id()
            );
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("start the async runtime")?;
            let outcome = rt.block_on(async {
                tokio::select! {
                    r = talon_jepsen::run::run(&cfg, &ns) => Some(r),
                    _ = interrupted() => None,
                }
            });
            // Dropping the runtime drops every task, and with them the cluster: its nodes
            // are killed before this process exits.
            rt.shutdown_timeout(Duration::from_secs(10));
            match outcome {
                None => anyhow::bail!("interrupted; every node was stopped"),
                Some(r) => {
                    let report = r?;
                    println!("{}", report.summary);
                    Ok(report.verdict.valid)
                }
            }
        }
    }
}
