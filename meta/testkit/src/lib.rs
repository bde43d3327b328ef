//! talon-testkit: Talon's test fixtures, a crate of their own so that the production
//! library (`talon-meta`) carries none of them, nor their dependencies. It uses only
//! `talon-meta`'s public API.
//!
//! An in-process cluster for tests: N real nodes in this process, each a gRPC server on
//! 127.0.0.1 with a port picked by the OS and its own temporary data directory. Nodes can
//! be stopped and restarted on the same port and data (a clean stop: every task and Raft
//! group shut down, storage closed), which is how tests take a node or a leader away.
//! Crash-style kills of whole processes are tested with the `talon-meta` binary instead.
//!
//! With [`TestClusterBuilder::lossy_front`], clients reach each node through a TCP relay
//! ([`LossyFront`]) that a test can tell to lose the next reply: the request reaches the
//! node and is carried out, the answer never reaches the client, and the connection
//! breaks — the "applied, but the client does not know" case of a real network.

use openraft::ServerState;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use talon_meta::config::{
    ClusterConfig, Config, NodeEntry, RaftConfig, SpaceConfig, StorageConfig,
};
use talon_meta::server::RunningNode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Builder of a `TestCluster`.
#[derive(Clone, Debug)]
pub struct TestClusterBuilder {
    nodes: u64,
    partitions: u32,
    replication: u32,
    strict_prefixes: Vec<String>,
    relaxed_staleness_ms: u64,
    small_file_max: u32,
    chunk_size: u32,
    chunk_gc_grace_ms: u64,
    unlinked_grace_ms: u64,
    gc_scan_records: u32,
    raft: RaftConfig,
    lossy_front: bool,
    txn_recovery_after_ms: u64,
    space: SpaceConfig,
    node_space: BTreeMap<u64, SpaceConfig>,
    data_dirs: BTreeMap<u64, std::path::PathBuf>,
}

impl TestClusterBuilder {
    /// Puts a [`LossyFront`] before every node and advertises its address in the cluster
    /// map, so clients (and peers) talk to the node through it.
    pub fn lossy_front(mut self, on: bool) -> Self {
        self.lossy_front = on;
        self
    }
    /// Space thresholds of every node. A test cluster's nodes share the machine's disk
    /// with everything else, so by default they never count it as full (both ratios 1.0,
    /// no reserve): how full the machine happens to be must not change a test's outcome.
    pub fn space(mut self, space: SpaceConfig) -> Self {
        self.space = space;
        self
    }
    /// Every node counts its disk as nearly full from the start, whatever its use (and
    /// never as full), so it reclaims deleted data as that mode does.
    pub fn nearly_full(self) -> Self {
        self.space(SpaceConfig {
            nearfull_ratio: 0.000_001,
            full_ratio: 1.0,
            reserve_bytes: 0,
        })
    }
    /// Space thresholds of node `id` alone (see [`TestClusterBuilder::space`]).
    pub fn node_space(mut self, id: u64, space: SpaceConfig) -> Self {
        self.node_space.insert(id, space);
        self
    }
    /// Puts node `id`'s data directory at `dir` (say, on a small file system the test
    /// mounted) instead of in the cluster's temporary directory.
    pub fn data_dir(mut self, id: u64, dir: std::path::PathBuf) -> Self {
        self.data_dirs.insert(id, dir);
        self
    }
    /// The number of nodes the cluster will have.
    pub fn node_count(&self) -> u64 {
        self.nodes
    }
    /// Number of nodes (ids 1..=n).
    pub fn nodes(mut self, n: u64) -> Self {
        self.nodes = n;
        self
    }
    /// Number of partitions.
    pub fn partitions(mut self, p: u32) -> Self {
        self.partitions = p;
        self
    }
    /// Replicas per partition.
    pub fn replication(mut self, r: u32) -> Self {
        self.replication = r;
        self
    }
    /// Strict path prefixes.
    pub fn strict_prefixes(mut self, p: Vec<String>) -> Self {
        self.strict_prefixes = p;
        self
    }
    /// Relaxed staleness bound.
    pub fn relaxed_staleness_ms(mut self, ms: u64) -> Self {
        self.relaxed_staleness_ms = ms;
        self
    }
    /// Small-file threshold and chunk size.
    pub fn file_sizes(mut self, small_file_max: u32, chunk_size: u32) -> Self {
        self.small_file_max = small_file_max;
        self.chunk_size = chunk_size;
        self
    }
    /// Grace period before unreferenced chunks are reclaimed.
    pub fn chunk_gc_grace_ms(mut self, ms: u64) -> Self {
        self.chunk_gc_grace_ms = ms;
        self
    }
    /// Records a garbage-collection round reads per partition (the chunk collector's page).
    pub fn gc_scan_records(mut self, n: u32) -> Self {
        self.gc_scan_records = n;
        self
    }
    /// How long an unlinked file stays readable by inode before it is reclaimed.
    pub fn unlinked_grace_ms(mut self, ms: u64) -> Self {
        self.unlinked_grace_ms = ms;
        self
    }
    /// Snapshot every `n` entries, keeping `keep` entries behind it.
    pub fn snapshots(mut self, n: u64, keep: u64) -> Self {
        self.raft.snapshot_after_entries = n;
        self.raft.keep_entries_after_snapshot = keep;
        self
    }
    /// Snapshot once the log holds `bytes` of entries since the last one (0: never by size).
    pub fn snapshot_after_bytes(mut self, bytes: u64) -> Self {
        self.raft.snapshot_after_bytes = bytes;
        self
    }
    /// Age of a prepared transaction intent after which recovery resolves it.
    pub fn txn_recovery_after_ms(mut self, ms: u64) -> Self {
        self.txn_recovery_after_ms = ms;
        self
    }

    /// Starts the cluster and waits until every partition has a leader.
    pub async fn start(self) -> anyhow::Result<TestCluster> {
        let root = tempfile::Builder::new().prefix("talon-test-").tempdir()?;
        let mut listeners = BTreeMap::new();
        for id in 1..=self.nodes {
            let l = TcpListener::bind("127.0.0.1:0").await?;
            listeners.insert(id, l);
        }
        let mut fronts = BTreeMap::new();
        let mut entries = Vec::new();
        for (id, l) in &listeners {
            let real = l.local_addr()?.to_string();
            let addr = if self.lossy_front {
                let front = LossyFront::start(real).await?;
                let addr = front.addr.clone();
                fronts.insert(*id, front);
                addr
            } else {
                real
            };
            entries.push(NodeEntry { id: *id, addr });
        }
        let mut configs = BTreeMap::new();
        let mut nodes = BTreeMap::new();
        for (id, listener) in listeners {
            let mut c = Config {
                node_id: id,
                listen: listener.local_addr()?.to_string(),
                data_dir: self
                    .data_dirs
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(|| root.path().join(format!("node{id}"))),
                space: self
                    .node_space
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(|| self.space.clone()),
                ..Config::default()
            };
            c.cluster.nodes = entries.clone();
            c.cluster.partitions = self.partitions;
            c.cluster.replication = self.replication;
            c.cluster.strict_prefixes = self.strict_prefixes.clone();
            c.cluster.relaxed_staleness_ms = self.relaxed_staleness_ms;
            c.cluster.small_file_max = self.small_file_max;
            c.cluster.chunk_size = self.chunk_size;
            c.cluster.chunk_gc_grace_ms = self.chunk_gc_grace_ms;
            c.cluster.unlinked_grace_ms = self.unlinked_grace_ms;
            c.storage.gc_scan_records = self.gc_scan_records;
            c.raft = self.raft.clone();
            c.raft.txn_recovery_after_ms = self.txn_recovery_after_ms;
            let running = RunningNode::start(c.clone(), listener).await?;
            configs.insert(id, c);
            nodes.insert(id, Some(running));
        }
        let cluster = TestCluster {
            nodes,
            configs,
            fronts,
            _root: root,
        };
        cluster.wait_for_leaders().await?;
        Ok(cluster)
    }
}

/// N nodes in this process.
pub struct TestCluster {
    nodes: BTreeMap<u64, Option<RunningNode>>,
    configs: BTreeMap<u64, Config>,
    fronts: BTreeMap<u64, LossyFront>,
    _root: tempfile::TempDir,
}

impl TestCluster {
    /// A builder with defaults: 3 nodes, 8 partitions, 3 replicas.
    pub fn builder() -> TestClusterBuilder {
        TestClusterBuilder {
            nodes: 3,
            partitions: 8,
            replication: 3,
            strict_prefixes: vec!["/checkpoints".into(), "/control".into()],
            relaxed_staleness_ms: 1000,
            small_file_max: 1 << 20,
            chunk_size: 4 << 20,
            chunk_gc_grace_ms: 10 * 60 * 1000,
            unlinked_grace_ms: ClusterConfig::default().unlinked_grace_ms,
            gc_scan_records: StorageConfig::default().gc_scan_records,
            raft: RaftConfig {
                heartbeat_ms: 100,
                election_timeout_min_ms: 500,
                election_timeout_max_ms: 1000,
                ..RaftConfig::default()
            },
            lossy_front: false,
            txn_recovery_after_ms: RaftConfig::default().txn_recovery_after_ms,
            space: SpaceConfig {
                nearfull_ratio: 1.0,
                full_ratio: 1.0,
                reserve_bytes: 0,
            },
            node_space: BTreeMap::new(),
            data_dirs: BTreeMap::new(),
        }
    }

    /// The address clients use for every node, running or not.
    pub fn addrs(&self) -> Vec<String> {
        self.configs
            .iter()
            .map(|(id, c)| match self.fronts.get(id) {
                Some(f) => f.addr.clone(),
                None => c.listen.clone(),
            })
            .collect()
    }

    /// The relay before node `id`, when the cluster was built with `lossy_front`.
    pub fn front(&self, id: u64) -> Option<&LossyFront> {
        self.fronts.get(&id)
    }

    /// The running node `id`.
    pub fn node(&self, id: u64) -> Option<&RunningNode> {
        self.nodes.get(&id).and_then(|n| n.as_ref())
    }

    /// Stops node `id` cleanly (its port and data are kept for a restart).
    pub async fn stop_node(&mut self, id: u64) {
        if let Some(n) = self.nodes.get_mut(&id).and_then(Option::take) {
            n.shutdown().await;
        }
    }

    /// Restarts a stopped node on its port and data directory.
    pub async fn restart_node(&mut self, id: u64) -> anyhow::Result<()> {
        let c = self
            .configs
            .get(&id)
            .ok_or_else(|| anyhow::anyhow!("no node {id}"))?
            .clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(&c.listen).await {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("rebind {}: {e}", c.listen);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        let running = RunningNode::start(c, listener).await?;
        self.nodes.insert(id, Some(running));
        Ok(())
    }

    /// The node that leads `partition`, if any running node claims it: of several, the one
    /// of the latest term. A deposed leader whose Raft core is stuck (its log waiting for
    /// disk room) still claims it, with the term it was deposed in.
    pub async fn leader_of(&self, partition: u32) -> Option<u64> {
        self.nodes
            .iter()
            .filter_map(|(id, n)| {
                let m = n.as_ref()?.node.partitions.get(&partition)?.raft.metrics();
                let m = m.borrow();
                (m.state == ServerState::Leader).then_some((m.current_term, *id))
            })
            .max()
            .map(|(_, id)| id)
    }

    /// Waits (up to 30 s) until every partition has a leader among the running nodes.
    pub async fn wait_for_leaders(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let partitions = self
            .configs
            .values()
            .next()
            .map(|c| c.cluster.partitions)
            .unwrap_or(0);
        loop {
            let mut missing = Vec::new();
            for p in 0..partitions {
                if self.leader_of(p).await.is_none() {
                    missing.push(p);
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("partitions without a leader after 30 s: {missing:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every node.
    pub async fn shutdown(mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            self.stop_node(id).await;
        }
    }
}

/// A TCP relay before a node that can lose replies on purpose (see the module docs).
pub struct LossyFront {
    /// The address clients connect to.
    pub addr: String,
    armed: Arc<AtomicU32>,
    lost: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

/// How long a connection whose reply is being lost keeps swallowing the node's bytes
/// before it is cut: long enough for the node to finish the request it is answering.
const LOSS_WINDOW: Duration = Duration::from_millis(300);

impl LossyFront {
    async fn start(target: String) -> std::io::Result<LossyFront> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let armed = Arc::new(AtomicU32::new(0));
        let lost = Arc::new(AtomicU32::new(0));
        let (a, l) = (armed.clone(), lost.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, a, l) = (target.clone(), a.clone(), l.clone());
                tokio::spawn(async move {
                    if let Ok(node) = TcpStream::connect(&target).await {
                        relay(client, node, a, l).await;
                    }
                });
            }
        });
        Ok(LossyFront {
            addr,
            armed,
            lost,
            task,
        })
    }

    /// Loses the next `n` replies: each time the node next sends bytes on any connection,
    /// they and everything after them on that connection for a short while are dropped,
    /// then the connection is cut.
    pub fn lose_next_replies(&self, n: u32) {
        self.armed.store(n, Ordering::SeqCst);
    }

    /// How many replies have been lost so far.
    pub fn lost(&self) -> u32 {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for LossyFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies bytes both ways until either side closes, losing a reply when armed.
async fn relay(client: TcpStream, node: TcpStream, armed: Arc<AtomicU32>, lost: Arc<AtomicU32>) {
    let _ = client.set_nodelay(true);
    let _ = node.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut nr, mut nw) = node.into_split();
    let upstream = async move {
        let _ = tokio::io::copy(&mut cr, &mut nw).await;
    };
    let downstream = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match nr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let take = armed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| a.checked_sub(1))
                .is_ok();
            if take {
                // Swallow what the node says for a while, then cut the connection.
                let _ = tokio::time::timeout(LOSS_WINDOW, async {
                    while let Ok(n) = nr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                })
                .await;
                lost.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever direction ends first ends the connection (dropping both halves).
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

/// A small tmpfs for tests of a full disk, mounted in a mount namespace of its own, which
/// a helper process holds: the host never sees the mount, and the kernel drops it when the
/// helper ends, which it does when this value is dropped or when the test process dies
/// (its stdin, a pipe from this process, then closes), so a killed test leaves no mount
/// behind. The test reaches the file system through the helper's `/proc/PID/root`; files
/// it holds open stay usable after the drop, as after a lazy unmount. Mounting needs root
/// and util-linux's `unshare`.
pub struct SmallFs {
    /// The file system's root, as this process reaches it.
    pub path: std::path::PathBuf,
    helper: std::process::Child,
    control: std::process::ChildStdin,
    answers: std::io::BufReader<std::process::ChildStdout>,
}

/// The helper: mounts the tmpfs over `/tmp` in its new private mount namespace, says so,
/// then remounts it at each size read from stdin until stdin closes.
const SMALL_FS_HELPER: &str = r#"
mount -t tmpfs -o "size=$1,mode=0755" tmpfs /tmp || exit 1
echo mounted
while read -r size; do
  if mount -o "remount,size=$size" /tmp; then echo ok; else echo failed; fi
done
"#;

impl SmallFs {
    /// Mounts a tmpfs of `bytes` bytes.
    pub fn mount(bytes: u64) -> anyhow::Result<SmallFs> {
        use std::process::{Command, Stdio};
        let mut helper = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(SMALL_FS_HELPER)
            .arg("sh")
            .arg(bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("start unshare (util-linux): {e}"))?;
        let (Some(control), Some(out)) = (helper.stdin.take(), helper.stdout.take()) else {
            anyhow::bail!("the small file system's helper has no pipes");
        };
        let mut fs = SmallFs {
            path: std::path::PathBuf::from(format!("/proc/{}/root/tmp", helper.id())),
            helper,
            control,
            answers: std::io::BufReader::new(out),
        };
        let said = fs.answer()?;
        if said != "mounted" {
            let mut why = String::new();
            if let Some(mut e) = fs.helper.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut why);
            }
            anyhow::bail!(
                "mount a tmpfs of {bytes} bytes: {} (mounting needs root)",
                why.trim()
            );
        }
        Ok(fs)
    }

    /// Grows (or shrinks) the file system to `bytes`, keeping its files.
    pub fn resize(&mut self, bytes: u64) -> anyhow::Result<()> {
        use std::io::Write;
        writeln!(self.control, "{bytes}")?;
        self.control.flush()?;
        match self.answer()?.as_str() {
            "ok" => Ok(()),
            other => anyhow::bail!("remount the tmpfs at {bytes} bytes: {other}"),
        }
    }

    /// The helper's next line, empty once it has ended.
    fn answer(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut self.answers, &mut line)?;
        Ok(line.trim().to_string())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        // The helper's end takes the namespace, and with it the mount.
        let _ = self.helper.kill();
        let _ = self.helper.wait();
    }
}

/// The chunks stored on all of `node`'s partitions (of any file, named by a layout or not).
pub fn chunk_count(node: &talon_meta::node::Node) -> usize {
    node.partitions
        .values()
        .map(|p| p.store.chunks(None, 1_000_000).expect("scan").len())
        .sum()
}

/// Deterministic bytes that differ between offsets and between seeds, and do not
/// compress (xorshift): test file contents that really take their size on disk.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Polls `f` every 100 ms until it returns Some; after `limit`, an error that names
/// `what`.
pub async fn poll_until<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::SmallFs;
    use std::time::{Duration, Instant};

    /// Set in the child process of `a_killed_owner_leaves_no_small_fs_behind`.
    const CHILD: &str = "TALON_TESTKIT_SMALL_FS_CHILD";

    fn size(fs: &SmallFs) -> u64 {
        let st = rustix::fs::statvfs(&fs.path).expect("statvfs the small file system");
        st.f_blocks * st.f_frsize
    }

    fn in_host_mount_table(bytes: u64) -> bool {
        let table = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
        let kib = format!("size={}k", bytes >> 10);
        table
            .lines()
            .any(|l| l.contains("tmpfs") && l.contains(&kib))
    }

    /// The tmpfs has the size asked for, and another after a resize with its files kept;
    /// this process's mount table never shows it; the helper ends with the value.
    #[test]
    fn a_small_fs_is_private_and_ends_with_its_value() {
        const BYTES: u64 = 7 << 20;
        let mut fs = SmallFs::mount(BYTES).expect("mount a small tmpfs");
        assert_eq!(size(&fs), BYTES);
        assert!(!in_host_mount_table(BYTES), "the host sees the tmpfs");
        std::fs::write(fs.path.join("f"), b"kept").expect("write a file");
        fs.resize(2 * BYTES).expect("grow it");
        assert_eq!(size(&fs), 2 * BYTES);
        assert_eq!(std::fs::read(fs.path.join("f")).expect("read"), b"kept");
        let path = fs.path.clone();
        drop(fs);
        assert!(
            std::fs::metadata(&path).is_err(),
            "{path:?} outlives its value"
        );
    }

    /// A test process killed with its small file system mounted leaves none behind: the
    /// helper sees its stdin close and ends, and the kernel drops the mount with it. The
    /// test runs itself again as the child that is killed.
    #[test]
    fn a_killed_owner_leaves_no_small_fs_behind() {
        if std::env::var_os(CHILD).is_some() {
            let fs = SmallFs::mount(5 << 20).expect("mount a small tmpfs");
            println!("helper at {}", fs.path.display());
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        let mut child = std::process::Command::new(std::env::current_exe().expect("own path"))
            .args([
                "--exact",
                "tests::a_killed_owner_leaves_no_small_fs_behind",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run the child");
        let out = child.stdout.take().expect("child's stdout");
        let path = std::io::BufRead::lines(std::io::BufReader::new(out))
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("helper at ").map(std::path::PathBuf::from))
            .expect("the child mounted a small file system");
        assert!(
            std::fs::metadata(&path).is_ok(),
            "{path:?} while the child lives"
        );
        child.kill().expect("kill the child");
        child.wait().expect("reap the child");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(&path).is_ok() {
            assert!(
                Instant::now() < deadline,
                "{path:?} outlived its killed owner"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
