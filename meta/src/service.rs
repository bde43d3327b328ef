//! The gRPC edge of a node: the client `Namespace` service and the node-to-node `Raft`
//! service, on one tonic router. Wire messages are validated and converted to domain
//! values here, and every `TalonError` is mapped to a `tonic::Status` here, once.
//!
//! Bounds enforced at this edge: names (via `talon-model`), batch and bundle sizes
//! (`max_batch`), partition ids, symlink and xattr sizes, and message sizes (tonic's
//! decoding limit), so a malformed request gets an error and never reaches a Raft log.

use crate::attrs::Attrs;
use crate::data::Files;
use crate::namespace::Namespace;
use crate::node::{Node, PeerRequest};
use crate::rename::Renames;
use crate::types::{NodeId, TypeConfig};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use prost::Message;
use std::sync::Arc;
use talon_model::attr::class_from_wire;
use talon_model::{Attr, ChunkRef, CreateSpec, Ino, Layout, SetAttr, TalonError};
use talon_proto::raft::raft_server::{Raft as RaftSvc, RaftServer};
use talon_proto::raft::{RaftReply, RaftRequest};
use talon_proto::v1 as pb;
use talon_proto::v1::namespace_server::{Namespace as NamespaceSvc, NamespaceServer};
use tonic::{Request, Response, Status};

/// Largest client request (a full batch of creates with long names fits well within).
pub const MAX_CLIENT_MESSAGE: usize = 16 << 20;

/// The handler of `node`'s client `Namespace` service. A process that runs `node` and a
/// client of it calls it directly (`talon up`), with [`MAX_CLIENT_MESSAGE`] as its limit.
pub fn api(node: Arc<Node>) -> Api {
    Api { node }
}

/// The client `Namespace` service of `node`, with the edge's message limits, as the router
/// below serves it on the network.
pub fn namespace(node: Arc<Node>) -> NamespaceServer<Api> {
    NamespaceServer::new(api(node))
        .max_decoding_message_size(MAX_CLIENT_MESSAGE)
        .max_encoding_message_size(MAX_CLIENT_MESSAGE)
}

/// The tonic router serving both services of `node`.
pub fn router(node: Arc<Node>) -> tonic::transport::server::Router {
    let ns = namespace(node.clone());
    let raft = RaftServer::new(RaftApi { node })
        .max_decoding_message_size(crate::network::MAX_PEER_MESSAGE)
        .max_encoding_message_size(crate::network::MAX_PEER_MESSAGE);
    server().add_service(ns).add_service(raft)
}

/// Calls a peer may give up on (reset) before this node's server has taken them, per
/// connection, before the server closes the connection. h2's default, 20, guards against
/// floods of opened-and-reset streams. But a node that was stopped or starved of CPU for a
/// moment resumes to find more than that: each leader of a partition it follows has timed
/// out a heartbeat every 100 ms meanwhile. Closing the connection then costs more than the
/// resets did: the leader's replication sees a broken connection, which openraft takes for
/// an unreachable follower and backs off from for half a second, and every call in flight
/// on it fails.
pub const PENDING_RESETS_MAX: usize = 4096;

/// The node server's transport settings, without its services.
pub fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        // Large windows: file bodies and Raft appends are megabytes (see network.rs).
        .initial_stream_window_size(Some(16 << 20))
        .initial_connection_window_size(Some(64 << 20))
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_max_pending_accept_reset_streams(Some(PENDING_RESETS_MAX))
}

/// The client API.
pub struct Api {
    node: Arc<Node>,
}

/// The node-to-node API.
pub struct RaftApi {
    node: Arc<Node>,
}

type Res<T> = Result<Response<T>, Status>;

fn header(h: Option<pb::RequestHeader>) -> pb::RequestHeader {
    h.unwrap_or_default()
}

/// The header of a read request, once a session read has passed its barrier
/// ([`Namespace::session_barrier`]).
async fn read_header(
    node: &Node,
    h: Option<pb::RequestHeader>,
) -> Result<pb::RequestHeader, Status> {
    let h = header(h);
    if h.relaxed_read && h.session_read {
        Namespace::new(node).session_barrier(h.partition).await?;
    }
    Ok(h)
}

fn attr_reply(a: &Attr) -> Option<pb::Attr> {
    Some(pb::Attr::from(a))
}

impl Api {
    /// Refuses a `what` of `n` `items` past the cluster's `max_batch`.
    fn within_max_batch(&self, what: &str, items: &str, n: usize) -> Result<(), TalonError> {
        let max = self.node.config.cluster.max_batch as usize;
        if n > max {
            return Err(TalonError::Invalid(format!(
                "{what} of {n} {items} exceeds max_batch {max}"
            )));
        }
        Ok(())
    }

    fn cluster_map(&self) -> pb::ClusterMap {
        let c = &self.node.config.cluster;
        let epoch = self
            .node
            .partitions
            .values()
            .filter_map(|p| p.store.epoch().ok())
            .max()
            .unwrap_or(0);
        pb::ClusterMap {
            nodes: c
                .nodes
                .iter()
                .map(|n| pb::NodeInfo {
                    id: n.id,
                    addr: n.addr.clone(),
                })
                .collect(),
            partitions: c.partitions,
            replication: c.replication,
            partition_info: (0..c.partitions)
                .map(|p| pb::PartitionInfo {
                    id: p,
                    replicas: self.node.config.replicas(p),
                    leader_hint: self
                        .node
                        .partitions
                        .get(&p)
                        .and_then(|x| x.leader())
                        .unwrap_or(0),
                })
                .collect(),
            strict_prefixes: c.strict_prefixes.clone(),
            epoch,
            relaxed_staleness_ms: c.relaxed_staleness_ms,
            root_ino: talon_model::ROOT_INO.0,
            max_batch: c.max_batch,
            small_file_max: c.small_file_max,
            chunk_size: c.chunk_size,
            chunk_gc_grace_ms: c.chunk_gc_grace_ms,
            unlinked_grace_ms: c.unlinked_grace_ms,
        }
    }
}

#[tonic::async_trait]
impl NamespaceSvc for Api {
    async fn get_cluster_map(&self, _r: Request<pb::ClusterMapRequest>) -> Res<pb::ClusterMap> {
        Ok(Response::new(self.cluster_map()))
    }

    async fn status(&self, _r: Request<pb::StatusRequest>) -> Res<pb::StatusReply> {
        let mut parts: Vec<pb::PartitionStatus> = self
            .node
            .partitions
            .values()
            .map(|p| {
                let m = p.raft.metrics().borrow().clone();
                let (inodes, entries) = p
                    .store
                    .read(|v| {
                        Ok((
                            v.counter(crate::keys::meta::INODES)?,
                            v.counter(crate::keys::meta::ENTRIES)?,
                        ))
                    })
                    .unwrap_or((0, 0));
                pb::PartitionStatus {
                    id: p.id,
                    role: match &m.running_state {
                        Ok(()) => format!("{:?}", m.state).to_uppercase(),
                        Err(_) => "FAILED".into(),
                    },
                    leader: m.current_leader.unwrap_or(0),
                    term: m.current_term,
                    last_log_index: m.last_log_index.unwrap_or(0),
                    applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
                    snapshot_index: m.snapshot.map(|l| l.index).unwrap_or(0),
                    purged_index: m.purged.map(|l| l.index).unwrap_or(0),
                    entries,
                    inodes,
                }
            })
            .collect();
        parts.sort_by_key(|p| p.id);
        let addr = self
            .node
            .peers
            .addr(self.node.config.node_id)
            .unwrap_or_default()
            .to_string();
        let (log_appends, log_syncs) = self.node.log_stats();
        let space = self.node.space.reading();
        let memory = self.node.memory();
        Ok(Response::new(pb::StatusReply {
            node_id: self.node.config.node_id,
            addr,
            partitions: parts,
            log_appends,
            log_syncs,
            space_level: space.level.name().to_string(),
            space_used: space.used,
            space_total_bytes: space.fs.total,
            space_usable_bytes: space.usable(self.node.space.config()),
            memory_resident: memory.resident,
            memory_peak_resident: memory.peak_resident,
            memory_memtables: memory.memtables,
            memory_table_readers: memory.table_readers,
            memory_cache: memory.cache,
            memory_cache_pinned: memory.cache_pinned,
        }))
    }

    async fn lookup(&self, r: Request<pb::LookupRequest>) -> Res<pb::EntryReply> {
        let r = r.into_inner();
        let h = read_header(&self.node, r.header).await?;
        let (attr, epoch) = Namespace::new(&self.node)
            .lookup(h.partition, h.relaxed_read, h.epoch, Ino(r.parent), &r.name)
            .await?;
        Ok(Response::new(pb::EntryReply {
            attr: attr_reply(&attr),
            epoch,
            created: false,
            parent: None,
        }))
    }

    async fn get_attr(&self, r: Request<pb::GetAttrRequest>) -> Res<pb::AttrReply> {
        let r = r.into_inner();
        let h = read_header(&self.node, r.header).await?;
        let attr = Attrs::new(&self.node)
            .getattr(h.partition, h.relaxed_read, h.epoch, Ino(r.ino))
            .await?;
        Ok(Response::new(pb::AttrReply {
            attr: attr_reply(&attr),
        }))
    }

    async fn set_attr(&self, r: Request<pb::SetAttrRequest>) -> Res<pb::AttrReply> {
        let r = r.into_inner();
        let h = header(r.header);
        let change = SetAttr::try_from(&r)?.resolve(crate::clock::now());
        let attr = Attrs::new(&self.node)
            .setattr(h.partition, h.epoch, Ino(r.ino), change)
            .await?;
        Ok(Response::new(pb::AttrReply {
            attr: attr_reply(&attr),
        }))
    }

    async fn create(&self, r: Request<pb::CreateRequest>) -> Res<pb::EntryReply> {
        let r = r.into_inner();
        let h = header(r.header);
        self.node.room_for(h.partition, 0)?;
        let spec = CreateSpec::try_from(&r)?;
        let made = Namespace::new(&self.node)
            .create(
                h.partition,
                h.epoch,
                Ino(r.parent),
                &r.name,
                &spec,
                r.request_id,
            )
            .await?;
        Ok(Response::new(pb::EntryReply {
            attr: attr_reply(&made.attr),
            epoch: made.epoch,
            created: made.new,
            parent: made.parent.as_ref().and_then(attr_reply),
        }))
    }

    async fn remove(&self, r: Request<pb::RemoveRequest>) -> Res<pb::RemoveReply> {
        let r = r.into_inner();
        let h = header(r.header);
        let gone = Namespace::new(&self.node)
            .remove(
                h.partition,
                h.epoch,
                Ino(r.parent),
                &r.name,
                r.directory,
                r.request_id,
            )
            .await?;
        Ok(Response::new(pb::RemoveReply {
            ino: gone.ino.0,
            nlink: gone.nlink,
            parent: gone.parent.as_ref().and_then(attr_reply),
        }))
    }

    async fn rename(&self, r: Request<pb::RenameRequest>) -> Res<pb::RenameReply> {
        let r = r.into_inner();
        let h = header(r.header);
        let epoch = Renames::new(&self.node)
            .rename(
                h.partition,
                h.epoch,
                Ino(r.src_parent),
                &r.src_name,
                Ino(r.dst_parent),
                &r.dst_name,
                r.flags,
                r.request_id,
            )
            .await?;
        Ok(Response::new(pb::RenameReply { epoch }))
    }

    async fn link(&self, r: Request<pb::LinkRequest>) -> Res<pb::EntryReply> {
        let r = r.into_inner();
        let h = header(r.header);
        self.node.room_for(h.partition, 0)?;
        let (attr, epoch) = Namespace::new(&self.node)
            .link(
                h.partition,
                h.epoch,
                Ino(r.ino),
                (Ino(r.new_parent), &r.new_name),
                r.request_id,
            )
            .await?;
        Ok(Response::new(pb::EntryReply {
            attr: attr_reply(&attr),
            epoch,
            created: false,
            parent: None,
        }))
    }

    async fn read_dir(&self, r: Request<pb::ReadDirRequest>) -> Res<pb::ReadDirReply> {
        let r = r.into_inner();
        if r.after.len() > talon_model::name::NAME_MAX {
            return Err(TalonError::Invalid("cursor name over 255 bytes".into()).into());
        }
        let h = read_header(&self.node, r.header).await?;
        let (entries, more) = Namespace::new(&self.node)
            .readdir(
                h.partition,
                h.relaxed_read,
                h.epoch,
                Ino(r.dir),
                &r.after,
                r.limit,
                r.plus,
            )
            .await?;
        let entries = entries
            .into_iter()
            .map(|(name, d, attr)| pb::DirEntry {
                name,
                ino: d.ino.0,
                kind: pb::FileKind::from(d.kind) as i32,
                attr: attr.as_ref().map(pb::Attr::from),
            })
            .collect();
        Ok(Response::new(pb::ReadDirReply { entries, more }))
    }

    async fn get_xattr(&self, r: Request<pb::GetXattrRequest>) -> Res<pb::GetXattrReply> {
        let r = r.into_inner();
        let h = read_header(&self.node, r.header).await?;
        let value = Attrs::new(&self.node)
            .getxattr(h.partition, h.relaxed_read, h.epoch, Ino(r.ino), &r.name)
            .await?;
        Ok(Response::new(pb::GetXattrReply { value }))
    }

    async fn set_xattr(&self, r: Request<pb::SetXattrRequest>) -> Res<pb::Empty> {
        let r = r.into_inner();
        let h = header(r.header);
        self.node.room_for(h.partition, r.value.len())?;
        Attrs::new(&self.node)
            .setxattr(
                h.partition,
                h.epoch,
                Ino(r.ino),
                &r.name,
                Some(r.value),
                r.flags,
                r.request_id,
            )
            .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn list_xattr(&self, r: Request<pb::ListXattrRequest>) -> Res<pb::ListXattrReply> {
        let r = r.into_inner();
        let h = read_header(&self.node, r.header).await?;
        let names = Attrs::new(&self.node)
            .listxattr(h.partition, h.relaxed_read, h.epoch, Ino(r.ino))
            .await?;
        Ok(Response::new(pb::ListXattrReply { names }))
    }

    async fn remove_xattr(&self, r: Request<pb::RemoveXattrRequest>) -> Res<pb::Empty> {
        let r = r.into_inner();
        let h = header(r.header);
        Attrs::new(&self.node)
            .setxattr(
                h.partition,
                h.epoch,
                Ino(r.ino),
                &r.name,
                None,
                0,
                r.request_id,
            )
            .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn stat_fs(&self, r: Request<pb::StatFsRequest>) -> Res<pb::StatFsReply> {
        let h = read_header(&self.node, r.into_inner().header).await?;
        let (inodes, entries) = Attrs::new(&self.node)
            .statfs(h.partition, h.relaxed_read)
            .await?;
        let (bytes, disk_bytes) = Files::new(&self.node).usage(h.partition)?;
        // What may still be written before the disk counts as full.
        let space = self.node.space.reading();
        let usable = space.usable(self.node.space.config());
        Ok(Response::new(pb::StatFsReply {
            inodes,
            bytes,
            entries,
            disk_bytes,
            node_id: self.node.config.node_id,
            fs_total_bytes: space.fs.total,
            fs_free_bytes: usable,
            fs_avail_bytes: usable,
        }))
    }

    async fn set_class(&self, r: Request<pb::SetClassRequest>) -> Res<pb::AttrReply> {
        let r = r.into_inner();
        let h = header(r.header);
        let class = class_from_wire(r.class)?
            .ok_or_else(|| TalonError::Invalid("class must be relaxed or strict".into()))?;
        let attr = Attrs::new(&self.node)
            .set_class(h.partition, h.epoch, Ino(r.ino), class)
            .await?;
        Ok(Response::new(pb::AttrReply {
            attr: attr_reply(&attr),
        }))
    }

    async fn read_whole(&self, r: Request<pb::ReadWholeRequest>) -> Res<pb::OpenReply> {
        let r = r.into_inner();
        let h = read_header(&self.node, r.header).await?;
        let (file, epoch) = Files::new(&self.node)
            .read_whole(h.partition, h.relaxed_read, h.epoch, Ino(r.parent), &r.name)
            .await?;
        Ok(Response::new(open_reply(file, epoch)))
    }

    async fn open(&self, r: Request<pb::OpenRequest>) -> Res<pb::OpenReply> {
        let r = r.into_inner();
        let h = read_header(&self.node, r.header).await?;
        let file = Files::new(&self.node)
            .open_file(
                h.partition,
                h.relaxed_read,
                h.epoch,
                Ino(r.ino),
                r.want_body,
            )
            .await?;
        Ok(Response::new(open_reply(file, 0)))
    }

    async fn write_small(&self, r: Request<pb::WriteSmallRequest>) -> Res<pb::AttrReply> {
        let r = r.into_inner();
        let h = header(r.header);
        self.node.room_for(h.partition, r.body.len())?;
        let attr = Files::new(&self.node)
            .write_small(
                h.partition,
                h.epoch,
                Ino(r.ino),
                r.body,
                r.expect_generation,
                r.drop_setid,
            )
            .await?;
        Ok(Response::new(pb::AttrReply {
            attr: attr_reply(&attr),
        }))
    }

    async fn put_chunk(&self, r: Request<pb::PutChunkRequest>) -> Res<pb::Empty> {
        let r = r.into_inner();
        let h = header(r.header);
        self.node.room_for(h.partition, r.data.len())?;
        Files::new(&self.node)
            .put_chunk(h.partition, Ino(r.ino), r.write_id, r.index, r.data)
            .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn get_chunk(&self, r: Request<pb::GetChunkRequest>) -> Res<pb::GetChunkReply> {
        let r = r.into_inner();
        let h = read_header(&self.node, r.header).await?;
        let data = Files::new(&self.node)
            .get_chunk(
                h.partition,
                h.relaxed_read,
                Ino(r.ino),
                r.write_id,
                r.index,
                r.offset,
                r.length,
            )
            .await?;
        Ok(Response::new(pb::GetChunkReply { data }))
    }

    async fn commit_layout(&self, r: Request<pb::CommitLayoutRequest>) -> Res<pb::AttrReply> {
        let r = r.into_inner();
        let h = header(r.header);
        self.node.room_for(h.partition, 0)?;
        let layout = Layout::Chunked {
            chunk_size: r.chunk_size,
            chunks: r.chunks.iter().map(ChunkRef::from).collect(),
        };
        let attr = Files::new(&self.node)
            .commit_layout(
                h.partition,
                h.epoch,
                Ino(r.ino),
                r.size,
                layout,
                r.expect_generation,
                r.open_session,
                r.view_generation,
                r.drop_setid,
            )
            .await?;
        Ok(Response::new(pb::AttrReply {
            attr: attr_reply(&attr),
        }))
    }

    async fn hold_open(&self, r: Request<pb::HoldOpenRequest>) -> Res<pb::HoldOpenReply> {
        let r = r.into_inner();
        let h = header(r.header);
        let lease_ms = Files::new(&self.node)
            .hold_open(h.partition, Ino(r.ino), r.session, r.renew, r.end)
            .await?;
        Ok(Response::new(pb::HoldOpenReply { lease_ms }))
    }

    async fn batch(&self, r: Request<pb::BatchRequest>) -> Res<pb::BatchReply> {
        let r = r.into_inner();
        self.within_max_batch("batch", "ops", r.ops.len())?;
        let h = read_header(&self.node, r.header).await?;
        let part = self.node.local(h.partition)?;
        // Creates need the leader: say so for the whole RPC rather than once per op.
        let has_writes = r
            .ops
            .iter()
            .any(|o| matches!(o.op, Some(pb::batch_op::Op::Create(_))));
        if has_writes && part.leader() != Some(self.node.config.node_id) {
            return Err(part.not_leader().into());
        }
        if has_writes {
            self.node.room_for(h.partition, 0)?;
        }
        let mut results: Vec<Option<Result<Attr, TalonError>>> = vec![None; r.ops.len()];
        let mut creates = Vec::new();
        let mut create_idx = Vec::new();
        let mut reads = Vec::new();
        for (i, op) in r.ops.into_iter().enumerate() {
            match op.op {
                Some(pb::batch_op::Op::Create(c)) => match CreateSpec::try_from(&c) {
                    Ok(spec) => {
                        creates.push((Ino(c.parent), c.name, spec, c.request_id));
                        create_idx.push(i);
                    }
                    Err(e) => results[i] = Some(Err(e)),
                },
                Some(pb::batch_op::Op::Lookup(l)) => {
                    reads.push((i, Some((Ino(l.parent), l.name)), Ino(0)))
                }
                Some(pb::batch_op::Op::Getattr(g)) => reads.push((i, None, Ino(g.ino))),
                None => results[i] = Some(Err(TalonError::Invalid("empty batch op".into()))),
            }
        }
        let (ns, attrs) = (Namespace::new(&self.node), Attrs::new(&self.node));
        let read_futs = reads.into_iter().map(|(i, lookup, ino)| async move {
            let res = match lookup {
                Some((parent, name)) => ns
                    .lookup(h.partition, h.relaxed_read, h.epoch, parent, &name)
                    .await
                    .map(|(a, _)| a),
                None => {
                    attrs
                        .getattr(h.partition, h.relaxed_read, h.epoch, ino)
                        .await
                }
            };
            (i, res)
        });
        let (created, read) = tokio::join!(
            ns.create_batch(h.partition, h.epoch, creates),
            futures::future::join_all(read_futs)
        );
        for (i, res) in create_idx.into_iter().zip(created?) {
            results[i] = Some(res);
        }
        for (i, res) in read {
            results[i] = Some(res);
        }
        let results = results
            .into_iter()
            .map(|r| pb::BatchResult {
                result: Some(
                    match r.unwrap_or_else(|| Err(TalonError::Invalid("op not run".into()))) {
                        Ok(a) => pb::batch_result::Result::Attr(pb::Attr::from(&a)),
                        Err(e) => pb::batch_result::Result::Error(e.to_detail()),
                    },
                ),
            })
            .collect();
        Ok(Response::new(pb::BatchReply { results }))
    }

    async fn bundle(&self, r: Request<pb::BundleRequest>) -> Res<pb::BundleReply> {
        let r = r.into_inner();
        self.within_max_batch("bundle", "requests", r.requests.len())?;
        // Each request is served by its own handler, as if it had come alone, and all of
        // them at once: a bundle of reads does not wait for one another, nor do writes.
        let served = r.requests.into_iter().map(|b| self.serve_bundled(b));
        let replies = futures::future::join_all(served).await;
        Ok(Response::new(pb::BundleReply { replies }))
    }
}

impl Api {
    /// One request of a bundle, answered as its own RPC would have been.
    async fn serve_bundled(&self, b: pb::BundledRequest) -> pb::BundledReply {
        use pb::bundled_reply::Reply;
        use pb::bundled_request::Request as Req;
        fn status(s: Status) -> Reply {
            Reply::Status(pb::BundledStatus {
                code: s.code() as i32,
                message: s.message().to_string(),
                details: s.details().to_vec(),
            })
        }
        fn reply<T>(r: Res<T>, wrap: fn(T) -> Reply) -> Reply {
            r.map_or_else(status, |r| wrap(r.into_inner()))
        }
        let reply = match b.request {
            Some(Req::Lookup(q)) => reply(self.lookup(Request::new(q)).await, Reply::Entry),
            Some(Req::GetAttr(q)) => reply(self.get_attr(Request::new(q)).await, Reply::Attr),
            Some(Req::Create(q)) => reply(self.create(Request::new(q)).await, Reply::Entry),
            Some(Req::Remove(q)) => reply(self.remove(Request::new(q)).await, Reply::Remove),
            None => status(TalonError::Invalid("empty bundled request".into()).into()),
        };
        pb::BundledReply { reply: Some(reply) }
    }
}

fn open_reply(f: crate::reads::OpenFile, epoch: u64) -> pb::OpenReply {
    pb::OpenReply {
        attr: attr_reply(&f.attr),
        layout: Some(f.layout.to_wire()),
        has_body: f.body.is_some(),
        body: f.body.unwrap_or_default(),
        epoch,
    }
}

/// Decodes a peer request's payload, refusing one in another format version.
fn decode<T: serde::de::DeserializeOwned>(r: &RaftRequest) -> Result<T, Status> {
    crate::format::check_message("a peer", r.format)
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
    crate::format::decode(&r.payload)
        .map_err(|e| Status::invalid_argument(format!("undecodable payload: {e}")))
}

fn encode<T: serde::Serialize>(v: &T) -> Result<bytes::Bytes, Status> {
    crate::format::encode(v)
        .map(Into::into)
        .map_err(|e| Status::internal(e.to_string()))
}

fn reply<T: serde::Serialize, E: serde::Serialize + std::fmt::Display>(
    r: Result<T, E>,
) -> Res<RaftReply> {
    let out = match r {
        Ok(v) => RaftReply {
            payload: encode(&v)?,
            format: crate::format::FORMAT,
            ..Default::default()
        },
        Err(e) => RaftReply {
            error: e.to_string(),
            error_payload: encode(&e)?,
            format: crate::format::FORMAT,
            ..Default::default()
        },
    };
    Ok(Response::new(out))
}

impl RaftApi {
    fn raft(&self, p: u32) -> Result<&Arc<crate::partition::Partition>, Status> {
        self.node
            .local(p)
            .map_err(|e| Status::not_found(e.to_string()))
    }
}

#[tonic::async_trait]
impl RaftSvc for RaftApi {
    async fn append_entries(&self, r: Request<RaftRequest>) -> Res<RaftReply> {
        let r = r.into_inner();
        let part = self.raft(r.partition)?;
        let req: AppendEntriesRequest<TypeConfig> = decode(&r)?;
        // The encoded copy is not kept while the call waits its turn.
        drop(r);
        reply(part.append_entries(req).await)
    }

    async fn vote(&self, r: Request<RaftRequest>) -> Res<RaftReply> {
        let r = r.into_inner();
        let part = self.raft(r.partition)?;
        let req: VoteRequest<NodeId> = decode(&r)?;
        reply(part.raft.vote(req).await)
    }

    async fn install_snapshot(&self, r: Request<RaftRequest>) -> Res<RaftReply> {
        let r = r.into_inner();
        let part = self.raft(r.partition)?;
        let req: InstallSnapshotRequest<TypeConfig> = decode(&r)?;
        // A received snapshot is kept as it came and unpacked beside it: twice its bytes.
        // Refused, the chunk is sent again later.
        if let Err(why) = self.node.space.has_room(2 * req.data.len() as u64) {
            return Err(Status::resource_exhausted(format!(
                "node {}, partition {}, snapshot chunk: {why}",
                self.node.config.node_id, r.partition
            )));
        }
        part.receiving_snapshot(&req.vote);
        reply(part.raft.install_snapshot(req).await)
    }

    async fn peer(&self, r: Request<RaftRequest>) -> Res<RaftReply> {
        let r = r.into_inner();
        let req: PeerRequest = decode(&r)?;
        match self.node.handle_peer(r.partition, req).await {
            Ok(v) => Ok(Response::new(RaftReply {
                payload: encode(&v)?,
                format: crate::format::FORMAT,
                ..Default::default()
            })),
            Err(e) => Ok(Response::new(RaftReply {
                error: e.to_string(),
                error_payload: e.to_detail().encode_to_vec().into(),
                format: crate::format::FORMAT,
                ..Default::default()
            })),
        }
    }
}
