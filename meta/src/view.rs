//! The state as a command or a read sees it: a store (a partition's RocksDB, a snapshot of
//! it for reads, or an in-memory map in tests; see `kv.rs`), then the writes staged by
//! earlier commands of the same apply call, then the command's own. Typed getters for the
//! records of `records.rs`, prefix scans, counters.
//!
//! It reads and stages writes; it decides nothing (that is `apply.rs`) and writes nothing
//! to the database (the state machine writes the staged batch).

use crate::keys::{self, meta};
use crate::kv::{Kv, Overlay};
use crate::records::{dec, Dentry, Fatal, InodeRec, RequestRec};
use crate::types::{NodeId, TxId};
use openraft::LogId;
use talon_model::{Class, Ino};

/// What a lookup of one name reads, from one view ([`View::lookup`]).
#[derive(Debug)]
pub struct LookupRead {
    /// The partition's namespace epoch.
    pub epoch: u64,
    /// The parent's class where this partition knows it: its home, or a live-directory
    /// record learned here (an unknown parent is not fetched for a read: absent entries
    /// answer ENOENT either way).
    pub known_class: Option<Class>,
    /// Whether a prepared transaction holds the entry, or the strict inode it names.
    pub locked: bool,
    /// The entry.
    pub dentry: Option<Dentry>,
    /// The entry's inode where this partition is its home (`Some(None)`: its home, absent).
    pub inode: Option<Option<InodeRec>>,
    /// The applied id this view holds, when asked for (the trace of strict reads).
    pub applied: Option<LogId<NodeId>>,
}

/// The state as a command sees it: the store, then the call's staged writes, then its own.
pub struct View<'a> {
    kv: &'a dyn Kv,
    base: &'a Overlay,
    own: Overlay,
}

impl<'a> View<'a> {
    /// A view over `kv` with `base` staged. Over a snapshot, every read sees one point in
    /// time, so reads of several keys (an inode and its body) agree with each other.
    pub fn new(kv: &'a dyn Kv, base: &'a Overlay) -> View<'a> {
        View {
            kv,
            base,
            own: Overlay::new(),
        }
    }

    /// Reads a key: the staged writes first, then the store.
    pub fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, Fatal> {
        if let Some(v) = self.staged(k) {
            return Ok(v.clone());
        }
        self.kv.get(k)
    }

    /// Reads a value that carries a checksum of its own, which the caller verifies (a
    /// small file's body, a chunk), in place: `read` gets the stored bytes without a copy
    /// out of the store (see [`Kv::read_in_place`]), and what it returns is the answer
    /// (None: the key is absent).
    pub fn read_self_checked<T>(
        &self,
        k: &[u8],
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>, Fatal> {
        if let Some(v) = self.staged(k) {
            return Ok(v.as_deref().map(read));
        }
        let mut read = Some(read);
        let mut out = None;
        self.kv.read_in_place(k, &mut |b| {
            out = read.take().map(|f| f(b));
        })?;
        Ok(out)
    }

    fn staged(&self, k: &[u8]) -> Option<&Option<Vec<u8>>> {
        self.own.get(k).or_else(|| self.base.get(k))
    }

    /// True if any live key starts with `prefix`.
    pub fn prefix_any(&self, prefix: &[u8]) -> Result<bool, Fatal> {
        for ov in [&self.own, self.base] {
            let hit = ov
                .range(prefix.to_vec()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .any(|(k, v)| v.is_some() && self.staged(k).is_some_and(|s| s.is_some()));
            if hit {
                return Ok(true);
            }
        }
        let mut found = false;
        self.kv.scan_keys(prefix, &mut |k| {
            // A key the staged writes delete does not count.
            found = k.starts_with(prefix) && !matches!(self.staged(k), Some(None));
            k.starts_with(prefix) && !found
        })?;
        Ok(found)
    }

    /// Until when (ms) open session `session` of `ino` is held, if it is recorded.
    pub fn open_hold(&self, ino: Ino, session: u64) -> Result<Option<u64>, Fatal> {
        Ok(self
            .get(&keys::open_hold(ino, session))?
            .map(|b| hold_until(&b)))
    }

    /// The open sessions recorded on `ino`: (session, held until in ms).
    pub fn open_holds(&self, ino: Ino) -> Result<Vec<(u64, u64)>, Fatal> {
        let mut out = Vec::new();
        for k in self.keys_with_prefix(&keys::open_hold_prefix(ino))? {
            if let (Some((_, session)), Some(b)) = (keys::open_hold_of(&k), self.get(&k)?) {
                out.push((session, hold_until(&b)));
            }
        }
        Ok(out)
    }

    /// Stages a put.
    pub fn put(&mut self, k: Vec<u8>, v: Vec<u8>) {
        self.own.insert(k, Some(v));
    }

    /// Stages a delete.
    pub fn del(&mut self, k: Vec<u8>) {
        self.own.insert(k, None);
    }

    /// Keys with `prefix`, staged writes included (small prefixes only: xattrs, locks).
    pub fn keys_with_prefix(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, Fatal> {
        let mut out = std::collections::BTreeSet::new();
        self.kv.scan_keys(prefix, &mut |k| {
            let more = k.starts_with(prefix);
            if more {
                out.insert(k.to_vec());
            }
            more
        })?;
        for ov in [self.base, &self.own] {
            for (k, _) in ov
                .range(prefix.to_vec()..)
                .take_while(|(k, _)| k.starts_with(prefix))
            {
                out.insert(k.clone());
            }
        }
        let mut keys = Vec::new();
        for k in out {
            if self.get(&k)?.is_some() {
                keys.push(k);
            }
        }
        Ok(keys)
    }

    /// The command's staged writes.
    pub fn into_writes(self) -> Overlay {
        self.own
    }

    /// The partition's namespace epoch. Epochs start at 1, so a client's 0 can only mean
    /// "no check".
    pub fn epoch(&self) -> Result<u64, Fatal> {
        Ok(self.counter(meta::EPOCH)?.max(1))
    }

    /// Reads a u64 counter in partition metadata.
    pub fn counter(&self, k: &[u8]) -> Result<u64, Fatal> {
        Ok(match self.get(k)? {
            Some(b) => u64::from_le_bytes(
                b.as_slice()
                    .try_into()
                    .map_err(|_| Fatal::Corrupt("counter".into()))?,
            ),
            None => 0,
        })
    }

    pub(crate) fn set_counter(&mut self, k: &[u8], v: u64) {
        self.put(k.to_vec(), v.to_le_bytes().to_vec());
    }

    pub(crate) fn add_counter(&mut self, k: &[u8], d: i64) -> Result<(), Fatal> {
        let v = self.counter(k)?;
        self.set_counter(k, v.saturating_add_signed(d));
        Ok(())
    }

    /// The record of client request `id`, if it was applied (and not yet forgotten).
    pub fn request(&self, id: u64) -> Result<Option<RequestRec>, Fatal> {
        self.get(&keys::request(id))?
            .map(|b| RequestRec::from_bytes(&b))
            .transpose()
    }

    /// Reads a dentry.
    pub fn dentry(&self, parent: Ino, name: &[u8]) -> Result<Option<Dentry>, Fatal> {
        self.get(&keys::dentry(parent, name))?
            .map(|b| dec(&b, "dentry"))
            .transpose()
    }

    /// Reads an inode.
    pub fn inode(&self, ino: Ino) -> Result<Option<InodeRec>, Fatal> {
        self.get(&keys::inode(ino))?
            .map(|b| dec(&b, "inode"))
            .transpose()
    }

    /// Whether a prepared transaction holds the record key of request `id` (a copy of the
    /// request is being applied).
    pub fn request_pending(&self, id: u64) -> Result<bool, Fatal> {
        Ok(self.locked(&keys::request(id))?.is_some())
    }

    /// Whether `rec`, inode `ino` as read here, is strict and held by a prepared
    /// transaction: its attributes may be half of that transaction, whose other partitions
    /// may have applied theirs already, so a strict reader waits. A relaxed inode's
    /// attributes may be that old anyway (and its lock is not read).
    pub fn strict_inode_locked(&self, ino: Ino, rec: Option<&InodeRec>) -> Result<bool, Fatal> {
        if !rec.is_some_and(|r| r.attr.class == talon_model::Class::Strict) {
            return Ok(false);
        }
        Ok(self.locked(&keys::inode(ino))?.is_some())
    }

    /// What a lookup of `name` in `parent` on partition `p` answers from: the epoch, the
    /// parent's class, the entry's lock, the entry and, where `p` is its home, its inode;
    /// the applied id too if `applied`.
    pub fn lookup(
        &self,
        p: u32,
        parent: Ino,
        name: &[u8],
        applied: bool,
    ) -> Result<LookupRead, Fatal> {
        let epoch = self.epoch()?;
        let known_class = if parent.home() == p {
            self.inode(parent)?.map(|r| r.attr.class)
        } else {
            self.get(&keys::live_dir(parent))?
                .map(|b| dec::<Class>(&b, "live dir"))
                .transpose()?
        };
        let applied = if applied {
            self.get(meta::APPLIED)?
                .map(|b| dec::<LogId<NodeId>>(&b, "applied"))
                .transpose()?
        } else {
            None
        };
        let key = keys::dentry(parent, name);
        let mut locked = self.get(&keys::lock(&key))?.is_some();
        let dentry = self
            .get(&key)?
            .map(|b| dec::<Dentry>(&b, "dentry"))
            .transpose()?;
        let inode = match &dentry {
            Some(d) if d.ino.home() == p => {
                let rec = self.inode(d.ino)?;
                locked |= self.strict_inode_locked(d.ino, rec.as_ref())?;
                Some(rec)
            }
            _ => None,
        };
        Ok(LookupRead {
            epoch,
            known_class,
            locked,
            dentry,
            inode,
            applied,
        })
    }

    pub(crate) fn locked(&self, key: &[u8]) -> Result<Option<TxId>, Fatal> {
        self.get(&keys::lock(key))?
            .map(|b| dec(&b, "lock"))
            .transpose()
    }
}

/// Whether an open session held until `until_ms` (its record's time) still holds its file at
/// `now_ms`: through the last millisecond of its lease, as long as a renewal of it, or a
/// commit naming it, is accepted. Every check of a session's lease is this one.
pub fn holds_at(until_ms: u64, now_ms: u64) -> bool {
    until_ms >= now_ms
}

/// Whether any of a file's open sessions (`View::open_holds`: session, held until) holds it
/// at `now_ms`.
pub fn any_holds_at(holds: &[(u64, u64)], now_ms: u64) -> bool {
    holds.iter().any(|&(_, until)| holds_at(until, now_ms))
}

/// The time (ms) an open session's record holds it until; a record too short to hold one
/// reads as expired long ago.
fn hold_until(value: &[u8]) -> u64 {
    value
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}
