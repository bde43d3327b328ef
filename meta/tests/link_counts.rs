//! A hard link across partitions is one transaction: its entry on the link directory's
//! partition and the link count at the inode's home. While one of them has applied its half
//! and the other still holds the prepared intent, a strict reader waits rather than see
//! half of it. Found by the fault harness's links workload (finding F10): a count read at
//! the home missed a link whose entry was already listed, and an unlink answered ENOENT
//! for a link whose count was already read.
//!
//! Each test prepares both halves of a link by hand, records the commit, applies one half
//! and leaves the other to recovery, then reads as a client would.

mod common;

use std::time::{Duration, Instant};
use talon_client::CreateSpec;
use talon_meta::types::{Command, CommandResult, Expect, Op, Target, TxId};
use talon_model::placement::entry_partition;
use talon_model::{Class, FileKind, Ino, Time};

/// Age of a prepared intent after which recovery resolves it.
const RECOVERY_AFTER: Duration = Duration::from_secs(5);
/// Bound on how long a reader waits: recovery's delay plus slack for a loaded machine. A
/// liveness bound, not a timing claim.
const READER_BOUND: Duration = Duration::from_secs(60);
const PARTITIONS: u32 = 8;

/// Prepares a link of `ino` as `name` in `dir` on both partitions, records the commit, and
/// applies it on the entry's partition (`entry_first`) or at the inode's home only.
async fn half_applied_link(entry_first: bool) {
    let (cluster, c) =
        common::recovering_cluster(PARTITIONS, RECOVERY_AFTER, READER_BOUND * 2).await;
    // Strict directories (under /control): each one's entries on one partition.
    c.mkdir("/control", Default::default())
        .await
        .expect("mkdir");
    let home = c
        .mkdir("/control/home", Default::default())
        .await
        .expect("mkdir")
        .ino;
    let ino = c
        .create(home, b"f", CreateSpec::file(0o644))
        .await
        .expect("create")
        .ino;
    let part = |dir: Ino| entry_partition(dir, b"", Class::Strict, PARTITIONS);
    let mut dir = None;
    for i in 0..32 {
        let d = c
            .mkdir(format!("/control/l{i}"), Default::default())
            .await
            .expect("mkdir")
            .ino;
        if part(d) != ino.home() {
            dir = Some((format!("/control/l{i}"), d));
            break;
        }
    }
    let (dir_path, dir) = dir.expect("a link directory on another partition");
    let (pl, ph) = (part(dir), ino.home());
    let name = b"f.0".to_vec();
    assert_eq!(c.getattr(ino).await.expect("getattr").nlink, 1);

    let node = &cluster.node(1).expect("node 1").node;
    let txid = TxId {
        coordinator: pl,
        id: 77,
    };
    let entry = vec![
        Op::ExpectDentry {
            parent: dir,
            name: name.clone(),
            expect: Expect::Absent,
        },
        Op::PutDentry {
            parent: dir,
            name: name.clone(),
            target: Target::Existing(ino),
            kind: FileKind::Regular,
        },
    ];
    let count = vec![Op::AdjustInode {
        ino,
        nlink: 1,
        parent: None,
        touch_mtime: false,
        now: Time::now(),
    }];
    common::prepare(node, txid, vec![(pl, entry), (ph, count)]).await;
    let r = node
        .propose_on(pl, Command::Decide { txid, commit: true })
        .await
        .expect("decide");
    assert_eq!(r, CommandResult::Decided(true));
    let first = if entry_first { pl } else { ph };
    node.propose_on(first, Command::Finish { txid, commit: true })
        .await
        .expect("finish one half");

    let started = Instant::now();
    if entry_first {
        // The entry is there; the count must include it.
        let found = c.lookup(dir, &name).await.expect("lookup the new link").ino;
        assert_eq!(found, ino);
        let nlink = c.getattr(ino).await.expect("getattr").nlink;
        assert_eq!(nlink, 2, "a count that misses a link whose entry is listed");
    } else {
        // The count includes the link; removing it must find it.
        assert_eq!(c.getattr(ino).await.expect("getattr").nlink, 2);
        c.unlink(format!("{dir_path}/f.0"))
            .await
            .expect("unlink a link whose count was read");
        assert_eq!(c.getattr(ino).await.expect("getattr").nlink, 1);
    }
    let waited = started.elapsed();
    println!("entry first: {entry_first}; the readers waited {waited:?}");
    assert!(
        waited < READER_BOUND,
        "the readers waited {waited:?} for recovery (after {RECOVERY_AFTER:?})"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_count_read_waits_for_a_link_whose_entry_is_in() {
    half_applied_link(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unlink_waits_for_a_link_whose_count_is_in() {
    half_applied_link(false).await;
}
