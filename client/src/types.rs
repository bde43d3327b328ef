//! Argument and result types of the client API. They are domain types: the client converts
//! them to and from the wire messages of `talon-proto` at the RPC edge.

use talon_model::{Attr, Class, FileKind, Ino, TalonError};

pub use talon_model::CreateSpec;

pub use talon_model::{SetAttr, TimeSet};

pub use talon_model::flags::{RenameFlags, XattrFlags};

/// What a change to a directory's entries (a create or a remove) answered: its result, and
/// the directory's attributes after it as the leader of the directory's home answered
/// them; `None` when they are not known.
#[derive(Clone, Debug)]
pub struct DirChange<T> {
    /// What the change returns.
    pub value: T,
    /// The directory's attributes right after the change, if the answer carried them.
    pub dir: Option<Attr>,
}

/// Usage figures, summed over the partitions asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Inodes in use.
    pub inodes: u64,
    /// Bytes of file data stored.
    pub bytes: u64,
    /// Directory entries.
    pub entries: u64,
    /// Capacity for file data: the nodes' data file systems, summed over the nodes that
    /// answered and divided by the replication factor (every byte is stored that many
    /// times). Sizes and free space of file systems shared by several nodes are counted
    /// once per node.
    pub space_total: u64,
    /// Free bytes of that capacity.
    pub space_free: u64,
    /// Free bytes of that capacity available to unprivileged users.
    pub space_avail: u64,
}

/// One directory entry from a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry name.
    pub name: Vec<u8>,
    /// The inode it names.
    pub ino: Ino,
    /// Its kind.
    pub kind: FileKind,
    /// Its attributes, when the listing asked for them (`plus`).
    pub attr: Option<Attr>,
}

/// Options of [`Client::mkdir`](crate::Client::mkdir).
#[derive(Clone, Debug)]
pub struct MkdirOptions {
    /// Permission bits of the new directories.
    pub perm: u32,
    /// Class of the (last) new directory; `None` follows the cluster's strict prefixes and
    /// otherwise inherits the parent's class.
    pub class: Option<Class>,
    /// Create missing parents and accept an existing directory (`mkdir -p`).
    pub parents: bool,
}

impl Default for MkdirOptions {
    fn default() -> Self {
        MkdirOptions {
            perm: 0o755,
            class: None,
            parents: false,
        }
    }
}

/// One partition replica as a node reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionStatus {
    /// Partition id.
    pub id: u32,
    /// LEADER, FOLLOWER, CANDIDATE, LEARNER or SHUTDOWN.
    pub role: String,
    /// The leader this replica knows (0: none).
    pub leader: u64,
    /// Raft term.
    pub term: u64,
    /// Last log index.
    pub last_log_index: u64,
    /// Applied index.
    pub applied_index: u64,
    /// Index of the last snapshot.
    pub snapshot_index: u64,
    /// Log entries up to this index are purged (covered by a snapshot): a replica behind
    /// it can catch up only by installing a snapshot.
    pub purged_index: u64,
    /// Directory entries held.
    pub entries: u64,
    /// Inodes held.
    pub inodes: u64,
}

/// What one node reports about itself, or why it did not.
#[derive(Clone, Debug)]
pub struct NodeStatus {
    /// The node id from the cluster map.
    pub node_id: u64,
    /// Its address from the cluster map.
    pub addr: String,
    /// The partitions it hosts, or the error asking it.
    pub partitions: Result<Vec<PartitionStatus>, TalonError>,
    /// Its data file system, if it answered.
    pub space: Option<NodeSpace>,
    /// Its memory and its Raft log's group commit, if it answered.
    pub load: Option<NodeLoad>,
}

/// Where a node's memory is and how well its Raft log's appends share a sync, as the node
/// reports them. Its memory budget is `[storage]` write_buffer_bytes + cache_bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeLoad {
    /// Resident memory now, in bytes, as the kernel counts it.
    pub resident: u64,
    /// The process's peak resident memory, in bytes.
    pub peak_resident: u64,
    /// Memtables of all its stores, in bytes.
    pub memtables: u64,
    /// Its shared block and blob cache in use, in bytes.
    pub cache: u64,
    /// Raft log appends since the node started (all partitions).
    pub log_appends: u64,
    /// The log syncs that made them durable; appends per sync is the group-commit factor.
    pub log_syncs: u64,
}

/// How full a node's data file system is.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpace {
    /// "ok", "nearfull", "full" or "critical".
    pub level: String,
    /// Fraction in use.
    pub used: f64,
    /// Size in bytes.
    pub total: u64,
    /// Bytes that may still be written before it counts as full.
    pub usable: u64,
}
