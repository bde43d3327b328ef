//! How an RPC reaches a node: over the network (a tonic channel: HTTP/2 on TCP), or, for
//! a node in this very process, as a direct call into its gRPC service.
//!
//! `talon up` runs its metadata node and its mount in one process. Sent over loopback TCP,
//! every FUSE request still paid for HTTP/2 framing, two socket writes, two socket reads
//! and the wake-ups between them; a profile of an image epoch put a sixth of the process's
//! time in the kernel's TCP paths alone. A [`LocalNode`] hands the request, still a
//! complete gRPC request with its encoded message, straight to the node's service: the
//! same codec, the same size limits, the same handlers and the same errors, minus the
//! connection. Every other node of the cluster map is reached over the network as before.

use std::task::{Context, Poll};
use talon_proto::v1::namespace_client::NamespaceClient;
use tonic::body::Body;
use tonic::transport::Channel;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Local = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, BoxError>;

/// A node served in this process: its address in the cluster map, and its gRPC service.
#[derive(Clone)]
pub struct LocalNode {
    addr: String,
    service: Local,
}

impl LocalNode {
    /// The node at `addr` (as the cluster map names it) is `service`, a tonic service
    /// such as the metadata node's `Namespace` server.
    pub fn new<S>(addr: impl Into<String>, service: S) -> LocalNode
    where
        S: Service<http::Request<Body>, Response = http::Response<Body>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        LocalNode {
            addr: addr.into(),
            service: BoxCloneSyncService::new(service.map_err(Into::into)),
        }
    }

    /// The node's address in the cluster map.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl std::fmt::Debug for LocalNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalNode")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The generated gRPC client of the `Namespace` service, sending through a [`Conn`]: what
/// every RPC is made with.
pub type NodeClient = NamespaceClient<Conn>;

/// The way to one node: what the generated `NamespaceClient` sends its requests through.
#[derive(Clone)]
pub enum Conn {
    /// A lazily connected tonic channel.
    Net(Channel),
    /// A node in this process.
    Local(LocalNode),
}

impl Service<http::Request<Body>> for Conn {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Conn::Net(c) => c.poll_ready(cx).map_err(Into::into),
            Conn::Local(l) => l.service.poll_ready(cx),
        }
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        match self {
            Conn::Net(c) => {
                let reply = c.call(req);
                Box::pin(async move { reply.await.map_err(Into::into) })
            }
            Conn::Local(l) => l.service.call(req),
        }
    }
}
