//! The cluster map as the client uses it: nodes, the replicas of every partition, the
//! leader each partition last reported, and the cluster policy (strict prefixes, staleness
//! bound, batch size). A map is read from the wire in `wire::replies` (the wire's zeros
//! become the defaults here) and then checked by `ClusterMap::validated`: every partition
//! `0..P` is described once and every replica names a known node, so the router can index
//! without further checks. This module knows no wire type.

use std::time::Duration;
use talon_model::{Ino, TalonError};

/// Largest batch / page size the client asks for when a map says 0.
pub(crate) const DEFAULT_MAX_BATCH: u32 = 1024;

/// Small-file threshold assumed when a map says 0 (DESIGN.md: 1 MiB).
pub const DEFAULT_SMALL_FILE_MAX: u32 = 1 << 20;

/// Chunk size assumed when a map says 0 (DESIGN.md: 4 MiB).
pub const DEFAULT_CHUNK_SIZE: u32 = 4 << 20;

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// Node id, unique in the cluster and never 0.
    pub id: u64,
    /// `host:port` of its client API.
    pub addr: String,
}

/// One partition and where it lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Partition id, `0..partitions`.
    pub id: u32,
    /// Node ids hosting a replica.
    pub replicas: Vec<u64>,
    /// The leader the answering node knew of, if any.
    pub leader_hint: Option<u64>,
}

/// A validated cluster map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMap {
    /// Every node.
    pub nodes: Vec<NodeInfo>,
    /// Number of partitions P.
    pub partitions: u32,
    /// Replicas per partition.
    pub replication: u32,
    /// Indexed by partition id.
    pub partition_info: Vec<PartitionInfo>,
    /// Directory path prefixes whose new directories are strict.
    pub strict_prefixes: Vec<String>,
    /// Newest namespace epoch known to the answering node.
    pub epoch: u64,
    /// Staleness bound of relaxed reads.
    pub relaxed_staleness: Duration,
    /// The root directory.
    pub root_ino: Ino,
    /// Largest number of ops in one Batch and of entries in one ReadDir page.
    pub max_batch: u32,
    /// Files up to this many bytes are stored whole (one `WriteSmall`); larger ones in chunks.
    pub small_file_max: u32,
    /// Chunk size of newly chunked files.
    pub chunk_size: u32,
    /// How old a chunk no layout names grows before the servers reclaim it, unless a held
    /// open session holds it (zero when the servers did not say).
    pub chunk_gc_grace: Duration,
    /// How long an unlinked file stays before the servers reclaim it, unless a held open
    /// session holds it (zero when the servers did not say).
    pub unlinked_grace: Duration,
}

impl ClusterMap {
    /// How long an open File waits before it holds an open session (`open_session`): a
    /// quarter of the shorter of the servers' graces, so the session is held before a chunk
    /// the File stored, or the file unlinked meanwhile, can be reclaimed. Zero (hold at
    /// once) when the servers said neither.
    pub fn open_session_delay(&self) -> Duration {
        [self.chunk_gc_grace, self.unlinked_grace]
            .into_iter()
            .filter(|g| !g.is_zero())
            .min()
            .unwrap_or_default()
            / 4
    }

    /// The node with id `id`.
    pub fn node(&self, id: u64) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The node whose address is `addr` (with or without an `http://` prefix).
    pub fn node_by_addr(&self, addr: &str) -> Option<&NodeInfo> {
        let addr = addr.strip_prefix("http://").unwrap_or(addr);
        self.nodes.iter().find(|n| n.addr == addr)
    }

    /// The replicas of partition `p` (empty for an unknown partition).
    pub fn replicas(&self, p: u32) -> &[u64] {
        self.partition_info
            .get(p as usize)
            .map(|i| i.replicas.as_slice())
            .unwrap_or(&[])
    }

    /// This map as a node sent it (partitions in any order, addresses perhaps with an
    /// `http://` prefix), checked: at least one and at most `MAX_PARTITIONS` partitions,
    /// nodes with distinct non-zero ids and an address each, every partition `0..P`
    /// described once with replicas that name known nodes. The result has its partitions
    /// indexed by id and its addresses bare, so the router can index without further checks.
    pub(crate) fn validated(self) -> Result<ClusterMap, TalonError> {
        let bad = |what: String| TalonError::Invalid(format!("cluster map: {what}"));
        if self.partitions == 0 {
            return Err(bad("zero partitions".into()));
        }
        if self.partitions > talon_model::ino::MAX_PARTITIONS {
            return Err(bad(format!("{} partitions is too many", self.partitions)));
        }
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for n in self.nodes {
            if n.id == 0 || n.addr.is_empty() {
                return Err(bad(format!("node {} with address {:?}", n.id, n.addr)));
            }
            if nodes.iter().any(|x: &NodeInfo| x.id == n.id) {
                return Err(bad(format!("node {} listed twice", n.id)));
            }
            let addr = n
                .addr
                .strip_prefix("http://")
                .unwrap_or(&n.addr)
                .to_string();
            nodes.push(NodeInfo { id: n.id, addr });
        }
        let mut slots: Vec<Option<PartitionInfo>> = vec![None; self.partitions as usize];
        for p in self.partition_info {
            let slot = slots
                .get_mut(p.id as usize)
                .ok_or_else(|| bad(format!("partition {} out of range", p.id)))?;
            if slot.is_some() {
                return Err(bad(format!("partition {} listed twice", p.id)));
            }
            if p.replicas.is_empty() {
                return Err(bad(format!("partition {} has no replicas", p.id)));
            }
            if let Some(r) = p
                .replicas
                .iter()
                .find(|r| !nodes.iter().any(|n| n.id == **r))
            {
                return Err(bad(format!("partition {} names unknown node {r}", p.id)));
            }
            *slot = Some(p);
        }
        let partition_info = slots
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.ok_or_else(|| bad(format!("partition {i} missing"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClusterMap {
            nodes,
            partition_info,
            ..self
        })
    }
}
