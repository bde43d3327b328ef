//! A 3-node cluster whose node 3 (or every node) keeps its data on a small tmpfs, and what
//! the tests of a full disk do with it: fill that file system from outside, wait for the
//! node to catch up, and read files back from nodes 2 and 3 alone.

use super::{eventually, settled_leader};
use std::path::{Path, PathBuf};
use std::time::Duration;
use talon_meta::config::SpaceConfig;
use talon_testkit::{SmallFs, TestCluster, TestClusterBuilder};

/// Sends the nodes' log lines to the test's output, filtered by `RUST_LOG`.
fn log_to_test_output() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A 3-node cluster, R = 3, whose node 3 keeps its data on a tmpfs of `bytes` with the
/// default space thresholds and reserve. `RUST_LOG=warn` shows what the nodes say about
/// their disks.
pub async fn node3_on_a_small_disk(bytes: u64, partitions: u32) -> (SmallFs, TestCluster) {
    log_to_test_output();
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

/// A 3-node cluster, R = 3, with the rest of its settings from `builder`, whose every node
/// keeps its data on a tmpfs of its own of `bytes` (node `i` on the `i - 1`th returned),
/// with the default space thresholds and reserve.
pub async fn every_node_on_a_small_disk(
    bytes: u64,
    builder: TestClusterBuilder,
) -> (Vec<SmallFs>, TestCluster) {
    log_to_test_output();
    let mut disks = Vec::new();
    let mut builder = builder.nodes(3).replication(3);
    for id in 1..=3u64 {
        let fs = SmallFs::mount(bytes).expect("mount a small tmpfs");
        builder = builder
            .data_dir(id, fs.path.join(format!("node{id}")))
            .node_space(id, SpaceConfig::default());
        disks.push(fs);
    }
    let cluster = builder.start().await.expect("cluster");
    (disks, cluster)
}

/// A client of `cluster` and the directory `/d` the tests write in.
pub async fn client_with_dir(cluster: &TestCluster) -> talon_client::Client {
    let c = super::client(&cluster.addrs()).await;
    c.mkdir("/d", talon_client::MkdirOptions::default())
        .await
        .expect("mkdir");
    c
}

/// Appends to `path` until the file system holding it has no byte left: another writer
/// taking every block the node does not hold.
pub fn fill(path: &Path) {
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

/// Waits for node `id` to hold its whole reserve, then fills its file system `fs` from
/// outside twice: the node sees it full and releases what it may of its reserve, and the
/// second fill takes that room too. Returns the filler's path and the reserve's size.
pub async fn fill_disk(cluster: &TestCluster, id: u64, fs: &SmallFs) -> (PathBuf, u64) {
    let node = cluster.node(id).expect("the node runs").node.clone();
    // A start-up holds the restart share at once, the space loop the rest soon after.
    let reserve = eventually(
        Duration::from_secs(20),
        &format!("node {id} to hold its reserve"),
        || {
            let r = node.space.reading();
            let whole = talon_meta::space::reserve_size(&SpaceConfig::default(), r.fs.total);
            async move { (r.held == whole && whole > 0).then_some(whole) }
        },
    )
    .await;
    let filler = fs.path.join("filler");
    fill(&filler);
    eventually(
        Duration::from_secs(20),
        &format!("node {id} to release its reserve"),
        || {
            let held = node.space.reading().held;
            async move { (held < reserve).then_some(()) }
        },
    )
    .await;
    fill(&filler);
    (filler, reserve)
}

/// Waits until every partition's replica on node `id` has applied what its leader had.
pub async fn caught_up(cluster: &TestCluster, id: u64, partitions: u32) {
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

/// Node 3 catches up, and with node 1 stopped files `/d/f{i:04}` for `i < files` read back
/// from nodes 2 and 3 as `body(i)`, whole.
pub async fn files_read_back_from_nodes_2_and_3(
    cluster: &mut TestCluster,
    c: &talon_client::Client,
    partitions: u32,
    files: usize,
    body: fn(usize) -> Vec<u8>,
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
