//! Rename: within one partition as one proposal, across partitions as a two-phase
//! commit; NOREPLACE and EXCHANGE; a directory moved under itself refused; the namespace
//! epoch moved on when a directory moves, so clients drop their path caches.
//!
//! Its operations are methods of [`Renames`], a view of a [`Node`] borrowed for one call
//! (`Renames::new(&node).rename(..)`), so a call names the file that defines it. Built on
//! the namespace's guards and planning ([`Namespace`]) and on transactions ([`Txns`]);
//! neither reaches here.
//!
//! A rename reads (the source entry, the destination's, a replaced directory's class) and
//! then decides: `rename_plan` is that decision, a pure function of what was read, which
//! answers the refusals and the ops of every partition, so it is tested on the in-memory
//! store without a cluster.

use crate::namespace::{
    outcome_epoch, plan_dir_removal, posix, record_request, relink, replan, Namespace,
};
use crate::node::Node;
use crate::partition::Partition;
use crate::records::{storage_error, Dentry};
use crate::txn::Txns;
use crate::types::{Expect, Op, Target};
use std::collections::BTreeMap;
use talon_model::placement::entry_partition;
use talon_model::{
    check_name, Class, Errno, FileKind, Ino, RenameFlags, TalonError, Time, ROOT_INO,
};

/// Deepest directory chain walked when checking a rename for loops.
const MAX_DEPTH: usize = 4096;
/// What a rename requires of its destination entry at commit, given what its plan read
/// there (`planned`). A plain rename replaces whatever is there, or takes the free name, so
/// any change re-plans it; NOREPLACE answers EEXIST if a name appeared; EXCHANGE answers
/// ENOENT if its partner went.
fn destination_guard(planned: Option<Ino>, flags: RenameFlags) -> Expect {
    match planned {
        _ if flags == RenameFlags::REPLACE => Expect::AsPlanned(planned),
        Some(ino) => Expect::Ino(ino),
        None => Expect::Absent,
    }
}

/// Renames on a node's partitions. A view of a [`Node`] borrowed for a call:
/// `Renames::new(&node).rename(..)`.
#[derive(Clone, Copy, Debug)]
pub struct Renames<'a> {
    node: &'a Node,
}

impl<'a> Renames<'a> {
    /// The renames served by `node`.
    pub fn new(node: &'a Node) -> Self {
        Renames { node }
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
        let flags = RenameFlags::from_bits(flags)?;
        let part = self.node.local(p)?;
        let ns = Namespace::new(self.node);
        let renamed = |_| async { part.store.epoch().map_err(storage_error) };
        replan("rename", 30, || async {
            let r = self
                .rename_once(part, epoch, (sp, sn), (dp, dn), flags, request)
                .await;
            ns.settle(part, request, r, renamed).await
        })
        .await
    }

    async fn rename_once(
        &self,
        part: &Partition,
        epoch: u64,
        (sp, sn): (Ino, &[u8]),
        (dp, dn): (Ino, &[u8]),
        flags: RenameFlags,
        request: u64,
    ) -> Result<u64, TalonError> {
        let ps = part.id;
        let ns = Namespace::new(self.node);
        ns.entry_class(part, sp, sn).await?;
        let (dclass, _) = ns.dir_class(part, dp).await?;
        let pd = entry_partition(dp, dn, dclass, self.node.partitions_count());
        part.linearizable().await?;
        let (src, cur_epoch) = part
            .store
            .read(|v| Ok((v.dentry(sp, sn)?, v.epoch()?)))
            .map_err(storage_error)?;
        if ns.applied(part, request)?.is_some() {
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
            ns.read_dentry(pd, dp, dn).await?
        };
        let at = RenameAt {
            epoch,
            source: (ps, sp, sn),
            src,
            dest: (pd, dp, dn),
            dclass,
            dst,
            flags,
            request,
            partitions: self.node.partitions_count(),
            now: crate::clock::now(),
        };
        let mut plan = rename_plan(&at, None)?;
        if let RenamePlan::NeedsClass(dir) = plan {
            let rec = ns
                .read_inode(dir)
                .await?
                .ok_or_else(|| TalonError::Retry("destination changed".into()))?;
            plan = rename_plan(&at, Some(rec.attr.class))?;
        }
        let RenameOps {
            parts,
            moved,
            touches,
        } = match plan {
            RenamePlan::Ops(ops) => ops,
            RenamePlan::Nothing => return Ok(cur_epoch),
            // Given the class, the plan does not ask for it again; kept as an error, not a
            // panic, should that ever change.
            RenamePlan::NeedsClass(dir) => {
                return Err(TalonError::Unavailable(format!(
                    "rename planned without directory {dir}'s class"
                )))
            }
        };
        let check = || async {
            // A directory must not move below itself: walk up from each new parent.
            for &(dir, new_parent) in &moved {
                self.check_not_ancestor(dir, new_parent).await?;
            }
            Ok(())
        };
        let out = Txns::new(self.node).run_ops(ps, parts, check).await?;
        futures::future::join_all(
            touches
                .into_iter()
                .map(|(dir, delta)| self.node.touch_parent(dir, delta, at.now)),
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
            let rec = Namespace::new(self.node)
                .read_inode(cur)
                .await?
                .ok_or_else(|| posix(Errno::ENOENT, format!("directory {cur} vanished")))?;
            cur = rec.attr.parent;
        }
        Err(posix(Errno::ELOOP, "directory chain too deep"))
    }
}

/// A rename as its plan found it: both entries, where they live and what they name.
#[derive(Clone, Debug)]
pub(crate) struct RenameAt<'a> {
    /// The routing epoch the client planned with.
    pub epoch: u64,
    /// The source entry: its partition (the one serving the rename), parent and name.
    pub source: (u32, Ino, &'a [u8]),
    /// What the source entry names.
    pub src: Dentry,
    /// The destination entry: its partition, parent and name.
    pub dest: (u32, Ino, &'a [u8]),
    /// The destination directory's class, as the source partition knows it.
    pub dclass: Class,
    /// What the destination entry names, if it exists.
    pub dst: Option<Dentry>,
    /// NOREPLACE, EXCHANGE or neither.
    pub flags: RenameFlags,
    /// The client's id for this rename (0: none).
    pub request: u64,
    /// How many partitions the cluster has: a moved directory bumps every one's epoch.
    pub partitions: u32,
    /// The rename's time.
    pub now: Time,
}

/// What a rename does, decided from what its plan read.
#[derive(Debug)]
pub(crate) enum RenamePlan {
    /// Nothing: both names are links to one inode, and POSIX says do nothing.
    Nothing,
    /// The rename replaces this directory, whose class (read at its home) says where its
    /// emptiness is checked: plan again with it.
    NeedsClass(Ino),
    /// The change.
    Ops(RenameOps),
}

/// The ops of a rename and what its caller does around them.
#[derive(Debug)]
pub(crate) struct RenameOps {
    /// Ops by partition, run as one proposal or one transaction.
    pub parts: BTreeMap<u32, Vec<Op>>,
    /// Each moved directory with its new parent, checked for a loop with the locks held.
    pub moved: Vec<(Ino, Ino)>,
    /// Link count changes of both parents (0 if none), applied at their homes after.
    pub touches: BTreeMap<Ino, i32>,
}

/// Plans the rename `at` found: the refusals that what it read decides (NOREPLACE onto an
/// existing name, EXCHANGE with a missing partner, a directory over a non-directory or the
/// reverse), then the ops of every partition it touches. `replaced_class` is the class of
/// a directory the rename replaces, once [`RenamePlan::NeedsClass`] asked for it.
pub(crate) fn rename_plan(
    at: &RenameAt<'_>,
    replaced_class: Option<Class>,
) -> Result<RenamePlan, TalonError> {
    let ((ps, sp, sn), (pd, dp, dn)) = (at.source, at.dest);
    let (src, dst, flags, now) = (&at.src, &at.dst, at.flags, at.now);
    let exchange = flags.exchange;
    match (dst, exchange) {
        (Some(_), false) if flags.noreplace => {
            return Err(posix(Errno::EEXIST, "destination exists"))
        }
        (None, true) => return Err(posix(Errno::ENOENT, "exchange with a missing entry")),
        _ => {}
    }
    if let Some(d) = dst {
        if d.ino == src.ino {
            return Ok(RenamePlan::Nothing);
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
    let mut parts: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
    let source_ops = parts.entry(ps).or_default();
    source_ops.extend([
        Op::ExpectEpoch(at.epoch),
        Op::ExpectDentry {
            parent: sp,
            name: sn.to_vec(),
            expect: Expect::Ino(src.ino),
        },
    ]);
    record_request(source_ops, at.request, src.ino);
    parts.entry(pd).or_default().extend([
        Op::ExpectDirLive {
            dir: dp,
            class: at.dclass,
            learn: true,
        },
        Op::ExpectDentry {
            parent: dp,
            name: dn.to_vec(),
            expect: destination_guard(dst.as_ref().map(|d| d.ino), flags),
        },
    ]);
    // The source name goes away, or (exchange) points at the destination's inode.
    match (dst, exchange) {
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
    if let Some(d) = dst {
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
            let Some(class) = replaced_class else {
                return Ok(RenamePlan::NeedsClass(d.ino));
            };
            plan_dir_removal(&mut parts, d.ino, class, at.partitions);
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
        // locked while prepared, so the loop check cannot race another move).
        for q in 0..at.partitions {
            parts.entry(q).or_default().push(Op::BumpEpoch(0));
        }
    }
    let moved = [Some(src), if exchange { dst.as_ref() } else { None }]
        .into_iter()
        .flatten()
        .filter(|d| d.kind == FileKind::Directory)
        .map(|d| (d.ino, if d.ino == src.ino { dp } else { sp }))
        .collect();
    let mut touches = nlink_delta;
    touches.entry(sp).or_default();
    touches.entry(dp).or_default();
    Ok(RenamePlan::Ops(RenameOps {
        parts,
        moved,
        touches,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::{fresh_attr, Applier};
    use crate::kv::{MemKv, Overlay};
    use crate::namespace::{create_ops, CreateAt};
    use crate::types::{ApplyError, Command, CommandResult};
    use crate::view::View;
    use talon_model::CreateSpec;

    /// The only partition of a one-partition cluster: a whole plan applies as one command.
    const P: u32 = 0;
    const NOW: Time = Time {
        secs: 1_700_000_000,
        nanos: 0,
    };
    const NOREPLACE: RenameFlags = RenameFlags {
        noreplace: true,
        exchange: false,
    };
    const EXCHANGE: RenameFlags = RenameFlags {
        noreplace: false,
        exchange: true,
    };

    /// Partition `P` at epoch 1, in memory, holding directory `d` with files `a` and `b`, an
    /// empty directory `x` and a directory `y` holding file `f`.
    struct Store {
        db: MemKv,
        d: Ino,
    }

    impl Store {
        fn new() -> Store {
            let mut s = Store {
                db: MemKv::default(),
                d: Ino(0),
            };
            let mut staged = Overlay::new();
            staged.insert(
                crate::keys::meta::EPOCH.to_vec(),
                Some(1u64.to_le_bytes().to_vec()),
            );
            s.db.write(staged);
            let attr = fresh_attr(
                FileKind::Directory,
                0o755,
                0,
                0,
                0,
                0,
                Class::Relaxed,
                ROOT_INO,
                NOW,
            );
            s.d = s.made(vec![Op::NewInode {
                attr: Box::new(attr),
                symlink: Vec::new(),
                creator: 0,
            }]);
            let d = s.d;
            s.create(d, b"a", &CreateSpec::file(0o644));
            s.create(d, b"b", &CreateSpec::file(0o644));
            s.create(d, b"x", &CreateSpec::dir(0o755, None));
            let y = s.create(d, b"y", &CreateSpec::dir(0o755, None));
            s.create(y, b"f", &CreateSpec::file(0o644));
            s
        }

        /// Applies `ops` as one command, keeping what it wrote if it applied.
        fn apply(&mut self, ops: Vec<Op>) -> CommandResult {
            let mut staged = Overlay::new();
            let res = Applier { partition: P }
                .apply(&self.db, &mut staged, &Command::Atomic(ops))
                .expect("no storage fault");
            if matches!(res, CommandResult::Applied(_)) {
                self.db.write(staged);
            }
            res
        }

        /// Applies `ops`, which must allocate an inode, and answers it.
        fn made(&mut self, ops: Vec<Op>) -> Ino {
            match self.apply(ops) {
                CommandResult::Applied(o) => o.new_inos[0],
                other => panic!("not applied: {other:?}"),
            }
        }

        fn create(&mut self, parent: Ino, name: &[u8], spec: &CreateSpec) -> Ino {
            let at = CreateAt {
                epoch: 1,
                parent,
                name,
                parent_class: Class::Relaxed,
                learn: false,
                parent_here: true,
                now: NOW,
            };
            self.made(create_ops(&at, spec, 0))
        }

        fn entry(&self, parent: Ino, name: &[u8]) -> Option<Dentry> {
            View::new(&self.db, &Overlay::new())
                .dentry(parent, name)
                .expect("read")
        }

        fn nlink(&self, ino: Ino) -> u32 {
            View::new(&self.db, &Overlay::new())
                .inode(ino)
                .expect("read")
                .map_or(0, |r| r.attr.nlink)
        }

        /// A rename of `d/sn` to `d/dn` as planning would find it here.
        fn at<'a>(&self, sn: &'a [u8], dn: &'a [u8], flags: RenameFlags) -> RenameAt<'a> {
            RenameAt {
                epoch: 1,
                source: (P, self.d, sn),
                src: self.entry(self.d, sn).expect("source exists"),
                dest: (P, self.d, dn),
                dclass: Class::Relaxed,
                dst: self.entry(self.d, dn),
                flags,
                request: 0,
                partitions: 1,
                now: NOW,
            }
        }

        /// Plans `at`, reading a replaced directory's class here when asked, and applies it.
        fn rename(&mut self, at: &RenameAt<'_>) -> Result<CommandResult, TalonError> {
            let mut plan = rename_plan(at, None)?;
            if let RenamePlan::NeedsClass(dir) = plan {
                let class = View::new(&self.db, &Overlay::new())
                    .inode(dir)
                    .expect("read")
                    .expect("replaced directory exists")
                    .attr
                    .class;
                plan = rename_plan(at, Some(class))?;
            }
            let RenamePlan::Ops(mut ops) = plan else {
                panic!("nothing to apply: {plan:?}")
            };
            let keys: Vec<u32> = ops.parts.keys().copied().collect();
            assert_eq!(keys, vec![P], "one partition, one command");
            Ok(self.apply(ops.parts.remove(&P).unwrap_or_default()))
        }
    }

    fn errno(r: &Result<impl std::fmt::Debug, TalonError>) -> Option<Errno> {
        match r {
            Err(TalonError::Posix { errno, .. }) => Some(*errno),
            _ => None,
        }
    }

    #[test]
    fn a_rename_within_a_partition_moves_the_entry() {
        let mut s = Store::new();
        let (d, a) = (s.d, s.entry(s.d, b"a").expect("a").ino);
        let res = s.rename(&s.at(b"a", b"c", RenameFlags::REPLACE));
        assert!(matches!(res, Ok(CommandResult::Applied(_))), "{res:?}");
        assert_eq!(s.entry(d, b"a"), None);
        assert_eq!(s.entry(d, b"c").map(|e| e.ino), Some(a));
        assert_eq!(s.nlink(a), 1);
    }

    #[test]
    fn a_rename_onto_a_file_replaces_it_and_unlinks_the_old_one() {
        let mut s = Store::new();
        let d = s.d;
        let (a, b) = (
            s.entry(d, b"a").expect("a").ino,
            s.entry(d, b"b").expect("b").ino,
        );
        let res = s.rename(&s.at(b"a", b"b", RenameFlags::REPLACE));
        assert!(matches!(res, Ok(CommandResult::Applied(_))), "{res:?}");
        assert_eq!(s.entry(d, b"b").map(|e| e.ino), Some(a));
        assert_eq!(s.entry(d, b"a"), None);
        assert_eq!(s.nlink(b), 0, "the replaced file has no name left");
    }

    #[test]
    fn refusals_are_decided_from_what_the_plan_read() {
        let s = Store::new();
        let table: [(&[u8], &[u8], RenameFlags, Errno); 4] = [
            (b"a", b"b", NOREPLACE, Errno::EEXIST),
            (b"a", b"missing", EXCHANGE, Errno::ENOENT),
            (b"x", b"a", RenameFlags::REPLACE, Errno::ENOTDIR),
            (b"a", b"x", RenameFlags::REPLACE, Errno::EISDIR),
        ];
        for (sn, dn, flags, want) in table {
            let plan = rename_plan(&s.at(sn, dn, flags), None);
            assert_eq!(errno(&plan), Some(want), "{sn:?} -> {dn:?}: {plan:?}");
        }
        // Two names of one inode: nothing to do.
        let mut same = s.at(b"a", b"b", RenameFlags::REPLACE);
        same.dst = Some(same.src.clone());
        assert!(matches!(rename_plan(&same, None), Ok(RenamePlan::Nothing)));
    }

    #[test]
    fn a_directory_replaces_an_empty_directory_only() {
        let mut s = Store::new();
        let d = s.d;
        let (x, y) = (
            s.entry(d, b"x").expect("x").ino,
            s.entry(d, b"y").expect("y").ino,
        );
        assert!(matches!(
            rename_plan(&s.at(b"x", b"y", RenameFlags::REPLACE), None),
            Ok(RenamePlan::NeedsClass(dir)) if dir == y
        ));
        let res = s.rename(&s.at(b"x", b"y", RenameFlags::REPLACE));
        assert!(
            matches!(&res, Ok(CommandResult::Failed(ApplyError::Posix(e, _)))
                if Errno(*e) == Errno::ENOTEMPTY),
            "{res:?}"
        );
        assert_eq!(s.entry(d, b"y").map(|e| e.ino), Some(y), "unchanged");

        let res = s.rename(&s.at(b"y", b"x", RenameFlags::REPLACE));
        assert!(matches!(res, Ok(CommandResult::Applied(_))), "{res:?}");
        assert_eq!(s.entry(d, b"x").map(|e| e.ino), Some(y));
        assert_eq!(s.entry(d, b"y"), None);
        assert_eq!(s.nlink(x), 0, "the empty directory is gone");
    }

    #[test]
    fn a_rename_across_partitions_has_ops_on_both() {
        let s = Store::new();
        let at = RenameAt {
            dest: (1, s.d, b"c"),
            dst: None,
            partitions: 2,
            ..s.at(b"a", b"a", RenameFlags::REPLACE)
        };
        let Ok(RenamePlan::Ops(ops)) = rename_plan(&at, None) else {
            panic!("no ops")
        };
        let keys: Vec<u32> = ops.parts.keys().copied().collect();
        assert_eq!(keys, vec![0, 1]);
        assert!(ops.parts[&0]
            .iter()
            .any(|op| matches!(op, Op::DelDentry { name, .. } if name == b"a")));
        assert!(ops.parts[&1]
            .iter()
            .any(|op| matches!(op, Op::PutDentry { name, .. } if name == b"c")));
        assert!(ops.moved.is_empty(), "a file moves no directory");
    }
}
