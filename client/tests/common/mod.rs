//! Shared fixture of the client's integration tests: a real in-process cluster (every node
//! a gRPC server on 127.0.0.1:0 with its own temporary data directory) and clients on it.
//!
//! Clusters of one test binary are started one at a time (a process-wide semaphore): the
//! test machines are small, and Raft elections under a starved CPU make timing-sensitive
//! tests flaky.

#![allow(dead_code)]

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;
use talon_client::{Client, ClientOptions, Errno, TalonError};
use talon_testkit::{TestCluster, TestClusterBuilder};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The staleness bound the fixture's clusters use.
pub const STALENESS_MS: u64 = 500;

/// The strict prefix the fixture's clusters use.
pub const STRICT_PREFIX: &str = "/ckpt";

fn gate() -> &'static std::sync::Arc<Semaphore> {
    static GATE: OnceLock<std::sync::Arc<Semaphore>> = OnceLock::new();
    GATE.get_or_init(|| std::sync::Arc::new(Semaphore::new(1)))
}

/// A running cluster and one client on it.
pub struct Fixture {
    /// The cluster.
    pub cluster: TestCluster,
    /// A client connected to every node.
    pub client: Client,
    _permit: OwnedSemaphorePermit,
}

impl Fixture {
    /// A cluster of `nodes` nodes, 8 partitions, replication min(3, nodes).
    pub async fn start(nodes: u64) -> Fixture {
        Fixture::start_with(nodes, |b| b).await
    }

    /// As [`Fixture::start`], with the builder adjusted by `tune` (e.g. file sizes).
    pub async fn start_with(
        nodes: u64,
        tune: impl FnOnce(TestClusterBuilder) -> TestClusterBuilder,
    ) -> Fixture {
        let permit = gate()
            .clone()
            .acquire_owned()
            .await
            .expect("gate is never closed");
        let builder = TestCluster::builder()
            .nodes(nodes)
            .partitions(8)
            .replication(nodes.min(3) as u32)
            .strict_prefixes(vec![STRICT_PREFIX.into()])
            .relaxed_staleness_ms(STALENESS_MS);
        let cluster = tune(builder).start().await.expect("start the test cluster");
        let client = connect(&cluster).await;
        Fixture {
            cluster,
            client,
            _permit: permit,
        }
    }

    /// Another, independent client (its own cache and channels).
    pub async fn other_client(&self) -> Client {
        connect(&self.cluster).await
    }

    /// Stops every node.
    pub async fn shutdown(self) {
        self.cluster.shutdown().await;
    }
}

/// A client on `cluster` with default options.
pub async fn connect(cluster: &TestCluster) -> Client {
    Client::connect(&cluster.addrs(), ClientOptions::default())
        .await
        .expect("connect a client")
}

/// A client on `cluster` with `opts`.
pub async fn connect_with(cluster: &TestCluster, opts: ClientOptions) -> Client {
    Client::connect(&cluster.addrs(), opts)
        .await
        .expect("connect a client")
}

/// Options for bulk tests (hundreds of thousands of operations against one node on a
/// small, loaded machine): deadlines far beyond what any single RPC or operation takes
/// when things work, so slowness is never mistaken for failure, and fewer batch RPCs in
/// flight, so each one finishes sooner.
pub fn bulk_options() -> ClientOptions {
    ClientOptions {
        op_timeout: Duration::from_secs(300),
        request_timeout: Duration::from_secs(120),
        batch_concurrency: 4,
        ..ClientOptions::default()
    }
}

/// The errno of a result that must be an error.
#[track_caller]
pub fn errno<T: std::fmt::Debug>(r: Result<T, TalonError>) -> Errno {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.errno(),
    }
}

/// Polls `check` until it returns true or `limit` passes; returns whether it did.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The node leading `partition` once one is known and its read barrier succeeds, polled
/// for up to 60 s. Leadership can move at any instant (a spurious election on a loaded
/// machine), so a single look may find no leader, or one just deposed.
pub async fn settled_leader(cluster: &TestCluster, partition: u32) -> u64 {
    let found = std::cell::Cell::new(None);
    let settled = eventually(Duration::from_secs(60), || {
        let found = &found;
        async move {
            let Some(id) = cluster.leader_of(partition).await else {
                return false;
            };
            let Some(part) = cluster
                .node(id)
                .and_then(|n| n.node.partitions.get(&partition).cloned())
            else {
                return false;
            };
            let barrier = tokio::time::timeout(Duration::from_secs(10), part.linearizable());
            if matches!(barrier.await, Ok(Ok(()))) {
                found.set(Some(id));
                return true;
            }
            false
        }
    })
    .await;
    match found.get() {
        Some(id) if settled => id,
        _ => panic!("no leader of partition {partition} passed a read barrier within 60 s"),
    }
}
