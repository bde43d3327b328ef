//! The namespace operations a partition leader serves: each turns a client request into
//! reads of local state and a list of ops per partition (`types::Op`), then runs them as
//! one `Atomic` proposal or, across partitions, a two-phase commit (`txn.rs`).
//!
//! Planning reads the leader's current state optimistically; every plan carries the
//! preconditions it relied on (`ExpectDentry`, `ExpectInode`, ...), so a plan made stale by
//! a concurrent change is refused at apply and planned again (bounded retries).
//!
//! Routing rules enforced here (the client computes them, the server checks):
//! - an entry (parent, name) is served by `entry_partition(parent, name, class(parent))`;
//! - an inode by its home partition `ino.home()`.
//!
//! Directory attribute updates of a parent (mtime, nlink) are applied in the same proposal
//! when the parent lives on the entry's partition. Otherwise `Node::touch_parent` updates
//! the parent before the change is answered, so the client that made the change sees it
//! at once: the home's leader makes a second proposal there or, for a file entry in a
//! relaxed directory, queues the update for its next flush (within 50 ms) while every read
//! of the directory there shows it (`dir_touch`). A create's or a remove's answer carries
//! the parent's attributes after it as that leader answered them (`Node::dir_attr_here`),
//! so the client need not read them again.
//!
//! Renames, removes, links and xattr changes take effect at most once per client request:
//! a request carrying an id is recorded (`Op::RecordRequest`) in the same commit as its
//! effect on the serving partition, so a copy the client sends again after a lost answer is
//! answered from the record (as done) instead of being applied again or refused.
//!
//! Its operations are methods of [`Namespace`], a view of a [`Node`] borrowed for one call
//! (`Namespace::new(&node).create(..)`), so a call names the file that defines it. Its
//! guards and reads (`read_guard`, `entry_class`, `attr_of`, `settle`, ...) serve the
//! modules above it too (`rename`, `attrs`, `data`); it builds on the node and on
//! transactions ([`Txns`]) and must not reach up to those modules.

use crate::apply::{fresh_attr, is_unlinked};
use crate::node::{Node, PeerReply, PeerRequest};
use crate::partition::{Partition, STRICT_READS};
use crate::records::{storage_error, Dentry, InodeRec, RequestRec};
use crate::txn::Txns;
use crate::types::{CommandResult, Expect, Op, Target};
use std::collections::BTreeMap;
use talon_model::placement::{dir_partitions, entry_partition};
use talon_model::{
    check_name, Attr, Backoff, Class, CreateSpec, Errno, FileKind, Ino, TalonError, Time,
};

/// Plans retried when a concurrent change refused them.
const PLAN_RETRIES: usize = 8;

/// Runs `attempt` until it settles: a plan refused because the state moved under it
/// (`Retry`) is planned again after a [`Backoff::replan`] pause (5 ms plus up to
/// `jitter_ms`), at most `PLAN_RETRIES` times; then the last refusal is returned.
pub(crate) async fn replan<T, F, Fut>(
    what: &str,
    jitter_ms: u64,
    mut attempt: F,
) -> Result<T, TalonError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, TalonError>>,
{
    let mut last = TalonError::Retry(format!("{what} did not settle"));
    let mut backoff = Backoff::replan(jitter_ms);
    for _ in 0..PLAN_RETRIES {
        match attempt().await {
            Err(e @ TalonError::Retry(_)) => {
                last = e;
                tokio::time::sleep(backoff.pause()).await;
            }
            other => return other,
        }
    }
    Err(last)
}

/// The op recording client request `id` as applied (none for id 0: the client keeps no
/// id, so nothing can be matched later), first in the serving partition's list so a copy
/// of an applied request is refused before any other precondition answers an errno.
pub(crate) fn record_request(ops: &mut Vec<Op>, id: u64, ino: Ino) {
    if id != 0 {
        ops.insert(
            0,
            Op::RecordRequest {
                id,
                ino,
                at_ms: crate::clock::now().as_millis(),
            },
        );
    }
}

pub(crate) fn posix(errno: Errno, msg: impl Into<String>) -> TalonError {
    TalonError::posix(errno, msg)
}

/// An inode's link count change (and, for a moved directory, its new parent), with ctime.
pub(crate) fn relink(ino: Ino, nlink: i32, parent: Option<Ino>, now: Time) -> Op {
    Op::AdjustInode {
        ino,
        nlink,
        parent,
        touch_mtime: false,
        now,
    }
}

pub(crate) fn outcome_attr(out: &BTreeMap<u32, crate::types::Outcome>, ino: Ino) -> Option<Attr> {
    out.values().find_map(|o| o.attr(ino).cloned())
}

pub(crate) fn outcome_epoch(out: &BTreeMap<u32, crate::types::Outcome>) -> u64 {
    out.values().map(|o| o.epoch).max().unwrap_or(0)
}

/// Refuses a request made at client epoch `epoch` (not 0) older than the partition's
/// `current` one.
fn check_epoch(epoch: u64, current: u64) -> Result<(), TalonError> {
    if epoch < current {
        return Err(TalonError::StaleEpoch { epoch: current });
    }
    Ok(())
}

/// What a create answers.
#[derive(Debug)]
pub struct Created {
    /// The entry's attributes.
    pub attr: Attr,
    /// The namespace epoch at the answering partition.
    pub epoch: u64,
    /// True if this request made the entry (or an earlier copy of it did); false if a
    /// create without `exclusive` found a regular file of that name and answers it.
    pub new: bool,
    /// The parent's attributes after this create, as its home's leader answered them (see
    /// [`Node::dir_attr_here`]); None when they are not known.
    pub parent: Option<Attr>,
}

/// What a remove answers.
#[derive(Debug)]
pub struct Removed {
    /// The removed entry's ino.
    pub ino: Ino,
    /// Its link count after the removal (0 for a directory).
    pub nlink: u32,
    /// The parent's attributes after this remove, as its home's leader answered them (see
    /// [`Node::dir_attr_here`]); None when they are not known.
    pub parent: Option<Attr>,
}

/// The namespace of a node: guards, lookup, create, remove, link and readdir on the
/// partitions it hosts. A view of a [`Node`] borrowed for a call:
/// `Namespace::new(&node).create(..)`.
#[derive(Clone, Copy, Debug)]
pub struct Namespace<'a> {
    node: &'a Node,
}

impl<'a> Namespace<'a> {
    /// The namespace served by `node`.
    pub fn new(node: &'a Node) -> Self {
        Namespace { node }
    }

    /// Checks the caller may read from `part`: a relaxed read within the staleness bound,
    /// or a linearizable one through the leader; then the client's epoch. For reads of
    /// something with a class of its own, `Namespace::read_at_class`.
    pub async fn read_guard(
        &self,
        part: &Partition,
        relaxed: bool,
        epoch: u64,
    ) -> Result<(), TalonError> {
        self.read_barrier(part, relaxed).await?;
        self.check_epoch_here(part, epoch)
    }

    /// The barrier of a session read of partition `p` (`RequestHeader.session_read`): its
    /// client changed something there within its session window, which only the leader's
    /// applied state is sure to show. A follower may not know yet that the change
    /// committed (it hears of a commit from its leader after the leader acknowledged it),
    /// so it answers NotLeader; a leader that has not applied an entry of its own term, or has
    /// not heard from a quorum within the staleness bound, confirms its leadership first.
    pub async fn session_barrier(&self, p: u32) -> Result<(), TalonError> {
        let part = self.node.local(p)?;
        if part.leads_fresh(self.node.staleness_bound()) {
            return Ok(());
        }
        part.linearizable().await
    }

    /// Refuses client epoch `epoch` (not 0) if `part` has seen a newer one.
    fn check_epoch_here(&self, part: &Partition, epoch: u64) -> Result<(), TalonError> {
        if epoch != 0 {
            check_epoch(epoch, part.store.epoch().map_err(storage_error)?)?;
        }
        Ok(())
    }

    /// The first half of [`Namespace::read_guard`], for a read that checks the epoch in
    /// its own view: a relaxed read within the staleness bound, or a linearizable one.
    /// True if the read is served relaxed (no ReadIndex was made).
    async fn read_barrier(&self, part: &Partition, relaxed: bool) -> Result<bool, TalonError> {
        if relaxed && part.relaxed_ok(self.node.staleness_bound()) {
            return Ok(true);
        }
        part.linearizable().await?;
        Ok(false)
    }

    /// `read` of `part` at the class of what it reads, as this replica's state shows it
    /// (`class`; `None` where it is not known here), not at the class the client believed
    /// (`relaxed`): a client may have learned a directory's class before it changed (a
    /// change allowed while the directory is empty), and a strict directory or file read
    /// relaxed would give up linearizability. A read served relaxed that finds its object
    /// strict is made again after a ReadIndex, so `read` may run twice. Then the client's
    /// `epoch` (0: the caller checks it in its own view).
    pub(crate) async fn read_at_class<T>(
        &self,
        part: &Partition,
        relaxed: bool,
        epoch: u64,
        read: impl Fn() -> Result<T, TalonError>,
        class: impl Fn(&T) -> Option<Class>,
    ) -> Result<T, TalonError> {
        let read = || std::future::ready(read());
        self.read_at_class_async(part, relaxed, epoch, read, class)
            .await
    }

    /// As [`Namespace::read_at_class`], for a `read` that may wait (for the disk, off the
    /// caller's thread).
    pub(crate) async fn read_at_class_async<T, Fut>(
        &self,
        part: &Partition,
        relaxed: bool,
        epoch: u64,
        read: impl Fn() -> Fut,
        class: impl Fn(&T) -> Option<Class>,
    ) -> Result<T, TalonError>
    where
        Fut: std::future::Future<Output = Result<T, TalonError>>,
    {
        let served_relaxed = self.read_barrier(part, relaxed).await?;
        let mut got = read().await?;
        if served_relaxed && class(&got) == Some(Class::Strict) {
            part.linearizable().await?;
            got = read().await?;
        }
        self.check_epoch_here(part, epoch)?;
        Ok(got)
    }

    /// The class of directory `dir` as seen from `part`, and whether `part` must learn it
    /// (it was fetched from the directory's home partition).
    pub(crate) async fn dir_class(
        &self,
        part: &Partition,
        dir: Ino,
    ) -> Result<(Class, bool), TalonError> {
        if dir.home() == part.id {
            return Ok((crate::reads::dir_class(&part.store, dir)?, false));
        }
        let known = part
            .store
            .read(|v| {
                if v.get(&crate::keys::tombstone(dir))?.is_some() {
                    return Ok(Some(None));
                }
                match v.get(&crate::keys::live_dir(dir))? {
                    Some(b) => Ok(Some(Some(crate::records::dec::<Class>(&b, "live dir")?))),
                    None => Ok(None),
                }
            })
            .map_err(storage_error)?;
        match known {
            Some(Some(c)) => Ok((c, false)),
            Some(None) => Err(posix(Errno::ENOENT, format!("directory {dir} was removed"))),
            None => match self
                .node
                .peer(dir.home(), PeerRequest::DirInfo(dir))
                .await?
            {
                PeerReply::Dir(c) => Ok((c, true)),
                other => Err(TalonError::Unavailable(format!(
                    "unexpected reply {other:?}"
                ))),
            },
        }
    }

    /// The class of `dir`, checking that `(dir, name)` belongs to partition `p`.
    pub(crate) async fn entry_class(
        &self,
        part: &Partition,
        dir: Ino,
        name: &[u8],
    ) -> Result<(Class, bool), TalonError> {
        let (class, learn) = self.dir_class(part, dir).await?;
        let want = entry_partition(dir, name, class, self.node.partitions_count());
        if want != part.id {
            return Err(TalonError::ClassChanged(format!(
                "entry {:?} of {dir} ({}) lives on partition {want}, not {}",
                String::from_utf8_lossy(name),
                class.as_str(),
                part.id
            )));
        }
        Ok((class, learn))
    }

    /// An inode record, read linearizably from its home partition.
    pub(crate) async fn read_inode(&self, ino: Ino) -> Result<Option<InodeRec>, TalonError> {
        match self
            .node
            .peer(ino.home(), PeerRequest::ReadInode(ino))
            .await?
        {
            PeerReply::Inode(r) => Ok(r),
            other => Err(TalonError::Unavailable(format!(
                "unexpected reply {other:?}"
            ))),
        }
    }

    pub(crate) async fn read_dentry(
        &self,
        p: u32,
        parent: Ino,
        name: &[u8],
    ) -> Result<Option<Dentry>, TalonError> {
        match self
            .node
            .peer(p, PeerRequest::ReadDentry(parent, name.to_vec()))
            .await?
        {
            PeerReply::Dentry(d) => Ok(d),
            other => Err(TalonError::Unavailable(format!(
                "unexpected reply {other:?}"
            ))),
        }
    }

    /// Attributes of `ino`: from `part`'s state if it is the home, else from the home.
    pub(crate) async fn attr_of(&self, part: &Partition, ino: Ino) -> Result<Attr, TalonError> {
        let rec = if ino.home() == part.id {
            part.store.read(|v| v.inode(ino)).map_err(storage_error)?
        } else {
            self.read_inode(ino).await?
        };
        self.found_attr(rec, ino)
    }

    /// The attributes of inode `ino` read as `rec`, as this node answers them.
    fn found_attr(&self, rec: Option<InodeRec>, ino: Ino) -> Result<Attr, TalonError> {
        rec.map(|r| self.node.with_queued_touches(r.attr))
            .ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))
    }

    /// [`Namespace::read_guard`] then [`Namespace::attr_of`], in one view of `part`, which
    /// is `ino`'s home (as `Node::home_part` gives it).
    pub(crate) async fn guarded_attr(
        &self,
        part: &Partition,
        relaxed: bool,
        epoch: u64,
        ino: Ino,
    ) -> Result<Attr, TalonError> {
        debug_assert_eq!(ino.home(), part.id, "an inode is read at its home");
        let (cur_epoch, rec, locked) = self
            .read_at_class(
                part,
                relaxed,
                0,
                || {
                    part.store
                        .read(|v| {
                            let rec = v.inode(ino)?;
                            let locked = v.strict_inode_locked(ino, rec.as_ref())?;
                            Ok((v.epoch()?, rec, locked))
                        })
                        .map_err(storage_error)
                },
                |(_, rec, _)| rec.as_ref().map(|r| r.attr.class),
            )
            .await?;
        if epoch != 0 {
            check_epoch(epoch, cur_epoch)?;
        }
        // As a lookup of a locked entry does, the reader waits for the transaction (a link
        // or unlink across partitions, say) to finish here.
        if locked {
            return Err(TalonError::Retry(
                "inode is being changed by a transaction".into(),
            ));
        }
        self.found_attr(rec, ino)
    }

    /// Looks up `name` in `parent` on partition `p`.
    pub async fn lookup(
        &self,
        p: u32,
        relaxed: bool,
        epoch: u64,
        parent: Ino,
        name: &[u8],
    ) -> Result<(Attr, u64), TalonError> {
        check_name(name)?;
        let part = self.node.local(p)?;
        let traced = tracing::enabled!(target: STRICT_READS, tracing::Level::DEBUG);
        // One view for the whole answer (`View::lookup`).
        let view = || {
            part.store
                .read(|v| v.lookup(p, parent, name, traced))
                .map_err(storage_error)
        };
        let crate::view::LookupRead {
            epoch: cur_epoch,
            known_class,
            locked,
            dentry,
            inode,
            applied,
        } = self
            .read_at_class(part, relaxed, 0, view, |r| r.known_class)
            .await?;
        if traced && known_class == Some(Class::Strict) {
            tracing::debug!(
                target: STRICT_READS,
                partition = p,
                %parent,
                name = %String::from_utf8_lossy(name),
                ino = ?dentry.as_ref().map(|d| d.ino.0),
                applied = ?applied,
                "strict lookup answered"
            );
        }
        if epoch != 0 {
            check_epoch(epoch, cur_epoch)?;
        }
        if let Some(c) = known_class {
            let want = entry_partition(parent, name, c, self.node.partitions_count());
            if want != p {
                return Err(TalonError::ClassChanged(format!(
                    "entry lives on partition {want} under {parent}'s class {}",
                    c.as_str()
                )));
            }
        }
        if locked {
            return Err(TalonError::Retry(
                "entry is being changed by a transaction".into(),
            ));
        }
        let d = dentry.ok_or_else(|| {
            posix(
                Errno::ENOENT,
                format!("no entry {:?}", String::from_utf8_lossy(name)),
            )
        })?;
        let attr = match inode {
            Some(rec) => self.found_attr(rec, d.ino)?,
            None => self.attr_of(part, d.ino).await?,
        };
        Ok((attr, cur_epoch))
    }

    /// Plans a create of `name` in `parent` on `part`.
    async fn plan_create(
        &self,
        part: &Partition,
        epoch: u64,
        parent: Ino,
        name: &[u8],
        spec: &CreateSpec,
        request_id: u64,
    ) -> Result<Vec<Op>, TalonError> {
        spec.check(name)?;
        let (parent_class, learn) = self.entry_class(part, parent, name).await?;
        let at = CreateAt {
            epoch,
            parent,
            name,
            parent_class,
            learn,
            parent_here: parent.home() == part.id,
            now: crate::clock::now(),
        };
        Ok(create_ops(&at, spec, request_id))
    }

    /// Creates a file, directory, symlink or special file; `request_id` is the client's
    /// retry token for it (0: none).
    pub async fn create(
        &self,
        p: u32,
        epoch: u64,
        parent: Ino,
        name: &[u8],
        spec: &CreateSpec,
        request_id: u64,
    ) -> Result<Created, TalonError> {
        let part = self.node.local(p)?;
        let ops = self
            .plan_create(part, epoch, parent, name, spec, request_id)
            .await?;
        let res = part.propose(crate::types::Command::Atomic(ops)).await?;
        self.finish_create(part, epoch, parent, name, spec, request_id, res)
            .await
    }

    /// Answers a create in `parent` from its proposal's result.
    #[allow(clippy::too_many_arguments)]
    async fn finish_create(
        &self,
        part: &Partition,
        epoch: u64,
        parent: Ino,
        name: &[u8],
        spec: &CreateSpec,
        request_id: u64,
        res: CommandResult,
    ) -> Result<Created, TalonError> {
        match res {
            CommandResult::Applied(o) => {
                let ino =
                    o.new_inos.first().copied().ok_or_else(|| {
                        TalonError::Unavailable("create allocated no inode".into())
                    })?;
                let parent_attr = if parent.home() != part.id {
                    let nlink = i32::from(spec.kind == FileKind::Directory);
                    self.node
                        .touch_parent(parent, nlink, crate::clock::now())
                        .await
                } else {
                    self.node.dir_attr_here(parent, o.attr(parent))
                };
                let attr = o.attr(ino).cloned().ok_or_else(|| {
                    TalonError::Unavailable("create returned no attributes".into())
                })?;
                Ok(Created {
                    attr,
                    epoch: o.epoch,
                    new: true,
                    parent: parent_attr,
                })
            }
            CommandResult::Failed(crate::types::ApplyError::Posix(errno, msg))
                if Errno(errno) == Errno::EEXIST =>
            {
                let own_retry = request_id != 0;
                let open_existing = !spec.exclusive && spec.kind == FileKind::Regular;
                if !own_retry && !open_existing {
                    return Err(posix(Errno::EEXIST, msg));
                }
                let (attr, e) = self.lookup(part.id, false, epoch, parent, name).await?;
                if own_retry && self.created_by(part, attr.ino, request_id).await? {
                    return Ok(Created {
                        attr,
                        epoch: e,
                        new: true,
                        parent: None,
                    });
                }
                match attr.kind {
                    _ if !open_existing => Err(posix(Errno::EEXIST, msg)),
                    FileKind::Directory => {
                        Err(posix(Errno::EISDIR, "a directory of that name exists"))
                    }
                    _ => Ok(Created {
                        attr,
                        epoch: e,
                        new: false,
                        parent: None,
                    }),
                }
            }
            CommandResult::Failed(e) => Err(e.into()),
            other => Err(TalonError::Unavailable(format!(
                "unexpected result {other:?}"
            ))),
        }
    }

    /// True if inode `ino` was created by the request with retry token `token`.
    async fn created_by(&self, part: &Partition, ino: Ino, token: u64) -> Result<bool, TalonError> {
        let rec = if ino.home() == part.id {
            part.store.read(|v| v.inode(ino)).map_err(storage_error)?
        } else {
            self.read_inode(ino).await?
        };
        Ok(rec.is_some_and(|r| r.creator == token))
    }

    /// Many creates for one partition, each `(parent, name, spec, request_id)`: planned
    /// separately, proposed concurrently so the proposer merges them into one Raft entry.
    /// Results in input order.
    pub async fn create_batch(
        &self,
        p: u32,
        epoch: u64,
        items: Vec<(Ino, Vec<u8>, CreateSpec, u64)>,
    ) -> Result<Vec<Result<Attr, TalonError>>, TalonError> {
        let part = self.node.local(p)?;
        let futs = items
            .into_iter()
            .map(|(parent, name, spec, id)| async move {
                let ops = self
                    .plan_create(part, epoch, parent, &name, &spec, id)
                    .await?;
                let res = part.propose(crate::types::Command::Atomic(ops)).await?;
                self.finish_create(part, epoch, parent, &name, &spec, id, res)
                    .await
                    .map(|c| c.attr)
            });
        Ok(futures::future::join_all(futs).await)
    }

    /// The record of client request `id` on `part`, if a copy of it was applied there.
    pub(crate) fn applied(
        &self,
        part: &Partition,
        id: u64,
    ) -> Result<Option<RequestRec>, TalonError> {
        if id == 0 {
            return Ok(None);
        }
        part.store.read(|v| v.request(id)).map_err(storage_error)
    }

    /// Settles one attempt `r` of client request `id`: a refusal (an errno, a stale epoch,
    /// a conflict) is answered by `done` instead when a copy of the request was applied
    /// meanwhile (its answer was lost, and the copy's effect is what made this one fail),
    /// and re-planned while a copy is still prepared in a transaction.
    pub(crate) async fn settle<T, D, F>(
        &self,
        part: &Partition,
        id: u64,
        r: Result<T, TalonError>,
        done: D,
    ) -> Result<T, TalonError>
    where
        D: FnOnce(RequestRec) -> F,
        F: std::future::Future<Output = Result<T, TalonError>>,
    {
        match r {
            Err(
                e @ (TalonError::Posix { .. }
                | TalonError::StaleEpoch { .. }
                | TalonError::Retry(_)),
            ) if id != 0 => {
                let (rec, pending) = part
                    .store
                    .read(|v| Ok((v.request(id)?, v.request_pending(id)?)))
                    .map_err(storage_error)?;
                match (rec, pending) {
                    (Some(rec), _) => done(rec).await,
                    (None, true) => Err(TalonError::Retry(format!(
                        "request {id:#x} is being applied"
                    ))),
                    (None, false) => Err(e),
                }
            }
            r => r,
        }
    }

    /// What a remove answers once applied: the inode it removed and that inode's link
    /// count now.
    async fn removed(&self, rec: RequestRec) -> Result<Removed, TalonError> {
        let nlink = match self.read_inode(rec.ino).await {
            Ok(Some(r)) if r.attr.kind != FileKind::Directory => r.attr.nlink,
            _ => 0,
        };
        Ok(Removed {
            ino: rec.ino,
            nlink,
            parent: None,
        })
    }

    /// Unlinks a non-directory (`directory == false`) or removes an empty directory.
    /// `request`: the client's id for this remove (0: none), see the module header.
    pub async fn remove(
        &self,
        p: u32,
        epoch: u64,
        parent: Ino,
        name: &[u8],
        directory: bool,
        request: u64,
    ) -> Result<Removed, TalonError> {
        check_name(name)?;
        let part = self.node.local(p)?;
        replan("remove", 20, || async {
            let r = self
                .remove_once(part, epoch, parent, name, directory, request)
                .await;
            self.settle(part, request, r, |rec| self.removed(rec)).await
        })
        .await
    }

    async fn remove_once(
        &self,
        part: &Partition,
        epoch: u64,
        parent: Ino,
        name: &[u8],
        directory: bool,
        request: u64,
    ) -> Result<Removed, TalonError> {
        // Refuses an entry this partition does not hold (class changed, not hosted).
        let (class, _) = self.entry_class(part, parent, name).await?;
        // The entry read below only plans the remove: where it applies, `ExpectDentry`
        // checks it again, and `settle` answers a copy of this request applied meanwhile.
        // So in a relaxed directory, on a leader, it may be as old as a relaxed lookup
        // there (its own term applied, a quorum heard within the bound): an ENOENT it
        // finds is the answer that lookup gives. Elsewhere it is linearizable.
        if !(class == Class::Relaxed && part.leads_fresh(self.node.staleness_bound())) {
            part.linearizable().await?;
        }
        if let Some(rec) = self.applied(part, request)? {
            return self.removed(rec).await;
        }
        let (d, locked) = part
            .store
            .read(|v| {
                let locked = v.locked(&crate::keys::dentry(parent, name))?.is_some();
                Ok((v.dentry(parent, name)?, locked))
            })
            .map_err(storage_error)?;
        // An entry a prepared transaction holds may be on its way in (a link or rename
        // whose other half is applied already): not there yet is no answer.
        if d.is_none() && locked {
            return Err(TalonError::Retry(
                "entry is being changed by a transaction".into(),
            ));
        }
        let d = d.ok_or_else(|| {
            posix(
                Errno::ENOENT,
                format!("no entry {:?}", String::from_utf8_lossy(name)),
            )
        })?;
        let now = crate::clock::now();
        let p = part.id;
        let mut parts: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
        let mut entry_ops = vec![
            Op::ExpectEpoch(epoch),
            Op::ExpectDentry {
                parent,
                name: name.to_vec(),
                expect: Expect::Ino(d.ino),
            },
            Op::DelDentry {
                parent,
                name: name.to_vec(),
            },
        ];
        record_request(&mut entry_ops, request, d.ino);
        parts.insert(p, entry_ops);
        if d.kind == FileKind::Directory {
            if !directory {
                return Err(posix(Errno::EISDIR, "is a directory"));
            }
            let attr = self.attr_of(part, d.ino).await?;
            plan_dir_removal(&mut parts, d.ino, attr.class, self.node.partitions_count());
        } else {
            if directory {
                return Err(posix(Errno::ENOTDIR, "not a directory"));
            }
            parts
                .entry(d.ino.home())
                .or_default()
                .push(relink(d.ino, -1, None, now));
        }
        if parent.home() == p && parts.len() == 1 {
            if let Some(ops) = parts.get_mut(&p) {
                ops.push(Op::TouchDir {
                    dir: parent,
                    nlink: -i32::from(directory),
                    now,
                });
            }
        }
        let single = parts.len() == 1;
        let out = Txns::new(self.node)
            .run_ops(p, parts, || async { Ok(()) })
            .await?;
        let parent_attr = if single && parent.home() == p {
            self.node
                .dir_attr_here(parent, outcome_attr(&out, parent).as_ref())
        } else {
            self.node
                .touch_parent(parent, -i32::from(directory), now)
                .await
        };
        let nlink = outcome_attr(&out, d.ino).map(|a| a.nlink).unwrap_or(0);
        Ok(Removed {
            ino: d.ino,
            nlink,
            parent: parent_attr,
        })
    }

    /// Links inode `ino` as `(np, nn)`; served by the new entry's partition.
    /// `request`: the client's id for this link (0: none), see the module header.
    pub async fn link(
        &self,
        p: u32,
        epoch: u64,
        ino: Ino,
        (np, nn): (Ino, &[u8]),
        request: u64,
    ) -> Result<(Attr, u64), TalonError> {
        check_name(nn)?;
        let part = self.node.local(p)?;
        let linked = |rec: RequestRec| async move {
            let attr = self
                .read_inode(rec.ino)
                .await?
                .map(|r| r.attr)
                .ok_or_else(|| posix(Errno::ENOENT, format!("no inode {}", rec.ino)))?;
            Ok((attr, part.store.epoch().map_err(storage_error)?))
        };
        if let Some(rec) = self.applied(part, request)? {
            return linked(rec).await;
        }
        let r = self.link_once(part, epoch, ino, (np, nn), request).await;
        self.settle(part, request, r, linked).await
    }

    async fn link_once(
        &self,
        part: &Partition,
        epoch: u64,
        ino: Ino,
        (np, nn): (Ino, &[u8]),
        request: u64,
    ) -> Result<(Attr, u64), TalonError> {
        let p = part.id;
        let (pclass, learn) = self.entry_class(part, np, nn).await?;
        let rec = self
            .read_inode(ino)
            .await?
            .ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))?;
        if rec.attr.kind == FileKind::Directory {
            return Err(posix(Errno::EPERM, "cannot hard-link a directory"));
        }
        if is_unlinked(&rec.attr) {
            return Err(posix(
                Errno::ENOENT,
                format!("inode {ino} has been unlinked"),
            ));
        }
        let now = crate::clock::now();
        let mut parts: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
        let entry_ops = parts.entry(p).or_default();
        record_request(entry_ops, request, ino);
        entry_ops.extend([
            Op::ExpectEpoch(epoch),
            Op::ExpectDirLive {
                dir: np,
                class: pclass,
                learn,
            },
            Op::ExpectDentry {
                parent: np,
                name: nn.to_vec(),
                expect: Expect::Absent,
            },
            Op::PutDentry {
                parent: np,
                name: nn.to_vec(),
                target: Target::Existing(ino),
                kind: rec.attr.kind,
            },
        ]);
        parts
            .entry(ino.home())
            .or_default()
            .push(relink(ino, 1, None, now));
        let out = Txns::new(self.node)
            .run_ops(p, parts, || async { Ok(()) })
            .await?;
        self.node.touch_parent(np, 0, now).await;
        let attr = match outcome_attr(&out, ino) {
            Some(a) => a,
            None => self
                .read_inode(ino)
                .await?
                .map(|r| r.attr)
                .ok_or_else(|| posix(Errno::ENOENT, "inode vanished"))?,
        };
        Ok((attr, outcome_epoch(&out)))
    }

    /// One page of partition `p`'s share of directory `dir`.
    #[allow(clippy::too_many_arguments)]
    pub async fn readdir(
        &self,
        p: u32,
        relaxed: bool,
        epoch: u64,
        dir: Ino,
        after: &[u8],
        limit: u32,
        plus: bool,
    ) -> Result<(Vec<(Vec<u8>, Dentry, Option<Attr>)>, bool), TalonError> {
        let part = self.node.local(p)?;
        // A strict directory's entries all live at its home, where its class is known; a
        // listing asked strictly needs no look at it.
        let home_class = || match relaxed && dir.home() == p {
            true => match crate::reads::dir_class(&part.store, dir) {
                Ok(c) => Ok(Some(c)),
                // Gone, or not a directory: the listing answers as before.
                Err(TalonError::Posix { .. }) => Ok(None),
                Err(e) => Err(e),
            },
            false => Ok(None),
        };
        let strict = self
            .read_at_class(part, relaxed, epoch, home_class, |c| *c)
            .await?
            == Some(Class::Strict);
        if !relaxed || strict {
            // A prepared transaction that changes entries of `dir` (a rename across
            // partitions, say) locks them here until it finishes here. Its other half may
            // already be finished and seen by another listing, so a strict listing waits
            // for it (the client retries) rather than show this half unchanged.
            let lock_prefix = crate::keys::lock(&crate::keys::dentry_prefix(dir));
            let busy = part
                .store
                .read(|v| v.prefix_any(&lock_prefix))
                .map_err(storage_error)?;
            if busy {
                return Err(TalonError::Retry(
                    "entries of the directory are being changed by a transaction".into(),
                ));
            }
        }
        let limit = limit.clamp(1, self.node.config.cluster.max_batch) as usize;
        let (entries, more) = part
            .store
            .readdir(dir, after, limit)
            .map_err(storage_error)?;
        let mut out = Vec::with_capacity(entries.len());
        for (name, d) in entries {
            let attr = if plus {
                self.attr_of(part, d.ino).await.ok()
            } else {
                None
            };
            out.push((name, d, attr));
        }
        Ok((out, more))
    }
}

/// Adds the ops that remove directory `dir` of `class`, in a cluster of `partitions`:
/// emptiness checked (and fenced) wherever its entries may live, a tombstone on every
/// partition, the inode dropped at its home.
pub(crate) fn plan_dir_removal(
    parts: &mut BTreeMap<u32, Vec<Op>>,
    dir: Ino,
    class: Class,
    partitions: u32,
) {
    let may_hold = dir_partitions(dir, class, partitions);
    for q in 0..partitions {
        let ops = parts.entry(q).or_default();
        if may_hold.contains(&q) {
            ops.push(Op::ExpectEmpty(dir));
        }
        ops.push(Op::Tombstone(dir));
    }
    let home = parts.entry(dir.home()).or_default();
    home.push(Op::ExpectInode {
        ino: dir,
        kind: Some(FileKind::Directory),
    });
    home.push(Op::DropInode(dir));
}

/// Where a create lands, as planning found it on the entry's partition.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CreateAt<'a> {
    /// The routing epoch the client planned with.
    pub epoch: u64,
    /// The directory the entry goes in.
    pub parent: Ino,
    /// The entry's name (already checked).
    pub name: &'a [u8],
    /// The parent's class, as this partition knows it.
    pub parent_class: Class,
    /// Whether this partition learns the parent's liveness from the proposal.
    pub learn: bool,
    /// Whether the parent's home is the entry's partition: its link count and times then
    /// change in the create's own commit (otherwise `Node::touch_parent` does it).
    pub parent_here: bool,
    /// The create's time.
    pub now: Time,
}

/// The ops of a create at `at`: the checks it relies on (epoch, a live parent, the name
/// absent), the new inode, its entry, and the parent's update when the parent is here. A
/// directory takes `spec.class` or its parent's class; anything else its parent's.
pub(crate) fn create_ops(at: &CreateAt<'_>, spec: &CreateSpec, request_id: u64) -> Vec<Op> {
    let class = match spec.kind {
        FileKind::Directory => spec.class.unwrap_or(at.parent_class),
        _ => at.parent_class,
    };
    let size = if spec.kind == FileKind::Symlink {
        spec.symlink_target.len() as u64
    } else {
        0
    };
    // A spec decoded from a request always names its owner.
    let (uid, gid) = spec.owner.unwrap_or_default();
    let attr = fresh_attr(
        spec.kind, spec.perm, uid, gid, spec.rdev, size, class, at.parent, at.now,
    );
    let mut ops = vec![
        Op::ExpectEpoch(at.epoch),
        Op::ExpectDirLive {
            dir: at.parent,
            class: at.parent_class,
            learn: at.learn,
        },
        Op::ExpectDentry {
            parent: at.parent,
            name: at.name.to_vec(),
            expect: Expect::Absent,
        },
        Op::NewInode {
            attr: Box::new(attr),
            symlink: spec.symlink_target.clone(),
            creator: request_id,
        },
        Op::PutDentry {
            parent: at.parent,
            name: at.name.to_vec(),
            target: Target::New(0),
            kind: spec.kind,
        },
    ];
    if at.parent_here {
        ops.push(Op::TouchDir {
            dir: at.parent,
            nlink: i32::from(spec.kind == FileKind::Directory),
            now: at.now,
        });
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::Applier;
    use crate::keys::meta;
    use crate::kv::{MemKv, Overlay};
    use crate::types::{ApplyError, Command};
    use crate::view::View;

    const P: u32 = 3;
    const NOW: Time = Time {
        secs: 1_700_000_000,
        nanos: 0,
    };
    const LATER: Time = Time {
        secs: 1_700_000_100,
        nanos: 0,
    };

    /// Partition `P` at epoch 2, holding relaxed directory `d` (its home here), in memory.
    struct Store {
        db: MemKv,
        none: Overlay,
        d: Ino,
    }

    impl Store {
        fn new() -> Store {
            let mut db = MemKv::default();
            let attr = fresh_attr(
                FileKind::Directory,
                0o755,
                0,
                0,
                0,
                0,
                Class::Relaxed,
                Ino(1),
                NOW,
            );
            let mut staged = Overlay::new();
            staged.insert(meta::EPOCH.to_vec(), Some(2u64.to_le_bytes().to_vec()));
            let made = Applier { partition: P }
                .apply(
                    &db,
                    &mut staged,
                    &Command::Atomic(vec![Op::NewInode {
                        attr: Box::new(attr),
                        symlink: Vec::new(),
                        creator: 0,
                    }]),
                )
                .expect("no storage fault");
            let CommandResult::Applied(o) = made else {
                panic!("make d: {made:?}")
            };
            db.write(staged);
            Store {
                db,
                none: Overlay::new(),
                d: o.new_inos[0],
            }
        }

        /// Applies the planned create and keeps what it wrote.
        fn create(&mut self, at: &CreateAt<'_>, spec: &CreateSpec) -> CommandResult {
            let mut staged = Overlay::new();
            let res = Applier { partition: P }
                .apply(
                    &self.db,
                    &mut staged,
                    &Command::Atomic(create_ops(at, spec, 9)),
                )
                .expect("no storage fault");
            self.db.write(staged);
            res
        }

        fn attr(&self, ino: Ino) -> Attr {
            View::new(&self.db, &self.none)
                .inode(ino)
                .expect("read")
                .unwrap_or_else(|| panic!("no inode {ino}"))
                .attr
        }

        fn entry(&self, name: &[u8]) -> Option<Ino> {
            View::new(&self.db, &self.none)
                .dentry(self.d, name)
                .expect("read")
                .map(|e| e.ino)
        }

        fn at<'a>(&self, name: &'a [u8]) -> CreateAt<'a> {
            CreateAt {
                epoch: 2,
                parent: self.d,
                name,
                parent_class: Class::Relaxed,
                learn: false,
                parent_here: true,
                now: LATER,
            }
        }
    }

    fn errno(res: &CommandResult) -> Option<Errno> {
        match res {
            CommandResult::Failed(ApplyError::Posix(e, _)) => Some(Errno(*e)),
            _ => None,
        }
    }

    #[test]
    fn a_planned_create_makes_the_entry_the_inode_and_the_parent_update() {
        let mut s = Store::new();
        let before = s.attr(s.d);
        let made = s.create(&s.at(b"a"), &CreateSpec::file(0o640));
        let CommandResult::Applied(o) = &made else {
            panic!("create a: {made:?}")
        };
        let a = o.new_inos[0];
        assert_eq!(s.entry(b"a"), Some(a));
        let attr = s.attr(a);
        assert_eq!(
            (attr.kind, attr.perm, attr.class, attr.nlink, attr.mtime),
            (FileKind::Regular, 0o640, Class::Relaxed, 1, LATER)
        );
        let d = s.attr(s.d);
        assert_eq!(
            (d.nlink, d.mtime),
            (before.nlink, LATER),
            "a file adds no link"
        );

        // Directories: their own class if given, else the parent's; each adds a link.
        let made = s.create(&s.at(b"s"), &CreateSpec::dir(0o755, Some(Class::Strict)));
        assert!(matches!(made, CommandResult::Applied(_)), "{made:?}");
        let made = s.create(&s.at(b"t"), &CreateSpec::dir(0o755, None));
        assert!(matches!(made, CommandResult::Applied(_)), "{made:?}");
        let dir = |name: &[u8]| {
            let a = s.attr(s.entry(name).expect("made"));
            (a.class, a.parent)
        };
        assert_eq!(
            (dir(b"s"), dir(b"t")),
            ((Class::Strict, s.d), (Class::Relaxed, s.d))
        );
        assert_eq!(s.attr(s.d).nlink, before.nlink + 2);

        // A symlink's size is its target's length.
        let made = s.create(&s.at(b"l"), &CreateSpec::symlink("a/b/c"));
        assert!(matches!(made, CommandResult::Applied(_)), "{made:?}");
        assert_eq!(s.attr(s.entry(b"l").expect("made")).size, 5);
    }

    #[test]
    fn a_parent_elsewhere_is_left_to_its_own_partition() {
        let mut s = Store::new();
        let before = s.attr(s.d);
        let at = CreateAt {
            parent_here: false,
            ..s.at(b"a")
        };
        let made = s.create(&at, &CreateSpec::dir(0o755, None));
        assert!(matches!(made, CommandResult::Applied(_)), "{made:?}");
        assert!(s.entry(b"a").is_some());
        let d = s.attr(s.d);
        assert_eq!((d.nlink, d.mtime), (before.nlink, before.mtime));
    }

    #[test]
    fn a_refused_create_changes_nothing() {
        let mut s = Store::new();
        let made = s.create(&s.at(b"a"), &CreateSpec::file(0o644));
        let CommandResult::Applied(o) = &made else {
            panic!("create a: {made:?}")
        };
        let a = o.new_inos[0];
        let before = s.attr(s.d);

        let again = s.create(&s.at(b"a"), &CreateSpec::file(0o644));
        assert_eq!(errno(&again), Some(Errno::EEXIST), "{again:?}");
        assert_eq!(s.entry(b"a"), Some(a), "the first file stays");

        let stale = CreateAt {
            epoch: 1,
            ..s.at(b"b")
        };
        let res = s.create(&stale, &CreateSpec::file(0o644));
        assert!(
            matches!(res, CommandResult::Failed(ApplyError::StaleEpoch(2))),
            "{res:?}"
        );

        let gone = CreateAt {
            parent: Ino::new(P, 999),
            ..s.at(b"b")
        };
        let res = s.create(&gone, &CreateSpec::file(0o644));
        assert_eq!(errno(&res), Some(Errno::ENOENT), "{res:?}");

        let file_parent = CreateAt {
            parent: a,
            ..s.at(b"b")
        };
        let res = s.create(&file_parent, &CreateSpec::file(0o644));
        assert_eq!(errno(&res), Some(Errno::ENOTDIR), "{res:?}");

        assert_eq!(s.entry(b"b"), None);
        assert_eq!(s.attr(s.d), before, "the parent is untouched");
    }
}
