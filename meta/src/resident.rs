//! The keys of a partition that its state machine, their only writer, keeps resident in
//! memory as the live store holds them, so that a command reads them without a store read:
//! the counters (`keys::meta::COUNTERS`: the next inode number, the inodes, entries and
//! bytes held, the namespace epoch) and the locks of prepared transactions (`keys::lock`).
//!
//! Nearly every command reads a counter and writes it back, and looks for a lock on each
//! key it touches. As store reads, the counters took about 4 % of a node's CPU in a profile
//! of creates through the mount (each a search of a memtable holding a version of the
//! counter for every earlier command) and the locks, nearly always absent, about 2 %.
//! Locks are few (they live from a transaction's prepare to its finish), so all of them fit.
//!
//! The keys are loaded from the store at the first apply and follow each batch the state
//! machine writes; a new store instance (an installed snapshot) or a write that failed
//! drops them, and the next apply loads them again. Every batch still writes them to the
//! store, so what is durable is unchanged.
//!
//! Owns nothing else: what the keys mean is `apply.rs`'s, the batch is `sm.rs`'s.

use crate::keys::{meta::COUNTERS, tag};
use crate::kv::{Kv, Overlay};
use crate::records::Fatal;
use crate::view::View;
use std::collections::BTreeMap;

/// The resident keys of one store instance, once loaded.
#[derive(Debug, Default)]
pub struct Resident {
    known: Option<Known>,
}

/// The resident keys' stored values.
#[derive(Debug)]
struct Known {
    /// Each counter's value (None: absent), in `COUNTERS`' order.
    counters: [Option<Vec<u8>>; COUNTERS.len()],
    /// Every lock key held, with its value.
    locks: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Whether `k` is a lock's key.
fn is_lock(k: &[u8]) -> bool {
    k.first() == Some(&tag::LOCK)
}

impl Known {
    fn load(kv: &dyn Kv) -> Result<Known, Fatal> {
        let mut counters: [Option<Vec<u8>>; COUNTERS.len()] = Default::default();
        for (slot, k) in counters.iter_mut().zip(COUNTERS) {
            *slot = kv.get(k)?;
        }
        let none = Overlay::new();
        let store = View::new(kv, &none);
        let mut locks = BTreeMap::new();
        for k in store.keys_with_prefix(&[tag::LOCK])? {
            if let Some(v) = store.get(&k)? {
                locks.insert(k, v);
            }
        }
        Ok(Known { counters, locks })
    }

    /// The value of `k` if it is a resident key: Some(None) if it is one and absent.
    fn get(&self, k: &[u8]) -> Option<Option<&Vec<u8>>> {
        if is_lock(k) {
            return Some(self.locks.get(k));
        }
        let i = COUNTERS.iter().position(|c| *c == k)?;
        self.counters.get(i).map(Option::as_ref)
    }
}

impl Resident {
    /// A store that answers the resident keys from memory (loading them from `kv` first,
    /// if they are not known) and every other key from `kv`.
    pub fn over<'a>(&'a mut self, kv: &'a dyn Kv) -> Result<WithResident<'a>, Fatal> {
        let known = match self.known.take() {
            Some(known) => known,
            None => Known::load(kv)?,
        };
        let known = self.known.insert(known);
        Ok(WithResident { kv, known })
    }

    /// Follows a batch the store has written.
    pub fn written(&mut self, batch: &Overlay) {
        let Some(known) = &mut self.known else { return };
        for (slot, k) in known.counters.iter_mut().zip(COUNTERS) {
            if let Some(v) = batch.get(k) {
                slot.clone_from(v);
            }
        }
        let lock_tag = [tag::LOCK];
        let locks = batch
            .range(lock_tag.to_vec()..)
            .take_while(|(k, _)| is_lock(k));
        for (k, v) in locks {
            match v {
                Some(v) => known.locks.insert(k.clone(), v.clone()),
                None => known.locks.remove(k),
            };
        }
    }

    /// Forgets the values: the store instance changed, or a write to it may not have
    /// happened as staged.
    pub fn forget(&mut self) {
        self.known = None;
    }
}

/// A store with its resident keys answered from memory (see [`Resident::over`]).
pub struct WithResident<'a> {
    kv: &'a dyn Kv,
    known: &'a Known,
}

impl Kv for WithResident<'_> {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, Fatal> {
        match self.known.get(k) {
            Some(v) => Ok(v.cloned()),
            None => self.kv.get(k),
        }
    }

    fn read_in_place(&self, k: &[u8], read: &mut dyn FnMut(&[u8])) -> Result<bool, Fatal> {
        match self.known.get(k) {
            Some(v) => Ok(v.map(|v| read(v)).is_some()),
            None => self.kv.read_in_place(k, read),
        }
    }

    fn scan_keys(&self, from: &[u8], visit: &mut dyn FnMut(&[u8]) -> bool) -> Result<(), Fatal> {
        // The resident keys are stored as they are known: the store's keys are the same.
        self.kv.scan_keys(from, visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{self, meta};
    use crate::kv::MemKv;

    fn value(n: u64) -> Option<Vec<u8>> {
        Some(n.to_le_bytes().to_vec())
    }

    /// Loaded once, the resident keys follow the written batches, not later writes to the
    /// store behind the state machine's back; other keys come from the store; forgotten,
    /// they are loaded again.
    #[test]
    fn resident_keys_follow_written_batches_until_forgotten() {
        let held = keys::lock(&keys::inode(talon_model::Ino(7)));
        let other = keys::lock(&keys::inode(talon_model::Ino(8)));
        let mut store = MemKv::default();
        let mut first = Overlay::new();
        first.insert(meta::NEXT_INO.to_vec(), value(5));
        first.insert(held.clone(), Some(b"tx".to_vec()));
        first.insert(b"Dother".to_vec(), Some(b"x".to_vec()));
        store.write(first);
        let mut resident = Resident::default();
        {
            let kv = resident.over(&store).expect("load");
            assert_eq!(kv.get(meta::NEXT_INO).expect("get"), value(5));
            assert_eq!(kv.get(meta::BYTES).expect("get"), None);
            assert_eq!(kv.get(&held).expect("get"), Some(b"tx".to_vec()));
            assert_eq!(kv.get(&other).expect("get"), None);
            assert_eq!(kv.get(b"Dother").expect("get"), Some(b"x".to_vec()));
        }
        let mut batch = Overlay::new();
        batch.insert(meta::NEXT_INO.to_vec(), value(9));
        batch.insert(meta::BYTES.to_vec(), value(4096));
        batch.insert(held.clone(), None);
        batch.insert(other.clone(), Some(b"tx2".to_vec()));
        store.write(batch.clone());
        resident.written(&batch);
        let mut behind = Overlay::new();
        behind.insert(meta::NEXT_INO.to_vec(), value(100));
        behind.insert(held.clone(), Some(b"tx3".to_vec()));
        store.write(behind);
        {
            let kv = resident.over(&store).expect("known");
            assert_eq!(kv.get(meta::NEXT_INO).expect("get"), value(9));
            assert_eq!(kv.get(meta::BYTES).expect("get"), value(4096));
            assert_eq!(kv.get(&held).expect("get"), None);
            assert_eq!(kv.get(&other).expect("get"), Some(b"tx2".to_vec()));
            let mut seen = Vec::new();
            assert!(kv
                .read_in_place(meta::BYTES, &mut |v| seen = v.to_vec())
                .expect("read"));
            assert_eq!(seen, 4096u64.to_le_bytes());
            assert!(!kv
                .read_in_place(meta::INODES, &mut |_| panic!("an absent counter"))
                .expect("read"));
        }
        resident.forget();
        let kv = resident.over(&store).expect("reload");
        assert_eq!(kv.get(meta::NEXT_INO).expect("get"), value(100));
        assert_eq!(kv.get(&held).expect("get"), Some(b"tx3".to_vec()));
    }
}
