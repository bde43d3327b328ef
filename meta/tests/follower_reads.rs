//! A follower serves relaxed reads only on its own question to its leader, for the
//! staleness bound from the asking: a message from the leader that arrives late does not
//! make the follower's state count as fresh. It asks only while relaxed reads come to it.
//!
//! A follower used to count the arrival of an AppendEntries as contact with its leader. One
//! held up in the network for longer than a client's session window then made state older
//! than the client's own write look fresh. Here the late message is sent by the test, as
//! the leader would have sent it, after the leader and the other follower have stopped.

mod common;

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use std::collections::HashMap;
use std::time::Duration;
use talon_meta::network::{PeerRpc, Peers};
use talon_meta::types::TypeConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_append_from_the_leader_does_not_make_a_follower_fresh() {
    let (mut cluster, client) = common::cluster(3, 1).await;
    client
        .write_file("/f", b"written")
        .await
        .expect("write a file");
    let leader = common::settled_leader(&cluster, 0).await;
    let follower = (1..=3).find(|&n| n != leader).expect("a follower");
    let other = (1..=3)
        .find(|&n| n != leader && n != follower)
        .expect("another follower");
    let node = cluster.node(follower).expect("follower runs").node.clone();
    let bound = node.staleness_bound();
    let part = node.partitions[&0].clone();

    // The follower's questions are answered: it serves relaxed reads.
    common::eventually(
        Duration::from_secs(30),
        "the follower to serve relaxed reads",
        || async { part.relaxed_ok(bound).then_some(()) },
    )
    .await;

    // It stops campaigning (so it keeps the leader's term), and loses the other two.
    part.hand_over(true);
    let (vote, last) = {
        let m = part.raft.metrics().borrow().clone();
        (m.vote, m.last_applied)
    };
    assert_eq!(
        vote.leader_id.voted_for(),
        Some(leader),
        "the follower follows the leader"
    );
    cluster.stop_node(leader).await;
    cluster.stop_node(other).await;
    tokio::time::sleep(bound).await;
    assert!(
        !part.relaxed_ok(bound),
        "no relaxed reads once the leader no longer answers"
    );

    // An empty AppendEntries of the leader's term, as it sent them before it stopped,
    // arrives now: the follower takes it, and still serves no relaxed reads.
    let late = AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: last,
        entries: Vec::new(),
        leader_commit: last,
    };
    let addr = cluster
        .node(follower)
        .expect("follower runs")
        .addr
        .to_string();
    let peers = Peers::new(HashMap::from([(follower, addr)]));
    let answer = peers
        .call::<_, AppendEntriesResponse<u64>>(
            follower,
            PeerRpc::Append,
            0,
            &late,
            Duration::from_secs(10),
        )
        .await
        .expect("the follower answers")
        .expect("the follower takes the append");
    assert!(
        answer.is_success(),
        "the follower takes the append: {answer:?}"
    );
    assert!(
        !part.relaxed_ok(bound),
        "a late append from the leader makes the follower's state look fresh"
    );
    cluster.shutdown().await;
}

/// A follower asks its leader only while relaxed reads come to it: none before the first,
/// and it serves them from its next round of questions on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_asks_its_leader_only_once_read_from() {
    let (cluster, _client) = common::cluster(3, 1).await;
    let leader = common::settled_leader(&cluster, 0).await;
    let follower = (1..=3).find(|&n| n != leader).expect("a follower");
    let node = cluster.node(follower).expect("follower runs").node.clone();
    let bound = node.staleness_bound();
    let part = node.partitions[&0].clone();

    // Four rounds of questions (a quarter bound apart) would have been asked by now.
    tokio::time::sleep(bound).await;
    assert!(
        !part.wants_leader_answers(bound * 2),
        "the follower counts a relaxed read nobody made"
    );
    assert!(
        !part.relaxed_ok(bound),
        "the follower serves relaxed reads without having asked its leader"
    );
    assert!(
        part.wants_leader_answers(bound * 2),
        "the relaxed read refused does not make the follower ask"
    );
    common::eventually(
        Duration::from_secs(30),
        "the follower to serve relaxed reads",
        || async { part.relaxed_ok(bound).then_some(()) },
    )
    .await;
    cluster.shutdown().await;
}
