//! Losing one partition's leader replica (its Raft group stops on that node while the
//! node's other groups keep serving): creates into that partition go on after an election,
//! nothing acknowledged is lost, and the node restarted in process catches up.

mod common;

use common::eventually;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use talon_client::CreateSpec;
use talon_model::placement::entry_partition;
use talon_model::Class;
use tokio::sync::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_go_on_when_one_partition_leader_stops() {
    let (mut cluster, c) = common::cluster(3, 8).await;
    let dir = c.mkdir("/d", Default::default()).await.expect("mkdir").ino;
    const TARGET: u32 = 5;
    // Names that all land on partition TARGET.
    let names: Vec<Vec<u8>> = (0..100_000)
        .map(|i| format!("n{i}").into_bytes())
        .filter(|n| entry_partition(dir, n, Class::Relaxed, 8) == TARGET)
        .take(3000)
        .collect();
    let names = Arc::new(names);
    let acked: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let (c, names, acked, next, stop) = (
                c.clone(),
                names.clone(),
                acked.clone(),
                next.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(n) = names.get(i) else { break };
                    if c.create(dir, n, CreateSpec::file(0o644)).await.is_ok() {
                        acked.lock().await.push(n.clone());
                    }
                }
            })
        })
        .collect();
    eventually(
        Duration::from_secs(120),
        "creates before the stop",
        || async { (acked.lock().await.len() >= 200).then_some(()) },
    )
    .await;
    let leader = common::settled_leader(&cluster, TARGET).await;
    cluster.node(leader).expect("node").node.partitions[&TARGET]
        .raft
        .shutdown()
        .await
        .expect("stop the group");
    let at_stop = acked.lock().await.len();
    eventually(Duration::from_secs(120), "creates to go on", || async {
        (acked.lock().await.len() >= at_stop + 300).then_some(())
    })
    .await;
    // An election may be under way at any one instant; the stopped group never leads again.
    eventually(
        Duration::from_secs(60),
        &format!("partition {TARGET} to have a new leader"),
        || async {
            let new_leader = cluster.leader_of(TARGET).await;
            (new_leader.is_some() && new_leader != Some(leader)).then_some(())
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.await.expect("writer");
    }
    // Bring the replica back by restarting its node; it catches up.
    cluster.stop_node(leader).await;
    cluster.restart_node(leader).await.expect("restart");
    let acked = acked.lock().await.clone();
    for n in &acked {
        c.lookup(dir, n)
            .await
            .unwrap_or_else(|e| panic!("acknowledged {} lost: {e}", String::from_utf8_lossy(n)));
    }
    let part = cluster.node(leader).expect("restarted").node.partitions[&TARGET].clone();
    let want = acked.len() as u64;
    eventually(
        Duration::from_secs(120),
        "the restarted replica to catch up",
        || {
            let part = part.clone();
            async move {
                let entries = part
                    .store
                    .read(|v| v.counter(talon_meta::keys::meta::ENTRIES))
                    .ok()?;
                (entries >= want).then_some(())
            }
        },
    )
    .await;
    println!(
        "{} creates acknowledged; {} after the stop",
        acked.len(),
        acked.len() - at_stop
    );
    cluster.shutdown().await;
}
