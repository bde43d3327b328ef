//! A partition's leader whose disk fills up while a strict file is replaced over and over
//! by write-then-rename (the checkpoint pattern) and read back: the leader's log waits for
//! room with proposals and reads queued behind it, the other replicas elect one of them
//! and go on, room comes back, the old leader catches up and, if it wins a campaign, leads
//! again. No read may return a version older than one whose rename was acknowledged before
//! the read began.
//!
//! This is the path the fault tests' finding F8 points at (a stale strict read right after
//! a full disk healed, `jepsen/README.md`), made deterministic: the full disk is on the
//! leader. Twice: with small files on one partition, where the node's log only waits, and
//! with checkpoint-sized files (5 MiB, chunks on all eight partitions), where the disk,
//! taken to its last byte by another writer, also fails the node's memtable flushes, and
//! RocksDB then refuses the log's writes until it recovers. Those writes wait for room too,
//! so that none of the node's partitions may stop (they did before the writes waited, two
//! or three of the eight in most runs). Every node keeps its data on a small disk of its
//! own, so the full disk is on whichever node leads; no election is forced for the test to
//! go on.

mod common;

use common::small_disk::{caught_up, every_node_on_a_small_disk, fill_disk};
use common::{client_waiting, eventually, settled_leader};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use talon_client::{Class, Client, MkdirOptions};
use talon_testkit::TestCluster;

const CKPT: &str = "/c/ckpt";
const READERS: usize = 2;

/// Version `k`'s contents, `len` bytes: `k` in the first eight, the rest a pattern of `k`.
fn body(k: u64, len: usize) -> Vec<u8> {
    let mut b = talon_testkit::pattern(k, len);
    b[..8].copy_from_slice(&k.to_le_bytes());
    b
}

/// The version `b` holds, if it is one whole of `len` bytes.
fn version(b: &[u8], len: usize) -> Option<u64> {
    let k = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    (b == body(k, len).as_slice()).then_some(k)
}

/// The register's history, as the workers see it.
#[derive(Default)]
struct Register {
    /// Every version's size.
    len: usize,
    /// The writer's pause between versions: old versions are garbage until reclaimed, and
    /// a writer at full speed fills every node's small disk with them.
    every: Duration,
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
        tokio::time::sleep(r.every).await;
        k += 1;
        let tmp = format!("/c/tmp{k}");
        let res = async {
            c.write_file(&tmp, &body(k, r.len)).await?;
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
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        r.reads.fetch_add(1, Ordering::Relaxed);
        match version(&got, r.len) {
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

/// Tries for `limit` to make node `id` the leader of partition `p`; true if it leads. The
/// writer holds off meanwhile, so that `id`'s log can be as long as the others' (a voter
/// refuses a candidate whose log is shorter than its own), and `id` campaigns every second:
/// the others' leader lease refuses a campaign while their leader's heartbeats arrive, and
/// a higher term from `id` ends that. Another replica may win each time.
async fn try_to_lead(
    cluster: &TestCluster,
    r: &Register,
    id: u64,
    p: u32,
    limit: Duration,
) -> bool {
    let last_log = |n: u64| {
        cluster
            .node(n)
            .and_then(|n| n.node.partitions[&p].raft.metrics().borrow().last_log_index)
            .unwrap_or(0)
    };
    r.pause.store(true, Ordering::SeqCst);
    eventually(
        Duration::from_secs(60),
        "the writer to hold off",
        || async { r.paused.load(Ordering::SeqCst).then_some(()) },
    )
    .await;
    let led = talon_testkit::poll_until(
        limit,
        &format!("node {id} to lead partition {p}"),
        || async move {
            if cluster.leader_of(p).await == Some(id) {
                return Some(());
            }
            if (1..=3).all(|n| last_log(id) >= last_log(n)) {
                let part = cluster.node(id)?.node.partitions[&p].clone();
                let _ = part.raft.trigger().elect().await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
        },
    )
    .await
    .is_ok();
    r.pause.store(false, Ordering::SeqCst);
    led
}

/// Waits until `more` renames past the current one are acknowledged.
async fn renames_go_on(r: &Register, more: u64, what: &str) {
    let from = r.acked.load(Ordering::SeqCst);
    eventually(Duration::from_secs(60), what, || async move {
        (r.acked.load(Ordering::SeqCst) >= from + more).then_some(())
    })
    .await;
}

/// The cluster a run starts, and the files it writes.
struct Scenario {
    partitions: u32,
    /// Small-file threshold and chunk size (the cluster's defaults if `None`).
    file_sizes: Option<(u32, u32)>,
    /// Every version's size.
    body_bytes: usize,
    /// The writer's pause between versions.
    every: Duration,
    /// Each node's file system.
    disk_bytes: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_waiting_for_disk_room_serves_no_stale_strict_read() {
    // Three chunks of 64 KiB and a short last one: a version is a layout over chunks, as
    // a checkpoint is, and the node's memtables need no flush while its disk is full. With
    // the read barrier taken out (any replica answering strict reads from its own state),
    // this case fails: version 18 read after version 19 was acknowledged.
    run(Scenario {
        partitions: 1,
        file_sizes: Some((4096, 64 << 10)),
        body_bytes: 150 << 10,
        every: Duration::from_millis(20),
        disk_bytes: 512 << 20,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_whose_log_flush_fails_on_a_full_disk_serves_no_stale_strict_read() {
    // F8's checkpoint size, in chunks of the default 4 MiB on every partition. Fewer
    // versions and reads than above (about 30 and 200): without the read barrier this case
    // passed twice, so it is the weaker check of reads, kept for the node whose log's
    // flush fails (its writes then waiting until RocksDB has recovered).
    run(Scenario {
        partitions: 8,
        file_sizes: None,
        body_bytes: 5132 << 10,
        every: Duration::from_millis(250),
        disk_bytes: 2048 << 20,
    })
    .await;
}

async fn run(s: Scenario) {
    let mut builder = TestCluster::builder().partitions(s.partitions);
    if let Some((small, chunk)) = s.file_sizes {
        builder = builder.file_sizes(small, chunk);
    }
    let (disks, cluster) = every_node_on_a_small_disk(s.disk_bytes, builder).await;
    let addrs = cluster.addrs();
    let c = client_waiting(&addrs, Duration::from_secs(20)).await;
    let strict = MkdirOptions {
        class: Some(Class::Strict),
        ..Default::default()
    };
    // A strict directory's entries live on its home partition.
    let p = c.mkdir("/c", strict).await.expect("mkdir /c").ino.home();
    let r = Arc::new(Register {
        len: s.body_bytes,
        every: s.every,
        ..Default::default()
    });
    let mut tasks = vec![tokio::spawn(write_loop(c.clone(), r.clone()))];
    renames_go_on(&r, 1, "a first version in place").await;
    for _ in 0..READERS {
        let reader = client_waiting(&addrs, Duration::from_secs(20)).await;
        tasks.push(tokio::spawn(read_loop(reader, r.clone())));
    }
    renames_go_on(&r, 5, "renames").await;

    // The leader's disk fills: its log waits for room, and the others take over.
    let old = settled_leader(&cluster, p).await;
    let (filler, _) = fill_disk(&cluster, old, &disks[old as usize - 1]).await;
    // (The old leader's Raft core waits with its log, so it may still claim to lead, in
    // the term it was deposed in.)
    eventually(Duration::from_secs(60), "a leader with room", || async {
        cluster.leader_of(p).await.filter(|&id| id != old)
    })
    .await;
    renames_go_on(&r, 5, "renames while the old leader waits for room").await;
    // As long as the full disk of F8's run lasted (2.8 s), with the readers at work.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Room again: the old leader takes what it missed, and campaigns to lead again. None
    // of its partitions stopped: writes that found the disk full waited for room.
    std::fs::remove_file(&filler).expect("remove the filler");
    let stopped: Vec<u32> = cluster.node(old).map_or_else(Vec::new, |n| {
        let parts = n.node.partitions.iter();
        parts
            .filter(|(_, part)| part.failure().is_some())
            .map(|(p, _)| *p)
            .collect()
    });
    assert!(
        stopped.is_empty(),
        "node {old}'s partitions {stopped:?} stopped on the full disk"
    );
    caught_up(&cluster, old, s.partitions).await;
    let led_again = try_to_lead(&cluster, &r, old, p, Duration::from_secs(20)).await;
    renames_go_on(&r, 5, "renames after the old leader's campaign").await;

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
        "{} versions acknowledged, {unknown} unknown, {reads} reads; node {old} led \
         partition {p}, it led again: {led_again}",
        r.acked.load(Ordering::SeqCst)
    );
    assert!(reads > 0, "the readers read");
    assert!(anomalies.is_empty(), "{} reads: {anomalies:?}", reads);
    cluster.shutdown().await;
    drop(disks);
}
