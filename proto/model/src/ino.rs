//! Inode numbers. An ino carries its home partition in the high 16 bits and a per-partition
//! counter in the low 48, so any ino routes to its partition without a lookup table. Inos are
//! never reused: a partition's counter only grows, and it is part of the replicated state.

use serde::{Deserialize, Serialize};

/// Bits of an ino that hold the per-partition counter.
pub const COUNTER_BITS: u32 = 48;

/// The root directory: counter 1 on partition 0.
pub const ROOT_INO: Ino = Ino(1);

/// Largest number of partitions an ino can address.
pub const MAX_PARTITIONS: u32 = 1 << 16;

/// An inode number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Ino(pub u64);

impl Ino {
    /// The ino with `counter` on `partition`. `counter` must fit in 48 bits.
    pub fn new(partition: u32, counter: u64) -> Ino {
        debug_assert!(counter < (1u64 << COUNTER_BITS));
        Ino(((partition as u64) << COUNTER_BITS) | counter)
    }

    /// The partition that holds this inode's attributes.
    pub fn home(self) -> u32 {
        (self.0 >> COUNTER_BITS) as u32
    }

    /// The per-partition counter part.
    pub fn counter(self) -> u64 {
        self.0 & ((1u64 << COUNTER_BITS) - 1)
    }
}

impl std::fmt::Display for Ino {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn home_and_counter_round_trip(p in 0u32..MAX_PARTITIONS, c in 0u64..(1u64 << 48)) {
            let ino = Ino::new(p, c);
            prop_assert_eq!(ino.home(), p);
            prop_assert_eq!(ino.counter(), c);
        }
    }

    #[test]
    fn root_is_on_partition_zero() {
        assert_eq!(ROOT_INO.home(), 0);
    }
}
