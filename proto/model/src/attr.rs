//! Inode attributes and their wire conversions. `Attr` is what a stat shows; the server
//! stores it as the inode record, the client caches it for relaxed paths.

use crate::error::TalonError;
use crate::ino::Ino;
use serde::{Deserialize, Serialize};
use talon_proto::v1 as pb;

/// What kind of object an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix domain socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

/// A directory's consistency class (see DESIGN.md, "Placement").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Class {
    /// Entries spread by hash of (parent, name); reads may be served stale within a bound.
    Relaxed,
    /// Entries co-located by hash of parent; every operation is linearizable.
    Strict,
}

impl Class {
    /// The name `talon policy` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Relaxed => "relaxed",
            Class::Strict => "strict",
        }
    }
}

impl std::str::FromStr for Class {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "relaxed" => Ok(Class::Relaxed),
            "strict" => Ok(Class::Strict),
            other => Err(format!(
                "unknown class {other:?}: expected relaxed or strict"
            )),
        }
    }
}

/// A point in time, seconds and nanoseconds since the Unix epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Time {
    /// Seconds since the epoch (may be negative).
    pub secs: i64,
    /// Nanoseconds, below 1e9.
    pub nanos: u32,
}

impl Time {
    /// The current wall-clock time.
    pub fn now() -> Time {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        }
    }

    /// Milliseconds since the epoch (0 for a time before it).
    pub fn as_millis(&self) -> u64 {
        u64::try_from(self.secs)
            .unwrap_or(0)
            .saturating_mul(1000)
            .saturating_add(u64::from(self.nanos / 1_000_000))
    }
}

/// The attributes of one inode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    /// The inode number.
    pub ino: Ino,
    /// What it is.
    pub kind: FileKind,
    /// Permission, set-id and sticky bits (07777).
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (the target's length for a symlink).
    pub size: u64,
    /// Hard link count (2 + subdirectories for a directory).
    pub nlink: u32,
    /// Last access.
    pub atime: Time,
    /// Last content change.
    pub mtime: Time,
    /// Last attribute change.
    pub ctime: Time,
    /// Creation.
    pub crtime: Time,
    /// Bumped when the contents are replaced.
    pub generation: u64,
    /// Consistency class (directories: their own; others: the class they were created in).
    pub class: Class,
    /// Device number for device nodes.
    pub rdev: u64,
    /// Directories: the parent's ino. Others: 0.
    pub parent: Ino,
}

impl From<FileKind> for pb::FileKind {
    fn from(k: FileKind) -> Self {
        match k {
            FileKind::Regular => pb::FileKind::Regular,
            FileKind::Directory => pb::FileKind::Directory,
            FileKind::Symlink => pb::FileKind::Symlink,
            FileKind::Fifo => pb::FileKind::Fifo,
            FileKind::Socket => pb::FileKind::Socket,
            FileKind::CharDevice => pb::FileKind::CharDevice,
            FileKind::BlockDevice => pb::FileKind::BlockDevice,
        }
    }
}

impl TryFrom<i32> for FileKind {
    type Error = TalonError;
    fn try_from(v: i32) -> Result<Self, TalonError> {
        match pb::FileKind::try_from(v) {
            Ok(pb::FileKind::Regular) => Ok(FileKind::Regular),
            Ok(pb::FileKind::Directory) => Ok(FileKind::Directory),
            Ok(pb::FileKind::Symlink) => Ok(FileKind::Symlink),
            Ok(pb::FileKind::Fifo) => Ok(FileKind::Fifo),
            Ok(pb::FileKind::Socket) => Ok(FileKind::Socket),
            Ok(pb::FileKind::CharDevice) => Ok(FileKind::CharDevice),
            Ok(pb::FileKind::BlockDevice) => Ok(FileKind::BlockDevice),
            _ => Err(TalonError::Invalid(format!("unknown file kind {v}"))),
        }
    }
}

impl From<Class> for pb::ConsistencyClass {
    fn from(c: Class) -> Self {
        match c {
            Class::Relaxed => pb::ConsistencyClass::Relaxed,
            Class::Strict => pb::ConsistencyClass::Strict,
        }
    }
}

/// Permission bits `perm` without the set-user-ID bit, and without the set-group-ID bit if
/// they are group-executable (without it, that bit marks mandatory locking, not privilege):
/// what a write or truncate by a caller that may not keep them, or a chown, leaves.
pub fn without_setid(perm: u32) -> u32 {
    let mut p = perm & !0o4000;
    if p & 0o010 != 0 {
        p &= !0o2000;
    }
    p
}

/// Decodes a wire class; `Ok(None)` is "unspecified" (inherit).
pub fn class_from_wire(v: i32) -> Result<Option<Class>, TalonError> {
    match pb::ConsistencyClass::try_from(v) {
        Ok(pb::ConsistencyClass::Unspecified) => Ok(None),
        Ok(pb::ConsistencyClass::Relaxed) => Ok(Some(Class::Relaxed)),
        Ok(pb::ConsistencyClass::Strict) => Ok(Some(Class::Strict)),
        Err(_) => Err(TalonError::Invalid(format!(
            "unknown consistency class {v}"
        ))),
    }
}

impl From<Time> for pb::Timestamp {
    fn from(t: Time) -> Self {
        pb::Timestamp {
            secs: t.secs,
            nanos: t.nanos,
        }
    }
}

impl TryFrom<pb::Timestamp> for Time {
    type Error = TalonError;
    fn try_from(t: pb::Timestamp) -> Result<Self, TalonError> {
        if t.nanos >= 1_000_000_000 {
            return Err(TalonError::Invalid(format!(
                "timestamp nanos {} out of range",
                t.nanos
            )));
        }
        Ok(Time {
            secs: t.secs,
            nanos: t.nanos,
        })
    }
}

impl From<&Attr> for pb::Attr {
    fn from(a: &Attr) -> Self {
        pb::Attr {
            ino: a.ino.0,
            kind: pb::FileKind::from(a.kind) as i32,
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            nlink: a.nlink,
            atime: Some(a.atime.into()),
            mtime: Some(a.mtime.into()),
            ctime: Some(a.ctime.into()),
            crtime: Some(a.crtime.into()),
            generation: a.generation,
            class: pb::ConsistencyClass::from(a.class) as i32,
            rdev: a.rdev,
            parent: a.parent.0,
        }
    }
}

fn time_field(t: Option<pb::Timestamp>, what: &str) -> Result<Time, TalonError> {
    t.ok_or_else(|| TalonError::Invalid(format!("attr without {what}")))?
        .try_into()
}

impl TryFrom<pb::Attr> for Attr {
    type Error = TalonError;
    fn try_from(a: pb::Attr) -> Result<Self, TalonError> {
        Ok(Attr {
            ino: Ino(a.ino),
            kind: FileKind::try_from(a.kind)?,
            perm: a.perm & 0o7777,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            nlink: a.nlink,
            atime: time_field(a.atime, "atime")?,
            mtime: time_field(a.mtime, "mtime")?,
            ctime: time_field(a.ctime, "ctime")?,
            crtime: time_field(a.crtime, "crtime")?,
            generation: a.generation,
            class: class_from_wire(a.class)?.unwrap_or(Class::Relaxed),
            rdev: a.rdev,
            parent: Ino(a.parent),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_round_trips_through_the_wire() {
        let a = Attr {
            ino: Ino::new(3, 42),
            kind: FileKind::CharDevice,
            perm: 0o4755,
            uid: 1000,
            gid: 100,
            size: 7,
            nlink: 1,
            atime: Time { secs: -5, nanos: 9 },
            mtime: Time { secs: 1, nanos: 2 },
            ctime: Time { secs: 3, nanos: 4 },
            crtime: Time { secs: 5, nanos: 6 },
            generation: 8,
            class: Class::Strict,
            rdev: 0x0801,
            parent: Ino(0),
        };
        let wire = pb::Attr::from(&a);
        assert_eq!(Attr::try_from(wire).ok(), Some(a));
    }

    #[test]
    fn rejects_unknown_kind() {
        assert!(FileKind::try_from(99).is_err());
    }
}
