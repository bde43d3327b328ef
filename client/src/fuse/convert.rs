//! Conversions between Talon's domain types and the kernel's view: attributes, file kinds,
//! times, entry TTLs, and the one place a [`TalonError`] becomes an errno.
//!
//! Errors are mapped here and nowhere else in the mount: a POSIX error keeps its errno (Talon
//! uses Linux values), a malformed request is EINVAL, a transient one EAGAIN, and anything
//! else (an unreachable cluster, a broken node) is EIO with a log line, since the
//! application only sees the number.

use fuser::{FileAttr, FileType, INodeNo};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use talon_model::{Attr, Class, FileKind, TalonError, Time};

/// Block size reported in `st_blksize`: the preferred I/O size, which `cp` and friends use
/// as their buffer size. Large, so a copy sends few, big writes.
pub(crate) const BLKSIZE: u32 = 1 << 20;

/// The errno for `e`, logging what the number alone would hide.
pub(crate) fn errno(op: &str, e: &TalonError) -> fuser::Errno {
    match e {
        TalonError::Posix { .. } => tracing::debug!("{op}: {e}"),
        _ => tracing::warn!("{op}: {e}"),
    }
    fuser::Errno::from_i32(e.errno().0)
}

/// The kernel's file type for a Talon kind.
pub(crate) fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

/// The kind a `mknod` mode asks for; `None` for a type mknod cannot make.
pub(crate) fn mknod_kind(mode: u32) -> Option<FileKind> {
    match mode & libc::S_IFMT {
        // Linux treats a zero type as a regular file.
        0 | libc::S_IFREG => Some(FileKind::Regular),
        libc::S_IFIFO => Some(FileKind::Fifo),
        libc::S_IFSOCK => Some(FileKind::Socket),
        libc::S_IFCHR => Some(FileKind::CharDevice),
        libc::S_IFBLK => Some(FileKind::BlockDevice),
        _ => None,
    }
}

/// A Talon time as a `SystemTime`; times the platform cannot represent clamp to the epoch.
pub(crate) fn system_time(t: Time) -> SystemTime {
    let whole = if t.secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(t.secs.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(t.secs.unsigned_abs()))
    };
    whole
        .and_then(|w| w.checked_add(Duration::from_nanos(u64::from(t.nanos))))
        .unwrap_or(UNIX_EPOCH)
}

/// A `SystemTime` as a Talon time (seconds may be negative; nanoseconds never are).
pub(crate) fn talon_time(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: d.subsec_nanos(),
        },
        Err(before) => {
            let d = before.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => Time {
                    secs: -secs,
                    nanos: 0,
                },
                n => Time {
                    secs: -secs - 1,
                    nanos: 1_000_000_000 - n,
                },
            }
        }
    }
}

/// The kernel attributes of `a`. Talon inos map to FUSE node ids unchanged: both number
/// the root 1.
pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: file_type(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // The kernel's dev_t encoding for FUSE is the 32-bit "new" one; larger numbers
        // cannot be shown and are cut.
        rdev: a.rdev as u32,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// The answer to a lookup that caches "no such name" for its TTL: node id 0.
pub fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// How long the kernel may trust entries and attributes of each class.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ttls {
    /// For relaxed paths: the staleness the cluster already allows.
    pub relaxed: Duration,
}

impl Ttls {
    /// The TTL for an inode of class `class`: zero for strict, so every access asks the
    /// cluster and sees the linearizable state.
    pub fn of(&self, class: Class) -> Duration {
        match class {
            Class::Strict => Duration::ZERO,
            Class::Relaxed => self.relaxed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_including_before_the_epoch() {
        for t in [
            Time { secs: 0, nanos: 0 },
            Time {
                secs: 1_700_000_000,
                nanos: 123_456_789,
            },
            Time {
                secs: -1,
                nanos: 500_000_000,
            },
            Time {
                secs: -86_400,
                nanos: 0,
            },
        ] {
            assert_eq!(talon_time(system_time(t)), t);
        }
    }

    #[test]
    fn mknod_types() {
        assert_eq!(mknod_kind(libc::S_IFIFO | 0o644), Some(FileKind::Fifo));
        assert_eq!(mknod_kind(0o644), Some(FileKind::Regular));
        assert_eq!(mknod_kind(libc::S_IFCHR), Some(FileKind::CharDevice));
        assert_eq!(mknod_kind(libc::S_IFDIR | 0o755), None);
        assert_eq!(mknod_kind(libc::S_IFLNK | 0o777), None);
    }

    #[test]
    fn errors_keep_their_posix_number() {
        let e = TalonError::posix(talon_model::Errno::ENOTEMPTY, "x");
        assert_eq!(errno("t", &e).code(), libc::ENOTEMPTY);
        let e = TalonError::Unavailable("down".into());
        assert_eq!(errno("t", &e).code(), libc::EIO);
    }

    #[test]
    fn strict_paths_are_never_cached() {
        let t = Ttls {
            relaxed: Duration::from_secs(2),
        };
        assert_eq!(t.of(Class::Strict), Duration::ZERO);
        assert_eq!(t.of(Class::Relaxed), Duration::from_secs(2));
    }
}
