//! Where a file's bytes are: a small file's whole body is one record on its inode's home
//! partition; a larger file is fixed-size chunks striped over the partitions. The server
//! stores this layout in the inode and answers it on `Open`; the client reads and writes
//! chunks by it. Both check it with [`Layout::check`], so a layout that names chunks past
//! the end of its file never reaches a Raft log or a read.
//!
//! The serde shape is part of Talon's stored format (the inode record and the
//! `CommitLayout` op carry it): `Small` and `Chunked` encode as `None` and `Some` of the
//! chunked fields did before the type moved here, which a test keeps true.

use crate::error::TalonError;
use serde::{Deserialize, Serialize};
use talon_proto::v1 as pb;

/// One chunk of a chunked layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// The open session that stored the chunk; 0 is a hole (reads as zeros).
    pub write_id: u64,
    /// Valid bytes in the chunk; bytes of the chunk past it read as zeros.
    pub len: u32,
}

impl ChunkRef {
    /// True when the chunk holds no data.
    pub fn is_hole(&self) -> bool {
        self.write_id == 0 || self.len == 0
    }
}

impl From<&pb::ChunkRef> for ChunkRef {
    fn from(c: &pb::ChunkRef) -> ChunkRef {
        ChunkRef {
            write_id: c.write_id,
            len: c.len,
        }
    }
}

impl From<&ChunkRef> for pb::ChunkRef {
    fn from(c: &ChunkRef) -> pb::ChunkRef {
        pb::ChunkRef {
            write_id: c.write_id,
            len: c.len,
        }
    }
}

/// Where a file's bytes are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    /// The whole body is one record on the inode's home partition (or the file is not a
    /// regular file).
    #[default]
    Small,
    /// Fixed-size chunks striped over the partitions.
    Chunked {
        /// Bytes per chunk (the last may be shorter).
        chunk_size: u32,
        /// Chunk `i` covers bytes `[i * chunk_size, (i + 1) * chunk_size)`; past the end of
        /// the list the file is a hole.
        chunks: Vec<ChunkRef>,
    },
}

impl Layout {
    /// Checks a layout for a file of `size` bytes: a chunked one has a non-zero chunk size,
    /// no chunk past the end of the file, no chunk longer than the chunk size, and no hole
    /// with a length.
    pub fn check(&self, size: u64) -> Result<(), TalonError> {
        let Layout::Chunked { chunk_size, chunks } = self else {
            return Ok(());
        };
        if *chunk_size == 0 {
            return Err(TalonError::Invalid(
                "chunked layout with chunk size 0".into(),
            ));
        }
        if chunks.len() as u64 > size.div_ceil(u64::from(*chunk_size)) {
            return Err(TalonError::Invalid(format!(
                "layout names {} chunks for {size} bytes",
                chunks.len()
            )));
        }
        if let Some(c) = chunks.iter().find(|c| c.len > *chunk_size) {
            return Err(TalonError::Invalid(format!(
                "chunk of {} bytes in a layout of {chunk_size}-byte chunks",
                c.len
            )));
        }
        if chunks.iter().any(|c| c.write_id == 0 && c.len != 0) {
            return Err(TalonError::Invalid("a hole with a length".into()));
        }
        Ok(())
    }

    /// Decodes and checks the wire layout of a file of `size` bytes (absent or not
    /// `chunked`: a small file).
    pub fn from_wire(l: Option<pb::Layout>, size: u64) -> Result<Layout, TalonError> {
        let Some(l) = l.filter(|l| l.chunked) else {
            return Ok(Layout::Small);
        };
        let layout = Layout::Chunked {
            chunk_size: l.chunk_size,
            chunks: l.chunks.iter().map(ChunkRef::from).collect(),
        };
        layout.check(size)?;
        Ok(layout)
    }

    /// The wire form (`chunked` false for a small file).
    pub fn to_wire(&self) -> pb::Layout {
        match self {
            Layout::Small => pb::Layout::default(),
            Layout::Chunked { chunk_size, chunks } => pb::Layout {
                chunked: true,
                chunk_size: *chunk_size,
                chunks: chunks.iter().map(pb::ChunkRef::from).collect(),
            },
        }
    }

    /// Cuts a chunked layout to a file of `size` bytes: chunks past the end are dropped and
    /// the last one's valid length shortened. Growing leaves the layout alone (the new
    /// bytes are a hole). A small layout is unchanged: its body is cut where it is stored.
    pub fn truncate(&mut self, size: u64) {
        let Layout::Chunked { chunk_size, chunks } = self else {
            return;
        };
        let cs = u64::from((*chunk_size).max(1));
        let keep = size.div_ceil(cs) as usize;
        chunks.truncate(keep);
        if let Some(last) = chunks.last_mut() {
            let valid = size - (keep as u64 - 1) * cs;
            last.len = last.len.min(valid as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(chunk_size: u32, lens: &[u32]) -> Option<pb::Layout> {
        Some(pb::Layout {
            chunked: true,
            chunk_size,
            chunks: lens
                .iter()
                .map(|l| pb::ChunkRef {
                    write_id: 1,
                    len: *l,
                })
                .collect(),
        })
    }

    #[test]
    fn layouts_are_checked() {
        assert_eq!(Layout::from_wire(None, 5).expect("small"), Layout::Small);
        assert!(Layout::from_wire(wire(0, &[]), 0).is_err());
        assert!(Layout::from_wire(wire(4, &[4, 4]), 5).is_ok());
        assert!(
            Layout::from_wire(wire(4, &[4, 4]), 4).is_err(),
            "chunk past the size"
        );
        assert!(
            Layout::from_wire(wire(4, &[5]), 4).is_err(),
            "chunk longer than chunks"
        );
        let hole = Layout::Chunked {
            chunk_size: 4,
            chunks: vec![ChunkRef {
                write_id: 0,
                len: 2,
            }],
        };
        assert!(hole.check(4).is_err(), "a hole with a length");
    }

    #[test]
    fn wire_round_trip() {
        let l = Layout::from_wire(wire(4, &[4, 1]), 5).expect("valid");
        assert_eq!(Layout::from_wire(Some(l.to_wire()), 5).expect("again"), l);
        assert_eq!(
            Layout::from_wire(Some(Layout::Small.to_wire()), 5).expect("small"),
            Layout::Small
        );
    }

    #[test]
    fn truncate_keeps_what_is_left() {
        let mut l = Layout::Chunked {
            chunk_size: 4,
            chunks: vec![
                ChunkRef {
                    write_id: 1,
                    len: 4
                };
                3
            ],
        };
        l.truncate(6);
        let Layout::Chunked { chunks, .. } = &l else {
            panic!("still chunked");
        };
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[1].len, 2);
        l.truncate(100);
        assert!(l.check(6).is_ok(), "growing changes nothing");
        let mut s = Layout::Small;
        s.truncate(0);
        assert_eq!(s, Layout::Small);
    }
}
