//! rmdir racing creates in the directory: never a removed directory with a child, never a
//! lost acknowledged create. Each round races one rmdir loop against creators; whichever
//! wins, the end state must agree with what was acknowledged.

mod common;

use common::TestCluster;
use std::sync::Arc;
use std::time::Duration;
use talon_client::CreateSpec;
use talon_model::Errno;
use tokio::sync::Mutex;

/// Entries of `dir` on every partition leader's state: what is really there, whatever
/// any client believes (the directory's inode may be gone).
async fn children_on_leaders(cluster: &TestCluster, dir: talon_model::Ino) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for p in 0..8 {
        // A leader whose read barrier passed holds every acknowledged change.
        let leader = common::settled_leader(cluster, p).await;
        let part = &cluster
            .node(leader)
            .expect("running leader")
            .node
            .partitions[&p];
        let (entries, more) = part.store.readdir(dir, b"", 100_000).expect("scan");
        assert!(!more);
        out.extend(entries.into_iter().map(|(name, _)| name));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rmdir_never_leaves_children_or_loses_creates() {
    let (cluster, c) = common::cluster(3, 8).await;
    let root = c.root();
    let mut rmdir_won = 0;
    let mut creates_won = 0;
    for round in 0..12u64 {
        let dname = format!("d{round}").into_bytes();
        let dir = c
            .create(root, &dname, CreateSpec::dir(0o755, None))
            .await
            .expect("mkdir")
            .ino;
        let acked: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let mut creators = Vec::new();
        for w in 0..3u64 {
            let (c, acked) = (c.clone(), acked.clone());
            creators.push(tokio::spawn(async move {
                // Stagger starts so that both outcomes happen across rounds.
                tokio::time::sleep(Duration::from_millis((round * 7 + w * 3) % 20)).await;
                for j in 0..10 {
                    let name = format!("f{w}-{j}").into_bytes();
                    match c.create(dir, &name, CreateSpec::file(0o644)).await {
                        Ok(_) => acked.lock().await.push(name),
                        Err(e) => {
                            assert_eq!(
                                e.errno(),
                                Errno::ENOENT,
                                "create under a racing rmdir: {e}"
                            );
                            return;
                        }
                    }
                }
            }));
        }
        let rm = {
            let c = c.clone();
            let dname = dname.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis((round * 5) % 15)).await;
                match c.remove(root, &dname, true).await {
                    Ok(_) => true,
                    Err(e) if e.errno() == Errno::ENOTEMPTY => false,
                    Err(e) => panic!("rmdir failed: {e}"),
                }
            })
        };
        let removed = rm.await.expect("rmdir task");
        for t in creators {
            t.await.expect("creator task");
        }
        let acked = acked.lock().await.clone();
        let mut listed = children_on_leaders(&cluster, dir).await;
        if removed {
            rmdir_won += 1;
            assert!(
                acked.is_empty(),
                "round {round}: rmdir succeeded after acknowledged creates {acked:?}"
            );
            assert!(
                listed.is_empty(),
                "round {round}: removed directory still has children {listed:?}"
            );
            let e = c
                .create(dir, b"late", CreateSpec::file(0o644))
                .await
                .expect_err("create in removed dir");
            assert_eq!(e.errno(), Errno::ENOENT);
        } else {
            creates_won += 1;
            listed.sort();
            let mut want = acked.clone();
            want.sort();
            assert_eq!(
                listed, want,
                "round {round}: listing differs from acknowledged creates"
            );
        }
    }
    println!("rmdir won {rmdir_won} rounds, creates won {creates_won}");
    assert!(rmdir_won + creates_won == 12);
    cluster.shutdown().await;
}
