//! A file whose last name goes (unlink, or a rename over it) stays readable by inode for
//! the grace period, so a reader that resolved the name just before the change still reads
//! the whole old file; it gets no new name meanwhile, and it is reclaimed afterwards.

mod common;

use common::{eventually, TestCluster};
use std::time::Duration;
use talon_client::CreateSpec;
use talon_model::{Errno, ROOT_INO};

/// Long enough that the reads below, under a loaded machine, fall well within it.
const GRACE_MS: u64 = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unlinked_files_read_whole_until_their_grace_ends_then_are_reclaimed() {
    let cluster = TestCluster::builder()
        .nodes(1)
        .replication(1)
        .partitions(4)
        .file_sizes(64 * 1024, 16 * 1024)
        .unlinked_grace_ms(GRACE_MS)
        .start()
        .await
        .expect("start the cluster");
    let c = common::client(&cluster.addrs()).await;
    c.create(ROOT_INO, b"d", CreateSpec::dir(0o755, None))
        .await
        .expect("mkdir");
    let small = b"step 1: the old checkpoint".to_vec();
    let large: Vec<u8> = (0..200 * 1024u32).map(|i| (i % 251) as u8).collect();
    let old = c
        .write_file("/d/step", &small)
        .await
        .expect("write step")
        .ino;
    let big = c.write_file("/d/big", &large).await.expect("write big").ino;
    let before = c.statfs().await.expect("statfs").inodes;

    // A rename over `step` takes the old file's last name; an unlink takes `big`'s.
    c.write_file("/d/step.tmp", b"step 2")
        .await
        .expect("write tmp");
    c.rename("/d/step.tmp", "/d/step")
        .await
        .expect("rename over");
    c.unlink("/d/big").await.expect("unlink big");

    // Readers that resolved the names before still read the old files whole, by inode.
    assert_eq!(c.read_file_ino(old).await.expect("read replaced"), small);
    assert_eq!(c.read_file_ino(big).await.expect("read unlinked"), large);
    assert_eq!(c.getattr(old).await.expect("getattr").nlink, 0);
    assert_eq!(c.read_file("/d/step").await.expect("read new"), b"step 2");
    // The names are gone, and an unlinked file cannot be linked back in.
    let gone = c.stat("/d/big").await.expect_err("big is unlinked");
    assert_eq!(gone.errno(), Errno::ENOENT);
    let dir = c.stat("/d").await.expect("stat d").ino;
    let relink = c.link(big, dir, b"again").await.expect_err("link back");
    assert_eq!(relink.errno(), Errno::ENOENT, "{relink}");

    // After the grace period both are reclaimed.
    for ino in [old, big] {
        eventually(
            Duration::from_secs(120),
            "an unlinked file's reclaim",
            || {
                let c = c.clone();
                async move {
                    match c.read_file_ino(ino).await {
                        Err(e) if e.errno() == Errno::ENOENT => Some(()),
                        _ => None,
                    }
                }
            },
        )
        .await;
    }
    let after = c.statfs().await.expect("statfs").inodes;
    // `step` was replaced by `step.tmp`'s inode, `big` is gone: one inode fewer.
    assert_eq!(after + 1, before, "inodes before {before}, after {after}");
    cluster.shutdown().await;
}
