//! Directory attribute updates waiting to be proposed: a directory's link count change and
//! the newest mtime/ctime its entries' changes gave it, merged per directory.
//!
//! DESIGN.md lets a directory's attributes (mtime, nlink) lag its entries "within a bound".
//! The node queues here the updates of two kinds of change and proposes the whole queue
//! every 50 ms, merged into one proposal per home partition:
//!
//! - a file entry created, removed or renamed in a *relaxed* directory whose home
//!   partition this node leads, by this node or by another that served the change and
//!   asked this one (`PeerRequest::TouchDir`; the hot path of a bulk import or an mdtest
//!   create phase: a second Raft commit per file otherwise);
//! - an update the home's leader did not take, asked or proposed (a leader change, a node
//!   out of reach): queued on the node that served the change.
//!
//! What keeps a queued update invisible to its client:
//!
//! - **Overlay.** Every attribute a read of the directory returns on this node goes
//!   through [`DirTouches::overlay`], which adds what is queued, and the times of what
//!   was taken and whose proposal has not landed yet ([`DirTouches::landed`]): a read
//!   between a take and the apply of its proposal must not see the times go back (the
//!   mount's own `stat` of the directory after a create did, now and then). Writes, strict reads and
//!   session reads of a partition go to its leader, the node that queued the update, so
//!   the client that made the change sees the directory's new mtime at once; other
//!   clients' relaxed reads may see it up to the flush period late.
//! - **Order.** A queued update commutes with every other change of the directory
//!   (times take the maximum, link counts add), except a setattr that sets the times
//!   explicitly: that one must take [`DirTouches::take`] and propose what is queued
//!   first, or the flush would move its mtime forward again.
//!
//! What it gives up: a node that crashes loses the updates it had queued (at most one
//! flush period of them); the entries themselves were committed before the client was
//! answered, only the directory's mtime stays older. Link count changes (a subdirectory
//! made or removed) are never queued on purpose, so a lost update never leaves a wrong
//! link count.
//!
//! The queue knows nothing of Raft or partitions: the node decides what to queue and
//! proposes what it takes.

use std::collections::BTreeMap;
use std::sync::Mutex;
use talon_model::{Attr, Ino, Time};

/// One directory's queued update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Touch {
    /// Link count change.
    pub nlink: i32,
    /// The newest time an entry change gave the directory (its mtime and ctime at least).
    pub now: Time,
}

/// The queued updates, by directory, and the ones taken and not landed yet.
#[derive(Debug, Default)]
pub struct DirTouches(Mutex<Queue>);

#[derive(Debug, Default)]
struct Queue {
    queued: BTreeMap<Ino, Touch>,
    /// By directory: the newest time of the updates taken and not yet landed, and how many
    /// takes of it are under way.
    in_flight: BTreeMap<Ino, (Time, u32)>,
}

impl Queue {
    fn mark_taken(&mut self, dir: Ino, t: &Touch) {
        let f = self.in_flight.entry(dir).or_insert((t.now, 0));
        f.0 = f.0.max(t.now);
        f.1 += 1;
    }
}

impl DirTouches {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues an update of `dir`, merged with any already queued.
    pub fn add(&self, dir: Ino, nlink: i32, now: Time) {
        let mut g = self.queue();
        let t = g.queued.entry(dir).or_insert(Touch { nlink: 0, now });
        t.nlink += nlink;
        t.now = t.now.max(now);
    }

    /// `a` as it will be once what is queued for it is applied (as `Op::TouchDir` applies
    /// it: link count at least 2, times at least the update's), with the times of what was
    /// taken and has not landed (its link count change may be applied already: not added
    /// twice).
    pub fn overlay(&self, a: &mut Attr) {
        let g = self.queue();
        if let Some(t) = g.queued.get(&a.ino) {
            a.nlink = (i64::from(a.nlink) + i64::from(t.nlink)).max(2) as u32;
            a.mtime = a.mtime.max(t.now);
            a.ctime = a.ctime.max(t.now);
        }
        if let Some((now, _)) = g.in_flight.get(&a.ino) {
            a.mtime = a.mtime.max(*now);
            a.ctime = a.ctime.max(*now);
        }
    }

    /// Takes what is queued for `dir`, if anything; the caller proposes it, holding a
    /// [`DirTouches::landing`] for it (when the proposal fails, it adds the update back
    /// before that lands).
    pub fn take(&self, dir: Ino) -> Option<Touch> {
        let mut g = self.queue();
        let t = g.queued.remove(&dir)?;
        g.mark_taken(dir, &t);
        Some(t)
    }

    /// Takes everything queued, as [`DirTouches::take`] does.
    pub fn take_all(&self) -> BTreeMap<Ino, Touch> {
        let mut g = self.queue();
        let all = std::mem::take(&mut g.queued);
        for (dir, t) in &all {
            g.mark_taken(*dir, t);
        }
        all
    }

    /// Calls [`DirTouches::landed`] for `dirs` when dropped: held across a proposal, so
    /// that one abandoned half-way (its caller went away) lands too.
    pub fn landing(&self, dirs: Vec<Ino>) -> Landing<'_> {
        Landing { queue: self, dirs }
    }

    /// The proposals of what was taken for `dirs` have been applied, or given up.
    pub fn landed(&self, dirs: impl IntoIterator<Item = Ino>) {
        let mut g = self.queue();
        for dir in dirs {
            if let Some(f) = g.in_flight.get_mut(&dir) {
                f.1 -= 1;
                if f.1 == 0 {
                    g.in_flight.remove(&dir);
                }
            }
        }
    }
}

/// See [`DirTouches::landing`].
#[derive(Debug)]
pub struct Landing<'a> {
    queue: &'a DirTouches,
    dirs: Vec<Ino>,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        self.queue.landed(std::mem::take(&mut self.dirs));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talon_model::{Class, FileKind};

    fn at(secs: i64) -> Time {
        Time { secs, nanos: 0 }
    }

    fn dir(ino: u64, nlink: u32, t: i64) -> Attr {
        Attr {
            ino: Ino(ino),
            kind: FileKind::Directory,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink,
            atime: at(t),
            mtime: at(t),
            ctime: at(t),
            crtime: at(t),
            generation: 0,
            class: Class::Relaxed,
            rdev: 0,
            parent: Ino(1),
        }
    }

    #[test]
    fn updates_of_one_directory_merge_and_show_through_the_overlay() {
        let q = DirTouches::default();
        q.add(Ino(7), 0, at(30));
        q.add(Ino(7), 0, at(20));
        q.add(Ino(7), 1, at(25));
        let mut a = dir(7, 3, 10);
        q.overlay(&mut a);
        assert_eq!(a.nlink, 4);
        assert_eq!(a.mtime, at(30));
        assert_eq!(a.ctime, at(30));
        // Another directory is left as it is.
        let mut b = dir(8, 2, 10);
        q.overlay(&mut b);
        assert_eq!(b, dir(8, 2, 10));
    }

    #[test]
    fn the_overlay_never_moves_times_back_nor_links_below_two() {
        let q = DirTouches::default();
        q.add(Ino(7), -3, at(5));
        let mut a = dir(7, 3, 10);
        q.overlay(&mut a);
        assert_eq!(a.nlink, 2);
        assert_eq!(a.mtime, at(10));
    }

    #[test]
    fn a_taken_update_shows_its_times_until_it_lands() {
        let q = DirTouches::default();
        q.add(Ino(7), 1, at(30));
        q.add(Ino(9), 0, at(40));
        assert_eq!(
            q.take(Ino(7)),
            Some(Touch {
                nlink: 1,
                now: at(30)
            })
        );
        // Proposed, not applied yet: the times still show, the link count is not added
        // again (the store may hold it already).
        let mut a = dir(7, 2, 10);
        q.overlay(&mut a);
        assert_eq!((a.mtime, a.ctime, a.nlink), (at(30), at(30), 2));
        assert_eq!(q.take_all().len(), 1);
        assert!(q.take(Ino(9)).is_none());
        q.landed([Ino(7)]);
        let mut a = dir(7, 2, 10);
        q.overlay(&mut a);
        assert_eq!(a.mtime, at(10));
        // Two takes of one directory under way: it shows until both have landed.
        q.add(Ino(9), 0, at(50));
        assert!(q.take(Ino(9)).is_some());
        drop(q.landing(vec![Ino(9)]));
        let mut b = dir(9, 2, 10);
        q.overlay(&mut b);
        assert_eq!(b.mtime, at(50));
        q.landed([Ino(9)]);
        let mut b = dir(9, 2, 10);
        q.overlay(&mut b);
        assert_eq!(b.mtime, at(10));
    }
}
