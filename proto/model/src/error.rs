//! Talon's error type and its one mapping to and from `tonic::Status`.
//!
//! A caller branches on the variant: `NotLeader`, `WrongPartition`, `StaleEpoch`, `Retry`
//! and `Unavailable` mean "retry, elsewhere or later"; `Posix` is the answer for the user;
//! `Invalid` is a malformed request that no retry fixes. The server maps a `TalonError` to
//! a `Status` once, at its edge, with an encoded `ErrorDetail` in the status details; the
//! client decodes it back with `TalonError::from(Status)`.

use prost::Message;
use talon_proto::v1 as pb;
use tonic::{Code, Status};

/// A POSIX error number (Linux values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

#[allow(missing_docs)]
impl Errno {
    pub const EPERM: Errno = Errno(1);
    pub const ENOENT: Errno = Errno(2);
    pub const EIO: Errno = Errno(5);
    pub const E2BIG: Errno = Errno(7);
    pub const EBADF: Errno = Errno(9);
    pub const EAGAIN: Errno = Errno(11);
    pub const EACCES: Errno = Errno(13);
    pub const EBUSY: Errno = Errno(16);
    pub const EEXIST: Errno = Errno(17);
    pub const EXDEV: Errno = Errno(18);
    pub const ENOTDIR: Errno = Errno(20);
    pub const EISDIR: Errno = Errno(21);
    pub const EINVAL: Errno = Errno(22);
    pub const EFBIG: Errno = Errno(27);
    pub const ENOSPC: Errno = Errno(28);
    pub const EMLINK: Errno = Errno(31);
    pub const ERANGE: Errno = Errno(34);
    pub const ENAMETOOLONG: Errno = Errno(36);
    pub const ENOSYS: Errno = Errno(38);
    pub const ENOTEMPTY: Errno = Errno(39);
    pub const ELOOP: Errno = Errno(40);
    pub const ENODATA: Errno = Errno(61);
    pub const ENOTSUP: Errno = Errno(95);
    pub const ETIMEDOUT: Errno = Errno(110);
    pub const ESTALE: Errno = Errno(116);

    /// The symbolic name, for messages.
    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "EPERM",
            2 => "ENOENT",
            5 => "EIO",
            7 => "E2BIG",
            9 => "EBADF",
            11 => "EAGAIN",
            13 => "EACCES",
            16 => "EBUSY",
            17 => "EEXIST",
            18 => "EXDEV",
            20 => "ENOTDIR",
            21 => "EISDIR",
            22 => "EINVAL",
            27 => "EFBIG",
            28 => "ENOSPC",
            31 => "EMLINK",
            34 => "ERANGE",
            36 => "ENAMETOOLONG",
            38 => "ENOSYS",
            39 => "ENOTEMPTY",
            40 => "ELOOP",
            61 => "ENODATA",
            95 => "ENOTSUP",
            110 => "ETIMEDOUT",
            116 => "ESTALE",
            _ => "errno",
        }
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// An error of any Talon layer that a caller may branch on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TalonError {
    /// A POSIX error: the answer to give the user.
    #[error("{errno}: {message}")]
    Posix {
        /// The error number.
        errno: Errno,
        /// What failed.
        message: String,
    },
    /// This replica is not the partition's leader; retry at `leader_addr` if known.
    #[error("not leader of partition {partition} (leader {leader_id:?} at {leader_addr:?})")]
    NotLeader {
        /// The partition asked for.
        partition: u32,
        /// The leader's node id, when known.
        leader_id: Option<u64>,
        /// The leader's address, when known.
        leader_addr: Option<String>,
    },
    /// The node does not host the partition, or the inode or chunk asked for belongs to
    /// another one: the caller's cluster map is stale.
    #[error("wrong partition: {0}")]
    WrongPartition(String),
    /// The entry belongs to another partition under its directory's current class: the
    /// caller's cached class of the directory is stale.
    #[error("directory class changed: {0}")]
    ClassChanged(String),
    /// The client's cache predates namespace epoch `epoch`.
    #[error("stale namespace epoch: the partition is at epoch {epoch}")]
    StaleEpoch {
        /// The partition's epoch.
        epoch: u64,
    },
    /// Transient: a transaction holds the key, or the node is busy. Retry shortly.
    #[error("retry: {0}")]
    Retry(String),
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The node cannot serve right now (storage failure, shutdown, unreachable).
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl TalonError {
    /// A POSIX error with a message.
    pub fn posix(errno: Errno, message: impl Into<String>) -> TalonError {
        TalonError::Posix {
            errno,
            message: message.into(),
        }
    }

    /// The errno to report to an application for this error.
    pub fn errno(&self) -> Errno {
        match self {
            TalonError::Posix { errno, .. } => *errno,
            TalonError::Invalid(_) => Errno::EINVAL,
            TalonError::Retry(_) => Errno::EAGAIN,
            _ => Errno::EIO,
        }
    }

    /// True if the same request may succeed when sent again (elsewhere or later).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            TalonError::NotLeader { .. }
                | TalonError::WrongPartition(_)
                | TalonError::ClassChanged(_)
                | TalonError::StaleEpoch { .. }
                | TalonError::Retry(_)
                | TalonError::Unavailable(_)
        )
    }

    /// The wire form carried in a status or a batch result.
    pub fn to_detail(&self) -> pb::ErrorDetail {
        use pb::ErrorKind as K;
        let mut d = pb::ErrorDetail {
            message: self.to_string(),
            ..Default::default()
        };
        match self {
            TalonError::Posix { errno, .. } => {
                d.kind = K::Posix as i32;
                d.errno = errno.0;
            }
            TalonError::NotLeader {
                leader_id,
                leader_addr,
                ..
            } => {
                d.kind = K::NotLeader as i32;
                d.leader_id = leader_id.unwrap_or(0);
                d.leader_addr = leader_addr.clone().unwrap_or_default();
            }
            TalonError::WrongPartition(_) => d.kind = K::WrongPartition as i32,
            TalonError::ClassChanged(_) => d.kind = K::ClassChanged as i32,
            TalonError::StaleEpoch { epoch } => {
                d.kind = K::StaleEpoch as i32;
                d.epoch = *epoch;
            }
            TalonError::Retry(_) => d.kind = K::Retry as i32,
            TalonError::Invalid(_) => d.kind = K::Invalid as i32,
            TalonError::Unavailable(_) => d.kind = K::Unavailable as i32,
        }
        d
    }

    /// Decodes the wire form.
    pub fn from_detail(d: pb::ErrorDetail) -> TalonError {
        use pb::ErrorKind as K;
        let message = d.message;
        match K::try_from(d.kind).unwrap_or(K::Unspecified) {
            K::Posix => TalonError::Posix {
                errno: Errno(d.errno),
                message,
            },
            K::NotLeader => TalonError::NotLeader {
                partition: 0,
                leader_id: (d.leader_id != 0).then_some(d.leader_id),
                leader_addr: (!d.leader_addr.is_empty()).then_some(d.leader_addr),
            },
            K::WrongPartition => TalonError::WrongPartition(message),
            K::ClassChanged => TalonError::ClassChanged(message),
            K::StaleEpoch => TalonError::StaleEpoch { epoch: d.epoch },
            K::Retry => TalonError::Retry(message),
            K::Invalid => TalonError::Invalid(message),
            K::Unavailable | K::Unspecified => TalonError::Unavailable(message),
        }
    }
}

impl From<Errno> for TalonError {
    fn from(errno: Errno) -> Self {
        TalonError::Posix {
            errno,
            message: errno.name().to_string(),
        }
    }
}

impl From<TalonError> for Status {
    fn from(e: TalonError) -> Status {
        let code = match &e {
            TalonError::Posix { errno, .. } => match *errno {
                Errno::ENOENT => Code::NotFound,
                Errno::EEXIST => Code::AlreadyExists,
                Errno::EACCES | Errno::EPERM => Code::PermissionDenied,
                _ => Code::FailedPrecondition,
            },
            TalonError::NotLeader { .. } | TalonError::WrongPartition(_) => Code::Unavailable,
            TalonError::StaleEpoch { .. } | TalonError::ClassChanged(_) => Code::Aborted,
            TalonError::Retry(_) => Code::Unavailable,
            TalonError::Invalid(_) => Code::InvalidArgument,
            TalonError::Unavailable(_) => Code::Unavailable,
        };
        let detail = e.to_detail();
        Status::with_details(code, detail.message.clone(), detail.encode_to_vec().into())
    }
}

impl From<Status> for TalonError {
    fn from(s: Status) -> TalonError {
        if !s.details().is_empty() {
            if let Ok(d) = pb::ErrorDetail::decode(s.details()) {
                return TalonError::from_detail(d);
            }
        }
        // A status without our detail comes from the transport, not from a Talon server.
        match s.code() {
            Code::InvalidArgument | Code::OutOfRange => TalonError::Invalid(s.message().into()),
            Code::Unimplemented => TalonError::posix(Errno::ENOSYS, s.message()),
            _ => TalonError::Unavailable(format!("{:?}: {}", s.code(), s.message())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_survives_a_status() {
        let cases = vec![
            TalonError::posix(Errno::ENOTEMPTY, "dir not empty"),
            TalonError::NotLeader {
                partition: 0,
                leader_id: Some(2),
                leader_addr: Some("127.0.0.1:1".into()),
            },
            TalonError::StaleEpoch { epoch: 9 },
            TalonError::Invalid("bad".into()),
        ];
        for e in cases {
            let back = TalonError::from(Status::from(e.clone()));
            assert_eq!(back.errno(), e.errno());
            assert_eq!(std::mem::discriminant(&back), std::mem::discriminant(&e));
        }
    }

    #[test]
    fn transport_errors_are_retryable() {
        let e = TalonError::from(Status::unavailable("connection refused"));
        assert!(e.is_retryable());
    }
}
