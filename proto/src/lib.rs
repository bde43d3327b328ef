//! Talon's wire protocol: the generated prost messages and tonic services, nothing else.
//! Domain types and their validation live in `talon-model`; server and client convert at
//! their edges.

#![allow(missing_docs, clippy::all)]

/// The client API (`talon.v1`).
pub mod v1 {
    tonic::include_proto!("talon.v1");
}

/// The node-to-node Raft and transaction service (`talon.raft.v1`).
pub mod raft {
    tonic::include_proto!("talon.raft.v1");
}
