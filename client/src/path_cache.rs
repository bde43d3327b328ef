//! The path-resolution cache: what this client believes the namespace looks like, so that
//! resolving `/imagenet/train/n01440764` is a memory lookup and a file operation is one RPC.
//!
//! Three tables, all lock-free maps:
//!
//! - dentries: `(parent ino, name) → attributes` of the entry;
//! - directory paths: `/a/b → (ino, class)` for whole-path hits;
//! - own changes: `ino → attributes` this client changed itself (setattr, link, unlink), so
//!   that a cached entry never shows this client an attribute older than its own write;
//! - directory classes: `ino → class`, used to route entry operations. A directory's class
//!   can only change while it is empty, and then no entry of it exists to misroute; a
//!   `ClassChanged` answer still makes the client drop and re-fetch the class.
//!
//! Invariants that keep the cache safe:
//!
//! - **Epoch.** Every entry is stamped with the namespace epoch it was filled at. The cache
//!   knows the newest epoch the client has seen (cluster map, replies, `StaleEpoch`); when
//!   it grows, every older entry stops being served (and is dropped). Every directory
//!   rename bumps the epoch on all partitions, and every write carries the client's epoch,
//!   so a write through a stale path is refused by the server instead of landing under the
//!   old directory.
//! - **TTL.** An entry that involves a relaxed directory (its parent or itself is relaxed)
//!   is served only for the relaxed TTL after it was filled. Entries between strict
//!   directories live until an epoch change.
//! - **What is cached.** Under a strict parent only directories are cached, and they are
//!   used only to resolve intermediate components; the final component of a strict path is
//!   always asked of the partition leader. Under a relaxed parent any entry may be cached,
//!   and a relaxed stat may be answered from it within the TTL.
//!
//! - **Epoch 0.** On the wire, epoch 0 means "skip the check", and a namespace that has
//!   never seen a directory rename is at epoch 0. A directory resolution filled at epoch 0
//!   could not be caught by the server after the first rename, so at epoch 0 directories
//!   are not cached at all (non-directory entries of relaxed directories still are, within
//!   the TTL: they are never used to resolve a path).
//!
//! Size: each table holds about `capacity` entries. When one grows past it, expired entries
//! go first, then the least recently used, down to three quarters of the capacity, so a
//! traversal bigger than the cache keeps its hot directories instead of starting cold.
//!
//! The cache never talks to the network; the client decides what to fill and invalidate.

use dashmap::DashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use talon_model::{Attr, Class, FileKind, Ino};

/// Inserts between two capacity checks.
const CAPACITY_CHECK_EVERY: usize = 1024;

#[derive(Debug)]
struct Stamped<T> {
    value: T,
    filled_at: Instant,
    epoch: u64,
    /// Whether the relaxed TTL bounds this entry.
    expires: bool,
    /// When it was last served or filled: microseconds since the cache's start.
    used: AtomicU64,
}

impl<T> Stamped<T> {
    fn new(value: T, filled_at: Instant, epoch: u64, expires: bool, used: u64) -> Stamped<T> {
        Stamped {
            value,
            filled_at,
            epoch,
            expires,
            used: AtomicU64::new(used),
        }
    }

    /// Marks the entry used at `tick`. At most once a millisecond: a hot directory's entry
    /// is read by every thread, and a write per read would bounce its cache line.
    fn touch(&self, tick: u64) {
        if self.used.load(Ordering::Relaxed) + 1_000 <= tick {
            self.used.store(tick, Ordering::Relaxed);
        }
    }

    fn usable(&self, epoch: u64, ttl: Duration, now: Instant) -> bool {
        self.epoch >= epoch && (!self.expires || now.duration_since(self.filled_at) < ttl)
    }
}

/// Shrinks `table` when it holds more than `capacity` entries: expired entries first, then
/// the least recently used, down to three quarters of `capacity`.
fn shrink<K, T>(
    table: &DashMap<K, Stamped<T>>,
    capacity: usize,
    usable: impl Fn(&Stamped<T>) -> bool,
) where
    K: Eq + std::hash::Hash,
{
    if table.len() <= capacity {
        return;
    }
    table.retain(|_, v| usable(v));
    let keep = capacity - capacity / 4;
    if table.len() <= keep {
        return;
    }
    let mut used: Vec<u64> = table
        .iter()
        .map(|e| e.value().used.load(Ordering::Relaxed))
        .collect();
    let drop_n = used.len().saturating_sub(keep);
    if drop_n == 0 {
        return;
    }
    // The newest use among the `drop_n` oldest: everything used no later goes. Ties may take
    // a few more; entries used meanwhile stay.
    let (_, cut, _) = used.select_nth_unstable(drop_n - 1);
    let cut = *cut;
    table.retain(|_, v| v.used.load(Ordering::Relaxed) > cut);
}

/// A cached directory entry.
#[derive(Clone, Debug)]
pub struct CachedEntry {
    /// The entry's attributes when it was filled.
    pub attr: Attr,
    /// The class of the directory holding it.
    pub parent_class: Class,
}

impl CachedEntry {
    /// True when a stat of this entry as the final path component may be answered from the
    /// cache (relaxed on both sides).
    pub fn serves_final_stat(&self) -> bool {
        self.parent_class == Class::Relaxed && self.attr.class == Class::Relaxed
    }
}

/// The client's path-resolution cache. See the module docs for its rules.
pub struct PathCache {
    dentries: DashMap<(Ino, Vec<u8>), Stamped<CachedEntry>>,
    /// Attributes this client changed, and when; `None` = changed, new value unknown.
    own: DashMap<Ino, (Option<Attr>, Instant)>,
    dirs: DashMap<Vec<u8>, Stamped<(Ino, Class)>>,
    classes: DashMap<Ino, Class>,
    epoch: AtomicU64,
    ttl: Duration,
    capacity: usize,
    inserts: AtomicUsize,
    /// Origin of the entries' `used` clocks.
    start: Instant,
}

impl PathCache {
    /// An empty cache at namespace epoch `epoch`.
    pub fn new(epoch: u64, ttl: Duration, capacity: usize) -> PathCache {
        PathCache {
            dentries: DashMap::new(),
            own: DashMap::new(),
            dirs: DashMap::new(),
            classes: DashMap::new(),
            epoch: AtomicU64::new(epoch),
            ttl,
            capacity: capacity.max(16),
            inserts: AtomicUsize::new(0),
            start: Instant::now(),
        }
    }

    /// `now` on the entries' `used` clock.
    fn tick(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.start).as_micros() as u64
    }

    /// The newest namespace epoch seen.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The relaxed TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Records epoch `e` seen in a reply or error. If it is newer than any seen before,
    /// every entry filled at an older epoch is dropped; returns whether that happened.
    pub fn observe_epoch(&self, e: u64) -> bool {
        let prev = self.epoch.fetch_max(e, Ordering::AcqRel);
        if e <= prev {
            return false;
        }
        tracing::debug!(
            from = prev,
            to = e,
            "namespace epoch advanced; dropping older entries"
        );
        self.dentries.retain(|_, v| v.epoch >= e);
        self.dirs.retain(|_, v| v.epoch >= e);
        true
    }

    /// The cached entry `name` of `parent`, if still usable.
    pub fn dentry(&self, parent: Ino, name: &[u8]) -> Option<CachedEntry> {
        self.dentry_at(parent, name, Instant::now())
    }

    fn dentry_at(&self, parent: Ino, name: &[u8], now: Instant) -> Option<CachedEntry> {
        let key = (parent, name.to_vec());
        let hit = self.dentries.get(&key)?;
        if hit.usable(self.epoch(), self.ttl, now) {
            hit.touch(self.tick(now));
            let mut entry = hit.value.clone();
            let filled_at = hit.filled_at;
            drop(hit);
            if let Some(own) = self.own.get(&entry.attr.ino) {
                if own.1 >= filled_at {
                    match &own.0 {
                        Some(attr) => entry.attr = attr.clone(),
                        None => {
                            drop(own);
                            self.dentries.remove(&key);
                            return None;
                        }
                    }
                }
            }
            return Some(entry);
        }
        drop(hit);
        self.dentries.remove(&key);
        None
    }

    /// Records attributes this client just changed (a setattr or link reply): cached
    /// entries naming `attr.ino` show them from now on.
    pub fn note_attr(&self, attr: &Attr) {
        self.note_own(attr.ino, Some(attr.clone()));
    }

    /// Records that this client changed `ino` in a way whose result it does not know (an
    /// unlink of one of its names): cached entries naming it are not served any more.
    pub fn forget_attr(&self, ino: Ino) {
        self.note_own(ino, None);
    }

    fn note_own(&self, ino: Ino, attr: Option<Attr>) {
        if self.own.len() > self.capacity {
            // A change older than the TTL covers no entry that may still be served with
            // attributes (those expire within the TTL). If younger ones fill the table, the
            // entries they cover go with them: forgetting a change while an entry filled
            // before it is still served would show this client its own write undone.
            let now = Instant::now();
            self.own
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < self.ttl);
            if self.own.len() > self.capacity / 2 {
                self.own.clear();
                self.dentries.clear();
            }
        }
        self.own.insert(ino, (attr, Instant::now()));
    }

    /// Caches entry `name` of `parent` as read or written at epoch `epoch`. Entries of a
    /// strict parent are kept only when they are directories.
    pub fn insert_dentry(
        &self,
        parent: Ino,
        parent_class: Class,
        name: &[u8],
        attr: &Attr,
        epoch: u64,
    ) {
        self.insert_dentry_at(parent, parent_class, name, attr, epoch, Instant::now())
    }

    fn insert_dentry_at(
        &self,
        parent: Ino,
        parent_class: Class,
        name: &[u8],
        attr: &Attr,
        epoch: u64,
        now: Instant,
    ) {
        if attr.kind == FileKind::Directory {
            self.classes.insert(attr.ino, attr.class);
        }
        if parent_class == Class::Strict && attr.kind != FileKind::Directory {
            return;
        }
        if epoch == 0 && attr.kind == FileKind::Directory {
            return;
        }
        if epoch < self.epoch() {
            return;
        }
        let expires = parent_class == Class::Relaxed || attr.class == Class::Relaxed;
        let value = CachedEntry {
            attr: attr.clone(),
            parent_class,
        };
        self.dentries.insert(
            (parent, name.to_vec()),
            Stamped::new(value, now, epoch, expires, self.tick(now)),
        );
        self.note_insert();
    }

    /// Forgets entry `name` of `parent`.
    pub fn remove_dentry(&self, parent: Ino, name: &[u8]) {
        self.dentries.remove(&(parent, name.to_vec()));
    }

    /// The directory at full path `path`, if cached and usable.
    pub fn dir(&self, path: &[u8]) -> Option<(Ino, Class)> {
        self.dir_at(path, Instant::now())
    }

    fn dir_at(&self, path: &[u8], now: Instant) -> Option<(Ino, Class)> {
        let hit = self.dirs.get(path)?;
        if hit.usable(self.epoch(), self.ttl, now) {
            hit.touch(self.tick(now));
            return Some(hit.value);
        }
        drop(hit);
        self.dirs.remove(path);
        None
    }

    /// Caches directory `path` → `(ino, class)`. `relaxed_on_path` says whether any
    /// directory on the way (or the directory itself) is relaxed, which bounds the entry by
    /// the TTL.
    pub fn insert_dir(
        &self,
        path: &[u8],
        ino: Ino,
        class: Class,
        epoch: u64,
        relaxed_on_path: bool,
    ) {
        self.insert_dir_at(path, ino, class, epoch, relaxed_on_path, Instant::now())
    }

    fn insert_dir_at(
        &self,
        path: &[u8],
        ino: Ino,
        class: Class,
        epoch: u64,
        relaxed_on_path: bool,
        now: Instant,
    ) {
        self.classes.insert(ino, class);
        if epoch == 0 || epoch < self.epoch() {
            return;
        }
        let expires = relaxed_on_path || class == Class::Relaxed;
        self.dirs.insert(
            path.to_vec(),
            Stamped::new((ino, class), now, epoch, expires, self.tick(now)),
        );
        self.note_insert();
    }

    /// Forgets directory path `path` and every cached path below it.
    pub fn remove_dir_tree(&self, path: &[u8]) {
        self.dirs.retain(|k, _| {
            !(k.as_slice() == path
                || (k.starts_with(path) && (path == b"/" || k.get(path.len()) == Some(&b'/'))))
        });
    }

    /// The class of directory `ino`, if known.
    pub fn class_of(&self, ino: Ino) -> Option<Class> {
        self.classes.get(&ino).map(|c| *c)
    }

    /// Records the class of directory `ino`.
    pub fn set_class(&self, ino: Ino, class: Class) {
        self.classes.insert(ino, class);
    }

    /// Forgets the class of directory `ino` (after a `ClassChanged` answer, or its removal).
    pub fn forget_class(&self, ino: Ino) {
        self.classes.remove(&ino);
    }

    /// Drops the class table.
    pub fn clear_classes(&self) {
        self.classes.clear();
    }

    /// Drops everything but the class table.
    pub fn clear(&self) {
        self.dentries.clear();
        self.own.clear();
        self.dirs.clear();
    }

    /// Number of cached dentries and directory paths.
    pub fn sizes(&self) -> (usize, usize) {
        (self.dentries.len(), self.dirs.len())
    }

    fn note_insert(&self) {
        if !self
            .inserts
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(CAPACITY_CHECK_EVERY)
        {
            return;
        }
        let (epoch, ttl, now) = (self.epoch(), self.ttl, Instant::now());
        shrink(&self.dentries, self.capacity, |v| v.usable(epoch, ttl, now));
        shrink(&self.dirs, self.capacity, |v| v.usable(epoch, ttl, now));
        if self.classes.len() > self.capacity {
            self.classes.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talon_model::Time;

    fn attr(ino: u64, kind: FileKind, class: Class) -> Attr {
        Attr {
            ino: Ino(ino),
            kind,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 1,
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
            crtime: Time::default(),
            generation: 0,
            class,
            rdev: 0,
            parent: Ino(0),
        }
    }

    const TTL: Duration = Duration::from_millis(500);

    #[test]
    fn relaxed_entries_expire_after_the_ttl() {
        let c = PathCache::new(1, TTL, 100);
        let t0 = Instant::now();
        let a = attr(10, FileKind::Regular, Class::Relaxed);
        c.insert_dentry_at(Ino(1), Class::Relaxed, b"f", &a, 1, t0);
        assert!(c.dentry_at(Ino(1), b"f", t0 + TTL / 2).is_some());
        assert!(c.dentry_at(Ino(1), b"f", t0 + TTL).is_none());
        // An expired entry is dropped on the way.
        assert!(c.dentry_at(Ino(1), b"f", t0).is_none());
    }

    #[test]
    fn strict_directories_do_not_expire_but_files_are_never_cached() {
        let c = PathCache::new(1, TTL, 100);
        let t0 = Instant::now();
        let d = attr(11, FileKind::Directory, Class::Strict);
        let f = attr(12, FileKind::Regular, Class::Strict);
        c.insert_dentry_at(Ino(5), Class::Strict, b"d", &d, 1, t0);
        c.insert_dentry_at(Ino(5), Class::Strict, b"f", &f, 1, t0);
        let hit = c
            .dentry_at(Ino(5), b"d", t0 + TTL * 100)
            .expect("strict dir cached");
        assert!(!hit.serves_final_stat());
        assert!(c.dentry_at(Ino(5), b"f", t0).is_none());
        assert_eq!(c.class_of(Ino(11)), Some(Class::Strict));
    }

    #[test]
    fn a_newer_epoch_drops_older_entries() {
        let c = PathCache::new(1, TTL, 100);
        let t0 = Instant::now();
        let d = attr(11, FileKind::Directory, Class::Strict);
        c.insert_dentry_at(Ino(5), Class::Strict, b"d", &d, 1, t0);
        c.insert_dir_at(b"/x/d", Ino(11), Class::Strict, 1, false, t0);
        assert!(!c.observe_epoch(1));
        assert!(c.dir_at(b"/x/d", t0).is_some());
        assert!(c.observe_epoch(2));
        assert_eq!(c.epoch(), 2);
        assert!(c.dentry_at(Ino(5), b"d", t0).is_none());
        assert!(c.dir_at(b"/x/d", t0).is_none());
        // Fills stamped before the new epoch are not taken in.
        c.insert_dir_at(b"/x/d", Ino(11), Class::Strict, 1, false, t0);
        assert!(c.dir_at(b"/x/d", t0).is_none());
        // The class table survives: classes only change on empty directories.
        assert_eq!(c.class_of(Ino(11)), Some(Class::Strict));
        // An older epoch never moves the cache backwards.
        assert!(!c.observe_epoch(1));
        assert_eq!(c.epoch(), 2);
    }

    #[test]
    fn directory_paths_expire_when_relaxed_and_trees_are_removed_by_component() {
        let c = PathCache::new(1, TTL, 100);
        let t0 = Instant::now();
        c.insert_dir_at(b"/a", Ino(2), Class::Relaxed, 1, true, t0);
        c.insert_dir_at(b"/a/b", Ino(3), Class::Strict, 1, true, t0);
        c.insert_dir_at(b"/ab", Ino(4), Class::Strict, 1, false, t0);
        assert!(c.dir_at(b"/a/b", t0 + TTL).is_none());
        assert!(c.dir_at(b"/ab", t0 + TTL * 10).is_some());
        c.insert_dir_at(b"/a/b", Ino(3), Class::Strict, 1, true, t0);
        c.remove_dir_tree(b"/a");
        assert!(c.dir_at(b"/a", t0).is_none());
        assert!(c.dir_at(b"/a/b", t0).is_none());
        assert!(c.dir_at(b"/ab", t0).is_some());
    }

    #[test]
    fn nothing_resolves_from_epoch_zero() {
        let c = PathCache::new(0, TTL, 100);
        let t0 = Instant::now();
        let d = attr(11, FileKind::Directory, Class::Relaxed);
        let f = attr(12, FileKind::Regular, Class::Relaxed);
        c.insert_dentry_at(Ino(1), Class::Relaxed, b"d", &d, 0, t0);
        c.insert_dentry_at(Ino(1), Class::Relaxed, b"f", &f, 0, t0);
        c.insert_dir_at(b"/d", Ino(11), Class::Relaxed, 0, true, t0);
        assert!(c.dentry_at(Ino(1), b"d", t0).is_none());
        assert!(c.dir_at(b"/d", t0).is_none());
        assert!(c.dentry_at(Ino(1), b"f", t0).is_some());
        assert_eq!(c.class_of(Ino(11)), Some(Class::Relaxed));
    }

    #[test]
    fn own_changes_show_through_cached_entries() {
        // Fills and reads take explicit times, so a slow run cannot outlive the TTL; the
        // change records take the real clock, so the fills are placed around them.
        let c = PathCache::new(1, TTL, 100);
        let f = attr(12, FileKind::Regular, Class::Relaxed);
        let t0 = Instant::now();
        c.insert_dentry_at(Ino(1), Class::Relaxed, b"f", &f, 1, t0);
        c.insert_dentry_at(Ino(1), Class::Relaxed, b"g", &f, 1, t0);
        let linked = Attr {
            nlink: 2,
            ..f.clone()
        };
        c.note_attr(&linked);
        let noted_by = Instant::now();
        assert_eq!(c.dentry_at(Ino(1), b"g", t0).map(|e| e.attr.nlink), Some(2));
        // A fill after the change is newer than it: stamp it strictly after the change.
        let t1 = loop {
            let t = Instant::now();
            if t > noted_by {
                break t;
            }
        };
        c.insert_dentry_at(
            Ino(1),
            Class::Relaxed,
            b"g",
            &Attr {
                nlink: 3,
                ..f.clone()
            },
            1,
            t1,
        );
        assert_eq!(c.dentry_at(Ino(1), b"g", t1).map(|e| e.attr.nlink), Some(3));
        // Recorded no earlier than t1, so after both fills.
        c.forget_attr(Ino(12));
        assert!(c.dentry_at(Ino(1), b"f", t0).is_none());
        assert!(c.dentry_at(Ino(1), b"g", t1).is_none());
    }

    /// A table past its capacity drops its least recently used entries, not everything: a
    /// directory used throughout a traversal bigger than the cache stays cached.
    #[test]
    fn a_full_table_drops_the_least_recently_used() {
        let c = PathCache::new(1, Duration::from_secs(3600), 64);
        let dir = attr(2, FileKind::Directory, Class::Relaxed);
        let file = attr(10, FileKind::Regular, Class::Relaxed);
        let t0 = Instant::now();
        c.insert_dentry_at(Ino(1), Class::Relaxed, b"hot", &dir, 1, t0);
        c.insert_dir_at(b"/hot", Ino(2), Class::Relaxed, 1, true, t0);
        let n = CAPACITY_CHECK_EVERY * 4;
        for i in 0..n {
            // A traversal: each step a few milliseconds after the last.
            let now = t0 + Duration::from_millis(3 * i as u64 + 1);
            assert!(
                c.dentry_at(Ino(1), b"hot", now).is_some(),
                "hot entry lost at {i}"
            );
            assert!(c.dir_at(b"/hot", now).is_some(), "hot path lost at {i}");
            let name = format!("f{i}");
            c.insert_dentry_at(Ino(2), Class::Relaxed, name.as_bytes(), &file, 1, now);
            let path = format!("/hot/d{i}");
            c.insert_dir_at(path.as_bytes(), Ino(3), Class::Relaxed, 1, true, now);
        }
        let (dentries, dirs) = c.sizes();
        assert!(dentries <= 64 + CAPACITY_CHECK_EVERY, "{dentries} dentries");
        assert!(dirs <= 64 + CAPACITY_CHECK_EVERY, "{dirs} paths");
        // The newest of the traversal are still there too: the table was not emptied.
        let last = t0 + Duration::from_millis(3 * n as u64);
        let name = format!("f{}", n - 1);
        assert!(c.dentry_at(Ino(2), name.as_bytes(), last).is_some());
    }

    /// Own changes that overflow their table take the entries they cover with them, so an
    /// entry filled before this client's change never shows the change undone.
    #[test]
    fn own_changes_are_never_forgotten_while_entries_they_cover_are_served() {
        let c = PathCache::new(1, Duration::from_secs(3600), 16);
        let before = attr(10, FileKind::Regular, Class::Relaxed);
        c.insert_dentry(Ino(1), Class::Relaxed, b"f", &before, 1);
        let mut after = before.clone();
        after.perm = 0o600;
        c.note_attr(&after);
        for i in 0..40u64 {
            c.note_attr(&attr(100 + i, FileKind::Regular, Class::Relaxed));
        }
        match c.dentry(Ino(1), b"f") {
            None => {}
            Some(e) => assert_eq!(e.attr.perm, 0o600, "own chmod undone"),
        }
    }

    #[test]
    fn capacity_is_bounded() {
        let c = PathCache::new(1, TTL, 16);
        let a = attr(10, FileKind::Regular, Class::Relaxed);
        for i in 0..(CAPACITY_CHECK_EVERY * 3) {
            c.insert_dentry(Ino(1), Class::Relaxed, format!("f{i}").as_bytes(), &a, 1);
        }
        assert!(c.sizes().0 <= CAPACITY_CHECK_EVERY + 16);
    }
}
