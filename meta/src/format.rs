//! The format of everything a node writes to disk or sends to another node: one codec and
//! one version number.
//!
//! Owns the codec (postcard, a maintained serde format) for stored records, Raft log
//! entries, snapshots and peer messages, the format version [`FORMAT`], and the check that
//! a store was written in that version. Every RocksDB a node opens carries its version under
//! one key ([`FORMAT_KEY`]); a store written in another version is refused at open with an
//! error naming both versions, never read as garbage. Peer messages carry the version in
//! their envelope (`RaftRequest.format`), checked by the receiving node.
//!
//! It must not know what it encodes: record shapes live with their owners (`apply`, `sm`,
//! `raft_log`, `types`).

use rocksdb::{IteratorMode, DB};
use serde::{Deserialize, Serialize};

/// The format this build writes and reads. Version 1 was the unversioned bincode encoding
/// of earlier releases; version 2 stored each chunk of a large file whole under one key,
/// version 3 in blocks (`keys::CHUNK_BLOCK`). Bump this whenever a stored or sent shape
/// changes.
pub const FORMAT: u32 = 3;

/// Older versions whose stores this build reads as they are: such a store is stamped with
/// [`FORMAT`] when this build opens it (so the older release refuses it from then on, rather
/// than misread what this one adds), and its records are read in their own shapes. A
/// version 2 store differs only in its chunks, which this build reads whole as before.
pub const UPGRADES_FROM: &[u32] = &[2];

/// The key under which every store records its format version (a big-endian `u32`). No
/// record shares it: a partition's keys begin with a letter, and the log's with a group
/// number and a tag that no scan of a group reaches. It travels with a partition's
/// snapshot (a checkpoint of the whole store).
pub const FORMAT_KEY: &[u8] = b"\x00talon-format";

/// Encodes a value in the current format, into a vector of its size: one that grew as the
/// value was written would copy what it held at each growth (a chunk's 4 MiB once more when
/// the fields after it are written).
pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, postcard::Error> {
    let size = postcard::experimental::serialized_size(v)?;
    postcard::to_io(v, Vec::with_capacity(size))
}

/// Decodes a value written in the current format. Every byte must belong to the value: a
/// record or message with bytes left over is not one this build wrote. The value may borrow
/// from `b` (a body read in place, see `records::BodyView`).
pub fn decode<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, DecodeError> {
    let (v, rest) = postcard::take_from_bytes(b)?;
    if !rest.is_empty() {
        return Err(DecodeError::Trailing(rest.len()));
    }
    Ok(v)
}

/// Why bytes are not a value of the expected shape.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not the shape's encoding.
    #[error(transparent)]
    Shape(#[from] postcard::Error),
    /// The value ended before the bytes did.
    #[error("{0} bytes left over after the value")]
    Trailing(usize),
}

/// A store or message in a format this build does not read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{what} is in format {found}, this build reads format {expected}; {hint}")]
pub struct FormatMismatch {
    /// What was checked (a store's path, a peer).
    pub what: String,
    /// The version found.
    pub found: u32,
    /// The version this build reads.
    pub expected: u32,
    /// What to do about it.
    pub hint: &'static str,
}

impl FormatMismatch {
    /// A mismatch with the hint fitting its direction.
    pub fn new(what: impl Into<String>, found: u32, expected: u32) -> FormatMismatch {
        let hint = if found > expected {
            "it was written by a newer release: run that release"
        } else {
            "it was written by an older release: run that release, or start from a new data \
             directory"
        };
        FormatMismatch {
            what: what.into(),
            found,
            expected,
            hint,
        }
    }
}

/// Why a store's format could not be confirmed.
#[derive(Debug, thiserror::Error)]
pub enum StoreFormatError {
    /// Written in another version.
    #[error(transparent)]
    Mismatch(#[from] FormatMismatch),
    /// RocksDB failed reading or writing the version.
    #[error("store format of {what}: {source}")]
    Rocks {
        /// The store.
        what: String,
        /// The failure.
        source: rocksdb::Error,
    },
    /// The version record is not a version.
    #[error("store format of {what}: the version record is {len} bytes, not 4")]
    Unreadable {
        /// The store.
        what: String,
        /// Its length.
        len: usize,
    },
}

/// Confirms that `db` (named `what` in errors) is in format `expected`: a new, empty store is
/// stamped with it; a store holding data but no version is version 1 (written before
/// versions were recorded); a store in a version of [`UPGRADES_FROM`] is stamped with
/// [`FORMAT`] when that is `expected`; anything else must match. Stores open through this
/// with [`FORMAT`].
pub fn check_store(db: &DB, what: &str, expected: u32) -> Result<(), StoreFormatError> {
    let rocks = |source| StoreFormatError::Rocks {
        what: what.to_string(),
        source,
    };
    let stamp = |version: u32| {
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(true);
        db.put_opt(FORMAT_KEY, version.to_be_bytes(), &wo)
            .map_err(rocks)
    };
    let found = match db.get(FORMAT_KEY).map_err(rocks)? {
        Some(b) => {
            let v: [u8; 4] = b
                .as_slice()
                .try_into()
                .map_err(|_| StoreFormatError::Unreadable {
                    what: what.to_string(),
                    len: b.len(),
                })?;
            u32::from_be_bytes(v)
        }
        None => {
            let empty = match db.iterator(IteratorMode::Start).next() {
                None => true,
                Some(r) => r.map(|_| false).map_err(rocks)?,
            };
            if !empty {
                1
            } else {
                stamp(expected)?;
                expected
            }
        }
    };
    if found != expected && expected == FORMAT && UPGRADES_FROM.contains(&found) {
        stamp(expected)?;
        tracing::info!("{what}: format {found} read as it is, stamped format {expected}");
        return Ok(());
    }
    if found != expected {
        return Err(FormatMismatch::new(what, found, expected).into());
    }
    Ok(())
}

/// Confirms a peer message's envelope version.
pub fn check_message(from: &str, found: u32) -> Result<(), FormatMismatch> {
    if found == FORMAT {
        Ok(())
    } else {
        Err(FormatMismatch::new(
            format!("a message from {from}"),
            found,
            FORMAT,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value is encoded as postcard encodes it, into a vector that never grew: a large
    /// body followed by more fields, and a small record.
    #[test]
    fn a_value_is_encoded_into_a_vector_of_its_size() {
        #[derive(Serialize)]
        struct Chunk {
            index: u32,
            #[serde(with = "serde_bytes")]
            data: Vec<u8>,
            at_ms: u64,
        }
        let chunk = Chunk {
            index: 7,
            data: vec![0xa5; 4 << 20],
            at_ms: u64::MAX,
        };
        for b in [
            encode(&chunk).expect("encode"),
            encode(&(3u8, "name")).expect("encode"),
        ] {
            assert_eq!(b.capacity(), b.len());
        }
        let b = encode(&chunk).expect("encode");
        assert_eq!(b, postcard::to_allocvec(&chunk).expect("postcard"));
    }

    #[test]
    fn a_new_store_is_stamped_and_then_accepted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = DB::open_default(dir.path()).expect("open");
        check_store(&db, "test store", FORMAT).expect("stamp");
        check_store(&db, "test store", FORMAT).expect("accept");
        assert_eq!(
            db.get(FORMAT_KEY).expect("get"),
            Some(FORMAT.to_be_bytes().to_vec())
        );
    }

    #[test]
    fn a_store_with_data_but_no_version_is_version_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = DB::open_default(dir.path()).expect("open");
        db.put(b"Mapplied", b"x").expect("put");
        let e = check_store(&db, "old store", FORMAT).expect_err("refused");
        let text = e.to_string();
        assert!(text.contains("format 1"), "{text}");
        assert!(text.contains(&format!("format {FORMAT}")), "{text}");
        assert!(text.contains("older release"), "{text}");
    }

    /// A store of a version this build reads is stamped with this build's on the way in,
    /// so the release that wrote it refuses it from then on.
    #[test]
    fn a_store_of_an_upgradable_version_is_stamped_and_accepted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = DB::open_default(dir.path()).expect("open");
        for &old in UPGRADES_FROM {
            db.put(FORMAT_KEY, old.to_be_bytes())
                .expect("stamp as the old release");
            check_store(&db, "old store", FORMAT).expect("read as it is");
            assert_eq!(
                db.get(FORMAT_KEY).expect("get"),
                Some(FORMAT.to_be_bytes().to_vec())
            );
            let e = check_store(&db, "old store", old).expect_err("the old release refuses it");
            assert!(e.to_string().contains("newer release"), "{e}");
        }
    }

    #[test]
    fn a_message_in_another_version_is_refused() {
        check_message("node 2", FORMAT).expect("same version");
        let e = check_message("node 2", FORMAT + 1).expect_err("newer");
        assert!(e.to_string().contains("newer release"), "{e}");
        let e = check_message("node 2", 0).expect_err("unversioned");
        assert_eq!(e.found, 0);
    }

    #[test]
    fn values_round_trip() {
        let v = (7u64, String::from("name"), vec![1u8, 2, 3], Some(-4i32));
        let b = encode(&v).expect("encode");
        let back: (u64, String, Vec<u8>, Option<i32>) = decode(&b).expect("decode");
        assert_eq!(back, v);
        assert!(decode::<(u64, String)>(&b[..2]).is_err());
        let mut longer = b.clone();
        longer.push(0);
        assert!(matches!(
            decode::<(u64, String, Vec<u8>, Option<i32>)>(&longer),
            Err(DecodeError::Trailing(1))
        ));
    }
}
