//! Argument and result types of the client API. They are domain types: the client converts
//! them to and from the wire messages of `talon-proto` at the RPC edge.

use talon_model::{Attr, Class, FileKind, Ino, TalonError, Time};
use talon_proto::v1 as pb;

/// What to create with [`Client::create`](crate::Client::create).
#[derive(Clone, Debug)]
pub struct CreateSpec {
    /// The kind of inode.
    pub kind: FileKind,
    /// Permission bits (07777).
    pub perm: u32,
    /// Device number, for character and block devices.
    pub rdev: u64,
    /// Target, for symlinks.
    pub symlink_target: Vec<u8>,
    /// Class of a new directory; `None` inherits the parent's.
    pub class: Option<Class>,
    /// When false, creating a regular file that exists returns it (open without O_EXCL).
    pub exclusive: bool,
    /// Owner and group of the new inode; `None` takes the client's `uid` and `gid` options.
    /// The FUSE mount passes the calling process's ids here.
    pub owner: Option<(u32, u32)>,
}

impl CreateSpec {
    /// A regular file with mode `perm`, failing with EEXIST if the name exists.
    pub fn file(perm: u32) -> CreateSpec {
        CreateSpec {
            kind: FileKind::Regular,
            perm,
            rdev: 0,
            symlink_target: Vec::new(),
            class: None,
            exclusive: true,
            owner: None,
        }
    }

    /// A directory with mode `perm` of class `class` (`None` inherits).
    pub fn dir(perm: u32, class: Option<Class>) -> CreateSpec {
        CreateSpec {
            kind: FileKind::Directory,
            class,
            ..CreateSpec::file(perm)
        }
    }

    /// A symlink pointing at `target`.
    pub fn symlink(target: impl Into<Vec<u8>>) -> CreateSpec {
        CreateSpec {
            kind: FileKind::Symlink,
            symlink_target: target.into(),
            ..CreateSpec::file(0o777)
        }
    }

    /// A special file (fifo, socket, device).
    pub fn node(kind: FileKind, perm: u32, rdev: u64) -> CreateSpec {
        CreateSpec {
            kind,
            rdev,
            ..CreateSpec::file(perm)
        }
    }
}

/// How to set a time in [`SetAttr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// This exact time.
    At(Time),
    /// The server's clock.
    Now,
}

/// Which attributes [`Client::setattr`](crate::Client::setattr) changes; `None` keeps one.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    /// New permission bits.
    pub perm: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
}

pub use talon_model::flags::{RenameFlags, XattrFlags};

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

impl TryFrom<pb::DirEntry> for DirEntry {
    type Error = TalonError;
    fn try_from(e: pb::DirEntry) -> Result<Self, TalonError> {
        Ok(DirEntry {
            kind: FileKind::try_from(e.kind)?,
            ino: Ino(e.ino),
            attr: e.attr.map(Attr::try_from).transpose()?,
            name: e.name,
        })
    }
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

impl From<pb::PartitionStatus> for PartitionStatus {
    fn from(p: pb::PartitionStatus) -> Self {
        PartitionStatus {
            id: p.id,
            role: p.role,
            leader: p.leader,
            term: p.term,
            last_log_index: p.last_log_index,
            applied_index: p.applied_index,
            snapshot_index: p.snapshot_index,
            entries: p.entries,
            inodes: p.inodes,
        }
    }
}
