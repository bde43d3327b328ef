//! Path-level operations: resolve `/a/b/c` through the path cache, then send one entry RPC.
//!
//! Resolution walks the components from the root. Each directory comes from the cache when
//! it is usable there (see `path_cache` for the TTL and epoch rules), otherwise from a
//! `Lookup` — relaxed (any replica) in a relaxed directory, strict (leader) in a strict one;
//! a relaxed "not found" for an intermediate component is confirmed with the leader, so a
//! lagging replica never fails a path this client can see. Symlinks met on the way are
//! followed (at most 40, then ELOOP); the final component is never followed, so `stat` is
//! `lstat`, and `unlink`/`rename` act on a symlink itself.
//!
//! Every request of one path operation carries the epoch the client held when resolution
//! began. If a partition answers `StaleEpoch`, the cache is dropped, the path is resolved
//! again and the operation sent once more; a second refusal is returned. A write therefore
//! never lands under a directory that has been renamed away since this client cached it.
//!
//! The final component of a strict path is always asked of the leader; the final
//! component of a relaxed path may be answered from the cache within the TTL.

use crate::client::Client;
use crate::dir::{DirCursor, ReadDir};
use crate::path::{self, Components};
use crate::router::ReadKind;
use crate::settle::Scope;
use crate::types::{CreateSpec, MkdirOptions, RenameFlags, SetAttr, TimeSet};
use futures::stream::{self, StreamExt, TryStreamExt};
use talon_model::{check_name, Attr, Class, Errno, FileKind, Ino, TalonError};

/// Symlinks followed while resolving one path before ELOOP (Linux's limit).
const MAX_SYMLINK_HOPS: u32 = 40;

/// Removals in flight at once in [`Client::remove_all`].
const REMOVE_CONCURRENCY: usize = 16;

/// A directory's parent and its name there.
type Link = (Ino, Vec<u8>);

/// A resolved directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dir {
    pub(crate) ino: Ino,
    pub(crate) class: Class,
}

pub(crate) fn split_last(
    comps: &[Vec<u8>],
    root: Errno,
    op: &str,
) -> Result<(Vec<u8>, Components), TalonError> {
    match comps.split_last() {
        Some((name, parent)) => Ok((name.clone(), parent.to_vec())),
        None => Err(TalonError::posix(
            root,
            format!("{op} of the root directory"),
        )),
    }
}

fn not_dir(comps: &[Vec<u8>]) -> TalonError {
    TalonError::posix(
        Errno::ENOTDIR,
        format!("{} is not a directory", path::display(comps)),
    )
}

impl Client {
    async fn root_dir(&self) -> Result<Dir, TalonError> {
        let ino = self.root();
        Ok(Dir {
            ino,
            class: self.dir_class(ino).await?,
        })
    }

    /// Looks up one component for resolution: cache, then server, confirming a relaxed
    /// ENOENT with the leader.
    async fn lookup_component(
        &self,
        dir: Dir,
        name: &[u8],
        epoch: u64,
    ) -> Result<Attr, TalonError> {
        if let Some(hit) = self.cache().dentry(dir.ino, name) {
            return Ok(hit.attr);
        }
        let strict = || self.rpc_lookup(dir.ino, dir.class, name, ReadKind::StrictRead, epoch);
        let (attr, stamp) = match dir.class {
            Class::Strict => strict().await?,
            Class::Relaxed => {
                let relaxed =
                    self.rpc_lookup(dir.ino, dir.class, name, ReadKind::RelaxedRead, epoch);
                Self::absence_confirmed(relaxed, strict).await?
            }
        };
        self.cache()
            .insert_dentry(dir.ino, dir.class, name, &attr, stamp);
        Ok(attr)
    }

    /// Resolves the directory at `comps`, following symlinks.
    pub(crate) async fn resolve_dir(
        &self,
        comps: &[Vec<u8>],
        epoch: u64,
    ) -> Result<Dir, TalonError> {
        let mut comps: Components = comps.to_vec();
        let mut hops = 0;
        'restart: loop {
            if let Some((ino, class)) = self.cache().dir(&path::join(&comps)) {
                return Ok(Dir { ino, class });
            }
            let mut cur = self.root_dir().await?;
            let mut relaxed_on_path = cur.class == Class::Relaxed;
            for i in 0..comps.len() {
                let attr = self.lookup_component(cur, &comps[i], epoch).await?;
                match attr.kind {
                    FileKind::Directory => {
                        relaxed_on_path |= attr.class == Class::Relaxed;
                        cur = Dir {
                            ino: attr.ino,
                            class: attr.class,
                        };
                        let key = path::join(&comps[..=i]);
                        self.cache()
                            .insert_dir(&key, cur.ino, cur.class, epoch, relaxed_on_path);
                    }
                    FileKind::Symlink => {
                        hops += 1;
                        if hops > MAX_SYMLINK_HOPS {
                            return Err(TalonError::posix(
                                Errno::ELOOP,
                                format!("too many symlinks resolving {}", path::display(&comps)),
                            ));
                        }
                        let target = self.readlink(attr.ino).await?;
                        let mut next = path::resolve_link(&comps[..i], &target)?;
                        next.extend_from_slice(&comps[i + 1..]);
                        comps = next;
                        continue 'restart;
                    }
                    _ => return Err(not_dir(&comps[..=i])),
                }
            }
            return Ok(cur);
        }
    }

    /// The final component `name` of a path in `dir`, without following a symlink.
    async fn lookup_final(&self, dir: Dir, name: &[u8], epoch: u64) -> Result<Attr, TalonError> {
        let cached = self.cache().dentry(dir.ino, name);
        if let Some(hit) = &cached {
            if hit.serves_final_stat() {
                return Ok(hit.attr.clone());
            }
        }
        let strict =
            dir.class == Class::Strict || cached.is_some_and(|hit| hit.attr.class == Class::Strict);
        let read = if strict {
            ReadKind::StrictRead
        } else {
            ReadKind::RelaxedRead
        };
        let (attr, stamp) = self
            .rpc_lookup(dir.ino, dir.class, name, read, epoch)
            .await?;
        self.cache()
            .insert_dentry(dir.ino, dir.class, name, &attr, stamp);
        Ok(attr)
    }

    /// Entry `name` of `dir` from the partition leader.
    async fn lookup_strict(&self, dir: Dir, name: &[u8], epoch: u64) -> Result<Attr, TalonError> {
        let r = self
            .rpc_lookup(dir.ino, dir.class, name, ReadKind::StrictRead, epoch)
            .await?;
        Ok(r.0)
    }

    async fn stat_comps(&self, comps: &[Vec<u8>], epoch: u64) -> Result<Attr, TalonError> {
        match comps.split_last() {
            None => {
                self.rpc_getattr(self.root(), ReadKind::StrictRead, epoch)
                    .await
            }
            Some((name, parent)) => {
                let dir = self.resolve_dir(parent, epoch).await?;
                self.lookup_final(dir, name, epoch).await
            }
        }
    }

    /// The attributes of `path`, not following a final symlink (`lstat`). Relaxed paths may
    /// be answered from the cache or a replica within the staleness bound.
    pub async fn stat(&self, path: impl AsRef<[u8]>) -> Result<Attr, TalonError> {
        let comps = path::components(path.as_ref())?;
        self.settle(Scope::Path, |epoch| self.stat_comps(&comps, epoch))
            .await
    }

    /// Creates directory `path`. Its class is `opts.class` if given; else strict when the
    /// path is or lies under one of the cluster's strict prefixes; else the parent's. With
    /// `opts.parents`, missing parents are created too and an existing directory is fine.
    pub async fn mkdir(
        &self,
        path: impl AsRef<[u8]>,
        opts: MkdirOptions,
    ) -> Result<Attr, TalonError> {
        let comps = path::components(path.as_ref())?;
        if comps.is_empty() {
            return if opts.parents {
                self.stat("/").await
            } else {
                Err(TalonError::posix(
                    Errno::EEXIST,
                    "the root directory exists",
                ))
            };
        }
        let prefixes = self.cluster_map().strict_prefixes;
        let class_for = |upto: usize| {
            if upto == comps.len() && opts.class.is_some() {
                opts.class
            } else if path::under_strict_prefix(&comps[..upto], &prefixes) {
                Some(Class::Strict)
            } else {
                None
            }
        };
        let (comps, opts, class_for) = (&comps, &opts, &class_for);
        self.settle(Scope::Path, |epoch| async move {
            let first = if opts.parents { 1 } else { comps.len() };
            let mut parent = self.resolve_dir(&comps[..first - 1], epoch).await?;
            for i in first..=comps.len() {
                let name = &comps[i - 1];
                let last = i == comps.len();
                if opts.parents {
                    match self.resolve_dir(&comps[..i], epoch).await {
                        Ok(d) if !last => {
                            parent = d;
                            continue;
                        }
                        Ok(_) => return self.lookup_strict(parent, name, epoch).await,
                        Err(e) if e.errno() == Errno::ENOENT => {}
                        Err(e) => return Err(e),
                    }
                }
                let spec = CreateSpec::dir(opts.perm, class_for(i));
                let attr = match self
                    .rpc_create(parent.ino, parent.class, name, &spec, epoch)
                    .await
                {
                    Ok(made) => made.value.0,
                    // Someone else made it between our lookup and create.
                    Err(e) if opts.parents && e.errno() == Errno::EEXIST => {
                        let a = self.lookup_strict(parent, name, epoch).await?;
                        if a.kind != FileKind::Directory {
                            return Err(e);
                        }
                        a
                    }
                    Err(e) => return Err(e),
                };
                if last {
                    return Ok(attr);
                }
                parent = Dir {
                    ino: attr.ino,
                    class: attr.class,
                };
                self.cache().insert_dir(
                    &path::join(&comps[..i]),
                    attr.ino,
                    attr.class,
                    epoch,
                    true,
                );
            }
            Err(TalonError::Invalid("mkdir walked past the path".into()))
        })
        .await
    }

    async fn create_path(
        &self,
        path: &[u8],
        spec: CreateSpec,
        root: Errno,
        op: &str,
    ) -> Result<Attr, TalonError> {
        self.create_comps(&path::components(path)?, spec, root, op)
            .await
    }

    /// Creates the entry `comps` names; `root` is the errno when `comps` is the root.
    pub(crate) async fn create_comps(
        &self,
        comps: &path::Components,
        spec: CreateSpec,
        root: Errno,
        op: &str,
    ) -> Result<Attr, TalonError> {
        let (name, parent) = split_last(comps, root, op)?;
        spec.check(&name)?;
        let (name, parent, spec) = (&name, &parent, &spec);
        self.settle(Scope::Path, |epoch| async move {
            let dir = self.resolve_dir(parent, epoch).await?;
            Ok(self
                .rpc_create(dir.ino, dir.class, name, spec, epoch)
                .await?
                .value
                .0)
        })
        .await
    }

    /// Creates regular file `path` with mode `perm`, or returns it if it exists as a
    /// regular file (open with O_CREAT, without O_EXCL).
    pub async fn create_file(&self, path: impl AsRef<[u8]>, perm: u32) -> Result<Attr, TalonError> {
        let spec = CreateSpec {
            exclusive: false,
            ..CreateSpec::file(perm)
        };
        self.create_path(path.as_ref(), spec, Errno::EISDIR, "create")
            .await
    }

    /// Creates symlink `linkpath` pointing at `target` (which need not exist).
    pub async fn symlink(
        &self,
        target: impl AsRef<[u8]>,
        linkpath: impl AsRef<[u8]>,
    ) -> Result<Attr, TalonError> {
        let spec = CreateSpec::symlink(target.as_ref());
        self.create_path(linkpath.as_ref(), spec, Errno::EEXIST, "symlink")
            .await
    }

    /// Creates special file `path` (fifo, socket, character or block device, or an empty
    /// regular file).
    pub async fn mknod(
        &self,
        path: impl AsRef<[u8]>,
        kind: FileKind,
        perm: u32,
        rdev: u64,
    ) -> Result<Attr, TalonError> {
        if matches!(kind, FileKind::Directory | FileKind::Symlink) {
            return Err(TalonError::posix(
                Errno::EINVAL,
                "mknod cannot make directories or symlinks",
            ));
        }
        self.create_path(
            path.as_ref(),
            CreateSpec::node(kind, perm, rdev),
            Errno::EEXIST,
            "mknod",
        )
        .await
    }

    async fn remove_path(&self, path: &[u8], directory: bool) -> Result<(), TalonError> {
        let comps = path::components(path)?;
        let (root_errno, op) = if directory {
            (Errno::EBUSY, "rmdir")
        } else {
            (Errno::EISDIR, "unlink")
        };
        let (name, parent) = split_last(&comps, root_errno, op)?;
        let (name, parent) = (&name, &parent);
        self.settle(Scope::Path, |epoch| async move {
            let dir = self.resolve_dir(parent, epoch).await?;
            self.rpc_remove(dir.ino, dir.class, name, directory, epoch)
                .await
        })
        .await?;
        if directory {
            self.cache().remove_dir_tree(&path::join(&comps));
        }
        Ok(())
    }

    /// Removes the non-directory `path` (EISDIR for a directory).
    pub async fn unlink(&self, path: impl AsRef<[u8]>) -> Result<(), TalonError> {
        self.remove_path(path.as_ref(), false).await
    }

    /// Removes the empty directory `path` (ENOTEMPTY otherwise).
    pub async fn rmdir(&self, path: impl AsRef<[u8]>) -> Result<(), TalonError> {
        self.remove_path(path.as_ref(), true).await
    }

    /// Renames `src` to `dst`, replacing a compatible `dst` (`rename(2)`).
    pub async fn rename(
        &self,
        src: impl AsRef<[u8]>,
        dst: impl AsRef<[u8]>,
    ) -> Result<(), TalonError> {
        self.rename_with_flags(src, dst, RenameFlags::REPLACE).await
    }

    /// Renames `src` to `dst` with `renameat2` flags. Atomic across partitions; never EXDEV.
    pub async fn rename_with_flags(
        &self,
        src: impl AsRef<[u8]>,
        dst: impl AsRef<[u8]>,
        flags: RenameFlags,
    ) -> Result<(), TalonError> {
        let src = path::components(src.as_ref())?;
        let dst = path::components(dst.as_ref())?;
        let (src_name, src_parent) = split_last(&src, Errno::EBUSY, "rename")?;
        let (dst_name, dst_parent) = split_last(&dst, Errno::EBUSY, "rename")?;
        if flags.noreplace && flags.exchange {
            return Err(TalonError::posix(
                Errno::EINVAL,
                "NOREPLACE and EXCHANGE together",
            ));
        }
        if src == dst {
            // rename(2) of a name onto itself does nothing, once the name is known to exist.
            self.stat(path::join(&src)).await?;
            return Ok(());
        }
        if dst.len() > src.len() && dst.starts_with(&src) {
            return Err(TalonError::posix(
                Errno::EINVAL,
                format!("cannot move {} into itself", path::display(&src)),
            ));
        }
        let (sn, sp, dn, dp) = (&src_name, &src_parent, &dst_name, &dst_parent);
        let r = self
            .settle(Scope::Path, |epoch| async move {
                let sdir = self.resolve_dir(sp, epoch).await?;
                let ddir = self.resolve_dir(dp, epoch).await?;
                self.rpc_rename(sdir.ino, sdir.class, sn, ddir.ino, dn, flags, epoch)
                    .await
            })
            .await;
        self.cache().remove_dir_tree(&path::join(&src));
        self.cache().remove_dir_tree(&path::join(&dst));
        r
    }

    /// Makes `new` a hard link to the non-directory `existing` (a symlink itself is linked,
    /// not followed); returns the inode's attributes with the new link count.
    pub async fn hard_link(
        &self,
        existing: impl AsRef<[u8]>,
        new: impl AsRef<[u8]>,
    ) -> Result<Attr, TalonError> {
        let from = path::components(existing.as_ref())?;
        let to = path::components(new.as_ref())?;
        let (name, parent) = split_last(&to, Errno::EEXIST, "link")?;
        check_name(&name)?;
        let (from, name, parent) = (&from, &name, &parent);
        self.settle(Scope::Path, |epoch| async move {
            let attr = self.stat_comps(from, epoch).await?;
            if attr.kind == FileKind::Directory {
                return Err(TalonError::posix(
                    Errno::EPERM,
                    "hard links to directories are not allowed",
                ));
            }
            let dir = self.resolve_dir(parent, epoch).await?;
            self.rpc_link(attr.ino, dir.ino, dir.class, name, epoch)
                .await
        })
        .await
    }

    /// The target of symlink `path` (EINVAL if it is not a symlink).
    pub async fn read_link(&self, path: impl AsRef<[u8]>) -> Result<Vec<u8>, TalonError> {
        let attr = self.stat(path).await?;
        if attr.kind != FileKind::Symlink {
            return Err(TalonError::posix(Errno::EINVAL, "not a symlink"));
        }
        self.readlink(attr.ino).await
    }

    /// Sets the access and modification times of `path` to now, creating it as an empty
    /// regular file if it does not exist (`touch`).
    pub async fn touch(&self, path: impl AsRef<[u8]>) -> Result<Attr, TalonError> {
        let path = path.as_ref();
        let attr = match self.stat(path).await {
            Ok(a) => a,
            Err(e) if e.errno() == Errno::ENOENT => return self.create_file(path, 0o644).await,
            Err(e) => return Err(e),
        };
        let now = SetAttr {
            atime: Some(TimeSet::Now),
            mtime: Some(TimeSet::Now),
            ..SetAttr::default()
        };
        self.setattr(attr.ino, now).await
    }

    /// A lazy listing of directory `path` (a symlink to a directory is followed), one page
    /// of at most the cluster's `max_batch` entries per RPC.
    pub async fn read_dir(&self, path: impl AsRef<[u8]>) -> Result<ReadDir, TalonError> {
        let comps = path::components(path.as_ref())?;
        let dir = self
            .settle(Scope::Path, |epoch| self.resolve_dir(&comps, epoch))
            .await?;
        Ok(self.read_dir_ino(dir.ino, self.cluster_map().max_batch, false))
    }

    /// The consistency class of directory `path`.
    pub async fn policy(&self, path: impl AsRef<[u8]>) -> Result<Class, TalonError> {
        let attr = self.stat(path).await?;
        if attr.kind != FileKind::Directory {
            return Err(TalonError::posix(
                Errno::ENOTDIR,
                "a policy belongs to a directory",
            ));
        }
        self.cache().set_class(attr.ino, attr.class);
        Ok(attr.class)
    }

    /// Sets the consistency class of the empty directory `path` (ENOTEMPTY otherwise).
    pub async fn set_policy(
        &self,
        path: impl AsRef<[u8]>,
        class: Class,
    ) -> Result<Attr, TalonError> {
        let attr = self.stat(path).await?;
        if attr.kind != FileKind::Directory {
            return Err(TalonError::posix(
                Errno::ENOTDIR,
                "a policy belongs to a directory",
            ));
        }
        self.set_class(attr.ino, class).await
    }

    /// Removes `path` and, if it is a directory, everything below it (`rm -r`). Memory stays
    /// bounded by one page per directory level.
    pub async fn remove_all(&self, path: impl AsRef<[u8]>) -> Result<(), TalonError> {
        let path = path.as_ref();
        let attr = self.stat(path).await?;
        if attr.kind != FileKind::Directory {
            return self.unlink(path).await;
        }
        self.empty_tree(attr.ino).await?;
        self.rmdir(path).await
    }

    /// Removes everything below directory `top`, depth first, without recursion.
    async fn empty_tree(&self, top: Ino) -> Result<(), TalonError> {
        // Each frame is a directory being emptied and the name it has in its parent.
        let mut stack: Vec<(Ino, Option<Link>)> = vec![(top, None)];
        let page = self.cluster_map().max_batch;
        while let Some((dir, link)) = stack.last().cloned() {
            // Listed from the leader and from the start each time: what was removed is gone.
            let (entries, _) = self
                .readdir_page_read(dir, &DirCursor::start(), page, false, true)
                .await?;
            if entries.is_empty() {
                stack.pop();
                if let Some((parent, name)) = link {
                    ignore_enoent(self.remove(parent, &name, true).await.map(|_| ()))?;
                }
                continue;
            }
            let (dirs, others): (Vec<_>, Vec<_>) = entries
                .into_iter()
                .partition(|e| e.kind == FileKind::Directory);
            stream::iter(others)
                .map(|e| async move {
                    ignore_enoent(self.remove(dir, &e.name, false).await.map(|_| ()))
                })
                .buffer_unordered(REMOVE_CONCURRENCY)
                .try_collect::<Vec<()>>()
                .await?;
            if let Some(d) = dirs.into_iter().next() {
                stack.push((d.ino, Some((dir, d.name))));
            }
        }
        Ok(())
    }
}

fn ignore_enoent(r: Result<(), TalonError>) -> Result<(), TalonError> {
    match r {
        Err(e) if e.errno() == Errno::ENOENT => Ok(()),
        r => r,
    }
}
