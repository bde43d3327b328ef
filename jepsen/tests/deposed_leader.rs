//! Finding F9's regression test: a leader cut off from its followers while proposals it
//! could not commit were waiting, then deposed and caught up by a snapshot that covers
//! those proposals, still takes proposals. Before the fix its partition's proposal slots
//! stayed held for answers openraft never gives in that case (the entries are neither
//! applied nor cut from the log, only purged under the snapshot), so every proposal the
//! node was sent afterwards, as a follower that should redirect it or as the leader again,
//! waited until the sender gave up.
//!
//! The cut must lose messages, as a network partition does: a paused process would find
//! the new leader's first messages in its sockets when it resumes, and cut its stale
//! entries from the log, which answers them. So the test does what the harness does: it
//! moves its process into a network namespace of its own (root only) and drops packets
//! between nodes with nftables there.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use talon_client::{Client, ClientOptions, PartitionStatus};
use talon_jepsen::cluster::{Cluster, ClusterSpec};
use talon_jepsen::net::{enter_private_netns, Firewall};
use talon_meta::network::{PeerRpc, Peers};
use talon_meta::node::{PeerReply, PeerRequest};
use talon_meta::types::Command;
use talon_testkit::poll_until as eventually;

/// Entries between snapshots; a tenth of it stays in the log behind each.
const SNAPSHOT_EVERY: u64 = 100;

/// Partition 0's status on every node that answers within 3 s, with the node's id: one
/// round of status calls.
async fn statuses(client: &Client) -> Vec<(u64, PartitionStatus)> {
    let Ok(all) = tokio::time::timeout(Duration::from_secs(3), client.status()).await else {
        return Vec::new();
    };
    all.into_iter()
        .filter_map(|n| {
            let p0 = n.partitions.ok()?.into_iter().find(|p| p.id == 0)?;
            Some((n.node_id, p0))
        })
        .collect()
}

/// Partition 0's status on node `id`, if it answers within 3 s.
async fn status(client: &Client, id: u64) -> Option<PartitionStatus> {
    statuses(client)
        .await
        .into_iter()
        .find_map(|(n, s)| (n == id).then_some(s))
}

/// The node among `ids` that says it leads partition 0.
async fn leader_among(client: &Client, ids: &[u64]) -> Option<u64> {
    statuses(client)
        .await
        .into_iter()
        .find_map(|(n, s)| (ids.contains(&n) && s.role == "LEADER").then_some(n))
}

/// Proposes a no-op on partition 0 at node `id` itself, following no redirect: Ok with
/// the node's answer (applied, or an error such as "not the leader"), Err if the call got
/// no answer in `timeout`.
async fn propose_at(
    peers: &Peers,
    id: u64,
    timeout: Duration,
) -> Result<Result<PeerReply, Vec<u8>>, String> {
    peers
        .call::<PeerRequest, PeerReply>(
            id,
            PeerRpc::Peer,
            0,
            &PeerRequest::Propose(Command::Noop),
            timeout,
        )
        .await
        .map_err(|e| e.to_string())
}

async fn scenario(cluster: &Cluster, fw: &Firewall) -> Result<(), String> {
    let ids = cluster.ids();
    let addrs = cluster.addrs();
    let opts = ClientOptions {
        op_timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    };
    let client = eventually(Duration::from_secs(30), "the cluster to serve", || {
        let (addrs, opts) = (addrs.clone(), opts.clone());
        async move {
            let c = Client::connect(&addrs, opts).await.ok()?;
            c.stat("/").await.ok()?;
            Some(c)
        }
    })
    .await?;
    let peers: Arc<Peers> = Peers::new(ids.iter().copied().zip(addrs).collect::<HashMap<_, _>>());
    let old = eventually(Duration::from_secs(30), "a leader of partition 0", || {
        leader_among(&client, &ids)
    })
    .await?;
    let others: Vec<u64> = ids.iter().copied().filter(|&i| i != old).collect();
    let before = status(&client, old)
        .await
        .ok_or("no status from the leader")?;

    // Cut the leader off its followers and give it proposals it cannot commit: more than
    // the slots it proposes through, each sent on its own so each is an entry.
    let cut: Vec<(u64, u64)> = others.iter().map(|&o| (old, o)).collect();
    fw.apply(&cut).map_err(|e| e.to_string())?;
    let mut stuck = Vec::new();
    for _ in 0..4 {
        let peers = peers.clone();
        stuck.push(tokio::spawn(async move {
            propose_at(&peers, old, Duration::from_secs(2)).await
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let held = eventually(
        Duration::from_secs(10),
        "the cut-off leader to append proposals it cannot commit",
        || async {
            let s = status(&client, old).await?;
            (s.last_log_index >= before.last_log_index + 2).then_some(s.last_log_index)
        },
    )
    .await?;
    for t in stuck {
        if let Ok(Ok(Ok(r))) = t.await {
            return Err(format!("a proposal without a quorum was applied: {r:?}"));
        }
    }

    // The others elect a leader and go on until its snapshot, less the entries it keeps
    // behind it, is past everything the old leader holds.
    let new = eventually(Duration::from_secs(30), "a new leader", || {
        leader_among(&client, &others)
    })
    .await?;
    let snap = eventually(
        Duration::from_secs(60),
        "the new leader's log to be purged past the old leader's",
        || async {
            for _ in 0..20 {
                propose_at(&peers, new, Duration::from_secs(5))
                    .await
                    .ok()?
                    .ok()?;
            }
            let s = status(&client, new).await?;
            (s.snapshot_index > held + SNAPSHOT_EVERY).then_some(s.snapshot_index)
        },
    )
    .await?;

    // Heal: the old leader learns it was deposed and installs the new leader's snapshot.
    fw.apply(&[]).map_err(|e| e.to_string())?;
    eventually(
        Duration::from_secs(30),
        "the old leader to install the new leader's snapshot",
        || async {
            let s = status(&client, old).await?;
            (s.role != "LEADER" && s.applied_index >= snap).then_some(())
        },
    )
    .await?;

    // A proposal sent to it is answered: redirected if it follows, applied if it leads.
    match propose_at(&peers, old, Duration::from_secs(10)).await {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "node {old}, deposed, left a proposal unanswered: {e}"
        )),
    }
}

#[test]
fn a_deposed_leader_takes_proposals_after_a_snapshot_covers_its_own() {
    // Before any thread of this test's own: threads started later share the namespace.
    let ns = enter_private_netns().expect("a network namespace of this test's own (root)");
    let fw = Firewall::new(&ns, false).expect("an nftables table in the test's namespace");
    let dir = tempfile::Builder::new()
        .prefix("talon-deposed-")
        .tempdir()
        .expect("temp dir");
    let mut cluster = Cluster::init(ClusterSpec {
        meta_bin: common::binary("TALON_META_BIN", "talon-meta", "talon-meta"),
        dir: dir.path().to_path_buf(),
        nodes: 3,
        replication: 3,
        partitions: 1,
        node_log: "warn".into(),
    })
    .expect("write the nodes' configs");
    cluster
        .snapshot_every(SNAPSHOT_EVERY)
        .expect("set the snapshot interval");
    cluster.start_all().expect("start the nodes");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let res = rt.block_on(scenario(&cluster, &fw));
    let _ = fw.apply(&[]);
    if let Err(e) = res {
        let logs: Vec<String> = cluster
            .ids()
            .into_iter()
            .map(|id| format!("node {id}:\n{}", cluster.log_tail(id, 30)))
            .collect();
        panic!("{e}\n{}", logs.join("\n"));
    }
}
