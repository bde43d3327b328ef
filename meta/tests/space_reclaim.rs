//! Deleting half of 100,000 small files gives the space back on disk (compaction with
//! BlobDB garbage collection, then a snapshot whose checkpoint no longer links the old
//! files), while reads of the other half keep being served.

mod common;

use common::eventually;
use futures::StreamExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use talon_client::CreateSpec;
use talon_model::{Ino, ROOT_INO};
use talon_proto::v1 as pb;
use talon_proto::v1::namespace_client::NamespaceClient;

const FILES: usize = 100_000;
const SIZE: usize = 4096;

fn body(i: usize) -> Vec<u8> {
    let mut b = vec![(i % 251) as u8; SIZE];
    b[..8].copy_from_slice(&(i as u64).to_le_bytes());
    b
}

/// Bytes allocated on disk under `dir`, each file counted once however many links it has
/// (a snapshot's checkpoint links the store's files).
fn allocated(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                dirs.push(e.path());
            } else if seen.insert((m.dev(), m.ino())) {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_half_the_files_gives_the_space_back() {
    // Deleted files are kept readable by inode for the unlinked grace, then reclaimed; a
    // short one keeps the test quick (the default is exercised in `unlinked.rs`'s shape).
    let cluster = common::TestCluster::builder()
        .nodes(1)
        .replication(1)
        .partitions(4)
        .unlinked_grace_ms(1000)
        .start()
        .await
        .expect("cluster");
    let c = common::client(&cluster.addrs()).await;
    let node = cluster.node(1).expect("node").node.clone();
    let raw = NamespaceClient::connect(format!("http://{}", cluster.addrs()[0]))
        .await
        .expect("connect");
    let dir = c
        .create(ROOT_INO, b"data", CreateSpec::dir(0o755, None))
        .await
        .expect("mkdir")
        .ino;

    let names: Vec<Vec<u8>> = (0..FILES)
        .map(|i| format!("f{i:06}").into_bytes())
        .collect();
    let mut inos: Vec<Ino> = Vec::with_capacity(FILES);
    for chunk in names.chunks(10_000) {
        let specs = chunk
            .iter()
            .map(|n| (n.clone(), CreateSpec::file(0o644)))
            .collect();
        for r in c.create_batch(dir, specs).await {
            inos.push(r.expect("create").ino);
        }
    }
    futures::stream::iter(inos.iter().enumerate())
        .for_each_concurrent(64, |(i, ino)| {
            let mut raw = raw.clone();
            async move {
                let req = pb::WriteSmallRequest {
                    header: Some(pb::RequestHeader {
                        partition: ino.home(),
                        epoch: 0,
                        relaxed_read: false,
                        session_read: false,
                    }),
                    ino: ino.0,
                    body: body(i).into(),
                    expect_generation: 0,
                    drop_setid: false,
                };
                raw.write_small(req).await.expect("write body");
            }
        })
        .await;
    let disk = |node: &talon_meta::node::Node| {
        node.partitions
            .values()
            .map(|p| p.store.disk_bytes())
            .sum::<u64>()
    };
    for p in node.partitions.values() {
        p.store.db().flush().expect("flush");
    }
    let before = disk(&node);
    let sm_dir = node.config.data_dir.join("sm");
    let on_disk_before = allocated(&sm_dir);
    assert!(
        node.partitions
            .values()
            .all(|p| p.store.snapshot_mark().get().is_some()),
        "every partition has a snapshot, whose checkpoint links the bodies"
    );
    println!(
        "{FILES} files of {SIZE} bytes: {:.1} MiB on disk",
        before as f64 / 1048576.0
    );
    assert!(
        before >= (FILES * SIZE) as u64 * 9 / 10,
        "bodies not on disk: {before}"
    );

    // Readers of the surviving half run throughout the deletion and the compaction.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..4)
        .map(|r| {
            let (raw, stop, reads, inos) = (raw.clone(), stop.clone(), reads.clone(), inos.clone());
            tokio::spawn(async move {
                let mut raw = raw;
                let mut k = r * 7919;
                while !stop.load(Ordering::SeqCst) {
                    let i = (k * 2 + 1) % FILES; // odd files survive
                    k += 4;
                    let ino = inos[i];
                    let req = pb::OpenRequest {
                        header: Some(pb::RequestHeader {
                            partition: ino.home(),
                            epoch: 0,
                            relaxed_read: false,
                            session_read: false,
                        }),
                        ino: ino.0,
                        want_body: true,
                    };
                    let got = raw
                        .open(req)
                        .await
                        .expect("read during deletion")
                        .into_inner();
                    assert_eq!(got.body, body(i), "file {i} read back wrong");
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    futures::stream::iter((0..FILES).step_by(2))
        .for_each_concurrent(64, |i| {
            let c = c.clone();
            let name = names[i].clone();
            async move {
                c.remove(dir, &name, false).await.expect("unlink");
            }
        })
        .await;
    // The collector compacts partitions with many deletions; wait for the space, in the
    // stores and on the disk: the files a compaction replaced leave with the checkpoint
    // that linked them, replaced by the snapshot built after it.
    let after = eventually(Duration::from_secs(300), "space to come back", || {
        let (node, sm_dir) = (node.clone(), sm_dir.clone());
        async move {
            let now = node
                .partitions
                .values()
                .map(|p| p.store.disk_bytes())
                .sum::<u64>();
            (now <= before * 3 / 4 && allocated(&sm_dir) <= on_disk_before * 3 / 4).then_some(now)
        }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.await.expect("reader");
    }
    println!(
        "after deleting half: {:.1} MiB in the stores ({:.0}% of before), {:.1} MiB on disk \
         ({:.0}%); {} reads served meanwhile",
        after as f64 / 1048576.0,
        after as f64 * 100.0 / before as f64,
        allocated(&sm_dir) as f64 / 1048576.0,
        allocated(&sm_dir) as f64 * 100.0 / on_disk_before as f64,
        reads.load(Ordering::Relaxed)
    );
    assert!(reads.load(Ordering::Relaxed) > 0);
    cluster.shutdown().await;
}
