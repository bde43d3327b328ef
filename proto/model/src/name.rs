//! Name validation at the edge: a directory entry name is 1 to 255 bytes, contains neither
//! `/` nor NUL, and is not `.` or `..`. Both the client and the server check, so a bad name
//! never reaches a Raft log.

use crate::error::{Errno, TalonError};

/// Longest entry name in bytes (NAME_MAX).
pub const NAME_MAX: usize = 255;

/// Longest symlink target in bytes (PATH_MAX).
pub const PATH_MAX: usize = 4096;

/// Checks an entry name; returns the POSIX error a file system would give for it.
pub fn validate_name(name: &[u8]) -> Result<(), Errno> {
    if name.is_empty() {
        return Err(Errno::ENOENT);
    }
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name == b"." || name == b".." || name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// Checks an entry name as [`validate_name`] does, as the error an operation answers.
pub fn check_name(name: &[u8]) -> Result<(), TalonError> {
    validate_name(name).map_err(|errno| {
        TalonError::posix(
            errno,
            format!("invalid name {:?}", String::from_utf8_lossy(name)),
        )
    })
}

/// Checks a symlink target: non-empty, at most PATH_MAX bytes, no NUL.
pub fn validate_symlink_target(target: &[u8]) -> Result<(), Errno> {
    if target.is_empty() {
        return Err(Errno::ENOENT);
    }
    if target.len() > PATH_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if target.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_posix_rejects() {
        assert_eq!(validate_name(b""), Err(Errno::ENOENT));
        assert_eq!(validate_name(b"."), Err(Errno::EINVAL));
        assert_eq!(validate_name(b".."), Err(Errno::EINVAL));
        assert_eq!(validate_name(b"a/b"), Err(Errno::EINVAL));
        assert_eq!(validate_name(b"a\0b"), Err(Errno::EINVAL));
        assert_eq!(validate_name(&[b'x'; 256]), Err(Errno::ENAMETOOLONG));
        assert_eq!(validate_name(&[b'x'; 255]), Ok(()));
        assert_eq!(validate_name(b"..."), Ok(()));
        assert_eq!(validate_name("ünïcode.jpg".as_bytes()), Ok(()));
    }
}
