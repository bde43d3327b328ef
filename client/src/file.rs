//! [`File`]: an open regular file with positioned and streaming reads and writes
//! (`AsyncRead`, `AsyncWrite`, `AsyncSeek`), buffered changes and commit at
//! [`File::flush`] / [`File::close`].
//!
//! **What a File holds.** The contents it was opened with (the base), plus its own
//! uncommitted changes:
//!
//! - while the file is small (at most the cluster's `small_file_max`) its whole contents
//!   live in memory, and a commit is one `WriteSmall`;
//! - once it is chunked, only *dirty* chunks are in memory. A write to a chunk the File does
//!   not hold first reads that chunk (read-modify-write). A dirty chunk that the writer has
//!   filled and moved past is stored with `PutChunk` in the background under a fresh
//!   `write_id`, at most [`MAX_UPLOADS`] at once, and at most [`MAX_DIRTY`] dirty chunks are
//!   kept, so a sequential write of any size needs bounded memory. A commit stores the
//!   remaining dirty chunks and sends one `CommitLayout` naming every chunk. The write ids
//!   are those of an open session the File holds on the file's home from a quarter of the
//!   servers' shorter grace after its open until it is dropped (`open_session`), so
//!   chunks stored long before the commit are not taken for a dead writer's; a File cut
//!   off from the servers for longer than the session's lease fails its commit with EIO
//!   rather than name chunks that may be gone.
//!
//! **Unlinked while open.** A File keeps working after the file's last name is gone (a
//! temporary file, a checkpoint replaced while it is read), as on a local file system: a
//! reader of a small file holds its body, and a writer or a reader of a chunked file holds
//! the file itself through its session, so the servers reclaim it only after the File is
//! dropped (or, if its client is cut off, a lease after its last renewal).
//!
//! A small file that grows past `small_file_max` becomes chunked (its body becomes the first
//! chunk(s)); a chunked file stays chunked, except that truncating it to zero bytes lets it
//! be committed small again. Shrinking a chunked file drops the chunks past the end and
//! shortens the last one's `len`, so bytes past the new size read as zeros if the file
//! grows again; nothing is rewritten.
//!
//! **Visibility.** The File reads its own uncommitted writes. Other readers see the
//! contents switch atomically when the commit is applied: never a mix of old and new bytes.
//! After `flush` / `sync_all` / `close` returns, every later open sees the new contents
//! (close-to-open). Dropping a File without closing it discards its uncommitted changes (it
//! logs a warning); chunks it had stored are garbage-collected by the servers.
//!
//! **Concurrent writers.** Commits carry `expect_generation = 0`: the last commit wins, as
//! POSIX tools expect of a local file system. A File that commits after another writer
//! replaces that writer's contents with its own view (its base plus its changes), so two
//! writers of disjoint ranges of one chunked file do not merge; use one writer per file.
//!
//! **Streaming.** `AsyncRead` reads ahead up to the end of the current chunk (at most one
//! chunk per RPC); `AsyncWrite` accepts data into the File and reports a failure of a
//! background chunk store at the next write or flush, like a local file system's deferred
//! write errors; `AsyncSeek` works on the File's current size, uncommitted changes included.
//! Positional reads (`read_at`, which a mount serves the kernel's reads with) that go
//! through the file in order fetch the rest of a chunk at their first read of it and answer
//! the next ones from it: one request per chunk, not one per read.

use crate::client::Client;
use crate::data::{data_error, pieces, Opened};
use crate::open_session::OpenSession;
use crate::path;
use crate::router::ReadKind;
use crate::types::CreateSpec;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use talon_model::{Attr, ChunkRef, Errno, FileKind, Ino, Layout, TalonError};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;

/// Background chunk stores in flight for one File.
pub const MAX_UPLOADS: usize = 6;

/// Dirty chunks a File keeps in memory before it stores some early.
pub const MAX_DIRTY: usize = 4;

/// How to open a file, as `open(2)` flags. The default opens an existing file read-only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Allow reads.
    pub read: bool,
    /// Allow writes.
    pub write: bool,
    /// Create the file if it does not exist (`O_CREAT`).
    pub create: bool,
    /// Fail if it exists (`O_EXCL`, with `create`).
    pub exclusive: bool,
    /// Empty the file when opening it (`O_TRUNC`, with `write`).
    pub truncate: bool,
    /// Every write goes to the end of the file (`O_APPEND`).
    pub append: bool,
    /// Permission bits of a created file.
    pub perm: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read: true,
            write: false,
            create: false,
            exclusive: false,
            truncate: false,
            append: false,
            perm: 0o644,
        }
    }
}

impl OpenOptions {
    /// Read-only, the file must exist.
    pub fn read_only() -> OpenOptions {
        OpenOptions::default()
    }

    /// Read-write, created if missing, emptied if present (`O_RDWR|O_CREAT|O_TRUNC`).
    pub fn create_truncate() -> OpenOptions {
        OpenOptions {
            write: true,
            create: true,
            truncate: true,
            ..OpenOptions::default()
        }
    }

    /// Read-write, the file must exist (`O_RDWR`).
    pub fn read_write() -> OpenOptions {
        OpenOptions {
            write: true,
            ..OpenOptions::default()
        }
    }

    /// Append-only, created if missing (`O_WRONLY|O_CREAT|O_APPEND`).
    pub fn append() -> OpenOptions {
        OpenOptions {
            read: false,
            write: true,
            create: true,
            append: true,
            ..OpenOptions::default()
        }
    }
}

/// A chunk store started in the background, and how it ended.
struct Upload {
    index: u32,
    write_id: u64,
    data: Bytes,
    result: Result<(), TalonError>,
}

/// A small file's body lent to its `WriteSmall` as `Bytes`, without a copy. The File gets
/// it back when the loan is dropped: after the request, or when a caller drops the commit
/// before it finished (which must not lose the contents); a copy is made only if the
/// request still shares it then.
struct Lent<'a> {
    home: &'a mut Vec<u8>,
    body: Bytes,
}

impl<'a> Lent<'a> {
    fn new(home: &'a mut Vec<u8>) -> Lent<'a> {
        let body = Bytes::from(std::mem::take(home));
        Lent { home, body }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        *self.home = Vec::from(std::mem::take(&mut self.body));
    }
}

/// The contents of a chunked file as this File sees them.
struct Chunks {
    chunk_size: u64,
    /// The layout to commit, for chunks that are not dirty.
    refs: Vec<ChunkRef>,
    /// Chunks changed in memory; each holds the chunk's exact bytes (zeros after its end).
    dirty: BTreeMap<u32, Vec<u8>>,
    /// Chunks being stored, by index: their write id and bytes, served to reads while
    /// `refs` names that write id.
    storing: HashMap<u32, (u64, Bytes)>,
    uploads: JoinSet<Upload>,
    /// The rest of a chunk fetched for a reader going through the file in order, to
    /// answer its next reads (see [`Ahead`]).
    ahead: Option<Box<Ahead>>,
    /// The chunk after `ahead`, being fetched while the reader reads `ahead`.
    next: Option<Prefetch>,
    /// Where the last positional read ended: a read that starts there is sequential.
    read_end: u64,
}

/// A whole chunk fetched in the background for a sequential reader, which becomes its
/// [`Ahead`] when the reader gets there: the node reads it (from its disk, when the page
/// cache does not hold it) while the reader still reads the chunk before. Stopped when
/// dropped.
struct Prefetch {
    index: u32,
    write_id: u64,
    task: tokio::task::JoinHandle<Result<Vec<u8>, TalonError>>,
    /// Its room in the client's read-ahead budget, passed on to the [`Ahead`] it becomes.
    held: Option<OwnedSemaphorePermit>,
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Bytes of a stored chunk from `from` to its end, fetched in one request when a read
/// goes through the file in order: a sequential reader (the kernel's 128 KiB reads of a
/// mount, say) that asked for each range on its own would pay a request per read, and the
/// node would read the chunk's blocks a few at a time instead of in pieces at once. A
/// stored chunk never changes under its write id: the bytes answer while the layout names
/// it.
struct Ahead {
    index: u32,
    write_id: u64,
    from: u64,
    data: Vec<u8>,
    /// Its room in the client's read-ahead budget (`ClientOptions::read_ahead_bytes`).
    _held: OwnedSemaphorePermit,
}

impl Ahead {
    /// The bytes `[in_chunk, in_chunk + n)` of chunk `index` under `write_id`, if held.
    fn get(&self, index: u32, write_id: u64, in_chunk: u64, n: u64) -> Option<&[u8]> {
        let start = in_chunk.checked_sub(self.from)?;
        let end = start.checked_add(n)?;
        (self.index == index && self.write_id == write_id && end <= self.data.len() as u64)
            .then(|| &self.data[start as usize..end as usize])
    }
}

enum Body {
    /// The whole contents, `len() == size`.
    Small(Vec<u8>),
    Chunked(Chunks),
}

/// Everything an open file owns; moved into a future while a streaming operation runs.
struct Core {
    client: Client,
    ino: Ino,
    /// The path or inode, for messages.
    what: String,
    opts: OpenOptions,
    attr: Attr,
    size: u64,
    body: Body,
    /// Uncommitted changes exist.
    changed: bool,
    /// The next commit clears the file's set-ID bits (`File::drop_setid`).
    drop_setid: bool,
    small_max: u64,
    new_chunk_size: u64,
    /// Holds the chunks this File stored until it commits them, and the file while unlinked:
    /// made at the open of a writer or of a chunked file's reader, held from a quarter of
    /// the servers' shorter grace on.
    session: Option<OpenSession>,
}

fn bad_fd(what: &str, op: &str) -> TalonError {
    TalonError::posix(Errno::EBADF, format!("{what}: not open for {op}"))
}

impl Core {
    fn new(client: Client, opened: Opened, what: String, opts: OpenOptions) -> Core {
        let (small_max, chunk_size) = client.data_limits();
        let size = opened.attr.size;
        // A reader of a small file holds its whole body; everything else the File may need
        // from the servers later is kept for it by a session (see `open_session`).
        let session = (opts.write || matches!(opened.layout, Layout::Chunked { .. }))
            .then(|| OpenSession::start(&client, opened.attr.ino));
        let body = match opened.layout {
            Layout::Small => Body::Small(opened.body.unwrap_or_default()),
            Layout::Chunked { chunk_size, chunks } => Body::Chunked(Chunks {
                chunk_size: chunk_size as u64,
                refs: chunks,
                dirty: BTreeMap::new(),
                storing: HashMap::new(),
                uploads: JoinSet::new(),
                ahead: None,
                next: None,
                read_end: 0,
            }),
        };
        Core {
            client,
            ino: opened.attr.ino,
            what,
            opts,
            attr: opened.attr,
            size,
            body,
            changed: false,
            drop_setid: false,
            small_max,
            new_chunk_size: chunk_size,
            session,
        }
    }

    async fn read_at(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, TalonError> {
        if !self.opts.read {
            return Err(bad_fd(&self.what, "reading"));
        }
        self.read_held(offset, len).await
    }

    /// As [`Core::read_at`], whatever the File was opened for.
    async fn read_held(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, TalonError> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let c = match &mut self.body {
            Body::Small(b) => {
                // The bytes held, then zeros past them (a truncate that extended the file):
                // one pass over the answer, not a zeroing and then a copy.
                let have = (b.len() as u64).min(end);
                let mut out = Vec::with_capacity((end - offset) as usize);
                if offset < have {
                    out.extend_from_slice(&b[offset as usize..have as usize]);
                }
                out.resize((end - offset) as usize, 0);
                return Ok(out);
            }
            Body::Chunked(c) => c,
        };
        let mut out = vec![0u8; (end - offset) as usize];
        let sequential = offset == c.read_end;
        c.read_end = end;
        let (first, last) = (
            (offset / c.chunk_size) as u32,
            ((end - 1) / c.chunk_size) as u32,
        );
        if !sequential || c.next.as_ref().is_some_and(|p| p.index < first) {
            c.next = None;
        }
        let fetched = c.next.take_if(|p| {
            p.index <= last
                && c.refs
                    .get(p.index as usize)
                    .is_some_and(|r| r.write_id == p.write_id)
        });
        if let Some(mut p) = fetched {
            // A failed prefetch is only a miss: the read below asks again.
            if let (Ok(Ok(data)), Some(held)) = ((&mut p.task).await, p.held.take()) {
                c.ahead = Some(Box::new(Ahead {
                    index: p.index,
                    write_id: p.write_id,
                    from: 0,
                    data,
                    _held: held,
                }));
            }
        }
        // Chunks held in memory are copied; the rest are fetched in one parallel read each
        // run of committed chunks.
        let mut fetch: Vec<(u32, u64, u64, u64)> = Vec::new();
        let mut read_ahead_used = false;
        for (index, in_chunk, n, at) in pieces(offset, end - offset, c.chunk_size) {
            let dst = &mut out[at as usize..(at + n) as usize];
            if let Some(d) = c.dirty.get(&index) {
                copy_from(dst, d, in_chunk, d.len() as u64);
                continue;
            }
            let r = c.refs.get(index as usize).copied().unwrap_or_default();
            if r.is_hole() {
                continue;
            }
            let valid = (r.len as u64).saturating_sub(in_chunk).min(n);
            let held = c
                .ahead
                .as_ref()
                .and_then(|a| a.get(index, r.write_id, in_chunk, valid));
            match (c.storing.get(&index), held) {
                (Some((id, d)), _) if *id == r.write_id => {
                    copy_from(dst, d, in_chunk, r.len as u64)
                }
                (_, Some(d)) => {
                    dst[..d.len()].copy_from_slice(d);
                    read_ahead_used = true;
                }
                _ => fetch.push((index, in_chunk, n, at)),
            }
        }
        // A reader that turned away from the order it read in gives its read-ahead back
        // to the client's budget, unless this read still used it.
        if !sequential && !read_ahead_used {
            c.ahead = None;
        }
        if !fetch.is_empty() {
            let client = self.client.clone();
            let mut runs = futures::stream::FuturesUnordered::new();
            let sem = Arc::new(tokio::sync::Semaphore::new(crate::data::READ_CONCURRENCY));
            let final_piece = fetch.len() - 1;
            for (k, (index, in_chunk, n, at)) in fetch.into_iter().enumerate() {
                let r = c.refs[index as usize];
                let mut valid = (r.len as u64).saturating_sub(in_chunk).min(n);
                if valid == 0 {
                    continue;
                }
                // A sequential reader's last chunk is fetched to its end, for its next
                // reads, while the client's read-ahead budget has room for it.
                let rest = r.len as u64 - in_chunk;
                let ahead = if sequential && k == final_piece && valid < rest {
                    // The held rest of an earlier chunk gives its room to this one's.
                    c.ahead = None;
                    client.hold_read_ahead(rest)
                } else {
                    None
                };
                if ahead.is_some() {
                    valid = rest;
                }
                let (client, sem, ino) = (client.clone(), sem.clone(), self.ino);
                runs.push(async move {
                    let _permit = sem.acquire().await;
                    let data = client
                        .rpc_get_chunk(ino, r.write_id, index, in_chunk as u32, valid as u32)
                        .await?;
                    let ahead = ahead.map(|held| (index, r.write_id, in_chunk, n, held));
                    Ok::<_, TalonError>((at, data, ahead))
                });
            }
            use futures::StreamExt;
            while let Some(r) = runs.next().await {
                let (at, data, ahead) = r.map_err(|e| data_error(&self.what, e))?;
                let Some((index, write_id, from, n, held)) = ahead else {
                    out[at as usize..at as usize + data.len()].copy_from_slice(&data);
                    continue;
                };
                let used = (n as usize).min(data.len());
                out[at as usize..at as usize + used].copy_from_slice(&data[..used]);
                c.ahead = Some(Box::new(Ahead {
                    index,
                    write_id,
                    from,
                    data,
                    _held: held,
                }));
            }
        }
        if sequential {
            c.prefetch_after(&self.client, self.ino, last, end);
        }
        Ok(out)
    }

    /// Turns a small body into dirty chunks.
    fn make_chunked(&mut self) {
        if let Body::Small(b) = &mut self.body {
            let b = std::mem::take(b);
            let cs = self.new_chunk_size;
            let dirty = b
                .chunks(cs as usize)
                .enumerate()
                .map(|(i, part)| (i as u32, part.to_vec()))
                .collect();
            self.body = Body::Chunked(Chunks {
                chunk_size: cs,
                refs: Vec::new(),
                dirty,
                storing: HashMap::new(),
                uploads: JoinSet::new(),
                ahead: None,
                next: None,
                read_end: 0,
            });
        }
    }

    async fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), TalonError> {
        if !self.opts.write {
            return Err(bad_fd(&self.what, "writing"));
        }
        if data.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| TalonError::posix(Errno::EFBIG, "write past the largest offset"))?;
        self.changed = true;
        if let Body::Small(b) = &mut self.body {
            if end <= self.small_max {
                if offset == b.len() as u64 {
                    b.extend_from_slice(data);
                } else {
                    if (b.len() as u64) < end {
                        b.resize(end as usize, 0);
                    }
                    b[offset as usize..end as usize].copy_from_slice(data);
                }
                self.size = b.len() as u64;
                return Ok(());
            }
            self.make_chunked();
        }
        let Body::Chunked(c) = &mut self.body else {
            return Err(TalonError::Invalid("file body is not chunked".into()));
        };
        let whole = c.chunk_size as usize;
        for (index, in_chunk, n, at) in pieces(offset, data.len() as u64, c.chunk_size) {
            let buf = c.dirty_chunk(&self.client, self.ino, index).await?;
            let (lo, hi) = (in_chunk as usize, (in_chunk + n) as usize);
            let src = &data[at as usize..(at + n) as usize];
            if buf.capacity() < hi {
                // A chunk that grows is made room for whole at once: a sequential writer
                // fills it, and growing it by doublings would copy it each time.
                buf.reserve_exact(whole - buf.len());
            }
            if buf.len() == lo {
                // Appended: copied once, not zeroed first.
                buf.extend_from_slice(src);
            } else {
                if buf.len() < hi {
                    buf.resize(hi, 0);
                }
                buf[lo..hi].copy_from_slice(src);
            }
        }
        self.size = self.size.max(end);
        // Store chunks the writer has filled and moved past, and keep the dirty set small.
        let cs = c.chunk_size;
        let done: Vec<u32> = c
            .dirty
            .iter()
            .filter(|(i, d)| d.len() as u64 == cs && (**i as u64 + 1) * cs <= end)
            .map(|(i, _)| *i)
            .collect();
        for i in done {
            c.store(&self.client, self.ino, i, &mut self.session)
                .await?;
        }
        while c.dirty.len() > MAX_DIRTY {
            let Some(i) = c.dirty.keys().next().copied() else {
                break;
            };
            c.store(&self.client, self.ino, i, &mut self.session)
                .await?;
        }
        Ok(())
    }

    async fn set_len(&mut self, size: u64) -> Result<(), TalonError> {
        if !self.opts.write {
            return Err(bad_fd(&self.what, "writing"));
        }
        self.changed = true;
        if size == 0 {
            // Nothing of the old contents survives: the file may be small again.
            self.body = Body::Small(Vec::new());
            self.size = 0;
            return Ok(());
        }
        if let Body::Small(b) = &mut self.body {
            if size <= self.small_max {
                b.resize(size as usize, 0);
                self.size = size;
                return Ok(());
            }
            self.make_chunked();
        }
        let Body::Chunked(c) = &mut self.body else {
            return Err(TalonError::Invalid("file body is not chunked".into()));
        };
        if size < self.size {
            let cs = c.chunk_size;
            let keep = size.div_ceil(cs);
            c.refs.truncate(keep as usize);
            c.dirty.retain(|i, _| (*i as u64) < keep);
            let last = (keep - 1) as u32;
            let rem = size - (keep - 1) * cs;
            if let Some(r) = c.refs.get_mut(last as usize) {
                r.len = r.len.min(rem as u32);
                if r.len == 0 {
                    *r = ChunkRef::default();
                }
            }
            if let Some(d) = c.dirty.get_mut(&last) {
                d.truncate(rem as usize);
            }
        }
        self.size = size;
        Ok(())
    }

    async fn commit(&mut self) -> Result<(), TalonError> {
        let Body::Chunked(c) = &mut self.body else {
            if !self.changed {
                return Ok(());
            }
            let Body::Small(b) = &mut self.body else {
                return Err(TalonError::Invalid("file body is not small".into()));
            };
            let lent = Lent::new(b);
            let sent = self
                .client
                .rpc_write_small(self.ino, lent.body.clone(), self.drop_setid)
                .await;
            drop(lent);
            self.attr = sent?;
            self.changed = false;
            self.drop_setid = false;
            return Ok(());
        };
        let indexes: Vec<u32> = c.dirty.keys().copied().collect();
        for i in indexes {
            c.store(&self.client, self.ino, i, &mut self.session)
                .await?;
        }
        while !c.uploads.is_empty() {
            c.reap_one().await?;
        }
        if !self.changed {
            return Ok(());
        }
        let session = match &mut self.session {
            Some(s) => s.held().await?,
            None => 0,
        };
        let cs = c.chunk_size;
        let mut refs = c.refs.clone();
        refs.truncate(self.size.div_ceil(cs) as usize);
        for r in refs.iter_mut() {
            if r.is_hole() {
                *r = ChunkRef::default();
            }
        }
        while refs.last().is_some_and(ChunkRef::is_hole) {
            refs.pop();
        }
        let attr = self
            .client
            .rpc_commit_layout(
                self.ino,
                self.size,
                cs as u32,
                &refs,
                session,
                // The layout `refs` started from: the open's, or this File's last commit's.
                self.attr.generation,
                self.drop_setid,
            )
            .await?;
        c.refs = refs;
        self.attr = attr;
        self.changed = false;
        self.drop_setid = false;
        Ok(())
    }

    fn metadata(&self) -> Attr {
        Attr {
            size: self.size,
            ..self.attr.clone()
        }
    }
}

/// Copies bytes `[from, from + dst.len())` of `src`, which is valid up to `valid`; the rest
/// of `dst` stays zero.
fn copy_from(dst: &mut [u8], src: &[u8], from: u64, valid: u64) {
    let valid = valid.min(src.len() as u64);
    if from >= valid {
        return;
    }
    let n = ((valid - from) as usize).min(dst.len());
    dst[..n].copy_from_slice(&src[from as usize..from as usize + n]);
}

impl Chunks {
    /// Starts fetching the chunk after `index` for a sequential reader that holds `index`
    /// ahead or has just read to its end (a streaming reader asks for a chunk's rest at a
    /// time), unless it is under way, a hole, or held here.
    fn prefetch_after(&mut self, client: &Client, ino: Ino, index: u32, read_end: u64) {
        let holds = self.ahead.as_ref().is_some_and(|a| a.index == index);
        let through = read_end == (u64::from(index) + 1) * self.chunk_size;
        let i = index + 1;
        if !(holds || through) || self.next.is_some() || self.dirty.contains_key(&i) {
            return;
        }
        let Some(r) = self.refs.get(i as usize).copied() else {
            return;
        };
        if r.is_hole() || self.storing.contains_key(&i) {
            return;
        }
        let Some(held) = client.hold_read_ahead(u64::from(r.len)) else {
            return;
        };
        let client = client.clone();
        let task =
            tokio::spawn(async move { client.rpc_get_chunk(ino, r.write_id, i, 0, r.len).await });
        self.next = Some(Prefetch {
            index: i,
            write_id: r.write_id,
            task,
            held: Some(held),
        });
    }

    /// The dirty buffer of chunk `index`, reading the chunk first if the File does not hold
    /// it yet.
    async fn dirty_chunk(
        &mut self,
        client: &Client,
        ino: Ino,
        index: u32,
    ) -> Result<&mut Vec<u8>, TalonError> {
        if !self.dirty.contains_key(&index) {
            let r = self.refs.get(index as usize).copied().unwrap_or_default();
            let old = if r.is_hole() {
                Vec::new()
            } else if let Some((_, d)) =
                self.storing.get(&index).filter(|(id, _)| *id == r.write_id)
            {
                d[..(r.len as usize).min(d.len())].to_vec()
            } else {
                client
                    .rpc_get_chunk(ino, r.write_id, index, 0, r.len)
                    .await
                    .map_err(|e| data_error(&format!("inode {ino}"), e))?
            };
            self.dirty.insert(index, old);
        }
        self.dirty
            .get_mut(&index)
            .ok_or_else(|| TalonError::Invalid("dirty chunk vanished".into()))
    }

    /// Starts storing dirty chunk `index` in the background, waiting for a slot first, under
    /// a write id of `session` (every writer holds one from its open).
    async fn store(
        &mut self,
        client: &Client,
        ino: Ino,
        index: u32,
        session: &mut Option<OpenSession>,
    ) -> Result<(), TalonError> {
        if !self.dirty.contains_key(&index) {
            return Ok(());
        }
        // The chunk stays dirty while this waits for a slot, so a caller that drops the
        // wait (a cancelled write or commit) loses nothing.
        while self.uploads.len() >= MAX_UPLOADS {
            self.reap_one().await?;
        }
        let Some(data) = self.dirty.remove(&index) else {
            return Ok(());
        };
        if self.refs.len() <= index as usize {
            self.refs.resize(index as usize + 1, ChunkRef::default());
        }
        if data.is_empty() {
            self.refs[index as usize] = ChunkRef::default();
            return Ok(());
        }
        let write_id = match session
            .as_mut()
            .ok_or_else(|| TalonError::Invalid("a File storing chunks has no open session".into()))
            .and_then(OpenSession::write_id)
        {
            Ok(id) => id,
            Err(e) => {
                self.dirty.insert(index, data);
                return Err(e);
            }
        };
        self.refs[index as usize] = ChunkRef {
            write_id,
            len: data.len() as u32,
        };
        let data = Bytes::from(data);
        self.storing.insert(index, (write_id, data.clone()));
        let client = client.clone();
        self.uploads.spawn(async move {
            let result = client
                .rpc_put_chunk(ino, write_id, index, data.clone())
                .await;
            Upload {
                index,
                write_id,
                data,
                result,
            }
        });
        Ok(())
    }

    /// Waits for one background store. A failed store puts its chunk back among the dirty
    /// ones (if nothing newer replaced it) and returns the error.
    async fn reap_one(&mut self) -> Result<(), TalonError> {
        let Some(done) = self.uploads.join_next().await else {
            return Ok(());
        };
        let done = done.map_err(|e| TalonError::Unavailable(format!("chunk store task: {e}")))?;
        let current = self
            .storing
            .get(&done.index)
            .is_some_and(|(id, _)| *id == done.write_id);
        if current {
            self.storing.remove(&done.index);
        }
        if let Err(e) = done.result {
            let named = self
                .refs
                .get(done.index as usize)
                .is_some_and(|r| r.write_id == done.write_id);
            if named && !self.dirty.contains_key(&done.index) {
                let len = self.refs[done.index as usize].len as usize;
                let mut data = Vec::from(done.data);
                data.truncate(len);
                self.dirty.insert(done.index, data);
            }
            return Err(e);
        }
        Ok(())
    }
}

/// What a streaming operation running in the background produced.
enum Outcome {
    Read(u64, Result<Vec<u8>, TalonError>),
    Write(Result<(), TalonError>),
    Flush(Result<(), TalonError>),
}

type Op = BoxFuture<'static, (Box<Core>, Outcome)>;

/// An open regular file. See the module docs for buffering, commit and visibility.
pub struct File {
    core: Option<Box<Core>>,
    op: Option<Op>,
    pos: u64,
    /// Read-ahead: bytes of the file starting at `rbuf_at`.
    rbuf: Vec<u8>,
    rbuf_at: u64,
    rbuf_used: usize,
}

fn io_err(e: TalonError) -> io::Error {
    let errno = e.errno();
    io::Error::new(io::Error::from_raw_os_error(errno.0).kind(), e)
}

impl File {
    fn new(core: Core) -> File {
        File {
            core: Some(Box::new(core)),
            op: None,
            pos: 0,
            rbuf: Vec::new(),
            rbuf_at: 0,
            rbuf_used: 0,
        }
    }

    /// Drives a running streaming operation to its end and takes the core back. A failed
    /// write or flush is returned; a read's result is dropped.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), TalonError>> {
        if let Some(op) = self.op.as_mut() {
            let (core, outcome) = ready!(op.as_mut().poll(cx));
            self.op = None;
            self.core = Some(core);
            match outcome {
                Outcome::Read(at, Ok(data)) => self.set_rbuf(at, data),
                Outcome::Read(_, Err(_)) => {}
                Outcome::Write(r) | Outcome::Flush(r) => r?,
            }
        }
        Poll::Ready(Ok(()))
    }

    fn set_rbuf(&mut self, at: u64, data: Vec<u8>) {
        self.rbuf = data;
        self.rbuf_at = at;
        self.rbuf_used = 0;
    }

    fn drop_rbuf(&mut self) {
        self.rbuf.clear();
        self.rbuf_used = 0;
    }

    async fn core(&mut self) -> Result<&mut Core, TalonError> {
        std::future::poll_fn(|cx| self.poll_idle(cx)).await?;
        self.core
            .as_deref_mut()
            .ok_or_else(|| TalonError::Invalid("file has no state".into()))
    }

    /// The inode.
    pub fn ino(&self) -> Ino {
        self.core.as_ref().map_or(Ino(0), |c| c.ino)
    }

    /// The current position of the streaming interface.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Up to `len` bytes at `offset` (fewer at the end of the file; holes read as zeros),
    /// this File's uncommitted writes included.
    pub async fn read_at(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, TalonError> {
        self.core().await?.read_at(offset, len).await
    }

    /// As [`File::read_at`], whatever the File was opened for (write-only too): the
    /// contents as its uncommitted writes make them, for another reader of the same client
    /// that must see them (the mount's other handles of the file).
    pub(crate) async fn read_as_written(
        &mut self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, TalonError> {
        self.core().await?.read_held(offset, len).await
    }

    /// Writes `data` at `offset`, extending the file (with zeros in any gap) if needed.
    /// Not visible to others until the next commit.
    pub async fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), TalonError> {
        self.drop_rbuf();
        self.core().await?.write_at(offset, data).await
    }

    /// Shrinks or extends the file to `size` bytes (extension reads as zeros).
    pub async fn set_len(&mut self, size: u64) -> Result<(), TalonError> {
        self.drop_rbuf();
        self.core().await?.set_len(size).await
    }

    /// Commits this File's changes: they become the file's contents, durably and for every
    /// later open, atomically. Does nothing when there is nothing to commit.
    pub async fn flush(&mut self) -> Result<(), TalonError> {
        self.core().await?.commit().await
    }

    /// Same as [`File::flush`]: a commit is durable (replicated) when it returns.
    pub async fn sync_all(&mut self) -> Result<(), TalonError> {
        self.flush().await
    }

    /// Commits and closes the file.
    pub async fn close(mut self) -> Result<(), TalonError> {
        self.flush().await
    }

    /// Holds the file for this File now and waits until it is held, for a caller about to
    /// remove the file's last name (unlink, or a rename over it) while it keeps the File
    /// open. The File holds it anyway from a quarter of the servers' shorter grace after its
    /// open (`open_session`), before a node reclaims the file (after half the unlinked grace
    /// at the soonest, while its disk is nearly full), unless that session is slow to start:
    /// this one is held before the name goes. A File that only reads a small file holds its
    /// body and needs nothing.
    pub async fn hold_now(&mut self) -> Result<(), TalonError> {
        match &mut self.core().await?.session {
            Some(s) => s.hold_now().await,
            None => Ok(()),
        }
    }

    /// Makes the next commit of this File's changes clear the file's set-user-ID bit, and
    /// its set-group-ID bit if it is group-executable, in the same step as the new contents
    /// (never a moment with both): for a writer that may not keep them, as the kernel
    /// decides for a mount's caller without `CAP_FSETID`. The servers remove a file's
    /// `security.capability` at every change of its contents anyway.
    pub async fn drop_setid(&mut self) -> Result<(), TalonError> {
        self.core().await?.drop_setid = true;
        Ok(())
    }

    /// The attributes as this File sees them (its size includes uncommitted writes).
    pub async fn metadata(&mut self) -> Result<Attr, TalonError> {
        Ok(self.core().await?.metadata())
    }

    /// The size as this File sees it (uncommitted writes included).
    pub async fn len(&mut self) -> Result<u64, TalonError> {
        Ok(self.core().await?.size)
    }

    /// True when the file is empty.
    pub async fn is_empty(&mut self) -> Result<bool, TalonError> {
        Ok(self.len().await? == 0)
    }

    /// Whether this File has changes not yet committed.
    pub fn is_dirty(&self) -> bool {
        self.op.is_some() || self.core.as_ref().is_some_and(|c| c.changed)
    }

    fn start(&mut self, f: impl FnOnce(Box<Core>) -> Op) -> Result<(), TalonError> {
        let core = self
            .core
            .take()
            .ok_or_else(|| TalonError::Invalid("file has no state".into()))?;
        self.op = Some(f(core));
        Ok(())
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("File");
        if let Some(c) = &self.core {
            d.field("file", &c.what).field("size", &c.size);
        }
        d.field("pos", &self.pos)
            .field("dirty", &self.is_dirty())
            .finish()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.is_dirty() {
            let what = self.core.as_ref().map_or(String::new(), |c| c.what.clone());
            tracing::warn!(file = %what, "file dropped with uncommitted changes; they are lost");
        }
    }
}

impl AsyncRead for File {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            let avail = this.rbuf.len() - this.rbuf_used;
            if avail > 0 && this.rbuf_at + this.rbuf_used as u64 == this.pos {
                let n = avail.min(buf.remaining());
                buf.put_slice(&this.rbuf[this.rbuf_used..this.rbuf_used + n]);
                this.rbuf_used += n;
                this.pos += n as u64;
                return Poll::Ready(Ok(()));
            }
            if let Some(op) = this.op.as_mut() {
                let (core, outcome) = ready!(op.as_mut().poll(cx));
                this.op = None;
                this.core = Some(core);
                match outcome {
                    Outcome::Read(at, r) => {
                        let data = r.map_err(io_err)?;
                        if data.is_empty() && at == this.pos {
                            return Poll::Ready(Ok(()));
                        }
                        this.set_rbuf(at, data);
                    }
                    Outcome::Write(r) | Outcome::Flush(r) => r.map_err(io_err)?,
                }
                continue;
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let at = this.pos;
            let chunk = match this.core.as_ref().map(|c| &c.body) {
                Some(Body::Chunked(c)) => c.chunk_size,
                _ => u64::MAX,
            };
            // Up to the end of the current chunk: one RPC per chunk for sequential reads.
            let window = (chunk - at % chunk)
                .min(8 << 20)
                .max(buf.remaining() as u64);
            this.start(|mut core| {
                Box::pin(async move {
                    let r = core.read_at(at, window).await;
                    (core, Outcome::Read(at, r))
                })
            })
            .map_err(io_err)?;
        }
    }
}

impl AsyncWrite for File {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_idle(cx)).map_err(io_err)?;
        this.drop_rbuf();
        let Some(core) = this.core.as_ref() else {
            return Poll::Ready(Err(io_err(TalonError::Invalid("file has no state".into()))));
        };
        let at = if core.opts.append {
            core.size
        } else {
            this.pos
        };
        let data = buf.to_vec();
        let n = data.len();
        this.start(|mut core| {
            Box::pin(async move {
                let r = core.write_at(at, &data).await;
                (core, Outcome::Write(r))
            })
        })
        .map_err(io_err)?;
        this.pos = at + n as u64;
        // Most writes only touch memory and finish in this first poll; the others go on
        // in the background and report a failure at the next operation.
        if let Poll::Ready(r) = this.poll_idle(cx) {
            r.map_err(io_err)?;
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if let Some(op) = this.op.as_mut() {
                let (core, outcome) = ready!(op.as_mut().poll(cx));
                this.op = None;
                this.core = Some(core);
                match outcome {
                    Outcome::Flush(r) => return Poll::Ready(r.map_err(io_err)),
                    Outcome::Write(r) => r.map_err(io_err)?,
                    Outcome::Read(..) => {}
                }
            }
            this.start(|mut core| {
                Box::pin(async move {
                    let r = core.commit().await;
                    (core, Outcome::Flush(r))
                })
            })
            .map_err(io_err)?;
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl AsyncSeek for File {
    fn start_seek(mut self: Pin<&mut Self>, to: io::SeekFrom) -> io::Result<()> {
        let this = &mut *self;
        let Some(core) = this.core.as_ref() else {
            return Err(io::Error::other(
                "another file operation is running; call poll_complete first",
            ));
        };
        let target = match to {
            io::SeekFrom::Start(n) => Some(n),
            io::SeekFrom::End(d) => core.size.checked_add_signed(d),
            io::SeekFrom::Current(d) => this.pos.checked_add_signed(d),
        };
        this.pos = target.ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "seek to a negative position")
        })?;
        Ok(())
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let this = &mut *self;
        ready!(this.poll_idle(cx)).map_err(io_err)?;
        Poll::Ready(Ok(this.pos))
    }
}

impl Client {
    /// Opens the regular file at `path` (a final symlink is followed) as `opts` says.
    pub async fn open(
        &self,
        path: impl AsRef<[u8]>,
        opts: OpenOptions,
    ) -> Result<File, TalonError> {
        let comps = path::components(path.as_ref())?;
        let what = path::display(&comps);
        check_opts(&opts)?;
        let opened = if opts.create {
            let spec = CreateSpec {
                exclusive: opts.exclusive,
                ..CreateSpec::file(opts.perm)
            };
            let created = match self.create_comps(&comps, spec, Errno::EISDIR, "open").await {
                // A symlink (or other non-file) of that name: open what it names.
                Err(e) if e.errno() == Errno::EEXIST && !opts.exclusive => None,
                r => Some(r?),
            };
            match created {
                Some(attr) if attr.kind != FileKind::Regular => {
                    return Err(TalonError::posix(
                        Errno::EISDIR,
                        format!("{what} is not a regular file"),
                    ))
                }
                // New, or existing and about to be emptied: no need to read the contents.
                Some(attr) if attr.size == 0 || opts.truncate => Opened {
                    attr,
                    layout: Layout::Small,
                    body: None,
                },
                Some(attr) => self.rpc_open(attr.ino, true, ReadKind::StrictRead).await?,
                None => self.open_path(&comps, true).await?,
            }
        } else {
            self.open_path(&comps, opts.write).await?
        };
        self.finish_open(opened, what, opts).await
    }

    /// Opens the regular file `attr` that a create of this client has just answered, as
    /// `opts` says (`create` and `exclusive` do not apply). An empty file has nothing to
    /// fetch, so it opens without a round trip, as [`Client::open`] does after its own
    /// create; a non-empty one (a create without `exclusive` found it) is opened as
    /// [`Client::open_ino`] opens it.
    pub async fn open_created(&self, attr: Attr, opts: OpenOptions) -> Result<File, TalonError> {
        check_opts(&opts)?;
        if attr.kind != FileKind::Regular {
            return Err(TalonError::posix(
                Errno::EISDIR,
                format!("inode {} is not a regular file", attr.ino),
            ));
        }
        if attr.size > 0 {
            return self.open_ino(attr.ino, opts).await;
        }
        let what = format!("inode {}", attr.ino);
        let opened = Opened {
            attr,
            layout: Layout::Small,
            body: None,
        };
        self.finish_open(opened, what, opts).await
    }

    /// Opens regular file `ino` as `opts` says (`create` and `exclusive` do not apply).
    pub async fn open_ino(&self, ino: Ino, opts: OpenOptions) -> Result<File, TalonError> {
        check_opts(&opts)?;
        let opened = self
            .rpc_open(ino, !opts.truncate, ReadKind::StrictRead)
            .await?;
        self.open_ino_from(ino, opened, opts).await
    }

    /// As [`Client::open_ino`], for a file the caller knows to be in a relaxed directory: an
    /// open that only reads is served by any replica, within the staleness bound (this
    /// client's own changes show at once); one that writes opens at the leader, as there.
    pub async fn open_ino_relaxed(&self, ino: Ino, opts: OpenOptions) -> Result<File, TalonError> {
        if opts.write || opts.truncate {
            return self.open_ino(ino, opts).await;
        }
        check_opts(&opts)?;
        let opened =
            Client::absence_confirmed(self.rpc_open(ino, true, ReadKind::RelaxedRead), || {
                self.rpc_open(ino, true, ReadKind::StrictRead)
            })
            .await?;
        self.open_ino_from(ino, opened, opts).await
    }

    async fn open_ino_from(
        &self,
        ino: Ino,
        opened: Opened,
        opts: OpenOptions,
    ) -> Result<File, TalonError> {
        if opened.attr.kind != FileKind::Regular {
            return Err(TalonError::posix(
                Errno::EISDIR,
                format!("inode {ino} is not a regular file"),
            ));
        }
        self.finish_open(opened, format!("inode {ino}"), opts).await
    }

    async fn finish_open(
        &self,
        opened: Opened,
        what: String,
        opts: OpenOptions,
    ) -> Result<File, TalonError> {
        let mut core = Core::new(self.clone(), opened, what, opts);
        // A file whose last name is gone (opened by inode in its grace) is held at once,
        // not a quarter of the grace from now: its grace may be over sooner (a nearly full
        // node halves it). If it is gone already, the open fails.
        if core.attr.nlink == 0 {
            if let Some(s) = &mut core.session {
                s.hold_now().await?;
            }
        }
        if opts.truncate && core.size > 0 {
            core.set_len(0).await?;
        }
        let mut f = File::new(core);
        if opts.append {
            f.pos = f.len().await?;
        }
        Ok(f)
    }

    /// Sets the size of regular file `ino` to `size` (truncate or extend with zeros), as a
    /// commit through a [`File`]: for a chunked file only the layout changes.
    pub async fn truncate(&self, ino: Ino, size: u64) -> Result<Attr, TalonError> {
        self.truncate_as(ino, size, false).await
    }

    /// As [`Client::truncate`], clearing the file's set-ID bits with it if `drop_setid`
    /// (see [`File::drop_setid`]).
    pub(crate) async fn truncate_as(
        &self,
        ino: Ino,
        size: u64,
        drop_setid: bool,
    ) -> Result<Attr, TalonError> {
        let opts = OpenOptions::read_write();
        let mut f = self.open_ino(ino, opts).await?;
        f.set_len(size).await?;
        if drop_setid {
            f.drop_setid().await?;
        }
        f.flush().await?;
        f.metadata().await
    }
}

fn check_opts(opts: &OpenOptions) -> Result<(), TalonError> {
    if !opts.read && !opts.write {
        return Err(TalonError::posix(
            Errno::EINVAL,
            "open for neither reading nor writing",
        ));
    }
    if (opts.truncate || opts.append) && !opts.write {
        return Err(TalonError::posix(
            Errno::EINVAL,
            "truncate or append without write access",
        ));
    }
    Ok(())
}
