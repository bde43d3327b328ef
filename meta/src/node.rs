//! A `talon-meta` node: opens its storage, starts a Raft group for every partition it
//! replicates, routes calls to other partitions' leaders (`Node::peer`) and answers theirs
//! (`Node::handle_peer`), and runs its own background loops (directory attribute updates,
//! the disk watch). Background loops of the layers above it are started by `server`
//! through [`Node::spawn`].
//!
//! It must not reach up: the namespace, rename, attribute, data and transaction operations
//! build on it as types of their own that borrow a node (`namespace::Namespace`,
//! `rename::Renames`, `attrs::Attrs`, `data::Files`, `txn::Txns`), each defined in its
//! module; they and the gRPC edge (`service`) use the node, never the other way round, and
//! `impl Node` lives here only. `server` starts and stops it. `Node::shutdown` fires the
//! node's cancellation token and waits for the background loops (whose last rounds may
//! still propose: the directory update flush does), then stops the partitions' proposal
//! and read queues, shuts every Raft group down and closes the log (its flusher
//! acknowledges everything queued first).

use crate::clock::DueSince;
use crate::config::{ClusterConfig, Config};
use crate::dir_touch::{DirTouches, Touch};
use crate::network::{NetFactory, PeerRpc, Peers};
use crate::partition::Partition;
use crate::raft_log::LogDb;
use crate::records::storage_error;
use crate::sm::{PartitionSm, SmStore};
use crate::space::{Level, Space};
use crate::types::{Command, CommandResult, NodeId, Op, Raft, TxId};
use openraft::BasicNode;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use talon_model::{Attr, Backoff, Class, FileKind, Ino, TalonError, Time};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a stopping node waits for openraft's tasks to let go of its stores.
const STORES_RELEASED: Duration = Duration::from_secs(10);

/// How long a node keeps retrying a call to another partition's leader.
pub const PEER_DEADLINE: Duration = Duration::from_secs(20);

/// A request from one node to the leader of a partition on another (or the same) node.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum PeerRequest {
    /// Propose a command on the partition (prepare, decide, finish, atomic).
    Propose(Command),
    /// Is `Ino` a live directory, and of which class? Asked of its home partition.
    DirInfo(Ino),
    /// The inode record, read linearizably and regardless of locks.
    ReadInode(Ino),
    /// A dentry, read linearizably and regardless of locks.
    ReadDentry(Ino, Vec<u8>),
    /// A file's inode and (small) body, read linearizably at its home.
    ReadFile(Ino),
    /// Directory `Ino`'s link count moved by `i32` and its times to at least `Time`, after
    /// a change to its entries on another partition (`Node::touch_parent`), at its home's
    /// leader; answered with its attributes after, as reads there show them.
    TouchDir(Ino, i32, Time),
    /// The leader's applied index after a ReadIndex, asked by a follower that serves
    /// relaxed reads (`Partition::answer_for_follower`); answered `Applied(None)` by a
    /// replica that does not lead.
    LeaderApplied,
    /// What keeps a file's chunks: its inode record and the open sessions held on it,
    /// read linearizably at its home (the chunk collector's question).
    ChunkHolder(Ino),
}

/// The answer to a `PeerRequest`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum PeerReply {
    /// Result of a proposal.
    Proposed(CommandResult),
    /// Class of a live directory.
    Dir(talon_model::Class),
    /// An inode record, if it exists.
    Inode(Option<crate::records::InodeRec>),
    /// A dentry, if it exists.
    Dentry(Option<crate::records::Dentry>),
    /// A file, if it exists.
    File(Option<crate::reads::OpenFile>),
    /// A directory's attributes after a `TouchDir`, if known.
    DirAttr(Option<Attr>),
    /// The answer to `LeaderApplied`.
    Applied(Option<u64>),
    /// The answer to `ChunkHolder`: the inode, if it exists, and its open sessions
    /// (session, held until in ms).
    ChunkHolder(Option<crate::records::InodeRec>, Vec<(u64, u64)>),
}

/// A node and everything it hosts.
pub struct Node {
    /// The validated configuration.
    pub config: Config,
    /// Channels to the other nodes.
    pub peers: Arc<Peers>,
    /// Partition replicas hosted here.
    pub partitions: HashMap<u32, Arc<Partition>>,
    /// Fullness of the data file system, and the reserve.
    pub space: Arc<Space>,
    log: Arc<LogDb>,
    /// The stores' RocksDB settings; compactions pause while the disk is full.
    tuning: crate::tuning::Tuning,
    /// Fired first when the node stops: background loops and waiting calls give up.
    cancel: CancellationToken,
    /// The background loops (`Node::spawn`).
    loops: TaskTracker,
    /// Fired once the loops have ended: the partitions' proposal and read queues stop.
    queues_cancel: CancellationToken,
    /// The partitions' queues.
    queues: TaskTracker,
    leader_hints: Mutex<HashMap<u32, NodeId>>,
    /// Partitions whose Raft group stopped on a storage error, once logged.
    failed: Mutex<std::collections::BTreeSet<u32>>,
    /// Directory attribute updates waiting for the next flush (`dir_touch`).
    dir_touches: DirTouches,
    /// Request records found due (see `data::Files::collect_requests`).
    pub(crate) requests_due: DueSince<u64>,
    /// Prepared transactions found (see `txn::Txns::recover_stale`).
    pub(crate) txns_due: DueSince<TxId>,
    /// Unreferenced chunks (inode, write id, index) found (see
    /// `data::Files::collect_chunks`).
    pub(crate) chunks_due: DueSince<(Ino, u64, u32)>,
    /// Chunks taken out of a layout (inode, write id, index) found due (see
    /// `data::Files::collect_dropped`).
    pub(crate) dropped_due: DueSince<(Ino, u64, u32)>,
    /// Unlinked files found (see `data::Files::collect_unlinked`).
    pub(crate) unlinked_due: DueSince<Ino>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({})", self.config.node_id)
    }
}

/// Errors starting a node.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Storage could not be opened.
    #[error("open storage: {0}")]
    Storage(String),
    /// Raft could not start.
    #[error("start raft group {0}: {1}")]
    Raft(u32, String),
    /// The listener failed.
    #[error("listen: {0}")]
    Listen(String),
    /// The config's cluster layout differs from the one this data was initialised with.
    #[error("cluster layout differs from the one stored at init: {0}")]
    ClusterMismatch(String),
}

fn raft_config(c: &Config) -> Result<Arc<openraft::Config>, String> {
    let r = &c.raft;
    let rc = openraft::Config {
        cluster_name: "talon".into(),
        heartbeat_interval: r.heartbeat_ms,
        election_timeout_min: r.election_timeout_min_ms,
        election_timeout_max: r.election_timeout_max_ms,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(r.snapshot_after_entries),
        max_in_snapshot_log_to_keep: r.keep_entries_after_snapshot,
        install_snapshot_timeout: 10_000,
        // Entries may carry up to ~8 MiB of file data: keep each AppendEntries small (the
        // network also cuts one to a byte budget and lets it outlast openraft's wait).
        max_payload_entries: 4,
        ..Default::default()
    };
    rc.validate().map(Arc::new).map_err(|e| e.to_string())
}

impl Node {
    /// Opens storage and starts every hosted partition's Raft group.
    pub async fn open(config: Config) -> Result<Arc<Node>, StartError> {
        config.validate()?;
        let me = config.node_id;
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| StartError::Storage(format!("create data dir: {e}")))?;
        // Releases the reserve first: on a full disk, that is the room the stores open in.
        let space = Arc::new(
            Space::open(&config.data_dir, config.space.clone())
                .map_err(|e| StartError::Storage(format!("data dir space: {e}")))?,
        );
        let reserve = crate::space::reserve_size(&config.space, space.reading().fs.total);
        let tuning = crate::tuning::Tuning::with_budget(crate::tuning::Tuning::budget_for(
            config.storage.write_buffer_bytes,
            reserve,
        ))
        .with_cache(config.storage.cache_bytes);
        // A node that starts on a full disk opens its stores without compactions, which
        // would take the room the reserve just gave back (see `Tuning::pause_compactions`).
        tuning.pause_compactions(space.full_since().is_some());
        let cancel = CancellationToken::new();
        let gate = crate::space::Gate {
            space: space.clone(),
            cancel: cancel.clone(),
        };
        let log = LogDb::open_gated(
            &config.data_dir.join("raft-log"),
            Some(gate.clone()),
            &tuning,
        )
        .map_err(|e| StartError::Storage(format!("open raft log: {e}")))?;
        let peers = Peers::new(
            config
                .cluster
                .nodes
                .iter()
                .map(|n| (n.id, n.addr.clone()))
                .collect(),
        );
        let rc = raft_config(&config).map_err(|e| StartError::Raft(0, e))?;
        let queues = TaskTracker::new();
        let queues_cancel = CancellationToken::new();
        let cluster_map = serde_json::to_vec(&config.cluster)
            .map_err(|e| StartError::Storage(format!("encode cluster map: {e}")))?;
        let mut stores = Vec::new();
        for p in 0..config.cluster.partitions {
            if !config.replicas(p).contains(&me) {
                continue;
            }
            let store = SmStore::open_tuned(
                &config.data_dir.join("sm").join(p.to_string()),
                p,
                &cluster_map,
                tuning.clone(),
            )
            .map_err(|e| StartError::Storage(format!("partition {p}: {e}")))?;
            if p == 0 {
                check_cluster_map(&store, &config.cluster)?;
            }
            store.watch_space(gate.clone());
            stores.push((p, store));
        }
        // Every store is open (the log's WAL replayed and flushed): the restart share goes
        // back in place before any Raft group can write, so that a node that stops again
        // finds it.
        if let Err(e) = Space::off_runtime(&space, Space::hold_restart_share).await {
            tracing::warn!(node = me, "hold the space reserve's restart share: {e}");
        }
        let mut partitions = HashMap::new();
        for (p, store) in stores {
            let raft = Raft::new(
                me,
                rc.clone(),
                NetFactory {
                    partition: p,
                    peers: peers.clone(),
                    me,
                    confirmed_for: Duration::from_millis(rc.heartbeat_interval / 2),
                },
                log.group_behind(p, store.snapshot_mark()),
                PartitionSm::new(store.clone()),
            )
            .await
            .map_err(|e| StartError::Raft(p, e.to_string()))?;
            let part = Partition::start(
                p,
                raft,
                store,
                peers.clone(),
                config.cluster.max_proposal_batch as usize,
                queues_cancel.child_token(),
                &queues,
            );
            partitions.insert(p, part);
        }
        let node = Arc::new(Node {
            config,
            peers,
            partitions,
            space,
            log,
            tuning,
            cancel,
            loops: TaskTracker::new(),
            queues_cancel,
            queues,
            leader_hints: Mutex::new(HashMap::new()),
            failed: Mutex::new(Default::default()),
            dir_touches: DirTouches::default(),
            requests_due: DueSince::default(),
            txns_due: DueSince::default(),
            chunks_due: DueSince::default(),
            dropped_due: DueSince::default(),
            unlinked_due: DueSince::default(),
        });
        node.initialize_groups().await?;
        node.spawn(dir_touch_loop);
        node.spawn(space_loop);
        node.spawn(leader_answer_loop);
        node.spawn(snapshot_size_loop);
        Ok(node)
    }

    /// The bound on the staleness of relaxed reads (`[cluster] relaxed_staleness_ms`).
    pub fn staleness_bound(&self) -> Duration {
        Duration::from_millis(self.config.cluster.relaxed_staleness_ms)
    }

    /// Runs a background loop of this node until shutdown: `task` gets the node and a
    /// token cancelled when the node stops, and `shutdown` waits for it.
    pub fn spawn<F, Fut>(self: &Arc<Self>, task: F)
    where
        F: FnOnce(Arc<Node>, CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.loops
            .spawn(task(self.clone(), self.cancel.child_token()));
    }

    /// Initializes the groups this node is the preferred leader of, on first start.
    async fn initialize_groups(&self) -> Result<(), StartError> {
        for (p, part) in &self.partitions {
            let replicas = self.config.replicas(*p);
            if self.config.preferred_leader(*p) != self.config.node_id {
                continue;
            }
            let initialized = part
                .raft
                .is_initialized()
                .await
                .map_err(|e| StartError::Raft(*p, e.to_string()))?;
            if initialized {
                continue;
            }
            let members: BTreeMap<NodeId, BasicNode> = replicas
                .iter()
                .map(|id| {
                    (
                        *id,
                        BasicNode::new(self.peers.addr(*id).unwrap_or_default()),
                    )
                })
                .collect();
            if let Err(e) = part.raft.initialize(members).await {
                // Already initialized by an earlier run that crashed mid-way: not an error.
                tracing::info!(partition = p, "initialize: {e}");
            }
        }
        Ok(())
    }

    /// The hosted replica of `p`, or WrongPartition.
    pub fn local(&self, p: u32) -> Result<&Arc<Partition>, TalonError> {
        self.partitions.get(&p).ok_or_else(|| {
            if p >= self.config.cluster.partitions {
                TalonError::Invalid(format!(
                    "partition {p} does not exist (cluster has {})",
                    self.config.cluster.partitions
                ))
            } else {
                TalonError::WrongPartition(format!(
                    "node {} does not host partition {p}",
                    self.config.node_id
                ))
            }
        })
    }

    /// How many partitions the cluster has (hosted here or not).
    pub(crate) fn partitions_count(&self) -> u32 {
        self.config.cluster.partitions
    }

    /// The hosted replica of `ino`'s home partition `p`, or WrongPartition if `p` is not it.
    pub(crate) fn home_part(&self, p: u32, ino: Ino) -> Result<&Partition, TalonError> {
        if ino.home() != p {
            return Err(TalonError::WrongPartition(format!(
                "inode {ino} lives on partition {}",
                ino.home()
            )));
        }
        Ok(self.local(p)?.as_ref())
    }

    /// Group-commit counters of the node's Raft log: (appends, fsyncs).
    pub fn log_stats(&self) -> (u64, u64) {
        self.log.stats()
    }

    /// Where the node's memory goes: its stores' memtables and table readers, the shared
    /// cache and the process's resident memory.
    pub fn memory(&self) -> crate::tuning::Memory {
        let stores: Vec<Arc<rocksdb::DB>> =
            self.partitions.values().map(|p| p.store.db()).collect();
        let mut dbs: Vec<&rocksdb::DB> = stores.iter().map(|d| d.as_ref()).collect();
        dbs.push(self.log.store());
        self.tuning.memory(&dbs)
    }

    /// The cancellation token of the node.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Stops background tasks and Raft groups and closes storage.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.loops.close();
        self.loops.wait().await;
        self.queues_cancel.cancel();
        self.queues.close();
        self.queues.wait().await;
        for part in self.partitions.values() {
            let _ = part.raft.shutdown().await;
        }
        self.log.close();
        // openraft's replication and state machine tasks end just after `shutdown` returns,
        // and hold the stores until they do: wait for them (bounded), so the directory can
        // be opened again at once (RocksDB refuses a second open while one is alive).
        let deadline = Instant::now() + STORES_RELEASED;
        let held = || {
            Arc::strong_count(&self.log) > 1
                || self
                    .partitions
                    .values()
                    .any(|p| Arc::strong_count(&p.store) > 1)
        };
        while held() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if held() {
            tracing::warn!("storage still held {STORES_RELEASED:?} after shutdown");
        }
    }

    fn hint(&self, p: u32) -> Option<NodeId> {
        if let Some(part) = self.partitions.get(&p) {
            if let Some(l) = part.leader() {
                return Some(l);
            }
        }
        self.leader_hints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&p)
            .copied()
    }

    fn set_hint(&self, p: u32, id: Option<NodeId>) {
        let mut g = self.leader_hints.lock().unwrap_or_else(|e| e.into_inner());
        match id {
            Some(id) => g.insert(p, id),
            None => g.remove(&p),
        };
    }

    /// Sends a request to the leader of partition `p`, wherever it is, following
    /// NotLeader redirects and trying replicas in turn until `PEER_DEADLINE` or the node's
    /// stop (once at least).
    pub async fn peer(&self, p: u32, req: PeerRequest) -> Result<PeerReply, TalonError> {
        if p >= self.config.cluster.partitions {
            return Err(TalonError::Invalid(format!("partition {p} does not exist")));
        }
        let replicas = self.config.replicas(p);
        let deadline = Instant::now() + PEER_DEADLINE;
        let mut attempt = 0usize;
        let mut backoff = Backoff::rpc();
        // At least one attempt, also on a stopping node: its last flush of queued
        // directory updates runs after the cancel and before its Raft groups stop.
        let give_up = || Instant::now() >= deadline || self.cancel.is_cancelled();
        loop {
            let target = self.hint(p).unwrap_or(replicas[attempt % replicas.len()]);
            attempt += 1;
            let res = if target == self.config.node_id {
                self.handle_peer(p, req.clone()).await
            } else {
                match self
                    .peers
                    .call::<PeerRequest, PeerReply>(
                        target,
                        PeerRpc::Peer,
                        p,
                        &req,
                        Duration::from_secs(10),
                    )
                    .await
                {
                    Ok(Ok(r)) => Ok(r),
                    Ok(Err(bytes)) => Err(decode_error(&bytes)),
                    Err(e) => Err(TalonError::Unavailable(e.to_string())),
                }
            };
            let err = match res {
                Ok(r) => return Ok(r),
                Err(TalonError::NotLeader { leader_id, .. }) => {
                    let changed = leader_id.is_some() && leader_id != Some(target);
                    self.set_hint(p, leader_id.filter(|l| *l != target));
                    if changed && !give_up() {
                        continue;
                    }
                    TalonError::Unavailable(format!("partition {p}: leader unknown"))
                }
                Err(e @ (TalonError::Unavailable(_) | TalonError::WrongPartition(_))) => {
                    self.set_hint(p, None);
                    e
                }
                Err(e) => return Err(e),
            };
            if give_up() {
                return Err(err);
            }
            tokio::time::sleep(backoff.pause()).await;
        }
    }

    /// Proposes `cmd` on the leader of partition `p`.
    pub async fn propose_on(&self, p: u32, cmd: Command) -> Result<CommandResult, TalonError> {
        match self.peer(p, PeerRequest::Propose(cmd)).await? {
            PeerReply::Proposed(r) => Ok(r),
            other => Err(TalonError::Unavailable(format!(
                "unexpected peer reply {other:?}"
            ))),
        }
    }

    /// Serves a peer request for a partition hosted here (must be its leader).
    pub async fn handle_peer(&self, p: u32, req: PeerRequest) -> Result<PeerReply, TalonError> {
        let part = self.local(p)?;
        match req {
            PeerRequest::Propose(cmd) => Ok(PeerReply::Proposed(part.propose(cmd).await?)),
            PeerRequest::DirInfo(dir) => {
                part.linearizable().await?;
                Ok(PeerReply::Dir(crate::reads::dir_class(&part.store, dir)?))
            }
            PeerRequest::ReadInode(ino) => {
                part.linearizable().await?;
                Ok(PeerReply::Inode(
                    part.store.read(|v| v.inode(ino)).map_err(storage_error)?,
                ))
            }
            PeerRequest::ChunkHolder(ino) => {
                part.linearizable().await?;
                let (rec, holds) = part
                    .store
                    .read(|v| Ok((v.inode(ino)?, v.open_holds(ino)?)))
                    .map_err(storage_error)?;
                Ok(PeerReply::ChunkHolder(rec, holds))
            }
            PeerRequest::ReadFile(ino) => {
                part.linearizable().await?;
                Ok(PeerReply::File(
                    crate::reads::read_stored_unblocking(&part.store, ino, true).await?,
                ))
            }
            PeerRequest::ReadDentry(parent, name) => {
                part.linearizable().await?;
                Ok(PeerReply::Dentry(
                    part.store
                        .read(|v| v.dentry(parent, &name))
                        .map_err(storage_error)?,
                ))
            }
            PeerRequest::LeaderApplied => Ok(PeerReply::Applied(part.answer_for_follower().await)),
            PeerRequest::TouchDir(dir, nlink, now) => {
                if dir.home() != p {
                    return Err(TalonError::Invalid(format!(
                        "directory {dir} does not live on partition {p}"
                    )));
                }
                Ok(PeerReply::DirAttr(
                    self.touch_here(part, dir, nlink, now).await?,
                ))
            }
        }
    }

    /// Whether partition `p`'s leader, this node, may take new entries or `incoming` bytes
    /// of data. While its
    /// disk is full: ENOSPC, or at first, where another replica can take over the
    /// leadership (`space_round` hands it on), `Retry`, so the client asks again and finds
    /// the new leader.
    pub fn room_for(&self, p: u32, incoming: usize) -> Result<(), TalonError> {
        // A replica that does not lead the partition sends the client on (NotLeader); the
        // leader's disk is the one that takes the write first.
        let me = self.config.node_id;
        if self.partitions.get(&p).and_then(|part| part.leader()) != Some(me) {
            return Ok(());
        }
        let Err(e) = self.space.check_room(me, p, incoming as u64) else {
            return Ok(());
        };
        if self.handing_over(p) {
            return Err(TalonError::Retry(format!(
                "{e}; handing partition {p} to a replica with room"
            )));
        }
        Err(e)
    }

    /// Whether this node, full, is handing partition `p` to another replica: `p` has
    /// others, and the disk has been full for less than the window a hand-over takes (the
    /// followers' lease, an election timeout, and an election or two). After it, if no
    /// replica with room took over (all are full), this one leads again, answering ENOSPC.
    fn handing_over(&self, p: u32) -> bool {
        let window = Duration::from_millis(self.config.raft.election_timeout_max_ms * 6);
        self.config.replicas(p).len() > 1
            && self
                .space
                .full_since()
                .is_some_and(|t| t.elapsed() < window)
    }

    /// One look at the data file system, and what the node does about it: say so when the
    /// level changes (past nearfull, `data::gc_loop` reclaims unlinked files and deleted
    /// bodies at once); while full, release the reserve but its restart share
    /// (`Space::keep_restart_share`) and hand the leadership of every replicated partition
    /// to a replica with room (`Partition::hand_over`), for a window of a few election
    /// timeouts; below nearfull, hold the whole reserve again.
    pub async fn space_round(&self) {
        let me = self.config.node_id;
        let r = match self.space.refresh() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(node = me, "statvfs of the data directory: {e}");
                return;
            }
        };
        let cfg = self.space.config();
        let before = self.space.announce(r.level);
        if r.level != before {
            let used = format!("{:.1}%", r.used * 100.0);
            if r.level > before {
                tracing::warn!(
                    node = me,
                    level = r.level.name(),
                    used,
                    nearfull_ratio = cfg.nearfull_ratio,
                    full_ratio = cfg.full_ratio,
                    "data file system filling up"
                );
            } else {
                tracing::info!(
                    node = me,
                    level = r.level.name(),
                    used,
                    "data file system has room again"
                );
            }
        }
        let full = self.space.full_since().is_some();
        // RocksDB's compactions wait while the log is at its floor, until there is as much
        // room again above it (a compaction that resumed at once would take it again);
        // otherwise they run, so that deleted bodies are reclaimed and a full node can
        // leave that level. (A start-up on a full disk opens its stores with them paused;
        // the first round here decides again.)
        let critical = crate::space::Floors::of(cfg, r.fs.total).critical;
        let resume_at = if self.tuning.compactions_paused() {
            2 * critical
        } else {
            critical
        };
        let pause = r.fs.avail < resume_at;
        if self.tuning.pause_compactions(pause) {
            self.set_compactions(pause);
        }
        if full || r.level == Level::Ok {
            let size = if full {
                Space::keep_restart_share
            } else {
                Space::hold_reserve
            };
            if let Err(e) = Space::off_runtime(&self.space, size).await {
                tracing::warn!(node = me, full, "size the space reserve: {e}");
            }
        }
        for (p, part) in &self.partitions {
            if let Some(why) = part.failure() {
                let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
                if failed.insert(*p) {
                    tracing::error!(
                        node = me,
                        partition = p,
                        "partition stopped on a storage error, the node serves its others; \
                         restart the node once the cause is gone: {why}"
                    );
                }
                continue;
            }
            part.hand_over(self.handing_over(*p));
        }
    }

    /// Turns RocksDB's automatic compactions of every store here off (`paused`: the disk
    /// is all but full) or on again (see `Tuning::pause_compactions`).
    fn set_compactions(&self, paused: bool) {
        let me = self.config.node_id;
        if paused {
            tracing::warn!(
                node = me,
                "disk all but full: RocksDB's own compactions paused"
            );
        } else {
            tracing::info!(node = me, "RocksDB's own compactions resumed");
        }
        if let Err(e) = self.log.set_compactions(paused) {
            tracing::warn!(node = me, paused, "compactions of the Raft log: {e}");
        }
        for (p, part) in &self.partitions {
            if let Err(e) = part.store.set_compactions(paused) {
                tracing::warn!(node = me, partition = p, paused, "compactions: {e}");
            }
        }
    }

    /// Updates directory `dir`'s link count and mtime after a change to its entries made
    /// on another partition than its home, before the change is answered: the client that
    /// made the change then sees the directory's new attributes at once (session
    /// consistency: its reads of the directory go to the home's leader for the session
    /// window; in a relaxed directory other clients may see them late, within the
    /// staleness bound). The home's leader does it (`PeerRequest::TouchDir`, answered here
    /// when that is this node): a file entry's change in a relaxed directory is queued
    /// there (see `dir_touch`: reads there show it at once, the flush proposes it within
    /// 50 ms), so a create costs one commit, not two, whichever node serves it; anything
    /// else is proposed. An update the home's leader did not take (a leader change, a node
    /// out of reach) is queued here, and this node's flush proposes it.
    ///
    /// Returns the directory's attributes after the update, as reads at its home's leader
    /// show them (see [`Node::dir_attr_here`]), so the change's answer can carry them; None
    /// when the update was queued here.
    pub async fn touch_parent(&self, dir: Ino, nlink: i32, now: Time) -> Option<Attr> {
        let asked = self
            .peer(dir.home(), PeerRequest::TouchDir(dir, nlink, now))
            .await;
        match asked {
            Ok(PeerReply::DirAttr(attr)) => attr,
            other => {
                tracing::debug!(%dir, "directory update queued instead: {other:?}");
                self.dir_touches.add(dir, nlink, now);
                None
            }
        }
    }

    /// [`Node::touch_parent`] at `dir`'s home `part`, which this node leads (else
    /// `NotLeader`, and the asker tries the leader): a file entry's change in a relaxed
    /// directory is queued here, anything else proposed.
    async fn touch_here(
        &self,
        part: &Partition,
        dir: Ino,
        nlink: i32,
        now: Time,
    ) -> Result<Option<Attr>, TalonError> {
        if nlink == 0 && self.leads_relaxed_dir(dir) {
            self.dir_touches.add(dir, 0, now);
            return Ok(self.dir_attr_here(dir, None));
        }
        let cmd = Command::Atomic(vec![Op::TouchDir { dir, nlink, now }]);
        match part.propose(cmd).await? {
            CommandResult::Applied(o) => Ok(self.dir_attr_here(dir, o.attr(dir))),
            _ => Ok(None),
        }
    }

    /// Directory `dir`'s attributes as a read here answers them, with the updates queued
    /// here: `applied` (what a proposal on its home just returned) or, without it, what
    /// its home's store holds. None unless this node leads `dir`'s home: another node's
    /// queue may hold updates this one cannot see.
    pub fn dir_attr_here(&self, dir: Ino, applied: Option<&Attr>) -> Option<Attr> {
        let part = self.local(dir.home()).ok()?;
        if part.leader() != Some(self.config.node_id) {
            return None;
        }
        let attr = match applied {
            Some(a) => a.clone(),
            None => part.store.read(|v| v.inode(dir)).ok()??.attr,
        };
        Some(self.with_queued_touches(attr))
    }

    /// True if this node leads `dir`'s home partition and `dir` is a relaxed directory
    /// there: the reads that must see an update queued for it are served here.
    fn leads_relaxed_dir(&self, dir: Ino) -> bool {
        let Ok(part) = self.local(dir.home()) else {
            return false;
        };
        part.leader() == Some(self.config.node_id)
            && matches!(
                crate::reads::dir_class(&part.store, dir),
                Ok(Class::Relaxed)
            )
    }

    /// `a` with the directory updates queued here applied (see `dir_touch`); every
    /// directory attribute this node answers passes through it.
    pub fn with_queued_touches(&self, mut a: Attr) -> Attr {
        if a.kind == FileKind::Directory {
            self.dir_touches.overlay(&mut a);
        }
        a
    }

    /// Proposes what is queued for `dir` now, before a change that does not commute with
    /// it (a setattr that sets its times). A failure is returned: the change must not go
    /// ahead of the update.
    pub async fn flush_touch(&self, dir: Ino) -> Result<(), TalonError> {
        let Some(t) = self.dir_touches.take(dir) else {
            return Ok(());
        };
        let _landing = self.dir_touches.landing(vec![dir]);
        let cmd = Command::Atomic(vec![touch_op(dir, t)]);
        if let Err(e) = self.propose_on(dir.home(), cmd).await {
            self.dir_touches.add(dir, t.nlink, t.now);
            return Err(e);
        }
        Ok(())
    }

    async fn flush_dir_touches(&self) {
        let pending = self.dir_touches.take_all();
        if pending.is_empty() {
            return;
        }
        let mut by_home: BTreeMap<u32, Vec<(Ino, Touch)>> = BTreeMap::new();
        for (dir, t) in pending {
            by_home.entry(dir.home()).or_default().push((dir, t));
        }
        let futs = by_home.into_iter().map(|(p, touches)| async move {
            let _landing = self
                .dir_touches
                .landing(touches.iter().map(|(d, _)| *d).collect());
            let ops = touches.into_iter().map(|(d, t)| touch_op(d, t)).collect();
            if let Err(e) = self.propose_on(p, Command::Atomic(ops)).await {
                tracing::warn!(partition = p, "directory attribute update lost: {e}");
            }
        });
        futures::future::join_all(futs).await;
    }
}

/// The proposal of directory `dir`'s queued update `t`.
fn touch_op(dir: Ino, t: Touch) -> Op {
    Op::TouchDir {
        dir,
        nlink: t.nlink,
        now: t.now,
    }
}

/// Refuses to start a node whose `[cluster]` table disagrees with the map stored in
/// partition 0 at init on the layout (nodes, partitions, replication): placement depends on
/// it, so data would silently become unreachable.
fn check_cluster_map(store: &SmStore, cluster: &ClusterConfig) -> Result<(), StartError> {
    let stored = store
        .read(|v| v.get(crate::keys::meta::CLUSTER_MAP))
        .map_err(|e| StartError::Storage(format!("read cluster map: {e}")))?;
    let Some(bytes) = stored.filter(|b| !b.is_empty()) else {
        return Ok(());
    };
    let stored: ClusterConfig = serde_json::from_slice(&bytes)
        .map_err(|e| StartError::Storage(format!("decode stored cluster map: {e}")))?;
    if stored.nodes != cluster.nodes
        || stored.partitions != cluster.partitions
        || stored.replication != cluster.replication
    {
        return Err(StartError::ClusterMismatch(format!(
            "stored: {} nodes, {} partitions, replication {}; config: {} nodes, {} partitions, replication {}",
            stored.nodes.len(),
            stored.partitions,
            stored.replication,
            cluster.nodes.len(),
            cluster.partitions,
            cluster.replication
        )));
    }
    Ok(())
}

/// Decodes an error carried in a peer reply (an encoded ErrorDetail).
pub fn decode_error(bytes: &[u8]) -> TalonError {
    use prost::Message;
    match talon_proto::v1::ErrorDetail::decode(bytes) {
        Ok(d) => TalonError::from_detail(d),
        Err(e) => TalonError::Unavailable(format!("undecodable peer error: {e}")),
    }
}

async fn dir_touch_loop(node: Arc<Node>, cancel: CancellationToken) {
    // Abandoned at shutdown; the final flush below redoes it.
    every(Duration::from_millis(50), &cancel, || {
        node.flush_dir_touches()
    })
    .await;
    // One last, bounded try: a node stopping after its peers has no quorum left, and its
    // Raft write would wait forever. What does not land is lost (a relaxed directory's
    // mtime/nlink may stay stale, never its entries).
    if tokio::time::timeout(FINAL_TOUCH_FLUSH, node.flush_dir_touches())
        .await
        .is_err()
    {
        tracing::warn!("directory attribute updates dropped at shutdown: no quorum in time");
    }
}

/// Builds a partition's snapshot once its log holds `[raft] snapshot_after_bytes` since the
/// stored one (see `SnapshotMark::is_due`), beside openraft's own policy by entries: the
/// log keeps file bodies until a snapshot, and 20,000 entries of images are gigabytes per
/// partition. One build at a time per partition: the next check waits for it to be stored.
/// A build that stores nothing (a disk without room keeps the stored snapshot) is asked
/// again after 5 s, then at most every minute. Stops on `cancel`.
async fn snapshot_size_loop(node: Arc<Node>, cancel: CancellationToken) {
    let limit = node.config.raft.snapshot_after_bytes;
    if limit == 0 {
        return;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for part in node.partitions.values() {
        let mark = part.store.snapshot_mark();
        mark.snapshot_after_bytes(limit);
        let (raft, id, cancel) = (part.raft.clone(), part.id, cancel.clone());
        tasks.spawn(async move {
            let mut wait = SNAPSHOT_RETRY_MIN;
            loop {
                if !mark.is_due() {
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = mark.due() => continue,
                    }
                }
                let mut stored = mark.watch();
                if let Err(e) = raft.trigger().snapshot().await {
                    tracing::warn!(partition = id, "a snapshot by log size: {e}");
                }
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    r = tokio::time::timeout(wait, stored.changed()) => {
                        wait = match r {
                            Ok(_) => SNAPSHOT_RETRY_MIN,
                            Err(_) => (wait * 2).min(SNAPSHOT_RETRY_MAX),
                        };
                    }
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// Longest wait for a snapshot asked for by log size before it is asked again, at first
/// and at most (doubling between).
const SNAPSHOT_RETRY_MIN: Duration = Duration::from_secs(5);
const SNAPSHOT_RETRY_MAX: Duration = Duration::from_secs(60);

/// Asks the leader of every partition that this node follows and was read relaxed from
/// lately (`Partition::wants_leader_answers`, within two bounds) for its applied index,
/// every quarter of the staleness bound, so that the replica may serve relaxed reads for a
/// bound after each question answered (`Partition::relaxed_ok`); stops on `cancel`. A
/// question is given up after a quarter bound: a lost one leaves the last answer standing.
async fn leader_answer_loop(node: Arc<Node>, cancel: CancellationToken) {
    let bound = node.staleness_bound();
    let period = (bound / 4).max(Duration::from_millis(10));
    every(period, &cancel, || node.ask_leaders(period, bound * 2)).await;
}

impl Node {
    /// One round of [`leader_answer_loop`]: a question for every partition read relaxed
    /// within `read_within`, all at once, each given up after `within`.
    async fn ask_leaders(&self, within: Duration, read_within: Duration) {
        let asks = self.partitions.iter().filter_map(|(&p, part)| {
            if !part.wants_leader_answers(read_within) {
                return None;
            }
            let leader = part.leader().filter(|&l| l != self.config.node_id)?;
            Some(async move {
                let asked = Instant::now();
                let answer = self
                    .peers
                    .call::<PeerRequest, PeerReply>(
                        leader,
                        PeerRpc::Peer,
                        p,
                        &PeerRequest::LeaderApplied,
                        within,
                    )
                    .await;
                if let Ok(Ok(PeerReply::Applied(Some(applied)))) = answer {
                    part.note_leader_answer(asked, applied);
                }
            })
        });
        futures::future::join_all(asks).await;
    }
}

/// Watches the data file system every half second; stops on `cancel`.
async fn space_loop(node: Arc<Node>, cancel: CancellationToken) {
    every(Duration::from_millis(500), &cancel, || node.space_round()).await;
}

/// Runs `round` every `period` until `cancel` fires. A round in progress is abandoned then:
/// a node that stops after its peers has no quorum left, and a proposal would never end
/// (nor `Node::shutdown`, which waits for the background tasks); the next start redoes it.
pub async fn every<F, Fut>(period: Duration, cancel: &CancellationToken, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {
                if cancel.run_until_cancelled(round()).await.is_none() {
                    break;
                }
            }
        }
    }
}

/// How long a stopping node tries to apply its queued directory attribute updates.
const FINAL_TOUCH_FLUSH: Duration = Duration::from_secs(2);
