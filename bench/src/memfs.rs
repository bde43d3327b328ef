//! `talon-bench memfs`: a file system held in this process's memory and served through
//! FUSE as Talon's mount is served: mounted and unmounted by the mount's own code
//! ([`talon_client::fuse::Mount::start_fs`], so with its mount options and session
//! threads), the same capabilities, write size and read-ahead asked of the kernel
//! ([`talon_client::fuse::negotiate`]), the same open flags, TTLs and cached negative
//! entries as a relaxed directory of a Talon mount. It answers every request at once, in
//! the session thread that read it: no network, no disk, nothing made durable.
//!
//! What a workload reaches through it is the ceiling of a FUSE file system mounted that
//! way on the machine: the kernel's and the FUSE device's own cost per request, which a
//! Talon mount pays as well before any work of its own (`bench/README.md` sets it beside
//! Talon's mount).
//!
//! It is an instrument, not a place to keep data: everything is gone at unmount. It has
//! directories and regular files only (no links, special files or renames: ENOSYS), no
//! extended attributes (none are found, none can be set), no clearing of set-ID bits at a
//! write (the capability it shares with the mount leaves that to the file system, and
//! memfs does not do it), and one lock around the whole tree.

use clap::Args;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use talon_client::fuse::{Mount, MountOptions};
use talon_model::Class;

/// `talon-bench memfs` flags.
#[derive(Args, Debug, Clone)]
pub struct MemfsArgs {
    /// Where to mount (an existing empty directory).
    pub mountpoint: PathBuf,
    /// How long the kernel caches entries and attributes, in milliseconds (a Talon mount's
    /// relaxed TTL is the cluster's staleness bound, 2,000 ms by default).
    #[arg(long, default_value_t = 2000)]
    pub ttl_ms: u64,
    /// Session threads reading the kernel's requests (a Talon mount's default is 2).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// Mounts an empty in-memory file system at `args.mountpoint` and serves it until SIGINT
/// or SIGTERM, or until it is unmounted from outside; then unmounts.
pub fn run(args: &MemfsArgs) -> anyhow::Result<()> {
    let fs = MemFs::new(
        Duration::from_millis(args.ttl_ms),
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let opts = MountOptions {
        threads: args.threads,
        ..MountOptions::new(&args.mountpoint)
    };
    let mount = Mount::start_fs(fs, "memfs", &opts, |_| {})?;
    eprintln!("memfs: mounted at {}", mount.mountpoint().display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(mount.serve_until(talon_client::fuse::shutdown_signal()))?;
    eprintln!("memfs: unmounted");
    Ok(())
}

/// The root directory's inode number, as the kernel expects it.
const ROOT: u64 = 1;
/// The block size reported in attributes and by statfs.
const BLOCK: u32 = 4096;
/// The longest name, as on Talon and most local file systems.
const NAME_MAX: usize = 255;
/// The largest file: memory is taken for every byte up to the end, so a write or truncate
/// far past it is EFBIG rather than an allocation the machine cannot make.
const MAX_FILE: u64 = 4 << 30;

/// One file or directory.
struct Node {
    attr: FileAttr,
    /// A regular file's contents.
    data: Vec<u8>,
    /// A directory's entries.
    entries: BTreeMap<OsString, u64>,
    /// Open handles: a file unlinked while open lives until its last one is released.
    open: u32,
}

/// The whole tree.
struct Tree {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

/// The file system: the tree behind one lock, and the TTL of every answer.
pub struct MemFs {
    tree: Mutex<Tree>,
    ttl: Duration,
}

fn new_attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: BLOCK,
        flags: 0,
    }
}

fn set_size(n: &mut Node, size: u64) -> Result<(), Errno> {
    if size > MAX_FILE {
        return Err(Errno::EFBIG);
    }
    let len = usize::try_from(size).map_err(|_| Errno::EFBIG)?;
    n.data.resize(len, 0);
    n.attr.size = size;
    n.attr.blocks = size.div_ceil(512);
    Ok(())
}

fn time_of(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl Tree {
    fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn dir(&self, ino: u64) -> Result<&Node, Errno> {
        let n = self.node(ino)?;
        if n.attr.kind == FileType::Directory {
            Ok(n)
        } else {
            Err(Errno::ENOTDIR)
        }
    }

    fn lookup(&self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let ino = *self.dir(parent)?.entries.get(name).ok_or(Errno::ENOENT)?;
        Ok(self.node(ino)?.attr)
    }

    /// Makes `name` in `parent`: a directory, or a regular file opened once (`open`).
    fn make(
        &mut self,
        parent: u64,
        name: &OsStr,
        kind: FileType,
        perm: u16,
        owner: (u32, u32),
        open: bool,
    ) -> Result<FileAttr, Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let attr = new_attr(ino, kind, perm, owner.0, owner.1);
        let node = Node {
            attr,
            data: Vec::new(),
            entries: BTreeMap::new(),
            open: u32::from(open),
        };
        self.nodes.insert(ino, node);
        let p = self.node_mut(parent)?;
        p.entries.insert(name.to_owned(), ino);
        if kind == FileType::Directory {
            p.attr.nlink += 1;
        }
        p.attr.mtime = attr.ctime;
        p.attr.ctime = attr.ctime;
        Ok(attr)
    }

    /// Removes `name` from `parent`: a directory (`dir`, empty) or anything else.
    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = *self.dir(parent)?.entries.get(name).ok_or(Errno::ENOENT)?;
        let n = self.node(ino)?;
        match (dir, n.attr.kind == FileType::Directory) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (true, true) if !n.entries.is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        let now = SystemTime::now();
        let p = self.node_mut(parent)?;
        p.entries.remove(name);
        if dir {
            p.attr.nlink -= 1;
        }
        p.attr.mtime = now;
        p.attr.ctime = now;
        let n = self.node_mut(ino)?;
        n.attr.nlink = 0;
        n.attr.ctime = now;
        if n.open == 0 {
            self.nodes.remove(&ino);
        }
        Ok(())
    }

    /// Lets go of one open handle of `ino`; an unlinked file goes with its last.
    fn release(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.open = n.open.saturating_sub(1);
            if n.open == 0 && n.attr.nlink == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    fn read(&self, ino: u64, offset: u64, size: u32) -> Result<&[u8], Errno> {
        let d = &self.node(ino)?.data;
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(d.len());
        let end = start.saturating_add(size as usize).min(d.len());
        Ok(&d[start..end])
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let len = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let n = self.node_mut(ino)?;
        let end = offset.checked_add(u64::from(len)).ok_or(Errno::EFBIG)?;
        if end > n.attr.size {
            set_size(n, end)?;
        }
        let start = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
        n.data[start..start + data.len()].copy_from_slice(data);
        let now = SystemTime::now();
        n.attr.mtime = now;
        n.attr.ctime = now;
        Ok(len)
    }

    /// Calls `add` with each entry of directory `ino` from `offset` on, until `add` says the
    /// reply is full: its inode number, the offset of the next, its name and attributes.
    /// ".", "..", then the names in order; both dots carry the directory's own number and
    /// attributes: the kernel takes neither from a listing.
    fn each_entry(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, &OsStr, &FileAttr) -> bool,
    ) -> Result<(), Errno> {
        let d = self.dir(ino)?;
        let dots = [(OsStr::new("."), ino), (OsStr::new(".."), ino)];
        let names = d.entries.iter().map(|(name, &i)| (name.as_os_str(), i));
        let from = usize::try_from(offset).unwrap_or(usize::MAX);
        for (at, (name, i)) in dots.into_iter().chain(names).enumerate().skip(from) {
            let Ok(n) = self.node(i) else { continue };
            if add(i, at as u64 + 1, name, &n.attr) {
                break;
            }
        }
        Ok(())
    }
}

impl MemFs {
    /// An empty file system whose root belongs to `uid` and `gid`, answering with `ttl`.
    pub fn new(ttl: Duration, uid: u32, gid: u32) -> MemFs {
        let root = Node {
            attr: new_attr(ROOT, FileType::Directory, 0o755, uid, gid),
            data: Vec::new(),
            entries: BTreeMap::new(),
            open: 0,
        };
        MemFs {
            tree: Mutex::new(Tree {
                nodes: HashMap::from([(ROOT, root)]),
                next_ino: ROOT + 1,
            }),
            ttl,
        }
    }

    fn tree(&self) -> MutexGuard<'_, Tree> {
        self.tree.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `name` in `parent` for the caller of `req`, with the permission bits of `mode`:
    /// a directory, or a regular file opened once (the handle a CREATE answers with).
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: FileType,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        let perm = (mode & 0o7777) as u16;
        let open = kind == FileType::RegularFile;
        self.tree()
            .make(parent.0, name, kind, perm, (req.uid(), req.gid()), open)
    }
}

impl Filesystem for MemFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        talon_client::fuse::negotiate(config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.tree().lookup(parent.0, name) {
            Ok(a) => reply.entry(&self.ttl, &a, Generation(0)),
            // As a relaxed directory of Talon's mount answers it: "no such name" cached.
            Err(Errno::ENOENT) => reply.entry(
                &self.ttl,
                &talon_client::fuse::convert::negative_entry(),
                Generation(0),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree().node(ino.0) {
            Ok(n) => reply.attr(&self.ttl, &n.attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut t = self.tree();
        let r = t.node_mut(ino.0).and_then(|n| {
            if let Some(size) = size {
                if n.attr.kind == FileType::Directory {
                    return Err(Errno::EISDIR);
                }
                set_size(n, size)?;
                n.attr.mtime = SystemTime::now();
            }
            if let Some(m) = mode {
                n.attr.perm = (m & 0o7777) as u16;
            }
            n.attr.uid = uid.unwrap_or(n.attr.uid);
            n.attr.gid = gid.unwrap_or(n.attr.gid);
            if let Some(a) = atime {
                n.attr.atime = time_of(a);
            }
            if let Some(m) = mtime {
                n.attr.mtime = time_of(m);
            }
            n.attr.ctime = SystemTime::now();
            Ok(n.attr)
        });
        match r {
            Ok(a) => reply.attr(&self.ttl, &a),
            Err(e) => reply.error(e),
        }
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
        match self.make(req, parent, name, FileType::Directory, mode & !umask) {
            Ok(a) => reply.entry(&self.ttl, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
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
        // The kernel creates regular files only; ENOSYS would make it stop sending CREATE.
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EINVAL);
        }
        match self.make(req, parent, name, FileType::RegularFile, mode & !umask) {
            Ok(a) => {
                let fopen = talon_client::fuse::fs::open_flags(Class::Relaxed, flags);
                reply.created(&self.ttl, &a, Generation(0), FileHandle(a.ino.0), fopen)
            }
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut t = self.tree();
        let r = t.node_mut(ino.0).and_then(|n| {
            if flags.0 & libc::O_TRUNC != 0 {
                set_size(n, 0)?;
            }
            n.open += 1;
            Ok(())
        });
        match r {
            Ok(()) => reply.opened(
                FileHandle(ino.0),
                talon_client::fuse::fs::open_flags(Class::Relaxed, flags.0),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.tree().read(ino.0, offset, size) {
            Ok(d) => reply.data(d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.tree().write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.tree().release(ino.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self.tree().each_entry(ino.0, offset, |i, next, name, a| {
            reply.add(INodeNo(i), next, a.kind, name)
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let listed = self.tree().each_entry(ino.0, offset, |i, next, name, a| {
            reply.add(INodeNo(i), next, name, &self.ttl, a, Generation(0))
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.tree().nodes.len() as u64;
        let blocks = 1 << 30;
        reply.statfs(
            blocks,
            blocks,
            blocks,
            files + (1 << 30),
            1 << 30,
            BLOCK,
            NAME_MAX as u32,
            BLOCK,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        match self.tree().node(ino.0) {
            Ok(_) => reply.error(Errno::ENODATA),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.size(0);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOTSUP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> Tree {
        let fs = MemFs::new(Duration::from_secs(1), 0, 0);
        fs.tree.into_inner().expect("lock")
    }

    /// Files and directories are made, found, written, read, listed and removed as a local
    /// file system does it, with its errors; an unlinked file lives until its last close.
    #[test]
    fn the_tree_answers_as_a_file_system_does() {
        let mut t = tree();
        let d = t
            .make(
                ROOT,
                OsStr::new("d"),
                FileType::Directory,
                0o755,
                (0, 0),
                false,
            )
            .expect("mkdir");
        assert_eq!(t.node(ROOT).expect("root").attr.nlink, 3);
        let f = t
            .make(
                d.ino.0,
                OsStr::new("f"),
                FileType::RegularFile,
                0o644,
                (0, 0),
                true,
            )
            .expect("create");
        assert_eq!(
            t.make(
                d.ino.0,
                OsStr::new("f"),
                FileType::RegularFile,
                0o644,
                (0, 0),
                true
            )
            .map(|_| ()),
            Err(Errno::EEXIST)
        );
        let long = OsString::from("x".repeat(NAME_MAX + 1));
        assert_eq!(
            t.make(d.ino.0, &long, FileType::RegularFile, 0o644, (0, 0), true)
                .map(|_| ()),
            Err(Errno::ENAMETOOLONG)
        );
        assert_eq!(t.write(f.ino.0, MAX_FILE, b"a"), Err(Errno::EFBIG));
        assert_eq!(t.write(f.ino.0, 3, b"abc"), Ok(3));
        assert_eq!(t.read(f.ino.0, 0, 100), Ok(&b"\0\0\0abc"[..]));
        assert_eq!(t.read(f.ino.0, 10, 100), Ok(&b""[..]));
        assert_eq!(t.lookup(d.ino.0, OsStr::new("f")).expect("lookup").size, 6);
        let listed = |from| {
            let mut names: Vec<(u64, OsString)> = Vec::new();
            t.each_entry(d.ino.0, from, |_, next, n, _| {
                names.push((next, n.to_owned()));
                false
            })
            .expect("list");
            names
        };
        assert_eq!(
            listed(0),
            vec![(1, ".".into()), (2, "..".into()), (3, "f".into())]
        );
        assert_eq!(listed(2), vec![(3, "f".into())]);
        assert_eq!(t.remove(ROOT, OsStr::new("d"), true), Err(Errno::ENOTEMPTY));
        assert_eq!(
            t.remove(d.ino.0, OsStr::new("f"), true),
            Err(Errno::ENOTDIR)
        );
        assert_eq!(t.remove(ROOT, OsStr::new("d"), false), Err(Errno::EISDIR));
        t.remove(d.ino.0, OsStr::new("f"), false).expect("unlink");
        assert_eq!(
            t.lookup(d.ino.0, OsStr::new("f")).map(|_| ()),
            Err(Errno::ENOENT)
        );
        assert_eq!(
            t.read(f.ino.0, 0, 3),
            Ok(&b"\0\0\0"[..]),
            "open after unlink"
        );
        t.release(f.ino.0);
        assert_eq!(t.read(f.ino.0, 0, 3).map(|_| ()), Err(Errno::ENOENT));
        t.remove(ROOT, OsStr::new("d"), true).expect("rmdir");
        assert_eq!(t.node(ROOT).expect("root").attr.nlink, 2);
        assert_eq!(t.nodes.len(), 1);
    }
}
