//! The `Bundle` RPC: each request of a bundle is served by its own handler and answered as
//! its own RPC would have been (a reply or the same status, with the same details), one
//! answer per request in order; a bundle past `max_batch` and an empty request are refused.

mod common;

use common::{bare_node, header};
use talon_model::{Errno, TalonError, ROOT_INO};
use talon_proto::v1 as pb;
use talon_proto::v1::bundled_reply::Reply;
use talon_proto::v1::bundled_request::Request as Req;
use tonic::{Code, Status};

fn create(name: &[u8]) -> pb::CreateRequest {
    pb::CreateRequest {
        header: header(0),
        parent: ROOT_INO.0,
        name: name.to_vec(),
        kind: pb::FileKind::Regular as i32,
        perm: 0o644,
        exclusive: true,
        ..Default::default()
    }
}

fn lookup(name: &[u8]) -> pb::LookupRequest {
    pb::LookupRequest {
        header: header(0),
        parent: ROOT_INO.0,
        name: name.to_vec(),
    }
}

/// The status a bundled request ended with, rebuilt as the client rebuilds it.
fn status(r: &pb::BundledReply) -> Status {
    match &r.reply {
        Some(Reply::Status(s)) => Status::with_details(
            Code::from(s.code),
            s.message.clone(),
            s.details.clone().into(),
        ),
        other => panic!("expected a status, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_answers_each_request_as_its_own_rpc_would() {
    // One partition: every entry and inode lives on partition 0.
    let (cluster, mut c) = bare_node(1).await;

    let requests = vec![
        Req::Create(create(b"a")),
        Req::Create(create(b"b")),
        Req::Lookup(lookup(b"missing")),
        Req::GetAttr(pb::GetAttrRequest {
            header: header(7),
            ino: ROOT_INO.0,
        }),
    ];
    let reply = c
        .bundle(pb::BundleRequest {
            requests: requests
                .into_iter()
                .map(|r| pb::BundledRequest { request: Some(r) })
                .collect(),
        })
        .await
        .expect("bundle")
        .into_inner();
    assert_eq!(reply.replies.len(), 4, "one answer per request");
    let made: Vec<pb::Attr> = reply.replies[..2]
        .iter()
        .map(|r| match &r.reply {
            Some(Reply::Entry(e)) => {
                assert!(e.created, "{e:?}");
                e.attr.expect("a create's attributes")
            }
            other => panic!("expected a created entry, got {other:?}"),
        })
        .collect();
    assert_ne!(made[0].ino, made[1].ino, "two creates, two inodes");

    // The missing name's status is the one a lookup on its own gets, details included.
    let alone = c
        .lookup(lookup(b"missing"))
        .await
        .expect_err("no such name");
    let bundled = status(&reply.replies[2]);
    assert_eq!(bundled.code(), alone.code());
    assert_eq!(bundled.details(), alone.details());
    assert_eq!(TalonError::from(bundled).errno(), Errno::ENOENT);
    // An unknown partition is refused as it is on its own.
    let alone = c
        .get_attr(pb::GetAttrRequest {
            header: header(7),
            ino: ROOT_INO.0,
        })
        .await
        .expect_err("unknown partition");
    let bundled = status(&reply.replies[3]);
    assert_eq!(bundled.code(), alone.code());
    assert_eq!(bundled.details(), alone.details());

    // What the bundle did is what its requests would have done: the names exist, a second
    // exclusive create of one is EEXIST, a lookup finds the bundled create's inode, and a
    // remove, a lookup of the removed name and an empty request answer on their own.
    let reply = c
        .bundle(pb::BundleRequest {
            requests: vec![
                pb::BundledRequest {
                    request: Some(Req::Create(create(b"a"))),
                },
                pb::BundledRequest {
                    request: Some(Req::Lookup(lookup(b"b"))),
                },
                pb::BundledRequest {
                    request: Some(Req::Remove(pb::RemoveRequest {
                        header: header(0),
                        parent: ROOT_INO.0,
                        name: b"a".to_vec(),
                        ..Default::default()
                    })),
                },
                pb::BundledRequest { request: None },
            ],
        })
        .await
        .expect("second bundle")
        .into_inner();
    assert_eq!(reply.replies.len(), 4);
    assert_eq!(
        TalonError::from(status(&reply.replies[0])).errno(),
        Errno::EEXIST
    );
    match &reply.replies[1].reply {
        Some(Reply::Entry(e)) => assert_eq!(e.attr.as_ref().map(|a| a.ino), Some(made[1].ino)),
        other => panic!("expected b's entry, got {other:?}"),
    }
    match &reply.replies[2].reply {
        Some(Reply::Remove(r)) => assert_eq!(r.ino, made[0].ino),
        other => panic!("expected a's removal, got {other:?}"),
    }
    assert!(matches!(
        TalonError::from(status(&reply.replies[3])),
        TalonError::Invalid(_)
    ));
    let gone = c.lookup(lookup(b"a")).await.expect_err("a was removed");
    assert_eq!(TalonError::from(gone).errno(), Errno::ENOENT);

    // More requests than `max_batch` (1,024 by default): the bundle is refused whole.
    let requests = (0..2000)
        .map(|_| pb::BundledRequest {
            request: Some(Req::Lookup(lookup(b"b"))),
        })
        .collect();
    let e = c
        .bundle(pb::BundleRequest { requests })
        .await
        .expect_err("oversized bundle");
    assert!(
        matches!(TalonError::from(e), TalonError::Invalid(_)),
        "refused as invalid"
    );
    cluster.shutdown().await;
}
