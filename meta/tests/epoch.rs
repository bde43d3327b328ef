//! The namespace epoch: a directory rename moves every partition's epoch one on, a file
//! rename does not, and a write carrying an older epoch is refused with StaleEpoch.

mod common;

use common::TestCluster;
use talon_client::CreateSpec;
use talon_meta::namespace::CreateSpec as ServerSpec;
use talon_model::placement::entry_partition;
use talon_model::{Class, FileKind, TalonError};

async fn epochs(cluster: &TestCluster) -> Vec<u64> {
    let mut out = Vec::new();
    for p in 0..8 {
        let leader = cluster.leader_of(p).await.expect("leader");
        let part = &cluster.node(leader).expect("node").node.partitions[&p];
        part.linearizable().await.expect("barrier");
        out.push(part.store.epoch().expect("epoch"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn directory_renames_bump_every_partition_and_stale_writes_are_refused() {
    let (cluster, c) = common::cluster(3, 8).await;
    assert_eq!(epochs(&cluster).await, vec![1; 8], "epochs start at 1");
    let root = c.root();
    c.create(root, b"f", CreateSpec::file(0o644))
        .await
        .expect("create file");
    c.rename_entry(root, b"f", root, b"g", Default::default())
        .await
        .expect("rename file");
    assert_eq!(
        epochs(&cluster).await,
        vec![1; 8],
        "a file rename leaves the epoch"
    );
    c.create(root, b"d", CreateSpec::dir(0o755, None))
        .await
        .expect("mkdir");
    c.rename_entry(root, b"d", root, b"e", Default::default())
        .await
        .expect("rename dir");
    assert_eq!(
        epochs(&cluster).await,
        vec![2; 8],
        "a directory rename bumps every partition"
    );

    // A create stamped with epoch 1 is refused now, wherever it lands.
    let name = b"late".to_vec();
    let p = entry_partition(root, &name, Class::Relaxed, 8);
    let leader = cluster.leader_of(p).await.expect("leader");
    let node = &cluster.node(leader).expect("node").node;
    let spec = ServerSpec {
        kind: FileKind::Regular,
        perm: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink: Vec::new(),
        class: None,
        exclusive: true,
        request_id: 0,
    };
    let e = node
        .create(p, 1, root, &name, &spec)
        .await
        .expect_err("stale create");
    assert_eq!(e, TalonError::StaleEpoch { epoch: 2 });
    node.create(p, 2, root, &name, &spec)
        .await
        .expect("create at the current epoch");
    cluster.shutdown().await;
}
