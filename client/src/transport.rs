//! How an RPC reaches a node: over the network (a tonic channel: HTTP/2 on TCP), or, for
//! a node in this very process, as a direct call of its `Namespace` service's handler.
//!
//! `talon up` runs its metadata node and its mount in one process. Sent over loopback TCP,
//! every FUSE request still paid for HTTP/2 framing, two socket writes, two socket reads
//! and the wake-ups between them; a profile of an image epoch put a sixth of the process's
//! time in the kernel's TCP paths alone. Handing the node a complete gRPC request instead
//! (the encoded message in an HTTP body) took the connection away but kept the codec: a
//! profile of a cold image epoch through `talon up` still had two fifths of the process's
//! samples under the client's gRPC call, a third of them in tonic and prost around the
//! handler, and each file body copied four times on its way (into the reply's encoding,
//! into the client's decode buffer, growing it, and into the decoded message).
//!
//! So a [`LocalNode`] holds the node's service handler itself, and [`NodeClient`] calls it
//! with the request message as built, and returns the reply message as the handler made
//! it: the same handlers, the same validation at the edge, the same `Status` errors, and
//! the same message size limits (checked on each message's encoded length, which prost
//! computes without encoding: the client's limits and the server's, as over the network,
//! failing with `OutOfRange` as tonic does). Every other node of the cluster map is
//! reached over the network through the generated gRPC client, whose lookups, getattrs,
//! creates and removes go through the node's [`Bundler`] when many are ready at once.

use crate::bundle::Bundler;
use prost::Message;
use std::sync::Arc;
use talon_proto::v1 as pb;
use talon_proto::v1::bundled_reply::Reply;
use talon_proto::v1::bundled_request::Request as BundledReq;
use talon_proto::v1::namespace_client::NamespaceClient;
use talon_proto::v1::namespace_server::Namespace;
use tonic::transport::Channel;
use tonic::{IntoRequest, Response, Status};

/// tonic's default limit on a decoded message, which a client without its own keeps.
const DEFAULT_MAX_DECODING: usize = 4 << 20;

/// A node served in this process: its address in the cluster map, its `Namespace` service
/// handler, and the largest message that service accepts or sends.
#[derive(Clone)]
pub struct LocalNode {
    addr: String,
    api: Arc<dyn Namespace>,
    max_message: usize,
}

impl LocalNode {
    /// The node at `addr` (as the cluster map names it) is `api`, a `Namespace` service
    /// handler such as the metadata node's (`talon_meta::service::api`), which accepts and
    /// sends messages of at most `max_message` bytes encoded, as its gRPC server does.
    pub fn new(addr: impl Into<String>, api: impl Namespace, max_message: usize) -> LocalNode {
        LocalNode {
            addr: addr.into(),
            api: Arc::new(api),
            max_message,
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
            .field("max_message", &self.max_message)
            .finish_non_exhaustive()
    }
}

/// The way to one node.
#[derive(Clone)]
pub enum Conn {
    /// A lazily connected tonic channel, and the bundler of its small requests
    /// ([`crate::bundle`]; none: each request on its own RPC).
    Net(Channel, Option<Arc<Bundler>>),
    /// A node in this process.
    Local(LocalNode),
}

/// A client of one node's `Namespace` service, with the generated gRPC client's methods:
/// what every RPC is made with.
pub struct NodeClient(Inner);

enum Inner {
    Net(NamespaceClient<Channel>, Option<Arc<Bundler>>),
    Local {
        node: LocalNode,
        max_decoding: usize,
        max_encoding: usize,
    },
}

impl NodeClient {
    /// A client sending through `conn`.
    pub fn new(conn: Conn) -> NodeClient {
        NodeClient(match conn {
            Conn::Net(c, b) => Inner::Net(NamespaceClient::new(c), b),
            Conn::Local(node) => Inner::Local {
                node,
                max_decoding: DEFAULT_MAX_DECODING,
                max_encoding: usize::MAX,
            },
        })
    }

    /// Refuses replies larger than `limit` bytes encoded (tonic's default: 4 MiB).
    pub fn max_decoding_message_size(self, limit: usize) -> Self {
        NodeClient(match self.0 {
            Inner::Net(c, b) => Inner::Net(c.max_decoding_message_size(limit), b),
            Inner::Local {
                node, max_encoding, ..
            } => Inner::Local {
                node,
                max_decoding: limit,
                max_encoding,
            },
        })
    }

    /// Refuses to send requests larger than `limit` bytes encoded (default: no limit).
    pub fn max_encoding_message_size(self, limit: usize) -> Self {
        NodeClient(match self.0 {
            Inner::Net(c, b) => Inner::Net(c.max_encoding_message_size(limit), b),
            Inner::Local {
                node, max_decoding, ..
            } => Inner::Local {
                node,
                max_decoding,
                max_encoding: limit,
            },
        })
    }
}

/// OutOfRange, as tonic answers, for a message of `len` bytes encoded past `limit`.
fn within(what: &str, len: usize, limit: usize) -> Result<(), Status> {
    if len > limit {
        return Err(Status::out_of_range(format!(
            "{what} message length too large: found {len} bytes, the limit is: {limit} bytes"
        )));
    }
    Ok(())
}

/// Calls the generated gRPC client's method, or the node's handler in this process.
macro_rules! direct {
    ($self:ident, $name:ident, $request:ident) => {
        match &mut $self.0 {
            Inner::Net(c, _) => c.$name($request).await,
            Inner::Local {
                node,
                max_decoding,
                max_encoding,
            } => {
                let request = $request.into_request();
                let len = request.get_ref().encoded_len();
                within("encoded", len, (*max_encoding).min(node.max_message))?;
                let reply = node.api.$name(request).await?;
                let len = reply.get_ref().encoded_len();
                within("decoded", len, (*max_decoding).min(node.max_message))?;
                Ok(reply)
            }
        }
    };
}

/// One method per RPC of the `Namespace` service, named and typed as the generated gRPC
/// client's.
macro_rules! rpcs {
    ($($name:ident($req:ident) -> $reply:ident;)*) => {
        impl NodeClient {
            $(
                #[doc = concat!("The `", stringify!($name), "` RPC.")]
                pub async fn $name(
                    &mut self,
                    request: impl IntoRequest<pb::$req>,
                ) -> Result<Response<pb::$reply>, Status> {
                    direct!(self, $name, request)
                }
            )*
        }
    };
}

/// As `rpcs!`, for the RPCs a node's bundler may carry in a bundle: `Variant` is the
/// request's in `BundledRequest` and `Answer` its reply's in `BundledReply`.
macro_rules! bundled_rpcs {
    ($($name:ident($req:ident) -> $reply:ident, $variant:ident => $answer:ident;)*) => {
        impl NodeClient {
            $(
                #[doc = concat!("The `", stringify!($name), "` RPC, in a bundle when others wait.")]
                pub async fn $name(
                    &mut self,
                    request: impl IntoRequest<pb::$req>,
                ) -> Result<Response<pb::$reply>, Status> {
                    if let Inner::Net(_, Some(b)) = &self.0 {
                        let req = request.into_request().into_inner();
                        return match b.send(BundledReq::$variant(req)).await? {
                            Reply::$answer(r) => Ok(Response::new(r)),
                            _ => Err(Status::internal(concat!(
                                "a bundled ", stringify!($name), " got another request's reply"
                            ))),
                        };
                    }
                    direct!(self, $name, request)
                }
            )*
        }
    };
}

rpcs! {
    get_cluster_map(ClusterMapRequest) -> ClusterMap;
    status(StatusRequest) -> StatusReply;
    set_attr(SetAttrRequest) -> AttrReply;
    rename(RenameRequest) -> RenameReply;
    link(LinkRequest) -> EntryReply;
    read_dir(ReadDirRequest) -> ReadDirReply;
    get_xattr(GetXattrRequest) -> GetXattrReply;
    set_xattr(SetXattrRequest) -> Empty;
    list_xattr(ListXattrRequest) -> ListXattrReply;
    remove_xattr(RemoveXattrRequest) -> Empty;
    stat_fs(StatFsRequest) -> StatFsReply;
    set_class(SetClassRequest) -> AttrReply;
    batch(BatchRequest) -> BatchReply;
    bundle(BundleRequest) -> BundleReply;
    read_whole(ReadWholeRequest) -> OpenReply;
    open(OpenRequest) -> OpenReply;
    write_small(WriteSmallRequest) -> AttrReply;
    put_chunk(PutChunkRequest) -> Empty;
    get_chunk(GetChunkRequest) -> GetChunkReply;
    commit_layout(CommitLayoutRequest) -> AttrReply;
    hold_open(HoldOpenRequest) -> HoldOpenReply;
}

bundled_rpcs! {
    lookup(LookupRequest) -> EntryReply, Lookup => Entry;
    get_attr(GetAttrRequest) -> AttrReply, GetAttr => Attr;
    create(CreateRequest) -> EntryReply, Create => Entry;
    remove(RemoveRequest) -> RemoveReply, Remove => Remove;
}
