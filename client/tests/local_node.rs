//! A client given its own process's node (`talon up`'s mount) reaches it without the
//! network: the node here has no listener at all, so every call that succeeds went
//! through the direct path, with the same answers and errors as over gRPC.

mod common;

use common::errno;
use talon_client::up::node_config;
use talon_client::{Client, ClientOptions, Errno, FileKind, LocalNode, MkdirOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_node_answers_without_a_listener() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Port 1 on loopback: nothing listens there, so a call sent over TCP would fail.
    let addr = "127.0.0.1:1";
    let node = talon_meta::server::open(node_config(dir.path(), addr))
        .await
        .expect("open the node");
    let local = LocalNode::new(
        addr,
        talon_meta::service::api(node.clone()),
        talon_meta::service::MAX_CLIENT_MESSAGE,
    );
    let c = Client::connect_local(&[addr.to_string()], ClientOptions::default(), local)
        .await
        .expect("connect to the local node");

    let d = c
        .mkdir("/d", MkdirOptions::default())
        .await
        .expect("mkdir /d");
    assert_eq!(d.kind, FileKind::Directory);
    // Bodies larger than one HTTP/2 frame or window, small and chunked.
    for (name, len) in [("/d/small", 200_000usize), ("/d/large", 9 << 20)] {
        let body: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        c.write_file(name, &body).await.expect("write");
        assert_eq!(c.read_file(name).await.expect("read"), body, "{name}");
        assert_eq!(c.stat(name).await.expect("stat").size, len as u64);
    }
    // Errors come back as the same errnos.
    assert_eq!(errno(c.stat("/d/missing").await), Errno::ENOENT);
    assert_eq!(
        errno(c.mkdir("/d", MkdirOptions::default()).await),
        Errno::EEXIST
    );
    let mut pager = c.read_dir("/d").await.expect("list /d");
    let mut names = Vec::new();
    while let Some(page) = pager.next_page().await.expect("page") {
        names.extend(page.into_iter().map(|e| e.name));
    }
    names.sort();
    assert_eq!(names, [b"large".to_vec(), b"small".to_vec()]);
    assert!(c.rpc_count() > 0);

    drop(c);
    node.shutdown().await;
}

/// The direct path keeps gRPC's message limits: a request past the node's limit, or a reply
/// past the client's, fails with OutOfRange as tonic's codec fails it over the network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_node_keeps_the_message_limits() {
    use talon_client::transport::{Conn, NodeClient};
    use talon_proto::v1 as pb;

    let dir = tempfile::tempdir().expect("temp dir");
    let addr = "127.0.0.1:1";
    let node = talon_meta::server::open(node_config(dir.path(), addr))
        .await
        .expect("open the node");
    let limit = 256;
    let local = LocalNode::new(addr, talon_meta::service::api(node.clone()), limit);

    let mut c = NodeClient::new(Conn::Local(local));
    let small = pb::LookupRequest {
        parent: 1,
        name: b"x".to_vec(),
        ..Default::default()
    };
    let r = c.lookup(small).await;
    assert_ne!(r.err().map(|s| s.code()), Some(tonic::Code::OutOfRange));
    let big = pb::LookupRequest {
        parent: 1,
        name: vec![b'x'; limit + 1],
        ..Default::default()
    };
    let status = c.lookup(big).await.expect_err("a request past the limit");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");

    let roomy = LocalNode::new(addr, talon_meta::service::api(node.clone()), 1 << 20);
    let map = NodeClient::new(Conn::Local(roomy.clone()))
        .get_cluster_map(pb::ClusterMapRequest {})
        .await
        .expect("the cluster map");
    let len = prost::Message::encoded_len(map.get_ref());
    let mut tight = NodeClient::new(Conn::Local(roomy)).max_decoding_message_size(len - 1);
    let status = tight
        .get_cluster_map(pb::ClusterMapRequest {})
        .await
        .expect_err("a reply past the client's limit");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");

    node.shutdown().await;
}
