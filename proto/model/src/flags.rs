//! Request flags both sides read the same way: a rename's (Linux `renameat2`), a
//! set-xattr's (Linux `setxattr`), and the virtual xattr that carries a symlink's target.
//!
//! The client builds them, the wire carries their bits, and the server decodes the bits
//! here, refusing unknown or contradictory ones with EINVAL; neither side spells a bit.

use crate::error::{Errno, TalonError};

/// The virtual xattr through which a symlink's target is read (the protocol has no ReadLink
/// RPC); never stored as an xattr, and its namespace `talon.` is refused to setxattr.
pub const SYMLINK_XATTR: &[u8] = b"talon.symlink";

/// Flags of a rename, as Linux `renameat2` has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with EEXIST instead of replacing the destination.
    pub noreplace: bool,
    /// Atomically swap source and destination, which must both exist.
    pub exchange: bool,
}

impl RenameFlags {
    /// Replace the destination if it exists (plain `rename(2)`).
    pub const REPLACE: RenameFlags = RenameFlags {
        noreplace: false,
        exchange: false,
    };
    /// `RENAME_NOREPLACE`.
    pub const NOREPLACE: RenameFlags = RenameFlags {
        noreplace: true,
        exchange: false,
    };
    /// `RENAME_EXCHANGE`.
    pub const EXCHANGE: RenameFlags = RenameFlags {
        noreplace: false,
        exchange: true,
    };

    /// The wire flags (Linux's bits).
    pub fn bits(self) -> u32 {
        u32::from(self.noreplace) | (u32::from(self.exchange) << 1)
    }

    /// Decodes wire flags: EINVAL for unknown bits, or NOREPLACE with EXCHANGE.
    pub fn from_bits(bits: u32) -> Result<RenameFlags, TalonError> {
        let f = RenameFlags {
            noreplace: bits & 1 != 0,
            exchange: bits & 2 != 0,
        };
        if bits & !3 != 0 || (f.noreplace && f.exchange) {
            return Err(TalonError::posix(
                Errno::EINVAL,
                format!("rename flags {bits:#x}"),
            ));
        }
        Ok(f)
    }
}

/// Flags of a set-xattr, as Linux `setxattr` has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrFlags {
    /// Create or replace.
    #[default]
    Any,
    /// `XATTR_CREATE`: fail with EEXIST if it exists.
    Create,
    /// `XATTR_REPLACE`: fail with ENODATA if it does not exist.
    Replace,
}

impl XattrFlags {
    /// The wire flags (Linux's bits).
    pub fn bits(self) -> u32 {
        match self {
            XattrFlags::Any => 0,
            XattrFlags::Create => 1,
            XattrFlags::Replace => 2,
        }
    }

    /// Decodes wire flags: EINVAL for unknown bits, or CREATE with REPLACE.
    pub fn from_bits(bits: u32) -> Result<XattrFlags, TalonError> {
        match bits {
            0 => Ok(XattrFlags::Any),
            1 => Ok(XattrFlags::Create),
            2 => Ok(XattrFlags::Replace),
            _ => Err(TalonError::posix(
                Errno::EINVAL,
                format!("xattr flags {bits:#x}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_round_trip_and_bad_bits_are_einval() {
        for f in [
            RenameFlags::REPLACE,
            RenameFlags::NOREPLACE,
            RenameFlags::EXCHANGE,
        ] {
            assert_eq!(RenameFlags::from_bits(f.bits()).expect("valid"), f);
        }
        for f in [XattrFlags::Any, XattrFlags::Create, XattrFlags::Replace] {
            assert_eq!(XattrFlags::from_bits(f.bits()).expect("valid"), f);
        }
        for bits in [3, 4, 0x8000_0001] {
            let e = RenameFlags::from_bits(bits).expect_err("invalid");
            assert_eq!(e.errno(), Errno::EINVAL);
            let e = XattrFlags::from_bits(bits).expect_err("invalid");
            assert_eq!(e.errno(), Errno::EINVAL);
        }
    }
}
