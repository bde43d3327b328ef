//! Rename: within one partition as one proposal, across partitions as a two-phase
//! commit; NOREPLACE and EXCHANGE; a directory moved under itself refused; the namespace
//! epoch moved on when a directory moves, so clients drop their path caches.
//!
//! Its operations are methods of [`Renames`], a view of a [`Node`] borrowed for one call
//! (`Renames::new(&node).rename(..)`), so a call names the file that defines it. Built on
//! the namespace's guards and planning ([`Namespace`]) and on transactions ([`Txns`]);
//! neither reaches here.

use crate::namespace::{outcome_epoch, posix, record_request, relink, replan, Namespace};
use crate::node::Node;
use crate::partition::Partition;
use crate::records::storage_error;
use crate::txn::Txns;
use crate::types::{Expect, Op, Target};
use std::collections::BTreeMap;
use talon_model::placement::entry_partition;
use talon_model::{check_name, Errno, FileKind, Ino, RenameFlags, TalonError, Time, ROOT_INO};

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
        let exchange = flags.exchange;
        match (&dst, exchange) {
            (Some(_), false) if flags.noreplace => {
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
                let attr = ns
                    .read_inode(d.ino)
                    .await?
                    .ok_or_else(|| TalonError::Retry("destination changed".into()))?;
                ns.plan_dir_removal(&mut parts, d.ino, attr.attr.class);
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
            for q in 0..self.node.partitions_count() {
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
        let out = Txns::new(self.node).run_ops(ps, parts, check).await?;
        let mut touches = nlink_delta;
        touches.entry(sp).or_default();
        touches.entry(dp).or_default();
        futures::future::join_all(
            touches
                .into_iter()
                .map(|(dir, delta)| self.node.touch_parent(dir, delta, now)),
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
