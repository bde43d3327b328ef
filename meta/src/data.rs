//! File contents on the server: small bodies in the packed store, chunks of large files,
//! layout commits, checksum verification, and reclaiming garbage.
//!
//! - A small file's body is one `BodyRec` (key `B` ‖ ino) on the inode's home partition.
//!   The state machine's RocksDB keeps values of 4 KiB and more in its integrated BlobDB
//!   blob files: large append-only segment files, so a JPEG is one index lookup plus one
//!   positioned read, with no per-file object or OS inode. Bodies travel inside the Raft
//!   entry that writes them, so every replica holds the same bytes.
//! - A chunk lives on `chunk_partition(ino, index)`, in blocks of `keys::CHUNK_BLOCK` bytes
//!   (`K` ‖ ino ‖ write id ‖ index ‖ block), so a read of a range reads only the blocks it
//!   covers (format 2 stored it whole under `K` ‖ ino ‖ write id ‖ index; such chunks are
//!   still read, whole). It is invisible until a `CommitLayout` on the home partition
//!   names it. A file reclaimed
//!   after its unlinked grace takes its chunks with it, and chunks a commit took out of a
//!   live file's layout go after that grace too once no open session holds the file
//!   (`Files::collect_dropped`); other chunks that no layout names
//!   and that are older than `chunk_gc_grace_ms` are dropped by the leader's garbage
//!   collector (writers that died, overwritten generations), once the leader has also
//!   seen them so for that grace on its own monotonic clock, so that no clock's jump
//!   shortens it. A client that keeps a file open (a writer, or a reader of a chunked
//!   file) for longer than a quarter of the shorter grace holds an open session on the
//!   file's home (`H` ‖ ino ‖ session, renewed within the chunk grace; see
//!   `Files::hold_open`): chunks whose write id carries a held session stay, an unlinked
//!   file with a held session is not reclaimed (it lives until its last holder closes it,
//!   as POSIX keeps an unlinked open file), and a commit by a writer whose session expired
//!   is refused (EIO) rather than naming chunks that may be gone.
//! - Every body and chunk block carries a CRC32C computed at apply; a read that finds a
//!   mismatch answers EIO and logs the inode, never returns the bytes.
//! - Deleted values are reclaimed by compaction, which a background task runs on a
//!   partition once enough bodies or chunks were deleted; BlobDB's garbage collection
//!   relocates live blobs during compaction. Neither blocks reads or writes.
//!
//! Its operations and collection rounds are methods of [`Files`], a view of a [`Node`]
//! borrowed for one call (`Files::new(&node).read_whole(..)`), so a call names the file
//! that defines it. Built on the namespace's guards and lookup ([`Namespace`]); neither it
//! nor the node reaches here.

use crate::keys;
use crate::namespace::Namespace;
use crate::node::{Node, PeerReply, PeerRequest};
use crate::partition::Partition;
use crate::reads::{read_stored_unblocking, OpenFile};
use crate::records::{dec, storage_error, ChunkView, Fatal};
use crate::types::{Command, CommandResult, Op, Outcome};
use crate::view::{any_holds_at, holds_at, View};
use bytes::Bytes;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use talon_model::placement::chunk_partition;
use talon_model::{Attr, ChunkRef, Errno, Ino, Layout, TalonError};
use tokio_util::sync::CancellationToken;

/// How long a request record (`Op::RecordRequest`) is kept (ms): far longer than a client
/// keeps sending copies of one request (its operation deadline, 30 s by default).
pub const REQUEST_RECORD_MS: u64 = 5 * 60 * 1000;
/// Deleted bodies or chunks on a partition that trigger a compaction.
const COMPACT_AFTER_DELETES: u64 = 2_000;
/// The share of a partition's store that deleted chunks (counted at the chunk size, their
/// most) trigger a compaction at, however few they are: 2,000 chunks are 8 GiB at the
/// default size, which a partition reached only on a nearly full disk.
const COMPACT_AFTER_CHUNK_SHARE: u64 = 8;

/// Whether a partition's deletes since its last reclaiming compaction are worth one:
/// `COMPACT_AFTER_DELETES` bodies or chunks; chunks of at least `1 / COMPACT_AFTER_CHUNK_SHARE`
/// of the store's `store_bytes` and at least `chunk_floor` bytes; or any delete at all on a
/// nearly full disk (`short`). The floor is the log's own snapshot interval
/// (`snapshot_after_bytes`): every compaction ends in a snapshot, and one after each
/// replaced checkpoint of a few chunks per partition slowed the checkpoints' writes.
fn worth_compacting(
    deletes: u64,
    chunk_bytes: u64,
    store_bytes: u64,
    chunk_floor: u64,
    short: bool,
) -> bool {
    let chunks_due = (store_bytes / COMPACT_AFTER_CHUNK_SHARE)
        .max(chunk_floor)
        .max(1);
    deletes >= COMPACT_AFTER_DELETES || chunk_bytes >= chunks_due || (short && deletes > 0)
}

fn posix(errno: Errno, msg: impl Into<String>) -> TalonError {
    TalonError::posix(errno, msg)
}

/// The file contents on a node's partitions, and their garbage collection. A view of a
/// [`Node`] borrowed for a call: `Files::new(&node).read_whole(..)`.
#[derive(Clone, Copy, Debug)]
pub struct Files<'a> {
    node: &'a Node,
}

impl<'a> Files<'a> {
    /// The files served by `node`.
    pub fn new(node: &'a Node) -> Self {
        Files { node }
    }

    /// The namespace's guards and lookup these operations build on.
    fn ns(&self) -> Namespace<'a> {
        Namespace::new(self.node)
    }

    fn chunk_size(&self) -> u32 {
        self.node.config.cluster.chunk_size
    }

    /// How long a file whose last name went, or a chunk a commit took out of a layout, is
    /// kept before it is reclaimed: `unlinked_grace_ms`, or half of it while the data file
    /// system is nearly full, to give the room back sooner. Never less: a reader or writer
    /// that had the file open before the change holds it through its open session from a
    /// quarter of the grace after its open on (`Files::hold_open`), and a file opened after
    /// its last name went is held at its open; a reclaim before that would take what it
    /// is reading from under it.
    fn reclaim_grace(&self) -> u64 {
        let grace = self.node.config.cluster.unlinked_grace_ms;
        if self.nearly_full() {
            grace / 2
        } else {
            grace
        }
    }

    /// Whether this node's data file system is past `space.nearfull_ratio`.
    fn nearly_full(&self) -> bool {
        self.node.space.level() >= crate::space::Level::NearFull
    }

    /// Records of one kind a collection round reads per partition.
    fn scan_limit(&self) -> usize {
        self.node.config.storage.gc_scan_records as usize
    }

    /// A file's attributes, layout and (small) body, from its home partition.
    pub async fn open_file(
        &self,
        p: u32,
        relaxed: bool,
        epoch: u64,
        ino: Ino,
        want_body: bool,
    ) -> Result<OpenFile, TalonError> {
        let part = self.node.home_part(p, ino)?;
        self.ns()
            .read_at_class_async(
                part,
                relaxed,
                epoch,
                || read_stored_unblocking(&part.store, ino, want_body),
                |f| f.as_ref().map(|f| f.attr.class),
            )
            .await?
            .ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))
    }

    /// Lookup plus contents: the entry's file with its body when small. One hop when the
    /// inode lives with its entry (the common case).
    pub async fn read_whole(
        &self,
        p: u32,
        relaxed: bool,
        epoch: u64,
        parent: Ino,
        name: &[u8],
    ) -> Result<(OpenFile, u64), TalonError> {
        let (attr, cur_epoch) = self.ns().lookup(p, relaxed, epoch, parent, name).await?;
        let ino = attr.ino;
        let file = if ino.home() == p {
            read_stored_unblocking(&self.node.local(p)?.store, ino, true).await?
        } else {
            match self
                .node
                .peer(ino.home(), PeerRequest::ReadFile(ino))
                .await?
            {
                PeerReply::File(f) => f,
                other => {
                    return Err(TalonError::Unavailable(format!(
                        "unexpected reply {other:?}"
                    )))
                }
            }
        };
        Ok((
            file.ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))?,
            cur_epoch,
        ))
    }

    /// Replaces a small file's contents, taking from it what a change of contents takes
    /// (`Op::DropPrivileges`; its set-ID bits only if `drop_setid`).
    pub async fn write_small(
        &self,
        p: u32,
        epoch: u64,
        ino: Ino,
        data: Bytes,
        expect_generation: u64,
        drop_setid: bool,
    ) -> Result<Attr, TalonError> {
        let part = self.node.home_part(p, ino)?;
        if data.len() > self.node.config.cluster.small_file_max as usize {
            return Err(TalonError::Invalid(format!(
                "body of {} bytes exceeds small_file_max {}",
                data.len(),
                self.node.config.cluster.small_file_max
            )));
        }
        let now = crate::clock::now();
        let ops = vec![
            Op::ExpectEpoch(epoch),
            Op::WriteBody {
                ino,
                data,
                expect_generation,
                now,
            },
            Op::DropPrivileges {
                ino,
                setid: drop_setid,
                now,
            },
        ];
        applied_attr(part.propose(Command::Atomic(ops)).await?, ino)
    }

    /// Stores one chunk on its partition.
    pub async fn put_chunk(
        &self,
        p: u32,
        ino: Ino,
        write_id: u64,
        index: u32,
        data: Bytes,
    ) -> Result<(), TalonError> {
        let want = chunk_partition(ino, index, self.node.config.cluster.partitions);
        if want != p {
            return Err(TalonError::WrongPartition(format!(
                "chunk {index} of {ino} lives on partition {want}"
            )));
        }
        if write_id == 0 {
            return Err(TalonError::Invalid(
                "write_id 0 is reserved for holes".into(),
            ));
        }
        if data.len() > self.chunk_size() as usize {
            return Err(TalonError::Invalid(format!(
                "chunk of {} bytes exceeds chunk_size {}",
                data.len(),
                self.chunk_size()
            )));
        }
        let part = self.node.local(p)?;
        let ops = vec![Op::PutChunk {
            ino,
            write_id,
            index,
            data,
            at_ms: crate::clock::now().as_millis(),
        }];
        applied(part.propose(Command::Atomic(ops)).await?).map(|_| ())
    }

    /// Reads `length` bytes at `offset` of a chunk, verifying the chunk's checksum.
    #[allow(clippy::too_many_arguments)]
    pub async fn get_chunk(
        &self,
        p: u32,
        relaxed: bool,
        ino: Ino,
        write_id: u64,
        index: u32,
        offset: u32,
        length: u32,
    ) -> Result<Vec<u8>, TalonError> {
        let want = chunk_partition(ino, index, self.node.config.cluster.partitions);
        if want != p {
            return Err(TalonError::WrongPartition(format!(
                "chunk {index} of {ino} lives on partition {want}"
            )));
        }
        let part = self.node.local(p)?;
        self.ns().read_guard(part, relaxed, 0).await?;
        // No chunk holds more: the request's length bounds no allocation beyond it.
        let length = length.min(crate::config::MAX_CHUNK_SIZE);
        let chunk = (ino, write_id, index);
        let mut got = read_pieces(part, chunk, offset, length).await?;
        if matches!(got, ChunkRead::Missing) && relaxed {
            // A lagging follower may not have it yet: ask as the leader.
            part.linearizable().await?;
            got = read_pieces(part, chunk, offset, length).await?;
        }
        match got {
            ChunkRead::Bytes(bytes) => Ok(bytes),
            ChunkRead::Missing => Err(posix(
                Errno::EIO,
                format!("chunk {index} of inode {ino} (write {write_id:x}) is missing"),
            )),
            ChunkRead::Undecodable(e) => {
                tracing::error!(ino = %ino, index, "undecodable chunk: {e}");
                Err(posix(
                    Errno::EIO,
                    format!("chunk {index} of inode {ino} is corrupt"),
                ))
            }
            ChunkRead::Mismatch => {
                tracing::error!(ino = %ino, index, partition = p, "checksum mismatch in chunk {index} of inode {ino}");
                Err(posix(
                    Errno::EIO,
                    format!("checksum mismatch in chunk {index} of inode {ino}"),
                ))
            }
        }
    }

    /// Starts (`renew` false), renews or ends (`end`) open session `session` of `ino` on its
    /// home partition `p`, and answers for how long (ms) it is held: the chunk collector's
    /// grace. Chunks whose write id carries a held session stay however old they grow, and
    /// so does the file once unlinked; a renewal of a session that expired is refused (EIO).
    /// A session takes no room worth waiting for (one small record), so none is asked for:
    /// a reader holds one too, and the writer's chunk stores wait for room themselves.
    pub async fn hold_open(
        &self,
        p: u32,
        ino: Ino,
        session: u64,
        renew: bool,
        end: bool,
    ) -> Result<u64, TalonError> {
        let part = self.node.home_part(p, ino)?;
        if session == 0 || session >> (64 - keys::SESSION_SHIFT) != 0 {
            return Err(TalonError::Invalid(format!(
                "open session {session:#x}: must be nonzero and below 2^40"
            )));
        }
        let op = if end {
            Op::EndOpens(vec![(ino, session)])
        } else {
            self.hold_op(ino, session, renew)
        };
        applied(part.propose(Command::Atomic(vec![op])).await?)?;
        Ok(self.node.config.cluster.chunk_gc_grace_ms)
    }

    /// The op that holds open session `session` of `ino` for the collector's grace from now.
    fn hold_op(&self, ino: Ino, session: u64, renew: bool) -> Op {
        let now_ms = crate::clock::now().as_millis();
        Op::HoldOpen {
            ino,
            session,
            renew,
            now_ms,
            until_ms: now_ms.saturating_add(self.node.config.cluster.chunk_gc_grace_ms),
        }
    }

    /// Makes a chunked layout the file's contents. A writer that holds open session
    /// `session` (nonzero) commits only while the session is held, and renews it. `view`
    /// is the generation of the layout the writer's chunks started from (see
    /// `Op::ExpectView`).
    /// What it takes from the file is as for [`Files::write_small`].
    #[allow(clippy::too_many_arguments)]
    pub async fn commit_layout(
        &self,
        p: u32,
        epoch: u64,
        ino: Ino,
        size: u64,
        layout: Layout,
        expect_generation: u64,
        session: u64,
        view: u64,
        drop_setid: bool,
    ) -> Result<Attr, TalonError> {
        let part = self.node.home_part(p, ino)?;
        let cs = self.chunk_size();
        layout.check(size)?;
        let Layout::Chunked { chunk_size, chunks } = layout else {
            return Err(TalonError::Invalid("a small layout to commit".into()));
        };
        if chunk_size != cs {
            return Err(TalonError::Invalid(format!(
                "chunk_size {chunk_size} differs from the cluster's {cs}"
            )));
        }
        if size > 1 << 50 {
            return Err(posix(Errno::EFBIG, "file larger than 1 PiB"));
        }
        let mut ops = vec![Op::ExpectEpoch(epoch)];
        if session != 0 {
            ops.push(self.hold_op(ino, session, true));
        }
        ops.push(Op::ExpectView {
            ino,
            generation: view,
        });
        let now = crate::clock::now();
        ops.push(Op::CommitLayout {
            ino,
            size,
            chunk_size,
            chunks,
            expect_generation,
            now,
        });
        ops.push(Op::DropPrivileges {
            ino,
            setid: drop_setid,
            now,
        });
        applied_attr(part.propose(Command::Atomic(ops)).await?, ino)
    }

    /// Logical file bytes homed on, and disk bytes used by, partition `p`.
    pub fn usage(&self, p: u32) -> Result<(u64, u64), TalonError> {
        let part = self.node.local(p)?;
        let bytes = part
            .store
            .read(|v| v.counter(keys::meta::BYTES))
            .map_err(storage_error)?;
        Ok((bytes, part.store.disk_bytes()))
    }

    /// One garbage-collection round over the chunks of partitions this node leads. A chunk
    /// goes once its wall-clock stamp is older than `chunk_gc_grace_ms` by this node's clock,
    /// no layout names it, and this node has found both true for `chunk_gc_grace_ms` more by
    /// its monotonic clock: the stamp is the writing leader's clock, and a jump of either
    /// clock must not take a chunk from a write still in progress. Unreferenced chunks
    /// thus go after about twice the grace.
    // The entry API cannot hold the map across the await that fetches a missing state.
    #[allow(clippy::map_entry)]
    pub async fn collect_chunks(&self) {
        let grace = self.node.config.cluster.chunk_gc_grace_ms;
        let now = crate::clock::now().as_millis();
        for (p, part) in &self.node.partitions {
            if part.leader() != Some(self.node.config.node_id) {
                self.node.chunks_due.forget(*p);
                continue;
            }
            // A page of the partition's chunks, after where the last round's stopped: a
            // partition can hold more chunks than a round reads, and committed chunks stay
            // listed, so starting at the first every round would never reach the rest.
            let after = self.node.chunks_due.resume_after(*p);
            let chunks = match part.store.chunks(after, self.scan_limit()) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(partition = p, "scan chunks: {e}");
                    continue;
                }
            };
            // The next page starts after this one, or at the first once this one reached
            // the end.
            let upto = if chunks.len() >= self.scan_limit() {
                chunks.last().map(|&(ino, w, i, _)| (ino, w, i))
            } else {
                None
            };
            self.node.chunks_due.set_resume(*p, upto);
            let on_page =
                |k: &(Ino, u64, u32)| after.is_none_or(|a| *k > a) && upto.is_none_or(|u| *k <= u);
            let mut states: BTreeMap<Ino, Holder> = BTreeMap::new();
            let mut garbage = Vec::new();
            for (ino, write_id, index, at_ms) in chunks {
                if now.saturating_sub(at_ms) < grace {
                    continue;
                }
                if !states.contains_key(&ino) {
                    let state = match self
                        .node
                        .peer(ino.home(), PeerRequest::ChunkHolder(ino))
                        .await
                    {
                        Ok(PeerReply::ChunkHolder(rec, holds)) => Holder::Known {
                            named: match rec.map(|r| r.layout) {
                                Some(Layout::Chunked { chunks, .. }) => chunks,
                                _ => Vec::new(),
                            },
                            held: holds
                                .into_iter()
                                .filter(|&(_, until)| holds_at(until, now))
                                .map(|(session, _)| session)
                                .collect(),
                        },
                        // Unknown: keep the chunk this round.
                        _ => Holder::Unknown,
                    };
                    states.insert(ino, state);
                }
                let live = match states.get(&ino) {
                    Some(Holder::Known { named, held }) => {
                        named
                            .get(index as usize)
                            .is_some_and(|c| c.write_id == write_id)
                            || held.contains(&(write_id >> keys::SESSION_SHIFT))
                    }
                    _ => true,
                };
                if !live {
                    garbage.push((ino, write_id, index));
                }
            }
            let garbage = self.node.chunks_due.confirmed_of(
                *p,
                garbage,
                Duration::from_millis(grace),
                on_page,
            );
            for batch in garbage.chunks(1000) {
                let n = batch.len();
                match part
                    .propose(Command::Atomic(vec![Op::DropChunks(batch.to_vec())]))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(partition = p, chunks = n, "reclaimed unreferenced chunks")
                    }
                    Err(e) => tracing::warn!(partition = p, "chunk collection deferred: {e}"),
                }
            }
        }
    }

    /// One round of reclaiming unlinked files on the partitions this node leads: those
    /// unlinked longer ago than their grace (`Files::reclaim_grace`: `unlinked_grace_ms`,
    /// half of it while the data file system is nearly full) by the unlinking leader's wall
    /// clock, and found unlinked by this node for that grace on its monotonic clock too, so
    /// that a wall clock that jumped forward (this one, or the unlinking leader's behind)
    /// cannot shorten the grace that a reader's session start relies on; unless an open
    /// session holds them (a reader or writer that still has the file open). Sessions on a
    /// reclaimed file that expired are ended in the same command. A reclaimed file's chunks
    /// go with it (see `Files::drop_chunks_of_gone`).
    pub async fn collect_unlinked(&self) {
        let grace = self.reclaim_grace();
        let now = crate::clock::now().as_millis();
        for (p, part) in &self.node.partitions {
            if part.leader() != Some(self.node.config.node_id) {
                self.node.unlinked_due.forget(*p);
                continue;
            }
            let unlinked = match part.store.unlinked(self.scan_limit()) {
                Ok(u) => u,
                Err(e) => {
                    tracing::error!(partition = p, "scan unlinked files: {e}");
                    continue;
                }
            };
            // Counted on the monotonic clock from the first round that finds the file (the
            // round after its unlink, in a steady cluster): at most a round later than by
            // the wall clock. A file past the scan's page is counted once it is in it.
            let seen: HashSet<Ino> = self
                .node
                .unlinked_due
                .confirmed(
                    *p,
                    unlinked.iter().map(|&(ino, _)| ino).collect(),
                    Duration::from_millis(grace),
                )
                .into_iter()
                .collect();
            let due: Vec<Ino> = unlinked
                .into_iter()
                .filter(|&(ino, at)| now.saturating_sub(at) >= grace && seen.contains(&ino))
                .map(|(ino, _)| ino)
                .collect();
            // (file, its expired sessions) of the files no session holds now.
            let unheld: Vec<(Ino, Vec<u64>)> = due
                .into_iter()
                .filter_map(|ino| {
                    let holds = part.store.read(|v| v.open_holds(ino)).ok()?;
                    (!any_holds_at(&holds, now))
                        .then(|| (ino, holds.into_iter().map(|(s, _)| s).collect()))
                })
                .collect();
            if unheld.is_empty() {
                continue;
            }
            let inos: Vec<Ino> = unheld.iter().map(|(ino, _)| *ino).collect();
            let chunks = chunks_named(part, &inos);
            let reclaim = |batch: Vec<(Ino, Vec<u64>)>| {
                let ended = batch
                    .iter()
                    .flat_map(|(ino, ss)| ss.iter().map(|&s| (*ino, s)))
                    .collect();
                let inos = batch.into_iter().map(|(ino, _)| ino).collect();
                vec![Op::EndOpens(ended), Op::ReclaimUnlinked(inos)]
            };
            let what = "reclaiming unlinked files";
            propose_in_batches(*p, unheld, reclaim, |c| part.propose(c), what).await;
            self.drop_chunks_of_gone(part, chunks).await;
        }
    }

    /// One round of reclaiming the chunks that commits took out of files' layouts (an
    /// `O_TRUNC` rewrite, an overwrite, a truncate) on the partitions this node leads,
    /// rather than leaving them to the chunk collector's grace (`chunk_gc_grace_ms`, twice
    /// over), which a checkpoint rewritten in place otherwise waited out on the disk. A
    /// chunk goes once it was dropped `unlinked_grace_ms` ago by the leader's wall clock
    /// and this node has found it so for that grace more on its monotonic clock (while the
    /// disk is nearly full: found dropped for half that grace on the monotonic clock,
    /// `Files::reclaim_grace`), and no open session holds its file: every reader or writer
    /// open longer than a quarter of `unlinked_grace_ms` holds one, so one that might still
    /// read the chunk or name it again in a commit keeps it.
    /// The file's home first marks the chunks reclaimed (`Op::ReclaimDropped`), which
    /// refuses a later commit from a writer whose view is older and names chunks outside
    /// the current layout; then they are dropped where they are stored. What fails here
    /// is left to the chunk collector.
    pub async fn collect_dropped(&self) {
        let grace = self.reclaim_grace();
        let now = crate::clock::now().as_millis();
        // On a nearly full disk the (halved) grace runs on this node's monotonic clock
        // alone, from the first round that finds the record: about as soon as an unlinked
        // file's, and never sooner for a wall clock that jumped.
        let stamped = if self.nearly_full() { 0 } else { grace };
        let before_ms = now.saturating_sub(stamped);
        for (p, part) in &self.node.partitions {
            if part.leader() != Some(self.node.config.node_id) {
                self.node.dropped_due.forget(*p);
                continue;
            }
            let due = match part.store.dropped(self.scan_limit(), |at| at <= before_ms) {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!(partition = p, "scan dropped chunks: {e}");
                    continue;
                }
            };
            let due = self
                .node
                .dropped_due
                .confirmed(*p, due, Duration::from_millis(grace));
            let mut by_file: BTreeMap<Ino, Vec<(u64, u32)>> = BTreeMap::new();
            for (ino, w, i) in due {
                by_file.entry(ino).or_default().push((w, i));
            }
            // A file a session holds keeps its chunks (the apply checks it again).
            by_file.retain(|&ino, _| {
                part.store
                    .read(|v| v.open_holds(ino))
                    .is_ok_and(|holds| !any_holds_at(&holds, now))
            });
            if by_file.is_empty() {
                continue;
            }
            let files: Vec<(Ino, Vec<(u64, u32)>)> = by_file.into_iter().collect();
            let cmd = Command::Batch(
                files
                    .iter()
                    .map(|(ino, chunks)| {
                        Command::Atomic(vec![Op::ReclaimDropped {
                            ino: *ino,
                            chunks: chunks.clone(),
                            before_ms,
                            now_ms: now,
                        }])
                    })
                    .collect(),
            );
            let results = match part.propose(cmd).await {
                Ok(CommandResult::Batch(r)) => r,
                Ok(other) => {
                    tracing::error!(partition = p, "reclaiming dropped chunks: {other:?}");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(partition = p, "reclaiming dropped chunks deferred: {e}");
                    continue;
                }
            };
            let reclaimed: Vec<(Ino, u64, u32)> = files
                .into_iter()
                .zip(results)
                .filter(|(_, r)| matches!(r, CommandResult::Applied(_)))
                .flat_map(|((ino, chunks), _)| chunks.into_iter().map(move |(w, i)| (ino, w, i)))
                .collect();
            if !reclaimed.is_empty() {
                tracing::info!(
                    partition = p,
                    chunks = reclaimed.len(),
                    "reclaiming chunks taken out of layouts"
                );
            }
            let what = "dropping chunks taken out of layouts";
            self.drop_where_stored(reclaimed, what).await;
        }
    }

    /// Drops the chunks that the layouts of files just reclaimed on `home` named, on the
    /// partitions that hold them, rather than leaving them to the chunk collector's grace
    /// (`chunk_gc_grace_ms`, ten minutes by default, which a replaced checkpoint's chunks
    /// otherwise waited out on the disk). Only the chunks of inodes now gone from `home`'s
    /// store go: inode numbers are never reused and a gone inode takes no layout again, so
    /// nothing can name them; a file the reclaim skipped keeps its chunks. That grace is
    /// for chunks no layout named yet (a write in progress); what fails here is left to it.
    async fn drop_chunks_of_gone(&self, home: &Partition, chunks: Vec<(Ino, u64, u32)>) {
        let mut gone: BTreeMap<Ino, bool> = BTreeMap::new();
        let chunks = chunks
            .into_iter()
            .filter(|&(ino, _, _)| {
                *gone.entry(ino).or_insert_with(|| {
                    home.store
                        .read(|v| v.inode(ino))
                        .is_ok_and(|rec| rec.is_none())
                })
            })
            .collect();
        let what = "dropping the chunks of reclaimed files";
        self.drop_where_stored(chunks, what).await;
    }

    /// Drops `chunks` (inode, write id, index) on the partitions that hold them; what fails
    /// (`what`, logged) is left to the chunk collector.
    async fn drop_where_stored(&self, chunks: Vec<(Ino, u64, u32)>, what: &str) {
        let partitions = self.node.config.cluster.partitions;
        let mut by_partition: BTreeMap<u32, Vec<(Ino, u64, u32)>> = BTreeMap::new();
        for (ino, write_id, index) in chunks {
            by_partition
                .entry(chunk_partition(ino, index, partitions))
                .or_default()
                .push((ino, write_id, index));
        }
        for (p, chunks) in by_partition {
            let propose = |c| self.node.propose_on(p, c);
            propose_in_batches(p, chunks, |b| vec![Op::DropChunks(b)], propose, what).await;
        }
    }

    /// One round of forgetting request records older than `REQUEST_RECORD_MS` on the
    /// partitions this node leads: older by the wall clock they carry, and found so by this
    /// node at least `REQUEST_RECORD_MS` ago by its monotonic clock (see
    /// [`crate::clock::confirmed_due`]).
    pub async fn collect_requests(&self) {
        let now = crate::clock::now().as_millis();
        for (p, part) in &self.node.partitions {
            if part.leader() != Some(self.node.config.node_id) {
                self.node.requests_due.forget(*p);
                continue;
            }
            let due: Vec<u64> = match part.store.requests(self.scan_limit(), |at| {
                now.saturating_sub(at) >= REQUEST_RECORD_MS
            }) {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::error!(partition = p, "scan request records: {e}");
                    continue;
                }
            };
            let due =
                self.node
                    .requests_due
                    .confirmed(*p, due, Duration::from_millis(REQUEST_RECORD_MS));
            let what = "forgetting request records";
            let forget = |b| vec![Op::ForgetRequests(b)];
            propose_in_batches(*p, due, forget, |c| part.propose(c), what).await;
        }
    }

    /// One round of forgetting the open sessions whose writers stopped renewing them a
    /// grace ago, on the partitions this node leads: they are refused whether their record
    /// is there or not, and their chunks are garbage.
    pub async fn collect_open_holds(&self) {
        let now = crate::clock::now().as_millis();
        let grace = self.node.config.cluster.chunk_gc_grace_ms;
        for (p, part) in &self.node.partitions {
            if part.leader() != Some(self.node.config.node_id) {
                continue;
            }
            let expired = match part
                .store
                .open_holds(self.scan_limit(), |until| now > until.saturating_add(grace))
            {
                Ok(holds) => holds,
                Err(e) => {
                    tracing::error!(partition = p, "scan open sessions: {e}");
                    continue;
                }
            };
            let what = "forgetting expired open sessions";
            let end = |b| vec![Op::EndOpens(b)];
            propose_in_batches(*p, expired, end, |c| part.propose(c), what).await;
        }
    }

    /// Compacts partitions (on this replica) that deleted many bodies or chunks, chunks of an
    /// eighth of their store and a snapshot's worth of log, or any at all while the data
    /// file system is nearly full (`worth_compacting`), then builds a snapshot of each so
    /// that the files the compaction replaced leave the disk. A compaction rewrites the
    /// store's files before it deletes the old ones (its keys, then its live values where
    /// the files hold enough garbage: `SmStore::compact_keys`, `SmStore::move_values`), so
    /// each step waits for a later round while the disk has no room for what it writes
    /// beside the critical floor: one run on a full disk filled it to the last byte and
    /// failed the node's next writes.
    pub async fn compact_if_needed(&self) {
        let short = self.nearly_full();
        let chunk_size = u64::from(self.chunk_size());
        let chunk_floor = self.node.config.raft.snapshot_after_bytes;
        for part in self.node.partitions.values() {
            let deletes = part.store.deletes_since_compaction();
            if deletes == 0 {
                continue;
            }
            let chunk_bytes = part.store.chunks_deleted_since_compaction() * chunk_size;
            let before = part.store.disk_bytes();
            if !worth_compacting(deletes, chunk_bytes, before, chunk_floor, short) {
                continue;
            }
            // Each step claims room for what it may write: the keys first, then, if the
            // garbage is worth it, the live values. Claimed whole before both, a copy of
            // the store kept a nearly full node from compacting at all (`jepsen/README.md`).
            let keys_claim = match self.node.space.claim(part.store.key_bytes()) {
                Ok(c) => c,
                Err(why) => {
                    tracing::warn!(partition = part.id, "compaction deferred: {why}");
                    continue;
                }
            };
            let store = part.store.clone();
            let live = tokio::task::spawn_blocking(move || store.compact_keys())
                .await
                .unwrap_or(None);
            drop(keys_claim);
            let mut moved = false;
            if let Some(live) = live {
                match self.node.space.claim(live) {
                    Ok(_values_claim) => {
                        let store = part.store.clone();
                        moved = tokio::task::spawn_blocking(move || store.move_values())
                            .await
                            .is_ok();
                    }
                    Err(why) => {
                        tracing::warn!(partition = part.id, "moving values deferred: {why}")
                    }
                }
            }
            tracing::info!(
                partition = part.id,
                deletes,
                chunk_bytes,
                before,
                after = part.store.disk_bytes(),
                moved,
                "reclaiming compaction"
            );
            // The stored snapshot's checkpoint still links the files the compaction
            // replaced, and holds their room until a new snapshot replaces it.
            if part.store.snapshot_mark().get().is_some() {
                if let Err(e) = part.raft.trigger().snapshot().await {
                    tracing::warn!(partition = part.id, "snapshot after compaction: {e}");
                }
            }
        }
    }
}

/// Proposes the ops `ops` makes of `items`, in batches of 1,000 on partition `p` (one
/// command each), through `propose`
/// (the partition's own `Partition::propose`, or `Node::propose_on` for one led elsewhere);
/// a failed batch waits for the next round.
async fn propose_in_batches<T: Clone, Fut>(
    p: u32,
    items: Vec<T>,
    ops: impl Fn(Vec<T>) -> Vec<Op>,
    propose: impl Fn(Command) -> Fut,
    what: &str,
) where
    Fut: std::future::Future<Output = Result<CommandResult, TalonError>>,
{
    for batch in items.chunks(1000) {
        match propose(Command::Atomic(ops(batch.to_vec()))).await {
            Ok(_) => tracing::debug!(partition = p, n = batch.len(), "{what}"),
            Err(e) => tracing::warn!(partition = p, "{what} deferred: {e}"),
        }
    }
}

/// The chunks (inode, write id, index) that the layouts of `inos` on their home `part`
/// name, and those that commits took out of them and are not reclaimed yet (see
/// `Files::collect_dropped`); holes (write id 0) name none. An inode that cannot be read
/// names none here: its chunks are left to the chunk collector.
fn chunks_named(part: &Partition, inos: &[Ino]) -> Vec<(Ino, u64, u32)> {
    let mut out = Vec::new();
    for &ino in inos {
        let read = part.store.read(|v| {
            let dropped = v.keys_with_prefix(&keys::dropped_prefix(ino))?;
            Ok((dropped, v.inode(ino)?))
        });
        let Ok((dropped, rec)) = read else {
            continue;
        };
        out.extend(dropped.iter().filter_map(|k| keys::chunk_of(k)));
        if let Some(rec) = rec {
            let named = crate::apply::named_chunks(&rec.layout);
            out.extend(named.into_iter().map(|(w, i)| (ino, w, i)));
        }
    }
    out
}

/// What a chunk's inode says about it, for garbage collection.
enum Holder {
    /// The home partition could not be asked this round.
    Unknown,
    /// Chunks `named` by the file's layout (none when the inode is gone or no longer
    /// chunked) are live, and so are those of an open session `held` past this round.
    Known {
        named: Vec<ChunkRef>,
        held: Vec<u64>,
    },
}

/// What an applied command changed; its refusal as the caller's error.
fn applied(res: CommandResult) -> Result<Outcome, TalonError> {
    match res {
        CommandResult::Applied(o) => Ok(o),
        CommandResult::Failed(e) => Err(e.into()),
        other => Err(TalonError::Unavailable(format!(
            "unexpected result {other:?}"
        ))),
    }
}

/// The attributes of `ino` after an applied command.
fn applied_attr(res: CommandResult, ino: Ino) -> Result<Attr, TalonError> {
    applied(res)?
        .attr(ino)
        .cloned()
        .ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))
}

/// Background garbage collection and compaction; stops on `cancel`. Each collector runs
/// about four times per grace period (within 250 ms..30 s), so nothing outlives its grace
/// by more than a quarter of it; compaction follows every round.
pub async fn gc_loop(node: Arc<Node>, cancel: CancellationToken) {
    let period = |grace_ms: u64| Duration::from_millis((grace_ms / 4).clamp(250, 30_000));
    let chunk_period = period(node.config.cluster.chunk_gc_grace_ms);
    let unlinked_period = period(node.config.cluster.unlinked_grace_ms);
    let mut tick = tokio::time::interval(chunk_period.min(unlinked_period));
    let mut chunks_due = tokio::time::Instant::now();
    let files = Files::new(&node);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {
                // A round in progress is abandoned at shutdown: a node that stops after its
                // peers has no quorum left, and a proposal would never end (nor
                // `Node::shutdown`, which waits for this task). The next start redoes it.
                let round = async {
                    files.collect_unlinked().await;
                    files.collect_dropped().await;
                    files.collect_requests().await;
                    files.collect_open_holds().await;
                    if tokio::time::Instant::now() >= chunks_due {
                        files.collect_chunks().await;
                        chunks_due = tokio::time::Instant::now() + chunk_period;
                    }
                    files.compact_if_needed().await;
                };
                if cancel.run_until_cancelled(round).await.is_none() {
                    break;
                }
            }
        }
    }
}

/// Bytes of a chunk's range read by one task: a longer range is read in pieces at once.
/// The store reads a block from its blob file with a read of its own and no read-ahead, so
/// the blocks of a piece come one disk read after another; a sequential reader asks for the
/// rest of a chunk at a time, which from a cold disk came at about half the rate of the
/// format that read the chunk whole in one disk read, until its pieces were read at once.
const READ_PIECE: u32 = 256 << 10;

/// Reads `length` bytes at `offset` of `chunk` held by `part` in place, only the blocks the
/// range covers (see [`read_chunk_range`]), in pieces of [`READ_PIECE`] read at once, each
/// off this thread if the store's reads have been coming from the disk.
async fn read_pieces(
    part: &Arc<Partition>,
    chunk: (Ino, u64, u32),
    offset: u32,
    length: u32,
) -> Result<ChunkRead, TalonError> {
    let end = offset.saturating_add(length);
    let mut pieces = Vec::new();
    let mut at = offset;
    loop {
        let to = (at / READ_PIECE)
            .saturating_add(1)
            .saturating_mul(READ_PIECE)
            .min(end);
        pieces.push((at, to - at));
        if to >= end {
            break;
        }
        at = to;
    }
    if let [(offset, length)] = pieces[..] {
        let read = move |v: &View<'_>| read_chunk_range(v, chunk, offset, length);
        return part.store.read_unblocking(read).await;
    }
    // A chunk stored whole is read once, not once a piece.
    let whole = move |v: &View<'_>| read_whole_chunk(v, chunk, offset, length);
    if let Some(got) = part.store.read_unblocking(whole).await? {
        return Ok(got);
    }
    let reads = pieces.into_iter().map(|(offset, length)| {
        let read = move |v: &View<'_>| read_blocks(v, chunk, offset, length);
        part.store.read_unblocking(read)
    });
    let mut out = Vec::new();
    for got in futures::future::try_join_all(reads).await? {
        match got {
            ChunkRead::Bytes(b) if out.is_empty() => {
                out = b;
                out.reserve((length as usize).saturating_sub(out.len()));
            }
            ChunkRead::Bytes(b) => out.extend_from_slice(&b),
            failed => return Ok(failed),
        }
    }
    Ok(ChunkRead::Bytes(out))
}

/// What a read of a range of a chunk found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ChunkRead {
    /// The bytes asked for; fewer, or none, past the chunk's end.
    Bytes(Vec<u8>),
    /// No such chunk here.
    Missing,
    /// A stored record that does not decode, and why.
    Undecodable(String),
    /// Stored data that no longer matches its checksum.
    Mismatch,
}

/// Reads `length` bytes at `offset` of chunk `(ino, write id, index)` in place: only the
/// blocks the range covers, each checked against its own checksum (a format 2 chunk,
/// stored whole, whole).
pub(crate) fn read_chunk_range(
    v: &View<'_>,
    chunk: (Ino, u64, u32),
    offset: u32,
    length: u32,
) -> Result<ChunkRead, Fatal> {
    match read_whole_chunk(v, chunk, offset, length)? {
        Some(got) => Ok(got),
        None => read_blocks(v, chunk, offset, length),
    }
}

/// Copies the part of chunk range `[offset, end)` that `b`, a stored block or whole chunk
/// starting at chunk offset `at`, holds into `out`; answers how many bytes the record held,
/// None if its data does not match its checksum.
fn copy_checked(
    b: &[u8],
    at: usize,
    (offset, end): (usize, usize),
    out: &mut Vec<u8>,
) -> Result<Option<usize>, Fatal> {
    let c = dec::<ChunkView>(b, "chunk")?;
    Ok(c.verify().then(|| {
        let from = offset.saturating_sub(at).min(c.data.len());
        let to = end.saturating_sub(at).min(c.data.len());
        out.extend_from_slice(&c.data[from..to]);
        c.data.len()
    }))
}

/// What [`copy_checked`] found: the bytes the record held, or the read's failure.
fn held(got: Result<Option<usize>, Fatal>) -> Result<usize, ChunkRead> {
    match got {
        Ok(Some(n)) => Ok(n),
        Ok(None) => Err(ChunkRead::Mismatch),
        Err(e) => Err(ChunkRead::Undecodable(e.to_string())),
    }
}

/// As [`read_chunk_range`], of a chunk stored whole (format 2); None if it is not.
fn read_whole_chunk(
    v: &View<'_>,
    (ino, write_id, index): (Ino, u64, u32),
    offset: u32,
    length: u32,
) -> Result<Option<ChunkRead>, Fatal> {
    let range = (
        offset as usize,
        (offset as usize).saturating_add(length as usize),
    );
    let mut out = Vec::with_capacity(length as usize);
    let got = v.read_self_checked(&keys::chunk(ino, write_id, index), |b| {
        copy_checked(b, 0, range, &mut out)
    })?;
    Ok(got.map(|got| match held(got) {
        Ok(_) => ChunkRead::Bytes(out),
        Err(failed) => failed,
    }))
}

/// As [`read_chunk_range`], of a chunk stored in blocks.
fn read_blocks(
    v: &View<'_>,
    (ino, write_id, index): (Ino, u64, u32),
    offset: u32,
    length: u32,
) -> Result<ChunkRead, Fatal> {
    let (offset, length) = (offset as usize, length as usize);
    let end = offset.saturating_add(length);
    let mut out = Vec::with_capacity(length);
    let mut found = false;
    let mut block = offset / keys::CHUNK_BLOCK;
    while block * keys::CHUNK_BLOCK < end {
        let at = block * keys::CHUNK_BLOCK;
        let Ok(b) = u32::try_from(block) else { break };
        let key = keys::chunk_block(ino, write_id, index, b);
        let got = v.read_self_checked(&key, |b| copy_checked(b, at, (offset, end), &mut out))?;
        // None: past the chunk's last block (or no such chunk: below).
        let Some(got) = got else { break };
        match held(got) {
            Ok(n) if n < keys::CHUNK_BLOCK => {
                found = true;
                break;
            }
            Ok(_) => found = true,
            Err(failed) => return Ok(failed),
        }
        block += 1;
    }
    // A range that starts past the chunk's blocks reads nothing, from a chunk that exists.
    if !found && v.get(&keys::chunk_time(ino, write_id, index))?.is_none() {
        return Ok(ChunkRead::Missing);
    }
    Ok(ChunkRead::Bytes(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_worth_a_compaction() {
        const MIB: u64 = 1 << 20;
        const FLOOR: u64 = 64 * MIB;
        // (deletes, of them chunks' bytes, store bytes, nearly full disk, compact?)
        let cases = [
            (0, 0, 0, true, false),
            (1_999, 0, 10_000 * MIB, false, false),
            (2_000, 0, 10_000 * MIB, false, true),
            (1, 0, 10_000 * MIB, true, true),
            // Sixteen chunks of 4 MiB: an eighth of a store of 512 MiB, less of one of 600.
            (16, 64 * MIB, 512 * MIB, false, true),
            (16, 64 * MIB, 600 * MIB, false, false),
            (16, 64 * MIB, 600 * MIB, true, true),
            // Below the floor, however small the store.
            (15, 60 * MIB, 100 * MIB, false, false),
            (16, 64 * MIB, 100 * MIB, false, true),
        ];
        for (deletes, chunk_bytes, store, short, want) in cases {
            assert_eq!(
                worth_compacting(deletes, chunk_bytes, store, FLOOR, short),
                want,
                "{deletes} deletes, {chunk_bytes} chunk bytes, store {store}, short {short}"
            );
        }
    }
}
