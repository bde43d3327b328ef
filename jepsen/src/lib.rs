//! `talon-jepsen`: fault injection on a real Talon cluster, with histories a checker can
//! reject.
//!
//! A run ([`run::run`]) starts a cluster of separate `talon-meta` processes ([`cluster`])
//! inside a private network namespace ([`net`]), drives concurrent workers through the
//! `talon-client` library ([`workload`]), injects faults on a seeded schedule
//! ([`nemesis`]), records every operation as invoke / ok / fail / info JSON lines
//! ([`history`]), and checks the history ([`checker`]). The harness never uses Talon's
//! internals: only the client library's public API and the `talon-meta` binary.

pub mod checker;
pub mod cluster;
pub mod disk;
pub mod history;
pub mod mount;
pub mod nemesis;
pub mod net;
pub mod run;
pub mod workload;
