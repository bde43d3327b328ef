//! The client's side of the wire, the counterpart of the server's `service.rs`: request
//! headers and ids, and the conversions of replies into the client's types, each checked
//! on receipt so that a malformed reply is an `Invalid` error, never a panic.
//!
//! Requests themselves are built where they are sent (one `pb::*Request` per RPC method);
//! conversions of shared nouns (attributes, layouts, create and setattr requests, errors)
//! live with the noun in `talon-model`, and the cluster map's with its validation in
//! `cluster_map`. What this module must not do: route, retry, or touch the cache.

use crate::data::Opened;
use crate::router::ReadKind;
use crate::types::{DirEntry, PartitionStatus};
use talon_model::{Attr, FileKind, Ino, Layout, TalonError};
use talon_proto::v1 as pb;

/// A fresh id for one logical request (a create, rename, remove, link or xattr change). The
/// router sends the very same request again after a lost answer, so the server recognises
/// a copy of a request it already applied and answers it as done.
pub(crate) fn request_id() -> u64 {
    rand::random::<u64>().max(1)
}

/// Decodes the attributes a reply must carry.
pub(crate) fn attr_of(a: Option<pb::Attr>) -> Result<Attr, TalonError> {
    a.ok_or_else(|| TalonError::Invalid("reply without attributes".into()))?
        .try_into()
}

/// The header of a request to `partition`.
pub(crate) fn header(partition: u32, read: ReadKind, epoch: u64) -> Option<pb::RequestHeader> {
    Some(match read {
        ReadKind::RelaxedRead => pb::RequestHeader {
            partition,
            epoch: 0,
            relaxed_read: true,
        },
        // Served like a relaxed read (no ReadIndex), by the leader the router picks, and
        // checked against the client's epoch like a strict one.
        ReadKind::SessionRead => pb::RequestHeader {
            partition,
            epoch,
            relaxed_read: true,
        },
        _ => pb::RequestHeader {
            partition,
            epoch,
            relaxed_read: false,
        },
    })
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
            entries: p.entries,
            inodes: p.inodes,
        }
    }
}

impl TryFrom<pb::OpenReply> for Opened {
    type Error = TalonError;

    fn try_from(r: pb::OpenReply) -> Result<Opened, TalonError> {
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
}
