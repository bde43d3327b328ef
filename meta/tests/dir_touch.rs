//! A relaxed directory's mtime after a file entry changed on another partition: queued on
//! the node that leads the directory's home and shown by its reads at once, stored by the
//! next flush, and never allowed to undo a setattr of the directory's times.

mod common;

use std::time::Duration;
use talon_client::CreateSpec;
use talon_model::placement::entry_partition;
use talon_model::{Class, Ino, SetAttr, Time, TimeSet};

const PARTITIONS: u32 = 8;

/// A name in `dir` whose entry lives on another partition than `dir`'s inode.
fn away_name(dir: Ino, prefix: &str) -> Vec<u8> {
    (0..)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .find(|n| entry_partition(dir, n, Class::Relaxed, PARTITIONS) != dir.home())
        .expect("a name placed away from the directory")
}

/// `dir`'s mtime as its home partition's store holds it on `node`.
fn stored_mtime(cluster: &common::TestCluster, node: u64, dir: Ino) -> Option<Time> {
    let part = cluster
        .node(node)?
        .node
        .partitions
        .get(&dir.home())?
        .clone();
    let rec = part.store.read(|v| v.inode(dir)).ok()??;
    Some(rec.attr.mtime)
}

/// One node, and a relaxed directory `/data` in it.
async fn one_node_with_dir() -> (common::TestCluster, talon_client::Client, Ino) {
    nodes_with_dir(1).await
}

/// `nodes` nodes (R = 3 from three on), and a relaxed directory `/data` in them.
async fn nodes_with_dir(nodes: u64) -> (common::TestCluster, talon_client::Client, Ino) {
    let (cluster, c) = common::cluster(nodes, PARTITIONS).await;
    let d = c
        .create(c.root(), b"data", CreateSpec::dir(0o755, None))
        .await
        .expect("mkdir")
        .ino;
    (cluster, c, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_directory_update_shows_at_once_lands_soon_and_never_undoes_a_setattr() {
    let (cluster, c, d) = one_node_with_dir().await;
    let before = c.getattr(d).await.expect("getattr").mtime;
    tokio::time::sleep(Duration::from_millis(20)).await;

    // Shown at once to the client that made the change.
    let f = away_name(d, "f");
    c.create(d, &f, CreateSpec::file(0o644))
        .await
        .expect("create");
    let shown = c.getattr(d).await.expect("getattr").mtime;
    assert!(shown > before, "the create moved the directory's mtime");

    // Stored within the flush period (waited for, not timed).
    common::eventually(Duration::from_secs(30), "the queued update stored", || {
        let stored = stored_mtime(&cluster, 1, d);
        async move { stored.filter(|m| *m >= shown).map(|_| ()) }
    })
    .await;

    // A setattr of the times right after another queued update keeps the times it set,
    // also once the update would have been flushed.
    let g = away_name(d, "g");
    c.create(d, &g, CreateSpec::file(0o644))
        .await
        .expect("create");
    let old = Time {
        secs: 1_000_000,
        nanos: 0,
    };
    let set = SetAttr {
        mtime: Some(TimeSet::At(old)),
        ..SetAttr::default()
    };
    let a = c.setattr(d, set).await.expect("setattr");
    assert_eq!(a.mtime, old, "the setattr's answer");
    assert_eq!(c.getattr(d).await.expect("getattr").mtime, old);
    // A later change moves it again: the flush after it must store that one.
    let h = away_name(d, "h");
    c.create(d, &h, CreateSpec::file(0o644))
        .await
        .expect("create");
    let shown = c.getattr(d).await.expect("getattr").mtime;
    assert!(shown > old);
    common::eventually(Duration::from_secs(30), "the last update stored", || {
        let stored = stored_mtime(&cluster, 1, d);
        async move { stored.filter(|m| *m == shown).map(|_| ()) }
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_stops_stores_the_directory_updates_it_had_queued() {
    let (mut cluster, c, d) = one_node_with_dir().await;
    // A create whose directory update is still queued when the stop begins: one the
    // periodic flush has already stored says nothing, so try again with another name.
    let mut shown = None;
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let f = away_name(d, &format!("f{i}-"));
        c.create(d, &f, CreateSpec::file(0o644))
            .await
            .expect("create");
        let mtime = c.getattr(d).await.expect("getattr").mtime;
        if stored_mtime(&cluster, 1, d).is_some_and(|m| m < mtime) {
            shown = Some(mtime);
            break;
        }
    }
    let shown = shown.expect("an update still queued after one of 20 creates");
    cluster.stop_node(1).await;
    cluster.restart_node(1).await.expect("restart");
    // The restarted node applies its log again; an update its stop did not propose is
    // never there.
    common::eventually(Duration::from_secs(30), "the queued update stored", || {
        let stored = stored_mtime(&cluster, 1, d);
        async move { stored.filter(|m| *m >= shown).map(|_| ()) }
    })
    .await;
    cluster.shutdown().await;
}

/// While the flush proposes a queued update, reads of the directory still show it: taken
/// from the queue and not yet applied, it was in neither for a moment, and a `stat` of
/// the directory right after a create in it could see the older mtime (pjdfstest's
/// `link/00.t` through a mount caught it now and then).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_directory_update_being_flushed_still_shows() {
    let (cluster, c, d) = one_node_with_dir().await;
    // Each round spans about one flush period (50 ms), reading all along.
    for i in 0..30 {
        let f = away_name(d, &format!("f{i}-"));
        c.create(d, &f, CreateSpec::file(0o644))
            .await
            .expect("create");
        let shown = c.getattr(d).await.expect("getattr").mtime;
        let until = std::time::Instant::now() + Duration::from_millis(60);
        while std::time::Instant::now() < until {
            let now = c.getattr(d).await.expect("getattr").mtime;
            assert!(
                now >= shown,
                "round {i}: the directory's mtime went back from {shown:?} to {now:?}"
            );
        }
    }
    cluster.shutdown().await;
}

/// A name in `dir` whose entry lives on `dir`'s own partition.
fn home_name(dir: Ino, prefix: &str) -> Vec<u8> {
    (0..)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .find(|n| entry_partition(dir, n, Class::Relaxed, PARTITIONS) == dir.home())
        .expect("a name placed with the directory")
}

/// A create's and a remove's answers carry the directory's attributes after the change,
/// as a read of the directory then shows them: whether the directory is updated in the
/// change's own commit (an entry on its home partition), by a queued update (a file entry
/// elsewhere) or by a second commit (a subdirectory elsewhere). The mount shows them for
/// its own change instead of asking for them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_answers_with_the_directory_as_reads_show_it() {
    let (cluster, c, d) = one_node_with_dir().await;
    for (what, name, spec) in [
        ("file here", home_name(d, "f"), CreateSpec::file(0o644)),
        ("file away", away_name(d, "g"), CreateSpec::file(0o644)),
        ("dir here", home_name(d, "s"), CreateSpec::dir(0o755, None)),
        ("dir away", away_name(d, "t"), CreateSpec::dir(0o755, None)),
    ] {
        let before = c.getattr(d).await.expect("getattr");
        tokio::time::sleep(Duration::from_millis(2)).await;
        let made = c.create_in(d, &name, spec.clone()).await.expect("create");
        let shown = c.getattr(d).await.expect("getattr");
        assert_eq!(made.dir.as_ref(), Some(&shown), "{what}: create");
        assert!(shown.mtime > before.mtime, "{what}: create moved the mtime");
        let directory = spec.kind == talon_model::FileKind::Directory;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let gone = c.remove_in(d, &name, directory).await.expect("remove");
        let after = c.getattr(d).await.expect("getattr");
        assert_eq!(gone.dir.as_ref(), Some(&after), "{what}: remove");
        assert!(after.mtime > shown.mtime, "{what}: remove moved the mtime");
        assert_eq!(after.nlink, before.nlink, "{what}: link count back");
    }
    cluster.shutdown().await;
}

/// On three nodes, a file entry's change served by another node than the leader of the
/// directory's home is queued at that leader too (one commit per create, not two): its
/// answer carries the directory's attributes as a read there shows them, and the queued
/// update is stored within the flush period.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_served_elsewhere_is_queued_at_the_directorys_home() {
    let (cluster, c, d) = nodes_with_dir(3).await;
    let home_leader = cluster.leader_of(d.home()).await.expect("home leader");
    let mut served_elsewhere = 0;
    for i in 0..40 {
        let name = format!("f{i}").into_bytes();
        let p = entry_partition(d, &name, Class::Relaxed, PARTITIONS);
        if p == d.home() || cluster.leader_of(p).await == Some(home_leader) {
            continue;
        }
        served_elsewhere += 1;
        let made = c
            .create_in(d, &name, CreateSpec::file(0o644))
            .await
            .expect("create");
        let shown = c.getattr(d).await.expect("getattr");
        assert_eq!(made.dir.as_ref(), Some(&shown), "{i}: create");
        common::eventually(Duration::from_secs(30), "the queued update stored", || {
            let stored = stored_mtime(&cluster, home_leader, d);
            async move { stored.filter(|m| *m >= shown.mtime).map(|_| ()) }
        })
        .await;
        let gone = c.remove_in(d, &name, false).await.expect("remove");
        assert_eq!(
            gone.dir.as_ref(),
            Some(&c.getattr(d).await.expect("getattr")),
            "{i}: remove"
        );
        if served_elsewhere == 4 {
            break;
        }
    }
    assert_eq!(
        served_elsewhere, 4,
        "names served away from the home's leader"
    );
    cluster.shutdown().await;
}
