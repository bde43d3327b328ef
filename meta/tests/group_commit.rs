//! Concurrent request merging: many concurrent creates to one partition leave its leader
//! as a few Raft entries, and the node's log makes them durable with far fewer fsyncs than
//! creates when many partitions write at once (appends of different groups share one).

mod common;

use std::sync::Arc;
use talon_client::CreateSpec;
use talon_model::placement::entry_partition;
use talon_model::Class;

const CREATES: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_share_proposals_and_fsyncs() {
    let (cluster, c) = common::cluster(1, 8).await;
    let dir = c.mkdir("/d", Default::default()).await.expect("mkdir").ino;
    let node = cluster.node(1).expect("node").node.clone();

    // One partition: compare its log growth with the number of creates.
    let target = 3u32;
    let names: Vec<Vec<u8>> = (0..100_000)
        .map(|i| format!("f{i}").into_bytes())
        .filter(|n| entry_partition(dir, n, Class::Relaxed, 8) == target)
        .take(CREATES)
        .collect();
    let part = node.partitions[&target].clone();
    let before = part.raft.metrics().borrow().last_log_index.unwrap_or(0);
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
    let entries = part.raft.metrics().borrow().last_log_index.unwrap_or(0) - before;
    println!("{CREATES} concurrent creates on one partition took {entries} Raft entries");
    assert!(
        entries <= CREATES as u64 / 4,
        "{entries} entries for {CREATES} creates: requests were not merged"
    );

    // All partitions: appends per fsync. Whether appends of different groups meet in one
    // fsync depends on their timing, so up to five waves are sent; one that shares is
    // enough, and a log that never shares fails.
    let c = Arc::new(c);
    let mut seen = Vec::new();
    for wave in 0..5 {
        let (a0, s0) = node.log_stats();
        let tasks: Vec<_> = (0..CREATES)
            .map(|i| {
                let c = c.clone();
                let n = format!("g{wave}-{i}").into_bytes();
                tokio::spawn(
                    async move { c.create(dir, &n, CreateSpec::file(0o644)).await.map(|_| ()) },
                )
            })
            .collect();
        for t in tasks {
            t.await.expect("task").expect("create");
        }
        let (a1, s1) = node.log_stats();
        let (appends, syncs) = (a1 - a0, s1 - s0);
        println!(
            "{CREATES} concurrent creates over 8 partitions: {appends} log appends, {syncs} fsyncs"
        );
        assert!(
            syncs <= CREATES as u64 / 4,
            "{syncs} fsyncs for {CREATES} creates"
        );
        seen.push((appends, syncs));
        if syncs < appends {
            break;
        }
    }
    assert!(
        seen.iter().any(|(a, s)| s < a),
        "every append paid its own fsync in every wave (appends, fsyncs): {seen:?}"
    );
    cluster.shutdown().await;
}
