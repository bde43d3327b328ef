//! Talon's domain model, shared by the server (`talon-meta`) and the client
//! (`talon-client`): inode numbers and their home partitions, entry placement, name
//! validation, attributes, request flags, and the error type with its mapping to and from
//! the wire.
//!
//! Everything here is pure logic with no I/O. Wire structs (prost) stay in `talon-proto`;
//! this crate converts them with `TryFrom`, validating on receipt, into types whose fields
//! are not optional.

pub mod attr;
pub mod error;
pub mod flags;
pub mod ino;
pub mod name;
pub mod placement;

pub use attr::{Attr, Class, FileKind, Time};
pub use error::{Errno, TalonError};
pub use flags::{RenameFlags, XattrFlags, SYMLINK_XATTR};
pub use ino::{Ino, ROOT_INO};
pub use name::validate_name;
pub use placement::{entry_partition, Placement};
