//! The client's side of the wire, the counterpart of the server's `service.rs`: the only
//! place in the client that builds a `talon-proto` request or reads a reply. The operation
//! modules (`client`, `paths`, `data`, `dir`, `batch`) deal in domain types only; what
//! crosses the wire is decided here, field by field.
//!
//! - [`requests`]: one function per request message, named after it (`LookupRequest` is
//!   [`requests::lookup`]), taking a [`requests::Header`] and domain values (`Ino`, names,
//!   `CreateSpec`, `SetAttr`, flags) and returning the message.
//! - [`replies`]: one function per reply message, named after it (`EntryReply` is
//!   [`replies::entry`]), returning domain values, each checked on receipt so that a
//!   malformed reply is an `Invalid` error, never a panic. Messages that are nouns rather
//!   than answers (a directory entry, a partition's status, the cluster map) convert with
//!   `TryFrom`/`From` into their domain types, as `talon-model` does for attributes,
//!   layouts, create and setattr requests and errors.
//!
//! Invariants: the same domain values always make the same message, and building one has
//! no effects: the caller draws a request id ([`requests::request_id`]) and so decides
//! which attempts share one. What this module must not do: route, retry, touch the cache,
//! or judge a reply against the client's state (the cluster map's own checks are
//! `ClusterMap::validated`, which its conversion here calls).

pub(crate) mod replies;
pub(crate) mod requests;
