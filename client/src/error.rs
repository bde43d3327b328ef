//! The error of [`Client::connect`](crate::Client::connect). Every other operation returns
//! `talon_model::TalonError`, whose variants already say whether to retry; this type only
//! covers what can go wrong before a client exists.

use talon_model::TalonError;

/// Why a client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No seed address was given.
    #[error("no cluster address given")]
    NoSeeds,
    /// A seed address is not a valid `host:port`.
    #[error("bad cluster address {addr:?}: {reason}")]
    BadAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No seed answered `GetClusterMap`.
    #[error("no cluster node reachable at {seeds}: {last}")]
    Unreachable {
        /// The seeds tried, comma separated.
        seeds: String,
        /// The last error seen.
        last: TalonError,
    },
    /// A node answered with a cluster map that does not make sense.
    #[error("invalid cluster map: {0}")]
    BadClusterMap(String),
}
