//! A follower whose disk is full, so that its log waits for room, while its leader goes on
//! sending it the entries it has not taken (finding F12 of the fault tests): the node's
//! memory stays flat, and once it has room again it catches up.
//!
//! The leader sends the same entries again at every timeout, a heartbeat interval. Each
//! copy used to be queued in the follower's Raft core, which takes nothing while its log
//! waits: a node grew by gigabytes a minute until the kernel killed it. This test has a
//! binary of its own, as it checks the process's resident memory.

mod common;

use common::small_disk::{
    client_with_dir, files_read_back_from_nodes_2_and_3, fill_disk, node3_on_a_small_disk,
};
use common::{eventually, settled_leader};
use std::time::{Duration, Instant};
use talon_meta::tuning::ProcStatus;
use talon_testkit::TestCluster;

/// Two chunks of the default 4 MiB each: an entry the leader resends is megabytes.
const FILE_BYTES: usize = 8 << 20;
const FILES: usize = 4;
/// How long node 3's log is left waiting while the test watches the process's memory:
/// about a hundred resends of the same entries.
const WAITING: Duration = Duration::from_secs(10);
/// What the process's anonymous memory may grow by meanwhile. A resend queued in the core
/// holds up to four chunk entries, 16 MiB: with the calls handed to the core as they came,
/// a debug build grew by 685 MiB in these 10 s; one at a time, by 5 MiB.
const GROWTH_MAX: u64 = 256 << 20;

/// File `i`'s contents.
fn body(i: usize) -> Vec<u8> {
    talon_testkit::pattern(i as u64, FILE_BYTES)
}

/// This process's anonymous resident memory, in bytes.
fn resident() -> u64 {
    ProcStatus::read("self").bytes("RssAnon").unwrap_or(0)
}

/// The index of the last entry in partition 0's log on node `id`.
fn last_log_index(cluster: &TestCluster, id: u64) -> u64 {
    cluster.node(id).expect("node runs").node.partitions[&0]
        .raft
        .metrics()
        .borrow()
        .last_log_index
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_whose_log_waits_for_disk_room_keeps_its_memory() {
    let (fs, mut cluster) = node3_on_a_small_disk(128 << 20, 1).await;
    let c = client_with_dir(&cluster).await;
    let (filler, _) = fill_disk(&cluster, 3, &fs).await;
    assert!(resident() > 0, "the kernel reports this process's memory");
    eventually(
        Duration::from_secs(60),
        "a node with room to lead partition 0",
        || async { cluster.leader_of(0).await.filter(|&id| id != 3) },
    )
    .await;

    // The files commit on nodes 1 and 2; node 3's log waits for room for their chunks.
    for i in 0..FILES {
        c.write_file(format!("/d/f{i:04}"), &body(i))
            .await
            .unwrap_or_else(|e| panic!("write {i} while a majority has room: {e}"));
    }
    let leader = settled_leader(&cluster, 0).await;
    assert_ne!(leader, 3, "a node with room leads");

    let before = resident();
    let started = Instant::now();
    let mut peak = before;
    while started.elapsed() < WAITING {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak = peak.max(resident());
    }
    let (theirs, ours) = (
        last_log_index(&cluster, leader),
        last_log_index(&cluster, 3),
    );
    assert!(
        ours < theirs,
        "node 3's log waited all along (its last entry {ours}, the leader's {theirs})"
    );
    assert!(
        peak < before + GROWTH_MAX,
        "anonymous memory grew from {} MiB to {} MiB while node 3's log waited",
        before >> 20,
        peak >> 20
    );

    // Room again: node 3 takes the entries, and with node 1 stopped the files are there.
    std::fs::remove_file(&filler).expect("remove the filler");
    files_read_back_from_nodes_2_and_3(&mut cluster, &c, 1, FILES, body).await;
    cluster.shutdown().await;
    drop(fs);
}
