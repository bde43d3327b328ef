//! File contents: the client side of the data RPCs (`ReadWhole`, `Open`, `WriteSmall`,
//! `PutChunk`, `GetChunk`, `CommitLayout`) and the whole-file operations built on them,
//! [`Client::read_file`] and [`Client::write_file`].
//!
//! A regular file is SMALL (its whole body is one record on its home partition) or CHUNKED
//! (fixed-size chunks, chunk `i` on `chunk_partition(ino, i, P)`). The contents change only
//! when a `WriteSmall` or `CommitLayout` is applied, so a reader sees the old file or the new
//! one, never a mix; chunks are stored first, each under a fresh `write_id` of the writer's
//! open session (`open_session`), and are invisible until the layout naming them commits.
//!
//! - Reading a small file by path is one RPC on a warm path cache: `ReadWhole` to the
//!   entry's partition answers with the body. A chunked file's `ReadWhole` answers with the
//!   layout; its chunks are then fetched in parallel (at most [`READ_CONCURRENCY`] at once).
//! - Whole-file writes create the file if needed (not exclusively) and replace its
//!   contents: one `WriteSmall` up to the cluster's `small_file_max`, otherwise the chunks
//!   in parallel (at most [`WRITE_CONCURRENCY`] in flight) and then one `CommitLayout`.
//! - Chunks never change once stored, so `GetChunk` is first asked of any replica; a replica
//!   that lags and does not have the chunk yet (or reports a bad checksum) is followed by
//!   one more attempt at the leader.
//! - A checksum mismatch is answered with EIO by the server; the client returns EIO with a
//!   message naming the file and logs it, and never returns the bad bytes.
//!
//! Writes carry `expect_generation = 0`: the last writer to commit wins, as with POSIX
//! tools on a local file system (see `file` for what that means for concurrent writers).

use crate::client::{read_kind, Client};
use crate::open_session::OpenSession;
use crate::path::{self, Components};
use crate::paths::split_last;
use crate::router::ReadKind;
use crate::settle::Scope;
use crate::wire::replies;
use crate::wire::requests::{self, Header};
use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use talon_model::placement::{chunk_partition, entry_partition};
use talon_model::{Attr, ChunkRef, Errno, FileKind, Ino, Layout, TalonError};

/// Chunk reads in flight at once for one read.
pub const READ_CONCURRENCY: usize = 8;

/// Chunk writes in flight at once for one whole-file write.
pub const WRITE_CONCURRENCY: usize = 8;

/// Largest gRPC message the data calls send or accept: a whole chunk plus its envelope.
pub(crate) const MAX_MESSAGE: usize = 80 << 20;

/// The `expect_generation` of every write here: no check, the last writer to commit wins.
const ANY_GENERATION: u64 = 0;

/// Symlinks followed while opening one path before ELOOP (as in path resolution).
const MAX_SYMLINK_HOPS: u32 = 40;

/// What `Open` / `ReadWhole` answered: attributes, layout, and a small file's body.
#[derive(Clone, Debug)]
pub(crate) struct Opened {
    pub(crate) attr: Attr,
    pub(crate) layout: Layout,
    /// Present for a small file when the body was asked for.
    pub(crate) body: Option<Vec<u8>>,
}

/// The error for file `what` whose data could not be read: EIO names the file.
pub(crate) fn data_error(what: &str, e: TalonError) -> TalonError {
    match e {
        TalonError::Posix {
            errno: Errno::EIO,
            message,
        } => {
            tracing::error!(file = what, "data read failed: {message}");
            TalonError::posix(Errno::EIO, format!("{what}: {message}"))
        }
        e => e,
    }
}

/// Splits `[offset, offset + len)` into per-chunk pieces: (chunk index, offset in the
/// chunk, length, offset in the output).
pub(crate) fn pieces(offset: u64, len: u64, chunk_size: u64) -> Vec<(u32, u64, u64, u64)> {
    let mut out = Vec::new();
    let mut pos = offset;
    let end = offset + len;
    while pos < end {
        let index = pos / chunk_size;
        let in_chunk = pos % chunk_size;
        let n = (chunk_size - in_chunk).min(end - pos);
        out.push((index as u32, in_chunk, n, pos - offset));
        pos += n;
    }
    out
}

impl Client {
    /// The cluster's small-file threshold and chunk size.
    pub(crate) fn data_limits(&self) -> (u64, u64) {
        let m = self.cluster_map();
        (m.small_file_max as u64, m.chunk_size.max(1) as u64)
    }

    // ----- raw data RPCs -----

    /// `ReadWhole` of entry `name` in `dir` (of class `class`).
    pub(crate) async fn rpc_read_whole(
        &self,
        dir: Ino,
        class: talon_model::Class,
        name: &[u8],
        read: ReadKind,
        epoch: u64,
    ) -> Result<Opened, TalonError> {
        let p = entry_partition(dir, name, class, self.router().partitions());
        let read = self.read_for(p, read);
        let req = requests::read_whole(Header::new(p, read, epoch), dir, name);
        let reply = self
            .call(p, read, |c| {
                let req = req.clone();
                async move {
                    c.max_decoding_message_size(MAX_MESSAGE)
                        .read_whole(req)
                        .await
                }
            })
            .await?;
        let reply = replies::open(reply);
        self.cache().observe_epoch(reply.epoch);
        let opened = reply.value?;
        self.cache()
            .insert_dentry(dir, class, name, &opened.attr, epoch.max(self.epoch()));
        Ok(opened)
    }

    /// `Open` of `ino` at its home partition.
    pub(crate) async fn rpc_open(
        &self,
        ino: Ino,
        want_body: bool,
        read: ReadKind,
    ) -> Result<Opened, TalonError> {
        let p = ino.home();
        let read = self.read_for(p, read);
        let reply = self
            .settle(Scope::Inode, |epoch| {
                let req = requests::open(Header::new(p, read, epoch), ino, want_body);
                self.call(p, read, move |c| async move {
                    c.max_decoding_message_size(MAX_MESSAGE).open(req).await
                })
            })
            .await?;
        replies::open(reply).value
    }

    /// `WriteSmall`: `body` becomes the whole contents of `ino`; its set-ID bits are
    /// cleared with it if `drop_setid` (see [`crate::File::drop_setid`]).
    pub(crate) async fn rpc_write_small(
        &self,
        ino: Ino,
        body: Bytes,
        drop_setid: bool,
    ) -> Result<Attr, TalonError> {
        let p = ino.home();
        let reply = self
            .settle(Scope::Inode, |epoch| {
                let req = requests::write_small(
                    Header::new(p, ReadKind::Write, epoch),
                    ino,
                    body.clone(),
                    ANY_GENERATION,
                    drop_setid,
                );
                self.call(p, ReadKind::Write, move |c| {
                    let req = req.clone();
                    async move {
                        c.max_encoding_message_size(MAX_MESSAGE)
                            .write_small(req)
                            .await
                    }
                })
            })
            .await?;
        let attr = replies::attr(reply)?;
        self.cache().note_attr(&attr);
        Ok(attr)
    }

    /// `PutChunk`: stores chunk `index` of `ino` under `write_id` (invisible until a layout
    /// names it).
    pub(crate) async fn rpc_put_chunk(
        &self,
        ino: Ino,
        write_id: u64,
        index: u32,
        data: Bytes,
    ) -> Result<(), TalonError> {
        let p = chunk_partition(ino, index, self.router().partitions());
        let req = requests::put_chunk(
            Header::new(p, ReadKind::Write, 0),
            ino,
            write_id,
            index,
            data,
        );
        self.call(p, ReadKind::Write, |c| {
            let req = req.clone();
            async move {
                c.max_encoding_message_size(MAX_MESSAGE)
                    .put_chunk(req)
                    .await
            }
        })
        .await?;
        Ok(())
    }

    /// `GetChunk` of `length` bytes at `offset` of chunk `index`, padded with zeros to
    /// `length` (the stored chunk may end first). Any replica first, then the leader.
    pub(crate) async fn rpc_get_chunk(
        &self,
        ino: Ino,
        write_id: u64,
        index: u32,
        offset: u32,
        length: u32,
    ) -> Result<Vec<u8>, TalonError> {
        let p = chunk_partition(ino, index, self.router().partitions());
        let ask = |read: ReadKind| {
            let req = requests::get_chunk(
                Header::new(p, read, 0),
                ino,
                write_id,
                index,
                offset,
                length,
            );
            self.call(p, read, move |c| async move {
                c.max_decoding_message_size(MAX_MESSAGE)
                    .get_chunk(req)
                    .await
            })
        };
        let reply = match ask(self.read_for(p, ReadKind::RelaxedRead)).await {
            Err(TalonError::Posix { errno, .. })
                if errno == Errno::ENOENT || errno == Errno::EIO =>
            {
                ask(ReadKind::StrictRead).await?
            }
            r => r?,
        };
        let mut data = replies::get_chunk(reply);
        if data.len() > length as usize {
            return Err(TalonError::Invalid(format!(
                "chunk {index} of inode {ino}: {} bytes for a read of {length}",
                data.len()
            )));
        }
        data.resize(length as usize, 0);
        Ok(data)
    }

    /// `CommitLayout`: the chunks named become the contents of `ino`, `size` bytes long; with
    /// an `open_session` (nonzero), only while that session is held. `view` is the
    /// generation of the layout the chunks' list started from (`u64::MAX` when every chunk
    /// was stored for this commit). `drop_setid` as in [`Client::rpc_write_small`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rpc_commit_layout(
        &self,
        ino: Ino,
        size: u64,
        chunk_size: u32,
        chunks: &[ChunkRef],
        open_session: u64,
        view: u64,
        drop_setid: bool,
    ) -> Result<Attr, TalonError> {
        let p = ino.home();
        let reply = self
            .settle(Scope::Inode, |epoch| {
                let req = requests::commit_layout(
                    Header::new(p, ReadKind::Write, epoch),
                    ino,
                    size,
                    chunk_size,
                    chunks,
                    ANY_GENERATION,
                    open_session,
                    view,
                    drop_setid,
                );
                self.call(p, ReadKind::Write, move |mut c| {
                    let req = req.clone();
                    async move { c.commit_layout(req).await }
                })
            })
            .await?;
        let attr = replies::attr(reply)?;
        self.cache().note_attr(&attr);
        Ok(attr)
    }

    /// `HoldOpen`: starts (`renew` false), renews or ends (`end`) open session `session`
    /// of `ino` at its home; answers within how many ms to renew it.
    pub(crate) async fn rpc_hold_open(
        &self,
        ino: Ino,
        session: u64,
        renew: bool,
        end: bool,
    ) -> Result<u64, TalonError> {
        let p = ino.home();
        let req = requests::hold_open(Header::new(p, ReadKind::Write, 0), ino, session, renew, end);
        let reply = self
            .call(p, ReadKind::Write, move |mut c| async move {
                c.hold_open(req).await
            })
            .await?;
        Ok(reply.lease_ms)
    }

    // ----- building blocks -----

    /// Bytes `[offset, offset + len)` of a chunked file of `size` bytes with `chunks` of
    /// `chunk_size`, holes and short chunks as zeros; chunks fetched in parallel.
    pub(crate) async fn read_chunks(
        &self,
        ino: Ino,
        size: u64,
        chunk_size: u64,
        chunks: &[ChunkRef],
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, TalonError> {
        let end = (offset.saturating_add(len)).min(size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let fetches = pieces(offset, end - offset, chunk_size)
            .into_iter()
            .filter_map(|(index, in_chunk, n, at)| {
                let c = chunks.get(index as usize).copied().unwrap_or_default();
                let valid = (c.len as u64).saturating_sub(in_chunk).min(n);
                (!c.is_hole() && valid > 0).then_some((index, c.write_id, in_chunk, valid, at))
            });
        let mut results = stream::iter(fetches)
            .map(|(index, write_id, in_chunk, n, at)| async move {
                let data = self
                    .rpc_get_chunk(ino, write_id, index, in_chunk as u32, n as u32)
                    .await?;
                Ok::<_, TalonError>((at, data))
            })
            .buffer_unordered(READ_CONCURRENCY);
        while let Some((at, data)) = results.try_next().await? {
            let at = at as usize;
            out[at..at + data.len()].copy_from_slice(&data);
        }
        Ok(out)
    }

    /// The whole contents described by `opened`.
    async fn contents(&self, opened: Opened, what: &str) -> Result<Vec<u8>, TalonError> {
        let attr = &opened.attr;
        match (&opened.layout, opened.body) {
            (Layout::Small, Some(body)) => Ok(body),
            (Layout::Small, None) if attr.size == 0 => Ok(Vec::new()),
            (Layout::Small, None) => {
                // The answering partition did not hold the body (the entry was renamed away
                // from the inode's home): ask the home partition.
                let again = self.rpc_open(attr.ino, true, ReadKind::StrictRead).await?;
                match again.body {
                    Some(b) if again.layout == Layout::Small => Ok(b),
                    _ => Box::pin(self.contents(again, what)).await,
                }
            }
            (Layout::Chunked { chunk_size, chunks }, _) => {
                self.read_chunks(
                    attr.ino,
                    attr.size,
                    *chunk_size as u64,
                    chunks,
                    0,
                    attr.size,
                )
                .await
            }
        }
        .map_err(|e| data_error(what, e))
    }

    /// Opens the regular file at `comps` (following symlinks), with its body if small.
    /// `leader` asks the partition leader even in a relaxed directory.
    pub(crate) async fn open_path(
        &self,
        comps: &Components,
        leader: bool,
    ) -> Result<Opened, TalonError> {
        let mut comps = comps.clone();
        let mut hops = 0;
        loop {
            let (name, parent) = split_last(&comps, Errno::EISDIR, "open")?;
            let (name_ref, parent_ref) = (&name, &parent);
            let opened = self
                .settle(Scope::Path, |epoch| async move {
                    let dir = self.resolve_dir(parent_ref, epoch).await?;
                    let read = if leader {
                        ReadKind::StrictRead
                    } else {
                        read_kind(dir.class)
                    };
                    self.rpc_read_whole(dir.ino, dir.class, name_ref, read, epoch)
                        .await
                })
                .await?;
            match opened.attr.kind {
                FileKind::Regular => return Ok(opened),
                FileKind::Directory => {
                    return Err(TalonError::posix(
                        Errno::EISDIR,
                        format!("{} is a directory", path::display(&comps)),
                    ))
                }
                FileKind::Symlink => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(TalonError::posix(
                            Errno::ELOOP,
                            format!("too many symlinks opening {}", path::display(&comps)),
                        ));
                    }
                    let target = self.readlink(opened.attr.ino).await?;
                    comps = path::resolve_link(&parent, &target)?;
                }
                _ => {
                    return Err(TalonError::posix(
                        Errno::EINVAL,
                        format!("{} is not a regular file", path::display(&comps)),
                    ))
                }
            }
        }
    }

    // ----- public whole-file API -----

    /// The whole contents of the regular file at `path` (a final symlink is followed). On a
    /// warm path cache a small file costs one RPC; a chunked one that RPC plus its chunks,
    /// fetched in parallel. Relaxed paths may be answered by any replica within the
    /// staleness bound (this client always sees its own writes).
    pub async fn read_file(&self, path: impl AsRef<[u8]>) -> Result<Vec<u8>, TalonError> {
        let comps = path::components(path.as_ref())?;
        let opened = self.open_path(&comps, false).await?;
        self.contents(opened, &path::display(&comps)).await
    }

    /// The whole contents of regular file `ino`, read from its home partition's leader.
    pub async fn read_file_ino(&self, ino: Ino) -> Result<Vec<u8>, TalonError> {
        let opened = self.rpc_open(ino, true, ReadKind::StrictRead).await?;
        if opened.attr.kind != FileKind::Regular {
            return Err(TalonError::posix(
                Errno::EISDIR,
                format!("inode {ino} is not a regular file"),
            ));
        }
        self.contents(opened, &format!("inode {ino}")).await
    }

    /// Makes `data` the contents of the regular file at `path`, creating it (mode 0644) if
    /// missing. The new contents replace the old ones atomically: a reader sees one or the
    /// other. Returns the file's new attributes.
    pub async fn write_file(
        &self,
        path: impl AsRef<[u8]>,
        data: &[u8],
    ) -> Result<Attr, TalonError> {
        let attr = self.create_file(path.as_ref(), 0o644).await?;
        if attr.kind != FileKind::Regular {
            return Err(TalonError::posix(
                Errno::EISDIR,
                "not a regular file".to_string(),
            ));
        }
        self.write_file_ino(attr.ino, data).await
    }

    /// Makes `data` the whole contents of regular file `ino` (see [`Client::write_file`]).
    pub async fn write_file_ino(&self, ino: Ino, data: &[u8]) -> Result<Attr, TalonError> {
        let (small_max, chunk_size) = self.data_limits();
        if data.len() as u64 <= small_max {
            return self
                .rpc_write_small(ino, Bytes::copy_from_slice(data), false)
                .await;
        }
        let cs = chunk_size as usize;
        // The chunks are held by an open session until the commit names them, however long
        // storing them takes; it ends when dropped here.
        let mut session = OpenSession::start(self, ino);
        let ids = (0..data.len().div_ceil(cs))
            .map(|_| session.write_id())
            .collect::<Result<Vec<u64>, TalonError>>()?;
        // Indices, not borrowed slices, go through the stream: a closure taking a borrowed
        // argument makes the future unusable with `tokio::spawn` (higher-ranked lifetime).
        let refs: Vec<ChunkRef> = stream::iter(0..ids.len())
            .map(|i| {
                let part = &data[i * cs..((i + 1) * cs).min(data.len())];
                let write_id = ids[i];
                async move {
                    self.rpc_put_chunk(ino, write_id, i as u32, Bytes::copy_from_slice(part))
                        .await?;
                    Ok::<_, TalonError>(ChunkRef {
                        write_id,
                        len: part.len() as u32,
                    })
                }
            })
            .buffered(WRITE_CONCURRENCY)
            .try_collect()
            .await?;
        let held = session.held().await?;
        // Every chunk named was stored above: no view of an older layout to check.
        let view = u64::MAX;
        let size = data.len() as u64;
        self.rpc_commit_layout(ino, size, chunk_size as u32, &refs, held, view, false)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_range_chunk_by_chunk() {
        assert_eq!(
            pieces(0, 10, 4),
            vec![(0, 0, 4, 0), (1, 0, 4, 4), (2, 0, 2, 8)]
        );
        assert_eq!(pieces(5, 4, 4), vec![(1, 1, 3, 0), (2, 0, 1, 3)]);
        assert!(pieces(7, 0, 4).is_empty());
    }
}
