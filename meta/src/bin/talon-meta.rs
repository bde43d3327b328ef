//! `talon-meta`: initialise a cluster's configuration, start a node, or show status.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use talon_meta::config::{Config, NodeEntry};

/// Rust's allocations go to jemalloc, RocksDB's stay with the C library's malloc (which
/// `talon_meta::malloc` keeps within the node's budget), as in the `talon` binary, where it
/// took less CPU for about the same peak memory (bench/README.md, "Rust's allocations
/// through jemalloc").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "talon-meta", about = "Talon's metadata server")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write one config file per node for a new cluster.
    Init {
        /// Nodes as id=host:port, comma-separated (e.g. 1=127.0.0.1:7001,2=127.0.0.1:7002).
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// Number of partitions.
        #[arg(long, default_value_t = 16)]
        partitions: u32,
        /// Replicas per partition (default: 3, or the number of nodes if fewer).
        #[arg(long)]
        replication: Option<u32>,
        /// Strict path prefixes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "/checkpoints,/control")]
        strict: Vec<String>,
        /// Directory under which each node's data directory (nodeN) is placed.
        #[arg(long, default_value = "talon-data")]
        data_root: PathBuf,
        /// Directory to write nodeN.toml files into.
        #[arg(long, default_value = ".")]
        out: PathBuf,
    },
    /// Run a node until SIGINT or SIGTERM.
    Start {
        /// The node's config file.
        #[arg(long)]
        config: PathBuf,
    },
    /// List the fail points this build can arm (builds with the `failpoints` feature only).
    FailPoints,
    /// Print the Raft state of every partition on a node.
    Status {
        /// The node's address (host:port).
        #[arg(long, default_value = "127.0.0.1:7001")]
        addr: String,
        /// Give up after this many seconds (connecting and answering together).
        #[arg(long, default_value_t = 10)]
        timeout: u64,
    },
}

fn parse_node(s: &str) -> anyhow::Result<NodeEntry> {
    let (id, addr) = s
        .split_once('=')
        .with_context(|| format!("node {s:?} is not id=host:port"))?;
    Ok(NodeEntry {
        id: id
            .trim()
            .parse()
            .with_context(|| format!("node id {id:?}"))?,
        addr: addr.trim().to_string(),
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Colours only on a terminal: a log redirected to a file stays plain text.
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .init();
    match Cli::parse().cmd {
        Cmd::Init {
            nodes,
            partitions,
            replication,
            strict,
            data_root,
            out,
        } => {
            let nodes: Vec<NodeEntry> = nodes
                .iter()
                .map(|s| parse_node(s))
                .collect::<anyhow::Result<_>>()?;
            std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
            for n in &nodes {
                let mut c = Config {
                    node_id: n.id,
                    listen: n.addr.clone(),
                    data_dir: data_root.join(format!("node{}", n.id)),
                    ..Config::default()
                };
                c.cluster.nodes = nodes.clone();
                c.cluster.partitions = partitions;
                c.cluster.replication = replication.unwrap_or(3.min(nodes.len() as u32));
                c.cluster.strict_prefixes =
                    strict.iter().filter(|s| !s.is_empty()).cloned().collect();
                c.validate()?;
                let path = out.join(format!("node{}.toml", n.id));
                std::fs::write(&path, toml::to_string_pretty(&c)?)
                    .with_context(|| format!("write {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        Cmd::Start { config } => {
            let text = std::fs::read_to_string(&config)
                .with_context(|| format!("read {}", config.display()))?;
            let c = Config::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
            c.validate()?;
            talon_meta::failpoints::follow_env();
            talon_meta::server::run(c, shutdown_signal()).await?;
            Ok(())
        }
        Cmd::FailPoints => {
            anyhow::ensure!(
                talon_meta::failpoints::ENABLED,
                "this talon-meta was built without fail points \
                 (cargo build -p talon-meta --features failpoints)"
            );
            for (name, step) in talon_meta::failpoints::POINTS {
                println!("{name}\t{step}");
            }
            Ok(())
        }
        Cmd::Status { addr, timeout } => {
            let ask = async {
                let mut client = talon_proto::v1::namespace_client::NamespaceClient::connect(
                    format!("http://{addr}"),
                )
                .await
                .with_context(|| format!("connect {addr}"))?;
                let s = client
                    .status(talon_proto::v1::StatusRequest {})
                    .await
                    .with_context(|| format!("status of {addr}"))?;
                anyhow::Ok(s.into_inner())
            };
            let s = tokio::time::timeout(std::time::Duration::from_secs(timeout), ask)
                .await
                .map_err(|_| anyhow::anyhow!("{addr} did not answer within {timeout} s"))??;
            println!("node {} at {}", s.node_id, s.addr);
            println!(
                "space: {} ({:.1}% of {} bytes used, {} bytes writable)",
                s.space_level,
                s.space_used * 100.0,
                s.space_total_bytes,
                s.space_usable_bytes
            );
            let mib = |b: u64| b as f64 / f64::from(1 << 20);
            println!(
                "memory: {:.0} MiB resident ({:.0} MiB peak); memtables {:.1} MiB, table readers {:.1} MiB, cache {:.1} MiB ({:.1} MiB pinned)",
                mib(s.memory_resident),
                mib(s.memory_peak_resident),
                mib(s.memory_memtables),
                mib(s.memory_table_readers),
                mib(s.memory_cache),
                mib(s.memory_cache_pinned)
            );
            // Appends per sync is the group commit's factor: how many Raft appends of all
            // partitions each fsync of the log made durable.
            println!(
                "log: {} appends made durable by {} syncs ({:.2} per sync)",
                s.log_appends,
                s.log_syncs,
                s.log_appends as f64 / s.log_syncs.max(1) as f64
            );
            let mut table = comfy_table::Table::new();
            table
                .load_preset(comfy_table::presets::NOTHING)
                .set_header([
                    "partition",
                    "role",
                    "leader",
                    "term",
                    "last_log",
                    "applied",
                    "entries",
                    "inodes",
                ]);
            for p in s.partitions {
                table.add_row(vec![
                    p.id.to_string(),
                    p.role,
                    p.leader.to_string(),
                    p.term.to_string(),
                    p.last_log_index.to_string(),
                    p.applied_index.to_string(),
                    p.entries.to_string(),
                    p.inodes.to_string(),
                ]);
            }
            for (i, c) in table.column_iter_mut().enumerate() {
                c.set_padding((0, 2));
                if i != 1 {
                    c.set_cell_alignment(comfy_table::CellAlignment::Right);
                }
            }
            for line in table.lines() {
                println!("{}", line.trim_end());
            }
            Ok(())
        }
    }
}
