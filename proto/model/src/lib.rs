//! Talon's domain model, shared by the server (`talon-meta`) and the client
//! (`talon-client`): inode numbers and their home partitions, entry placement, name
//! validation, attributes, create and setattr requests, file layouts, request flags, retry
//! pauses, and the error type with its mapping to and from the wire.
//!
//! Everything here is pure logic with no I/O (a retry pause is computed here and slept by
//! the caller). Wire structs (prost) stay in `talon-proto`; this crate converts them with
//! `TryFrom`, validating on receipt, into types whose fields are not optional.

pub mod attr;
pub mod backoff;
pub mod create;
pub mod error;
pub mod flags;
pub mod ino;
pub mod layout;
pub mod name;
pub mod placement;
pub mod set_attr;

pub use attr::{Attr, Class, FileKind, Time};
pub use backoff::Backoff;
pub use create::CreateSpec;
pub use error::{Errno, TalonError};
pub use flags::{RenameFlags, XattrFlags, SYMLINK_XATTR};
pub use ino::{Ino, ROOT_INO};
pub use layout::{ChunkRef, Layout};
pub use name::{check_name, validate_name};
pub use placement::{entry_partition, Placement};
pub use set_attr::{SetAttr, TimeSet};
