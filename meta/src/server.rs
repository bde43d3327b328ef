//! Starting and stopping a serving node: the body of `talon-meta start` and of `talon up`'s
//! node.
//!
//! [`open`] opens a node ([`Node::open`]: storage and Raft groups) and starts the
//! background loops of the layers above it (stale-transaction recovery, data garbage
//! collection) and the allocator's trims; [`RunningNode::start`] also serves the gRPC edge
//! (`service`) on a listener, and [`RunningNode::shutdown`] stops accepting requests, waits
//! for in-flight ones, then shuts the node down. Nothing outlives `shutdown`, so the same data directory
//! can be opened again at once. It owns process lifetime only: what each loop does lives in
//! its module.

use crate::config::Config;
use crate::node::{Node, StartError};
use std::sync::Arc;
use tokio::net::TcpListener;

/// Opens `config`'s node with every background loop running, not yet serving: a caller in
/// the same process reaches it through `service::namespace` (as `talon up`'s mount does).
pub async fn open(config: Config) -> Result<Arc<Node>, StartError> {
    crate::malloc::tune(config.storage.malloc_arenas);
    let trim_every = std::time::Duration::from_millis(config.storage.trim_every_ms);
    let node = Node::open(config).await?;
    node.spawn(crate::txn::recovery_loop);
    node.spawn(crate::data::gc_loop);
    node.spawn(move |_, cancel| crate::malloc::trim_loop(trim_every, cancel));
    Ok(node)
}

/// A node serving on a listener.
pub struct RunningNode {
    /// The node.
    pub node: Arc<Node>,
    /// The address it listens on.
    pub addr: std::net::SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl RunningNode {
    /// Starts `config`'s node serving on `listener`.
    pub async fn start(config: Config, listener: TcpListener) -> Result<RunningNode, StartError> {
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::Listen(e.to_string()))?;
        let node = open(config).await?;
        let cancel = node.cancel_token();
        let router = crate::service::router(node.clone());
        // Connections from our own listener do not get the router's `tcp_nodelay`; without
        // it a reply written in several segments (a small file's body) waits out the
        // client's delayed ACK, some 40 ms.
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |s| s.and_then(|s| s.set_nodelay(true).map(|()| s)),
        );
        let server = tokio::spawn(async move {
            if let Err(e) = router
                .serve_with_incoming_shutdown(incoming, cancel.cancelled_owned())
                .await
            {
                tracing::error!("server: {e}");
            }
        });
        Ok(RunningNode { node, addr, server })
    }

    /// Stops serving, waits for in-flight requests, then shuts the node down.
    pub async fn shutdown(self) {
        self.node.cancel_token().cancel();
        let _ = self.server.await;
        self.node.shutdown().await;
    }
}

/// Runs a node until `shutdown` resolves: the body of `talon-meta start`.
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| StartError::Listen(format!("{}: {e}", config.listen)))?;
    let running = RunningNode::start(config, listener).await?;
    tracing::info!(addr = %running.addr, node = running.node.config.node_id, "talon-meta serving");
    shutdown.await;
    tracing::info!("shutting down");
    running.shutdown().await;
    Ok(())
}
