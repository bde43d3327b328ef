//! A copy of a rename, remove, link or xattr change that the client sends again after a
//! lost answer is answered from the server's record of the first, never applied a second
//! time: through the raw protocol, each request is sent twice with the same id, and between
//! the two copies the name it changed is made again by another request. Applied twice, the
//! copy would remove, move or refuse that new name (jepsen/README.md, findings F1 and F4).

mod common;

use common::TestCluster;
use talon_model::placement::entry_partition;
use talon_model::{Attr, Ino};
use talon_proto::v1 as pb;
use talon_proto::v1::namespace_client::NamespaceClient;
use tonic::transport::Channel;

const P: u32 = 4;

struct Fx {
    cluster: TestCluster,
    raw: NamespaceClient<Channel>,
    client: talon_client::Client,
    dir: Attr,
}

impl Fx {
    async fn start() -> Fx {
        let (cluster, raw) = common::bare_node(P).await;
        let client = common::client(&cluster.addrs()).await;
        client.mkdir("/d", Default::default()).await.expect("mkdir");
        let dir = client.stat("/d").await.expect("stat");
        Fx {
            cluster,
            raw,
            client,
            dir,
        }
    }

    /// The header of a write to the partition holding `name` in the directory.
    fn header(&self, name: &str) -> Option<pb::RequestHeader> {
        Some(pb::RequestHeader {
            partition: entry_partition(self.dir.ino, name.as_bytes(), self.dir.class, P),
            epoch: 0,
            relaxed_read: false,
            session_read: false,
        })
    }

    async fn create(&self, name: &str) -> Ino {
        self.client
            .create_file(format!("/d/{name}"), 0o644)
            .await
            .expect("create")
            .ino
    }

    /// What `name` names now, asked of its partition (the client's cache has not seen the
    /// raw requests).
    async fn ino(&self, name: &str) -> Option<Ino> {
        let req = pb::LookupRequest {
            header: self.header(name),
            parent: self.dir.ino.0,
            name: name.into(),
        };
        let reply = self.raw.clone().lookup(req).await.ok()?.into_inner();
        reply.attr.map(|a| Ino(a.ino))
    }

    fn remove(&self, name: &str, id: u64) -> pb::RemoveRequest {
        pb::RemoveRequest {
            header: self.header(name),
            parent: self.dir.ino.0,
            name: name.into(),
            directory: false,
            request_id: id,
        }
    }

    fn rename(&self, from: &str, to: &str, flags: u32, id: u64) -> pb::RenameRequest {
        pb::RenameRequest {
            header: self.header(from),
            src_parent: self.dir.ino.0,
            src_name: from.into(),
            dst_parent: self.dir.ino.0,
            dst_name: to.into(),
            flags,
            request_id: id,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_unlink_leaves_the_name_made_since() {
    let mut fx = Fx::start().await;
    let first = fx.create("k").await;
    let req = fx.remove("k", 0x5eed);
    let done = fx
        .raw
        .remove(req.clone())
        .await
        .expect("unlink")
        .into_inner();
    assert_eq!(done.ino, first.0);

    let second = fx.create("k").await;
    let again = fx
        .raw
        .remove(req)
        .await
        .expect("the copy answers success")
        .into_inner();
    assert_eq!(again.ino, first.0, "answered as the first unlink");
    assert_eq!(fx.ino("k").await, Some(second), "the new file stays");

    // Without an id nothing is recorded: the same unlink is a new one.
    fx.raw.remove(fx.remove("k", 0)).await.expect("unlink");
    assert_eq!(fx.ino("k").await, None);
    fx.cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_rename_neither_moves_again_nor_fails() {
    let mut fx = Fx::start().await;
    let old = fx.create("src").await;
    let noreplace = fx.rename("src", "dst", 1, 0xabc);
    fx.raw.rename(noreplace.clone()).await.expect("rename");
    let new = fx.create("src").await;

    // The copy finds the destination taken and a new source: it must not answer EEXIST
    // (the NOREPLACE guard) nor move the new source.
    fx.raw
        .rename(noreplace)
        .await
        .expect("the copy answers success");
    assert_eq!(fx.ino("dst").await, Some(old));
    assert_eq!(fx.ino("src").await, Some(new));

    // An exchange sent twice swaps once.
    let exchange = fx.rename("src", "dst", 2, 0xdef);
    fx.raw.rename(exchange.clone()).await.expect("exchange");
    fx.raw
        .rename(exchange)
        .await
        .expect("the copy answers success");
    assert_eq!(fx.ino("src").await, Some(old));
    assert_eq!(fx.ino("dst").await, Some(new));
    fx.cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_link_answers_the_link_it_made() {
    let mut fx = Fx::start().await;
    let f = fx.create("f").await;
    let req = pb::LinkRequest {
        header: fx.header("g"),
        ino: f.0,
        new_parent: fx.dir.ino.0,
        new_name: "g".into(),
        request_id: 0x11,
    };
    fx.raw.link(req.clone()).await.expect("link");
    let again = fx
        .raw
        .link(req)
        .await
        .expect("the copy answers success, not EEXIST")
        .into_inner();
    assert_eq!(again.attr.map(|a| (a.ino, a.nlink)), Some((f.0, 2)));
    fx.cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_xattr_change_answers_as_the_first() {
    let mut fx = Fx::start().await;
    let f = fx.create("f").await;
    let header = Some(pb::RequestHeader {
        partition: f.home(),
        epoch: 0,
        relaxed_read: false,
        session_read: false,
    });
    let create_only = pb::SetXattrRequest {
        header,
        ino: f.0,
        name: b"user.k".to_vec(),
        value: b"v".to_vec(),
        flags: 1,
        request_id: 0x22,
    };
    fx.raw
        .set_xattr(create_only.clone())
        .await
        .expect("setxattr");
    fx.raw
        .set_xattr(create_only)
        .await
        .expect("the copy answers success, not EEXIST");
    let remove = pb::RemoveXattrRequest {
        header,
        ino: f.0,
        name: b"user.k".to_vec(),
        request_id: 0x33,
    };
    fx.raw
        .remove_xattr(remove.clone())
        .await
        .expect("removexattr");
    fx.raw
        .remove_xattr(remove)
        .await
        .expect("the copy answers success, not ENODATA");
    fx.cluster.shutdown().await;
}
