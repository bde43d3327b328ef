//! The namespace epoch: a directory rename moves every partition's epoch one on, a file
//! rename does not, and a write carrying an older epoch is refused with StaleEpoch.

mod common;

use common::TestCluster;
use std::time::{Duration, Instant};
use talon_client::CreateSpec;
use talon_meta::namespace::Namespace;
use talon_model::placement::entry_partition;
use talon_model::{Attr, Class, Ino, TalonError};

async fn epochs(cluster: &TestCluster) -> Vec<u64> {
    let mut out = Vec::new();
    for p in 0..8 {
        let leader = common::settled_leader(cluster, p).await;
        let part = &cluster.node(leader).expect("node").node.partitions[&p];
        out.push(part.store.epoch().expect("epoch"));
    }
    out
}

/// `create` called directly on the leader of partition `p`. A node deposed between the
/// look-up and the call answers NotLeader without proposing anything; then the create is
/// sent again to whichever node leads by then (for up to 60 s).
async fn create_on_leader(
    cluster: &TestCluster,
    p: u32,
    epoch: u64,
    parent: Ino,
    name: &[u8],
    spec: &CreateSpec,
) -> Result<(Attr, u64), TalonError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let leader = common::settled_leader(cluster, p).await;
        let node = &cluster.node(leader).expect("node").node;
        match Namespace::new(node)
            .create(p, epoch, parent, name, spec, 0)
            .await
        {
            Err(TalonError::NotLeader { .. }) if Instant::now() < deadline => continue,
            r => return r.map(|made| (made.attr, made.epoch)),
        }
    }
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
    let spec = CreateSpec {
        owner: Some((0, 0)),
        ..CreateSpec::file(0o644)
    };
    let e = create_on_leader(&cluster, p, 1, root, &name, &spec)
        .await
        .expect_err("stale create");
    assert_eq!(e, TalonError::StaleEpoch { epoch: 2 });
    create_on_leader(&cluster, p, 2, root, &name, &spec)
        .await
        .expect("create at the current epoch");
    cluster.shutdown().await;
}
