//! ImageNet-style load: import N files of ~110 KB (random bytes) in a class-per-directory
//! tree through `Client::import`, then read them all back in random order with 1 and 16
//! concurrent readers through the library; and, as the ceiling, the same reads from the
//! local copy with plain tokio fs.
//!
//! ```text
//! cargo run --release -p talon-client --example imagenet -- --nodes 1 --files 20000
//! cargo run --release -p talon-client --example imagenet -- --nodes 3 --files 20000
//! cargo run --release -p talon-client --example imagenet -- --cluster 10.0.0.1:7001
//! ```
//!
//! Without `--cluster` it starts an in-process cluster (`--nodes` nodes, 8 partitions,
//! replication min(3, nodes)) in a temporary directory. The local tree is made in a
//! temporary directory (or `--local DIR`, reused if it already holds the files).

mod common;

use anyhow::Context;
use clap::Parser;
use futures::stream::{self, StreamExt, TryStreamExt};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::time::Instant;
use talon_client::{Client, ClientOptions, ImportOptions, ImportProgress};

#[derive(Parser)]
struct Args {
    /// Nodes of the in-process cluster (ignored with --cluster).
    #[arg(long, default_value_t = 1)]
    nodes: u64,
    /// Files to import and read.
    #[arg(long, default_value_t = 10_000)]
    files: usize,
    /// Class directories.
    #[arg(long, default_value_t = 100)]
    classes: usize,
    /// Mean file size in bytes (sizes vary by ±25%).
    #[arg(long, default_value_t = 110_000)]
    size: usize,
    /// Reader concurrencies to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    readers: Vec<usize>,
    /// Use a running cluster (comma-separated host:port) instead of an in-process one.
    #[arg(long)]
    cluster: Option<String>,
    /// Local directory for the source tree (default: a temporary one).
    #[arg(long)]
    local: Option<PathBuf>,
}

fn rel_path(i: usize, classes: usize) -> String {
    format!("n{:08}/img_{i:08}.JPEG", i % classes.max(1))
}

/// Writes the local tree unless it is already there.
fn make_tree(root: &Path, args: &Args) -> anyhow::Result<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut bytes = 0;
    for c in 0..args.classes.max(1) {
        std::fs::create_dir_all(root.join(format!("n{c:08}"))).context("make a class dir")?;
    }
    for i in 0..args.files {
        let path = root.join(rel_path(i, args.classes));
        let len = rng.random_range(args.size * 3 / 4..=args.size * 5 / 4);
        bytes += len as u64;
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == len as u64) {
            continue;
        }
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        std::fs::write(&path, data).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(bytes)
}

/// Reads every file once in `order` with `readers` concurrent readers; returns (files/s,
/// MB/s).
async fn read_all<F, Fut>(order: &[usize], readers: usize, read: F) -> anyhow::Result<(f64, f64)>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<usize>>,
{
    let start = Instant::now();
    let bytes: usize = stream::iter(order.iter().map(|i| read(*i)))
        .buffer_unordered(readers.max(1))
        .try_fold(0, |sum, n| async move { Ok(sum + n) })
        .await?;
    let secs = start.elapsed().as_secs_f64();
    Ok((order.len() as f64 / secs, bytes as f64 / 1e6 / secs))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (cluster, seeds) = common::cluster_to_measure(args.cluster.as_deref(), args.nodes).await?;
    let tmp = tempfile::tempdir().context("make a temporary directory")?;
    let local = args.local.clone().unwrap_or_else(|| tmp.path().join("src"));
    let t = Instant::now();
    let total = make_tree(&local, &args)?;
    println!(
        "local tree: {} files, {:.1} MB in {} classes ({:.1} s)",
        args.files,
        total as f64 / 1e6,
        args.classes,
        t.elapsed().as_secs_f64()
    );

    let client = Client::connect(&seeds, ClientOptions::default()).await?;
    let dst = format!("/imagenet-{}", std::process::id());
    let progress = ImportProgress::default();
    let summary = client
        .import(&local, &dst, &ImportOptions::default(), &progress)
        .await?;
    anyhow::ensure!(summary.failed == 0, "import failed: {:?}", summary.failures);
    println!(
        "import: {:.0} files/s, {:.1} MB/s ({summary})",
        summary.files_per_sec(),
        summary.mb_per_sec()
    );

    let mut order: Vec<usize> = (0..args.files).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(2));
    let nodes = match &args.cluster {
        Some(_) => "external".to_string(),
        None => args.nodes.to_string(),
    };
    for &readers in &args.readers {
        let (client, dst) = (&client, &dst);
        let (fps, mbps) = read_all(&order, readers, |i| async move {
            let path = format!("{dst}/{}", rel_path(i, args.classes));
            let data = client
                .read_file(&path)
                .await
                .with_context(|| format!("read {path}"))?;
            Ok(data.len())
        })
        .await?;
        println!("talon nodes={nodes} readers={readers}: {fps:.0} files/s, {mbps:.1} MB/s");
        let local = &local;
        let (fps, mbps) = read_all(&order, readers, |i| async move {
            let path = local.join(rel_path(i, args.classes));
            let data = tokio::fs::read(&path)
                .await
                .with_context(|| format!("read {}", path.display()))?;
            Ok(data.len())
        })
        .await?;
        println!("local fs readers={readers}: {fps:.0} files/s, {mbps:.1} MB/s (page cache)");
    }
    client.remove_all(&dst).await?;
    if let Some(c) = cluster {
        c.shutdown().await;
    }
    Ok(())
}
