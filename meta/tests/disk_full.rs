//! One node's disk fills up, or one partition's store fails, in a 3-node cluster: the
//! cluster keeps accepting writes while a majority has room (leadership moves away from
//! the full node), the node says so in its status, and once the cause is gone and the node
//! is back, nothing acknowledged is lost.

mod common;

use common::settled_leader;
use common::small_disk::{
    caught_up, client_with_dir, files_read_back_from_nodes_2_and_3, fill_disk,
    node3_on_a_small_disk,
};
use std::time::Duration;
use talon_testkit::TestCluster;

const FILE_BYTES: usize = 200_000;

/// File `i`'s contents: incompressible, so the disk really fills.
fn body(i: usize) -> Vec<u8> {
    talon_testkit::pattern(i as u64, FILE_BYTES)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_full_node_does_not_stop_the_cluster() {
    const PARTITIONS: u32 = 4;
    const FILES: usize = 250;
    let (mut fs, mut cluster) = node3_on_a_small_disk(48 << 20, PARTITIONS).await;
    let c = client_with_dir(&cluster).await;

    // 50 MB, stored twice on every replica until a snapshot: more than node 3 holds.
    for i in 0..FILES {
        c.write_file(format!("/d/f{i:04}"), &body(i))
            .await
            .unwrap_or_else(|e| panic!("write {i} while a majority has room: {e}"));
    }
    let node3 = cluster.node(3).expect("node 3").node.clone();
    let level = node3.space.level();
    assert!(
        level >= talon_meta::space::Level::Full,
        "node 3's disk is full: {level:?}"
    );
    for p in 0..PARTITIONS {
        assert_ne!(
            cluster.leader_of(p).await,
            Some(3),
            "partition {p} is led by a node with room"
        );
    }
    let status = c.status().await;
    let space = status[2].space.as_ref().expect("node 3 answers status");
    assert!(
        space.level == "full" || space.level == "critical",
        "status shows node 3 full: {space:?}"
    );
    drop(node3);

    // Room again: node 3 catches up, and with node 1 stopped the files are all there.
    fs.resize(512 << 20).expect("grow the tmpfs");
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.stop_node(3).await;
    cluster.restart_node(3).await.expect("restart node 3");
    files_read_back_from_nodes_2_and_3(&mut cluster, &c, PARTITIONS, FILES, body).await;
    cluster.shutdown().await;
    drop(fs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_partition_store_hands_over_and_recovers() {
    const PARTITIONS: u32 = 4;
    let mut cluster = TestCluster::builder()
        .nodes(3)
        .partitions(PARTITIONS)
        .replication(3)
        .start()
        .await
        .expect("cluster");
    let c = client_with_dir(&cluster).await;
    for i in 0..40 {
        c.write_file(format!("/d/a{i:02}"), b"before")
            .await
            .expect("write before");
    }

    // Break partition 1's store on its leader: the next apply there fails.
    let victim = settled_leader(&cluster, 1).await;
    let node = cluster.node(victim).expect("victim").node.clone();
    node.partitions[&1].store.inject_write_errors(true);

    // Writes go on everywhere: partition 1 under a new leader, the others wherever.
    for i in 0..40 {
        c.write_file(format!("/d/b{i:02}"), b"during")
            .await
            .unwrap_or_else(|e| panic!("write {i} with one broken store: {e}"));
    }
    let why = node.partitions[&1].failure();
    assert!(
        why.is_some(),
        "partition 1 on node {victim} reports its failure"
    );
    assert_ne!(
        cluster.leader_of(1).await,
        Some(victim),
        "another replica leads"
    );
    // The node keeps its other partitions: every one of them still has a live replica
    // here that follows or leads.
    for p in (0..PARTITIONS).filter(|&p| p != 1) {
        assert!(
            node.partitions[&p].failure().is_none(),
            "partition {p} on node {victim} is unaffected"
        );
    }
    let status = c.status().await;
    let parts = status[(victim - 1) as usize]
        .partitions
        .as_ref()
        .expect("the node answers status");
    let role = &parts.iter().find(|s| s.id == 1).expect("partition 1").role;
    assert_eq!(role, "FAILED", "status names the failed partition");
    drop(node);

    // The cause gone (a restart opens the store afresh), the node catches up.
    cluster.stop_node(victim).await;
    cluster.restart_node(victim).await.expect("restart");
    caught_up(&cluster, victim, PARTITIONS).await;
    let others: Vec<u64> = (1..=3).filter(|&n| n != victim).collect();
    cluster.stop_node(others[0]).await;
    for (prefix, body) in [("a", &b"before"[..]), ("b", &b"during"[..])] {
        for i in 0..40 {
            let got = c
                .read_file(format!("/d/{prefix}{i:02}"))
                .await
                .unwrap_or_else(|e| panic!("read {prefix}{i}: {e}"));
            assert_eq!(got, body);
        }
    }
    cluster.shutdown().await;
}

/// A node whose disk filled up stops (a crash, or an operator's restart) after the room
/// its reserve gave back was taken by another writer, and must open its stores again on
/// that same full disk: what the start-up replays from its logs needs room, and the
/// reserve keeps a share for it that only a start-up releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_restarts_on_a_disk_left_full() {
    const PARTITIONS: u32 = 2;
    const FILES: usize = 10;
    let (fs, mut cluster) = node3_on_a_small_disk(128 << 20, PARTITIONS).await;
    // Writes that node 3 holds in its logs' WALs, unflushed, when it stops.
    let c = client_with_dir(&cluster).await;
    for i in 0..FILES {
        c.write_file(format!("/d/f{i:04}"), &body(i))
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
    }
    caught_up(&cluster, 3, PARTITIONS).await;

    // Another writer fills the disk, and takes the room node 3 releases of its reserve.
    let (filler, reserve) = fill_disk(&cluster, 3, &fs).await;
    let node3 = cluster.node(3).expect("node 3").node.clone();
    let held = node3.space.reading().held;
    // The node trusts a reading for 20 ms (`space::FRESH`), so one taken in the last moment
    // of the second fill may still show a few bytes; and the other writer takes whatever the
    // node's stores free meanwhile.
    common::eventually(
        Duration::from_secs(10),
        "node 3 to take in no snapshot on a full disk",
        || {
            let full = node3.space.has_room(1 << 20).is_err();
            if !full {
                common::small_disk::fill(&filler);
            }
            async move { full.then_some(()) }
        },
    )
    .await;
    assert_eq!(
        held,
        reserve / 2,
        "node 3 keeps half its reserve for a start-up"
    );
    drop(node3);

    cluster.stop_node(3).await;
    cluster
        .restart_node(3)
        .await
        .expect("node 3 opens its stores on the full disk");

    // Room again: node 3 catches up, and with node 1 stopped the files are all there.
    std::fs::remove_file(&filler).expect("remove the filler");
    files_read_back_from_nodes_2_and_3(&mut cluster, &c, PARTITIONS, FILES, body).await;
    cluster.shutdown().await;
    drop(fs);
}

/// A write of a node's Raft log or of a partition's store that finds the disk full waits
/// for room and tries again, instead of failing: a failed write stops the partition's Raft
/// group until the node restarts. Here a memtable flush into a disk taken to its last byte
/// puts the store's database in error, so that RocksDB refuses every write until it has
/// recovered by itself, once there is room (the full-leader test's second case stopped
/// partitions this way). A write still waiting when the node stops fails rather than hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_write_after_a_failed_flush_waits_for_room() {
    use openraft::storage::{RaftLogStorage, RaftStateMachine};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};
    use std::sync::Arc;
    use talon_meta::raft_log::LogDb;
    use talon_meta::sm::{PartitionSm, SmStore};
    use talon_meta::space::{Gate, Space};
    use talon_meta::types::TypeConfig;

    let fs = talon_testkit::SmallFs::mount(64 << 20).expect("mount a small tmpfs");
    let dir = fs.path.join("node");
    std::fs::create_dir(&dir).expect("make the node's directory");
    let space = Arc::new(
        Space::open(&dir, talon_meta::config::SpaceConfig::default()).expect("open the space"),
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let gate = Gate {
        space,
        cancel: cancel.clone(),
    };
    let tuning = talon_meta::tuning::Tuning::with_budget(4 << 20);
    let log = LogDb::open_gated(&dir.join("raft-log"), Some(gate.clone()), &tuning)
        .expect("open the log");
    let mut group = log.group(1);
    let store = SmStore::open_tuned(&dir.join("sm"), 3, b"", tuning).expect("open the store");
    store.watch_space(gate);
    let mut sm = PartitionSm::new(store.clone());
    let filler = fs.path.join("filler");
    let blank = |i| Entry::<TypeConfig> {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
        payload: EntryPayload::Blank,
    };

    // The log: once room comes back, the vote's write goes through.
    group.save_vote(&Vote::new(1, 1)).await.expect("a vote");
    let vote = {
        let mut group = group.clone();
        async move { ((), group.save_vote(&Vote::new(2, 1)).await) }
    };
    let write = stalled(|| log.store().flush(), &filler, vote).await;
    std::fs::remove_file(&filler).expect("remove the filler");
    room_lets_it_through(write).await;
    assert_eq!(
        group.read_vote().await.expect("read the vote"),
        Some(Vote::new(2, 1))
    );

    // The partition's store: so does the apply of an entry.
    sm.apply([blank(1)]).await.expect("apply");
    let apply = async move {
        let res = sm.apply([blank(2)]).await.map(|_| ());
        (sm, res)
    };
    let write = stalled(|| store.db().flush(), &filler, apply).await;
    std::fs::remove_file(&filler).expect("remove the filler");
    let mut sm = room_lets_it_through(write).await;
    let (applied, _) = sm.applied_state().await.expect("applied state");
    assert_eq!(applied.map(|a| a.index), Some(2));

    // The node stops while the disk is still full: the write fails.
    group.save_vote(&Vote::new(3, 1)).await.expect("a vote");
    let vote = async move { ((), group.save_vote(&Vote::new(4, 1)).await) };
    let write = stalled(|| log.store().flush(), &filler, vote).await;
    cancel.cancel();
    let ((), res) = tokio::time::timeout(Duration::from_secs(10), write)
        .await
        .expect("the write ends once the node stops")
        .expect("join");
    assert!(res.is_err(), "a write cut short by the stop fails: {res:?}");
    std::fs::remove_file(&filler).expect("remove the filler");
}

/// Fills the disk at `filler` and fails a `flush` of what a store holds in memory; returns
/// `write` started then, checked to be still waiting after a while.
async fn stalled<T: Send + 'static, E: std::fmt::Debug + Send + 'static>(
    flush: impl FnOnce() -> Result<(), rocksdb::Error>,
    filler: &std::path::Path,
    write: impl std::future::Future<Output = (T, Result<(), E>)> + Send + 'static,
) -> tokio::task::JoinHandle<(T, Result<(), E>)> {
    common::small_disk::fill(filler);
    let e = flush().expect_err("a flush into a full disk fails");
    assert!(talon_meta::space::is_no_space(&e), "{e}");
    let write = tokio::spawn(write);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !write.is_finished(),
        "the write waits for room: {:?}",
        write.await.map(|(_, res)| res)
    );
    write
}

/// What `write`, a stalled write of a store, ends with once the disk has room again: it
/// must succeed within a minute (RocksDB looks for room to recover every 5 s).
async fn room_lets_it_through<T, E: std::fmt::Debug>(
    write: tokio::task::JoinHandle<(T, Result<(), E>)>,
) -> T {
    let (out, res) = tokio::time::timeout(Duration::from_secs(60), write)
        .await
        .expect("the write goes through within a minute of room")
        .expect("join");
    res.expect("the write succeeds");
    out
}
