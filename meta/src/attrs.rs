//! Attributes of an inode: getattr and setattr, extended attributes, a directory's class,
//! and the file system's totals (statfs).
//!
//! Its operations are methods of [`Attrs`], a view of a [`Node`] borrowed for one call
//! (`Attrs::new(&node).getattr(..)`), so a call names the file that defines it. Built on the
//! namespace's guards ([`Namespace`]) and on transactions ([`Txns`]); neither reaches here.

use crate::namespace::{outcome_attr, posix, record_request, Namespace};
use crate::node::Node;
use crate::records::{storage_error, Fatal, InodeRec};
use crate::txn::Txns;
use crate::types::{AttrChange, Op};
use crate::view::View;
use std::collections::BTreeMap;
use talon_model::placement::dir_partitions;
use talon_model::{Attr, Class, Errno, FileKind, Ino, TalonError, SYMLINK_XATTR};

/// Longest xattr value.
pub const XATTR_VALUE_MAX: usize = 64 * 1024;

/// Attributes on a node's partitions: an inode's, its xattrs', a directory's class, the
/// totals. A view of a [`Node`] borrowed for a call: `Attrs::new(&node).getattr(..)`.
#[derive(Clone, Copy, Debug)]
pub struct Attrs<'a> {
    node: &'a Node,
}

impl<'a> Attrs<'a> {
    /// The attributes served by `node`.
    pub fn new(node: &'a Node) -> Self {
        Attrs { node }
    }

    /// The namespace's guards and reads these operations build on.
    fn ns(&self) -> Namespace<'a> {
        Namespace::new(self.node)
    }

    /// Inode `ino`'s record and `more` of it, read in one view of its home at the inode's
    /// class (see `Namespace::read_at_class`).
    async fn inode_and<T>(
        &self,
        p: u32,
        relaxed: bool,
        epoch: u64,
        ino: Ino,
        more: impl Fn(&View<'_>) -> Result<T, Fatal>,
    ) -> Result<(Option<InodeRec>, T), TalonError> {
        let part = self.node.home_part(p, ino)?;
        let read = || {
            part.store
                .read(|v| Ok((v.inode(ino)?, more(v)?)))
                .map_err(storage_error)
        };
        self.ns()
            .read_at_class(part, relaxed, epoch, read, |(rec, _)| {
                rec.as_ref().map(|r| r.attr.class)
            })
            .await
    }

    /// Attributes of `ino` (served by its home partition).
    pub async fn getattr(
        &self,
        p: u32,
        relaxed: bool,
        epoch: u64,
        ino: Ino,
    ) -> Result<Attr, TalonError> {
        let part = self.node.home_part(p, ino)?;
        self.ns().guarded_attr(part, relaxed, epoch, ino).await
    }

    /// Applies a setattr at the inode's home.
    pub async fn setattr(
        &self,
        p: u32,
        epoch: u64,
        ino: Ino,
        change: AttrChange,
    ) -> Result<Attr, TalonError> {
        self.node.home_part(p, ino)?;
        // A directory update queued here must land first: times set explicitly would
        // otherwise be moved forward again by its flush (`dir_touch`).
        self.node.flush_touch(ino).await?;
        let now = crate::clock::now();
        // A new owner or size takes privileges from a file, as for a kernel caller without
        // CAP_FSETID; set-ID bits given with the same change stay.
        let drop =
            (change.uid.is_some() || change.gid.is_some() || change.size.is_some()).then(|| {
                Op::DropPrivileges {
                    ino,
                    setid: change.perm.is_none(),
                    now,
                }
            });
        let ops = [Op::ExpectEpoch(epoch), Op::SetAttr { ino, change, now }]
            .into_iter()
            .chain(drop)
            .collect();
        let out = Txns::new(self.node)
            .run_ops(p, BTreeMap::from([(p, ops)]), || async { Ok(()) })
            .await?;
        outcome_attr(&out, ino)
            .map(|a| self.node.with_queued_touches(a))
            .ok_or_else(|| posix(Errno::ENOENT, format!("no inode {ino}")))
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
        let key = crate::keys::xattr(ino, name);
        let (rec, val) = self
            .inode_and(p, relaxed, epoch, ino, |v| v.get(&key))
            .await?;
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
        let prefix = crate::keys::xattr_prefix(ino);
        let (rec, keys) = self
            .inode_and(p, relaxed, epoch, ino, |v| v.keys_with_prefix(&prefix))
            .await?;
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
        let part = self.node.home_part(p, ino)?;
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
        talon_model::XattrFlags::from_bits(flags)?;
        if self.ns().applied(part, request)?.is_some() {
            return Ok(());
        }
        let mut ops = vec![
            Op::ExpectEpoch(epoch),
            Op::Xattr {
                ino,
                name: name.to_vec(),
                value,
                flags,
                now: crate::clock::now(),
            },
        ];
        record_request(&mut ops, request, ino);
        let r = Txns::new(self.node)
            .run_ops(p, BTreeMap::from([(p, ops)]), || async { Ok(()) })
            .await
            .map(|_| ());
        self.ns()
            .settle(part, request, r, |_| async { Ok(()) })
            .await
    }

    /// Usage of partition `p`: (inodes, entries).
    pub async fn statfs(&self, p: u32, relaxed: bool) -> Result<(u64, u64), TalonError> {
        let part = self.node.local(p)?;
        self.ns().read_guard(part, relaxed, 0).await?;
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
        let part = self.node.home_part(p, dir)?;
        part.linearizable().await?;
        let attr = self.ns().attr_of(part, dir).await?;
        if attr.kind != FileKind::Directory {
            return Err(posix(Errno::ENOTDIR, "not a directory"));
        }
        if attr.class == class {
            return Ok(attr);
        }
        let n = self.node.partitions_count();
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
        let out = Txns::new(self.node)
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
