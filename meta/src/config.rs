//! Node and cluster configuration: one TOML file per node, written by `talon-meta init`.
//!
//! Every key has a default (see `Default` impls) and is documented in
//! `meta/talon-meta.example.toml`, which a test parses. `validate()` returns a typed error
//! naming the offending key; a node refuses to start with an invalid config.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The largest chunk size a cluster may be configured with (`cluster.chunk_size`), so the
/// largest chunk any node stores.
pub const MAX_CHUNK_SIZE: u32 = 8 << 20;

/// The configuration of one `talon-meta` node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// This node's id; must appear in `cluster.nodes`.
    pub node_id: u64,
    /// Address to listen on for both services (client API and Raft).
    pub listen: String,
    /// Directory holding this node's Raft log and partition state.
    pub data_dir: PathBuf,
    /// The cluster, identical on every node.
    pub cluster: ClusterConfig,
    /// Raft timing and log retention.
    pub raft: RaftConfig,
    /// Thresholds of the data file system's fullness (this node's own disk).
    pub space: SpaceConfig,
    /// Memory of this node's stores.
    pub storage: StorageConfig,
}

/// Memory of a node's RocksDB stores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Memtable budget of the whole node: a quarter for the Raft log's memtable, the rest
    /// shared by the partitions; unflushed writes beyond it are flushed. Capped at a
    /// quarter of the space reserve (half its restart share), so that what a restart must
    /// flush fits in the room the reserve gives back.
    pub write_buffer_bytes: u64,
    /// Read cache of the whole node, in memory: blocks of every store and small-file bodies
    /// (blobs) of every partition, least recently used out first. 0: RocksDB's default
    /// block cache per store and no cache of bodies.
    pub cache_bytes: u64,
    /// How often the process hands memory the C library's allocator holds free back to the
    /// kernel, in ms (glibc only; 0: never): RocksDB's memory, as the `talon` and
    /// `talon-meta` binaries allocate Rust's through jemalloc. See `crate::malloc`.
    pub trim_every_ms: u64,
    /// Most arenas the C library's allocator keeps (glibc only; 0: its own default of eight
    /// per core). Set as the node opens.
    pub malloc_arenas: u32,
    /// Records of one kind (chunks, unlinked files, request records, open sessions) a
    /// garbage-collection round reads on each partition: bounds a round's work and memory.
    /// The chunk collector pages through a partition's chunks this many at a time, each
    /// round after where the last one stopped.
    pub gc_scan_records: u32,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            write_buffer_bytes: 64 << 20,
            cache_bytes: 256 << 20,
            trim_every_ms: 10_000,
            malloc_arenas: 2,
            gc_scan_records: 50_000,
        }
    }
}

/// The cluster: nodes, partitioning, replication and policy. Identical on every node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Every node of the cluster.
    pub nodes: Vec<NodeEntry>,
    /// Number of partitions P, fixed at init.
    pub partitions: u32,
    /// Replicas per partition R (at most the number of nodes).
    pub replication: u32,
    /// Directories whose path is or is under one of these are created strict.
    pub strict_prefixes: Vec<String>,
    /// Bound on the staleness of relaxed reads served by followers and client caches (ms).
    pub relaxed_staleness_ms: u64,
    /// Largest number of ops in a Batch RPC and of entries in one ReadDir page.
    pub max_batch: u32,
    /// Largest number of client commands merged into one Raft proposal.
    pub max_proposal_batch: u32,
    /// Files up to this many bytes are stored whole in the packed store.
    pub small_file_max: u32,
    /// Chunk size of larger files.
    pub chunk_size: u32,
    /// Chunks no committed layout names are reclaimed once older than this (ms), and seen
    /// so by the collecting leader for this long again, unless an open session holds them:
    /// a file kept open (by a writer, or a reader of a chunked file) for a quarter of the
    /// shorter of this and `unlinked_grace_ms` holds one, renewed every third of this, so
    /// this is also how long a client cut off from the servers keeps its session.
    pub chunk_gc_grace_ms: u64,
    /// A file whose last name goes (unlink, or a rename over it) stays readable by inode
    /// for this long (ms), so a reader that looked the name up just before still opens and
    /// reads the old contents; then (after half of it when the node's data file system is
    /// past `space.nearfull_ratio`) it is reclaimed, unless an open session holds it (a
    /// client still has it open). A client holds a file it keeps open from a quarter of the
    /// shorter grace on, so even half of this one is past that.
    pub unlinked_grace_ms: u64,
}

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    /// Node id, unique, non-zero.
    pub id: u64,
    /// Address other nodes and clients reach it at (host:port).
    pub addr: String,
}

/// Raft timing and snapshot policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    /// Leader heartbeat interval (ms).
    pub heartbeat_ms: u64,
    /// Election timeout, lower bound (ms); must exceed the heartbeat.
    pub election_timeout_min_ms: u64,
    /// Election timeout, upper bound (ms).
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many log entries since the last one.
    pub snapshot_after_entries: u64,
    /// Build a snapshot once the log holds this many bytes of entries since the last one
    /// (0: by entries only). File bodies travel in the log, and it keeps them until a
    /// snapshot: without this, 20,000 entries of 110 KB images are 2 GB of log per
    /// partition. A snapshot is a checkpoint (hard links), so building one often costs
    /// little.
    pub snapshot_after_bytes: u64,
    /// Log entries kept behind a snapshot, for followers that lag a little; never those
    /// before the snapshot before it, so that entries of file data (up to a 4 MiB chunk
    /// each) keep at most about `snapshot_after_bytes` behind a snapshot.
    pub keep_entries_after_snapshot: u64,
    /// A prepared transaction that a partition's leader has seen for this long (ms, by its
    /// monotonic clock) is resolved by asking its coordinator.
    pub txn_recovery_after_ms: u64,
}

/// When this node's data file system counts as nearly full or full, and the space it
/// holds back so that it can always restart. See `crate::space`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpaceConfig {
    /// Past this fraction of the file system used, the node frees what it can at once:
    /// unlinked files, deleted bodies (compaction), Raft log behind a snapshot.
    pub nearfull_ratio: f64,
    /// Past this fraction used, new entries and data are refused with ENOSPC (reads,
    /// listings, unlinks, rmdirs, renames and truncates go on), and the node hands the
    /// leadership of its partitions to replicas with room.
    pub full_ratio: f64,
    /// Bytes held back in a reserve file, so that the node can always open its stores,
    /// apply what is committed and delete: half of it is released when the disk fills,
    /// the other half (the restart share) only at start-up. At most a sixteenth of the
    /// file system is held.
    pub reserve_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: 1,
            listen: "127.0.0.1:7001".into(),
            data_dir: PathBuf::from("talon-data/node1"),
            cluster: ClusterConfig::default(),
            raft: RaftConfig::default(),
            space: SpaceConfig::default(),
            storage: StorageConfig::default(),
        }
    }
}

impl Default for SpaceConfig {
    fn default() -> Self {
        SpaceConfig {
            nearfull_ratio: 0.85,
            full_ratio: 0.95,
            reserve_bytes: 256 << 20,
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            nodes: vec![NodeEntry {
                id: 1,
                addr: "127.0.0.1:7001".into(),
            }],
            partitions: 16,
            replication: 1,
            strict_prefixes: vec!["/checkpoints".into(), "/control".into()],
            relaxed_staleness_ms: 2000,
            max_batch: 1024,
            max_proposal_batch: 256,
            small_file_max: 1 << 20,
            chunk_size: 4 << 20,
            chunk_gc_grace_ms: 10 * 60 * 1000,
            unlinked_grace_ms: 30_000,
        }
    }
}

impl Default for RaftConfig {
    fn default() -> Self {
        RaftConfig {
            heartbeat_ms: 100,
            election_timeout_min_ms: 600,
            election_timeout_max_ms: 1200,
            snapshot_after_entries: 20_000,
            snapshot_after_bytes: 64 << 20,
            keep_entries_after_snapshot: 1_000,
            txn_recovery_after_ms: 3_000,
        }
    }
}

/// A configuration error, naming the key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A key has a value outside its range.
    #[error("config key `{key}`: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// Why.
        reason: String,
    },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

impl Config {
    /// Parses a TOML config.
    pub fn from_toml(s: &str) -> Result<Config, String> {
        toml::from_str(s).map_err(|e| e.to_string())
    }

    /// Checks every key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if c.nodes.is_empty() {
            return Err(invalid("cluster.nodes", "no nodes"));
        }
        let mut ids: Vec<u64> = c.nodes.iter().map(|n| n.id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != c.nodes.len() || ids.first() == Some(&0) {
            return Err(invalid(
                "cluster.nodes",
                "node ids must be unique and non-zero",
            ));
        }
        for n in &c.nodes {
            if n.addr.parse::<std::net::SocketAddr>().is_err() && !n.addr.contains(':') {
                return Err(invalid(
                    "cluster.nodes",
                    format!("address {:?} is not host:port", n.addr),
                ));
            }
        }
        if !c.nodes.iter().any(|n| n.id == self.node_id) {
            return Err(invalid(
                "node_id",
                format!("{} is not in cluster.nodes", self.node_id),
            ));
        }
        if c.partitions == 0 || c.partitions > talon_model::ino::MAX_PARTITIONS {
            return Err(invalid("cluster.partitions", "must be 1..=65536"));
        }
        if c.replication == 0 || c.replication as usize > c.nodes.len() {
            return Err(invalid(
                "cluster.replication",
                "must be 1..=number of nodes",
            ));
        }
        for p in &c.strict_prefixes {
            if !p.starts_with('/') || (p.len() > 1 && p.ends_with('/')) {
                return Err(invalid(
                    "cluster.strict_prefixes",
                    format!("{p:?}: absolute, no trailing /"),
                ));
            }
        }
        if c.max_batch == 0 || c.max_batch > 65_536 {
            return Err(invalid("cluster.max_batch", "must be 1..=65536"));
        }
        if c.small_file_max == 0 || c.small_file_max > 4 << 20 {
            return Err(invalid("cluster.small_file_max", "must be 1..=4194304"));
        }
        if c.chunk_size < 4096 || c.chunk_size > MAX_CHUNK_SIZE {
            return Err(invalid("cluster.chunk_size", "must be 4096..=8388608"));
        }
        if c.unlinked_grace_ms > 24 * 3600 * 1000 {
            return Err(invalid(
                "cluster.unlinked_grace_ms",
                "must be at most a day (86400000)",
            ));
        }
        if c.max_proposal_batch == 0 {
            return Err(invalid("cluster.max_proposal_batch", "must be at least 1"));
        }
        let r = &self.raft;
        if r.heartbeat_ms == 0 {
            return Err(invalid("raft.heartbeat_ms", "must be positive"));
        }
        if r.election_timeout_min_ms <= r.heartbeat_ms {
            return Err(invalid(
                "raft.election_timeout_min_ms",
                "must exceed raft.heartbeat_ms",
            ));
        }
        if r.election_timeout_max_ms <= r.election_timeout_min_ms {
            return Err(invalid(
                "raft.election_timeout_max_ms",
                "must exceed the minimum",
            ));
        }
        if r.snapshot_after_entries == 0 {
            return Err(invalid("raft.snapshot_after_entries", "must be positive"));
        }
        if self.storage.gc_scan_records == 0 {
            return Err(invalid("storage.gc_scan_records", "must be at least 1"));
        }
        if self.storage.write_buffer_bytes < 2 << 20 {
            return Err(invalid(
                "storage.write_buffer_bytes",
                "must be at least 2 MiB",
            ));
        }
        let s = &self.space;
        if !(s.full_ratio > 0.0 && s.full_ratio <= 1.0) {
            return Err(invalid("space.full_ratio", "must be in (0, 1]"));
        }
        if !(s.nearfull_ratio > 0.0 && s.nearfull_ratio <= s.full_ratio) {
            return Err(invalid(
                "space.nearfull_ratio",
                "must be in (0, space.full_ratio]",
            ));
        }
        Ok(())
    }

    /// The replicas of `partition`: R consecutive nodes (by id order) starting at
    /// `partition % N`, so leaders and data spread evenly.
    pub fn replicas(&self, partition: u32) -> Vec<u64> {
        replicas(&self.cluster, partition)
    }

    /// The node that initialises `partition`'s group on first start, and so usually leads
    /// it at first: the start of its replica rotation, so leaders spread over the nodes.
    pub fn preferred_leader(&self, partition: u32) -> u64 {
        let mut ids: Vec<u64> = self.cluster.nodes.iter().map(|n| n.id).collect();
        ids.sort_unstable();
        ids[partition as usize % ids.len()]
    }

    /// The address of node `id`.
    pub fn addr_of(&self, id: u64) -> Option<&str> {
        self.cluster
            .nodes
            .iter()
            .find(|n| n.id == id)
            .map(|n| n.addr.as_str())
    }
}

/// The replicas of `partition` under `cluster`.
pub fn replicas(cluster: &ClusterConfig, partition: u32) -> Vec<u64> {
    let mut ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
    ids.sort_unstable();
    let n = ids.len();
    let mut out: Vec<u64> = (0..cluster.replication as usize)
        .map(|i| ids[(partition as usize + i) % n])
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_file_parses_and_validates() {
        let text = include_str!("../talon-meta.example.toml");
        let c = Config::from_toml(text).expect("example parses");
        c.validate().expect("example validates");
        assert_eq!(c.cluster.nodes.len(), 3);
    }

    #[test]
    fn default_is_valid() {
        Config::default().validate().expect("default validates");
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut c = Config::default();
        c.cluster.replication = 3;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Invalid {
                key: "cluster.replication",
                ..
            })
        ));
        let c = Config {
            node_id: 9,
            ..Config::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Invalid { key: "node_id", .. })
        ));
        assert!(Config::from_toml("unknown_key = 1").is_err());
    }

    #[test]
    fn replicas_spread_and_are_distinct() {
        let mut c = Config::default();
        c.cluster.nodes = (1..=3)
            .map(|id| NodeEntry {
                id,
                addr: format!("127.0.0.1:{}", 7000 + id),
            })
            .collect();
        c.cluster.replication = 2;
        for p in 0..8 {
            let r = c.replicas(p);
            assert_eq!(r.len(), 2);
            assert_ne!(r[0], r[1]);
        }
        assert_ne!(c.replicas(0), c.replicas(1));
        let leaders: std::collections::BTreeSet<u64> =
            (0..6).map(|p| c.preferred_leader(p)).collect();
        assert_eq!(leaders.len(), 3, "initial leaders spread over every node");
        for p in 0..8 {
            assert!(c.replicas(p).contains(&c.preferred_leader(p)));
        }
    }
}
