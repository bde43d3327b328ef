//! Concurrent request merging: many concurrent creates to one partition leave its leader
//! as a few Raft entries, and the node's log makes them durable with far fewer fsyncs than
//! creates when many partitions write at once (appends of different groups share one).
//!
//! How many requests meet in one proposal or one fsync depends on scheduling, and the
//! node's own background writes (directory-attribute flushes every few tens of
//! milliseconds) add entries and fsyncs in proportion to how long a wave takes. So each
//! property is measured over up to `WAVES` waves of concurrent creates and holds if any wave
//! shows it; a node that never merges, or whose appends never share an fsync, fails every
//! wave and so fails the test.

mod common;

use std::sync::Arc;
use talon_client::{Client, CreateSpec};
use talon_model::placement::entry_partition;
use talon_model::{Class, Ino};

const CREATES: usize = 400;
/// Most waves sent per property before the test gives up on seeing it.
const WAVES: usize = 8;

/// Creates every name in `dir` at once, each on its own task; fails on any error.
async fn create_all(c: &Arc<Client>, dir: Ino, names: Vec<Vec<u8>>) {
    let tasks: Vec<_> = names
        .into_iter()
        .map(|n| {
            let c = c.clone();
            tokio::spawn(
                async move { c.create(dir, &n, CreateSpec::file(0o644)).await.map(|_| ()) },
            )
        })
        .collect();
    for t in tasks {
        t.await.expect("task").expect("create");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_share_proposals_and_fsyncs() {
    let (cluster, c) = common::cluster(1, 8).await;
    let dir = c.mkdir("/d", Default::default()).await.expect("mkdir").ino;
    let node = cluster.node(1).expect("node").node.clone();
    let c = Arc::new(c);

    // One partition: compare its log growth with the number of creates. Merged requests
    // leave at most one entry per four creates.
    let target = 3u32;
    let part = node.partitions[&target].clone();
    let mut entries_seen = Vec::new();
    for wave in 0..WAVES {
        let names: Vec<Vec<u8>> = (0..100_000)
            .map(|i| format!("f{wave}-{i}").into_bytes())
            .filter(|n| entry_partition(dir, n, Class::Relaxed, 8) == target)
            .take(CREATES)
            .collect();
        assert_eq!(names.len(), CREATES, "names on partition {target}");
        let before = part.raft.metrics().borrow().last_log_index.unwrap_or(0);
        create_all(&c, dir, names).await;
        let entries = part.raft.metrics().borrow().last_log_index.unwrap_or(0) - before;
        println!("{CREATES} concurrent creates on one partition took {entries} Raft entries");
        entries_seen.push(entries);
        if entries <= CREATES as u64 / 4 {
            break;
        }
    }
    assert!(
        entries_seen.iter().any(|&e| e <= CREATES as u64 / 4),
        "requests were never merged: Raft entries per wave of {CREATES} creates: \
         {entries_seen:?}"
    );

    // All partitions: appends per fsync. A wave shows group commit when its appends shared
    // fsyncs and it paid at most one fsync per four creates.
    let mut seen = Vec::new();
    for wave in 0..WAVES {
        let (a0, s0) = node.log_stats();
        let names = (0..CREATES)
            .map(|i| format!("g{wave}-{i}").into_bytes())
            .collect();
        create_all(&c, dir, names).await;
        let (a1, s1) = node.log_stats();
        let (appends, syncs) = (a1 - a0, s1 - s0);
        println!(
            "{CREATES} concurrent creates over 8 partitions: {appends} log appends, {syncs} fsyncs"
        );
        seen.push((appends, syncs));
        if syncs < appends && syncs <= CREATES as u64 / 4 {
            break;
        }
    }
    assert!(
        seen.iter().any(|&(a, s)| s < a && s <= CREATES as u64 / 4),
        "no wave of {CREATES} creates shared fsyncs between appends with at most one fsync \
         per four creates (appends, fsyncs): {seen:?}"
    );
    cluster.shutdown().await;
}
