//! Create-then-stat throughput through the client library.
//!
//! ```text
//! cargo run --release -p talon-client --example throughput -- --nodes 3 --callers 16 --files 20000
//! cargo run --release -p talon-client --example throughput -- --cluster 10.0.0.1:7001 --files 100000
//! ```
//!
//! Without `--cluster` it starts an in-process cluster (`--nodes` nodes, 8 partitions,
//! replication min(3, nodes)) in a temporary directory. `--callers` tasks share one client
//! and create `--files` files in one relaxed directory, one create per call, then stat each
//! by path from a second client with a cold cache (one RPC per stat); the rates of both
//! phases are printed.

mod common;

use anyhow::Context;
use clap::Parser;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use talon_client::{Client, ClientOptions, MkdirOptions};

#[derive(Parser)]
struct Args {
    /// Nodes of the in-process cluster (ignored with --cluster).
    #[arg(long, default_value_t = 1)]
    nodes: u64,
    /// Concurrent callers.
    #[arg(long, default_value_t = 16)]
    callers: usize,
    /// Files to create and stat.
    #[arg(long, default_value_t = 10_000)]
    files: usize,
    /// Use a running cluster (comma-separated host:port) instead of an in-process one.
    #[arg(long)]
    cluster: Option<String>,
}

/// Runs `op(i)` for i in 0..n from `callers` tasks; returns ops per second.
async fn phase<F, Fut>(n: usize, callers: usize, op: F) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let op = Arc::new(op);
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers.max(1))
        .map(|_| {
            let (next, op) = (next.clone(), op.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return anyhow::Ok(());
                    }
                    op(i).await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.context("join a caller")??;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (cluster, seeds) = common::cluster_to_measure(args.cluster.as_deref(), args.nodes).await?;
    let client = Client::connect(&seeds, ClientOptions::default()).await?;
    let dir = format!("/throughput-{}", std::process::id());
    client.mkdir(&dir, MkdirOptions::default()).await?;

    let (c, d) = (client.clone(), dir.clone());
    let creates = phase(args.files, args.callers, move |i| {
        let (c, path) = (c.clone(), format!("{d}/f{i:08}"));
        async move {
            c.create_file(&path, 0o644)
                .await
                .with_context(|| format!("create {path}"))?;
            Ok(())
        }
    })
    .await?;
    // A fresh client for the stat phase: each file is stat'ed once, so every stat is one
    // Lookup RPC to a replica (the directory resolves once and stays cached), not a hit in
    // the cache the create phase filled.
    let reader = Client::connect(&seeds, ClientOptions::default()).await?;
    let (c, d) = (reader, dir.clone());
    let stats = phase(args.files, args.callers, move |i| {
        let (c, path) = (c.clone(), format!("{d}/f{i:08}"));
        async move {
            c.stat(&path)
                .await
                .with_context(|| format!("stat {path}"))?;
            Ok(())
        }
    })
    .await?;
    println!(
        "nodes={} callers={} files={}: create {creates:.0} ops/s, stat {stats:.0} ops/s",
        if args.cluster.is_some() {
            "external".to_string()
        } else {
            args.nodes.to_string()
        },
        args.callers,
        args.files
    );
    client.remove_all(&dir).await?;
    if let Some(c) = cluster {
        c.shutdown().await;
    }
    Ok(())
}
