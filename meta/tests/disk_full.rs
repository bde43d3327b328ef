//! One node's disk fills up, or one partition's store fails, in a 3-node cluster: the
//! cluster keeps accepting writes while a majority has room (leadership moves away from
//! the full node), the node says so in its status, and once the cause is gone and the node
//! is back, nothing acknowledged is lost.

mod common;

use common::{eventually, settled_leader};
use std::time::Duration;
use talon_meta::config::SpaceConfig;
use talon_testkit::{SmallFs, TestCluster};

const FILE_BYTES: usize = 200_000;

/// File `i`'s contents: incompressible, so the disk really fills.
fn body(i: usize) -> Vec<u8> {
    talon_testkit::pattern(i as u64, FILE_BYTES)
}

/// Waits until every partition's replica on node `id` has applied what its leader had.
async fn caught_up(cluster: &TestCluster, id: u64, partitions: u32) {
    for p in 0..partitions {
        let leader = settled_leader(cluster, p).await;
        let target = cluster.node(leader).expect("leader runs").node.partitions[&p]
            .raft
            .metrics()
            .borrow()
            .last_applied
            .map(|l| l.index)
            .unwrap_or(0);
        eventually(
            Duration::from_secs(120),
            &format!("node {id} to apply partition {p} up to {target}"),
            || async move {
                let m = cluster.node(id)?.node.partitions[&p]
                    .raft
                    .metrics()
                    .borrow()
                    .clone();
                (m.last_applied.map(|l| l.index).unwrap_or(0) >= target).then_some(())
            },
        )
        .await;
    }
}

/// A 3-node cluster, R = 3, whose node 3 keeps its data on a tmpfs of `bytes` with the
/// default space thresholds and reserve. `RUST_LOG=warn` shows what the nodes say about
/// their disks.
async fn node3_on_a_small_disk(bytes: u64, partitions: u32) -> (SmallFs, TestCluster) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let fs = SmallFs::mount(bytes).expect("mount a small tmpfs");
    let cluster = TestCluster::builder()
        .nodes(3)
        .partitions(partitions)
        .replication(3)
        .data_dir(3, fs.path.join("node3"))
        .node_space(3, SpaceConfig::default())
        .start()
        .await
        .expect("cluster");
    (fs, cluster)
}

/// Node 3 catches up, and with node 1 stopped files `/d/f{i:04}` for `i < files` read back
/// whole from nodes 2 and 3.
async fn files_read_back_from_nodes_2_and_3(
    cluster: &mut TestCluster,
    c: &talon_client::Client,
    partitions: u32,
    files: usize,
) {
    caught_up(cluster, 3, partitions).await;
    cluster.stop_node(1).await;
    for i in 0..files {
        let got = c
            .read_file(format!("/d/f{i:04}"))
            .await
            .unwrap_or_else(|e| panic!("read {i} from nodes 2 and 3: {e}"));
        assert!(got == body(i), "file {i} reads back whole");
    }
}

/// A client of `cluster` and the directory `/d` the tests write in.
async fn client_with_dir(cluster: &TestCluster) -> talon_client::Client {
    let c = common::client(&cluster.addrs()).await;
    c.mkdir("/d", talon_client::MkdirOptions::default())
        .await
        .expect("mkdir");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_full_node_does_not_stop_the_cluster() {
    const PARTITIONS: u32 = 4;
    const FILES: usize = 250;
    let (fs, mut cluster) = node3_on_a_small_disk(48 << 20, PARTITIONS).await;
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
    files_read_back_from_nodes_2_and_3(&mut cluster, &c, PARTITIONS, FILES).await;
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

/// Appends to `path` until the file system holding it has no byte left: another writer
/// taking every block the node does not hold.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the filler");
    for chunk in [1 << 20, 4096, 512] {
        let zeros = vec![1u8; chunk];
        while f.write_all(&zeros).is_ok() {}
    }
    let _ = f.sync_all();
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
    let node3 = cluster.node(3).expect("node 3").node.clone();
    // A start-up holds the restart share at once, the space loop the rest soon after.
    let reserve = eventually(
        Duration::from_secs(20),
        "node 3 to hold its reserve",
        || {
            let r = node3.space.reading();
            let whole = talon_meta::space::reserve_size(&SpaceConfig::default(), r.fs.total);
            async move { (r.held == whole && whole > 0).then_some(whole) }
        },
    )
    .await;

    // Writes that node 3 holds in its logs' WALs, unflushed, when it stops.
    let c = client_with_dir(&cluster).await;
    for i in 0..FILES {
        c.write_file(format!("/d/f{i:04}"), &body(i))
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
    }
    caught_up(&cluster, 3, PARTITIONS).await;

    // Another writer fills the disk; node 3 sees it full and releases what it may of its
    // reserve, and the writer takes that room too.
    let filler = fs.path.join("filler");
    fill(&filler);
    let held = eventually(
        Duration::from_secs(20),
        "node 3 to release its reserve",
        || {
            let held = node3.space.reading().held;
            async move { (held < reserve).then_some(held) }
        },
    )
    .await;
    fill(&filler);
    assert!(
        node3.space.has_room(1 << 20).is_err(),
        "node 3 takes in no snapshot on a full disk"
    );
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
    files_read_back_from_nodes_2_and_3(&mut cluster, &c, PARTITIONS, FILES).await;
    cluster.shutdown().await;
    drop(fs);
}
