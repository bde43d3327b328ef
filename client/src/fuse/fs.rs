//! [`TalonFs`]: the kernel's FUSE requests, each answered from a task on the client's tokio
//! runtime, or at once when it needs nothing from the cluster.
//!
//! The FUSE session thread only decodes a request, copies what it needs out of it and
//! spawns a task that owns the `Reply*` object; it never waits for the cluster, so as many
//! requests can be in flight as the kernel sends (it bounds them itself). The two requests
//! that a warm epoch over relaxed files sends for every image are answered in the session
//! thread itself, without a trip through the runtime: a relaxed read-only open (deferred,
//! see `data`) and the release of a handle with nothing to commit; a read-only open asks
//! the kernel for no flush at all (`open_flags`), and a flush of a handle with nothing to
//! commit is answered here too. So is the kernel's `security.capability` check before the
//! first write to a relaxed file this mount has just created (it has no xattrs yet; see
//! `Shared::fresh`): the kernel checks once per file it holds, and leaves clearing set-ID
//! bits and capabilities to the mount, which leaves them to the cluster's commit
//! (`FUSE_HANDLE_KILLPRIV_V2`; without it the kernel checks before every write). And so
//! is the kernel's getattr of a relaxed directory right after this mount's own create or
//! remove in it, from the attributes that change's answer carried (`Shared::own_dirs`).
//! A lookup, a getattr, a read and a write start in the session thread and finish there
//! when nothing makes them wait (a relaxed read that the node in this very process answers
//! at once, as `talon up`'s does; a write the handle only buffers); one that must wait (the
//! network, a ReadIndex, a lock) goes on in the runtime. Ordering between requests is the
//! kernel's business: it already serialises what POSIX requires (a write returns before
//! the `close` that flushes it, directory operations on one name hold its lock), and the
//! mount adds no ordering of its own beyond one lock per open directory.
//!
//! What the mount keeps per inode is only what the kernel cannot: open file and directory
//! handles ([`handles`](super::handles)). Inode numbers are Talon's, unchanged (both number
//! the root 1), and never reused, so `forget` has nothing to release.
//!
//! Caching: entries and attributes of relaxed inodes carry the relaxed TTL (by default the
//! cluster's staleness bound), strict ones a zero TTL, so every access to a strict path asks
//! the cluster and sees its linearizable state. A name missing from a relaxed directory is
//! a negative entry with the relaxed TTL. Relaxed files keep the page cache across
//! opens; the kernel drops it when it sees the size or mtime change (`FUSE_AUTO_INVAL_DATA`).
//!
//! Permissions are checked by the kernel from the mode bits (`default_permissions`), with
//! the caller's supplementary groups; the mount passes the caller's uid and gid as the owner
//! of what it creates. (`access` is answered here only for a kernel that asks despite
//! `default_permissions`.)
//!
//! Times: atime is set at creation and by explicit `utimens`, never by reads (the
//! `noatime` policy): an epoch of reads over millions of training files must not become
//! millions of replicated writes. `fallocate` supports mode 0 (grow to cover the range) and
//! `FALLOC_FL_KEEP_SIZE` (nothing to reserve: space is taken when data is written); other
//! modes answer EOPNOTSUPP.

use super::convert::{errno, file_attr, file_type, mknod_kind, negative_entry, talon_time, Ttls};
use super::data::{self, OpenFile};
use super::handles::{DirListing, HandleTable, ListedEntry};
use crate::client::Client;
use crate::types::{CreateSpec, DirChange, RenameFlags, SetAttr, TimeSet, XattrFlags};
use dashmap::{DashMap, DashSet};
use fuser::{
    AccessFlags, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use futures::FutureExt;
use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use talon_model::{Attr, Class, Errno, FileKind, Ino, TalonError};

/// The read-ahead offered to the kernel at INIT, and given to the mount's device (see
/// `widen_readahead`): a sequential reader's reads are this large.
pub const MAX_READAHEAD: u32 = 1 << 20;

/// Entries fetched per ReadDir RPC for a listing; the kernel takes them a buffer at a time.
const READDIR_PAGE: u32 = 512;

/// The virtual xattr showing (and, on an empty directory, setting) a directory's class.
pub const CLASS_XATTR: &[u8] = b"user.talon.class";

/// Xattr namespaces stored as given. Others (`system.*` ACLs, names without a namespace
/// such as Talon's internal `talon.*`) are not supported, as on a file system without ACLs.
const XATTR_NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// Block size of `statfs`. Sizes and free space come from the nodes' data file systems
/// (see `StatFs`); Talon has no inode table to run out of, so free inodes are shown as a
/// large constant (2^40), as other cluster file systems do.
const STATFS_BSIZE: u64 = 4096;
const STATFS_FREE_INODES: u64 = 1 << 40;

/// State shared by the session thread and the request tasks.
pub(crate) struct Shared {
    client: Client,
    rt: tokio::runtime::Handle,
    ttls: Ttls,
    files: HandleTable<OpenFile>,
    dirs: HandleTable<tokio::sync::Mutex<DirListing>>,
    /// Open file handles of each inode, to read a writer's size and to find them on unlink.
    open_inos: DashMap<Ino, Vec<u64>>,
    strict_prefixes: Vec<String>,
    /// Mode bits and group of directories as last shown to the kernel, for the group a new
    /// entry inherits from a setgid parent (see [`Shared::owner_in`]). The kernel looks a
    /// parent up, and checks it, before it creates in it, so this is as fresh as what the
    /// kernel used for its permission check.
    dir_modes: DashMap<Ino, (u32, u32)>,
    /// Inodes last shown to the kernel as relaxed: their attributes and xattrs are read
    /// from any replica (bounded staleness; this mount's own changes show at once, see
    /// `Client::read_for`). An inode not in it is read strictly, so forgetting one is safe.
    relaxed: DashSet<Ino>,
    /// Relaxed files this mount has just created, until a handle of theirs is released or
    /// this mount sets an xattr on them: they have no xattrs, so a `getxattr` (the kernel
    /// asks for `security.capability` before the first write to every file) or `listxattr`
    /// is answered in the session thread, for at most the relaxed TTL after the create (the
    /// staleness another client's xattr may have anyway).
    fresh: DashMap<Ino, Instant>,
    /// Relaxed directories' attributes as this mount's own last create or remove in them
    /// left them (its answer carries them, see [`DirChange`]). The kernel drops a
    /// directory's attributes at every change in it and, checking permissions, asks for
    /// them again before the next one: for the relaxed TTL that question is answered from
    /// here, not by a replica, and a create or a remove costs one request to the cluster
    /// fewer. The kernel serialises the changes to one directory's entries (it holds the
    /// directory's lock), so the last answer is the newest. Every other change this mount
    /// makes to a directory forgets it (setattr, xattrs, a link into it), and so does a
    /// change whose answer carries nothing or that failed.
    own_dirs: DashMap<Ino, OwnDir>,
    /// Renames this mount has begun or finished. A rename moves a directory without
    /// holding that directory's lock, so it may overlap a change in it: an attribute in
    /// `own_dirs` is served only while this count is what it was when its change began.
    renames: AtomicU64,
    /// Tells the kernel to drop pages it cached (see [`Shared::changed_under_others`]);
    /// set once the session is up.
    notifier: std::sync::OnceLock<fuser::Notifier>,
}

/// A directory's attributes after this mount's own change to its entries (`own_dirs`).
struct OwnDir {
    attr: Attr,
    at: Instant,
    /// `Shared::renames` when the change began.
    renames: u64,
}

/// Directories remembered in `dir_modes` before it is emptied and refilled on demand.
const DIR_MODES_MAX: usize = 100_000;

/// Relaxed inodes remembered in `relaxed` before it is emptied and refilled on demand.
const RELAXED_MAX: usize = 1_000_000;

/// The FUSE file system of one mount.
pub struct TalonFs {
    s: Arc<Shared>,
}

impl TalonFs {
    /// A file system over `client`, answering requests on runtime `rt`. Relaxed entries and
    /// attributes are cached by the kernel for `relaxed_ttl`.
    pub fn new(client: Client, rt: tokio::runtime::Handle, relaxed_ttl: Duration) -> TalonFs {
        let strict_prefixes = client.cluster_map().strict_prefixes;
        TalonFs {
            s: Arc::new(Shared {
                client,
                rt,
                ttls: Ttls {
                    relaxed: relaxed_ttl,
                },
                files: HandleTable::new(),
                dirs: HandleTable::new(),
                open_inos: DashMap::new(),
                strict_prefixes,
                dir_modes: DashMap::new(),
                relaxed: DashSet::new(),
                fresh: DashMap::new(),
                own_dirs: DashMap::new(),
                renames: AtomicU64::new(0),
                notifier: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The mount's shared state, for [`Shared::set_notifier`] once the session is up.
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.s.clone()
    }

    /// Runs `f` on the runtime; its reply is sent from there.
    fn spawn<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let s = self.s.clone();
        self.s.rt.spawn(f(s));
    }

    /// Runs `f` here, in the session thread, as far as it goes without waiting, and on the
    /// runtime from there if it must wait. For point reads that the node in this process
    /// usually answers from memory (a lookup, a getattr, a small body) and for writes a
    /// handle only buffers: no hop through the runtime.
    fn answer_or_spawn<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let _in_runtime = self.s.rt.enter();
        let mut fut = Box::pin(f(self.s.clone()));
        if fut.as_mut().now_or_never().is_none() {
            self.s.rt.spawn(fut);
        }
    }
}

/// The kernel's open flags for a file of `class` opened with `flags`. Relaxed files may
/// keep their page cache across opens (the kernel still drops it when it sees the size or
/// mtime change); strict ones start afresh on every open, which together with the flush at
/// close gives close-to-open consistency. A handle opened read-only, without `O_TRUNC`, has
/// nothing to commit at close, so the kernel is told not to send its FLUSH
/// (`FOPEN_NOFLUSH`; this mount keeps no POSIX locks that a flush would release): one
/// request fewer for every read of a file.
pub fn open_flags(class: Class, flags: i32) -> FopenFlags {
    let mut f = match class {
        Class::Relaxed => FopenFlags::FOPEN_KEEP_CACHE,
        Class::Strict => FopenFlags::empty(),
    };
    if flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_TRUNC == 0 {
        f |= FopenFlags::FOPEN_NOFLUSH;
    }
    f
}

fn name_of(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

fn ino(n: INodeNo) -> Ino {
    Ino(n.0)
}

fn posix(errno: Errno, msg: impl Into<String>) -> TalonError {
    TalonError::posix(errno, msg)
}

/// ENOENT for an inode the kernel named by number becomes ESTALE: the inode went away
/// between the kernel's lookup and this call (a rename replaced it, say), and on ESTALE the
/// kernel looks the path up again and retries, as it does for NFS, instead of failing an
/// `open` or `stat` of a name that exists.
fn stale(e: TalonError) -> TalonError {
    if e.errno() == Errno::ENOENT {
        posix(Errno::ESTALE, e.to_string())
    } else {
        e
    }
}

/// Whether a truncate by `req`'s caller (`truncate(2)`, or an open with `O_TRUNC`) clears
/// the file's set-ID bits. With `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves that to the
/// file system and flags a caller without `CAP_FSETID`; the flag reaches a write here, but
/// not a setattr or an open, so a caller's uid 0 stands for the capability there. A chown
/// clears them whoever makes it (the cluster does, see `Op::DropPrivileges`).
fn caller_drops_setid(req: &Request) -> bool {
    req.uid() != 0
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(talon_time(t)),
    }
}

/// Whether a caller with `uid`/`gid` may access `a` as `mask` (R_OK/W_OK/X_OK bits) asks.
/// Supplementary groups are not known to FUSE and are not considered.
pub(crate) fn permitted(a: &Attr, uid: u32, gid: u32, mask: u32) -> bool {
    let mask = mask & 7;
    if uid == 0 {
        // Root may read and write anything, and execute what anyone may execute.
        return mask & 1 == 0 || a.kind == FileKind::Directory || a.perm & 0o111 != 0;
    }
    let bits = if uid == a.uid {
        a.perm >> 6
    } else if gid == a.gid {
        a.perm >> 3
    } else {
        a.perm
    } & 7;
    mask & !bits == 0
}

/// The reply to an xattr read: its size when the caller asked for 0 bytes, ERANGE when the
/// caller's buffer is too small, else the bytes.
fn reply_xattr(reply: ReplyXattr, size: u32, value: &[u8]) {
    match u32::try_from(value.len()) {
        Ok(len) if size == 0 => reply.size(len),
        Ok(len) if len <= size => reply.data(value),
        _ => reply.error(fuser::Errno::from_i32(libc::ERANGE)),
    }
}

fn xattr_supported(name: &[u8]) -> bool {
    XATTR_NAMESPACES.iter().any(|ns| name.starts_with(ns))
}

impl Shared {
    /// The entries of open directory `fh` (of `dir`) from `offset`, fetching pages as
    /// needed, with the directory's attributes as the listing holds them.
    async fn listing_from(
        &self,
        fh: u64,
        dir: Ino,
        offset: u64,
        op: &str,
    ) -> Result<(Vec<(u64, ListedEntry)>, Attr), fuser::Errno> {
        let Some(listing) = self.dirs.get(fh) else {
            return Err(fuser::Errno::from_i32(libc::EBADF));
        };
        let mut listing = listing.lock().await;
        let client = self.client.clone();
        let fetch = |c| {
            let client = client.clone();
            async move { client.readdir_page(dir, &c, READDIR_PAGE, true).await }
        };
        let entries = listing
            .entries_from(offset, fetch)
            .await
            .map_err(|e| errno(op, &e))?;
        Ok((entries, listing.dir.clone()))
    }

    fn entry(&self, reply: ReplyEntry, a: &Attr) {
        self.note_shown(a);
        let ttl = self.ttls.of(a.class);
        reply.entry(&ttl, &file_attr(a), Generation(0));
    }

    fn attr(&self, reply: ReplyAttr, a: &Attr) {
        self.note_shown(a);
        reply.attr(&self.ttls.of(a.class), &file_attr(a));
    }

    /// Remembers what the kernel is shown of an inode: its class, and a directory's mode.
    fn note_shown(&self, a: &Attr) {
        self.note_dir_mode(a);
        match a.class {
            Class::Relaxed => {
                if self.relaxed.len() >= RELAXED_MAX {
                    self.relaxed.clear();
                }
                self.relaxed.insert(a.ino);
            }
            Class::Strict => {
                self.relaxed.remove(&a.ino);
            }
        }
    }

    /// Remembers a directory's mode bits and group as shown to the kernel.
    fn note_dir_mode(&self, a: &Attr) {
        if a.kind != FileKind::Directory {
            return;
        }
        if self.dir_modes.len() >= DIR_MODES_MAX {
            self.dir_modes.clear();
        }
        self.dir_modes.insert(a.ino, (a.perm, a.gid));
    }

    /// The owner of a new entry that `(uid, gid)` creates in `parent`, and whether `parent`
    /// is a setgid directory. In a setgid directory a new entry takes the directory's group
    /// (and a new subdirectory the setgid bit, which the caller adds), as on a local file
    /// system; otherwise it takes the creator's.
    async fn owner_in(&self, parent: Ino, (uid, gid): (u32, u32)) -> ((u32, u32), bool) {
        let known = self.dir_modes.get(&parent).map(|e| *e);
        let (perm, dir_gid) = match known {
            Some(m) => m,
            None => match self.client.getattr(parent).await {
                Ok(a) => {
                    self.note_dir_mode(&a);
                    (a.perm, a.gid)
                }
                // The create itself will report what is wrong with the parent.
                Err(_) => return ((uid, gid), false),
            },
        };
        if perm & libc::S_ISGID != 0 {
            ((uid, dir_gid), true)
        } else {
            ((uid, gid), false)
        }
    }

    /// `a` with the size (and change times) an open writer of this mount has made, which
    /// the cluster only learns at flush; the kernel must not see the file shrink under its
    /// writer, nor a truncate or write leave the times unchanged.
    fn with_open_size(&self, mut a: Attr) -> Attr {
        if let Some(fhs) = self.open_inos.get(&a.ino) {
            for fh in fhs.iter() {
                if let Some(f) = self.files.get(*fh) {
                    a = f.overlay(a);
                }
            }
        }
        a
    }

    /// Creates `name` in `parent`, noting what the answer says of `parent`. Returns the
    /// entry's attributes and whether this call made it (see [`Client::create_entry`]).
    async fn create_in(
        &self,
        parent: Ino,
        name: &[u8],
        spec: CreateSpec,
    ) -> Result<(Attr, bool), TalonError> {
        let begun = self.dir_change_begins();
        let made = self.client.create_in(parent, name, spec).await;
        self.note_dir_change(parent, begun, &made);
        Ok(made?.value)
    }

    /// Removes `name` from `parent` (rmdir semantics when `directory`), noting what the
    /// answer says of `parent`.
    async fn remove_in(&self, parent: Ino, name: &[u8], directory: bool) -> Result<(), TalonError> {
        let begun = self.dir_change_begins();
        let gone = self.client.remove_in(parent, name, directory).await;
        self.note_dir_change(parent, begun, &gone);
        let (ino, _) = gone?.value;
        if directory {
            self.forget_dir(ino);
        }
        Ok(())
    }

    /// The count of renames to pass to [`Shared::note_dir_change`] for a change that
    /// begins now.
    fn dir_change_begins(&self) -> u64 {
        self.renames.load(Ordering::Acquire)
    }

    /// Records what a create or remove in `dir`, begun at rename count `renames`, answered
    /// about `dir` (nothing if it failed).
    fn note_dir_change<T>(&self, dir: Ino, renames: u64, r: &Result<DirChange<T>, TalonError>) {
        match r {
            Ok(DirChange {
                dir: Some(attr), ..
            }) if attr.ino == dir && attr.class == Class::Relaxed => {
                if self.own_dirs.len() >= DIR_MODES_MAX {
                    self.own_dirs.clear();
                }
                let own = OwnDir {
                    attr: attr.clone(),
                    at: Instant::now(),
                    renames,
                };
                self.own_dirs.insert(dir, own);
            }
            _ => self.forget_dir(dir),
        }
    }

    /// Forgets what `own_dirs` holds for `dir` (a change whose effect on it is not known).
    fn forget_dir(&self, dir: Ino) {
        self.own_dirs.remove(&dir);
    }

    /// Relaxed directory `dir`'s attributes after this mount's last change in it, if that
    /// was within the relaxed TTL and no rename began since.
    fn own_dir(&self, dir: Ino) -> Option<Attr> {
        let own = self.own_dirs.get(&dir)?;
        let fresh = own.at.elapsed() < self.ttls.relaxed
            && own.renames == self.renames.load(Ordering::Acquire);
        fresh.then(|| own.attr.clone())
    }

    async fn getattr(&self, i: Ino) -> Result<Attr, TalonError> {
        let got = if self.relaxed.contains(&i) {
            if let Some(a) = self.own_dir(i) {
                return Ok(a);
            }
            self.client.getattr_relaxed(i).await
        } else {
            self.client.getattr(i).await
        };
        match got {
            Ok(a) => Ok(self.with_open_size(a)),
            // Unlinked while open here: the open handle still knows the file.
            Err(e) if e.errno() == Errno::ENOENT => match self.any_handle(i) {
                Some(f) => {
                    let mut a = f.metadata().await?;
                    a.nlink = 0;
                    Ok(a)
                }
                None => Err(stale(e)),
            },
            Err(e) => Err(e),
        }
    }

    /// Any open handle of `i` in this mount.
    fn any_handle(&self, i: Ino) -> Option<Arc<OpenFile>> {
        let fhs = self.open_inos.get(&i)?;
        fhs.iter().find_map(|fh| self.files.get(*fh))
    }

    /// An open handle of `i` in this mount that holds writes not committed yet, if any.
    fn dirty_writer(&self, i: Ino) -> Option<Arc<OpenFile>> {
        let fhs = self.open_inos.get(&i)?;
        fhs.iter()
            .filter_map(|fh| self.files.get(*fh))
            .find(|f| f.writable() && f.pending_size().is_some())
    }

    /// A read through handle `f` while another handle of its file in this mount holds
    /// writes not committed yet: answered through that one, so what this mount's processes
    /// wrote shows at once to its other readers, as on a local file system (and the kernel
    /// caches those contents, not the ones before the writes). `None` when there is no
    /// such writer, or it committed meanwhile: `f`'s own read is current then.
    async fn read_through_writer(
        &self,
        f: &Arc<OpenFile>,
        offset: u64,
        size: u32,
    ) -> Result<Option<Vec<u8>>, TalonError> {
        match self.dirty_writer(f.ino) {
            Some(w) if !Arc::ptr_eq(&w, f) => w.read_uncommitted(offset, size).await,
            _ => Ok(None),
        }
    }

    /// The class a new directory `name` in `parent` gets: strict when its path is one of
    /// the cluster's strict prefixes, else inherited (`None`).
    async fn mkdir_class(&self, parent: Ino, name: &[u8]) -> Option<Class> {
        for prefix in &self.strict_prefixes {
            let comps: Vec<&[u8]> = prefix
                .as_bytes()
                .split(|&b| b == b'/')
                .filter(|c| !c.is_empty())
                .collect();
            let Some((last, dir)) = comps.split_last() else {
                continue;
            };
            if *last != name {
                continue;
            }
            let dir_path = format!("/{}", String::from_utf8_lossy(&dir.join(&b'/')));
            if let Ok(a) = self.client.stat(dir_path.as_bytes()).await {
                if a.ino == parent {
                    return Some(Class::Strict);
                }
            }
        }
        None
    }

    /// Opens regular file `i` with the kernel's `flags`: one RPC, which also brings a small
    /// file's body. Returns the handle, the open flags for the kernel and the attributes.
    /// `created`: the attributes a create has just answered (see [`OpenFile::open`]).
    async fn open_file(
        &self,
        i: Ino,
        flags: i32,
        created: Option<Attr>,
    ) -> Result<(u64, FopenFlags, Attr), TalonError> {
        let file = OpenFile::open(&self.client, i, flags, created).await?;
        let attr = file.metadata().await?;
        let fh = self.add_handle(file);
        Ok((fh, open_flags(attr.class, flags), attr))
    }

    /// Empties file `a`, just opened as handle `fh` with `flags`, when they hold `O_TRUNC`
    /// and it is not empty: through that handle if it writes, so the truncate and its
    /// writes apply in order and no other handle of the file takes part; directly for a
    /// read-only one (the kernel has checked the caller may write).
    /// `drop_setid` as [`caller_drops_setid`] says for the caller.
    async fn truncate_at_open(
        &self,
        fh: u64,
        flags: i32,
        a: &Attr,
        drop_setid: bool,
    ) -> Result<(), TalonError> {
        if flags & libc::O_TRUNC == 0 || a.size == 0 {
            return Ok(());
        }
        match self.files.get(fh) {
            Some(f) if f.writable() => f.set_len(0, drop_setid).await,
            _ => {
                data::truncate(&self.client, a.ino, 0, drop_setid).await?;
                self.changed_under_others(a.ino, Some(fh)).await;
                Ok(())
            }
        }
    }

    /// A deferred open of regular file `i` (no RPC; see [`OpenFile::deferred`]) when the
    /// kernel was shown it as relaxed and `flags` allow one. Returns the handle and the
    /// open flags for the kernel.
    fn open_deferred(&self, i: Ino, flags: i32) -> Option<(u64, FopenFlags)> {
        if !self.relaxed.contains(&i) {
            return None;
        }
        let file = OpenFile::deferred(&self.client, i, flags)?;
        Some((self.add_handle(file), open_flags(Class::Relaxed, flags)))
    }

    fn add_handle(&self, file: OpenFile) -> u64 {
        let i = file.ino;
        let fh = self.files.insert(file);
        self.open_inos.entry(i).or_default().push(fh);
        fh
    }

    /// Closes handle `fh` here, in the kernel's dispatch thread, if it has nothing to
    /// commit ([`OpenFile::close_clean`]): a release that needs no trip through the runtime.
    fn release_clean(&self, fh: u64) -> bool {
        let clean = self.files.get(fh).is_some_and(|f| f.close_clean());
        if clean {
            self.forget_handle(fh);
        }
        clean
    }

    /// True if `i` is a file this mount just created and has set no xattr on (see
    /// `fresh`): it has none.
    fn has_no_xattrs(&self, i: Ino) -> bool {
        self.fresh
            .get(&i)
            .is_some_and(|made| made.elapsed() < self.ttls.relaxed)
    }

    /// The session's notifier, for [`Shared::changed_under_others`].
    pub(crate) fn set_notifier(&self, n: fuser::Notifier) {
        let _ = self.notifier.set(n);
    }

    /// After a change to file `i` committed by this mount (through handle `by`, or by
    /// path): this mount's other open handles of `i` would go on serving the contents
    /// their open fetched, and the kernel would cache what they serve for every later
    /// open (relaxed files keep their pages), so this mount's own change would not show.
    /// Those handles reopen at their next read ([`OpenFile::mark_stale`]) and the kernel
    /// drops the file's cached pages before the change is answered. Nothing to do, and
    /// nothing done, when no other handle of `i` is open here.
    async fn changed_under_others(&self, i: Ino, by: Option<u64>) {
        let others: Vec<u64> = self
            .open_inos
            .get(&i)
            .map(|fhs| fhs.iter().copied().filter(|fh| Some(*fh) != by).collect())
            .unwrap_or_default();
        if others.is_empty() {
            return;
        }
        for fh in others {
            if let Some(f) = self.files.get(fh) {
                f.mark_stale();
            }
        }
        let Some(n) = self.notifier.get().cloned() else {
            return;
        };
        // The kernel drops the pages under their locks, which a read in flight holds
        // until it is answered: off the runtime's workers, which answer it.
        let dropped = tokio::task::spawn_blocking(move || n.inval_inode(INodeNo(i.0), 0, 0));
        match dropped.await {
            Ok(Ok(())) => {}
            // ENOENT: the kernel holds no inode of that number any more.
            Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Ok(Err(e)) => tracing::warn!(ino = %i, "drop the kernel's cached pages: {e}"),
            Err(e) => tracing::warn!(ino = %i, "drop the kernel's cached pages: {e}"),
        }
    }

    /// The end of a flush, fsync or release of handle `fh` of `f` that committed what it
    /// held (`commit`: whether there was anything): the file's other handles learn of it.
    async fn committed(
        &self,
        f: &OpenFile,
        fh: u64,
        commit: Result<bool, TalonError>,
    ) -> Result<(), TalonError> {
        if commit? {
            self.changed_under_others(f.ino, Some(fh)).await;
        }
        Ok(())
    }

    fn forget_handle(&self, fh: u64) -> Option<Arc<OpenFile>> {
        let f = self.files.remove(fh)?;
        if let Some(mut fhs) = self.open_inos.get_mut(&f.ino) {
            fhs.retain(|h| *h != fh);
        }
        self.open_inos.remove_if(&f.ino, |_, fhs| fhs.is_empty());
        Some(f)
    }

    /// Before the last name of `victim` in `parent` goes away (unlink, or a rename over
    /// it), lets this mount's open handles of it keep their contents: POSIX keeps an
    /// unlinked file readable through open descriptors until they are closed.
    async fn preserve_open(&self, parent: Ino, name: &[u8]) {
        if self.open_inos.is_empty() {
            return;
        }
        let Ok(a) = self.client.lookup(parent, name).await else {
            return;
        };
        let handles: Vec<Arc<OpenFile>> = match self.open_inos.get(&a.ino) {
            Some(fhs) => fhs.iter().filter_map(|fh| self.files.get(*fh)).collect(),
            None => return,
        };
        for f in handles {
            if let Err(e) = f.detach().await {
                tracing::warn!(ino = %f.ino, "keep an unlinked file's contents: {e}");
            }
        }
    }
}

/// Asks the kernel at INIT for what every Talon mount uses: READDIRPLUS, automatic
/// invalidation of cached pages whose file changed, parallel directory operations,
/// asynchronous and big requests, O_TRUNC and the set-ID bits left to the mount, 1 MiB
/// writes and read-ahead, and up to 256 requests in the background. A capability the
/// kernel lacks is left out.
pub fn negotiate(config: &mut KernelConfig) {
    for cap in [
        InitFlags::FUSE_DO_READDIRPLUS,
        InitFlags::FUSE_READDIRPLUS_AUTO,
        InitFlags::FUSE_AUTO_INVAL_DATA,
        InitFlags::FUSE_PARALLEL_DIROPS,
        InitFlags::FUSE_ASYNC_READ,
        InitFlags::FUSE_BIG_WRITES,
        // O_TRUNC comes with the OPEN and is applied through the handle it opens (see
        // `open`): without it the kernel sends a SETATTR of size 0 without a handle
        // after the open, which could reach another writer's handle of the file,
        // one that its release was closing (EBADF at the truncating open's close).
        InitFlags::FUSE_ATOMIC_O_TRUNC,
        // The set-ID bits and `security.capability` a write, a truncate or a chown must
        // clear are cleared by the cluster, with the change (see `caller_drops_setid`):
        // without it the kernel asks for `security.capability` before every write(2),
        // a request to the cluster for each one to a file this mount has not just made;
        // with it, before the first write to a file it holds.
        InitFlags::FUSE_HANDLE_KILLPRIV_V2,
    ] {
        if config.add_capabilities(cap).is_err() {
            tracing::debug!("kernel lacks FUSE capability {cap:?}");
        }
    }
    // Big requests: a 110 KB image is one read and one write.
    let _ = config.set_max_write(1 << 20);
    let _ = config.set_max_readahead(MAX_READAHEAD);
    let _ = config.set_max_background(256);
    let _ = config.set_congestion_threshold(192);
}

impl Filesystem for TalonFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        negotiate(config);
        Ok(())
    }

    fn destroy(&mut self) {
        // The kernel releases every handle before a normal unmount; after a lazy one, or
        // if the session ends abruptly, close what is left so nothing written is lost.
        let s = self.s.clone();
        let files = s.files.drain();
        if files.is_empty() {
            return;
        }
        let rt = s.rt.clone();
        let closing = async move {
            for f in files {
                if let Err(e) = f.close().await {
                    tracing::warn!(ino = %f.ino, "close at unmount: {e}");
                }
            }
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            rt.spawn(closing);
        } else {
            rt.block_on(closing);
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name_of(name);
        self.answer_or_spawn(move |s| async move {
            match s.client.lookup(ino(parent), &name).await {
                Ok(a) => {
                    let a = s.with_open_size(a);
                    s.entry(reply, &a)
                }
                // A missing name in a relaxed directory is cached as a negative entry for
                // the relaxed TTL (DESIGN.md allows it): a program probing for files that are
                // not there asks the cluster once per TTL, not once per probe. The kernel
                // replaces the entry when this mount makes the name; other clients' names
                // show within the TTL, as their changes to existing names do.
                Err(e)
                    if e.errno() == Errno::ENOENT
                        && s.client.cached_class(ino(parent)) == Some(Class::Relaxed) =>
                {
                    reply.entry(&s.ttls.of(Class::Relaxed), &negative_entry(), Generation(0))
                }
                Err(e) => reply.error(errno("lookup", &e)),
            }
        });
    }

    fn forget(&self, _req: &Request, _ino: INodeNo, _nlookup: u64) {
        // Inos are Talon's own and never reused; nothing is kept per looked-up inode.
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.answer_or_spawn(move |s| async move {
            match s.getattr(ino(i)).await {
                Ok(a) => s.attr(reply, &a),
                Err(e) => reply.error(errno("getattr", &e)),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let drop_setid = caller_drops_setid(req);
        self.spawn(move |s| async move {
            let i = ino(i);
            let r = async {
                if let Some(size) = size {
                    // Through the handle it names (ftruncate), or one holding writes not
                    // committed yet, so those and the truncate apply in order; else at
                    // once. A handle with nothing pending is not used: its view of the
                    // file may be older than another writer's commit, and the truncate
                    // would wait for its close to be seen. A writer closed meanwhile has
                    // committed its writes: the truncate follows them at once.
                    let through = match fh.and_then(|fh| s.files.get(fh.0)) {
                        Some(f) => {
                            f.set_len(size, drop_setid).await?;
                            true
                        }
                        None => match s.dirty_writer(i) {
                            Some(f) => f.set_len_if_open(size, drop_setid).await?,
                            None => false,
                        },
                    };
                    if !through {
                        data::truncate(&s.client, i, size, drop_setid).await?;
                        s.changed_under_others(i, None).await;
                    }
                }
                let set = SetAttr {
                    perm: mode.map(|m| m & 0o7777),
                    uid,
                    gid,
                    size: None,
                    atime: atime.map(time_set),
                    mtime: mtime.map(time_set),
                };
                let changes = set.perm.is_some()
                    || set.uid.is_some()
                    || set.gid.is_some()
                    || set.atime.is_some()
                    || set.mtime.is_some();
                if changes {
                    Ok(s.with_open_size(s.client.setattr(i, set).await?))
                } else {
                    s.getattr(i).await
                }
            };
            let r = r.await;
            s.forget_dir(i);
            match r {
                Ok(a) => s.attr(reply, &a),
                Err(e) => reply.error(errno("setattr", &e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        self.spawn(move |s| async move {
            match s.client.readlink(ino(i)).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(errno("readlink", &e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let name = name_of(name);
        let owner = (req.uid(), req.gid());
        self.spawn(move |s| async move {
            let Some(kind) = mknod_kind(mode) else {
                return reply.error(fuser::Errno::from_i32(libc::EINVAL));
            };
            let (owner, _) = s.owner_in(ino(parent), owner).await;
            let spec = CreateSpec {
                owner: Some(owner),
                ..CreateSpec::node(kind, mode & !umask & 0o7777, u64::from(rdev))
            };
            match s.create_in(ino(parent), &name, spec).await {
                Ok((a, _)) => s.entry(reply, &a),
                Err(e) => reply.error(errno("mknod", &e)),
            }
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name_of(name);
        let owner = (req.uid(), req.gid());
        self.spawn(move |s| async move {
            let parent = ino(parent);
            let class = s.mkdir_class(parent, &name).await;
            let (owner, setgid) = s.owner_in(parent, owner).await;
            let inherited = if setgid { libc::S_ISGID } else { 0 };
            let spec = CreateSpec {
                owner: Some(owner),
                ..CreateSpec::dir((mode & !umask & 0o7777) | inherited, class)
            };
            match s.create_in(parent, &name, spec).await {
                Ok((a, _)) => s.entry(reply, &a),
                Err(e) => reply.error(errno("mkdir", &e)),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_of(name);
        self.spawn(move |s| async move {
            s.preserve_open(ino(parent), &name).await;
            match s.remove_in(ino(parent), &name, false).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("unlink", &e)),
            }
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_of(name);
        self.spawn(move |s| async move {
            match s.remove_in(ino(parent), &name, true).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("rmdir", &e)),
            }
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let name = name_of(link_name);
        let target = target.as_os_str().as_bytes().to_vec();
        let owner = (req.uid(), req.gid());
        self.spawn(move |s| async move {
            let (owner, _) = s.owner_in(ino(parent), owner).await;
            let spec = CreateSpec {
                owner: Some(owner),
                ..CreateSpec::symlink(target)
            };
            match s.create_in(ino(parent), &name, spec).await {
                Ok((a, _)) => s.entry(reply, &a),
                Err(e) => reply.error(errno("symlink", &e)),
            }
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = (name_of(name), name_of(newname));
        self.spawn(move |s| async move {
            let known = fuser::RenameFlags::RENAME_NOREPLACE | fuser::RenameFlags::RENAME_EXCHANGE;
            if !known.contains(flags) {
                // RENAME_WHITEOUT is for overlay file systems.
                return reply.error(fuser::Errno::from_i32(libc::EINVAL));
            }
            let flags = RenameFlags {
                noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
                exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
            };
            if !flags.exchange {
                s.preserve_open(ino(newparent), &newname).await;
            }
            s.renames.fetch_add(1, Ordering::AcqRel);
            let r = s
                .client
                .rename_entry(ino(parent), &name, ino(newparent), &newname, flags)
                .await;
            s.renames.fetch_add(1, Ordering::AcqRel);
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("rename", &e)),
            }
        });
    }

    fn link(
        &self,
        _req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let name = name_of(newname);
        self.spawn(move |s| async move {
            let r = s.client.link(ino(i), ino(newparent), &name).await;
            s.forget_dir(ino(newparent));
            match r {
                Ok(a) => {
                    let a = s.with_open_size(a);
                    s.entry(reply, &a)
                }
                Err(e) => reply.error(errno("link", &e)),
            }
        });
    }

    fn open(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // A relaxed read-only open fetches nothing until a read needs it: answered here.
        if let Some((fh, f)) = self.s.open_deferred(ino(i), flags.0) {
            return reply.opened(FileHandle(fh), f);
        }
        let drop_setid = caller_drops_setid(req);
        self.spawn(move |s| async move {
            // The kernel opens directories with opendir; the File refuses anything but a
            // regular file (EISDIR).
            let r = async {
                let (fh, f, a) = s.open_file(ino(i), flags.0, None).await?;
                s.truncate_at_open(fh, flags.0, &a, drop_setid).await?;
                Ok((fh, f))
            };
            match r.await.map_err(stale) {
                Ok((fh, f)) => reply.opened(FileHandle(fh), f),
                Err(e) => reply.error(errno("open", &e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // A read of a body the handle holds, or one the node in this process serves from
        // memory, finishes here.
        self.answer_or_spawn(move |s| async move {
            let Some(f) = s.files.get(fh.0) else {
                return reply.error(fuser::Errno::from_i32(libc::EBADF));
            };
            let read = async {
                match s.read_through_writer(&f, offset, size).await? {
                    Some(bytes) => Ok(bytes),
                    None => f.read(offset, size).await,
                }
            };
            match read.await {
                Ok(bytes) => reply.data(&bytes),
                Err(e) => reply.error(errno("read", &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        // The kernel leaves the set-ID bits to this mount (`FUSE_HANDLE_KILLPRIV_V2`) and
        // says here whether this writer may keep them.
        let drop_setid = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        // A write the handle only buffers finishes here.
        self.answer_or_spawn(move |s| async move {
            let Some(f) = s.files.get(fh.0) else {
                return reply.error(fuser::Errno::from_i32(libc::EBADF));
            };
            match f.write(offset, &data, drop_setid).await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno("write", &e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let Some(f) = self.s.files.get(fh.0) else {
            return reply.error(fuser::Errno::from_i32(libc::EBADF));
        };
        // Nothing to commit (a read-only handle, or no writes): answered here.
        if f.is_clean() {
            return reply.ok();
        }
        self.spawn(move |s| async move {
            match s.committed(&f, fh.0, f.flush().await).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("flush", &e)),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.s.fresh.remove(&ino(i));
        if self.s.release_clean(fh.0) {
            return reply.ok();
        }
        self.spawn(move |s| async move {
            let Some(f) = s.forget_handle(fh.0) else {
                return reply.error(fuser::Errno::from_i32(libc::EBADF));
            };
            match s.committed(&f, fh.0, f.close().await).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("release", &e)),
            }
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |s| async move {
            let Some(f) = s.files.get(fh.0) else {
                return reply.error(fuser::Errno::from_i32(libc::EBADF));
            };
            match s.committed(&f, fh.0, f.fsync().await).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("fsync", &e)),
            }
        });
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(move |s| async move {
            match s.client.getattr(ino(i)).await.map_err(stale) {
                Ok(a) if a.kind != FileKind::Directory => {
                    reply.error(fuser::Errno::from_i32(libc::ENOTDIR))
                }
                Ok(a) => {
                    // The root's parent is itself.
                    let parent = if a.parent.0 == 0 { a.ino } else { a.parent };
                    let fh = s
                        .dirs
                        .insert(tokio::sync::Mutex::new(DirListing::new(a, parent)));
                    reply.opened(FileHandle(fh), FopenFlags::empty())
                }
                Err(e) => reply.error(errno("opendir", &e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.spawn(move |s| async move {
            match s.listing_from(fh.0, ino(i), offset, "readdir").await {
                Ok((entries, _)) => {
                    for (off, e) in entries {
                        let name = OsStr::from_bytes(&e.name);
                        if reply.add(INodeNo(e.ino.0), off + 1, file_type(e.kind), name) {
                            break;
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn readdirplus(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.spawn(move |s| async move {
            let (entries, dir_attr) =
                match s.listing_from(fh.0, ino(i), offset, "readdirplus").await {
                    Ok(got) => got,
                    Err(e) => return reply.error(e),
                };
            for (off, e) in entries {
                let attr = match e.attr.clone() {
                    Some(a) => s.with_open_size(a),
                    // `..` (the kernel does not link `.` and `..` from a readdirplus, so
                    // their attributes only need to be well formed).
                    None if e.name == b".." => Attr {
                        ino: e.ino,
                        ..dir_attr.clone()
                    },
                    None => match s.getattr(e.ino).await {
                        Ok(a) => a,
                        // Gone since the page was read: leave it out.
                        Err(_) => continue,
                    },
                };
                let ListedEntry {
                    name, ino: eino, ..
                } = e;
                s.note_shown(&attr);
                let ttl = s.ttls.of(attr.class);
                let full = reply.add(
                    INodeNo(eino.0),
                    off + 1,
                    OsStr::from_bytes(&name),
                    &ttl,
                    &file_attr(&attr),
                    Generation(0),
                );
                if full {
                    break;
                }
            }
            reply.ok()
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.s.dirs.remove(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are committed through Raft before they are acknowledged.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        self.spawn(move |s| async move {
            match s.client.statfs().await {
                Ok(st) => reply.statfs(
                    st.space_total / STATFS_BSIZE,
                    st.space_free / STATFS_BSIZE,
                    st.space_avail / STATFS_BSIZE,
                    st.inodes + STATFS_FREE_INODES,
                    STATFS_FREE_INODES,
                    STATFS_BSIZE as u32,
                    talon_model::name::NAME_MAX as u32,
                    STATFS_BSIZE as u32,
                ),
                Err(e) => reply.error(errno("statfs", &e)),
            }
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        // From now on this mount's xattr reads of `i` ask the cluster.
        self.s.fresh.remove(&ino(i));
        let name = name_of(name);
        let value = value.to_vec();
        self.spawn(move |s| async move {
            let r = async {
                if position != 0 {
                    return Err(posix(Errno::EINVAL, "xattr position"));
                }
                let flags = match flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) {
                    0 => XattrFlags::Any,
                    libc::XATTR_CREATE => XattrFlags::Create,
                    libc::XATTR_REPLACE => XattrFlags::Replace,
                    _ => return Err(posix(Errno::EINVAL, "XATTR_CREATE with XATTR_REPLACE")),
                };
                if name == CLASS_XATTR {
                    let text = String::from_utf8_lossy(&value);
                    let class: Class = text
                        .trim_end_matches(['\n', '\0'])
                        .parse()
                        .map_err(|m: String| posix(Errno::EINVAL, m))?;
                    return s.client.set_class(ino(i), class).await.map(|_| ());
                }
                if !xattr_supported(&name) {
                    return Err(posix(Errno::ENOTSUP, "xattr namespace not supported"));
                }
                s.client.setxattr(ino(i), &name, &value, flags).await
            };
            let r = r.await;
            s.forget_dir(ino(i));
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("setxattr", &e)),
            }
        });
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if self.s.has_no_xattrs(ino(i)) {
            return reply.error(fuser::Errno::from_i32(libc::ENODATA));
        }
        let name = name_of(name);
        self.spawn(move |s| async move {
            let r = async {
                if name == CLASS_XATTR {
                    let a = s.client.getattr(ino(i)).await?;
                    if a.kind != FileKind::Directory {
                        return Err(posix(Errno::ENODATA, "only directories have a class"));
                    }
                    return Ok(a.class.as_str().as_bytes().to_vec());
                }
                if !xattr_supported(&name) {
                    return Err(posix(Errno::ENODATA, "xattr namespace not supported"));
                }
                if s.relaxed.contains(&ino(i)) {
                    return s.client.getxattr_relaxed(ino(i), &name).await;
                }
                s.client.getxattr(ino(i), &name).await
            };
            match r.await {
                Ok(v) => reply_xattr(reply, size, &v),
                Err(e) => reply.error(errno("getxattr", &e)),
            }
        });
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        if self.s.has_no_xattrs(ino(i)) {
            return reply_xattr(reply, size, &[]);
        }
        self.spawn(move |s| async move {
            match s.client.listxattr(ino(i)).await {
                Ok(names) => {
                    let mut list = Vec::new();
                    for n in names.iter().filter(|n| xattr_supported(n)) {
                        list.extend_from_slice(n);
                        list.push(0);
                    }
                    reply_xattr(reply, size, &list)
                }
                Err(e) => reply.error(errno("listxattr", &e)),
            }
        });
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_of(name);
        self.spawn(move |s| async move {
            let r = async {
                if name == CLASS_XATTR {
                    return Err(posix(Errno::EPERM, "a directory always has a class"));
                }
                if !xattr_supported(&name) {
                    return Err(posix(Errno::ENODATA, "xattr namespace not supported"));
                }
                s.client.removexattr(ino(i), &name).await
            };
            let r = r.await;
            s.forget_dir(ino(i));
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("removexattr", &e)),
            }
        });
    }

    fn access(&self, req: &Request, i: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let (uid, gid) = (req.uid(), req.gid());
        let mask = mask.bits() as u32;
        self.spawn(move |s| async move {
            match s.client.getattr(ino(i)).await {
                Ok(a) if permitted(&a, uid, gid, mask) => reply.ok(),
                Ok(_) => reply.error(fuser::Errno::from_i32(libc::EACCES)),
                Err(e) => reply.error(errno("access", &e)),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name_of(name);
        let owner = (req.uid(), req.gid());
        let drop_setid = caller_drops_setid(req);
        self.spawn(move |s| async move {
            let r = async {
                if mode & libc::S_IFMT != 0 && mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(posix(Errno::EINVAL, "create of a non-regular file"));
                }
                let (owner, _) = s.owner_in(ino(parent), owner).await;
                let spec = CreateSpec {
                    owner: Some(owner),
                    exclusive: flags & libc::O_EXCL != 0,
                    ..CreateSpec::file(mode & !umask & 0o7777)
                };
                let (a, new) = s.create_in(ino(parent), &name, spec).await?;
                let made = Instant::now();
                let (fh, fflags, a) = s.open_file(a.ino, flags, Some(a)).await?;
                // Only with a handle: its release ends the entry.
                if new && a.class == Class::Relaxed {
                    s.fresh.insert(a.ino, made);
                }
                // The name existed already (a create without O_EXCL opens it).
                s.truncate_at_open(fh, flags, &a, drop_setid).await?;
                Ok((s.with_open_size(a), fh, fflags))
            };
            match r.await {
                Ok((a, fh, fflags)) => {
                    s.note_shown(&a);
                    let ttl = s.ttls.of(a.class);
                    reply.created(&ttl, &file_attr(&a), Generation(0), FileHandle(fh), fflags)
                }
                Err(e) => reply.error(errno("create", &e)),
            }
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |s| async move {
            let r = async {
                match mode {
                    0 => {}
                    // Talon stores no blocks ahead of data, so reserving space without
                    // growing the file has nothing to do.
                    libc::FALLOC_FL_KEEP_SIZE => return Ok(()),
                    // Hole punching, zeroing, collapsing, inserting: EOPNOTSUPP, as a file
                    // system without them answers, so tools fall back to writing.
                    _ => return Err(posix(Errno::ENOTSUP, "fallocate mode")),
                }
                let f = s
                    .files
                    .get(fh.0)
                    .ok_or_else(|| posix(Errno::EBADF, "no such handle"))?;
                let end = offset
                    .checked_add(length)
                    .ok_or_else(|| posix(Errno::EFBIG, "fallocate past the largest size"))?;
                let size = match f.pending_size() {
                    Some(size) => size,
                    None => s.client.getattr(f.ino).await?.size,
                };
                // Talon stores no blocks ahead of data: mode 0 only has to make the file
                // at least `end` long. (The kernel clears the set-ID bits before a
                // fallocate itself.)
                if end > size {
                    f.set_len(end, false).await?;
                }
                Ok(())
            };
            match r.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno("fallocate", &e)),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talon_model::Time;

    fn attr(kind: FileKind, perm: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: Ino(7),
            kind,
            perm,
            uid,
            gid,
            size: 0,
            nlink: 1,
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
            crtime: Time::default(),
            generation: 0,
            class: Class::Relaxed,
            rdev: 0,
            parent: Ino(0),
        }
    }

    #[test]
    fn permission_bits_by_owner_group_other() {
        let a = attr(FileKind::Regular, 0o640, 1000, 100);
        assert!(permitted(&a, 1000, 5, 4 | 2));
        assert!(!permitted(&a, 1000, 5, 1));
        assert!(permitted(&a, 2000, 100, 4));
        assert!(!permitted(&a, 2000, 100, 2));
        assert!(!permitted(&a, 2000, 200, 4));
        assert!(permitted(&a, 2000, 200, 0));
        // Root reads and writes anything but executes only what someone may.
        assert!(permitted(&a, 0, 0, 4 | 2));
        assert!(!permitted(&a, 0, 0, 1));
        assert!(permitted(&attr(FileKind::Directory, 0o700, 5, 5), 0, 0, 1));
    }

    #[test]
    fn xattr_namespaces() {
        assert!(xattr_supported(b"user.a"));
        assert!(xattr_supported(b"security.capability"));
        assert!(!xattr_supported(b"system.posix_acl_access"));
        assert!(!xattr_supported(b"talon.symlink"));
    }

    /// Only a handle that can have nothing to commit at close skips the kernel's FLUSH: a
    /// writer (whose close commits its writes) and a truncating open keep it, in both
    /// classes; relaxed files keep their page cache either way.
    #[test]
    fn only_plain_read_only_opens_skip_the_flush() {
        let noflush = |class, flags| open_flags(class, flags).contains(FopenFlags::FOPEN_NOFLUSH);
        for class in [Class::Relaxed, Class::Strict] {
            assert!(noflush(class, libc::O_RDONLY));
            assert!(noflush(class, libc::O_RDONLY | libc::O_NOATIME));
            assert!(!noflush(class, libc::O_RDONLY | libc::O_TRUNC));
            assert!(!noflush(class, libc::O_WRONLY));
            assert!(!noflush(class, libc::O_RDWR));
            assert!(!noflush(class, libc::O_WRONLY | libc::O_APPEND));
        }
        assert!(open_flags(Class::Relaxed, libc::O_RDWR).contains(FopenFlags::FOPEN_KEEP_CACHE));
        assert!(!open_flags(Class::Strict, libc::O_RDONLY).contains(FopenFlags::FOPEN_KEEP_CACHE));
    }
}
