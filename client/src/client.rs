//! The [`Client`] handle and its inode-level operations, one per namespace RPC, for the
//! FUSE mount and for callers that already hold inode numbers.
//!
//! Routing follows the contract in `talon.proto`: entry operations (lookup, create, remove,
//! link, rename) go to `entry_partition(parent, name, parent_class, P)`, inode operations
//! to the ino's home partition. The parent's class comes from the path cache's class table,
//! or from a strict `GetAttr` of the parent; a `ClassChanged` answer (the class changed
//! while the directory was empty) drops it, re-fetches it, and sends the request once more
//! (the `settle` wrapper, which also handles `StaleEpoch`).
//!
//! Epochs: every write, and every strict read, carries the client's namespace epoch;
//! relaxed reads carry 0 and `relaxed_read`. An inode-level operation names inodes, not
//! paths, so a `StaleEpoch` answer only means the cache is old: the client drops it and
//! sends the request once more with the new epoch. Path-level operations (see `paths`)
//! instead re-resolve the path first.
//!
//! Inode-level reads of attributes and xattrs are strict (linearizable) unless the method
//! says otherwise; lookups and listings follow the directory's class.
//!
//! Read-your-writes: a relaxed read may be served by a follower that lags by up to the
//! staleness bound. So that a client always sees its own changes, a relaxed read of a
//! partition this client wrote to within twice the bound goes to the leader instead.

use crate::cluster_map::ClusterMap;
use crate::error::ClientError;
use crate::options::ClientOptions;
use crate::path_cache::PathCache;
use crate::router::{ReadKind, Router};
use crate::settle::Scope;
use crate::transport::{LocalNode, NodeClient};
use crate::types::{CreateSpec, DirChange, NodeStatus, RenameFlags, SetAttr, StatFs, XattrFlags};
use crate::wire::replies;
use crate::wire::requests::{self, request_id, Header};
use futures::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use talon_model::placement::entry_partition;
use talon_model::SYMLINK_XATTR;
use talon_model::{check_name, Attr, Class, Errno, FileKind, Ino, TalonError};
use tokio::sync::OwnedSemaphorePermit;

/// The largest read-ahead budget a client keeps, in KiB (a tokio semaphore's limit is
/// higher; 1 TiB is past any client's memory).
const MAX_READ_AHEAD_KIB: u64 = 1 << 30;

/// A connection to a Talon cluster. Cheap to clone; clones share the channels and cache.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) router: Router,
    pub(crate) cache: PathCache,
    pub(crate) opts: ClientOptions,
    /// When this client last sent a write to each partition, in milliseconds after `born`
    /// plus one (0: never).
    last_write: Vec<AtomicU64>,
    /// How long after a write relaxed reads of that partition go to the leader.
    session_window: Duration,
    born: Instant,
    /// What is left of `ClientOptions::read_ahead_bytes`, in KiB.
    read_ahead: Arc<tokio::sync::Semaphore>,
}

/// The read kind for entries of a directory of class `class`.
pub(crate) fn read_kind(class: Class) -> ReadKind {
    match class {
        Class::Strict => ReadKind::StrictRead,
        Class::Relaxed => ReadKind::RelaxedRead,
    }
}

impl Client {
    /// Connects to the cluster through any of `seeds` (`host:port`), fetching the cluster
    /// map. Node channels connect lazily, on first use.
    pub async fn connect(seeds: &[String], opts: ClientOptions) -> Result<Client, ClientError> {
        Self::connect_with(seeds, opts, None).await
    }

    /// As [`Client::connect`], for a process that also serves `local`, a node of the
    /// cluster: its RPCs are direct calls into that node's service rather than network
    /// round trips (`talon up` mounts its own node this way). Its address should be one of
    /// `seeds`, so that even the cluster map is fetched without the network.
    pub async fn connect_local(
        seeds: &[String],
        opts: ClientOptions,
        local: LocalNode,
    ) -> Result<Client, ClientError> {
        Self::connect_with(seeds, opts, Some(local)).await
    }

    async fn connect_with(
        seeds: &[String],
        opts: ClientOptions,
        local: Option<LocalNode>,
    ) -> Result<Client, ClientError> {
        let router = Router::connect(seeds, &opts, local).await?;
        let map = router.map();
        let ttl = opts.relaxed_ttl.unwrap_or(map.relaxed_staleness);
        let cache = PathCache::new(map.epoch, ttl, opts.cache_capacity);
        let last_write = (0..map.partitions).map(|_| AtomicU64::new(0)).collect();
        let session_window = map.relaxed_staleness * 2;
        let read_ahead_kib = (opts.read_ahead_bytes / 1024).min(MAX_READ_AHEAD_KIB) as usize;
        let inner = Inner {
            router,
            cache,
            opts,
            last_write,
            session_window,
            born: Instant::now(),
            read_ahead: Arc::new(tokio::sync::Semaphore::new(read_ahead_kib)),
        };
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn router(&self) -> &Router {
        &self.inner.router
    }

    pub(crate) fn cache(&self) -> &PathCache {
        &self.inner.cache
    }

    /// Room for `bytes` of read-ahead (`ClientOptions::read_ahead_bytes`), held until the
    /// permit is dropped; None if the budget is spent.
    pub(crate) fn hold_read_ahead(&self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        let kib = u32::try_from(bytes.div_ceil(1024)).ok()?;
        self.inner
            .read_ahead
            .clone()
            .try_acquire_many_owned(kib)
            .ok()
    }

    /// The options this client was made with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.opts
    }

    /// The current cluster map.
    pub fn cluster_map(&self) -> ClusterMap {
        self.router().map()
    }

    /// The newest namespace epoch this client has seen.
    pub fn epoch(&self) -> u64 {
        self.cache().epoch()
    }

    /// Numbers of cached directory entries and directory paths, for diagnostics.
    pub fn cache_len(&self) -> (usize, usize) {
        self.cache().sizes()
    }

    /// Server round trips this client has made so far (every RPC attempt, retries and
    /// cluster-map fetches included, the first map fetch at connect excluded; requests
    /// that shared a bundle count one each). Read it before and after a workload to count
    /// the round trips each operation cost.
    pub fn rpc_count(&self) -> u64 {
        self.router().rpc_count()
    }

    /// The bundles of small requests sent so far ([`crate::bundle`]), and the requests they
    /// carried between them.
    pub fn bundle_counts(&self) -> (u64, u64) {
        self.router().bundle_counts()
    }

    /// The root directory's ino.
    pub fn root(&self) -> Ino {
        self.router().map().root_ino
    }

    /// Fetches the cluster map again (e.g. after the cluster changed).
    pub async fn refresh_cluster_map(&self) -> Result<(), TalonError> {
        let epoch = self.router().refresh_map().await?;
        self.cache().observe_epoch(epoch);
        Ok(())
    }

    fn now_ms(&self) -> u64 {
        self.inner.born.elapsed().as_millis() as u64 + 1
    }

    /// Records that this client is sending a write that changes partition `p`.
    pub(crate) fn note_write(&self, p: u32) {
        if let Some(t) = self.inner.last_write.get(p as usize) {
            t.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// As [`Client::note_write`], for every partition: a change whose partitions are unknown.
    fn note_write_everywhere(&self) {
        let now = self.now_ms();
        for t in self.inner.last_write.iter() {
            t.store(now, Ordering::Relaxed);
        }
    }

    /// Records that this client changed the entries of directory `dir`: the directory's
    /// link count and times changed on its home partition before the change was answered,
    /// so this client's reads there go to the leader for the session window, and cached
    /// entries naming `dir` (with its old attributes) are not served any more.
    pub(crate) fn changed_dir(&self, dir: Ino) {
        self.note_write(dir.home());
        self.cache().forget_attr(dir);
    }

    /// `read`, upgraded from relaxed to a session read (served by the leader) when this
    /// client wrote to `p` recently enough that a follower may not have its change yet.
    pub(crate) fn read_for(&self, p: u32, read: ReadKind) -> ReadKind {
        if read != ReadKind::RelaxedRead {
            return read;
        }
        let Some(t) = self.inner.last_write.get(p as usize) else {
            return read;
        };
        let t = t.load(Ordering::Relaxed);
        let window = self.inner.session_window.as_millis() as u64;
        if t != 0 && self.now_ms().saturating_sub(t) < window {
            ReadKind::SessionRead
        } else {
            read
        }
    }

    /// The answer of `relaxed`, a relaxed read, unless it is ENOENT: a replica behind its
    /// leader may not have an inode or entry yet, so absence is confirmed by `strict`.
    pub(crate) async fn absence_confirmed<T, R, S, SF>(
        relaxed: R,
        strict: S,
    ) -> Result<T, TalonError>
    where
        R: Future<Output = Result<T, TalonError>>,
        S: FnOnce() -> SF,
        SF: Future<Output = Result<T, TalonError>>,
    {
        match relaxed.await {
            Err(e) if e.errno() == Errno::ENOENT => strict().await,
            r => r,
        }
    }

    /// Routes one RPC and records any epoch a `StaleEpoch` answer reveals.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        p: u32,
        read: ReadKind,
        f: F,
    ) -> Result<T, TalonError>
    where
        F: Fn(NodeClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        if read == ReadKind::Write {
            self.note_write(p);
        }
        let r = self.router().call(p, read, f).await;
        if read == ReadKind::Write {
            // The window is counted from the answer too: a write that took longer than the
            // window (a big batch, a leader change) is still fresh when it returns.
            self.note_write(p);
        }
        if let Err(TalonError::StaleEpoch { epoch }) = &r {
            self.cache().observe_epoch(*epoch);
        }
        r
    }

    /// The class of directory `dir` if this client knows it, without asking the cluster.
    pub fn cached_class(&self, dir: Ino) -> Option<Class> {
        self.cache().class_of(dir)
    }

    /// The class of directory `dir`, from the cache or a strict `GetAttr`.
    pub(crate) async fn dir_class(&self, dir: Ino) -> Result<Class, TalonError> {
        if let Some(c) = self.cache().class_of(dir) {
            return Ok(c);
        }
        let attr = self
            .rpc_getattr(dir, ReadKind::StrictRead, self.epoch())
            .await?;
        if attr.kind != FileKind::Directory {
            return Err(TalonError::posix(
                Errno::ENOTDIR,
                format!("inode {dir} is not a directory"),
            ));
        }
        self.cache().set_class(dir, attr.class);
        Ok(attr.class)
    }

    fn partition_of(&self, parent: Ino, name: &[u8], class: Class) -> u32 {
        entry_partition(parent, name, class, self.router().partitions())
    }

    // ----- raw RPCs: one request each, explicit class and epoch, no epoch retry -----

    /// `Lookup`; returns the attributes and the epoch the answer is valid at.
    pub(crate) async fn rpc_lookup(
        &self,
        parent: Ino,
        class: Class,
        name: &[u8],
        read: ReadKind,
        epoch: u64,
    ) -> Result<(Attr, u64), TalonError> {
        let p = self.partition_of(parent, name, class);
        let read = self.read_for(p, read);
        let req = requests::lookup(Header::new(p, read, epoch), parent, name);
        let reply = self
            .call(p, read, |mut c| {
                let req = req.clone();
                async move { c.lookup(req).await }
            })
            .await?;
        let reply = replies::entry(reply);
        self.cache().observe_epoch(reply.epoch);
        Ok((reply.value?, reply.epoch.max(epoch)))
    }

    pub(crate) async fn rpc_getattr(
        &self,
        ino: Ino,
        read: ReadKind,
        epoch: u64,
    ) -> Result<Attr, TalonError> {
        let p = ino.home();
        let read = self.read_for(p, read);
        let req = requests::get_attr(Header::new(p, read, epoch), ino);
        let reply = self
            .call(p, read, |mut c| async move { c.get_attr(req).await })
            .await?;
        replies::attr(reply)
    }

    /// The owner (uid, gid) of new inodes whose spec leaves it open.
    pub(crate) fn owner(&self) -> (u32, u32) {
        (self.inner.opts.uid, self.inner.opts.gid)
    }

    /// `Create`; fills the cache with the new entry.
    pub(crate) async fn rpc_create(
        &self,
        parent: Ino,
        class: Class,
        name: &[u8],
        spec: &CreateSpec,
        epoch: u64,
    ) -> Result<DirChange<(Attr, bool)>, TalonError> {
        let p = self.partition_of(parent, name, class);
        // One token per logical create: the router resends this very request, so a retry
        // after a lost reply finds its own inode instead of EEXIST.
        let req = requests::create(
            Header::new(p, ReadKind::Write, epoch),
            parent,
            name,
            spec,
            self.owner(),
            request_id(),
        );
        let reply = self
            .call(p, ReadKind::Write, |mut c| {
                let req = req.clone();
                async move { c.create(req).await }
            })
            .await?;
        let reply = replies::created(reply);
        self.cache().observe_epoch(reply.epoch);
        self.changed_dir(parent);
        let made = reply.value?;
        let stamp = reply.epoch.max(epoch);
        self.cache()
            .insert_dentry(parent, class, name, &made.value.0, stamp);
        Ok(made)
    }

    pub(crate) async fn rpc_remove(
        &self,
        parent: Ino,
        class: Class,
        name: &[u8],
        directory: bool,
        epoch: u64,
    ) -> Result<DirChange<(Ino, u32)>, TalonError> {
        let p = self.partition_of(parent, name, class);
        let req = requests::remove(
            Header::new(p, ReadKind::Write, epoch),
            parent,
            name,
            directory,
            request_id(),
        );
        let r = self
            .call(p, ReadKind::Write, |mut c| {
                let req = req.clone();
                async move { c.remove(req).await }
            })
            .await;
        // Whatever the answer, what this client believed about the name is in doubt.
        self.cache().remove_dentry(parent, name);
        self.changed_dir(parent);
        let gone = replies::remove(r?);
        let ino = gone.value.0;
        // The inode's link count changed at its own home, which may be another partition.
        self.note_write(ino.home());
        if directory {
            self.cache().forget_class(ino);
        } else {
            // Other names of the inode now show another link count.
            self.cache().forget_attr(ino);
        }
        Ok(gone)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rpc_rename(
        &self,
        src_parent: Ino,
        src_class: Class,
        src_name: &[u8],
        dst_parent: Ino,
        dst_name: &[u8],
        flags: RenameFlags,
        epoch: u64,
    ) -> Result<(), TalonError> {
        let p = self.partition_of(src_parent, src_name, src_class);
        // The destination entry changes too, on its own partition.
        let dst_part = self
            .cache()
            .class_of(dst_parent)
            .map(|c| self.partition_of(dst_parent, dst_name, c));
        if let Some(d) = dst_part {
            self.note_write(d);
        }
        // The moved inode (its change time, a directory's parent) and a replaced one (its
        // link count) change at their homes: reads there go to the leader for the session
        // window too. Their inodes are known from the entries the kernel looked up first;
        // when either is not (or the destination is absent), any partition may be one.
        let homes = [(src_parent, src_name), (dst_parent, dst_name)]
            .map(|(dir, name)| self.cache().dentry(dir, name).map(|e| e.attr.ino.home()));
        let note_homes = || match homes {
            [Some(s), Some(d)] => {
                self.note_write(s);
                self.note_write(d);
            }
            _ => self.note_write_everywhere(),
        };
        note_homes();
        let req = requests::rename(
            Header::new(p, ReadKind::Write, epoch),
            src_parent,
            src_name,
            dst_parent,
            dst_name,
            flags,
            request_id(),
        );
        let r = self
            .call(p, ReadKind::Write, |mut c| {
                let req = req.clone();
                async move { c.rename(req).await }
            })
            .await;
        if let Some(d) = dst_part {
            self.note_write(d);
        }
        note_homes();
        self.cache().remove_dentry(src_parent, src_name);
        self.cache().remove_dentry(dst_parent, dst_name);
        self.changed_dir(src_parent);
        self.changed_dir(dst_parent);
        self.cache().observe_epoch(replies::rename(r?));
        Ok(())
    }

    pub(crate) async fn rpc_link(
        &self,
        ino: Ino,
        new_parent: Ino,
        class: Class,
        new_name: &[u8],
        epoch: u64,
    ) -> Result<Attr, TalonError> {
        let p = self.partition_of(new_parent, new_name, class);
        let req = requests::link(
            Header::new(p, ReadKind::Write, epoch),
            ino,
            new_parent,
            new_name,
            request_id(),
        );
        let reply = self
            .call(p, ReadKind::Write, |mut c| {
                let req = req.clone();
                async move { c.link(req).await }
            })
            .await?;
        let reply = replies::entry(reply);
        self.cache().observe_epoch(reply.epoch);
        let (attr, stamp) = (reply.value?, reply.epoch.max(epoch));
        // The link count changed at the inode's home, which may be another partition.
        self.note_write(ino.home());
        self.cache().note_attr(&attr);
        self.changed_dir(new_parent);
        self.cache()
            .insert_dentry(new_parent, class, new_name, &attr, stamp);
        Ok(attr)
    }

    // ----- inode-level API -----

    /// Looks up `name` in directory `parent`. Entries of relaxed directories may be read
    /// from any replica; entries of strict ones from the leader.
    pub async fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr, TalonError> {
        check_name(name)?;
        self.settle_in(parent, |class, epoch| async move {
            let (attr, stamp) = self
                .rpc_lookup(parent, class, name, read_kind(class), epoch)
                .await?;
            self.cache()
                .insert_dentry(parent, class, name, &attr, stamp);
            Ok(attr)
        })
        .await
    }

    /// The attributes of `ino`, read linearizably from its home partition's leader.
    pub async fn getattr(&self, ino: Ino) -> Result<Attr, TalonError> {
        self.settle(Scope::Inode, |epoch| {
            self.rpc_getattr(ino, ReadKind::StrictRead, epoch)
        })
        .await
    }

    /// The attributes of `ino` from any replica of its home partition, possibly stale
    /// within the cluster's staleness bound (this client's own changes show at once); an
    /// ENOENT is confirmed with the leader.
    pub async fn getattr_relaxed(&self, ino: Ino) -> Result<Attr, TalonError> {
        Self::absence_confirmed(self.rpc_getattr(ino, ReadKind::RelaxedRead, 0), || {
            self.getattr(ino)
        })
        .await
    }

    /// Changes the attributes named in `set`; returns the new attributes.
    pub async fn setattr(&self, ino: Ino, set: SetAttr) -> Result<Attr, TalonError> {
        let p = ino.home();
        self.settle(Scope::Inode, |epoch| {
            let req = requests::set_attr(Header::new(p, ReadKind::Write, epoch), ino, &set);
            async move {
                let reply = self
                    .call(
                        p,
                        ReadKind::Write,
                        |mut c| async move { c.set_attr(req).await },
                    )
                    .await?;
                let attr = replies::attr(reply)?;
                self.cache().note_attr(&attr);
                Ok(attr)
            }
        })
        .await
    }

    /// Creates `name` in `parent` as `spec` says.
    pub async fn create(
        &self,
        parent: Ino,
        name: &[u8],
        spec: CreateSpec,
    ) -> Result<Attr, TalonError> {
        Ok(self.create_entry(parent, name, spec).await?.0)
    }

    /// As [`Client::create`], and whether this call made the entry: false when a create
    /// without `exclusive` found a regular file of that name and opened it.
    pub async fn create_entry(
        &self,
        parent: Ino,
        name: &[u8],
        spec: CreateSpec,
    ) -> Result<(Attr, bool), TalonError> {
        Ok(self.create_in(parent, name, spec).await?.value)
    }

    /// As [`Client::create_entry`], with `parent`'s attributes after the create when the
    /// answer carries them (see [`DirChange`]).
    pub async fn create_in(
        &self,
        parent: Ino,
        name: &[u8],
        spec: CreateSpec,
    ) -> Result<DirChange<(Attr, bool)>, TalonError> {
        spec.check(name)?;
        let spec = &spec;
        self.settle_in(parent, |class, epoch| async move {
            self.rpc_create(parent, class, name, spec, epoch).await
        })
        .await
    }

    /// Removes `name` from `parent`: rmdir semantics when `directory`, unlink otherwise.
    /// Returns the removed ino and its remaining link count.
    pub async fn remove(
        &self,
        parent: Ino,
        name: &[u8],
        directory: bool,
    ) -> Result<(Ino, u32), TalonError> {
        Ok(self.remove_in(parent, name, directory).await?.value)
    }

    /// As [`Client::remove`], with `parent`'s attributes after the remove when the answer
    /// carries them (see [`DirChange`]).
    pub async fn remove_in(
        &self,
        parent: Ino,
        name: &[u8],
        directory: bool,
    ) -> Result<DirChange<(Ino, u32)>, TalonError> {
        check_name(name)?;
        self.settle_in(parent, |class, epoch| {
            self.rpc_remove(parent, class, name, directory, epoch)
        })
        .await
    }

    /// Renames `src_name` in `src_parent` to `dst_name` in `dst_parent`, atomically, across
    /// partitions if need be (never EXDEV).
    pub async fn rename_entry(
        &self,
        src_parent: Ino,
        src_name: &[u8],
        dst_parent: Ino,
        dst_name: &[u8],
        flags: RenameFlags,
    ) -> Result<(), TalonError> {
        check_name(src_name)?;
        check_name(dst_name)?;
        if flags.noreplace && flags.exchange {
            return Err(TalonError::posix(
                Errno::EINVAL,
                "NOREPLACE and EXCHANGE together",
            ));
        }
        self.settle_in(src_parent, |class, epoch| {
            self.rpc_rename(
                src_parent, class, src_name, dst_parent, dst_name, flags, epoch,
            )
        })
        .await
    }

    /// Adds hard link `new_name` in `new_parent` to `ino`; returns its attributes.
    pub async fn link(
        &self,
        ino: Ino,
        new_parent: Ino,
        new_name: &[u8],
    ) -> Result<Attr, TalonError> {
        check_name(new_name)?;
        self.settle_in(new_parent, |class, epoch| {
            self.rpc_link(ino, new_parent, class, new_name, epoch)
        })
        .await
    }

    /// The value of xattr `name` of `ino` (ENODATA when absent).
    pub async fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>, TalonError> {
        self.settle(Scope::Inode, |epoch| {
            self.rpc_getxattr(ino, name, ReadKind::StrictRead, epoch)
        })
        .await
    }

    /// The value of xattr `name` of `ino` from any replica of its home partition, possibly
    /// stale within the cluster's staleness bound (this client's own changes show at once);
    /// an ENOENT (no such inode) is confirmed with the leader.
    pub async fn getxattr_relaxed(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>, TalonError> {
        Self::absence_confirmed(
            self.rpc_getxattr(ino, name, ReadKind::RelaxedRead, 0),
            || self.getxattr(ino, name),
        )
        .await
    }

    async fn rpc_getxattr(
        &self,
        ino: Ino,
        name: &[u8],
        read: ReadKind,
        epoch: u64,
    ) -> Result<Vec<u8>, TalonError> {
        let p = ino.home();
        let read = self.read_for(p, read);
        let req = requests::get_xattr(Header::new(p, read, epoch), ino, name);
        let r = self
            .call(p, read, |mut c| {
                let req = req.clone();
                async move { c.get_xattr(req).await }
            })
            .await?;
        Ok(replies::get_xattr(r))
    }

    /// Sets xattr `name` of `ino` to `value`.
    pub async fn setxattr(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<(), TalonError> {
        let p = ino.home();
        let request_id = request_id();
        self.settle(Scope::Inode, |epoch| {
            let req = requests::set_xattr(
                Header::new(p, ReadKind::Write, epoch),
                ino,
                name,
                value,
                flags,
                request_id,
            );
            async move {
                self.call(p, ReadKind::Write, |mut c| {
                    let req = req.clone();
                    async move { c.set_xattr(req).await }
                })
                .await
                .map(|_| ())
            }
        })
        .await
    }

    /// The names of `ino`'s xattrs.
    pub async fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>, TalonError> {
        let p = ino.home();
        self.settle(Scope::Inode, |epoch| {
            let req = requests::list_xattr(Header::new(p, ReadKind::StrictRead, epoch), ino);
            async move {
                let r = self
                    .call(p, ReadKind::StrictRead, |mut c| async move {
                        c.list_xattr(req).await
                    })
                    .await?;
                Ok(replies::list_xattr(r))
            }
        })
        .await
    }

    /// Removes xattr `name` of `ino` (ENODATA when absent).
    pub async fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<(), TalonError> {
        let p = ino.home();
        let request_id = request_id();
        self.settle(Scope::Inode, |epoch| {
            let req = requests::remove_xattr(
                Header::new(p, ReadKind::Write, epoch),
                ino,
                name,
                request_id,
            );
            async move {
                self.call(p, ReadKind::Write, |mut c| {
                    let req = req.clone();
                    async move { c.remove_xattr(req).await }
                })
                .await
                .map(|_| ())
            }
        })
        .await
    }

    /// The target of symlink `ino`.
    pub async fn readlink(&self, ino: Ino) -> Result<Vec<u8>, TalonError> {
        match self.getxattr(ino, SYMLINK_XATTR).await {
            Err(TalonError::Posix {
                errno: Errno::ENODATA,
                ..
            }) => Err(TalonError::posix(
                Errno::EINVAL,
                format!("inode {ino} is not a symlink"),
            )),
            r => r,
        }
    }

    /// Sets the consistency class of directory `ino`; refused (ENOTEMPTY) unless it is empty.
    pub async fn set_class(&self, ino: Ino, class: Class) -> Result<Attr, TalonError> {
        let p = ino.home();
        let attr = self
            .settle(Scope::Inode, |epoch| {
                let req = requests::set_class(Header::new(p, ReadKind::Write, epoch), ino, class);
                async move {
                    let r = self
                        .call(
                            p,
                            ReadKind::Write,
                            |mut c| async move { c.set_class(req).await },
                        )
                        .await?;
                    replies::attr(r)
                }
            })
            .await;
        // Cached paths through this directory carry the old class.
        self.cache().clear();
        match attr {
            Ok(a) => {
                self.cache().set_class(ino, a.class);
                Ok(a)
            }
            Err(e) => {
                self.cache().forget_class(ino);
                Err(e)
            }
        }
    }

    /// Usage summed over every partition (each answered by any of its replicas). Space is
    /// the nodes' data file systems summed and divided by the replication factor; nodes
    /// that no partition's answer came from are counted like the average one that was.
    pub async fn statfs(&self) -> Result<StatFs, TalonError> {
        let mut calls: FuturesUnordered<_> = (0..self.router().partitions())
            .map(|p| {
                let req = requests::stat_fs(Header::new(p, ReadKind::RelaxedRead, 0));
                async move {
                    self.call(p, ReadKind::RelaxedRead, |mut c| async move {
                        c.stat_fs(req).await
                    })
                    .await
                }
            })
            .collect();
        let mut sum = StatFs::default();
        let mut nodes = std::collections::BTreeMap::new();
        while let Some(r) = calls.next().await {
            let (node, usage) = replies::stat_fs(r?);
            sum.inodes += usage.inodes;
            sum.bytes += usage.bytes;
            sum.entries += usage.entries;
            nodes.insert(
                node,
                (usage.space_total, usage.space_free, usage.space_avail),
            );
        }
        // Each partition was answered by whichever replica the router chose, so some nodes
        // may not have been heard from: count those like the average node that was.
        let copies = u128::from(self.cluster_map().replication.max(1));
        let answered = nodes.len().max(1) as u128;
        let all = (self.router().map().nodes.len() as u128).max(answered);
        let share = |v: u128| u64::try_from(v * all / answered / copies).unwrap_or(u64::MAX);
        let (mut total, mut free, mut avail) = (0u128, 0u128, 0u128);
        for (t, f, a) in nodes.into_values() {
            total += u128::from(t);
            free += u128::from(f);
            avail += u128::from(a);
        }
        sum.space_total = share(total);
        sum.space_free = share(free);
        sum.space_avail = share(avail);
        Ok(sum)
    }

    /// The status of every node in the cluster map, in node-id order. A node that does not
    /// answer is reported with its error rather than failing the call.
    pub async fn status(&self) -> Vec<NodeStatus> {
        let mut nodes = self.router().map().nodes;
        nodes.sort_by_key(|n| n.id);
        let calls = nodes.into_iter().map(|n| async move {
            let r = self
                .router()
                .call_node(
                    n.id,
                    |mut c| async move { c.status(requests::status()).await },
                )
                .await;
            let (partitions, space, load) = match r.map(replies::status) {
                Ok((partitions, space, load)) => (Ok(partitions), Some(space), Some(load)),
                Err(e) => (Err(e), None, None),
            };
            NodeStatus {
                node_id: n.id,
                addr: n.addr,
                partitions,
                space,
                load,
            }
        });
        futures::future::join_all(calls).await
    }
}
