//! The key-value seam under the state machine's reads: what a [`View`](crate::view::View)
//! needs of a store (point reads and ordered key scans), implemented by a partition's
//! RocksDB, by a RocksDB snapshot, and by [`MemKv`], an ordered map in memory, so the
//! applier, its checks and its locks run in unit tests without a database.
//!
//! Writes do not pass through the trait: a command stages them in an [`Overlay`], which the
//! state machine writes to RocksDB in one batch (`sm.rs`) and a test writes to a `MemKv`
//! with [`MemKv::write`]. This module knows
//! nothing of what the keys mean (that is `keys.rs`).

use crate::records::Fatal;
use std::collections::BTreeMap;

/// Staged writes: key → Some(value) to put, None to delete.
pub type Overlay = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// A RocksDB write batch with room for `records` records of `bytes` key and value bytes in
/// all: filled, it never grows its buffer, which copies what it holds at each growth (a
/// chunk's 4 MiB once or twice more).
pub fn batch_with_room(records: usize, bytes: usize) -> rocksdb::WriteBatch {
    // A 12-byte header, then per record a type byte and two varint32 lengths of at most 5.
    rocksdb::WriteBatch::with_capacity_bytes(12 + bytes + records * 11)
}

/// A store a view reads from.
pub trait Kv {
    /// The value of `k`, the store's own checksums verified.
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, Fatal>;

    /// Calls `read` with the value of `k` where the store holds it, without copying it out
    /// (RocksDB pins its block or blob for the call); false, and `read` not called, if `k`
    /// is absent. For a value that carries a checksum of its own, which the caller verifies
    /// (a small file's body, a chunk): the store skips its own checks. RocksDB's CRC32C over
    /// every 110 KB body, in software then, cost about 6 % of the server's CPU in a warm
    /// image epoch, for bytes the caller checks anyway.
    fn read_in_place(&self, k: &[u8], read: &mut dyn FnMut(&[u8])) -> Result<bool, Fatal>;

    /// Calls `visit` with each key at or after `from`, in key order, until it returns false.
    fn scan_keys(&self, from: &[u8], visit: &mut dyn FnMut(&[u8]) -> bool) -> Result<(), Fatal>;
}

fn read_options(verify: bool) -> rocksdb::ReadOptions {
    let mut opts = rocksdb::ReadOptions::default();
    opts.set_verify_checksums(verify);
    opts
}

fn scan(
    mut it: rocksdb::DBRawIterator<'_>,
    from: &[u8],
    visit: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<(), Fatal> {
    it.seek(from);
    while let Some(k) = it.key() {
        if !visit(k) {
            break;
        }
        it.next();
    }
    it.status()?;
    Ok(())
}

impl Kv for rocksdb::DB {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, Fatal> {
        Ok(self.get_opt(k, &read_options(true))?)
    }

    fn read_in_place(&self, k: &[u8], read: &mut dyn FnMut(&[u8])) -> Result<bool, Fatal> {
        let v = self.get_pinned_opt(k, &read_options(false))?;
        Ok(v.map(|v| read(&v)).is_some())
    }

    fn scan_keys(&self, from: &[u8], visit: &mut dyn FnMut(&[u8]) -> bool) -> Result<(), Fatal> {
        scan(self.raw_iterator(), from, visit)
    }
}

/// A snapshot: every read sees one point in time, so reads of several keys (an inode and
/// its body) are consistent with each other.
impl Kv for rocksdb::Snapshot<'_> {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, Fatal> {
        Ok(self.get_opt(k, read_options(true))?)
    }

    fn read_in_place(&self, k: &[u8], read: &mut dyn FnMut(&[u8])) -> Result<bool, Fatal> {
        let v = self.get_pinned_opt(k, read_options(false))?;
        Ok(v.map(|v| read(&v)).is_some())
    }

    fn scan_keys(&self, from: &[u8], visit: &mut dyn FnMut(&[u8]) -> bool) -> Result<(), Fatal> {
        scan(self.raw_iterator(), from, visit)
    }
}

/// An ordered map in memory, for unit tests of the deterministic core.
#[derive(Debug, Clone, Default)]
pub struct MemKv(BTreeMap<Vec<u8>, Vec<u8>>);

impl MemKv {
    /// Writes staged puts and deletes, as the state machine writes a batch.
    pub fn write(&mut self, writes: Overlay) {
        for (k, v) in writes {
            match v {
                Some(v) => self.0.insert(k, v),
                None => self.0.remove(&k),
            };
        }
    }

    /// Number of keys stored.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Kv for MemKv {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, Fatal> {
        Ok(self.0.get(k).cloned())
    }

    fn read_in_place(&self, k: &[u8], read: &mut dyn FnMut(&[u8])) -> Result<bool, Fatal> {
        Ok(self.0.get(k).map(|v| read(v)).is_some())
    }

    fn scan_keys(&self, from: &[u8], visit: &mut dyn FnMut(&[u8]) -> bool) -> Result<(), Fatal> {
        for k in self.0.range(from.to_vec()..).map(|(k, _)| k) {
            if !visit(k) {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(kv: &dyn Kv, from: &[u8], prefix: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        kv.scan_keys(from, &mut |k| {
            let more = k.starts_with(prefix);
            if more {
                out.push(k.to_vec());
            }
            more
        })
        .expect("scan");
        out
    }

    /// The in-memory store answers as RocksDB does, for the same writes.
    #[test]
    fn memory_and_rocksdb_agree() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = rocksdb::DB::open_default(dir.path()).expect("open");
        let mut mem = MemKv::default();
        let mut writes = Overlay::new();
        for k in [&b"a/1"[..], b"a/2", b"a/3", b"b/1", b"a"] {
            writes.insert(k.to_vec(), Some(k.iter().rev().copied().collect()));
        }
        writes.insert(b"a/2".to_vec(), None);
        for (k, v) in &writes {
            match v {
                Some(v) => db.put(k, v).expect("put"),
                None => db.delete(k).expect("delete"),
            }
        }
        mem.write(writes);
        assert_eq!(mem.len(), 4);
        let snap = db.snapshot();
        for kv in [&db as &dyn Kv, &snap, &mem] {
            assert_eq!(kv.get(b"a/1").expect("get"), Some(b"1/a".to_vec()));
            assert_eq!(kv.get(b"a/2").expect("get"), None);
            assert_eq!(keys(kv, b"a/", b"a/"), [b"a/1".to_vec(), b"a/3".to_vec()]);
            assert_eq!(keys(kv, b"a/2", b"a/"), [b"a/3".to_vec()]);
            assert!(keys(kv, b"c", b"c").is_empty());
            let mut seen = Vec::new();
            assert!(kv
                .read_in_place(b"a/3", &mut |v| seen = v.to_vec())
                .expect("read"));
            assert_eq!(seen, b"3/a");
            assert!(!kv
                .read_in_place(b"a/2", &mut |_| panic!("read of an absent key"))
                .expect("read"));
        }
    }
}
