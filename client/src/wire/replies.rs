//! Reply messages, read into domain values: one function per reply message, named after
//! it, and `TryFrom`/`From` for the nouns replies carry (a directory entry, a partition's
//! status, the cluster map). Every field a reply must carry is checked here, so that a
//! malformed reply is an `Invalid` error, never a panic.

use crate::cluster_map::{
    ClusterMap, NodeInfo, PartitionInfo, DEFAULT_CHUNK_SIZE, DEFAULT_MAX_BATCH,
    DEFAULT_SMALL_FILE_MAX,
};
use crate::data::Opened;
use crate::types::{DirChange, DirEntry, NodeLoad, NodeSpace, PartitionStatus, StatFs};
use std::time::Duration;
use talon_model::{Attr, FileKind, Ino, Layout, TalonError};
use talon_proto::v1 as pb;
use talon_proto::v1::batch_result::Result as BatchOutcome;

/// A reply that carries the answering partition's namespace epoch beside what it is
/// about. The epoch is read apart from the rest: it holds even when the rest is malformed,
/// so a caller records it, and the change a write made, before it fails on the rest.
pub(crate) struct Stamped<T> {
    /// The namespace epoch at the answering partition.
    pub(crate) epoch: u64,
    /// The rest of the reply, checked.
    pub(crate) value: Result<T, TalonError>,
}

/// The attributes a reply must carry.
fn attr_of(a: Option<pb::Attr>) -> Result<Attr, TalonError> {
    a.ok_or_else(|| TalonError::Invalid("reply without attributes".into()))?
        .try_into()
}

/// `EntryReply` (to `Lookup`, `Create` and `Link`): the entry's attributes.
pub(crate) fn entry(r: pb::EntryReply) -> Stamped<Attr> {
    Stamped {
        epoch: r.epoch,
        value: attr_of(r.attr),
    }
}

/// `EntryReply` to `Create`: the entry's attributes and whether the create made it, with
/// the parent's attributes if the reply carries them.
pub(crate) fn created(mut r: pb::EntryReply) -> Stamped<DirChange<(Attr, bool)>> {
    let new = r.created;
    let dir = dir_after(r.parent.take());
    let Stamped { epoch, value } = entry(r);
    Stamped {
        epoch,
        value: value.map(|a| DirChange {
            value: (a, new),
            dir,
        }),
    }
}

/// The parent directory's attributes a create or remove reply may carry. Optional: one
/// that is malformed is as good as absent (the caller asks for them when it needs them).
fn dir_after(a: Option<pb::Attr>) -> Option<Attr> {
    a.and_then(|a| Attr::try_from(a).ok())
        .filter(|a| a.kind == FileKind::Directory)
}

/// `AttrReply`: the inode's attributes.
pub(crate) fn attr(r: pb::AttrReply) -> Result<Attr, TalonError> {
    attr_of(r.attr)
}

/// `RemoveReply`: the removed entry's ino and its link count after the removal, with the
/// parent's attributes if the reply carries them.
pub(crate) fn remove(r: pb::RemoveReply) -> DirChange<(Ino, u32)> {
    DirChange {
        value: (Ino(r.ino), r.nlink),
        dir: dir_after(r.parent),
    }
}

/// `RenameReply`: the namespace epoch after the rename.
pub(crate) fn rename(r: pb::RenameReply) -> u64 {
    r.epoch
}

/// `ReadDirReply`: one page of entries, and whether the partition may hold more after it.
pub(crate) fn read_dir(r: pb::ReadDirReply) -> Result<(Vec<DirEntry>, bool), TalonError> {
    let entries = r
        .entries
        .into_iter()
        .map(DirEntry::try_from)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((entries, r.more))
}

/// `GetXattrReply`: the value.
pub(crate) fn get_xattr(r: pb::GetXattrReply) -> Vec<u8> {
    r.value
}

/// `ListXattrReply`: the names.
pub(crate) fn list_xattr(r: pb::ListXattrReply) -> Vec<Vec<u8>> {
    r.names
}

/// `StatFsReply`: the answering node's id, and the partition's usage with that node's data
/// file system as its space (not yet summed over nodes or divided by the replication).
pub(crate) fn stat_fs(r: pb::StatFsReply) -> (u64, StatFs) {
    let usage = StatFs {
        inodes: r.inodes,
        bytes: r.bytes,
        entries: r.entries,
        space_total: r.fs_total_bytes,
        space_free: r.fs_free_bytes,
        space_avail: r.fs_avail_bytes,
    };
    (r.node_id, usage)
}

/// `StatusReply`: the node's partitions, its data file system, its memory and its log.
pub(crate) fn status(r: pb::StatusReply) -> (Vec<PartitionStatus>, NodeSpace, NodeLoad) {
    let load = NodeLoad {
        resident: r.memory_resident,
        peak_resident: r.memory_peak_resident,
        memtables: r.memory_memtables,
        cache: r.memory_cache,
        log_appends: r.log_appends,
        log_syncs: r.log_syncs,
    };
    let space = NodeSpace {
        level: r.space_level,
        used: r.space_used,
        total: r.space_total_bytes,
        usable: r.space_usable_bytes,
    };
    (
        r.partitions.into_iter().map(Into::into).collect(),
        space,
        load,
    )
}

/// `OpenReply` (to `Open` and `ReadWhole`): attributes, layout, and a small file's body
/// when it was asked for and sent, of exactly the file's size.
pub(crate) fn open(r: pb::OpenReply) -> Stamped<Opened> {
    Stamped {
        epoch: r.epoch,
        value: opened(r),
    }
}

fn opened(r: pb::OpenReply) -> Result<Opened, TalonError> {
    let attr = attr_of(r.attr)?;
    let layout = Layout::from_wire(r.layout, attr.size)?;
    let body = (r.has_body && layout == Layout::Small).then_some(r.body);
    if let Some(b) = &body {
        if b.len() as u64 != attr.size {
            return Err(TalonError::Invalid(format!(
                "inode {}: body of {} bytes for size {}",
                attr.ino,
                b.len(),
                attr.size
            )));
        }
    }
    Ok(Opened { attr, layout, body })
}

/// `GetChunkReply`: the bytes read (perhaps fewer than asked for, where the chunk ends).
pub(crate) fn get_chunk(r: pb::GetChunkReply) -> Vec<u8> {
    r.data
}

/// `BatchReply`: one result for each of the `ops` ops sent, in order; an op the reply
/// leaves out is an `Invalid` error.
pub(crate) fn batch(r: pb::BatchReply, ops: usize) -> Vec<Result<Attr, TalonError>> {
    let mut answers = r.results.into_iter();
    (0..ops)
        .map(|_| match answers.next().and_then(|r| r.result) {
            Some(BatchOutcome::Attr(a)) => attr_of(Some(a)),
            Some(BatchOutcome::Error(d)) => Err(TalonError::from_detail(d)),
            None => Err(TalonError::Invalid(
                "batch reply without this op's result".into(),
            )),
        })
        .collect()
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
            purged_index: p.purged_index,
            entries: p.entries,
            inodes: p.inodes,
        }
    }
}

/// The wire's 0 for a value the answering node left to the client's default.
fn or_default(v: u32, default: u32) -> u32 {
    if v == 0 {
        default
    } else {
        v
    }
}

/// The map field by field, the wire's zeros read as defaults and absent hints; then the
/// map's own checks (`ClusterMap::validated`), so only a valid map comes out.
impl TryFrom<pb::ClusterMap> for ClusterMap {
    type Error = TalonError;

    fn try_from(m: pb::ClusterMap) -> Result<Self, TalonError> {
        ClusterMap {
            nodes: m
                .nodes
                .into_iter()
                .map(|n| NodeInfo {
                    id: n.id,
                    addr: n.addr,
                })
                .collect(),
            partitions: m.partitions,
            replication: m.replication,
            partition_info: m
                .partition_info
                .into_iter()
                .map(|p| PartitionInfo {
                    id: p.id,
                    replicas: p.replicas,
                    leader_hint: (p.leader_hint != 0).then_some(p.leader_hint),
                })
                .collect(),
            strict_prefixes: m.strict_prefixes,
            epoch: m.epoch,
            relaxed_staleness: Duration::from_millis(m.relaxed_staleness_ms),
            root_ino: if m.root_ino == 0 {
                talon_model::ROOT_INO
            } else {
                Ino(m.root_ino)
            },
            max_batch: or_default(m.max_batch, DEFAULT_MAX_BATCH),
            small_file_max: or_default(m.small_file_max, DEFAULT_SMALL_FILE_MAX),
            chunk_size: or_default(m.chunk_size, DEFAULT_CHUNK_SIZE),
            chunk_gc_grace: Duration::from_millis(m.chunk_gc_grace_ms),
            unlinked_grace: Duration::from_millis(m.unlinked_grace_ms),
        }
        .validated()
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
            chunk_gc_grace_ms: 0,
            unlinked_grace_ms: 0,
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
