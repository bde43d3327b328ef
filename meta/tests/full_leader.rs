//! A partition's leader whose disk fills up while a strict file is replaced over and over
//! by write-then-rename (the checkpoint pattern) and read back: the leader's log waits for
//! room with proposals and reads queued behind it, the other replicas elect one of them
//! and go on, room comes back, the old leader catches up and leads again. No read may
//! return a version older than one whose rename was acknowledged before the read began.
//!
//! This is the path the fault tests' finding F8 points at (a stale strict read right after
//! a full disk healed, `jepsen/README.md`), made deterministic: the full disk is on the
//! leader, and the leader comes back to lead the same partition.

mod common;

use common::small_disk::{caught_up, fill_node3_disk, node3_on_a_small_disk_of};
use common::{client_waiting, eventually};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use talon_client::{Class, Client, MkdirOptions};
use talon_testkit::TestCluster;

/// Three chunks of 64 KiB (and a short last one): a version is a layout over chunks, as a
/// checkpoint is.
const BODY_BYTES: usize = 150 << 10;
const CKPT: &str = "/c/ckpt";
const READERS: usize = 2;

/// Version `k`'s contents: `k` in the first eight bytes, the rest a pattern of `k`.
fn body(k: u64) -> Vec<u8> {
    let mut b = talon_testkit::pattern(k, BODY_BYTES);
    b[..8].copy_from_slice(&k.to_le_bytes());
    b
}

/// The version `b` holds, if it is one whole.
fn version(b: &[u8]) -> Option<u64> {
    let k = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    (b == body(k).as_slice()).then_some(k)
}

/// The register's history, as the workers see it.
#[derive(Default)]
struct Register {
    /// The last version whose rename was acknowledged (one writer: in order).
    acked: AtomicU64,
    /// Versions whose write or rename failed: their rename may take effect at any time.
    unknown: Mutex<HashSet<u64>>,
    /// What no order of the operations explains.
    anomalies: Mutex<Vec<String>>,
    reads: AtomicU64,
    stop: AtomicBool,
    /// Asked of the writer: hold off between versions.
    pause: AtomicBool,
    /// Set by the writer while it holds off.
    paused: AtomicBool,
}

impl Register {
    fn anomaly(&self, what: String) {
        self.anomalies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
    }
}

/// Writes versions 1, 2, ... under a temporary name and renames each over `CKPT`.
async fn write_loop(c: Client, r: Arc<Register>) {
    let mut k = 0;
    while !r.stop.load(Ordering::Relaxed) {
        let holding = r.pause.load(Ordering::SeqCst);
        r.paused.store(holding, Ordering::SeqCst);
        if holding {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        k += 1;
        let tmp = format!("/c/tmp{k}");
        let res = async {
            c.write_file(&tmp, &body(k)).await?;
            c.rename(&tmp, CKPT).await
        }
        .await;
        match res {
            Ok(()) => r.acked.store(k, Ordering::SeqCst),
            Err(_) => {
                r.unknown
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(k);
            }
        }
    }
}

/// Reads `CKPT` (strict) until told to stop, checking each version against what was
/// acknowledged before the read began. A read that fails is no anomaly.
async fn read_loop(c: Client, r: Arc<Register>) {
    while !r.stop.load(Ordering::Relaxed) {
        let floor = r.acked.load(Ordering::SeqCst);
        let Ok(got) = c.read_file(CKPT).await else {
            continue;
        };
        r.reads.fetch_add(1, Ordering::Relaxed);
        match version(&got) {
            None => r.anomaly(format!("a torn read of {} bytes", got.len())),
            Some(v) if v < floor => {
                let maybe = r
                    .unknown
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&v);
                if !maybe {
                    r.anomaly(format!(
                        "read version {v} after version {floor}'s rename was acknowledged"
                    ));
                }
            }
            Some(_) => {}
        }
    }
}

/// Makes node `id` the leader of partition 0. The writer holds off meanwhile, so that
/// `id`'s log can be as long as the others' (a voter refuses a candidate whose log is
/// shorter than its own), and `id` campaigns every second until it leads: the others'
/// leader lease refuses a campaign while their leader's heartbeats arrive, and a higher
/// term from `id` ends that.
async fn lead(cluster: &TestCluster, r: &Register, id: u64) {
    let last_log = |n: u64| {
        cluster
            .node(n)
            .and_then(|n| n.node.partitions[&0].raft.metrics().borrow().last_log_index)
            .unwrap_or(0)
    };
    r.pause.store(true, Ordering::SeqCst);
    eventually(
        Duration::from_secs(60),
        "the writer to hold off",
        || async { r.paused.load(Ordering::SeqCst).then_some(()) },
    )
    .await;
    eventually(
        Duration::from_secs(60),
        &format!("node {id}'s log as long as the others'"),
        || async { (1..=3).all(|n| last_log(id) >= last_log(n)).then_some(()) },
    )
    .await;
    eventually(
        Duration::from_secs(60),
        &format!("node {id} to lead partition 0"),
        || async move {
            if cluster.leader_of(0).await == Some(id) {
                return Some(());
            }
            let part = cluster.node(id)?.node.partitions[&0].clone();
            let _ = part.raft.trigger().elect().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
        },
    )
    .await;
    r.pause.store(false, Ordering::SeqCst);
}

/// Waits until `more` renames past the current one are acknowledged.
async fn renames_go_on(r: &Register, more: u64, what: &str) {
    let from = r.acked.load(Ordering::SeqCst);
    eventually(Duration::from_secs(60), what, || async move {
        (r.acked.load(Ordering::SeqCst) >= from + more).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_waiting_for_disk_room_serves_no_stale_strict_read() {
    let builder = TestCluster::builder()
        .partitions(1)
        .file_sizes(4096, 64 << 10);
    let (fs, cluster) = node3_on_a_small_disk_of(256 << 20, builder).await;
    let addrs = cluster.addrs();
    let c = client_waiting(&addrs, Duration::from_secs(20)).await;
    let strict = MkdirOptions {
        class: Some(Class::Strict),
        ..Default::default()
    };
    c.mkdir("/c", strict).await.expect("mkdir /c");
    // The writer starts held off, until node 3 leads.
    let r = Arc::new(Register::default());
    r.pause.store(true, Ordering::SeqCst);
    let mut tasks = vec![tokio::spawn(write_loop(c.clone(), r.clone()))];
    lead(&cluster, &r, 3).await;
    renames_go_on(&r, 1, "a first version in place").await;
    for _ in 0..READERS {
        let reader = client_waiting(&addrs, Duration::from_secs(20)).await;
        tasks.push(tokio::spawn(read_loop(reader, r.clone())));
    }
    renames_go_on(&r, 5, "renames under node 3").await;

    // Node 3's disk fills: its log waits for room, and the others take over.
    let (filler, _) = fill_node3_disk(&cluster, &fs).await;
    eventually(Duration::from_secs(60), "a leader with room", || async {
        cluster.leader_of(0).await.filter(|&id| id != 3)
    })
    .await;
    renames_go_on(&r, 5, "renames while node 3 waits for room").await;
    // As long as the full disk of F8's run lasted (2.8 s), with the readers at work.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Room again: node 3 takes what it missed, then leads once more.
    std::fs::remove_file(&filler).expect("remove the filler");
    caught_up(&cluster, 3, 1).await;
    lead(&cluster, &r, 3).await;
    renames_go_on(&r, 5, "renames under node 3 again").await;

    r.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("worker");
    }
    let anomalies = r
        .anomalies
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let reads = r.reads.load(Ordering::Relaxed);
    let unknown = r.unknown.lock().unwrap_or_else(|p| p.into_inner()).len();
    eprintln!(
        "{} versions acknowledged, {unknown} unknown, {reads} reads",
        r.acked.load(Ordering::SeqCst)
    );
    assert!(reads > 0, "the readers read");
    assert!(anomalies.is_empty(), "{} reads: {anomalies:?}", reads);
    cluster.shutdown().await;
    drop(fs);
}
