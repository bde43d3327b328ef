//! An ImageNet-style namespace, scaled down, in bounded memory: three `talon-meta`
//! processes with a small memory budget and frequent snapshots; 100,000 small files in
//! 100 class directories imported through the library; one node killed while 20,000 more
//! are imported, until its leaders have purged the log it stopped in, so that it can catch
//! up only by installing their snapshots; then it is restarted and must hold what they
//! hold. Every file reads back whole, and every node's peak resident memory stays within
//! its configured budget plus a fixed allowance. (`bench/scale` is the full-size run; this
//! is its test.)

mod common;

use common::{eventually, test_raft, ProcCluster};
use futures::stream::{self, StreamExt};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use talon_client::{Client, ClientOptions, ImportOptions, ImportProgress, PartitionStatus};

/// Two partitions, so that each holds half the data (about 150 MB): a snapshot built or
/// installed in memory, as it once was, would show in the peaks.
const PARTITIONS: u32 = 2;
const CLASSES: usize = 100;
const FILES: usize = 100_000;
const MORE: usize = 20_000;
/// The node's memtable budget and read cache (`[storage]`).
const WRITE_BUFFER: u64 = 16 << 20;
const CACHE: u64 = 32 << 20;
/// What a node holds besides that budget: the runtime, Raft groups, RocksDB's table
/// readers, gRPC buffers, in a debug build (peaks of 81-97 MiB were seen with the budget's
/// 48). Below a partition's data, which a snapshot held in memory would add.
const ALLOWANCE: u64 = 128 << 20;

/// Contents of file `i`: 1-4 KiB, derived from `i`.
fn body(i: usize) -> Vec<u8> {
    let len = 1024 + (i * 7919) % 3072;
    talon_testkit::pattern(i as u64 + 1, len)
}

/// The path of file `i` under the tree's root.
fn rel(i: usize) -> String {
    format!("n{:08}/img_{i:07}.JPEG", i % CLASSES)
}

/// Writes files `range` into class directories under `root`.
fn write_tree(root: &Path, range: std::ops::Range<usize>) {
    for c in 0..CLASSES {
        std::fs::create_dir_all(root.join(format!("n{c:08}"))).expect("mkdir local");
    }
    for i in range {
        std::fs::write(root.join(rel(i)), body(i)).expect("write local");
    }
}

async fn import(c: &Client, local: &Path, n: usize) {
    let summary = c
        .import(
            local,
            "/train",
            &ImportOptions::default(),
            &ImportProgress::default(),
        )
        .await
        .expect("import");
    println!("import: {summary}");
    assert_eq!(summary.failed, 0, "failures: {:?}", summary.failures);
    assert_eq!(summary.files, n as u64);
}

/// Node `id`'s partitions as it reports them, by partition, if it answers.
async fn partitions_of(c: &Client, id: u64) -> Option<BTreeMap<u32, PartitionStatus>> {
    let nodes = c.status().await;
    let node = nodes.into_iter().find(|n| n.node_id == id)?;
    Some(
        node.partitions
            .ok()?
            .into_iter()
            .map(|p| (p.id, p))
            .collect(),
    )
}

/// The leaders' view of every partition, from the nodes that lead them.
async fn leaders(c: &Client) -> Option<BTreeMap<u32, PartitionStatus>> {
    let mut out = BTreeMap::new();
    for n in c.status().await {
        for p in n.partitions.into_iter().flatten() {
            if p.role == "LEADER" {
                out.insert(p.id, p);
            }
        }
    }
    (out.len() == PARTITIONS as usize).then_some(out)
}

/// A process's peak resident memory in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    talon_meta::tuning::ProcStatus::read(&pid.to_string())
        .bytes("VmHWM")
        .expect("VmHWM in proc status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaled_imagenet_tree_imports_snapshots_and_catches_up_in_bounded_memory() {
    let mut pc = ProcCluster::start_configured(3, PARTITIONS, test_raft(1_000, 100), |c| {
        c.storage.write_buffer_bytes = WRITE_BUFFER;
        c.storage.cache_bytes = CACHE;
    });
    let opts = ClientOptions {
        op_timeout: Duration::from_secs(300),
        request_timeout: Duration::from_secs(120),
        batch_concurrency: 4,
        ..ClientOptions::default()
    };
    let c = &Client::connect(&pc.addrs, opts).await.expect("connect");
    let local = tempfile::tempdir().expect("tempdir");

    let first = local.path().join("first");
    write_tree(&first, 0..FILES);
    import(c, &first, FILES).await;

    let stopped_at = eventually(Duration::from_secs(60), "node 3's status", || {
        partitions_of(c, 3)
    })
    .await;
    pc.kill(3);

    let second = local.path().join("second");
    write_tree(&second, FILES..FILES + MORE);
    import(c, &second, MORE).await;
    // Every leader has purged its log past where node 3 stopped (a snapshot covers it).
    eventually(
        Duration::from_secs(60),
        "logs purged past node 3",
        || async {
            let l = leaders(c).await?;
            l.iter()
                .all(|(p, s)| {
                    stopped_at
                        .get(p)
                        .is_some_and(|n| s.purged_index > n.last_log_index)
                })
                .then_some(())
        },
    )
    .await;

    pc.restart(3);
    let want = eventually(Duration::from_secs(60), "quiet leaders", || leaders(c)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let mine = partitions_of(c, 3).await.unwrap_or_default();
        let behind: Vec<_> = want
            .iter()
            .filter(|(p, l)| {
                !mine.get(p).is_some_and(|m| {
                    m.applied_index >= l.applied_index
                        && m.snapshot_index > stopped_at[p].last_log_index
                        && (m.entries, m.inodes) == (l.entries, l.inodes)
                })
            })
            .map(|(p, l)| (stopped_at[p].clone(), l.clone(), mine.get(p).cloned()))
            .collect();
        if behind.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node 3 did not catch up by a snapshot (stopped at, leader, now): {behind:#?}\n{}",
            pc.log(3)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let mut order: Vec<usize> = (0..FILES + MORE).collect();
    order.shuffle(&mut StdRng::seed_from_u64(7));
    let bad = stream::iter(order)
        .map(|i| async move {
            let got = c.read_file(&format!("/train/{}", rel(i))).await;
            (got.as_deref().ok() != Some(body(i).as_slice())).then_some(i)
        })
        .buffer_unordered(32)
        .filter_map(|b| async move { b })
        .collect::<Vec<_>>()
        .await;
    assert!(
        bad.is_empty(),
        "{} files differ, e.g. {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );

    let peaks: Vec<u64> = (1..=3)
        .map(|id| peak_rss(pc.pid(id).expect("node runs")))
        .collect();
    println!(
        "peak resident memory of nodes 1 / 2 / 3: {:?} MiB (budget {} MiB)",
        peaks.iter().map(|p| p >> 20).collect::<Vec<_>>(),
        (WRITE_BUFFER + CACHE) >> 20
    );
    for (id, peak) in (1..=3).zip(peaks) {
        assert!(
            peak <= WRITE_BUFFER + CACHE + ALLOWANCE,
            "node {id} peaked at {} MiB, over its budget of {} MiB plus {} MiB\n{}",
            peak >> 20,
            (WRITE_BUFFER + CACHE) >> 20,
            ALLOWANCE >> 20,
            pc.log(id)
        );
    }
}
