//! The one wrapper above the router that makes an operation settle: it runs an attempt
//! with the client's namespace epoch and, when a partition refused the attempt for a
//! reason this client can repair, repairs it and runs the attempt again.
//!
//! | answer         | repair before the next attempt                               | how often          |
//! |----------------|--------------------------------------------------------------|--------------------|
//! | `StaleEpoch`   | adopt the newer epoch (older cache entries drop); a path op  | `STALE_ATTEMPTS`,  |
//! |                | drops the whole cache, since a component may have moved      | contention pauses  |
//! | `ClassChanged` | forget the class the attempt was routed by: the directory's  | once               |
//! |                | ([`Scope::Dir`]) or every class ([`Scope::Path`])            |                    |
//!
//! A refused attempt changed nothing, so running it again is safe. Choosing a replica, a
//! leader or the next node belongs to the router ([`crate::router`]), and so does a lost
//! reply: the router sends the very same request again, whose request id makes the server
//! answer the copy as it answered the first. What an operation whose outcome is still
//! unknown believed about a name is dropped by that operation (`rpc_remove`). This module
//! must not retry answers given after the server acted (POSIX errnos, `Invalid`), and has
//! no pauses of its own: they are [`Backoff::contention`]'s.

use crate::client::Client;
use std::future::Future;
use talon_model::{Backoff, Class, Ino, TalonError};

/// Attempts of an operation that partitions keep refusing with `StaleEpoch` (directory
/// renames landing between resolving a path and using it) before the refusal is returned.
const STALE_ATTEMPTS: usize = 32;

/// What an attempt was routed by, so what a refusal invalidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Inode numbers only: a `ClassChanged` answer has nothing to repair and is returned.
    Inode,
    /// Entries of this directory, routed by its class.
    Dir(Ino),
    /// A path, resolved through the cache from the root.
    Path,
}

impl Client {
    /// Runs `attempt` with the current epoch until it settles, repairing what a refusal
    /// says is out of date (see the module docs).
    pub(crate) async fn settle<T, F, Fut>(&self, scope: Scope, attempt: F) -> Result<T, TalonError>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = Result<T, TalonError>>,
    {
        let mut backoff = Backoff::contention();
        let mut stale = 1;
        let mut class_repaired = false;
        loop {
            match attempt(self.epoch()).await {
                Err(TalonError::StaleEpoch { epoch }) if stale < STALE_ATTEMPTS => {
                    stale += 1;
                    self.cache().observe_epoch(epoch);
                    if scope == Scope::Path {
                        self.cache().clear();
                    }
                    tokio::time::sleep(backoff.pause()).await;
                }
                Err(TalonError::ClassChanged(m)) if !class_repaired && scope != Scope::Inode => {
                    tracing::debug!(?scope, "class changed ({m}); dropping the cached class");
                    class_repaired = true;
                    match scope {
                        Scope::Dir(dir) => self.cache().forget_class(dir),
                        _ => {
                            self.cache().clear();
                            self.cache().clear_classes();
                        }
                    }
                }
                r => return r,
            }
        }
    }

    /// [`Client::settle`] for an operation on entries of `parent`: each attempt is given
    /// the parent's class (cached, or fetched again after a `ClassChanged` answer).
    pub(crate) async fn settle_in<T, F, Fut>(
        &self,
        parent: Ino,
        attempt: F,
    ) -> Result<T, TalonError>
    where
        F: Fn(Class, u64) -> Fut,
        Fut: Future<Output = Result<T, TalonError>>,
    {
        let attempt = &attempt;
        self.settle(Scope::Dir(parent), |epoch| async move {
            let class = self.dir_class(parent).await?;
            attempt(class, epoch).await
        })
        .await
    }
}
