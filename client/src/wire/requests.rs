//! Request messages, built from domain values: one function per message of the `Namespace`
//! service, named after it, each setting every field the message has. A function here
//! only builds; the caller chooses the partition, the epoch and the request id, and sends.

use crate::router::ReadKind;
use crate::types::{CreateSpec, RenameFlags, SetAttr, XattrFlags};
use bytes::Bytes;
use talon_model::{ChunkRef, Class, Ino};
use talon_proto::v1 as pb;
use talon_proto::v1::batch_op::Op;

/// What a request's header says: the partition it is for, how it may be served, and the
/// namespace epoch of the client's cache when it was built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    partition: u32,
    read: ReadKind,
    epoch: u64,
}

impl Header {
    /// The header of a request to `partition`, served as `read` says, at `epoch`.
    pub(crate) fn new(partition: u32, read: ReadKind, epoch: u64) -> Header {
        Header {
            partition,
            read,
            epoch,
        }
    }

    fn wire(self) -> Option<pb::RequestHeader> {
        let Header {
            partition,
            read,
            epoch,
        } = self;
        Some(match read {
            ReadKind::RelaxedRead => pb::RequestHeader {
                partition,
                epoch: 0,
                relaxed_read: true,
                session_read: false,
            },
            // Served like a relaxed read (no ReadIndex), by the leader only (a follower
            // refuses it), and checked against the client's epoch like a strict one.
            ReadKind::SessionRead => pb::RequestHeader {
                partition,
                epoch,
                relaxed_read: true,
                session_read: true,
            },
            _ => pb::RequestHeader {
                partition,
                epoch,
                relaxed_read: false,
                session_read: false,
            },
        })
    }
}

/// A fresh id for one logical request (a create, rename, remove, link or xattr change). The
/// router sends the very same request again after a lost answer, so the server recognises
/// a copy of a request it already applied and answers it as done.
pub(crate) fn request_id() -> u64 {
    rand::random::<u64>().max(1)
}

/// `LookupRequest`: entry `name` of directory `parent`.
pub(crate) fn lookup(h: Header, parent: Ino, name: &[u8]) -> pb::LookupRequest {
    pb::LookupRequest {
        header: h.wire(),
        parent: parent.0,
        name: name.to_vec(),
    }
}

/// `GetAttrRequest`: the attributes of `ino`.
pub(crate) fn get_attr(h: Header, ino: Ino) -> pb::GetAttrRequest {
    pb::GetAttrRequest {
        header: h.wire(),
        ino: ino.0,
    }
}

/// `SetAttrRequest`: the change `set` to `ino` (its wire form lives with `SetAttr`).
pub(crate) fn set_attr(h: Header, ino: Ino, set: &SetAttr) -> pb::SetAttrRequest {
    set.to_request(h.wire(), ino)
}

/// `CreateRequest`: `name` in `parent` as `spec` says, owned by `owner` (uid, gid) unless
/// the spec names an owner (its wire form lives with `CreateSpec`).
pub(crate) fn create(
    h: Header,
    parent: Ino,
    name: &[u8],
    spec: &CreateSpec,
    owner: (u32, u32),
    request_id: u64,
) -> pb::CreateRequest {
    spec.to_request(h.wire(), parent, name, owner, request_id)
}

/// `RemoveRequest`: entry `name` of `parent`, with rmdir semantics when `directory`.
pub(crate) fn remove(
    h: Header,
    parent: Ino,
    name: &[u8],
    directory: bool,
    request_id: u64,
) -> pb::RemoveRequest {
    pb::RemoveRequest {
        header: h.wire(),
        parent: parent.0,
        name: name.to_vec(),
        directory,
        request_id,
    }
}

/// `RenameRequest`: `src_name` in `src_parent` to `dst_name` in `dst_parent`.
pub(crate) fn rename(
    h: Header,
    src_parent: Ino,
    src_name: &[u8],
    dst_parent: Ino,
    dst_name: &[u8],
    flags: RenameFlags,
    request_id: u64,
) -> pb::RenameRequest {
    pb::RenameRequest {
        header: h.wire(),
        src_parent: src_parent.0,
        src_name: src_name.to_vec(),
        dst_parent: dst_parent.0,
        dst_name: dst_name.to_vec(),
        flags: flags.bits(),
        request_id,
    }
}

/// `LinkRequest`: a new name `new_name` in `new_parent` for `ino`.
pub(crate) fn link(
    h: Header,
    ino: Ino,
    new_parent: Ino,
    new_name: &[u8],
    request_id: u64,
) -> pb::LinkRequest {
    pb::LinkRequest {
        header: h.wire(),
        ino: ino.0,
        new_parent: new_parent.0,
        new_name: new_name.to_vec(),
        request_id,
    }
}

/// `ReadDirRequest`: up to `limit` entries of `dir` after name `after` (empty: from the
/// start), with their attributes when `plus`.
pub(crate) fn read_dir(
    h: Header,
    dir: Ino,
    after: &[u8],
    limit: u32,
    plus: bool,
) -> pb::ReadDirRequest {
    pb::ReadDirRequest {
        header: h.wire(),
        dir: dir.0,
        after: after.to_vec(),
        limit,
        plus,
    }
}

/// `GetXattrRequest`: xattr `name` of `ino`.
pub(crate) fn get_xattr(h: Header, ino: Ino, name: &[u8]) -> pb::GetXattrRequest {
    pb::GetXattrRequest {
        header: h.wire(),
        ino: ino.0,
        name: name.to_vec(),
    }
}

/// `SetXattrRequest`: xattr `name` of `ino` set to `value`.
pub(crate) fn set_xattr(
    h: Header,
    ino: Ino,
    name: &[u8],
    value: &[u8],
    flags: XattrFlags,
    request_id: u64,
) -> pb::SetXattrRequest {
    pb::SetXattrRequest {
        header: h.wire(),
        ino: ino.0,
        name: name.to_vec(),
        value: value.to_vec(),
        flags: flags.bits(),
        request_id,
    }
}

/// `ListXattrRequest`: the xattr names of `ino`.
pub(crate) fn list_xattr(h: Header, ino: Ino) -> pb::ListXattrRequest {
    pb::ListXattrRequest {
        header: h.wire(),
        ino: ino.0,
    }
}

/// `RemoveXattrRequest`: xattr `name` of `ino`.
pub(crate) fn remove_xattr(
    h: Header,
    ino: Ino,
    name: &[u8],
    request_id: u64,
) -> pb::RemoveXattrRequest {
    pb::RemoveXattrRequest {
        header: h.wire(),
        ino: ino.0,
        name: name.to_vec(),
        request_id,
    }
}

/// `StatFsRequest`: the usage of the header's partition.
pub(crate) fn stat_fs(h: Header) -> pb::StatFsRequest {
    pb::StatFsRequest { header: h.wire() }
}

/// `SetClassRequest`: directory `ino` becomes of class `class`.
pub(crate) fn set_class(h: Header, ino: Ino, class: Class) -> pb::SetClassRequest {
    pb::SetClassRequest {
        header: h.wire(),
        ino: ino.0,
        class: pb::ConsistencyClass::from(class) as i32,
    }
}

/// `StatusRequest`: the answering node's status (no header: it is not for a partition).
pub(crate) fn status() -> pb::StatusRequest {
    pb::StatusRequest {}
}

/// `ClusterMapRequest`: the answering node's cluster map.
pub(crate) fn cluster_map() -> pb::ClusterMapRequest {
    pb::ClusterMapRequest {}
}

/// `ReadWholeRequest`: entry `name` of `parent` with its attributes, layout and, for a
/// small file, body.
pub(crate) fn read_whole(h: Header, parent: Ino, name: &[u8]) -> pb::ReadWholeRequest {
    pb::ReadWholeRequest {
        header: h.wire(),
        parent: parent.0,
        name: name.to_vec(),
    }
}

/// `OpenRequest`: the attributes and layout of `ino`, and a small file's body if
/// `want_body`.
pub(crate) fn open(h: Header, ino: Ino, want_body: bool) -> pb::OpenRequest {
    pb::OpenRequest {
        header: h.wire(),
        ino: ino.0,
        want_body,
    }
}

/// `WriteSmallRequest`: `body` becomes the whole contents of `ino`, if it is at
/// `expect_generation` (0: whatever its generation), clearing its set-ID bits if
/// `drop_setid`.
pub(crate) fn write_small(
    h: Header,
    ino: Ino,
    body: Bytes,
    expect_generation: u64,
    drop_setid: bool,
) -> pb::WriteSmallRequest {
    pb::WriteSmallRequest {
        header: h.wire(),
        ino: ino.0,
        body,
        expect_generation,
        drop_setid,
    }
}

/// `PutChunkRequest`: `data` stored as chunk `index` of `ino` under `write_id`.
pub(crate) fn put_chunk(
    h: Header,
    ino: Ino,
    write_id: u64,
    index: u32,
    data: Bytes,
) -> pb::PutChunkRequest {
    pb::PutChunkRequest {
        header: h.wire(),
        ino: ino.0,
        write_id,
        index,
        data,
    }
}

/// `GetChunkRequest`: `length` bytes at `offset` of chunk `index` of `ino`, stored under
/// `write_id`.
pub(crate) fn get_chunk(
    h: Header,
    ino: Ino,
    write_id: u64,
    index: u32,
    offset: u32,
    length: u32,
) -> pb::GetChunkRequest {
    pb::GetChunkRequest {
        header: h.wire(),
        ino: ino.0,
        write_id,
        index,
        offset,
        length,
    }
}

/// `CommitLayoutRequest`: `chunks` of `chunk_size` become the contents of `ino`, `size`
/// bytes long, if it is at `expect_generation` (0: whatever its generation) and, when
/// `open_session` is nonzero, while that open session is held. `view` is the generation
/// the writer's list of chunks started from (`u64::MAX`: all stored for this commit).
/// `drop_setid` as in [`write_small`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn commit_layout(
    h: Header,
    ino: Ino,
    size: u64,
    chunk_size: u32,
    chunks: &[ChunkRef],
    expect_generation: u64,
    open_session: u64,
    view: u64,
    drop_setid: bool,
) -> pb::CommitLayoutRequest {
    pb::CommitLayoutRequest {
        header: h.wire(),
        ino: ino.0,
        size,
        chunk_size,
        chunks: chunks.iter().map(pb::ChunkRef::from).collect(),
        expect_generation,
        open_session,
        view_generation: view,
        drop_setid,
    }
}

/// `HoldOpenRequest`: start, renew or end open session `session` of `ino`.
pub(crate) fn hold_open(
    h: Header,
    ino: Ino,
    session: u64,
    renew: bool,
    end: bool,
) -> pb::HoldOpenRequest {
    pb::HoldOpenRequest {
        header: h.wire(),
        ino: ino.0,
        session,
        renew,
        end,
    }
}

/// One op of a `Batch`, built once and sent as often as the batch is (the very same
/// request id each time).
#[derive(Clone, Debug)]
pub(crate) struct BatchOp(Op);

/// A batch's create, as [`create`] (the batch's header routes it; this one is ignored).
pub(crate) fn batch_create(
    h: Header,
    parent: Ino,
    name: &[u8],
    spec: &CreateSpec,
    owner: (u32, u32),
    request_id: u64,
) -> BatchOp {
    BatchOp(Op::Create(create(h, parent, name, spec, owner, request_id)))
}

/// A batch's lookup of `name` in `parent`, without a header of its own (the batch's
/// routes it).
pub(crate) fn batch_lookup(parent: Ino, name: &[u8]) -> BatchOp {
    BatchOp(Op::Lookup(pb::LookupRequest {
        header: None,
        parent: parent.0,
        name: name.to_vec(),
    }))
}

/// A batch's getattr of `ino`, without a header of its own (the batch's routes it).
pub(crate) fn batch_get_attr(ino: Ino) -> BatchOp {
    BatchOp(Op::Getattr(pb::GetAttrRequest {
        header: None,
        ino: ino.0,
    }))
}

/// `BatchRequest`: `ops`, in order, all for the header's partition.
pub(crate) fn batch<'a>(h: Header, ops: impl IntoIterator<Item = &'a BatchOp>) -> pb::BatchRequest {
    pb::BatchRequest {
        header: h.wire(),
        ops: ops
            .into_iter()
            .map(|op| pb::BatchOp {
                op: Some(op.0.clone()),
            })
            .collect(),
    }
}
