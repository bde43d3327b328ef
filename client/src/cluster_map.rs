//! The cluster map as the client uses it: nodes, the replicas of every partition, the
//! leader each partition last reported, and the cluster policy (strict prefixes, staleness
//! bound, batch size). Converted from the wire form with `TryFrom`, which checks that every
//! partition `0..P` is described once and that every replica names a known node, so the
//! router can index without further checks.

use std::time::Duration;
use talon_model::{Ino, TalonError};
use talon_proto::v1 as pb;

/// Largest batch / page size the client asks for when a map says 0.
const DEFAULT_MAX_BATCH: u32 = 1024;

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
}

impl ClusterMap {
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
}

impl TryFrom<pb::ClusterMap> for ClusterMap {
    type Error = TalonError;

    fn try_from(m: pb::ClusterMap) -> Result<Self, TalonError> {
        let bad = |what: String| TalonError::Invalid(format!("cluster map: {what}"));
        if m.partitions == 0 {
            return Err(bad("zero partitions".into()));
        }
        if m.partitions > talon_model::ino::MAX_PARTITIONS {
            return Err(bad(format!("{} partitions is too many", m.partitions)));
        }
        let mut nodes = Vec::with_capacity(m.nodes.len());
        for n in m.nodes {
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
        let mut slots: Vec<Option<PartitionInfo>> = vec![None; m.partitions as usize];
        for p in m.partition_info {
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
            *slot = Some(PartitionInfo {
                id: p.id,
                replicas: p.replicas,
                leader_hint: (p.leader_hint != 0).then_some(p.leader_hint),
            });
        }
        let partition_info = slots
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.ok_or_else(|| bad(format!("partition {i} missing"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClusterMap {
            nodes,
            partitions: m.partitions,
            replication: m.replication,
            partition_info,
            strict_prefixes: m.strict_prefixes,
            epoch: m.epoch,
            relaxed_staleness: Duration::from_millis(m.relaxed_staleness_ms),
            root_ino: if m.root_ino == 0 {
                talon_model::ROOT_INO
            } else {
                Ino(m.root_ino)
            },
            max_batch: if m.max_batch == 0 {
                DEFAULT_MAX_BATCH
            } else {
                m.max_batch
            },
            small_file_max: if m.small_file_max == 0 {
                DEFAULT_SMALL_FILE_MAX
            } else {
                m.small_file_max
            },
            chunk_size: if m.chunk_size == 0 {
                DEFAULT_CHUNK_SIZE
            } else {
                m.chunk_size
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(partitions: u32) -> pb::ClusterMap {
        pb::ClusterMap {
            nodes: vec![
                pb::NodeInfo {
                    id: 1,
                    addr: "127.0.0.1:1".into(),
                },
                pb::NodeInfo {
                    id: 2,
                    addr: "http://127.0.0.1:2".into(),
                },
            ],
            partitions,
            replication: 2,
            partition_info: (0..partitions)
                .map(|id| pb::PartitionInfo {
                    id,
                    replicas: vec![1, 2],
                    leader_hint: 2,
                })
                .collect(),
            strict_prefixes: vec!["/ckpt".into()],
            epoch: 3,
            relaxed_staleness_ms: 500,
            root_ino: 1,
            max_batch: 0,
            small_file_max: 0,
            chunk_size: 1 << 16,
        }
    }

    #[test]
    fn accepts_a_complete_map() {
        let m = ClusterMap::try_from(wire(4)).expect("valid map");
        assert_eq!(m.partition_info.len(), 4);
        assert_eq!(m.node_by_addr("127.0.0.1:2").map(|n| n.id), Some(2));
        assert_eq!(m.node_by_addr("http://127.0.0.1:1").map(|n| n.id), Some(1));
        assert_eq!(m.max_batch, DEFAULT_MAX_BATCH);
        assert_eq!(m.small_file_max, DEFAULT_SMALL_FILE_MAX);
        assert_eq!(m.chunk_size, 1 << 16);
        assert_eq!(m.partition_info[3].leader_hint, Some(2));
    }

    #[test]
    fn rejects_missing_partitions_and_unknown_nodes() {
        let mut w = wire(4);
        w.partition_info.pop();
        assert!(ClusterMap::try_from(w).is_err());
        let mut w = wire(2);
        w.partition_info[0].replicas.push(9);
        assert!(ClusterMap::try_from(w).is_err());
        assert!(ClusterMap::try_from(wire(0)).is_err());
    }
}
