//! Routing under node failure: with R = 3, stopping any one node (including partition
//! leaders) leaves every operation working; the router follows NotLeader answers and moves
//! off unreachable replicas within the operation deadline.

mod common;

use common::{eventually, settled_leader, Fixture};
use std::time::Duration;
use talon_client::MkdirOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_continue_when_a_leader_stops() {
    let mut fx = Fixture::start(3).await;
    let c = fx.client.clone();
    c.mkdir("/d", MkdirOptions::default()).await.expect("mkdir");
    for i in 0..50 {
        c.create_file(format!("/d/before{i}"), 0o644)
            .await
            .expect("create before");
    }
    let victim = settled_leader(&fx.cluster, 0).await;
    fx.cluster.stop_node(victim).await;
    for i in 0..50 {
        c.create_file(format!("/d/after{i}"), 0o644)
            .await
            .expect("create after a stop");
        c.stat(format!("/d/before{i}"))
            .await
            .expect("stat after a stop");
    }
    let fresh = fx.other_client().await;
    // Its relaxed stat may reach a replica that has not applied the create yet.
    assert!(
        eventually(Duration::from_secs(30), || async {
            fresh.stat("/d/after49").await.is_ok()
        })
        .await,
        "a new client connects past a dead seed"
    );
    fx.cluster.restart_node(victim).await.expect("restart");
    fx.cluster
        .wait_for_leaders()
        .await
        .expect("leaders after restart");
    c.create_file("/d/restarted", 0o644)
        .await
        .expect("create after restart");
    fx.shutdown().await;
}
