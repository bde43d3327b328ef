//! A client's hold on a file it keeps open: on the chunks it stored and has not committed
//! yet, and on the file itself once unlinked.
//!
//! The servers take a chunk that no layout names, once it is older than their grace
//! (`chunk_gc_grace_ms`, ten minutes by default), for a dead writer's, and reclaim an
//! unlinked file once it has been unlinked for `unlinked_grace_ms` (30 s). A client can be
//! alive and slower than either: a checkpoint of hundreds of GB, or a log kept open for a
//! whole training run, commits long after it stored its first chunks; a temporary file is
//! unlinked at once and then written and read through its handle; a reader loads a large
//! checkpoint while another process replaces it. So an open [`File`](crate::File) that
//! writes, or that reads a chunked file, holds an [`OpenSession`] on the file's home
//! partition (`HoldOpen`): each write id carries the session's id in its high bits
//! (`write_id >> SESSION_SHIFT`), the collector keeps the chunks of a held session however
//! old they are, and an unlinked file with a held session lives until it is ended, as POSIX
//! keeps an unlinked file while it is open.
//!
//! The session is started in the background a quarter of the shorter grace after the File
//! is opened (a chunk it stores can be collected only once a whole grace old, and a file
//! unlinked meanwhile only a whole grace after the unlink), so a File closed sooner, as
//! nearly every one is, never pays for it; it is then renewed every third of the lease the
//! server answers, and ended when the File drops it, which makes its uncommitted chunks
//! garbage and an unlinked file reclaimable at once. A commit of chunks names the session
//! once it has been asked for (and waits for the answer): the server applies the commit
//! only while the session is held. A writer cut off for longer than its lease (the session
//! expired, and its chunks may be gone) is refused at its commit with EIO, loudly, instead
//! of committing a layout that names missing chunks.

use crate::client::Client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use talon_model::{Errno, Ino, TalonError};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// Bits of a chunk's write id below its open session's id (the server's `SESSION_SHIFT`).
const SESSION_SHIFT: u32 = 24;

/// Where a session stands, as its keeper last found it.
#[derive(Clone, Debug)]
enum Standing {
    /// The start is under way.
    Starting,
    /// Held (started, and renewed in time).
    Held,
    /// Not held: the start failed, or the server refused a renewal (expired, or the file is
    /// gone). A commit with it would be refused.
    Lost(TalonError),
}

/// An open session held on one file for one open File (see the module docs).
pub(crate) struct OpenSession {
    client: Client,
    ino: Ino,
    id: u64,
    /// Write ids handed out (the low `SESSION_SHIFT` bits of each).
    stores: u64,
    /// Whether the keeper has asked for the session yet.
    asked: Arc<AtomicBool>,
    /// Tells the keeper to ask now rather than after its delay.
    hurry: Arc<Notify>,
    state: watch::Receiver<Standing>,
    keeper: JoinHandle<()>,
    /// The runtime the session was started on, which ends it: a File may be dropped on a
    /// thread outside it (the mount's session thread closes clean handles).
    runtime: tokio::runtime::Handle,
}

impl OpenSession {
    /// A new session on `ino`, for a File just opened or chunks about to be stored: held in
    /// the background from a quarter of the servers' shorter grace on (needs a tokio
    /// runtime).
    pub(crate) fn start(client: &Client, ino: Ino) -> OpenSession {
        let id = (rand::random::<u64>() >> SESSION_SHIFT).max(1);
        let (tx, state) = watch::channel(Standing::Starting);
        let asked = Arc::new(AtomicBool::new(false));
        let hurry = Arc::new(Notify::new());
        let delay = client.cluster_map().open_session_delay();
        let runtime = tokio::runtime::Handle::current();
        let keeper = runtime.spawn(keep(
            client.clone(),
            ino,
            id,
            delay,
            asked.clone(),
            hurry.clone(),
            tx,
        ));
        OpenSession {
            client: client.clone(),
            ino,
            id,
            stores: 0,
            asked,
            hurry,
            state,
            keeper,
            runtime,
        }
    }

    /// A fresh write id for one chunk store of this session.
    pub(crate) fn write_id(&mut self) -> Result<u64, TalonError> {
        if self.stores + 1 >= 1 << SESSION_SHIFT {
            return Err(TalonError::posix(
                Errno::EFBIG,
                "an open session stores at most 16,777,215 chunks: commit and reopen the file",
            ));
        }
        self.stores += 1;
        Ok(self.id << SESSION_SHIFT | self.stores)
    }

    /// Holds the session now, not after the delay, and waits until it is held: for a File
    /// whose file is about to lose its last name, or has lost it already, whose grace may
    /// end sooner than the delay (a nearly full node halves it).
    pub(crate) async fn hold_now(&mut self) -> Result<(), TalonError> {
        self.hurry.notify_one();
        self.asked_and_held().await.map(|_| ())
    }

    /// The session a commit of chunks names: 0 while it has not been asked for (the File is
    /// younger than a quarter of the shorter grace, and so is every chunk it stored), else
    /// its id once it is held; or the error that lost it.
    pub(crate) async fn held(&mut self) -> Result<u64, TalonError> {
        if !self.asked.load(Ordering::Acquire) {
            return Ok(0);
        }
        self.asked_and_held().await
    }

    /// The session's id once the keeper's question is answered, or the error that lost it.
    async fn asked_and_held(&mut self) -> Result<u64, TalonError> {
        let state = self
            .state
            .wait_for(|s| !matches!(s, Standing::Starting))
            .await
            .map_err(|_| TalonError::Unavailable("the open session's keeper stopped".into()))?;
        match &*state {
            Standing::Lost(e) => Err(e.clone()),
            _ => Ok(self.id),
        }
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.keeper.abort();
        if !self.asked.load(Ordering::Acquire) {
            return;
        }
        // Ended in the background: the File is closed (its writes committed, or given up),
        // so the session's uncommitted chunks are garbage and the file, if unlinked, can go.
        // If the runtime has shut down, it expires instead.
        let (client, ino, id) = (self.client.clone(), self.ino, self.id);
        self.runtime.spawn(async move {
            if let Err(e) = client.rpc_hold_open(ino, id, false, true).await {
                tracing::debug!(ino = %ino, "ending an open session: {e}");
            }
        });
    }
}

/// Starts session `id` on `ino` after `delay` (or when hurried), then renews it every third
/// of its lease until aborted or refused; notes that it asked in `asked` and reports where
/// the session stands through `tx`.
async fn keep(
    client: Client,
    ino: Ino,
    id: u64,
    delay: Duration,
    asked: Arc<AtomicBool>,
    hurry: Arc<Notify>,
    tx: watch::Sender<Standing>,
) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = hurry.notified() => {}
    }
    asked.store(true, Ordering::Release);
    let mut renew = false;
    let mut lease = Duration::from_secs(60);
    loop {
        match client.rpc_hold_open(ino, id, renew, false).await {
            Ok(ms) => {
                lease = Duration::from_millis(ms.max(150));
                tx.send_replace(Standing::Held);
                renew = true;
                tokio::time::sleep(lease / 3).await;
            }
            // Refused by the server (expired, the file gone), or never started: a commit
            // with this session would be refused; the writer learns it there.
            Err(e) if !renew || matches!(e, TalonError::Posix { .. }) => {
                tracing::warn!(ino = %ino, "open session {id:x} lost: {e}");
                tx.send_replace(Standing::Lost(e));
                return;
            }
            // Unreachable for now (the call already retried up to its deadline): try again
            // while the lease may still run.
            Err(e) => {
                tracing::debug!(ino = %ino, "renewing open session {id:x}: {e}");
                tokio::time::sleep(lease / 10).await;
            }
        }
    }
}
