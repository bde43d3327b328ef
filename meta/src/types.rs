//! The Raft type configuration and the replicated command language of a partition.
//!
//! A partition's log carries `Command`s. Every namespace change is expressed as a list of
//! primitive `Op`s with preconditions; a single-partition change is one `Atomic` command,
//! a multi-partition change is a `Prepare` on every participant, a `Decide` on the
//! coordinator and a `Finish` on every participant (see `txn.rs`). Apply is deterministic:
//! it reads nothing but the state machine and the command (ino allocation included), so
//! every replica reaches the same state.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use talon_model::{Attr, ChunkRef, Class, Errno, FileKind, Ino, SetAttr, TalonError, Time};

openraft::declare_raft_types!(
    /// Talon's openraft type configuration: node ids are u64, nodes carry their address.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::archive::Stream,
);

/// Raft handle of one partition group.
pub type Raft = openraft::Raft<TypeConfig>;
/// Node id.
pub type NodeId = u64;
/// Storage error of our type config.
pub type StorageError = openraft::StorageError<NodeId>;

/// A transaction id: the coordinator partition and a random number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TxId {
    /// The partition whose log holds the commit/abort decision.
    pub coordinator: u32,
    /// Unique within the coordinator.
    pub id: u64,
}

impl std::fmt::Display for TxId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{:016x}", self.coordinator, self.id)
    }
}

/// What a dentry must be for an op list to apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expect {
    /// No entry of that name.
    Absent,
    /// An entry pointing at exactly this ino.
    Ino(Ino),
    /// Still what the plan read (`None`: no entry). Any change, an entry appearing, going
    /// or pointing elsewhere, makes the plan stale (it is made again), never an errno: the
    /// guard of a rename that replaces whatever its destination holds, for which neither
    /// EEXIST nor ENOENT is a valid answer. Last in the enum, so logs written before it
    /// existed still decode.
    AsPlanned(Option<Ino>),
}

/// The ino a new dentry points at: an existing inode, or one allocated by a `NewInode` of
/// the same op list (by its position among the list's `NewInode`s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// An existing inode.
    Existing(Ino),
    /// The n-th inode this op list allocates.
    New(u8),
}

/// Attribute changes of a setattr as its op records them: every time fixed by the proposer
/// (see `talon_model::set_attr`).
pub type AttrChange = SetAttr<Time>;

/// One primitive step of a namespace change on one partition. Preconditions (`Expect*`)
/// are checked for the whole list before any mutation applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Precondition: the command's epoch is not older than the partition's.
    ExpectEpoch(u64),
    /// Precondition: `dir` is a live directory (not removed, not fenced by an rmdir). When
    /// `learn` is set, the partition records `dir` with class `class` in its set of known
    /// live directories (lazy namespace replication).
    ExpectDirLive {
        /// The directory.
        dir: Ino,
        /// Its class, as learnt from its home partition.
        class: Class,
        /// Record it in the live-directory set.
        learn: bool,
    },
    /// Precondition on a dentry.
    ExpectDentry {
        /// Parent directory.
        parent: Ino,
        /// Entry name.
        name: Vec<u8>,
        /// What it must be.
        expect: Expect,
    },
    /// Precondition: this partition holds no entry (and no pending entry) of `dir`; takes
    /// the directory's fence while prepared, so no create under `dir` can slip in.
    ExpectEmpty(Ino),
    /// Precondition: the inode exists (and, for `kind`, is of that kind).
    ExpectInode {
        /// The inode.
        ino: Ino,
        /// Required kind, if any.
        kind: Option<FileKind>,
    },
    /// Allocate an ino on this partition and store an inode with these attributes (its
    /// `ino` field is filled in) and, for a symlink, its target.
    NewInode {
        /// The attributes of the new inode.
        attr: Box<Attr>,
        /// Symlink target (empty for other kinds).
        symlink: Vec<u8>,
        /// The creating request's retry token (0: none), kept with the inode.
        creator: u64,
    },
    /// Insert or replace a dentry.
    PutDentry {
        /// Parent directory.
        parent: Ino,
        /// Entry name.
        name: Vec<u8>,
        /// What it points at.
        target: Target,
        /// Kind of the target.
        kind: FileKind,
    },
    /// Remove a dentry.
    DelDentry {
        /// Parent directory.
        parent: Ino,
        /// Entry name.
        name: Vec<u8>,
    },
    /// Change an inode's link count and times. A file whose count drops to zero stays,
    /// unlinked, for the grace period (`unlinked_grace_ms`) so readers that looked its name
    /// up just before can still open it by inode; `ReclaimUnlinked` then deletes it. A
    /// count raised from zero is refused (ENOENT): an unlinked file gets no new name.
    AdjustInode {
        /// The inode.
        ino: Ino,
        /// Link count change.
        nlink: i32,
        /// New parent, for a directory moved by rename.
        parent: Option<Ino>,
        /// Set mtime as well as ctime (a directory whose entries changed).
        touch_mtime: bool,
        /// The time to set.
        now: Time,
    },
    /// Apply a setattr.
    SetAttr {
        /// The inode.
        ino: Ino,
        /// What to change.
        change: AttrChange,
        /// ctime to set.
        now: Time,
    },
    /// Set (`value: Some`) or remove an xattr; flags as Linux setxattr.
    Xattr {
        /// The inode.
        ino: Ino,
        /// Attribute name.
        name: Vec<u8>,
        /// New value, or None to remove.
        value: Option<Vec<u8>>,
        /// 1 = must not exist, 2 = must exist.
        flags: u32,
        /// ctime to set.
        now: Time,
    },
    /// Delete a directory inode with its xattrs (rmdir, or a directory replaced by rename).
    DropInode(Ino),
    /// Change a directory's class (its emptiness is checked by `ExpectEmpty` ops).
    SetClass {
        /// The directory.
        dir: Ino,
        /// Its new class.
        class: Class,
    },
    /// Update the live-directory set's class of `dir`, where this partition knows it.
    Relearn {
        /// The directory.
        dir: Ino,
        /// Its new class.
        class: Class,
    },
    /// Mark `dir` removed on this partition: creates under it fail with ENOENT forever.
    Tombstone(Ino),
    /// Move the namespace epoch one on, and to at least this value (directory renames).
    BumpEpoch(u64),
    /// Replace a small file's whole body (the file becomes or stays small).
    WriteBody {
        /// The file.
        ino: Ino,
        /// Its new contents (encoded as `serde_bytes` encodes a `Vec<u8>`).
        data: Bytes,
        /// Refuse unless the inode is at this generation (0: any).
        expect_generation: u64,
        /// mtime/ctime to set.
        now: Time,
    },
    /// Store a chunk (invisible until a layout names it).
    PutChunk {
        /// The file.
        ino: Ino,
        /// The writer's session.
        write_id: u64,
        /// Chunk index.
        index: u32,
        /// Contents (encoded as `serde_bytes` encodes a `Vec<u8>`).
        data: Bytes,
        /// Leader wall clock (ms) at proposal, for garbage collection's grace period.
        at_ms: u64,
    },
    /// Switch a file to a chunked layout and size.
    CommitLayout {
        /// The file.
        ino: Ino,
        /// New size.
        size: u64,
        /// Bytes per chunk of the new chunked layout.
        chunk_size: u32,
        /// Its chunks (the fields of `Layout::Chunked`, kept flat so the op's stored
        /// encoding did not change when the layout type moved to the model).
        chunks: Vec<ChunkRef>,
        /// Refuse unless the inode is at this generation (0: any).
        expect_generation: u64,
        /// mtime/ctime to set.
        now: Time,
    },
    /// Delete chunks no layout names (garbage collection).
    DropChunks(Vec<(Ino, u64, u32)>),
    /// Best-effort directory attribute update: link count change and mtime/ctime. Never
    /// fails and ignores locks (DESIGN.md: directory attributes may be updated
    /// asynchronously); a missing directory is skipped.
    TouchDir {
        /// The directory.
        dir: Ino,
        /// Link count change (subdirectories created or removed).
        nlink: i32,
        /// Time to set as mtime/ctime if newer.
        now: Time,
    },
    /// Reclaim unlinked files whose grace period is over (see `AdjustInode`): drop each
    /// inode that is still unlinked and that no open session is recorded on (a reader or
    /// writer still has it open; the leader ends expired ones first, in the same command),
    /// with its body and xattrs. Appended last: the log's encoding numbers variants by
    /// position.
    ReclaimUnlinked(Vec<Ino>),
    /// Record that the client request `id` (a rename, remove or link) is applied by this
    /// op list, so a copy of it sent again after a lost answer is answered as done.
    /// Precondition: not recorded yet (a copy that raced the first is refused as `Locked`
    /// and re-planned, and then finds the record).
    RecordRequest {
        /// The client's request id (never 0).
        id: u64,
        /// The inode the request named (the removed, moved or linked one).
        ino: Ino,
        /// Leader wall clock (ms) at proposal, for forgetting the record later.
        at_ms: u64,
    },
    /// Forget request records older than any client still waits for (garbage collection).
    ForgetRequests(Vec<u64>),
    /// Start (`renew` false) or renew an open session of a file until `until_ms` (leader
    /// wall clock): chunks whose write id carries the session are kept from the collector
    /// while it is held. A renewal is refused (EIO) once the session expired by `now_ms`
    /// or when it is unknown, so a writer cut off for longer than its lease fails loudly.
    HoldOpen {
        /// The file.
        ino: Ino,
        /// The session (`write_id >> 24` of its chunks).
        session: u64,
        /// Renew a held session rather than start one.
        renew: bool,
        /// Leader wall clock (ms) at proposal.
        now_ms: u64,
        /// Held until then (ms).
        until_ms: u64,
    },
    /// End open sessions (a writer done with its file, or sessions long expired).
    EndOpens(Vec<(Ino, u64)>),
    /// Precondition of a `CommitLayout` of `ino` in the same op list: the writer's view of
    /// the layout is of `generation` (0: unknown). If chunks that a later commit took out
    /// of the layout have been reclaimed since (`ReclaimDropped`), the writer may name
    /// only chunks of the current layout (refused with EIO otherwise): any other chunk it
    /// names may be gone. A commit without it is checked as one with 0.
    ExpectView {
        /// The file.
        ino: Ino,
        /// The generation the writer's layout came from.
        generation: u64,
    },
    /// Reclaim chunks that commits took out of the layout of `ino` (dropped-chunk records),
    /// all or none: refused unless each is recorded, was dropped at or before `before_ms`,
    /// is not named by the current layout, and no open session on the file is held at
    /// `now_ms` (a reader or writer that may still use them). Marks the file so a writer
    /// with an older view cannot name them again (`ExpectView`); the leader then drops
    /// the chunks where they are stored.
    ReclaimDropped {
        /// The file.
        ino: Ino,
        /// (write id, index) of each chunk.
        chunks: Vec<(u64, u32)>,
        /// The dropping commits' latest time (ms) allowed: the grace's end.
        before_ms: u64,
        /// Leader wall clock (ms) at proposal.
        now_ms: u64,
    },
    /// What a change of a file's contents or owner takes from it, as Linux's VFS does:
    /// its `security.capability` xattr, and with `setid` its set-user-ID bit and, if it is
    /// group-executable, its set-group-ID bit. Nothing for a directory (its set-group-ID
    /// bit is inheritance, not privilege) or an inode gone; ctime moves only if something
    /// went. (Last of the ops: a new variant keeps the log's encoding of the others.)
    DropPrivileges {
        /// The inode.
        ino: Ino,
        /// Clear the set-ID bits too.
        setid: bool,
        /// ctime to set if something went.
        now: Time,
    },
}

/// A command in a partition's Raft log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Apply an op list all-or-nothing on this partition.
    Atomic(Vec<Op>),
    /// Phase one of a multi-partition transaction: check the ops' preconditions, lock their
    /// keys and allocate their inos, or refuse.
    Prepare {
        /// The transaction.
        txid: TxId,
        /// This partition's share of it.
        ops: Vec<Op>,
        /// The coordinator's wall clock in ms at proposal. Recovery does not go by it (see
        /// `txn::Txns::recover_stale`); it stays in the record as written.
        at_ms: u64,
    },
    /// Record the coordinator's decision; the first decision recorded wins.
    Decide {
        /// The transaction.
        txid: TxId,
        /// Commit (true) or abort.
        commit: bool,
    },
    /// Phase two on a participant: apply (commit) or drop (abort) the prepared ops and
    /// release their locks. A no-op when the transaction is not prepared here.
    Finish {
        /// The transaction.
        txid: TxId,
        /// Commit (true) or abort.
        commit: bool,
    },
    /// Does nothing; proposed to commit an entry of the current term.
    Noop,
    /// Several commands merged into one proposal; each answers on its own.
    Batch(Vec<Command>),
}

impl Command {
    /// Approximate payload bytes (file data dominates), for bounding merged proposals.
    pub fn approx_bytes(&self) -> usize {
        let ops_bytes = |ops: &[Op]| -> usize {
            ops.iter()
                .map(|o| match o {
                    Op::WriteBody { data, .. } | Op::PutChunk { data, .. } => data.len() + 64,
                    _ => 64,
                })
                .sum()
        };
        match self {
            Command::Atomic(ops) | Command::Prepare { ops, .. } => ops_bytes(ops),
            Command::Batch(cmds) => cmds.iter().map(Command::approx_bytes).sum(),
            _ => 64,
        }
    }
}

/// The answer of an applied command.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// Nothing to report (membership entries, blanks, no-ops).
    #[default]
    None,
    /// An op list applied, or a transaction finished.
    Applied(Outcome),
    /// A transaction was prepared; the inos it allocated and the partition's epoch.
    Prepared {
        /// Inos allocated by the prepared `NewInode`s.
        new_inos: Vec<Ino>,
        /// The partition's namespace epoch.
        epoch: u64,
    },
    /// The recorded decision of a transaction.
    Decided(bool),
    /// The command was refused.
    Failed(ApplyError),
    /// Answers of a batch, in order.
    Batch(Vec<CommandResult>),
}

/// What an applied op list changed: the inodes it allocated and the attributes of every
/// inode it touched (`None`: deleted).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Inos allocated by `NewInode`s, in order.
    pub new_inos: Vec<Ino>,
    /// Attributes after the change, per touched inode.
    pub attrs: Vec<(Ino, Option<Attr>)>,
    /// The partition's namespace epoch after the change.
    pub epoch: u64,
}

impl Outcome {
    /// The attributes of `ino` after the change, if it was touched and still exists.
    pub fn attr(&self, ino: Ino) -> Option<&Attr> {
        self.attrs
            .iter()
            .rev()
            .find(|(i, _)| *i == ino)
            .and_then(|(_, a)| a.as_ref())
    }
}

/// Why a command was refused, in a form the log can carry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyError {
    /// A POSIX error for the user.
    Posix(i32, String),
    /// A transaction holds a key: retry shortly.
    Locked(String),
    /// The command's epoch is older than the partition's.
    StaleEpoch(u64),
    /// The command is malformed.
    Invalid(String),
}

impl ApplyError {
    /// A POSIX refusal.
    pub fn posix(errno: Errno, msg: impl Into<String>) -> ApplyError {
        ApplyError::Posix(errno.0, msg.into())
    }
}

impl From<ApplyError> for TalonError {
    fn from(e: ApplyError) -> TalonError {
        match e {
            ApplyError::Posix(errno, message) => TalonError::Posix {
                errno: Errno(errno),
                message,
            },
            ApplyError::Locked(m) => TalonError::Retry(m),
            ApplyError::StaleEpoch(epoch) => TalonError::StaleEpoch { epoch },
            ApplyError::Invalid(m) => TalonError::Invalid(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How bodies and chunks were declared in the log before they became `Bytes`.
    #[derive(Serialize, Deserialize)]
    struct VecBody {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    }

    #[derive(Serialize, Deserialize)]
    struct BytesBody {
        data: Bytes,
    }

    /// The log's entries keep their encoding: a node reads what an older build wrote, and
    /// the other way round.
    #[test]
    fn bytes_payloads_encode_as_the_vectors_they_replace() {
        for len in [0, 1, 127, 128, 70_000] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let old = crate::format::encode(&VecBody { data: data.clone() }).expect("encode");
            let new = crate::format::encode(&BytesBody {
                data: Bytes::from(data.clone()),
            })
            .expect("encode");
            assert_eq!(old, new, "{len} bytes");
            let back: BytesBody = crate::format::decode(&old).expect("decode");
            assert_eq!(back.data, data);
            let back: VecBody = crate::format::decode(&new).expect("decode");
            assert_eq!(back.data, data);
        }
    }
}
