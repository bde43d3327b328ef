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
//! when the parent lives on the entry's partition. Otherwise a strict parent is updated by
//! a second proposal on its home before the change is answered (POSIX-visible at once), and
//! a relaxed one asynchronously within ~50 ms (DESIGN.md allows this; a crash in that
//! window can leave a relaxed parent's nlink/mtime stale).
//!
//! Renames, removes, links and xattr changes take effect at most once per client request:
//! a request carrying an id is recorded (`Op::RecordRequest`) in the same commit as its
//! effect on the serving partition, so a copy the client sends again after a lost answer is
//! answered from the record (as done) instead of being applied again or refused.

use crate::apply::storage_error;
use crate::apply::{fresh_attr, is_unlinked, Dentry, InodeRec, RequestRec};
use crate::node::{Node, PeerReply, PeerRequest};
use crate::partition::Partition;
use crate::types::{AttrChange, CommandResult, Expect, Op, Target};
use std::collections::BTreeMap;
use std::time::Duration;
use talon_model::name::{validate_name, validate_symlink_target};
use talon_model::placement::{dir_partitions, entry_partition};
use talon_model::{Attr, Class, Errno, FileKind, Ino, TalonError, Time, ROOT_INO};

/// Linux renameat2 flags.
pub const RENAME_NOREPLACE: u32 = 1;
/// Linux renameat2 flags.
pub const RENAME_EXCHANGE: u32 = 2;
/// The virtual xattr that carries a symlink's target (readlink).
pub const SYMLINK_XATTR: &[u8] = b"talon.symlink";
/// Longest xattr value.
pub const XATTR_VALUE_MAX: usize = 64 * 1024;
/// Deepest directory chain walked when checking a rename for loops.
const MAX_DEPTH: usize = 4096;
/// Plans retried when a concurrent change refused them.
const PLAN_RETRIES: usize = 8;

/// Runs `attempt` until it settles: a plan refused because the state moved under it
/// (`Retry`) is planned again after a pause of 5 ms plus up to `jitter_ms`, at most
/// `PLAN_RETRIES` times; then the last refusal is returned.
async fn replan<T, F, Fut>(what: &str, jitter_ms: u64, mut attempt: F) -> Result<T, TalonError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, TalonError>>,
{
    let mut last = TalonError::Retry(format!("{what} did not settle"));
    for _ in 0..PLAN_RETRIES {
        match attempt().await {
            Err(e @ TalonError::Retry(_)) => {
                last = e;
                let pause = 5 + rand::random::<u64>() % jitter_ms;
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            other => return other,
        }
    }
    Err(last)
}

/// What a rename requires of its destination entry at commit, given what its plan read
/// there (`planned`). A plain rename replaces whatever is there, or takes the free name, so
/// any change re-plans it; NOREPLACE answers EEXIST if a name appeared; EXCHANGE answers
/// ENOENT if its partner went.
fn destination_guard(planned: Option<Ino>, flags: u32) -> Expect {
    match planned {
        _ if flags & (RENAME_NOREPLACE | RENAME_EXCHANGE) == 0 => Expect::AsPlanned(planned),
        Some(ino) => Expect::Ino(ino),
        None => Expect::Absent,
    }
}

/// The op recording client request `id` as applied (none for id 0: the client keeps no
/// id, so nothing can be matched later), first in the serving partition's list so a copy
/// of an applied request is refused before any other precondition answers an errno.
fn record_request(ops: &mut Vec<Op>, id: u64, ino: Ino) {
    if id != 0 {
        ops.insert(
            0,
            Op::RecordRequest {
                id,
                ino,
                at_ms: Time::now().as_millis(),
            },
        );
    }
}

fn posix(errno: Errno, msg: impl Into<String>) -> TalonError {
    TalonError::posix(errno, msg)
}

fn check_name(name: &[u8]) -> Result<(), TalonError> {
    validate_name(name).map_err(|e| {
        posix(
            e,
            format!("invalid name {:?}", String::from_utf8_lossy(name)),
        )
    })
}

/// An inode's link count change (and, for a moved directory, its new parent), with ctime.
fn relink(ino: Ino, nlink: i32, parent: Option<Ino>, now: Time) -> Op {
    Op::AdjustInode {
        ino,
        nlink,
        parent,
        touch_mtime: false,
        now,
    }
}

fn outcome_attr(out: &BTreeMap<u32, crate::types::Outcome>, ino: Ino) -> Option<Attr> {
    out.values().find_map(|o| o.attr(ino).cloned())
}

fn outcome_epoch(out: &BTreeMap<u32, crate::types::Outcome>) -> u64 {
    out.values().map(|o| o.epoch).max().unwrap_or(0)
}

/// What a create asks for.
#[derive(Clone, Debug)]
pub struct CreateSpec {
    /// Kind of the new inode.
    pub kind: FileKind,
    /// Permission bits.
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number.
    pub rdev: u64,
    /// Symlink target.
    pub symlink: Vec<u8>,
    /// Class of a new directory (None: inherit).
    pub class: Option<Class>,
    /// EEXIST if the name exists (otherwise an existing regular file is returned).
    pub exclusive: bool,
    /// Retry token of the request (0: none).
    pub request_id: u64,
}

impl Node {
    fn partitions_count(&self) -> u32 {
        self.config.cluster.partitions
    }

    /// Checks the caller may read from `part`: a relaxed read within the staleness bound,
    /// or a linearizable one through the leader; then the client's epoch.
    pub async fn read_guard(
        &self,
        part: &Partition,
        relaxed: bool,
        epoch: u64,
    ) -> Result<(), TalonError> {
        let bound = Duration::from_millis(self.config.cluster.relaxed_staleness_ms);
        if !(relaxed && part.relaxed_ok(bound)) {
            part.linearizable().await?;
        }
        if epoch != 0 {
            let cur = part.store.epoch().map_err(storage_error)?;
            if epoch < cur {
                return Err(TalonError::StaleEpoch { epoch: cur });
            }
        }
        Ok(())
    }

    /// The class of directory `dir` as seen from `part`, and whether `part` must learn it
    /// (it was fetched from the directory's home partition).
    async fn dir_class(&self, part: &Partition, dir: Ino) -> Result<(Class, bool), TalonError> {
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
                    Some(b) => Ok(Some(Some(crate::apply::dec::<Class>(&b, "live dir")?))),
                    None => Ok(None),
                }
            })
            .map_err(storage_error)?;
        match known {
            Some(Some(c)) => Ok((c, false)),
            Some(None) => Err(posix(Errno::ENOENT, format!("directory {dir} was removed"))),
            None => match self.peer(dir.home(), PeerRequest::DirInfo(dir)).await? {
                PeerReply::Dir(c) => Ok((c, true)),
                other => Err(TalonError::Unavailable(format!(
                    "unexpected reply {other:?}"
                ))),
            },
        }
    }

    /// The class of `dir`, checking that `(dir, name)` belongs to partition `p`.
    async fn entry_class(
        &self,
        part: &Partition,
        dir: Ino,
        name: &[u8],
    ) -> Result<(Class, bool), TalonError> {
        let (class, learn) = self.dir_class(part, dir).await?;
        let want = entry_partition(dir, name, class, self.partitions_count());
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
    async fn read_inode(&self, ino: Ino) -> Result<Option<InodeRec>, TalonError> {
        match self.peer(ino.home(), PeerRequest::ReadInode(ino)).await? {
            PeerReply::Inode(r) => Ok(r),
            other => Err(TalonError::Unavailable(format!(
                "unexpected reply {other:?}"
            ))),
        }
    }

    async fn read_dentry(
        &self,
        p: u32,
        parent: Ino,
        name: &[u8],
    ) -> Result<Option<Dentry>, TalonError> {
        match self
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
    async fn attr_of(&self, part: &Partition, ino: Ino) -> Result<Attr, TalonError> {
        let rec = if ino.home() == part.id {
            part.store.read(|v| v.inode(ino)).map_err(storage_error)?
        } else {
            self.read_inode(ino).await?
        };
        rec.map(|r| r.attr)
            .ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))
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
        let part = self.local(p)?;
        self.read_guard(part, relaxed, epoch).await?;
        // Validate placement when the class is known here; an unknown parent is not
        // fetched for a read (absent entries answer ENOENT either way).
        let known_class = if parent.home() == p {
            part.store
                .read(|v| v.inode(parent))
                .map_err(storage_error)?
                .map(|r| r.attr.class)
        } else {
            part.store
                .read(|v| {
                    v.get(&crate::keys::live_dir(parent))?
                        .map(|b| crate::apply::dec::<Class>(&b, "live dir"))
                        .transpose()
                })
                .map_err(storage_error)?
        };
        if let Some(c) = known_class {
            let want = entry_partition(parent, name, c, self.partitions_count());
            if want != p {
                return Err(TalonError::ClassChanged(format!(
                    "entry lives on partition {want} under {parent}'s class {}",
                    c.as_str()
                )));
            }
        }
        let (dentry, locked, cur_epoch) = part
            .store
            .read(|v| {
                let key = crate::keys::dentry(parent, name);
                let locked = v.get(&crate::keys::lock(&key))?.is_some();
                Ok((v.dentry(parent, name)?, locked, v.epoch()?))
            })
            .map_err(storage_error)?;
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
        Ok((self.attr_of(part, d.ino).await?, cur_epoch))
    }

    /// Attributes of `ino` (served by its home partition).
    pub async fn getattr(
        &self,
        p: u32,
        relaxed: bool,
        epoch: u64,
        ino: Ino,
    ) -> Result<Attr, TalonError> {
        let part = self.home_part(p, ino)?;
        self.read_guard(part, relaxed, epoch).await?;
        self.attr_of(part, ino).await
    }

    /// Applies a setattr at the inode's home.
    pub async fn setattr(
        &self,
        p: u32,
        epoch: u64,
        ino: Ino,
        change: AttrChange,
    ) -> Result<Attr, TalonError> {
        self.home_part(p, ino)?;
        let ops = vec![
            Op::ExpectEpoch(epoch),
            Op::SetAttr {
                ino,
                change,
                now: Time::now(),
            },
        ];
        let out = self
            .run_ops(p, BTreeMap::from([(p, ops)]), || async { Ok(()) })
            .await?;
        outcome_attr(&out, ino).ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))
    }

    /// Plans a create of `name` in `parent` on `part`.
    async fn plan_create(
        &self,
        part: &Partition,
        epoch: u64,
        parent: Ino,
        name: &[u8],
        spec: &CreateSpec,
    ) -> Result<Vec<Op>, TalonError> {
        check_name(name)?;
        if spec.kind == FileKind::Symlink {
            validate_symlink_target(&spec.symlink)
                .map_err(|e| posix(e, "invalid symlink target"))?;
        }
        let (pclass, learn) = self.entry_class(part, parent, name).await?;
        let class = match spec.kind {
            FileKind::Directory => spec.class.unwrap_or(pclass),
            _ => pclass,
        };
        let now = Time::now();
        let size = if spec.kind == FileKind::Symlink {
            spec.symlink.len() as u64
        } else {
            0
        };
        let attr = fresh_attr(
            spec.kind, spec.perm, spec.uid, spec.gid, spec.rdev, size, class, parent, now,
        );
        let mut ops = vec![
            Op::ExpectEpoch(epoch),
            Op::ExpectDirLive {
                dir: parent,
                class: pclass,
                learn,
            },
            Op::ExpectDentry {
                parent,
                name: name.to_vec(),
                expect: Expect::Absent,
            },
            Op::NewInode {
                attr: Box::new(attr),
                symlink: spec.symlink.clone(),
                creator: spec.request_id,
            },
            Op::PutDentry {
                parent,
                name: name.to_vec(),
                target: Target::New(0),
                kind: spec.kind,
            },
        ];
        if parent.home() == part.id {
            let nlink = i32::from(spec.kind == FileKind::Directory);
            ops.push(Op::TouchDir {
                dir: parent,
                nlink,
                now,
            });
        }
        Ok(ops)
    }

    /// Creates a file, directory, symlink or special file.
    pub async fn create(
        &self,
        p: u32,
        epoch: u64,
        parent: Ino,
        name: &[u8],
        spec: &CreateSpec,
    ) -> Result<(Attr, u64), TalonError> {
        let part = self.local(p)?;
        let ops = self.plan_create(part, epoch, parent, name, spec).await?;
        let res = part.propose(crate::types::Command::Atomic(ops)).await?;
        self.finish_create(part, epoch, parent, name, spec, res)
            .await
    }

    /// Answers a create in `parent` from its proposal's result.
    async fn finish_create(
        &self,
        part: &Partition,
        epoch: u64,
        parent: Ino,
        name: &[u8],
        spec: &CreateSpec,
        res: CommandResult,
    ) -> Result<(Attr, u64), TalonError> {
        match res {
            CommandResult::Applied(o) => {
                let ino =
                    o.new_inos.first().copied().ok_or_else(|| {
                        TalonError::Unavailable("create allocated no inode".into())
                    })?;
                if parent.home() != part.id {
                    let nlink = i32::from(spec.kind == FileKind::Directory);
                    self.touch_parent(parent, nlink, Time::now()).await;
                }
                let attr = o.attr(ino).cloned().ok_or_else(|| {
                    TalonError::Unavailable("create returned no attributes".into())
                })?;
                Ok((attr, o.epoch))
            }
            CommandResult::Failed(crate::types::ApplyError::Posix(errno, msg))
                if Errno(errno) == Errno::EEXIST =>
            {
                let own_retry = spec.request_id != 0;
                let open_existing = !spec.exclusive && spec.kind == FileKind::Regular;
                if !own_retry && !open_existing {
                    return Err(posix(Errno::EEXIST, msg));
                }
                let (attr, e) = self.lookup(part.id, false, epoch, parent, name).await?;
                if own_retry && self.created_by(part, attr.ino, spec.request_id).await? {
                    return Ok((attr, e));
                }
                match attr.kind {
                    _ if !open_existing => Err(posix(Errno::EEXIST, msg)),
                    FileKind::Directory => {
                        Err(posix(Errno::EISDIR, "a directory of that name exists"))
                    }
                    _ => Ok((attr, e)),
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

    /// Many creates for one partition: planned separately, proposed concurrently so the
    /// proposer merges them into one Raft entry. Results in input order.
    pub async fn create_batch(
        &self,
        p: u32,
        epoch: u64,
        items: Vec<(Ino, Vec<u8>, CreateSpec)>,
    ) -> Result<Vec<Result<Attr, TalonError>>, TalonError> {
        let part = self.local(p)?;
        let futs = items.into_iter().map(|(parent, name, spec)| async move {
            let ops = self.plan_create(part, epoch, parent, &name, &spec).await?;
            let res = part.propose(crate::types::Command::Atomic(ops)).await?;
            self.finish_create(part, epoch, parent, &name, &spec, res)
                .await
                .map(|(a, _)| a)
        });
        Ok(futures::future::join_all(futs).await)
    }

    /// The record of client request `id` on `part`, if a copy of it was applied there.
    fn applied(&self, part: &Partition, id: u64) -> Result<Option<RequestRec>, TalonError> {
        if id == 0 {
            return Ok(None);
        }
        part.store.read(|v| v.request(id)).map_err(storage_error)
    }

    /// Settles one attempt `r` of client request `id`: a refusal (an errno, a stale epoch,
    /// a conflict) is answered by `done` instead when a copy of the request was applied
    /// meanwhile (its answer was lost, and the copy's effect is what made this one fail),
    /// and re-planned while a copy is still prepared in a transaction.
    async fn settle<T, D, F>(
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
    async fn removed(&self, rec: RequestRec) -> Result<(Ino, u32), TalonError> {
        let nlink = match self.read_inode(rec.ino).await {
            Ok(Some(r)) if r.attr.kind != FileKind::Directory => r.attr.nlink,
            _ => 0,
        };
        Ok((rec.ino, nlink))
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
    ) -> Result<(Ino, u32), TalonError> {
        check_name(name)?;
        let part = self.local(p)?;
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
    ) -> Result<(Ino, u32), TalonError> {
        // Refuses an entry this partition does not hold (class changed, not hosted).
        self.entry_class(part, parent, name).await?;
        part.linearizable().await?;
        if let Some(rec) = self.applied(part, request)? {
            return self.removed(rec).await;
        }
        let d = part
            .store
            .read(|v| v.dentry(parent, name))
            .map_err(storage_error)?
            .ok_or_else(|| {
                posix(
                    Errno::ENOENT,
                    format!("no entry {:?}", String::from_utf8_lossy(name)),
                )
            })?;
        let now = Time::now();
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
            self.plan_dir_removal(&mut parts, d.ino, attr.class);
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
        let out = self.run_ops(p, parts, || async { Ok(()) }).await?;
        if !(single && parent.home() == p) {
            self.touch_parent(parent, -i32::from(directory), now).await;
        }
        let nlink = outcome_attr(&out, d.ino).map(|a| a.nlink).unwrap_or(0);
        Ok((d.ino, nlink))
    }

    /// Adds the ops that remove directory `dir`: emptiness checked (and fenced) wherever its
    /// entries may live, a tombstone on every partition, the inode dropped at its home.
    fn plan_dir_removal(&self, parts: &mut BTreeMap<u32, Vec<Op>>, dir: Ino, class: Class) {
        let n = self.partitions_count();
        let may_hold = dir_partitions(dir, class, n);
        for q in 0..n {
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

    /// Renames `(sp, sn)` to `(dp, dn)`; served by the source entry's partition.
    /// `request`: the client's id for this rename (0: none), see the module header.
    #[allow(clippy::too_many_arguments)]
    pub async fn rename(
        &self,
        p: u32,
        epoch: u64,
        sp: Ino,
        sn: &[u8],
        dp: Ino,
        dn: &[u8],
        flags: u32,
        request: u64,
    ) -> Result<u64, TalonError> {
        check_name(sn)?;
        check_name(dn)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == (RENAME_NOREPLACE | RENAME_EXCHANGE)
        {
            return Err(posix(Errno::EINVAL, format!("rename flags {flags:#x}")));
        }
        let part = self.local(p)?;
        let renamed = |_| async { part.store.epoch().map_err(storage_error) };
        replan("rename", 30, || async {
            let r = self
                .rename_once(part, epoch, (sp, sn), (dp, dn), flags, request)
                .await;
            self.settle(part, request, r, renamed).await
        })
        .await
    }

    async fn rename_once(
        &self,
        part: &Partition,
        epoch: u64,
        (sp, sn): (Ino, &[u8]),
        (dp, dn): (Ino, &[u8]),
        flags: u32,
        request: u64,
    ) -> Result<u64, TalonError> {
        let ps = part.id;
        self.entry_class(part, sp, sn).await?;
        let (dclass, _) = self.dir_class(part, dp).await?;
        let pd = entry_partition(dp, dn, dclass, self.partitions_count());
        part.linearizable().await?;
        let (src, cur_epoch) = part
            .store
            .read(|v| Ok((v.dentry(sp, sn)?, v.epoch()?)))
            .map_err(storage_error)?;
        if self.applied(part, request)?.is_some() {
            return Ok(cur_epoch);
        }
        let src = src.ok_or_else(|| {
            posix(
                Errno::ENOENT,
                format!("no entry {:?}", String::from_utf8_lossy(sn)),
            )
        })?;
        if epoch != 0 && epoch < cur_epoch {
            return Err(TalonError::StaleEpoch { epoch: cur_epoch });
        }
        if sp == dp && sn == dn {
            return Ok(cur_epoch);
        }
        let dst = if pd == ps {
            part.store
                .read(|v| v.dentry(dp, dn))
                .map_err(storage_error)?
        } else {
            self.read_dentry(pd, dp, dn).await?
        };
        let exchange = flags & RENAME_EXCHANGE != 0;
        match (&dst, exchange) {
            (Some(_), false) if flags & RENAME_NOREPLACE != 0 => {
                return Err(posix(Errno::EEXIST, "destination exists"))
            }
            (None, true) => return Err(posix(Errno::ENOENT, "exchange with a missing entry")),
            _ => {}
        }
        if let Some(d) = &dst {
            if d.ino == src.ino {
                // Two links to one inode: POSIX says do nothing.
                return Ok(cur_epoch);
            }
            if !exchange {
                match (
                    src.kind == FileKind::Directory,
                    d.kind == FileKind::Directory,
                ) {
                    (true, false) => {
                        return Err(posix(
                            Errno::ENOTDIR,
                            "cannot replace a non-directory with a directory",
                        ))
                    }
                    (false, true) => {
                        return Err(posix(
                            Errno::EISDIR,
                            "cannot replace a directory with a non-directory",
                        ))
                    }
                    _ => {}
                }
            }
        }
        let now = Time::now();
        let mut parts: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
        let source_ops = parts.entry(ps).or_default();
        source_ops.extend([
            Op::ExpectEpoch(epoch),
            Op::ExpectDentry {
                parent: sp,
                name: sn.to_vec(),
                expect: Expect::Ino(src.ino),
            },
        ]);
        record_request(source_ops, request, src.ino);
        parts.entry(pd).or_default().extend([
            Op::ExpectDirLive {
                dir: dp,
                class: dclass,
                learn: true,
            },
            Op::ExpectDentry {
                parent: dp,
                name: dn.to_vec(),
                expect: destination_guard(dst.as_ref().map(|d| d.ino), flags),
            },
        ]);
        // The source name goes away, or (exchange) points at the destination's inode.
        match (&dst, exchange) {
            (Some(d), true) => parts.entry(ps).or_default().push(Op::PutDentry {
                parent: sp,
                name: sn.to_vec(),
                target: Target::Existing(d.ino),
                kind: d.kind,
            }),
            _ => parts.entry(ps).or_default().push(Op::DelDentry {
                parent: sp,
                name: sn.to_vec(),
            }),
        }
        parts.entry(pd).or_default().push(Op::PutDentry {
            parent: dp,
            name: dn.to_vec(),
            target: Target::Existing(src.ino),
            kind: src.kind,
        });
        let mut moves_dir = false;
        let mut nlink_delta: BTreeMap<Ino, i32> = BTreeMap::new();
        if src.kind == FileKind::Directory {
            moves_dir = true;
            parts
                .entry(src.ino.home())
                .or_default()
                .push(relink(src.ino, 0, Some(dp), now));
            if sp != dp {
                *nlink_delta.entry(sp).or_default() -= 1;
                *nlink_delta.entry(dp).or_default() += 1;
            }
        } else {
            parts
                .entry(src.ino.home())
                .or_default()
                .push(relink(src.ino, 0, None, now));
        }
        if let Some(d) = &dst {
            if exchange {
                if d.kind == FileKind::Directory {
                    moves_dir = true;
                    parts
                        .entry(d.ino.home())
                        .or_default()
                        .push(relink(d.ino, 0, Some(sp), now));
                    if sp != dp {
                        *nlink_delta.entry(dp).or_default() -= 1;
                        *nlink_delta.entry(sp).or_default() += 1;
                    }
                }
            } else if d.kind == FileKind::Directory {
                let attr = self
                    .read_inode(d.ino)
                    .await?
                    .ok_or_else(|| TalonError::Retry("destination changed".into()))?;
                self.plan_dir_removal(&mut parts, d.ino, attr.attr.class);
                *nlink_delta.entry(dp).or_default() -= 1;
            } else {
                parts
                    .entry(d.ino.home())
                    .or_default()
                    .push(relink(d.ino, -1, None, now));
            }
        }
        if moves_dir {
            // Every cached path below the moved directory is now stale: bump the epoch on
            // every partition (this also serializes directory renames: the epoch key is
            // locked while prepared, so the loop check below cannot race another move).
            for q in 0..self.partitions_count() {
                parts.entry(q).or_default().push(Op::BumpEpoch(0));
            }
        }
        let moved: Vec<Ino> = [Some(&src), if exchange { dst.as_ref() } else { None }]
            .into_iter()
            .flatten()
            .filter(|d| d.kind == FileKind::Directory)
            .map(|d| d.ino)
            .collect();
        let check = || async {
            // A directory must not move below itself: walk up from each new parent.
            for (dir, new_parent) in moved
                .iter()
                .map(|m| (*m, if *m == src.ino { dp } else { sp }))
            {
                self.check_not_ancestor(dir, new_parent).await?;
            }
            Ok(())
        };
        let out = self.run_ops(ps, parts, check).await?;
        let mut touches = nlink_delta;
        touches.entry(sp).or_default();
        touches.entry(dp).or_default();
        futures::future::join_all(
            touches
                .into_iter()
                .map(|(dir, delta)| self.touch_parent(dir, delta, now)),
        )
        .await;
        Ok(outcome_epoch(&out).max(cur_epoch))
    }

    /// EINVAL if `dir` is `start` or one of its ancestors. Reads parent pointers at their
    /// homes regardless of locks: only directory renames change them, and those are
    /// serialized by the epoch lock the caller holds.
    async fn check_not_ancestor(&self, dir: Ino, start: Ino) -> Result<(), TalonError> {
        let mut cur = start;
        for _ in 0..MAX_DEPTH {
            if cur == dir {
                return Err(posix(Errno::EINVAL, "cannot move a directory below itself"));
            }
            if cur == ROOT_INO {
                return Ok(());
            }
            let rec = self
                .read_inode(cur)
                .await?
                .ok_or_else(|| posix(Errno::ENOENT, format!("directory {cur} vanished")))?;
            cur = rec.attr.parent;
        }
        Err(posix(Errno::ELOOP, "directory chain too deep"))
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
        let part = self.local(p)?;
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
        let now = Time::now();
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
        let out = self.run_ops(p, parts, || async { Ok(()) }).await?;
        self.touch_parent(np, 0, now).await;
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
        let part = self.local(p)?;
        self.read_guard(part, relaxed, epoch).await?;
        if !relaxed {
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
        let limit = limit.clamp(1, self.config.cluster.max_batch) as usize;
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

    /// Reads an xattr (or, for `talon.symlink`, a symlink's target).
    pub async fn getxattr(
        &self,
        p: u32,
        relaxed: bool,
        epoch: u64,
        ino: Ino,
        name: &[u8],
    ) -> Result<Vec<u8>, TalonError> {
        let part = self.home_part(p, ino)?;
        self.read_guard(part, relaxed, epoch).await?;
        let (rec, val) = part
            .store
            .read(|v| Ok((v.inode(ino)?, v.get(&crate::keys::xattr(ino, name))?)))
            .map_err(storage_error)?;
        let rec = rec.ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))?;
        if name == SYMLINK_XATTR {
            return if rec.attr.kind == FileKind::Symlink {
                Ok(rec.symlink)
            } else {
                Err(posix(Errno::EINVAL, "not a symlink"))
            };
        }
        val.ok_or_else(|| posix(Errno::ENODATA, "no such xattr"))
    }

    /// Names of an inode's xattrs.
    pub async fn listxattr(
        &self,
        p: u32,
        relaxed: bool,
        epoch: u64,
        ino: Ino,
    ) -> Result<Vec<Vec<u8>>, TalonError> {
        let part = self.home_part(p, ino)?;
        self.read_guard(part, relaxed, epoch).await?;
        let prefix = crate::keys::xattr_prefix(ino);
        let (rec, keys) = part
            .store
            .read(|v| Ok((v.inode(ino)?, v.keys_with_prefix(&prefix)?)))
            .map_err(storage_error)?;
        rec.ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))?;
        Ok(keys
            .into_iter()
            .map(|k| k[prefix.len()..].to_vec())
            .collect())
    }

    /// Sets (value Some) or removes an xattr.
    #[allow(clippy::too_many_arguments)]
    pub async fn setxattr(
        &self,
        p: u32,
        epoch: u64,
        ino: Ino,
        name: &[u8],
        value: Option<Vec<u8>>,
        flags: u32,
        request: u64,
    ) -> Result<(), TalonError> {
        let part = self.home_part(p, ino)?;
        if name.is_empty() || name.len() > 255 || name.contains(&0) {
            return Err(posix(
                Errno::ERANGE,
                "xattr name must be 1..=255 bytes without NUL",
            ));
        }
        if name.starts_with(b"talon.") {
            return Err(posix(
                Errno::EPERM,
                "the talon. xattr namespace is reserved",
            ));
        }
        if value.as_ref().is_some_and(|v| v.len() > XATTR_VALUE_MAX) {
            return Err(posix(Errno::E2BIG, "xattr value over 64 KiB"));
        }
        if flags & !3 != 0 || flags == 3 {
            return Err(posix(Errno::EINVAL, format!("xattr flags {flags:#x}")));
        }
        if self.applied(part, request)?.is_some() {
            return Ok(());
        }
        let mut ops = vec![
            Op::ExpectEpoch(epoch),
            Op::Xattr {
                ino,
                name: name.to_vec(),
                value,
                flags,
                now: Time::now(),
            },
        ];
        record_request(&mut ops, request, ino);
        let r = self
            .run_ops(p, BTreeMap::from([(p, ops)]), || async { Ok(()) })
            .await
            .map(|_| ());
        self.settle(part, request, r, |_| async { Ok(()) }).await
    }

    /// The hosted replica of `ino`'s home partition `p`, or WrongPartition if `p` is not it.
    pub(crate) fn home_part(&self, p: u32, ino: Ino) -> Result<&Partition, TalonError> {
        if ino.home() != p {
            return Err(TalonError::WrongPartition(format!(
                "inode {ino} lives on partition {}",
                ino.home()
            )));
        }
        Ok(self.local(p)?.as_ref())
    }

    /// Usage of partition `p`: (inodes, entries).
    pub async fn statfs(&self, p: u32, relaxed: bool) -> Result<(u64, u64), TalonError> {
        let part = self.local(p)?;
        self.read_guard(part, relaxed, 0).await?;
        part.store
            .read(|v| {
                Ok((
                    v.counter(crate::keys::meta::INODES)?,
                    v.counter(crate::keys::meta::ENTRIES)?,
                ))
            })
            .map_err(storage_error)
    }

    /// Changes the class of an empty directory.
    pub async fn set_class(
        &self,
        p: u32,
        epoch: u64,
        dir: Ino,
        class: Class,
    ) -> Result<Attr, TalonError> {
        let part = self.home_part(p, dir)?;
        part.linearizable().await?;
        let attr = self.attr_of(part, dir).await?;
        if attr.kind != FileKind::Directory {
            return Err(posix(Errno::ENOTDIR, "not a directory"));
        }
        if attr.class == class {
            return Ok(attr);
        }
        let n = self.partitions_count();
        let may_hold = dir_partitions(dir, attr.class, n);
        let mut parts: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
        for q in 0..n {
            let ops = parts.entry(q).or_default();
            if may_hold.contains(&q) {
                ops.push(Op::ExpectEmpty(dir));
            }
            ops.push(Op::Relearn { dir, class });
        }
        parts
            .entry(p)
            .or_default()
            .extend([Op::ExpectEpoch(epoch), Op::SetClass { dir, class }]);
        let out = self
            .run_ops(p, parts, || async { Ok(()) })
            .await
            .map_err(|e| match e {
                TalonError::Posix {
                    errno: Errno::ENOTEMPTY,
                    ..
                } => posix(
                    Errno::ENOTEMPTY,
                    "the class of a non-empty directory cannot change",
                ),
                other => other,
            })?;
        outcome_attr(&out, dir).ok_or_else(|| posix(Errno::ENOENT, "directory vanished"))
    }
}
