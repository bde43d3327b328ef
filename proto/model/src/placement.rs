//! Entry placement: which partition holds a directory entry.
//!
//! - A RELAXED parent spreads its entries: `(parent, name)` lives on
//!   `xxh3(parent ‖ name) % P`, so one huge directory is served by every partition.
//! - A STRICT parent co-locates its entries: every entry lives on `xxh3(parent) % P`, so a
//!   rename inside the directory (the checkpoint pattern) is a single-partition transaction.
//!
//! The hash input is the parent ino in little-endian followed by the name bytes. The result
//! must never change for a given input: it is how existing data is found.

use crate::attr::Class;
use crate::ino::Ino;
use xxhash_rust::xxh3::xxh3_64;

/// The partition that holds entry `name` of directory `parent` whose class is `class`.
pub fn entry_partition(parent: Ino, name: &[u8], class: Class, partitions: u32) -> u32 {
    let p = partitions.max(1) as u64;
    match class {
        Class::Strict => (xxh3_64(&parent.0.to_le_bytes()) % p) as u32,
        Class::Relaxed => {
            let mut buf = Vec::with_capacity(8 + name.len());
            buf.extend_from_slice(&parent.0.to_le_bytes());
            buf.extend_from_slice(name);
            (xxh3_64(&buf) % p) as u32
        }
    }
}

/// The partitions that may hold entries of a directory of class `class`.
pub fn dir_partitions(parent: Ino, class: Class, partitions: u32) -> Vec<u32> {
    match class {
        Class::Strict => vec![entry_partition(parent, b"", class, partitions)],
        Class::Relaxed => (0..partitions.max(1)).collect(),
    }
}

/// The partition that holds chunk `index` of inode `ino`: chunks of one large file are
/// striped over every partition.
pub fn chunk_partition(ino: Ino, index: u32, partitions: u32) -> u32 {
    let mut buf = [0u8; 12];
    buf[..8].copy_from_slice(&ino.0.to_le_bytes());
    buf[8..].copy_from_slice(&index.to_le_bytes());
    (xxh3_64(&buf) % partitions.max(1) as u64) as u32
}

/// A placement function bound to a partition count.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    /// Number of partitions, fixed at `init`.
    pub partitions: u32,
}

impl Placement {
    /// Partition of entry `name` in `parent`.
    pub fn entry(&self, parent: Ino, name: &[u8], class: Class) -> u32 {
        entry_partition(parent, name, class, self.partitions)
    }

    /// Partitions that may hold children of `dir`.
    pub fn dir(&self, dir: Ino, class: Class) -> Vec<u32> {
        dir_partitions(dir, class, self.partitions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn strict_entries_share_one_partition(parent: u64, a: Vec<u8>, b: Vec<u8>, p in 1u32..64) {
            let parent = Ino(parent);
            prop_assert_eq!(
                entry_partition(parent, &a, Class::Strict, p),
                entry_partition(parent, &b, Class::Strict, p)
            );
        }

        #[test]
        fn placement_is_in_range(parent: u64, name: Vec<u8>, p in 1u32..1024) {
            prop_assert!(entry_partition(Ino(parent), &name, Class::Relaxed, p) < p);
            prop_assert!(entry_partition(Ino(parent), &name, Class::Strict, p) < p);
        }
    }

    #[test]
    fn relaxed_entries_spread_over_all_partitions() {
        let p = 16;
        let mut seen = vec![0u32; p as usize];
        for i in 0..10_000 {
            let name = format!("n{i:08}.JPEG");
            seen[entry_partition(Ino(77), name.as_bytes(), Class::Relaxed, p) as usize] += 1;
        }
        // 625 expected per partition; every partition within a factor of 1.5.
        for (i, n) in seen.iter().enumerate() {
            assert!(*n > 420 && *n < 940, "partition {i} holds {n} of 10000");
        }
    }

    #[test]
    fn chunks_of_one_file_stripe_over_partitions() {
        let used: std::collections::BTreeSet<u32> = (0..64)
            .map(|i| chunk_partition(Ino(1 << 48 | 9), i, 8))
            .collect();
        assert_eq!(used.len(), 8);
    }

    #[test]
    fn placement_is_stable() {
        // Pinned values: a change here would strand existing data.
        assert_eq!(entry_partition(Ino(1), b"imagenet", Class::Relaxed, 16), {
            let mut b = 1u64.to_le_bytes().to_vec();
            b.extend_from_slice(b"imagenet");
            (xxh3_64(&b) % 16) as u32
        });
    }
}
