//! Deterministic application of commands to a partition's state: the checks of each op,
//! the locks of prepared transactions, and the mutations.
//!
//! It must not touch a database but through a `View` (`view.rs`), nor define stored
//! records (`records.rs`) or keys (`keys.rs`).
//!
//! `Applier` runs over a `View`: the store (`kv.rs`) plus the writes staged by earlier
//! commands of the same apply call, plus this command's own staged writes. A command
//! either succeeds and its writes join the call's batch, or fails and its writes are
//! dropped; the caller writes the whole batch, with the applied log id, in one RocksDB
//! WriteBatch. Apply reads nothing but the state and the command, so replicas agree.
//!
//! Invariants kept here:
//! - a dentry or inode key locked by a prepared transaction changes only through that
//!   transaction's `Finish`;
//! - an rmdir fence (`F` ‖ dir) blocks creates under the directory until the rmdir ends;
//! - a tombstoned directory never gets a child again;
//! - inos come from the partition's counter, which only grows.

use crate::keys::{self, meta};
use crate::kv::{Kv, Overlay};
use crate::records::{
    dec, enc, BodyRec, BodyView, ChunkTime, ChunkView, Dentry, Fatal, InodeRec, PreparedRec,
    RequestRec,
};
use crate::types::{
    ApplyError, AttrChange, Command, CommandResult, Expect, Op, Outcome, Target, TxId,
};
use crate::view::{any_holds_at, holds_at, View};
use talon_model::attr::without_setid;
use talon_model::{Attr, ChunkRef, Class, Errno, FileKind, Ino, Layout, Time, XattrFlags};

/// The most blocks a chunk can have (`keys::CHUNK_BLOCK`).
const MAX_CHUNK_BLOCKS: u32 = crate::config::MAX_CHUNK_SIZE / keys::CHUNK_BLOCK as u32;

/// The keys a prepared op list locks.
pub fn lock_keys(ops: &[Op]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for op in ops {
        let k = match op {
            Op::ExpectDentry { parent, name, .. }
            | Op::PutDentry { parent, name, .. }
            | Op::DelDentry { parent, name } => keys::dentry(*parent, name),
            Op::ExpectEmpty(dir) | Op::Tombstone(dir) => keys::fence(*dir),
            Op::ExpectInode { ino, .. }
            | Op::AdjustInode { ino, .. }
            | Op::DropInode(ino)
            | Op::SetAttr { ino, .. }
            | Op::Xattr { ino, .. }
            | Op::WriteBody { ino, .. }
            | Op::CommitLayout { ino, .. }
            | Op::ReclaimDropped { ino, .. }
            | Op::DropPrivileges { ino, .. } => keys::inode(*ino),
            Op::SetClass { dir, .. } => keys::inode(*dir),
            Op::BumpEpoch(_) => keys::EPOCH_LOCK.to_vec(),
            Op::RecordRequest { id, .. } => keys::request(*id),
            Op::ExpectEpoch(_)
            | Op::ExpectDirLive { .. }
            | Op::NewInode { .. }
            | Op::Relearn { .. }
            | Op::PutChunk { .. }
            | Op::DropChunks(_)
            | Op::ReclaimUnlinked(_)
            | Op::ForgetRequests(_)
            | Op::HoldOpen { .. }
            | Op::EndOpens(_)
            | Op::ExpectView { .. }
            | Op::TouchDir { .. } => continue,
        };
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// Applies commands of one partition.
pub struct Applier {
    /// The partition this state machine belongs to.
    pub partition: u32,
}

fn posix(errno: Errno, msg: impl Into<String>) -> ApplyError {
    ApplyError::posix(errno, msg)
}

fn name_str(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

impl Applier {
    /// Applies one command; its writes are staged into `batch` only if it succeeds.
    pub fn apply(
        &self,
        kv: &dyn Kv,
        batch: &mut Overlay,
        cmd: &Command,
    ) -> Result<CommandResult, Fatal> {
        if let Command::Batch(cmds) = cmd {
            let mut out = Vec::with_capacity(cmds.len());
            for c in cmds {
                out.push(self.apply(kv, batch, c)?);
            }
            return Ok(CommandResult::Batch(out));
        }
        let mut view = View::new(kv, batch);
        let res = self.apply_one(&mut view, cmd)?;
        if !matches!(res, CommandResult::Failed(_)) {
            let writes = view.into_writes();
            batch.extend(writes);
        }
        Ok(res)
    }

    fn apply_one(&self, v: &mut View<'_>, cmd: &Command) -> Result<CommandResult, Fatal> {
        match cmd {
            Command::Noop | Command::Batch(_) => Ok(CommandResult::None),
            Command::Atomic(ops) => {
                if let Err(e) = self.check(v, ops, None)? {
                    return Ok(CommandResult::Failed(e));
                }
                let new_inos = self.allocate(v, ops)?;
                let out = self.mutate(v, ops, &new_inos)?;
                Ok(match out {
                    Ok(o) => CommandResult::Applied(o),
                    Err(e) => CommandResult::Failed(e),
                })
            }
            Command::Prepare { txid, ops, at_ms } => {
                let pk = keys::prepared(*txid);
                if let Some(b) = v.get(&pk)? {
                    // A retried prepare: answer as the first time.
                    let rec: PreparedRec = dec(&b, "prepared")?;
                    let epoch = v.epoch()?;
                    return Ok(CommandResult::Prepared {
                        new_inos: rec.new_inos,
                        epoch,
                    });
                }
                if v.get(&keys::decision(*txid))?.is_some() && txid.coordinator == self.partition {
                    // Already decided here (recovery aborted it): refuse a late prepare.
                    return Ok(CommandResult::Failed(ApplyError::Locked(format!(
                        "transaction {txid} already decided"
                    ))));
                }
                if let Err(e) = self.check(v, ops, Some(*txid))? {
                    return Ok(CommandResult::Failed(e));
                }
                let new_inos = self.allocate(v, ops)?;
                let locks = lock_keys(ops);
                for k in &locks {
                    v.put(keys::lock(k), enc(txid));
                }
                let rec = PreparedRec {
                    ops: ops.clone(),
                    new_inos: new_inos.clone(),
                    locks,
                    at_ms: *at_ms,
                };
                v.put(pk, enc(&rec));
                let epoch = v.epoch()?;
                Ok(CommandResult::Prepared { new_inos, epoch })
            }
            Command::Decide { txid, commit } => {
                let dk = keys::decision(*txid);
                if let Some(b) = v.get(&dk)? {
                    return Ok(CommandResult::Decided(b.first() == Some(&1)));
                }
                v.put(dk, vec![u8::from(*commit)]);
                Ok(CommandResult::Decided(*commit))
            }
            Command::Finish { txid, commit } => {
                let pk = keys::prepared(*txid);
                let Some(b) = v.get(&pk)? else {
                    return Ok(CommandResult::Applied(Outcome {
                        epoch: v.epoch()?,
                        ..Outcome::default()
                    }));
                };
                let rec: PreparedRec = dec(&b, "prepared")?;
                for k in &rec.locks {
                    v.del(keys::lock(k));
                }
                v.del(pk);
                if !commit {
                    return Ok(CommandResult::Applied(Outcome {
                        epoch: v.epoch()?,
                        ..Outcome::default()
                    }));
                }
                // Preconditions held at prepare and the locks kept them true.
                match self.mutate(v, &rec.ops, &rec.new_inos)? {
                    Ok(o) => Ok(CommandResult::Applied(o)),
                    Err(e) => Err(Fatal::Corrupt(format!(
                        "prepared transaction {txid} failed at commit: {e:?}"
                    ))),
                }
            }
        }
    }

    /// Checks preconditions and locks. `Ok(Err(_))` is a refusal; `Err(_)` is fatal.
    fn check(
        &self,
        v: &View<'_>,
        ops: &[Op],
        txid: Option<TxId>,
    ) -> Result<Result<(), ApplyError>, Fatal> {
        let held_by_other = |t: Option<TxId>| t.is_some() && t != txid;
        for k in lock_keys(ops) {
            if let Some(t) = v.locked(&k)? {
                if Some(t) != txid {
                    return Ok(Err(ApplyError::Locked(format!(
                        "key held by transaction {t}"
                    ))));
                }
            }
        }
        for op in ops {
            match op {
                Op::ExpectEpoch(e) => {
                    let cur = v.epoch()?;
                    if *e != 0 && *e < cur {
                        return Ok(Err(ApplyError::StaleEpoch(cur)));
                    }
                }
                Op::ExpectDirLive { dir, learn, .. } => {
                    if v.get(&keys::tombstone(*dir))?.is_some() {
                        return Ok(Err(posix(
                            Errno::ENOENT,
                            format!("directory {dir} was removed"),
                        )));
                    }
                    if held_by_other(v.locked(&keys::fence(*dir))?) {
                        return Ok(Err(ApplyError::Locked(format!(
                            "directory {dir} is being removed"
                        ))));
                    }
                    if dir.home() == self.partition {
                        match v.inode(*dir)? {
                            None => {
                                return Ok(Err(posix(Errno::ENOENT, format!("no directory {dir}"))))
                            }
                            Some(r) if r.attr.kind != FileKind::Directory => {
                                return Ok(Err(posix(
                                    Errno::ENOTDIR,
                                    format!("{dir} is not a directory"),
                                )))
                            }
                            Some(_) => {}
                        }
                    } else if !learn && v.get(&keys::live_dir(*dir))?.is_none() {
                        return Ok(Err(ApplyError::Invalid(format!(
                            "directory {dir} unknown on partition {}",
                            self.partition
                        ))));
                    }
                }
                Op::ExpectDentry {
                    parent,
                    name,
                    expect,
                } => {
                    let cur = v.dentry(*parent, name)?;
                    match (expect, cur) {
                        (Expect::Absent, Some(_)) => {
                            return Ok(Err(posix(
                                Errno::EEXIST,
                                format!("{} exists", name_str(name)),
                            )))
                        }
                        (Expect::Ino(_), None) => {
                            return Ok(Err(posix(
                                Errno::ENOENT,
                                format!("no entry {}", name_str(name)),
                            )))
                        }
                        (Expect::Ino(i), Some(d)) if d.ino != *i => {
                            return Ok(Err(ApplyError::Locked(format!(
                                "entry {} changed under the operation",
                                name_str(name)
                            ))))
                        }
                        (Expect::AsPlanned(planned), cur)
                            if cur.as_ref().map(|d| d.ino) != *planned =>
                        {
                            return Ok(Err(ApplyError::Locked(format!(
                                "entry {} changed under the operation",
                                name_str(name)
                            ))))
                        }
                        _ => {}
                    }
                }
                Op::ExpectEmpty(dir) => {
                    if v.prefix_any(&keys::lock(&keys::dentry_prefix(*dir)))? {
                        return Ok(Err(ApplyError::Locked(format!(
                            "an entry of directory {dir} is being changed"
                        ))));
                    }
                    if v.prefix_any(&keys::dentry_prefix(*dir))? {
                        return Ok(Err(posix(Errno::ENOTEMPTY, "directory not empty")));
                    }
                }
                Op::ExpectInode { ino, kind } => match (v.inode(*ino)?, kind) {
                    (None, _) => return Ok(Err(posix(Errno::ENOENT, format!("no inode {ino}")))),
                    (Some(r), Some(k)) if r.attr.kind != *k => {
                        let errno = if *k == FileKind::Directory {
                            Errno::ENOTDIR
                        } else if r.attr.kind == FileKind::Directory {
                            Errno::EISDIR
                        } else {
                            Errno::EINVAL
                        };
                        return Ok(Err(posix(
                            errno,
                            format!("inode {ino} is a {:?}", r.attr.kind),
                        )));
                    }
                    _ => {}
                },
                Op::SetAttr { ino, change, .. } => match v.inode(*ino)? {
                    None => return Ok(Err(posix(Errno::ENOENT, format!("no inode {ino}")))),
                    Some(r) if change.size.is_some() && r.attr.kind == FileKind::Directory => {
                        return Ok(Err(posix(
                            Errno::EISDIR,
                            "cannot set the size of a directory",
                        )))
                    }
                    Some(r) if change.size.is_some() && r.attr.kind != FileKind::Regular => {
                        return Ok(Err(posix(Errno::EINVAL, "size of a special file")))
                    }
                    _ => {}
                },
                Op::Xattr {
                    ino,
                    name,
                    value,
                    flags,
                    ..
                } => {
                    if v.inode(*ino)?.is_none() {
                        return Ok(Err(posix(Errno::ENOENT, format!("no inode {ino}"))));
                    }
                    let exists = v.get(&keys::xattr(*ino, name))?.is_some();
                    if value.is_some() && *flags == XattrFlags::Create.bits() && exists {
                        return Ok(Err(posix(Errno::EEXIST, "xattr exists")));
                    }
                    if (value.is_none() || *flags == XattrFlags::Replace.bits()) && !exists {
                        return Ok(Err(posix(Errno::ENODATA, "no such xattr")));
                    }
                }
                Op::AdjustInode { ino, nlink, .. } => match v.inode(*ino)? {
                    None => return Ok(Err(posix(Errno::ENOENT, format!("no inode {ino}")))),
                    Some(r) if *nlink > 0 && is_unlinked(&r.attr) => {
                        return Ok(Err(posix(
                            Errno::ENOENT,
                            format!("inode {ino} has been unlinked"),
                        )))
                    }
                    Some(_) => {}
                },
                Op::DropInode(ino) | Op::SetClass { dir: ino, .. } => {
                    if v.inode(*ino)?.is_none() {
                        return Ok(Err(posix(Errno::ENOENT, format!("no inode {ino}"))));
                    }
                }
                Op::WriteBody {
                    ino,
                    expect_generation,
                    ..
                }
                | Op::CommitLayout {
                    ino,
                    expect_generation,
                    ..
                } => {
                    let Some(r) = v.inode(*ino)? else {
                        return Ok(Err(posix(Errno::ENOENT, format!("no inode {ino}"))));
                    };
                    match r.attr.kind {
                        FileKind::Regular => {}
                        FileKind::Directory => {
                            return Ok(Err(posix(Errno::EISDIR, "is a directory")))
                        }
                        _ => return Ok(Err(posix(Errno::EINVAL, "not a regular file"))),
                    }
                    if *expect_generation != 0 && r.attr.generation != *expect_generation {
                        return Ok(Err(ApplyError::Locked(format!(
                            "inode {ino} is at generation {}, not {expect_generation}",
                            r.attr.generation
                        ))));
                    }
                    if let Op::CommitLayout { chunks, .. } = op {
                        if let Err(e) = check_view(v, ops, *ino, &r.layout, chunks)? {
                            return Ok(Err(e));
                        }
                    }
                }
                Op::ReclaimDropped {
                    ino,
                    chunks,
                    before_ms,
                    now_ms,
                } => {
                    if let Err(e) = check_reclaim(v, *ino, chunks, *before_ms, *now_ms)? {
                        return Ok(Err(e));
                    }
                }
                Op::RecordRequest { id, .. } => {
                    if v.get(&keys::request(*id))?.is_some() {
                        return Ok(Err(ApplyError::Locked(format!(
                            "request {id:#x} is already applied"
                        ))));
                    }
                }
                Op::NewInode { .. }
                | Op::PutDentry { .. }
                | Op::DelDentry { .. }
                | Op::Relearn { .. }
                | Op::Tombstone(_)
                | Op::BumpEpoch(_)
                | Op::PutChunk { .. }
                | Op::DropChunks(_)
                | Op::ReclaimUnlinked(_)
                | Op::ForgetRequests(_)
                | Op::EndOpens(_)
                | Op::ExpectView { .. }
                | Op::TouchDir { .. }
                | Op::DropPrivileges { .. } => {}
                Op::HoldOpen {
                    ino,
                    session,
                    renew,
                    now_ms,
                    ..
                } => {
                    if v.inode(*ino)?.is_none() {
                        return Ok(Err(posix(Errno::ENOENT, format!("no inode {ino}"))));
                    }
                    let until = v.open_hold(*ino, *session)?;
                    if *renew && until.is_none_or(|u| !holds_at(u, *now_ms)) {
                        return Ok(Err(posix(
                            Errno::EIO,
                            format!(
                                "the open session {session:x} of inode {ino} expired (not renewed \
                                 within its lease): chunks it stored may be gone"
                            ),
                        )));
                    }
                }
            }
        }
        Ok(Ok(()))
    }

    fn allocate(&self, v: &mut View<'_>, ops: &[Op]) -> Result<Vec<Ino>, Fatal> {
        let n = ops
            .iter()
            .filter(|o| matches!(o, Op::NewInode { .. }))
            .count();
        if n == 0 {
            return Ok(Vec::new());
        }
        // Counter 0 is never used; 1 on partition 0 is the root.
        let next = v.counter(meta::NEXT_INO)?.max(2);
        v.set_counter(meta::NEXT_INO, next + n as u64);
        Ok((0..n as u64)
            .map(|i| Ino::new(self.partition, next + i))
            .collect())
    }

    fn mutate(
        &self,
        v: &mut View<'_>,
        ops: &[Op],
        new_inos: &[Ino],
    ) -> Result<Result<Outcome, ApplyError>, Fatal> {
        let mut out = Outcome {
            new_inos: new_inos.to_vec(),
            ..Outcome::default()
        };
        let mut next_new = 0usize;
        let target = |t: &Target| -> Result<Ino, ApplyError> {
            match t {
                Target::Existing(i) => Ok(*i),
                Target::New(n) => new_inos
                    .get(*n as usize)
                    .copied()
                    .ok_or_else(|| ApplyError::Invalid(format!("no new inode #{n}"))),
            }
        };
        for op in ops {
            match op {
                Op::ExpectDirLive { dir, class, learn } => {
                    if *learn && dir.home() != self.partition {
                        v.put(keys::live_dir(*dir), enc(class));
                    }
                }
                Op::NewInode {
                    attr,
                    symlink,
                    creator,
                } => {
                    let Some(ino) = new_inos.get(next_new).copied() else {
                        return Ok(Err(ApplyError::Invalid("inode allocation mismatch".into())));
                    };
                    next_new += 1;
                    let mut attr = (**attr).clone();
                    attr.ino = ino;
                    v.put(
                        keys::inode(ino),
                        enc(&InodeRec {
                            attr: attr.clone(),
                            symlink: symlink.clone(),
                            creator: *creator,
                            layout: Layout::Small,
                        }),
                    );
                    v.add_counter(meta::INODES, 1)?;
                    out.attrs.push((ino, Some(attr)));
                }
                Op::PutDentry {
                    parent,
                    name,
                    target: t,
                    kind,
                } => {
                    let ino = match target(t) {
                        Ok(i) => i,
                        Err(e) => return Ok(Err(e)),
                    };
                    let k = keys::dentry(*parent, name);
                    if v.get(&k)?.is_none() {
                        v.add_counter(meta::ENTRIES, 1)?;
                    }
                    v.put(k, enc(&Dentry { ino, kind: *kind }));
                }
                Op::DelDentry { parent, name } => {
                    let k = keys::dentry(*parent, name);
                    if v.get(&k)?.is_some() {
                        v.add_counter(meta::ENTRIES, -1)?;
                        v.del(k);
                    }
                }
                Op::AdjustInode {
                    ino,
                    nlink,
                    parent,
                    touch_mtime,
                    now,
                } => {
                    let Some(mut rec) = v.inode(*ino)? else {
                        continue;
                    };
                    rec.attr.nlink = (rec.attr.nlink as i64 + *nlink as i64).max(0) as u32;
                    rec.attr.ctime = *now;
                    if *touch_mtime {
                        rec.attr.mtime = *now;
                    }
                    if let Some(p) = parent {
                        rec.attr.parent = *p;
                    }
                    if is_unlinked(&rec.attr) {
                        // Kept, readable by inode, until the collector reclaims it after
                        // the grace period (`ReclaimUnlinked`).
                        v.put(keys::unlinked(*ino), now.as_millis().to_le_bytes().to_vec());
                        v.put(keys::inode(*ino), enc(&rec));
                        out.attrs.push((*ino, None));
                    } else {
                        out.attrs.push((*ino, Some(rec.attr.clone())));
                        v.put(keys::inode(*ino), enc(&rec));
                    }
                }
                Op::DropInode(ino) => {
                    if v.inode(*ino)?.is_some() {
                        self.drop_inode(v, *ino)?;
                    }
                    out.attrs.push((*ino, None));
                }
                Op::SetAttr { ino, change, now } => {
                    let Some(mut rec) = v.inode(*ino)? else {
                        continue;
                    };
                    // Only a size change can take chunks out of the layout.
                    let old = change.size.map(|_| rec.layout.clone());
                    if let Some(size) = change.size {
                        self.truncate_contents(v, *ino, &mut rec, size)?;
                    }
                    apply_change(&mut rec.attr, change, *now);
                    if let Some(old) = &old {
                        note_dropped(v, *ino, old, &rec.layout, now, rec.attr.generation)?;
                    }
                    out.attrs.push((*ino, Some(rec.attr.clone())));
                    v.put(keys::inode(*ino), enc(&rec));
                }
                Op::Xattr {
                    ino,
                    name,
                    value,
                    now,
                    ..
                } => {
                    match value {
                        Some(val) => v.put(keys::xattr(*ino, name), val.clone()),
                        None => v.del(keys::xattr(*ino, name)),
                    }
                    if let Some(mut rec) = v.inode(*ino)? {
                        rec.attr.ctime = *now;
                        out.attrs.push((*ino, Some(rec.attr.clone())));
                        v.put(keys::inode(*ino), enc(&rec));
                    }
                }
                Op::SetClass { dir, class } => {
                    if let Some(mut rec) = v.inode(*dir)? {
                        rec.attr.class = *class;
                        out.attrs.push((*dir, Some(rec.attr.clone())));
                        v.put(keys::inode(*dir), enc(&rec));
                    }
                }
                Op::Relearn { dir, class } => {
                    let k = keys::live_dir(*dir);
                    if v.get(&k)?.is_some() {
                        v.put(k, enc(class));
                    }
                }
                Op::Tombstone(dir) => {
                    v.put(keys::tombstone(*dir), Vec::new());
                    v.del(keys::live_dir(*dir));
                }
                Op::BumpEpoch(e) => {
                    // Each directory rename moves every partition one epoch on (they all take
                    // part in it), so partitions agree on the epoch once it has finished.
                    let cur = v.epoch()?;
                    v.set_counter(meta::EPOCH, (cur + 1).max(*e));
                }
                Op::TouchDir { dir, nlink, now } => {
                    let Some(mut rec) = v.inode(*dir)? else {
                        continue;
                    };
                    if rec.attr.kind != FileKind::Directory {
                        continue;
                    }
                    rec.attr.nlink = (rec.attr.nlink as i64 + *nlink as i64).max(2) as u32;
                    rec.attr.mtime = rec.attr.mtime.max(*now);
                    rec.attr.ctime = rec.attr.ctime.max(*now);
                    v.put(keys::inode(*dir), enc(&rec));
                    out.attrs.push((*dir, Some(rec.attr)));
                }
                Op::WriteBody { ino, data, now, .. } => {
                    let Some(mut rec) = v.inode(*ino)? else {
                        continue;
                    };
                    v.add_counter(meta::BYTES, data.len() as i64 - rec.attr.size as i64)?;
                    rec.attr.size = data.len() as u64;
                    rec.attr.generation += 1;
                    rec.attr.mtime = *now;
                    rec.attr.ctime = *now;
                    let old = std::mem::replace(&mut rec.layout, Layout::Small);
                    note_dropped(v, *ino, &old, &rec.layout, now, rec.attr.generation)?;
                    let body = BodyView {
                        crc: crc32c::crc32c(data),
                        data,
                    };
                    v.put(keys::body(*ino), enc(&body));
                    out.attrs.push((*ino, Some(rec.attr.clone())));
                    v.put(keys::inode(*ino), enc(&rec));
                }
                Op::PutChunk {
                    ino,
                    write_id,
                    index,
                    data,
                    at_ms,
                } => {
                    // In blocks, each with its own checksum, so a read of a range reads and
                    // checks only its blocks; an empty chunk is one empty block.
                    let empty = data.is_empty().then_some(&data[..]);
                    let mut blocks = 0u32;
                    for part in data.chunks(keys::CHUNK_BLOCK).chain(empty) {
                        let block = ChunkView {
                            crc: crc32c::crc32c(part),
                            at_ms: *at_ms,
                            data: part,
                        };
                        let k = keys::chunk_block(*ino, *write_id, *index, blocks);
                        v.put(k, enc(&block));
                        blocks += 1;
                    }
                    let time = ChunkTime {
                        at_ms: *at_ms,
                        blocks,
                    };
                    v.put(keys::chunk_time(*ino, *write_id, *index), time.to_bytes());
                }
                Op::CommitLayout {
                    ino,
                    size,
                    chunk_size,
                    chunks,
                    now,
                    ..
                } => {
                    let Some(mut rec) = v.inode(*ino)? else {
                        continue;
                    };
                    v.add_counter(meta::BYTES, *size as i64 - rec.attr.size as i64)?;
                    rec.attr.size = *size;
                    rec.attr.generation += 1;
                    rec.attr.mtime = *now;
                    rec.attr.ctime = *now;
                    let new = Layout::Chunked {
                        chunk_size: *chunk_size,
                        chunks: chunks.clone(),
                    };
                    let old = std::mem::replace(&mut rec.layout, new);
                    note_dropped(v, *ino, &old, &rec.layout, now, rec.attr.generation)?;
                    v.del(keys::body(*ino));
                    out.attrs.push((*ino, Some(rec.attr.clone())));
                    v.put(keys::inode(*ino), enc(&rec));
                }
                Op::DropChunks(chunks) => {
                    for (ino, w, i) in chunks {
                        let time = keys::chunk_time(*ino, *w, *i);
                        // Format 2 stored the chunk whole (no blocks in its time record).
                        let (whole, blocks) = match v.get(&time)? {
                            None => (true, 0),
                            Some(b) => match ChunkTime::from_bytes(&b) {
                                Ok(t) => (t.blocks == 0, t.blocks),
                                // Unreadable: every key the chunk may have.
                                Err(_) => (true, MAX_CHUNK_BLOCKS),
                            },
                        };
                        if whole {
                            v.del(keys::chunk(*ino, *w, *i));
                        }
                        for b in 0..blocks {
                            v.del(keys::chunk_block(*ino, *w, *i, b));
                        }
                        v.del(time);
                    }
                }
                Op::ReclaimUnlinked(inos) => {
                    for ino in inos {
                        let k = keys::unlinked(*ino);
                        if v.get(&k)?.is_none()
                            || v.locked(&keys::inode(*ino))?.is_some()
                            || !v.open_holds(*ino)?.is_empty()
                        {
                            continue;
                        }
                        v.del(k);
                        if v.inode(*ino)?.is_some_and(|r| is_unlinked(&r.attr)) {
                            self.drop_inode(v, *ino)?;
                        }
                    }
                }
                Op::RecordRequest { id, ino, at_ms } => {
                    let rec = RequestRec {
                        at_ms: *at_ms,
                        ino: *ino,
                    };
                    v.put(keys::request(*id), rec.to_bytes());
                }
                Op::ForgetRequests(ids) => {
                    for id in ids {
                        let k = keys::request(*id);
                        if v.locked(&k)?.is_none() {
                            v.del(k);
                        }
                    }
                }
                Op::HoldOpen {
                    ino,
                    session,
                    until_ms,
                    ..
                } => v.put(
                    keys::open_hold(*ino, *session),
                    until_ms.to_le_bytes().to_vec(),
                ),
                Op::EndOpens(holds) => {
                    for (ino, session) in holds {
                        v.del(keys::open_hold(*ino, *session));
                    }
                }
                Op::ReclaimDropped { ino, chunks, .. } => {
                    // Checked: every record is there. The newest generation they were
                    // dropped by marks the file.
                    let mut newest = reclaimed_generation(v, *ino)?;
                    for &(w, i) in chunks {
                        let k = keys::dropped(*ino, w, i);
                        if let Some(b) = v.get(&k)? {
                            newest = newest.max(dropped_record(&b)?.1);
                        }
                        v.del(k);
                    }
                    v.put(keys::reclaimed_gen(*ino), newest.to_le_bytes().to_vec());
                }
                Op::DropPrivileges { ino, setid, now } => {
                    let Some(mut rec) = v.inode(*ino)? else {
                        continue;
                    };
                    if rec.attr.kind == FileKind::Directory {
                        continue;
                    }
                    let perm = if *setid {
                        without_setid(rec.attr.perm)
                    } else {
                        rec.attr.perm
                    };
                    let cap = keys::xattr(*ino, CAPABILITY_XATTR);
                    let had_cap = v.get(&cap)?.is_some();
                    if had_cap {
                        v.del(cap);
                    }
                    if perm != rec.attr.perm || had_cap {
                        rec.attr.perm = perm;
                        rec.attr.ctime = rec.attr.ctime.max(*now);
                        out.attrs.push((*ino, Some(rec.attr.clone())));
                        v.put(keys::inode(*ino), enc(&rec));
                    }
                }
                Op::ExpectEpoch(_)
                | Op::ExpectDentry { .. }
                | Op::ExpectEmpty(_)
                | Op::ExpectInode { .. }
                | Op::ExpectView { .. } => {}
            }
        }
        out.epoch = v.epoch()?;
        Ok(Ok(out))
    }

    /// Cuts or extends a file's contents to `size`: bytes past the old end read as zeros
    /// (a small body is not padded; a chunked layout shortens its last chunk's valid length
    /// and drops chunks past the end, which garbage collection then reclaims).
    fn truncate_contents(
        &self,
        v: &mut View<'_>,
        ino: Ino,
        rec: &mut InodeRec,
        size: u64,
    ) -> Result<(), Fatal> {
        if rec.attr.kind != FileKind::Regular {
            return Ok(());
        }
        v.add_counter(meta::BYTES, size as i64 - rec.attr.size as i64)?;
        match &mut rec.layout {
            Layout::Small => {
                let key = keys::body(ino);
                if let Some(b) = v.get(&key)? {
                    let body: BodyRec = dec(&b, "body")?;
                    if (body.data.len() as u64) > size {
                        let mut data = body.data;
                        data.truncate(size as usize);
                        v.put(key, enc(&BodyRec::new(data)));
                    }
                }
            }
            layout => layout.truncate(size),
        }
        Ok(())
    }

    fn drop_inode(&self, v: &mut View<'_>, ino: Ino) -> Result<(), Fatal> {
        for prefix in [
            keys::xattr_prefix(ino),
            keys::open_hold_prefix(ino),
            keys::dropped_prefix(ino),
        ] {
            for k in v.keys_with_prefix(&prefix)? {
                v.del(k);
            }
        }
        if let Some(rec) = v.inode(ino)? {
            if rec.attr.kind == FileKind::Regular {
                v.add_counter(meta::BYTES, -(rec.attr.size as i64))?;
            }
        }
        v.del(keys::body(ino));
        v.del(keys::reclaimed_gen(ino));
        v.del(keys::inode(ino));
        v.add_counter(meta::INODES, -1)
    }
}

/// The stored chunks a layout names: (write id, index); holes name none.
pub(crate) fn named_chunks(layout: &Layout) -> std::collections::BTreeSet<(u64, u32)> {
    match layout {
        Layout::Small => Default::default(),
        Layout::Chunked { chunks, .. } => chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.write_id != 0)
            .map(|(i, c)| (c.write_id, i as u32))
            .collect(),
    }
}

/// A dropped-chunk record: the dropping commit's time (ms, first, as every timed record)
/// and the generation it made.
fn dropped_value(at_ms: u64, generation: u64) -> Vec<u8> {
    let mut b = at_ms.to_le_bytes().to_vec();
    b.extend_from_slice(&generation.to_le_bytes());
    b
}

/// (time in ms, generation) of a dropped-chunk record.
fn dropped_record(b: &[u8]) -> Result<(u64, u64), Fatal> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    word(0)
        .zip(word(8))
        .ok_or_else(|| Fatal::Corrupt(format!("dropped-chunk record of {} bytes", b.len())))
}

/// The newest generation of `ino` whose dropped chunks were reclaimed (0: none).
fn reclaimed_generation(v: &View<'_>, ino: Ino) -> Result<u64, Fatal> {
    let Some(b) = v.get(&keys::reclaimed_gen(ino))? else {
        return Ok(0);
    };
    let b: [u8; 8] = b
        .as_slice()
        .try_into()
        .map_err(|_| Fatal::Corrupt(format!("reclaimed generation of {ino}")))?;
    Ok(u64::from_le_bytes(b))
}

/// Records the chunks that `old` named and `new` does not as dropped by the change that
/// made `generation` at `now`, for `ReclaimDropped`, and forgets the records of chunks
/// that `new` names again (a writer that still had them in its view).
fn note_dropped(
    v: &mut View<'_>,
    ino: Ino,
    old: &Layout,
    new: &Layout,
    now: &Time,
    generation: u64,
) -> Result<(), Fatal> {
    let (old, new) = (named_chunks(old), named_chunks(new));
    for &(w, i) in old.difference(&new) {
        v.put(
            keys::dropped(ino, w, i),
            dropped_value(now.as_millis(), generation),
        );
    }
    // Most commits name chunks never dropped: look for records only if the file has any.
    let renamed: Vec<_> = new.difference(&old).collect();
    if !renamed.is_empty() && v.prefix_any(&keys::dropped_prefix(ino))? {
        for &(w, i) in renamed {
            let k = keys::dropped(ino, w, i);
            if v.get(&k)?.is_some() {
                v.del(k);
            }
        }
    }
    Ok(())
}

/// The check of a commit of `chunks` to `ino`, whose layout is `current`, against
/// reclaimed chunks: a writer whose view (`Op::ExpectView` in `ops`, 0 without one) is
/// older than the newest generation whose dropped chunks were reclaimed may name only
/// chunks of the current layout and chunks never named by one; it cannot tell which of
/// its others are gone, so it is refused unless all it names are current.
fn check_view(
    v: &View<'_>,
    ops: &[Op],
    ino: Ino,
    current: &Layout,
    chunks: &[ChunkRef],
) -> Result<Result<(), ApplyError>, Fatal> {
    let reclaimed = reclaimed_generation(v, ino)?;
    if reclaimed == 0 {
        return Ok(Ok(()));
    }
    let view = ops
        .iter()
        .find_map(|o| match o {
            Op::ExpectView { ino: i, generation } if *i == ino => Some(*generation),
            _ => None,
        })
        .unwrap_or(0);
    if view >= reclaimed {
        return Ok(Ok(()));
    }
    let current = named_chunks(current);
    let foreign = chunks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.write_id != 0)
        .find(|(i, c)| !current.contains(&(c.write_id, *i as u32)));
    Ok(match foreign {
        None => Ok(()),
        Some((i, c)) => Err(posix(
            Errno::EIO,
            format!(
                "inode {ino}: this writer's view of the file is of generation {view}, and \
                 chunks dropped by generation {reclaimed} were reclaimed since; chunk {i} \
                 (write {:#x}) may be one of them",
                c.write_id
            ),
        )),
    })
}

/// The check of `ReclaimDropped`: each chunk recorded as dropped at or before `before_ms`
/// and not named by the current layout, and no open session on the file held at `now_ms`.
fn check_reclaim(
    v: &View<'_>,
    ino: Ino,
    chunks: &[(u64, u32)],
    before_ms: u64,
    now_ms: u64,
) -> Result<Result<(), ApplyError>, Fatal> {
    let Some(rec) = v.inode(ino)? else {
        return Ok(Err(posix(Errno::ENOENT, format!("no inode {ino}"))));
    };
    if any_holds_at(&v.open_holds(ino)?, now_ms) {
        return Ok(Err(ApplyError::Locked(format!(
            "inode {ino} is open: its dropped chunks stay"
        ))));
    }
    let current = named_chunks(&rec.layout);
    for &(w, i) in chunks {
        let due = match v.get(&keys::dropped(ino, w, i))? {
            Some(b) => dropped_record(&b)?.0 <= before_ms,
            None => false,
        };
        if !due || current.contains(&(w, i)) {
            return Ok(Err(ApplyError::Locked(format!(
                "chunk {i} (write {w:#x}) of inode {ino} is not a dropped chunk due"
            ))));
        }
    }
    Ok(Ok(()))
}

/// Whether a non-directory has lost its last name and waits, readable by inode, to be
/// reclaimed.
pub fn is_unlinked(a: &Attr) -> bool {
    a.nlink == 0 && a.kind != FileKind::Directory
}

/// The xattr holding a file's capabilities, which a change of its contents or owner removes.
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Applies a setattr change to attributes.
pub fn apply_change(a: &mut Attr, c: &AttrChange, now: Time) {
    if let Some(p) = c.perm {
        a.perm = p & 0o7777;
    }
    if let Some(u) = c.uid {
        a.uid = u;
    }
    if let Some(g) = c.gid {
        a.gid = g;
    }
    if let Some(s) = c.size {
        if s != a.size {
            a.generation += 1;
        }
        a.size = s;
        a.mtime = now;
    }
    if let Some(t) = c.atime {
        a.atime = t;
    }
    if let Some(t) = c.mtime {
        a.mtime = t;
    }
    a.ctime = now;
}

/// The attributes of a fresh inode.
#[allow(clippy::too_many_arguments)]
pub fn fresh_attr(
    kind: FileKind,
    perm: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    size: u64,
    class: Class,
    parent: Ino,
    now: Time,
) -> Attr {
    Attr {
        ino: Ino(0),
        kind,
        perm: perm & 0o7777,
        uid,
        gid,
        size,
        nlink: if kind == FileKind::Directory { 2 } else { 1 },
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        generation: 0,
        class,
        rdev,
        parent: if kind == FileKind::Directory {
            parent
        } else {
            Ino(0)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MemKv;
    use crate::types::TxId;
    use bytes::Bytes;

    fn record(id: u64) -> Op {
        Op::RecordRequest {
            id,
            ino: Ino(42),
            at_ms: 1_000,
        }
    }

    /// Applies `cmd` on top of `staged` (nothing reaches the database).
    fn apply(kv: &MemKv, staged: &mut Overlay, cmd: Command) -> CommandResult {
        Applier { partition: 3 }
            .apply(kv, staged, &cmd)
            .expect("no storage fault")
    }

    #[test]
    fn a_request_is_recorded_once_and_can_be_forgotten() {
        let db = MemKv::default();
        let mut staged = Overlay::new();
        let first = apply(&db, &mut staged, Command::Atomic(vec![record(7)]));
        assert!(matches!(first, CommandResult::Applied(_)), "{first:?}");
        let view = View::new(&db, &staged);
        let rec = view.request(7).expect("read").expect("recorded");
        assert_eq!((rec.at_ms, rec.ino), (1_000, Ino(42)));
        assert_eq!(
            RequestRec::from_bytes(&rec.to_bytes()).expect("decode"),
            rec
        );

        // A copy is refused before anything else in its list applies.
        let copy = Command::Atomic(vec![record(7), Op::BumpEpoch(9)]);
        let again = apply(&db, &mut staged, copy);
        assert!(
            matches!(again, CommandResult::Failed(ApplyError::Locked(_))),
            "{again:?}"
        );
        assert_eq!(
            View::new(&db, &staged).epoch().expect("epoch"),
            1,
            "not bumped"
        );

        // While a transaction holds a copy prepared, the id reads as pending.
        let txid = TxId {
            coordinator: 3,
            id: 1,
        };
        let at_ms = 0;
        let prepared = apply(
            &db,
            &mut staged,
            Command::Prepare {
                txid,
                ops: vec![record(8)],
                at_ms,
            },
        );
        assert!(
            matches!(prepared, CommandResult::Prepared { .. }),
            "{prepared:?}"
        );
        let view = View::new(&db, &staged);
        assert!(view.request_pending(8).expect("read"));
        assert!(view.request(8).expect("read").is_none());

        let forget = apply(
            &db,
            &mut staged,
            Command::Atomic(vec![Op::ForgetRequests(vec![7, 8])]),
        );
        assert!(matches!(forget, CommandResult::Applied(_)), "{forget:?}");
        let view = View::new(&db, &staged);
        assert!(view.request(7).expect("read").is_none(), "forgotten");
        assert!(
            view.request_pending(8).expect("read"),
            "a locked record stays"
        );
        let anew = apply(&db, &mut staged, Command::Atomic(vec![record(7)]));
        assert!(matches!(anew, CommandResult::Applied(_)), "{anew:?}");
    }

    #[test]
    fn a_short_request_record_is_corrupt_not_a_panic() {
        assert!(RequestRec::from_bytes(&[1, 2, 3]).is_err());
    }

    /// A partition (3) holding directory `/d` (its home here) with regular file `d/f` and
    /// an xattr `user.a` on it, written to an in-memory store (cases then stage over it).
    struct Fixture {
        db: MemKv,
        staged: Overlay,
        d: Ino,
        f: Ino,
    }

    const NOW: Time = Time {
        secs: 1_700_000_000,
        nanos: 0,
    };

    impl Fixture {
        fn new() -> Fixture {
            let db = MemKv::default();
            let mut staged = Overlay::new();
            let new = |kind, parent| Op::NewInode {
                attr: Box::new(fresh_attr(
                    kind,
                    0o755,
                    0,
                    0,
                    0,
                    0,
                    Class::Strict,
                    parent,
                    NOW,
                )),
                symlink: Vec::new(),
                creator: 0,
            };
            let made = apply(
                &db,
                &mut staged,
                Command::Atomic(vec![new(FileKind::Directory, Ino(1))]),
            );
            let CommandResult::Applied(o) = made else {
                panic!("make /d: {made:?}")
            };
            let d = o.new_inos[0];
            let made = apply(
                &db,
                &mut staged,
                Command::Atomic(vec![
                    new(FileKind::Regular, d),
                    Op::PutDentry {
                        parent: d,
                        name: b"f".to_vec(),
                        target: Target::New(0),
                        kind: FileKind::Regular,
                    },
                ]),
            );
            let CommandResult::Applied(o) = made else {
                panic!("make d/f: {made:?}")
            };
            let f = o.new_inos[0];
            let mut fx = Fixture { db, staged, d, f };
            let set = fx.run(vec![Op::Xattr {
                ino: f,
                name: b"user.a".to_vec(),
                value: Some(b"1".to_vec()),
                flags: 0,
                now: NOW,
            }]);
            assert!(matches!(set, CommandResult::Applied(_)), "{set:?}");
            // The set-up is in the store, as applied log entries are; a case stages on top.
            fx.db.write(std::mem::take(&mut fx.staged));
            fx
        }

        fn run(&mut self, ops: Vec<Op>) -> CommandResult {
            apply(&self.db, &mut self.staged, Command::Atomic(ops))
        }

        fn view(&self) -> View<'_> {
            View::new(&self.db, &self.staged)
        }
    }

    /// A chunk is stored in blocks, each with a checksum of its own: any range reads back as
    /// written, a range past the end reads short, a flipped byte fails only the ranges over
    /// its block, a chunk stored whole (format 2) reads as before, and a drop takes every
    /// block of either.
    #[test]
    fn chunks_are_stored_and_read_in_blocks() {
        use crate::data::{read_chunk_range, ChunkRead};
        const B: usize = keys::CHUNK_BLOCK;
        let mut fx = Fixture::new();
        let f = fx.f;
        let data: Vec<u8> = (0..2 * B + 1000).map(|i| (i * 7 % 251) as u8).collect();
        let put = |fx: &mut Fixture, write_id| {
            let put = fx.run(vec![Op::PutChunk {
                ino: f,
                write_id,
                index: 0,
                data: Bytes::from(data.clone()),
                at_ms: 5,
            }]);
            assert!(matches!(put, CommandResult::Applied(_)), "{put:?}");
            fx.db.write(std::mem::take(&mut fx.staged));
        };
        put(&mut fx, 9);
        // Format 2's whole chunk, as an older release stored it.
        let whole = ChunkView {
            crc: crc32c::crc32c(&data),
            at_ms: 5,
            data: &data,
        };
        fx.staged.insert(keys::chunk(f, 11, 0), Some(enc(&whole)));
        let time = keys::chunk_time(f, 11, 0);
        fx.staged.insert(time, Some(5u64.to_le_bytes().to_vec()));
        fx.db.write(std::mem::take(&mut fx.staged));
        let read = |fx: &Fixture, w: u64, offset: usize, length: usize| {
            let (offset, length) = (offset as u32, length as u32);
            read_chunk_range(&fx.view(), (f, w, 0), offset, length).expect("read")
        };
        let bytes = |r: std::ops::Range<usize>| ChunkRead::Bytes(data[r].to_vec());
        let len = data.len();
        for w in [9, 11] {
            for (offset, length) in [(0, len), (0, 1), (B - 10, 20), (B, B), (1, 2 * B + 10)] {
                let end = (offset + length).min(len);
                assert_eq!(
                    read(&fx, w, offset, length),
                    bytes(offset..end),
                    "{w} {offset}"
                );
            }
            assert_eq!(read(&fx, w, len - 100, 500), bytes(len - 100..len));
            assert_eq!(read(&fx, w, len + 5, 10), ChunkRead::Bytes(Vec::new()));
            assert_eq!(read(&fx, w, 3 * B, 10), ChunkRead::Bytes(Vec::new()));
            assert_eq!(read(&fx, w, 0, 0), ChunkRead::Bytes(Vec::new()));
        }
        assert_eq!(read(&fx, 10, 0, 10), ChunkRead::Missing);
        assert_eq!(read(&fx, 10, 3 * B, 10), ChunkRead::Missing);
        let chunk_keys = |fx: &Fixture| {
            let view = fx.view();
            let mut n = view.keys_with_prefix(&[keys::tag::CHUNK]).expect("scan");
            n.extend(
                view.keys_with_prefix(&[keys::tag::CHUNK_TIME])
                    .expect("scan"),
            );
            n
        };
        assert_eq!(
            chunk_keys(&fx).len(),
            3 + 1 + 2,
            "three blocks, one whole, two times"
        );
        // A flipped byte in block 1.
        let k = keys::chunk_block(f, 9, 0, 1);
        let mut stored = fx.view().get(&k).expect("get").expect("block 1");
        let at = stored.len() - 100;
        stored[at] ^= 0x40;
        fx.db.write([(k, Some(stored))].into_iter().collect());
        assert_eq!(read(&fx, 9, 0, len), ChunkRead::Mismatch);
        assert_eq!(read(&fx, 9, B - 1, 2), ChunkRead::Mismatch);
        assert_eq!(read(&fx, 9, 0, B), bytes(0..B));
        assert_eq!(read(&fx, 9, 2 * B, 1000), bytes(2 * B..len));
        // A chunk whose time record no longer reads: its drop takes every key it may have.
        put(&mut fx, 12);
        let time = keys::chunk_time(f, 12, 0);
        fx.db
            .write([(time, Some(vec![1; 5]))].into_iter().collect());
        let drop = fx.run(vec![Op::DropChunks(vec![
            (f, 9, 0),
            (f, 11, 0),
            (f, 12, 0),
        ])]);
        assert!(matches!(drop, CommandResult::Applied(_)), "{drop:?}");
        fx.db.write(std::mem::take(&mut fx.staged));
        assert_eq!(chunk_keys(&fx), Vec::<Vec<u8>>::new());
        assert_eq!(read(&fx, 9, 0, 10), ChunkRead::Missing);
        assert_eq!(read(&fx, 11, 0, 10), ChunkRead::Missing);
    }

    /// What a case's op list must come to.    /// What a case's op list must come to.
    #[derive(Debug, PartialEq)]
    enum Want {
        Applied,
        Errno(Errno),
        Locked,
        Stale,
        Invalid,
    }

    fn came_to(r: &CommandResult) -> Option<Want> {
        Some(match r {
            CommandResult::Applied(_) => Want::Applied,
            CommandResult::Failed(ApplyError::Posix(e, _)) => Want::Errno(Errno(*e)),
            CommandResult::Failed(ApplyError::Locked(_)) => Want::Locked,
            CommandResult::Failed(ApplyError::StaleEpoch(_)) => Want::Stale,
            CommandResult::Failed(ApplyError::Invalid(_)) => Want::Invalid,
            _ => return None,
        })
    }

    /// Every op's checks, one row each: the op list (built from the fixture's inos) and what
    /// it must come to. A refused list changes nothing (checked on every row).
    #[test]
    fn each_op_is_checked_before_anything_applies() {
        type Case = (&'static str, fn(&Fixture) -> Vec<Op>, Want);
        let cases: Vec<Case> = vec![
            (
                "epoch 0 is any",
                |_| vec![Op::ExpectEpoch(0)],
                Want::Applied,
            ),
            (
                "the current epoch",
                |_| vec![Op::ExpectEpoch(1)],
                Want::Applied,
            ),
            (
                "a live directory",
                |fx| {
                    vec![Op::ExpectDirLive {
                        dir: fx.d,
                        class: Class::Strict,
                        learn: false,
                    }]
                },
                Want::Applied,
            ),
            (
                "a file is no directory",
                |fx| {
                    vec![Op::ExpectDirLive {
                        dir: fx.f,
                        class: Class::Strict,
                        learn: false,
                    }]
                },
                Want::Errno(Errno::ENOTDIR),
            ),
            (
                "a missing directory",
                |_| {
                    vec![Op::ExpectDirLive {
                        dir: Ino::new(3, 999),
                        class: Class::Strict,
                        learn: false,
                    }]
                },
                Want::Errno(Errno::ENOENT),
            ),
            (
                "another partition's directory, unknown here",
                |_| {
                    vec![Op::ExpectDirLive {
                        dir: Ino::new(5, 9),
                        class: Class::Relaxed,
                        learn: false,
                    }]
                },
                Want::Invalid,
            ),
            (
                "another partition's directory, learnt",
                |_| {
                    vec![Op::ExpectDirLive {
                        dir: Ino::new(5, 9),
                        class: Class::Relaxed,
                        learn: true,
                    }]
                },
                Want::Applied,
            ),
            (
                "absent, but present",
                |fx| {
                    vec![Op::ExpectDentry {
                        parent: fx.d,
                        name: b"f".to_vec(),
                        expect: Expect::Absent,
                    }]
                },
                Want::Errno(Errno::EEXIST),
            ),
            (
                "absent, and absent",
                |fx| {
                    vec![Op::ExpectDentry {
                        parent: fx.d,
                        name: b"g".to_vec(),
                        expect: Expect::Absent,
                    }]
                },
                Want::Applied,
            ),
            (
                "an ino, but no entry",
                |fx| {
                    vec![Op::ExpectDentry {
                        parent: fx.d,
                        name: b"g".to_vec(),
                        expect: Expect::Ino(fx.f),
                    }]
                },
                Want::Errno(Errno::ENOENT),
            ),
            (
                "an ino, but another",
                |fx| {
                    vec![Op::ExpectDentry {
                        parent: fx.d,
                        name: b"f".to_vec(),
                        expect: Expect::Ino(fx.d),
                    }]
                },
                Want::Locked,
            ),
            (
                "as planned, unchanged",
                |fx| {
                    vec![Op::ExpectDentry {
                        parent: fx.d,
                        name: b"f".to_vec(),
                        expect: Expect::AsPlanned(Some(fx.f)),
                    }]
                },
                Want::Applied,
            ),
            (
                "as planned, but it appeared",
                |fx| {
                    vec![Op::ExpectDentry {
                        parent: fx.d,
                        name: b"f".to_vec(),
                        expect: Expect::AsPlanned(None),
                    }]
                },
                Want::Locked,
            ),
            (
                "empty, but not",
                |fx| vec![Op::ExpectEmpty(fx.d)],
                Want::Errno(Errno::ENOTEMPTY),
            ),
            (
                "empty, and empty",
                |fx| vec![Op::ExpectEmpty(fx.f)],
                Want::Applied,
            ),
            (
                "an inode of any kind",
                |fx| {
                    vec![Op::ExpectInode {
                        ino: fx.f,
                        kind: None,
                    }]
                },
                Want::Applied,
            ),
            (
                "a directory, but a file",
                |fx| {
                    vec![Op::ExpectInode {
                        ino: fx.f,
                        kind: Some(FileKind::Directory),
                    }]
                },
                Want::Errno(Errno::ENOTDIR),
            ),
            (
                "a file, but a directory",
                |fx| {
                    vec![Op::ExpectInode {
                        ino: fx.d,
                        kind: Some(FileKind::Regular),
                    }]
                },
                Want::Errno(Errno::EISDIR),
            ),
            (
                "a missing inode",
                |_| {
                    vec![Op::ExpectInode {
                        ino: Ino::new(3, 999),
                        kind: None,
                    }]
                },
                Want::Errno(Errno::ENOENT),
            ),
            (
                "the size of a directory",
                |fx| {
                    vec![Op::SetAttr {
                        ino: fx.d,
                        change: AttrChange {
                            size: Some(0),
                            ..Default::default()
                        },
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::EISDIR),
            ),
            (
                "setattr of a missing inode",
                |_| {
                    vec![Op::SetAttr {
                        ino: Ino::new(3, 999),
                        change: AttrChange::default(),
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::ENOENT),
            ),
            (
                "create an existing xattr",
                |fx| {
                    vec![Op::Xattr {
                        ino: fx.f,
                        name: b"user.a".to_vec(),
                        value: Some(b"2".to_vec()),
                        flags: 1,
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::EEXIST),
            ),
            (
                "replace a missing xattr",
                |fx| {
                    vec![Op::Xattr {
                        ino: fx.f,
                        name: b"user.b".to_vec(),
                        value: Some(b"2".to_vec()),
                        flags: 2,
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::ENODATA),
            ),
            (
                "remove a missing xattr",
                |fx| {
                    vec![Op::Xattr {
                        ino: fx.f,
                        name: b"user.b".to_vec(),
                        value: None,
                        flags: 0,
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::ENODATA),
            ),
            (
                "an xattr of a missing inode",
                |_| {
                    vec![Op::Xattr {
                        ino: Ino::new(3, 999),
                        name: b"user.a".to_vec(),
                        value: None,
                        flags: 0,
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::ENOENT),
            ),
            (
                "link a missing inode",
                |_| {
                    vec![Op::AdjustInode {
                        ino: Ino::new(3, 999),
                        nlink: 1,
                        parent: None,
                        touch_mtime: false,
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::ENOENT),
            ),
            (
                "drop a missing inode",
                |_| vec![Op::DropInode(Ino::new(3, 999))],
                Want::Errno(Errno::ENOENT),
            ),
            (
                "class of a missing directory",
                |_| {
                    vec![Op::SetClass {
                        dir: Ino::new(3, 999),
                        class: Class::Relaxed,
                    }]
                },
                Want::Errno(Errno::ENOENT),
            ),
            (
                "a body for a directory",
                |fx| {
                    vec![Op::WriteBody {
                        ino: fx.d,
                        data: Bytes::from_static(b"x"),
                        expect_generation: 0,
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::EISDIR),
            ),
            (
                "a body at a stale generation",
                |fx| {
                    vec![Op::WriteBody {
                        ino: fx.f,
                        data: Bytes::from_static(b"x"),
                        expect_generation: 77,
                        now: NOW,
                    }]
                },
                Want::Locked,
            ),
            (
                "a body for a missing file",
                |_| {
                    vec![Op::WriteBody {
                        ino: Ino::new(3, 999),
                        data: Bytes::from_static(b"x"),
                        expect_generation: 0,
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::ENOENT),
            ),
            (
                "a layout for a directory",
                |fx| {
                    vec![Op::CommitLayout {
                        ino: fx.d,
                        size: 0,
                        chunk_size: 4096,
                        chunks: Vec::new(),
                        expect_generation: 0,
                        now: NOW,
                    }]
                },
                Want::Errno(Errno::EISDIR),
            ),
            // A failing op after a passing one: nothing of the list applies.
            (
                "a later refusal stops the list",
                |fx| {
                    vec![
                        Op::BumpEpoch(9),
                        Op::DelDentry {
                            parent: fx.d,
                            name: b"f".to_vec(),
                        },
                        Op::ExpectInode {
                            ino: Ino::new(3, 999),
                            kind: None,
                        },
                    ]
                },
                Want::Errno(Errno::ENOENT),
            ),
        ];
        for (name, ops, want) in cases {
            let mut fx = Fixture::new();
            let before = fx.staged.clone();
            let r = fx.run(ops(&fx));
            assert_eq!(came_to(&r).as_ref(), Some(&want), "{name}: {r:?}");
            if !matches!(want, Want::Applied) {
                assert_eq!(fx.staged, before, "{name}: a refused list changed state");
            }
        }
    }

    /// Each mutating op's effect, read back through the view.
    #[test]
    fn each_op_has_its_effect() {
        let mut fx = Fixture::new();
        let (d, f) = (fx.d, fx.f);
        let ok = |r: CommandResult| match r {
            CommandResult::Applied(o) => o,
            other => panic!("{other:?}"),
        };

        // A second name for f, then the first one removed: nlink follows the ops given.
        ok(fx.run(vec![
            Op::PutDentry {
                parent: d,
                name: b"g".to_vec(),
                target: Target::Existing(f),
                kind: FileKind::Regular,
            },
            Op::AdjustInode {
                ino: f,
                nlink: 1,
                parent: None,
                touch_mtime: false,
                now: NOW,
            },
        ]));
        assert_eq!(
            fx.view().dentry(d, b"g").expect("read").map(|e| e.ino),
            Some(f)
        );
        assert_eq!(fx.view().inode(f).expect("read").expect("f").attr.nlink, 2);
        ok(fx.run(vec![
            Op::DelDentry {
                parent: d,
                name: b"f".to_vec(),
            },
            Op::AdjustInode {
                ino: f,
                nlink: -1,
                parent: None,
                touch_mtime: false,
                now: NOW,
            },
        ]));
        assert!(fx.view().dentry(d, b"f").expect("read").is_none());
        assert_eq!(fx.view().inode(f).expect("read").expect("f").attr.nlink, 1);

        // Attributes and xattrs.
        let o = ok(fx.run(vec![Op::SetAttr {
            ino: f,
            change: AttrChange {
                perm: Some(0o600),
                ..Default::default()
            },
            now: NOW,
        }]));
        assert_eq!(o.attr(f).map(|a| a.perm & 0o7777), Some(0o600));
        ok(fx.run(vec![Op::Xattr {
            ino: f,
            name: b"user.a".to_vec(),
            value: None,
            flags: 0,
            now: NOW,
        }]));
        assert!(fx
            .view()
            .get(&keys::xattr(f, b"user.a"))
            .expect("read")
            .is_none());

        // A small body, read back with its checksum.
        ok(fx.run(vec![Op::WriteBody {
            ino: f,
            data: Bytes::from_static(b"hello"),
            expect_generation: 0,
            now: NOW,
        }]));
        let body: BodyRec = dec(
            &fx.view().get(&keys::body(f)).expect("read").expect("body"),
            "body",
        )
        .expect("decode");
        assert!(body.verify());
        assert_eq!(body.data, b"hello");
        assert_eq!(fx.view().inode(f).expect("read").expect("f").attr.size, 5);

        // The epoch moves on, and an older command is then refused.
        let o = ok(fx.run(vec![Op::BumpEpoch(7)]));
        assert!(o.epoch >= 7, "{o:?}");
        assert!(matches!(
            fx.run(vec![Op::ExpectEpoch(1)]),
            CommandResult::Failed(ApplyError::StaleEpoch(_))
        ));

        // A tombstoned directory takes no more entries.
        ok(fx.run(vec![Op::Tombstone(d)]));
        let r = fx.run(vec![Op::ExpectDirLive {
            dir: d,
            class: Class::Strict,
            learn: false,
        }]);
        assert!(
            matches!(&r, CommandResult::Failed(ApplyError::Posix(e, _)) if Errno(*e) == Errno::ENOENT),
            "{r:?}"
        );
    }

    /// Chunks a change takes out of a layout are recorded on the file's home, and
    /// forgotten when a commit names them again; `ReclaimDropped` takes them only when all
    /// are due, none is named and no open session holds the file; after it, a writer
    /// whose view is older may name only the current layout's chunks.
    #[test]
    fn dropped_chunks_are_recorded_reclaimed_and_not_named_again() {
        let mut fx = Fixture::new();
        let f = fx.f;
        let at = NOW.as_millis();
        let chunk = |write_id| ChunkRef { write_id, len: 10 };
        let commit = |chunks: Vec<ChunkRef>| Op::CommitLayout {
            ino: f,
            size: 10 * chunks.len() as u64,
            chunk_size: 10,
            chunks,
            expect_generation: 0,
            now: NOW,
        };
        let dropped = |fx: &Fixture| -> Vec<(u64, u32)> {
            let view = fx.view();
            let keys = view
                .keys_with_prefix(&keys::dropped_prefix(f))
                .expect("scan");
            keys.iter()
                .filter_map(|k| keys::chunk_of(k))
                .map(|(_, w, i)| (w, i))
                .collect()
        };
        let generation = |fx: &Fixture| {
            fx.view()
                .inode(f)
                .expect("read")
                .expect("f")
                .attr
                .generation
        };
        let applied = |r: &CommandResult| matches!(r, CommandResult::Applied(_));

        // Three chunks of write 1, then a rewrite by write 2 that keeps the middle one.
        assert!(applied(&fx.run(vec![commit(vec![
            chunk(1),
            chunk(1),
            chunk(1)
        ])])));
        assert!(dropped(&fx).is_empty());
        assert!(applied(&fx.run(vec![commit(vec![chunk(2), chunk(1)])])));
        let rewrite = generation(&fx);
        assert_eq!(dropped(&fx), vec![(1, 0), (1, 2)]);
        // A writer with the old view names (1, 2) again: its record goes.
        assert!(applied(&fx.run(vec![commit(vec![
            chunk(2),
            chunk(1),
            chunk(1)
        ])])));
        assert_eq!(dropped(&fx), vec![(1, 0)]);
        // A truncate drops the chunks past the end, a small body all of them.
        let cut = AttrChange {
            size: Some(10),
            ..AttrChange::default()
        };
        let r = fx.run(vec![Op::SetAttr {
            ino: f,
            change: cut,
            now: NOW,
        }]);
        assert!(applied(&r), "{r:?}");
        assert_eq!(dropped(&fx), vec![(1, 0), (1, 1), (1, 2)]);
        assert!(applied(&fx.run(vec![commit(vec![chunk(3), chunk(3)])])));
        assert_eq!(dropped(&fx), vec![(1, 0), (1, 1), (1, 2), (2, 0)]);
        let last = generation(&fx);

        let reclaim = |chunks: Vec<(u64, u32)>, before_ms: u64| Op::ReclaimDropped {
            ino: f,
            chunks,
            before_ms,
            now_ms: at + 1_000,
        };
        // Refused, and nothing taken: a chunk not yet due, one never dropped, one named by
        // the layout, a file an open session holds.
        let all = vec![(1, 0), (1, 1), (1, 2), (2, 0)];
        let refused = [
            reclaim(all.clone(), at - 1),
            reclaim(vec![(1, 0), (9, 0)], at),
            reclaim(vec![(3, 0)], at),
        ];
        for op in refused {
            let r = fx.run(vec![op.clone()]);
            assert!(
                matches!(r, CommandResult::Failed(ApplyError::Locked(_))),
                "{op:?}: {r:?}"
            );
        }
        let hold = Op::HoldOpen {
            ino: f,
            session: 5,
            renew: false,
            now_ms: at,
            until_ms: at + 2_000,
        };
        assert!(applied(&fx.run(vec![hold])));
        let r = fx.run(vec![reclaim(all.clone(), at)]);
        assert!(
            matches!(r, CommandResult::Failed(ApplyError::Locked(_))),
            "{r:?}"
        );
        assert_eq!(dropped(&fx), all);
        assert!(applied(&fx.run(vec![Op::EndOpens(vec![(f, 5)])])));
        let r = fx.run(vec![reclaim(all, at)]);
        assert!(applied(&r), "{r:?}");
        assert!(dropped(&fx).is_empty());

        // A writer whose view predates the reclaim: chunks outside the layout refused...
        let view = |generation| Op::ExpectView { ino: f, generation };
        for stale in [0, rewrite] {
            let r = fx.run(vec![view(stale), commit(vec![chunk(3), chunk(1)])]);
            assert!(
                matches!(&r, CommandResult::Failed(ApplyError::Posix(e, _)) if Errno(*e) == Errno::EIO),
                "{r:?}"
            );
        }
        let r = fx.run(vec![commit(vec![chunk(7)])]);
        assert!(
            !applied(&r),
            "a commit without a view counts as the oldest: {r:?}"
        );
        // ...the current layout's chunks allowed; a newer view names what it stored.
        assert!(applied(
            &fx.run(vec![view(rewrite), commit(vec![chunk(3)])])
        ));
        assert!(applied(
            &fx.run(vec![view(last), commit(vec![chunk(3), chunk(4)])])
        ));
        assert!(applied(
            &fx.run(vec![view(u64::MAX), commit(vec![chunk(5)])])
        ));

        // The records and the mark go with the inode.
        ok_drop(&mut fx, f);
        assert!(dropped(&fx).is_empty());
        assert!(fx
            .view()
            .get(&keys::reclaimed_gen(f))
            .expect("read")
            .is_none());
    }

    fn ok_drop(fx: &mut Fixture, ino: Ino) {
        let r = fx.run(vec![Op::DropInode(ino)]);
        assert!(matches!(r, CommandResult::Applied(_)), "{r:?}");
    }
}
