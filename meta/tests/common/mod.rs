//! Shared fixtures of the server's integration tests: an in-process cluster (re-exported
//! from `talon_testkit`) and a cluster of real `talon-meta` processes that a test can
//! SIGKILL, for crash tests. Every process is killed when the fixture drops.

#![allow(dead_code)]

pub mod small_disk;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;
use talon_client::{Client, ClientOptions};
use talon_meta::config::{ClusterConfig, Config, NodeEntry, RaftConfig, SpaceConfig};

#[allow(unused_imports)]
pub use talon_testkit::TestCluster;

/// A client of `addrs` with a generous per-operation deadline.
pub async fn client(addrs: &[String]) -> Client {
    client_waiting(addrs, Duration::from_secs(60)).await
}

/// A client of `addrs` whose operations may take `op_timeout`.
pub async fn client_waiting(addrs: &[String], op_timeout: Duration) -> Client {
    let opts = ClientOptions {
        op_timeout,
        ..ClientOptions::default()
    };
    Client::connect(addrs, opts).await.expect("connect client")
}

/// An in-process cluster of `nodes` nodes and `partitions` partitions (replication
/// min(3, nodes)), and a client of it.
pub async fn cluster(nodes: u64, partitions: u32) -> (TestCluster, Client) {
    let cluster = TestCluster::builder()
        .nodes(nodes)
        .partitions(partitions)
        .replication(nodes.min(3) as u32)
        .start()
        .await
        .expect("cluster");
    let c = client(&cluster.addrs()).await;
    (cluster, c)
}

/// A 3-node cluster (R = 3) of `partitions` partitions whose stale-transaction recovery
/// resolves prepared intents after `recovery_after`, for tests that leave a transaction
/// to it, and a client whose operations may wait `op_timeout` (a reader of a locked entry
/// waits for that recovery).
pub async fn recovering_cluster(
    partitions: u32,
    recovery_after: Duration,
    op_timeout: Duration,
) -> (TestCluster, Client) {
    let cluster = TestCluster::builder()
        .nodes(3)
        .partitions(partitions)
        .replication(3)
        .txn_recovery_after_ms(recovery_after.as_millis() as u64)
        .start()
        .await
        .expect("cluster");
    let c = client_waiting(&cluster.addrs(), op_timeout).await;
    (cluster, c)
}

/// A one-node cluster of `partitions` partitions and a bare gRPC client of its `Namespace`
/// service, for tests of the wire edge itself.
pub async fn bare_node(
    partitions: u32,
) -> (
    TestCluster,
    talon_proto::v1::namespace_client::NamespaceClient<tonic::transport::Channel>,
) {
    let cluster = TestCluster::builder()
        .nodes(1)
        .partitions(partitions)
        .replication(1)
        .start()
        .await
        .expect("cluster");
    let addr = cluster.addrs()[0].clone();
    let c = talon_proto::v1::namespace_client::NamespaceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    (cluster, c)
}

/// The header of a request for `partition`: no epoch, not a relaxed read.
pub fn header(partition: u32) -> Option<talon_proto::v1::RequestHeader> {
    Some(talon_proto::v1::RequestHeader {
        partition,
        ..Default::default()
    })
}

/// Prepares transaction `txid` as a coordinator would, through `node`: each partition's
/// share of `shares`, stamped with the wall clock now; asserts every share prepared.
pub async fn prepare(
    node: &talon_meta::node::Node,
    txid: talon_meta::types::TxId,
    shares: Vec<(u32, Vec<talon_meta::types::Op>)>,
) {
    prepare_stamped(node, txid, shares, Duration::ZERO).await
}

/// [`prepare`] by a coordinator whose wall clock runs `ahead` of the true time.
pub async fn prepare_stamped(
    node: &talon_meta::node::Node,
    txid: talon_meta::types::TxId,
    shares: Vec<(u32, Vec<talon_meta::types::Op>)>,
    ahead: Duration,
) {
    use talon_meta::types::{Command, CommandResult};
    let at_ms = (std::time::SystemTime::now() + ahead)
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    for (p, ops) in shares {
        let r = node
            .propose_on(p, Command::Prepare { txid, ops, at_ms })
            .await
            .expect("prepare");
        assert!(
            matches!(r, CommandResult::Prepared { .. }),
            "prepare on {p}: {r:?}"
        );
    }
}

/// A loopback address of this cluster's own, `127.a.b.1` with `a.b` drawn at random.
/// Outgoing connections on this machine take their ephemeral ports on 127.0.0.1, so a
/// port held on another loopback address cannot be taken by one of them while a node is
/// down for a restart (a port picked on 127.0.0.1 could, and the node would then fail to
/// bind when it comes back).
fn cluster_ip() -> std::net::Ipv4Addr {
    let [a, b]: [u8; 2] = rand::random();
    std::net::Ipv4Addr::new(127, a.max(1), b, 1)
}

/// A port free on `ip`, picked by the OS.
fn free_port(ip: std::net::Ipv4Addr) -> u16 {
    let l = std::net::TcpListener::bind((ip, 0)).expect("bind port 0");
    l.local_addr().expect("local addr").port()
}

/// N `talon-meta` processes on loopback, each with its own data directory.
pub struct ProcCluster {
    pub dir: tempfile::TempDir,
    pub configs: Vec<PathBuf>,
    pub addrs: Vec<String>,
    children: Vec<Option<Child>>,
}

impl ProcCluster {
    /// Writes configs for `n` nodes and starts them.
    pub fn start(n: u64, partitions: u32, raft: RaftConfig) -> ProcCluster {
        ProcCluster::start_with(n, partitions, raft, |_| {})
    }

    /// As [`ProcCluster::start`], with `cluster` adjusting the cluster section (the same on
    /// every node) after the fixture has filled in nodes, partitions and replication.
    pub fn start_with(
        n: u64,
        partitions: u32,
        raft: RaftConfig,
        cluster: impl Fn(&mut ClusterConfig),
    ) -> ProcCluster {
        ProcCluster::start_configured(n, partitions, raft, |c| cluster(&mut c.cluster))
    }

    /// As [`ProcCluster::start`], with `adjust` changing each node's whole configuration
    /// (storage budgets, say) after the fixture has filled it in.
    pub fn start_configured(
        n: u64,
        partitions: u32,
        raft: RaftConfig,
        adjust: impl Fn(&mut Config),
    ) -> ProcCluster {
        let dir = tempfile::Builder::new()
            .prefix("talon-proc-")
            .tempdir()
            .expect("temp dir");
        let ip = cluster_ip();
        let nodes: Vec<NodeEntry> = (1..=n)
            .map(|id| NodeEntry {
                id,
                addr: format!("{ip}:{}", free_port(ip)),
            })
            .collect();
        let mut configs = Vec::new();
        for node in &nodes {
            let mut c = Config {
                node_id: node.id,
                listen: node.addr.clone(),
                data_dir: dir.path().join(format!("node{}", node.id)),
                raft: raft.clone(),
                // The machine's disk is shared with everything else: never count it full.
                space: SpaceConfig {
                    nearfull_ratio: 1.0,
                    full_ratio: 1.0,
                    reserve_bytes: 0,
                },
                ..Config::default()
            };
            c.cluster.nodes = nodes.clone();
            c.cluster.partitions = partitions;
            c.cluster.replication = n.min(3) as u32;
            adjust(&mut c);
            c.validate().expect("valid config");
            let path = dir.path().join(format!("node{}.toml", node.id));
            std::fs::write(&path, toml::to_string(&c).expect("encode config"))
                .expect("write config");
            configs.push(path);
        }
        let mut pc = ProcCluster {
            dir,
            configs,
            addrs: nodes.iter().map(|n| n.addr.clone()).collect(),
            children: Vec::new(),
        };
        for i in 0..n as usize {
            let child = pc.spawn(i);
            pc.children.push(Some(child));
        }
        pc
    }

    fn spawn(&self, i: usize) -> Child {
        let log = std::fs::File::create(self.dir.path().join(format!("node{}.log", i + 1)))
            .expect("log file");
        Command::new(env!("CARGO_BIN_EXE_talon-meta"))
            .arg("start")
            .arg("--config")
            .arg(&self.configs[i])
            .env("RUST_LOG", "warn,talon_meta::txn=info")
            // The node logs to its standard output.
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("spawn talon-meta")
    }

    /// SIGKILLs node `id` (1-based): a crash, no clean shutdown.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.children[(id - 1) as usize].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts node `id` again on its data directory.
    pub fn restart(&mut self, id: u64) {
        let child = self.spawn((id - 1) as usize);
        self.children[(id - 1) as usize] = Some(child);
    }

    /// The process id of node `id`, while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.children[(id - 1) as usize].as_ref().map(Child::id)
    }

    /// The node's log, for failure messages.
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("node{id}.log"))).unwrap_or_default()
    }
}

impl Drop for ProcCluster {
    fn drop(&mut self) {
        for c in self.children.iter_mut().filter_map(Option::take) {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The status of every partition on the node at `addr`, if it answers.
pub async fn partition_statuses(addr: &str) -> Option<Vec<talon_proto::v1::PartitionStatus>> {
    let mut c =
        talon_proto::v1::namespace_client::NamespaceClient::connect(format!("http://{addr}"))
            .await
            .ok()?;
    Some(
        c.status(talon_proto::v1::StatusRequest {})
            .await
            .ok()?
            .into_inner()
            .partitions,
    )
}

/// The node (1-based, in `addrs`' order) leading `partition` among those that answer, with
/// its term.
pub async fn leader_and_term(addrs: &[String], partition: u32) -> Option<(u64, u64)> {
    for (i, addr) in addrs.iter().enumerate() {
        if let Some(st) = partition_statuses(addr).await {
            if let Some(p) = st.iter().find(|p| p.id == partition && p.role == "LEADER") {
                return Some((i as u64 + 1, p.term));
            }
        }
    }
    None
}

/// The node (1-based, in `addrs`' order) leading `partition` among those that answer.
pub async fn leader_of(addrs: &[String], partition: u32) -> Option<u64> {
    leader_and_term(addrs, partition)
        .await
        .map(|(node, _)| node)
}

/// Raft timing for tests: quick elections, small snapshots where asked.
pub fn test_raft(snapshot_after: u64, keep: u64) -> RaftConfig {
    RaftConfig {
        heartbeat_ms: 100,
        election_timeout_min_ms: 500,
        election_timeout_max_ms: 1000,
        snapshot_after_entries: snapshot_after,
        snapshot_after_bytes: RaftConfig::default().snapshot_after_bytes,
        keep_entries_after_snapshot: keep,
        txn_recovery_after_ms: 2000,
    }
}

/// Polls `f` every 100 ms until it returns Some, or panics after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    talon_testkit::poll_until(limit, what, f)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The node leading `partition` once one is known and its read barrier succeeds, polled
/// for up to 60 s. Leadership can move at any instant (a spurious election on a loaded
/// machine), so a single look may find no leader, or one just deposed that refuses the
/// barrier; what the barrier confirms is that this node's state holds everything committed
/// before the call.
pub async fn settled_leader(cluster: &TestCluster, partition: u32) -> u64 {
    eventually(
        Duration::from_secs(60),
        &format!("a leader of partition {partition} that passes a read barrier"),
        || async move {
            let id = cluster.leader_of(partition).await?;
            let part = cluster.node(id)?.node.partitions.get(&partition)?.clone();
            tokio::time::timeout(Duration::from_secs(10), part.linearizable())
                .await
                .ok()?
                .ok()?;
            Some(id)
        },
    )
    .await
}
