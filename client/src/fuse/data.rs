//! The mount's open file: one `OpenFile` per kernel file handle, wrapping the client's
//! [`File`] (the one open-file handle of the client) with what the kernel needs besides
//! it: turn-taking between requests, and the pending size a `getattr` shows.
//!
//! The mount never stores or caches file contents itself: every read, write, truncate and
//! commit goes through the `File`, which owns the data path (small-file bodies in memory,
//! chunks, commits that switch the contents atomically). The kernel's open maps onto it as:
//!
//! - `open`/`create` open the `File` (a small file's body comes with the open reply);
//!   a read-only open of a file the kernel was shown as relaxed is *deferred*: it answers
//!   at once and opens the `File` at the first request that needs it (a read the page
//!   cache did not serve, a getattr of an unlinked file, an unlink of it here). An epoch
//!   whose images are in the kernel's page cache then costs no round trip per open, and
//!   a cold one still costs one (the open that brings the body). What a deferred open
//!   gives up is relaxed by design: a file another client removed within the staleness
//!   bound fails at its first read instead of at the open;
//! - `write` buffers in the `File`; `flush` (every `close(2)`), `fsync` and `release`
//!   commit, so after `close` returns every later open anywhere sees the new contents
//!   (close-to-open);
//! - a change one handle commits shows through this mount's other handles of the file
//!   from then on: they reopen their `File` at their next read, and the kernel drops the
//!   pages it cached through them (`Shared::changed_under_others`); before the commit, a
//!   read through another handle reads through the writer's (`OpenFile::read_uncommitted`),
//!   so it sees the writes as a local file system shows them;
//! - O_APPEND is the kernel's business: it passes append offsets in each write; O_TRUNC
//!   comes with the open and truncates through its handle;
//! - a write, truncate or O_TRUNC open by a caller that may not keep the file's set-ID
//!   bits clears them in the commit of the change (`File::drop_setid`), and the handle
//!   shows them cleared until then.
//!
//! A `File` is used by one caller at a time, so requests on one handle take turns; different
//! handles, even of one inode, proceed in parallel.

use crate::client::Client;
use crate::file::{File, OpenOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use talon_model::attr::without_setid;
use talon_model::{Attr, Errno, Ino, TalonError, Time};
use tokio::sync::Mutex;

/// One open regular file of the mount.
pub(crate) struct OpenFile {
    pub(crate) ino: Ino,
    /// What the `File` is opened for (the kernel's open flags).
    opts: OpenOptions,
    client: Client,
    file: Mutex<Slot>,
    /// Whether the `File` holds writes not yet committed, and the size they give it; read
    /// without waiting for the lock by `getattr`.
    dirty: AtomicBool,
    size: AtomicU64,
    /// Whether the commit of those writes clears the set-ID bits (`File::drop_setid`).
    drops_setid: AtomicBool,
    /// When the last uncommitted change was made: the file's mtime and ctime as this
    /// handle shows them until the commit gives the cluster's own.
    changed: std::sync::Mutex<Time>,
    /// Another handle of this mount committed a change to the file since this one's `File`
    /// was opened: a small file's body held from the open is not its contents any more
    /// (see [`OpenFile::mark_stale`]).
    stale: AtomicBool,
    /// The file is held open past the removal of its last name ([`OpenFile::detach`]): it
    /// can no longer be opened again by number.
    detached: AtomicBool,
}

/// Where a handle's `File` stands.
enum Slot {
    /// A deferred read-only open (see the module docs): nothing fetched yet.
    Deferred(OpenOptions),
    Open(File),
    Closed,
}

fn slot_clean(slot: &Slot) -> bool {
    match slot {
        Slot::Deferred(_) | Slot::Closed => true,
        Slot::Open(f) => !f.is_dirty(),
    }
}

fn closed(ino: Ino) -> TalonError {
    TalonError::posix(Errno::EBADF, format!("inode {ino}: handle already closed"))
}

/// The `File` options of the kernel's open `flags`.
fn open_options(flags: i32) -> OpenOptions {
    let acc = flags & libc::O_ACCMODE;
    OpenOptions {
        read: acc != libc::O_WRONLY,
        write: acc != libc::O_RDONLY,
        ..OpenOptions::default()
    }
}

impl OpenFile {
    fn with_slot(client: &Client, ino: Ino, opts: OpenOptions, slot: Slot) -> OpenFile {
        OpenFile {
            ino,
            opts,
            client: client.clone(),
            file: Mutex::new(slot),
            dirty: AtomicBool::new(false),
            size: AtomicU64::new(0),
            drops_setid: AtomicBool::new(false),
            changed: std::sync::Mutex::new(Time::default()),
            stale: AtomicBool::new(false),
            detached: AtomicBool::new(false),
        }
    }

    /// Opens `ino`'s contents with the kernel's open `flags`, now. `created` is the file's
    /// attributes when a create of this mount has just answered them: an empty new file
    /// then opens without another round trip.
    pub async fn open(
        client: &Client,
        ino: Ino,
        flags: i32,
        created: Option<Attr>,
    ) -> Result<OpenFile, TalonError> {
        let opts = open_options(flags);
        let file = match created {
            Some(a) => client.open_created(a, opts).await?,
            None => client.open_ino(ino, opts).await?,
        };
        Ok(OpenFile::with_slot(client, ino, opts, Slot::Open(file)))
    }

    /// A deferred open of `ino` (see the module docs), if `flags` allow one: read-only,
    /// without `O_TRUNC`. The caller knows the kernel was shown the file as relaxed.
    pub fn deferred(client: &Client, ino: Ino, flags: i32) -> Option<OpenFile> {
        let opts = open_options(flags);
        (!opts.write && flags & libc::O_TRUNC == 0)
            .then(|| OpenFile::with_slot(client, ino, opts, Slot::Deferred(opts)))
    }

    /// Opened for writing (`O_WRONLY` or `O_RDWR`).
    pub fn writable(&self) -> bool {
        self.opts.write
    }

    /// True when a flush of this handle has nothing to commit and nothing to wait for: a
    /// deferred or closed handle, or an open one without changes or an operation under
    /// way. The kernel's dispatch thread answers such a flush (and such a release, with
    /// [`OpenFile::close_clean`]) itself, without a trip through the runtime. False also
    /// when the handle is busy.
    pub fn is_clean(&self) -> bool {
        self.file.try_lock().is_ok_and(|g| slot_clean(&g))
    }

    /// Closes the handle if [`OpenFile::is_clean`]; false (and nothing done) otherwise.
    pub fn close_clean(&self) -> bool {
        let Ok(mut g) = self.file.try_lock() else {
            return false;
        };
        if !slot_clean(&g) {
            return false;
        }
        *g = Slot::Closed;
        true
    }

    /// The open `File` in `slot`, opening a deferred one first (a relaxed read-only open,
    /// as [`Client::open_ino_relaxed`] serves it).
    async fn file<'a>(&self, slot: &'a mut Slot) -> Result<&'a mut File, TalonError> {
        if let Slot::Deferred(opts) = *slot {
            *slot = Slot::Open(self.client.open_ino_relaxed(self.ino, opts).await?);
        }
        match slot {
            Slot::Open(f) => Ok(f),
            _ => Err(closed(self.ino)),
        }
    }

    /// Records the `File`'s size after a change, and that its commit clears the set-ID bits
    /// if `drop_setid`.
    async fn note_change(&self, f: &mut File, drop_setid: bool) -> Result<(), TalonError> {
        if drop_setid {
            f.drop_setid().await?;
            self.drops_setid.store(true, Ordering::Release);
        }
        let size = f.len().await?;
        self.size.store(size, Ordering::Release);
        *self.changed.lock().unwrap_or_else(|e| e.into_inner()) = Time::now();
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// Notes that the `File` has nothing uncommitted left; true if it had (the commit just
    /// made changed the file).
    fn committed(&self) -> bool {
        self.drops_setid.store(false, Ordering::Release);
        self.dirty.swap(false, Ordering::AcqRel)
    }

    /// Tells this handle that another handle of the mount committed a change to its file.
    /// Its `File` holds a small file's body from its open on, so its next read would serve
    /// the contents as they were, and fill the kernel's page cache with them for every
    /// later open of this mount: its `File` is opened again first.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// Reopens the `File` in `slot` if [`OpenFile::mark_stale`] said so and the handle has
    /// nothing of its own in it (no uncommitted writes), and the file is not held past its
    /// removal (it could not be opened by number again). The reopen reads strictly, at the
    /// leader, so it sees the change that made this handle stale. Should the reopen fail,
    /// the handle keeps what it had, as before the change.
    async fn refresh(&self, slot: &mut Slot) {
        if !self.stale.swap(false, Ordering::AcqRel) || self.detached.load(Ordering::Acquire) {
            return;
        }
        let Slot::Open(f) = slot else { return };
        if f.is_dirty() {
            return;
        }
        match self.client.open_ino(self.ino, self.opts).await {
            Ok(fresh) => *slot = Slot::Open(fresh),
            Err(e) => tracing::debug!(ino = %self.ino, "reopen a stale handle: {e}"),
        }
    }

    /// Up to `len` bytes at `offset` (fewer only at the end of the file).
    pub async fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, TalonError> {
        let mut g = self.file.lock().await;
        self.refresh(&mut g).await;
        let f = self.file(&mut g).await?;
        f.read_at(offset, u64::from(len)).await
    }

    /// Up to `len` bytes at `offset` as this handle's uncommitted writes make them, for a
    /// read through another handle of the file (the mount's `read_through_writer`); `None`
    /// once they are committed (the other handle's own read is then current).
    pub async fn read_uncommitted(
        &self,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, TalonError> {
        let mut g = self.file.lock().await;
        match &mut *g {
            Slot::Open(f) if f.is_dirty() => {
                f.read_as_written(offset, u64::from(len)).await.map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Writes `data` at `offset`; returns the bytes taken. With `drop_setid` (a writer that
    /// may not keep the set-ID bits), the commit of the change clears them.
    pub async fn write(
        &self,
        offset: u64,
        data: &[u8],
        drop_setid: bool,
    ) -> Result<u32, TalonError> {
        let n = u32::try_from(data.len())
            .map_err(|_| TalonError::posix(Errno::EINVAL, "write larger than 4 GiB"))?;
        let mut g = self.file.lock().await;
        let f = self.file(&mut g).await?;
        f.write_at(offset, data).await?;
        self.note_change(f, drop_setid).await?;
        Ok(n)
    }

    /// The size this handle has made the file, while it holds writes the cluster has not
    /// committed yet; `None` when the cluster's size is current.
    pub fn pending_size(&self) -> Option<u64> {
        self.dirty
            .load(Ordering::Acquire)
            .then(|| self.size.load(Ordering::Acquire))
    }

    /// `a` as this handle shows it while it holds uncommitted changes: their size, the
    /// set-ID bits their commit leaves, and mtime and ctime no older than the last change (a
    /// write or truncate changes them at once, not at the commit).
    pub fn overlay(&self, mut a: Attr) -> Attr {
        if let Some(size) = self.pending_size() {
            a.size = size;
            if self.drops_setid.load(Ordering::Acquire) {
                a.perm = without_setid(a.perm);
            }
            let changed = *self.changed.lock().unwrap_or_else(|e| e.into_inner());
            a.mtime = a.mtime.max(changed);
            a.ctime = a.ctime.max(changed);
        }
        a
    }

    /// The attributes as this handle sees them (its size includes uncommitted writes).
    pub async fn metadata(&self) -> Result<Attr, TalonError> {
        let mut g = self.file.lock().await;
        let f = self.file(&mut g).await?;
        f.metadata().await
    }

    /// Called before the file's last name is removed. POSIX keeps an unlinked file through
    /// open handles until they are closed: a deferred open is completed now (a small file's
    /// whole body is in the `File` once it is open), and the `File` holds the file on its
    /// home at once (`File::hold_now`), rather than from a quarter of the grace after its
    /// open: a session slow to start would otherwise race the reclaim (after half the grace
    /// on a nearly full node).
    pub async fn detach(&self) -> Result<(), TalonError> {
        let mut g = self.file.lock().await;
        self.file(&mut g).await?.hold_now().await?;
        self.detached.store(true, Ordering::Release);
        Ok(())
    }

    /// Truncates or extends the file to `size` (EBADF once the handle is closed); with
    /// `drop_setid`, as [`OpenFile::write`].
    pub async fn set_len(&self, size: u64, drop_setid: bool) -> Result<(), TalonError> {
        if self.set_len_if_open(size, drop_setid).await? {
            Ok(())
        } else {
            Err(closed(self.ino))
        }
    }

    /// As [`OpenFile::set_len`], for a caller that borrows this handle (a truncate by path
    /// beside a writer with uncommitted writes): false, with nothing done, if the handle
    /// was closed meanwhile, its writes committed by then ([`OpenFile::close`] holds the
    /// handle until its commit ends).
    pub async fn set_len_if_open(&self, size: u64, drop_setid: bool) -> Result<bool, TalonError> {
        let mut g = self.file.lock().await;
        if matches!(*g, Slot::Closed) {
            return Ok(false);
        }
        let f = self.file(&mut g).await?;
        f.set_len(size).await?;
        self.note_change(f, drop_setid).await?;
        Ok(true)
    }

    /// Commits what was written, so a later open anywhere sees it (close-to-open). True if
    /// there was something to commit.
    pub async fn flush(&self) -> Result<bool, TalonError> {
        let mut g = self.file.lock().await;
        let Slot::Open(f) = &mut *g else {
            return Ok(false);
        };
        f.flush().await?;
        Ok(self.committed())
    }

    /// Commits what was written, durably (a commit is replicated when it returns). True if
    /// there was something to commit.
    pub async fn fsync(&self) -> Result<bool, TalonError> {
        let mut g = self.file.lock().await;
        let Slot::Open(f) = &mut *g else {
            return Ok(false);
        };
        f.sync_all().await?;
        Ok(self.committed())
    }

    /// The last close of this handle: commits anything left (true if there was anything).
    /// The handle stays locked until the commit ends, so a change that borrows it meanwhile
    /// (a truncate by path) comes after the commit, not beside it.
    pub async fn close(&self) -> Result<bool, TalonError> {
        let mut g = self.file.lock().await;
        let Slot::Open(f) = std::mem::replace(&mut *g, Slot::Closed) else {
            return Ok(false);
        };
        let r = f.close().await;
        let changed = self.committed();
        r.map(|()| changed)
    }
}

/// Truncates or extends `ino` to `size` without an open handle (`truncate(2)`); with
/// `drop_setid`, as [`OpenFile::write`].
pub(crate) async fn truncate(
    client: &Client,
    ino: Ino,
    size: u64,
    drop_setid: bool,
) -> Result<(), TalonError> {
    client.truncate_as(ino, size, drop_setid).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClientOptions;
    use std::sync::Arc;
    use talon_testkit::TestCluster;

    /// A truncate by path that borrows a writer while that writer closes finds it closed
    /// only once the close's commit has ended, and is then made at once, after the writes.
    /// The close let go of the handle before its commit: the truncate failed with EBADF
    /// ("handle already closed"), and one made at once then could come before the writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_truncate_beside_a_closing_writer_follows_its_commit() {
        let cluster = TestCluster::builder()
            .nodes(1)
            .replication(1)
            .start()
            .await
            .expect("cluster");
        let c = Client::connect(&cluster.addrs(), ClientOptions::default())
            .await
            .expect("connect");
        let ino = c.write_file("/f", b"").await.expect("create").ino;
        let w = Arc::new(
            OpenFile::open(&c, ino, libc::O_WRONLY, None)
                .await
                .expect("open"),
        );
        w.write(0, b"0123456789", false).await.expect("write");
        let closing = {
            let w = w.clone();
            tokio::spawn(async move { w.close().await })
        };
        // Until the close has the handle (or has let go of it, closed).
        loop {
            match w.file.try_lock() {
                Ok(g) if !matches!(*g, Slot::Closed) => tokio::task::yield_now().await,
                _ => break,
            }
        }
        let through = w.set_len_if_open(3, false).await.expect("truncate");
        assert!(!through, "a closed handle took the truncate");
        assert_eq!(
            c.read_file("/f").await.expect("read"),
            b"0123456789",
            "the handle was found closed before its writes were committed"
        );
        closing.await.expect("join").expect("close");
        truncate(&c, ino, 3, false).await.expect("truncate at once");
        assert_eq!(c.read_file("/f").await.expect("read"), b"012");
        cluster.shutdown().await;
    }
}
