//! What a create asks for: the kind, mode, owner and class of a new inode. The client
//! builds a [`CreateSpec`] and sends it as a `CreateRequest`; the server decodes the request
//! back into the same type. Both run [`CreateSpec::check`], so the client fails fast and
//! the server never trusts the wire.
//!
//! Retry tokens and request headers are not part of the spec: they belong to one attempt
//! at sending it, not to what is created.

use crate::attr::{class_from_wire, Class, FileKind};
use crate::error::TalonError;
use crate::ino::Ino;
use crate::name::{check_name, validate_symlink_target};
use talon_proto::v1 as pb;

/// What to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateSpec {
    /// The kind of inode.
    pub kind: FileKind,
    /// Permission bits (07777).
    pub perm: u32,
    /// Device number, for character and block devices.
    pub rdev: u64,
    /// Target, for symlinks.
    pub symlink_target: Vec<u8>,
    /// Class of a new directory; `None` inherits the parent's.
    pub class: Option<Class>,
    /// When false, creating a regular file that exists returns it (open without O_EXCL).
    pub exclusive: bool,
    /// Owner and group of the new inode. On the client, `None` takes the client's `uid`
    /// and `gid` options (the FUSE mount passes the calling process's ids); a spec decoded
    /// from a request always has them.
    pub owner: Option<(u32, u32)>,
}

impl CreateSpec {
    /// A regular file with mode `perm`, failing with EEXIST if the name exists.
    pub fn file(perm: u32) -> CreateSpec {
        CreateSpec {
            kind: FileKind::Regular,
            perm,
            rdev: 0,
            symlink_target: Vec::new(),
            class: None,
            exclusive: true,
            owner: None,
        }
    }

    /// A directory with mode `perm` of class `class` (`None` inherits).
    pub fn dir(perm: u32, class: Option<Class>) -> CreateSpec {
        CreateSpec {
            kind: FileKind::Directory,
            class,
            ..CreateSpec::file(perm)
        }
    }

    /// A symlink pointing at `target`.
    pub fn symlink(target: impl Into<Vec<u8>>) -> CreateSpec {
        CreateSpec {
            kind: FileKind::Symlink,
            symlink_target: target.into(),
            ..CreateSpec::file(0o777)
        }
    }

    /// A special file (fifo, socket, device).
    pub fn node(kind: FileKind, perm: u32, rdev: u64) -> CreateSpec {
        CreateSpec {
            kind,
            rdev,
            ..CreateSpec::file(perm)
        }
    }

    /// Checks that `name` may be created with this spec: a valid entry name, a valid
    /// target for a symlink and none for anything else, a class only for a directory.
    pub fn check(&self, name: &[u8]) -> Result<(), TalonError> {
        check_name(name)?;
        if self.kind == FileKind::Symlink {
            validate_symlink_target(&self.symlink_target)
                .map_err(|errno| TalonError::posix(errno, "invalid symlink target"))?;
        } else if !self.symlink_target.is_empty() {
            return Err(TalonError::Invalid(
                "symlink_target on a non-symlink".into(),
            ));
        }
        if self.class.is_some() && self.kind != FileKind::Directory {
            return Err(TalonError::Invalid(
                "class given for a non-directory".into(),
            ));
        }
        Ok(())
    }

    /// The request that creates `name` in `parent` as this spec says; `owner` stands in
    /// for an owner the spec leaves open.
    pub fn to_request(
        &self,
        header: Option<pb::RequestHeader>,
        parent: Ino,
        name: &[u8],
        owner: (u32, u32),
        request_id: u64,
    ) -> pb::CreateRequest {
        let (uid, gid) = self.owner.unwrap_or(owner);
        pb::CreateRequest {
            header,
            parent: parent.0,
            name: name.to_vec(),
            kind: pb::FileKind::from(self.kind) as i32,
            perm: self.perm & 0o7777,
            uid,
            gid,
            rdev: self.rdev,
            symlink_target: self.symlink_target.clone(),
            class: self.class.map_or(
                pb::ConsistencyClass::Unspecified,
                pb::ConsistencyClass::from,
            ) as i32,
            exclusive: self.exclusive,
            request_id,
        }
    }
}

impl TryFrom<&pb::CreateRequest> for CreateSpec {
    type Error = TalonError;

    /// Decodes the spec of a create request (the name is checked by [`CreateSpec::check`]).
    fn try_from(r: &pb::CreateRequest) -> Result<CreateSpec, TalonError> {
        Ok(CreateSpec {
            kind: FileKind::try_from(r.kind)?,
            perm: r.perm & 0o7777,
            rdev: r.rdev,
            symlink_target: r.symlink_target.clone(),
            class: class_from_wire(r.class)?,
            exclusive: r.exclusive,
            owner: Some((r.uid, r.gid)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Errno;

    fn errno(r: Result<(), TalonError>) -> Option<Errno> {
        match r {
            Err(TalonError::Posix { errno, .. }) => Some(errno),
            _ => None,
        }
    }

    #[test]
    fn checks_name_target_and_class() {
        assert!(CreateSpec::file(0o644).check(b"a").is_ok());
        assert_eq!(
            errno(CreateSpec::file(0o644).check(b"a/b")),
            Some(Errno::EINVAL)
        );
        assert_eq!(
            errno(CreateSpec::symlink("").check(b"l")),
            Some(Errno::ENOENT)
        );
        assert!(CreateSpec::symlink("t").check(b"l").is_ok());
        let mut f = CreateSpec::file(0o644);
        f.symlink_target = b"t".to_vec();
        assert!(matches!(f.check(b"f"), Err(TalonError::Invalid(_))));
        let mut f = CreateSpec::file(0o644);
        f.class = Some(Class::Strict);
        assert!(matches!(f.check(b"f"), Err(TalonError::Invalid(_))));
        assert!(CreateSpec::dir(0o755, Some(Class::Strict))
            .check(b"d")
            .is_ok());
    }

    #[test]
    fn request_round_trip() {
        let spec = CreateSpec::dir(0o1755, Some(Class::Strict));
        let req = spec.to_request(None, Ino(1), b"d", (5, 6), 99);
        assert_eq!((req.uid, req.gid, req.request_id), (5, 6, 99));
        let back = CreateSpec::try_from(&req).expect("decodes");
        assert_eq!(
            back,
            CreateSpec {
                owner: Some((5, 6)),
                ..spec
            }
        );
        let mut bad = req;
        bad.kind = 99;
        assert!(CreateSpec::try_from(&bad).is_err());
    }
}
