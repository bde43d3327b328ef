//! The values a partition stores, beside the keys of `keys.rs`: entries, inodes, bodies,
//! chunks, request records and prepared transactions; their encoding (through `format`),
//! and `Fatal`, what a store that cannot be read or written means for the node.
//!
//! It only describes records: reading them is `view.rs`, changing them `apply.rs`.

use crate::types::Op;
use serde::{Deserialize, Serialize};
use talon_model::{Attr, FileKind, Ino, Layout};

/// A directory entry's value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dentry {
    /// The inode it names.
    pub ino: Ino,
    /// The inode's kind, so readdir needs no inode read.
    pub kind: FileKind,
}

/// An inode record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeRec {
    /// Attributes.
    pub attr: Attr,
    /// Symlink target; empty for other kinds.
    pub symlink: Vec<u8>,
    /// Retry token of the request that created it (0: none), so a retried create can
    /// recognise its own earlier success.
    pub creator: u64,
    /// Where the file's bytes are: a small file's body is a `BodyRec`; a chunked file's
    /// chunks are `ChunkRec`s.
    pub layout: Layout,
}

/// A small file's body in the packed store, with its checksum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyRec {
    /// CRC32C of `data`.
    pub crc: u32,
    /// The contents (may be shorter than the file's size: the tail reads as zeros).
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// True if `data` still matches `crc`, the CRC32C that every stored body and chunk
/// carries ([`BodyRec`], [`BodyView`], [`ChunkView`]).
fn crc_matches(data: &[u8], crc: u32) -> bool {
    crc32c::crc32c(data) == crc
}

/// A [`BodyRec`] as stored, its data borrowed from the stored bytes: what a read that
/// returns the body decodes, so the body is copied out of the store once, not twice; and
/// what the apply encodes a new body from, without a copy of its own.
#[derive(Debug, Serialize, Deserialize)]
pub struct BodyView<'a> {
    /// CRC32C of `data`.
    pub crc: u32,
    /// The contents.
    #[serde(borrow, with = "serde_bytes")]
    pub data: &'a [u8],
}

impl BodyView<'_> {
    /// True if the data still matches its checksum.
    pub fn verify(&self) -> bool {
        crc_matches(self.data, self.crc)
    }
}

/// A chunk of a large file, with its checksum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRec {
    /// CRC32C of `data`.
    pub crc: u32,
    /// When it was written (leader wall clock, ms).
    pub at_ms: u64,
    /// The contents.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// A rename, remove or link applied on behalf of a client request (`keys::request`):
/// stored as the proposal's time (u64 ms) then the inode the request named, both
/// little-endian, so the collector reads the time as it does other timed records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestRec {
    /// Leader wall clock (ms) when the request was proposed.
    pub at_ms: u64,
    /// The inode the request named.
    pub ino: Ino,
}

impl RequestRec {
    /// The stored form.
    pub fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16);
        b.extend_from_slice(&self.at_ms.to_le_bytes());
        b.extend_from_slice(&self.ino.0.to_le_bytes());
        b
    }

    /// Decodes the stored form.
    pub fn from_bytes(b: &[u8]) -> Result<RequestRec, Fatal> {
        let word = |at: usize| -> Result<u64, Fatal> {
            b.get(at..at + 8)
                .and_then(|w| <[u8; 8]>::try_from(w).ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| Fatal::Corrupt(format!("request record of {} bytes", b.len())))
        };
        Ok(RequestRec {
            at_ms: word(0)?,
            ino: Ino(word(8)?),
        })
    }
}

impl BodyRec {
    /// A body with its checksum.
    pub fn new(data: Vec<u8>) -> BodyRec {
        BodyRec {
            crc: crc32c::crc32c(&data),
            data,
        }
    }

    /// True if the data still matches its checksum.
    pub fn verify(&self) -> bool {
        crc_matches(&self.data, self.crc)
    }
}

/// A [`ChunkRec`] as stored, its data borrowed from the stored bytes: a chunk read copies
/// out only the range asked for, and the apply encodes a new chunk from the command's
/// bytes without a copy of its own.
#[derive(Debug, Serialize, Deserialize)]
pub struct ChunkView<'a> {
    /// CRC32C of `data`.
    pub crc: u32,
    /// When it was written (leader wall clock, ms).
    pub at_ms: u64,
    /// The contents.
    #[serde(borrow, with = "serde_bytes")]
    pub data: &'a [u8],
}

impl ChunkView<'_> {
    /// True if the data still matches its checksum.
    pub fn verify(&self) -> bool {
        crc_matches(self.data, self.crc)
    }
}

/// A chunk's write-time record (`keys::chunk_time`): when it was written (leader wall
/// clock, ms), then how many blocks hold it (`keys::chunk_block`), both little-endian, so
/// the collector reads the time as it does other timed records. A format 2 record holds
/// the time alone: that chunk is stored whole under `keys::chunk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkTime {
    /// When the chunk was written (ms).
    pub at_ms: u64,
    /// Its blocks; 0 for a chunk stored whole.
    pub blocks: u32,
}

impl ChunkTime {
    /// The stored form.
    pub fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(12);
        b.extend_from_slice(&self.at_ms.to_le_bytes());
        b.extend_from_slice(&self.blocks.to_le_bytes());
        b
    }

    /// Decodes the stored form, either version's.
    pub fn from_bytes(b: &[u8]) -> Result<ChunkTime, Fatal> {
        let bad = || Fatal::Corrupt(format!("chunk time record of {} bytes", b.len()));
        let at: [u8; 8] = b.get(..8).and_then(|w| w.try_into().ok()).ok_or_else(bad)?;
        let blocks = match b.get(8..) {
            Some([]) => 0,
            Some(w) => u32::from_le_bytes(w.try_into().map_err(|_| bad())?),
            None => return Err(bad()),
        };
        Ok(ChunkTime {
            at_ms: u64::from_le_bytes(at),
            blocks,
        })
    }
}

/// A prepared transaction's record on a participant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedRec {
    /// The ops to apply at commit.
    pub ops: Vec<Op>,
    /// Inos allocated at prepare for the ops' `NewInode`s.
    pub new_inos: Vec<Ino>,
    /// Lock keys held.
    pub locks: Vec<Vec<u8>>,
    /// Proposal time (the coordinator's wall clock, ms); recovery goes by the monotonic
    /// clock of the partition's leader instead (see `txn::Txns::recover_stale`).
    pub at_ms: u64,
}

/// Storage failures and corrupt records: the node cannot go on applying.
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    /// RocksDB failed.
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// A stored record does not decode.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The store was written in a format this build does not read.
    #[error(transparent)]
    Format(#[from] crate::format::StoreFormatError),
}

/// A storage failure seen on a read path. Corrupt data is an I/O error for the caller
/// (another replica would answer the same for replicated corruption, and retrying cannot
/// help); anything else means this node cannot serve: retry elsewhere.
pub fn storage_error(e: Fatal) -> talon_model::TalonError {
    use talon_model::TalonError;
    tracing::error!("storage: {e}");
    match &e {
        Fatal::Rocks(r) if r.kind() == rocksdb::ErrorKind::Corruption => {
            TalonError::posix(talon_model::Errno::EIO, format!("corrupt data: {e}"))
        }
        Fatal::Corrupt(_) => {
            TalonError::posix(talon_model::Errno::EIO, format!("corrupt data: {e}"))
        }
        _ => TalonError::Unavailable(format!("storage: {e}")),
    }
}

/// Encodes a value for storage.
pub fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    // Encoding our own plain structs cannot fail (no sequences of unknown length); an
    // empty value would be caught by the decoder on read.
    crate::format::encode(v).unwrap_or_default()
}

/// Decodes a stored value (which may borrow from `b`).
pub fn dec<'a, T: Deserialize<'a>>(b: &'a [u8], what: &str) -> Result<T, Fatal> {
    crate::format::decode(b).map_err(|e| Fatal::Corrupt(format!("decode {what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::fresh_attr;
    use talon_model::{ChunkRef, Class, Time};

    /// The chunked layout as stored before `Layout` moved to the model: a struct that the
    /// inode record held in an `Option`.
    #[derive(Serialize)]
    struct OldLayout {
        chunk_size: u32,
        chunks: Vec<ChunkRef>,
    }

    fn chunks() -> Vec<ChunkRef> {
        vec![
            ChunkRef {
                write_id: 7,
                len: 4096,
            },
            ChunkRef {
                write_id: 0,
                len: 0,
            },
        ]
    }

    /// The apply encodes bodies and chunks from borrowed views: they store the same bytes
    /// as the owned records, which every read decodes.
    #[test]
    fn views_encode_as_the_records() {
        let data: Vec<u8> = (0..5000).map(|i| (i % 253) as u8).collect();
        let body = BodyRec::new(data.clone());
        let view = BodyView {
            crc: body.crc,
            data: &data,
        };
        assert_eq!(enc(&view), enc(&body));
        let chunk = ChunkRec {
            crc: 9,
            at_ms: 1234,
            data: data.clone(),
        };
        let view = ChunkView {
            crc: 9,
            at_ms: 1234,
            data: &data,
        };
        assert_eq!(enc(&view), enc(&chunk));
    }

    /// A chunk's time record reads back in this format and in format 2's (the time alone).
    #[test]
    fn chunk_times_read_in_either_format() {
        let t = ChunkTime {
            at_ms: 1_700_000_000_123,
            blocks: 64,
        };
        assert_eq!(ChunkTime::from_bytes(&t.to_bytes()).expect("decodes"), t);
        let old = ChunkTime::from_bytes(&t.at_ms.to_le_bytes()).expect("format 2");
        assert_eq!((old.at_ms, old.blocks), (t.at_ms, 0));
        for bad in [&[1u8; 7][..], &[1u8; 11][..], &[1u8; 13][..]] {
            assert!(ChunkTime::from_bytes(bad).is_err(), "{} bytes", bad.len());
        }
    }

    /// Moving `Layout` into the model kept the stored bytes: inode records and
    /// `CommitLayout` ops written before read the same after, within one format version.
    #[test]
    fn layout_encoding_is_unchanged() {
        let attr = fresh_attr(
            FileKind::Regular,
            0o644,
            1,
            2,
            0,
            5000,
            Class::Relaxed,
            Ino(1),
            Time { secs: 1, nanos: 0 },
        );
        for (layout, old) in [
            (Layout::Small, None),
            (
                Layout::Chunked {
                    chunk_size: 4096,
                    chunks: chunks(),
                },
                Some(OldLayout {
                    chunk_size: 4096,
                    chunks: chunks(),
                }),
            ),
        ] {
            let rec = InodeRec {
                attr: attr.clone(),
                symlink: Vec::new(),
                creator: 9,
                layout,
            };
            let before = enc(&(&attr, Vec::<u8>::new(), 9u64, old));
            assert_eq!(enc(&rec), before);
            assert_eq!(dec::<InodeRec>(&before, "inode").expect("decodes"), rec);
        }
        let now = Time { secs: 2, nanos: 5 };
        let op = enc(&Op::CommitLayout {
            ino: Ino(3),
            size: 4097,
            chunk_size: 4096,
            chunks: chunks(),
            expect_generation: 5,
            now,
        });
        // An enum variant is its index (one varint byte here) and then its fields in order.
        let old_fields = enc(&(
            Ino(3),
            4097u64,
            OldLayout {
                chunk_size: 4096,
                chunks: chunks(),
            },
            5u64,
            now,
        ));
        assert_eq!(op[1..], old_fields[..]);
    }

    /// A stored body decodes in place as a `BodyView` borrowing the stored bytes, with the
    /// same checksum and data, and a changed byte fails its check.
    #[test]
    fn a_body_view_reads_a_stored_body_in_place() {
        let rec = BodyRec::new((0..300u32).map(|i| (i * 7) as u8).collect());
        let stored = enc(&rec);
        let view: BodyView = dec(&stored, "body").expect("decode");
        assert_eq!((view.crc, view.data), (rec.crc, rec.data.as_slice()));
        assert!(view.verify());
        assert!(stored.as_ptr_range().contains(&view.data.as_ptr()));
        let mut bad = stored.clone();
        if let Some(b) = bad.last_mut() {
            *b ^= 1;
        }
        let view: BodyView = dec(&bad, "body").expect("decode");
        assert!(!view.verify());
    }
}
