//! The key schema of a partition's state machine (one RocksDB per partition replica).
//!
//! Every key starts with a one-byte table tag; integers are big-endian so keys sort by
//! number, and a directory's entries (`D` ‖ parent ‖ name) are one contiguous prefix, so a
//! readdir is a prefix scan in name order.
//!
//! | tag | key                  | value                                   |
//! |-----|----------------------|-----------------------------------------|
//! | `D` | parent ‖ name        | `Dentry` (ino, kind)                    |
//! | `I` | ino                  | `InodeRec` (attributes, symlink target)  |
//! | `X` | ino ‖ name           | xattr value                             |
//! | `T` | dir ino              | tombstone of a removed directory        |
//! | `V` | dir ino              | class of a live directory seen here      |
//! | `L` | locked key           | `TxId` of the prepared transaction       |
//! | `P` | coordinator ‖ id     | `Prepared` record of a transaction       |
//! | `C` | coordinator ‖ id     | decision of a coordinated transaction    |
//! | `B` | ino                  | `BodyRec`: a small file's whole body    |
//! | `K` | ino ‖ write id ‖ idx ‖ block | `ChunkView`: one block of a chunk of a large file ([`CHUNK_BLOCK`] bytes, the last one fewer) |
//! | `K` | ino ‖ write id ‖ idx | `ChunkView`: a whole chunk, as format 2 stored it |
//! | `W` | ino ‖ write id ‖ idx | `ChunkTime`: when the chunk was written (u64 ms), its blocks |
//! | `U` | ino                  | when the file lost its last name (u64 ms)|
//! | `R` | request id           | `RequestRec`: a rename, remove or link applied (ms, ino) |
//! | `H` | ino ‖ session        | an open session held until then (u64 ms) |
//! | `M` | name                 | partition metadata (applied, epoch, ...) |
//!
//! Lock keys (`L` ‖ k) name the key they protect: a dentry or inode key, `F` ‖ dir for an
//! rmdir fence on a directory's children, or `E` for the epoch (directory renames).

use crate::types::TxId;
use talon_model::Ino;

/// Table tags.
pub mod tag {
    /// Directory entries.
    pub const DENTRY: u8 = b'D';
    /// Inodes.
    pub const INODE: u8 = b'I';
    /// Extended attributes.
    pub const XATTR: u8 = b'X';
    /// Tombstones of removed directories.
    pub const TOMBSTONE: u8 = b'T';
    /// Live directories known to this partition.
    pub const LIVE_DIR: u8 = b'V';
    /// Locks held by prepared transactions.
    pub const LOCK: u8 = b'L';
    /// Prepared transactions.
    pub const PREPARED: u8 = b'P';
    /// Decisions of coordinated transactions.
    pub const DECISION: u8 = b'C';
    /// Partition metadata.
    pub const META: u8 = b'M';
    /// Small-file bodies.
    pub const BODY: u8 = b'B';
    /// Chunks of large files.
    pub const CHUNK: u8 = b'K';
    /// Write times of chunks (small records the collector scans instead of the chunks).
    pub const CHUNK_TIME: u8 = b'W';
    /// Unlinked files kept readable for a grace period, with the time they were unlinked.
    pub const UNLINKED: u8 = b'U';
    /// Renames, removes and links applied, by their client's request id, so a request sent
    /// again after a lost answer is answered as done instead of being applied twice.
    pub const REQUEST: u8 = b'R';
    /// Open sessions held on files, with the time (ms) until which each is held.
    pub const WRITE_HOLD: u8 = b'H';
    /// Chunks a commit took out of a file's layout (an `O_TRUNC` rewrite, an overwrite, a
    /// truncate), with the commit's time and the generation it made: kept on the file's
    /// home until they are reclaimed or named again.
    pub const DROPPED: u8 = b'O';
    /// Per file, the newest generation whose dropped chunks were reclaimed: a writer whose
    /// view of the layout is older may not name chunks outside the current layout.
    pub const RECLAIMED_GEN: u8 = b'G';
}

/// Bits of a chunk's write id below its open session (`write_id >> SESSION_SHIFT`).
pub const SESSION_SHIFT: u32 = 24;

/// Key of an open session held on `ino`.
pub fn open_hold(ino: Ino, session: u64) -> Vec<u8> {
    let mut k = with_ino(tag::WRITE_HOLD, ino);
    k.extend_from_slice(&session.to_be_bytes());
    k
}

/// The prefix of every open session held on `ino`.
pub fn open_hold_prefix(ino: Ino) -> Vec<u8> {
    with_ino(tag::WRITE_HOLD, ino)
}

/// Decodes an open session's key into (ino, session).
pub fn open_hold_of(key: &[u8]) -> Option<(Ino, u64)> {
    let ino = ino_at(key, 1)?;
    let b: [u8; 8] = key.get(9..17)?.try_into().ok()?;
    Some((ino, u64::from_be_bytes(b)))
}

/// Key of an applied request's record.
pub fn request(id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(tag::REQUEST);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// Decodes the request id of a request record's key.
pub fn request_of(key: &[u8]) -> Option<u64> {
    let b: [u8; 8] = key.get(1..9)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

/// Key of an unlinked file's record (kept until it is reclaimed).
pub fn unlinked(ino: Ino) -> Vec<u8> {
    with_ino(tag::UNLINKED, ino)
}

/// Key of a small file's body.
pub fn body(ino: Ino) -> Vec<u8> {
    with_ino(tag::BODY, ino)
}

/// Key of chunk `index` written by `write_id` for `ino`.
pub fn chunk(ino: Ino, write_id: u64, index: u32) -> Vec<u8> {
    let mut k = with_ino(tag::CHUNK, ino);
    k.extend_from_slice(&write_id.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// Bytes of a chunk stored under one key (its last block may hold fewer): a read of a
/// range reads and checks only the blocks the range covers. Format 2 stored a chunk whole
/// (up to 8 MiB) under [`chunk`]'s key, and a random 4 KiB read of a large file cost its
/// node the whole chunk from the disk and its checksum. Part of the stored format.
pub const CHUNK_BLOCK: usize = 64 << 10;

/// Key of block `block` of chunk `index` written by `write_id` for `ino`: the chunk's
/// bytes `[block * CHUNK_BLOCK, (block + 1) * CHUNK_BLOCK)`.
pub fn chunk_block(ino: Ino, write_id: u64, index: u32, block: u32) -> Vec<u8> {
    let mut k = chunk(ino, write_id, index);
    k.extend_from_slice(&block.to_be_bytes());
    k
}

/// True for the key a chunk is counted by: its first block, or a format 2 chunk's whole.
pub fn is_chunk_head(key: &[u8]) -> bool {
    key.first() == Some(&tag::CHUNK)
        && match key.len() {
            21 => true,
            25 => key[21..] == [0; 4],
            _ => false,
        }
}

/// Key of a chunk's write-time record.
pub fn chunk_time(ino: Ino, write_id: u64, index: u32) -> Vec<u8> {
    let mut k = chunk(ino, write_id, index);
    k[0] = tag::CHUNK_TIME;
    k
}

/// Key of the record of chunk `index` written by `write_id`, which a commit took out of the
/// layout of `ino` (see [`tag::DROPPED`]).
pub fn dropped(ino: Ino, write_id: u64, index: u32) -> Vec<u8> {
    let mut k = chunk(ino, write_id, index);
    k[0] = tag::DROPPED;
    k
}

/// The prefix of every dropped-chunk record of `ino`.
pub fn dropped_prefix(ino: Ino) -> Vec<u8> {
    with_ino(tag::DROPPED, ino)
}

/// Key of the newest generation of `ino` whose dropped chunks were reclaimed.
pub fn reclaimed_gen(ino: Ino) -> Vec<u8> {
    with_ino(tag::RECLAIMED_GEN, ino)
}

/// Decodes (ino, write id, index) from a chunk, chunk-time or dropped-chunk key.
pub fn chunk_of(key: &[u8]) -> Option<(Ino, u64, u32)> {
    let ino = ino_at(key, 1)?;
    let w: [u8; 8] = key.get(9..17)?.try_into().ok()?;
    let i: [u8; 4] = key.get(17..21)?.try_into().ok()?;
    Some((ino, u64::from_be_bytes(w), u32::from_be_bytes(i)))
}

fn with_ino(tag: u8, ino: Ino) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(tag);
    k.extend_from_slice(&ino.0.to_be_bytes());
    k
}

/// Key of entry `name` in `parent`.
pub fn dentry(parent: Ino, name: &[u8]) -> Vec<u8> {
    let mut k = with_ino(tag::DENTRY, parent);
    k.extend_from_slice(name);
    k
}

/// Prefix of every entry of `parent`.
pub fn dentry_prefix(parent: Ino) -> Vec<u8> {
    with_ino(tag::DENTRY, parent)
}

/// Key of an inode.
pub fn inode(ino: Ino) -> Vec<u8> {
    with_ino(tag::INODE, ino)
}

/// Key of an xattr.
pub fn xattr(ino: Ino, name: &[u8]) -> Vec<u8> {
    let mut k = with_ino(tag::XATTR, ino);
    k.extend_from_slice(name);
    k
}

/// Prefix of every xattr of an inode.
pub fn xattr_prefix(ino: Ino) -> Vec<u8> {
    with_ino(tag::XATTR, ino)
}

/// Tombstone of a removed directory.
pub fn tombstone(dir: Ino) -> Vec<u8> {
    with_ino(tag::TOMBSTONE, dir)
}

/// Live-directory record.
pub fn live_dir(dir: Ino) -> Vec<u8> {
    with_ino(tag::LIVE_DIR, dir)
}

/// The lock key protecting `key`.
pub fn lock(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(tag::LOCK);
    k.extend_from_slice(key);
    k
}

/// The fence key of a directory's children (held by rmdir while prepared).
pub fn fence(dir: Ino) -> Vec<u8> {
    with_ino(b'F', dir)
}

/// The epoch key (held by directory renames while prepared).
pub const EPOCH_LOCK: &[u8] = b"E";

fn txn_key(tag: u8, txid: TxId) -> Vec<u8> {
    let mut k = Vec::with_capacity(13);
    k.push(tag);
    k.extend_from_slice(&txid.coordinator.to_be_bytes());
    k.extend_from_slice(&txid.id.to_be_bytes());
    k
}

/// Prepared-transaction record.
pub fn prepared(txid: TxId) -> Vec<u8> {
    txn_key(tag::PREPARED, txid)
}

/// Decision record.
pub fn decision(txid: TxId) -> Vec<u8> {
    txn_key(tag::DECISION, txid)
}

/// Partition metadata keys.
pub mod meta {
    /// Last applied log id.
    pub const APPLIED: &[u8] = b"Mapplied";
    /// Last applied membership.
    pub const MEMBERSHIP: &[u8] = b"Mmembership";
    /// Namespace epoch.
    pub const EPOCH: &[u8] = b"Mepoch";
    /// Next ino counter.
    pub const NEXT_INO: &[u8] = b"Mnext_ino";
    /// Number of dentries held.
    pub const ENTRIES: &[u8] = b"Mentries";
    /// Number of inodes held.
    pub const INODES: &[u8] = b"Minodes";
    /// The cluster map (partition 0).
    pub const CLUSTER_MAP: &[u8] = b"Mcluster_map";
    /// Logical bytes of bodies and chunks held.
    pub const BYTES: &[u8] = b"Mbytes";
    /// The counters: what nearly every command reads and writes back (`resident.rs`).
    pub const COUNTERS: [&[u8]; 5] = [NEXT_INO, INODES, ENTRIES, BYTES, EPOCH];
}

/// Decodes a big-endian ino from 8 bytes at `at`.
pub fn ino_at(key: &[u8], at: usize) -> Option<Ino> {
    let b: [u8; 8] = key.get(at..at + 8)?.try_into().ok()?;
    Some(Ino(u64::from_be_bytes(b)))
}

/// Decodes a `TxId` from a `P` or `C` key.
pub fn txid_of(key: &[u8]) -> Option<TxId> {
    let c: [u8; 4] = key.get(1..5)?.try_into().ok()?;
    let i: [u8; 8] = key.get(5..13)?.try_into().ok()?;
    Some(TxId {
        coordinator: u32::from_be_bytes(c),
        id: u64::from_be_bytes(i),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_a_directory_share_a_prefix_and_sort_by_name() {
        let p = Ino(42);
        let a = dentry(p, b"a");
        let b = dentry(p, b"b");
        assert!(a.starts_with(&dentry_prefix(p)) && b.starts_with(&dentry_prefix(p)));
        assert!(a < b);
        assert!(!dentry(Ino(43), b"a").starts_with(&dentry_prefix(p)));
    }

    #[test]
    fn txid_round_trips() {
        let t = TxId {
            coordinator: 7,
            id: 0xdead_beef,
        };
        assert_eq!(txid_of(&prepared(t)), Some(t));
    }

    #[test]
    fn request_ids_round_trip_in_their_own_table() {
        for id in [1, 0xfeed_f00d, u64::MAX] {
            let k = request(id);
            assert_eq!(request_of(&k), Some(id));
            assert_eq!(k.first(), Some(&tag::REQUEST));
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn name() -> impl Strategy<Value = Vec<u8>> {
            proptest::collection::vec(any::<u8>(), 1..40)
        }

        /// Every key of every table, from the same inputs.
        fn all_keys(ino: Ino, n: &[u8], w: u64, i: u32, t: TxId) -> Vec<Vec<u8>> {
            vec![
                request(w),
                unlinked(ino),
                body(ino),
                chunk(ino, w, i),
                chunk_time(ino, w, i),
                dentry(ino, n),
                inode(ino),
                xattr(ino, n),
                tombstone(ino),
                live_dir(ino),
                lock(&dentry(ino, n)),
                fence(ino),
                prepared(t),
                decision(t),
            ]
        }

        proptest! {
            /// A directory's entries sort by name under its prefix, and no other
            /// directory's entry falls under that prefix (readdir is one prefix scan).
            #[test]
            fn entries_scan_in_name_order_under_their_directory(
                p in any::<u64>(), q in any::<u64>(), a in name(), b in name()
            ) {
                let (p, q) = (Ino(p), Ino(q));
                prop_assert_eq!(dentry(p, &a).cmp(&dentry(p, &b)), a.cmp(&b));
                prop_assert!(dentry(p, &a).starts_with(&dentry_prefix(p)));
                prop_assert_eq!(dentry(q, &a).starts_with(&dentry_prefix(p)), p == q);
                prop_assert_eq!(xattr(q, &a).starts_with(&xattr_prefix(p)), p == q);
                // A transaction's lock on an entry is found by the directory's lock scan.
                prop_assert!(lock(&dentry(p, &a)).starts_with(&lock(&dentry_prefix(p))));
            }

            /// Keys by inode sort as the inode numbers do.
            #[test]
            fn inode_keys_sort_by_ino(a in any::<u64>(), b in any::<u64>()) {
                prop_assert_eq!(inode(Ino(a)).cmp(&inode(Ino(b))), a.cmp(&b));
                prop_assert_eq!(ino_at(&inode(Ino(a)), 1), Some(Ino(a)));
            }

            /// Chunk keys decode to what made them, and sort by (ino, writer, index).
            #[test]
            fn chunk_keys_round_trip_and_sort(
                a in (any::<u64>(), any::<u64>(), any::<u32>()),
                b in (any::<u64>(), any::<u64>(), any::<u32>()),
            ) {
                let ka = chunk(Ino(a.0), a.1, a.2);
                prop_assert_eq!(chunk_of(&ka), Some((Ino(a.0), a.1, a.2)));
                prop_assert_eq!(chunk_of(&chunk_time(Ino(a.0), a.1, a.2)), Some((Ino(a.0), a.1, a.2)));
                prop_assert_eq!(ka.cmp(&chunk(Ino(b.0), b.1, b.2)), a.cmp(&b));
                let head = chunk_block(Ino(a.0), a.1, a.2, 0);
                prop_assert_eq!(chunk_of(&head), Some((Ino(a.0), a.1, a.2)));
                prop_assert!(is_chunk_head(&head) && is_chunk_head(&ka));
                prop_assert!(!is_chunk_head(&chunk_block(Ino(a.0), a.1, a.2, 1)));
                prop_assert!(!is_chunk_head(&chunk_time(Ino(a.0), a.1, a.2)));
            }

            /// Transaction and request keys decode to what made them.
            #[test]
            fn transaction_and_request_keys_round_trip(c in any::<u32>(), id in any::<u64>()) {
                let t = TxId { coordinator: c, id };
                prop_assert_eq!(txid_of(&prepared(t)), Some(t));
                prop_assert_eq!(txid_of(&decision(t)), Some(t));
                prop_assert_eq!(request_of(&request(id)), Some(id));
            }

            /// Tables never share a key, nor reach the partition's own records or the store's
            /// format record.
            #[test]
            fn tables_are_disjoint_and_miss_the_format_record(
                ino in any::<u64>(), n in name(), w in any::<u64>(), i in any::<u32>(),
                c in any::<u32>(), id in any::<u64>()
            ) {
                let keys = all_keys(Ino(ino), &n, w, i, TxId { coordinator: c, id });
                let tags: std::collections::BTreeSet<u8> = keys.iter().map(|k| k[0]).collect();
                prop_assert_eq!(tags.len(), keys.len(), "two tables share a tag");
                for k in &keys {
                    prop_assert!(!k.starts_with(crate::format::FORMAT_KEY));
                    prop_assert_ne!(k[0], tag::META);
                    prop_assert_ne!(k[0], 0);
                }
            }
        }
    }
}
