//! A read the client marks relaxed is answered at the class the server's state shows. A
//! client may hold a directory's class learned before it changed (a change allowed while
//! the directory is empty), so its `relaxed_read` flag is a belief, not a grant: a lookup,
//! getattr, open, xattr read or listing of something strict, sent relaxed to a follower
//! that serves relaxed reads, is refused there as a strict read is (NotLeader), instead of
//! being answered from that follower's state. A session read is the leader's alone.

mod common;

use std::time::Duration;
use talon_client::MkdirOptions;
use talon_model::{Class, TalonError};
use talon_proto::v1 as pb;
use talon_proto::v1::namespace_client::NamespaceClient;
use tonic::transport::Channel;

/// One partition, so every entry and inode lives on partition 0.
const P: u32 = 1;

/// mkdir's options for a directory of class `c`.
fn class(c: Class) -> MkdirOptions {
    MkdirOptions {
        class: Some(c),
        ..Default::default()
    }
}

/// A relaxed read's header; a session read's with `session`.
fn relaxed_as(session: bool) -> Option<pb::RequestHeader> {
    Some(pb::RequestHeader {
        partition: 0,
        epoch: 0,
        relaxed_read: true,
        session_read: session,
    })
}

/// What relaxed-flagged reads of `ino` answer at `raw` (`Ok` if served, else the error):
/// a lookup of `name` and a listing (of a directory), a getattr, listxattr and open.
async fn reads(raw: &NamespaceClient<Channel>, ino: u64, name: &str) -> Vec<Result<(), String>> {
    reads_as(raw, ino, name, false).await
}

/// [`reads`], as session reads if `session`.
async fn reads_as(
    raw: &NamespaceClient<Channel>,
    ino: u64,
    name: &str,
    session: bool,
) -> Vec<Result<(), String>> {
    let relaxed = || relaxed_as(session);
    fn done<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Result<(), String> {
        r.map(|_| ())
            .map_err(|s| format!("{:?}", TalonError::from(s)))
    }
    let mut raw = raw.clone();
    let lookup = pb::LookupRequest {
        header: relaxed(),
        parent: ino,
        name: name.as_bytes().to_vec(),
    };
    let getattr = pb::GetAttrRequest {
        header: relaxed(),
        ino,
    };
    let list = pb::ListXattrRequest {
        header: relaxed(),
        ino,
    };
    let open = pb::OpenRequest {
        header: relaxed(),
        ino,
        want_body: false,
    };
    let list_dir = pb::ReadDirRequest {
        header: relaxed(),
        dir: ino,
        after: vec![],
        limit: 16,
        plus: false,
    };
    vec![
        done(raw.lookup(lookup).await),
        done(raw.read_dir(list_dir).await),
        done(raw.get_attr(getattr).await),
        done(raw.list_xattr(list).await),
        done(raw.open(open).await),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relaxed_read_of_something_strict_is_made_strict() {
    let (cluster, client) = common::cluster(3, P).await;
    client
        .mkdir("/s", class(Class::Strict))
        .await
        .expect("mkdir /s");
    client
        .mkdir("/r", class(Class::Relaxed))
        .await
        .expect("mkdir /r");
    let strict = client
        .create_file("/s/f", 0o644)
        .await
        .expect("create /s/f");
    let loose = client
        .create_file("/r/f", 0o644)
        .await
        .expect("create /r/f");
    let s = client.stat("/s").await.expect("stat /s");
    let r = client.stat("/r").await.expect("stat /r");

    let leader = common::settled_leader(&cluster, 0).await;
    let follower = (1..=3).find(|&n| n != leader).expect("a follower");
    let addr = &cluster.addrs()[(follower - 1) as usize];
    let raw = NamespaceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the follower");

    for _ in 0..5 {
        // The follower serves relaxed reads now: the relaxed directory and its file answer.
        common::eventually(
            Duration::from_secs(30),
            "relaxed reads served by the follower",
            || async {
                let served = reads(&raw, r.ino.0, "f").await;
                let file = reads(&raw, loose.ino.0, "").await;
                (served[..2].iter().all(Result::is_ok) && file[2..].iter().all(Result::is_ok))
                    .then_some(())
            },
        )
        .await;
        // The same reads of the strict directory and file are strict ones: refused here.
        let dir = reads(&raw, s.ino.0, "f").await;
        let file = reads(&raw, strict.ino.0, "").await;
        if cluster.leader_of(0).await == Some(follower) {
            continue; // leadership moved here meanwhile: a strict read may be served
        }
        let answers = [&dir[0], &dir[1], &file[2], &file[3], &file[4]];
        let names = ["lookup", "readdir", "getattr", "listxattr", "open"];
        for (what, a) in names.iter().zip(answers) {
            let e = a
                .as_ref()
                .expect_err(&format!("relaxed {what} of a strict object served"));
            assert!(e.starts_with("NotLeader"), "{what}: {e}");
        }
        return;
    }
    panic!("leadership kept moving to the follower");
}

/// A session read (its client changed the partition within its session window) is served
/// by the leader only: a follower may have the change's entry without knowing yet that it
/// committed, so it refuses (NotLeader) what it would serve as a relaxed read, and the
/// client finds the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_read_is_refused_by_a_follower() {
    let (cluster, client) = common::cluster(3, P).await;
    client
        .mkdir("/r", class(Class::Relaxed))
        .await
        .expect("mkdir /r");
    let file = client
        .create_file("/r/f", 0o644)
        .await
        .expect("create /r/f");
    let r = client.stat("/r").await.expect("stat /r");
    let connect = |n: u64| {
        let addr = cluster.addrs()[(n - 1) as usize].clone();
        async move {
            NamespaceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect")
        }
    };
    let all = |dir: Vec<Result<(), String>>, file: Vec<Result<(), String>>| {
        vec![
            dir[0].clone(),
            dir[1].clone(),
            file[2].clone(),
            file[3].clone(),
            file[4].clone(),
        ]
    };
    for _ in 0..5 {
        let leader = common::settled_leader(&cluster, 0).await;
        let follower = (1..=3).find(|&n| n != leader).expect("a follower");
        let (at_leader, at_follower) = (connect(leader).await, connect(follower).await);
        common::eventually(
            Duration::from_secs(30),
            "relaxed reads served by the follower",
            || async {
                let served = all(
                    reads(&at_follower, r.ino.0, "f").await,
                    reads(&at_follower, file.ino.0, "").await,
                );
                served.iter().all(Result::is_ok).then_some(())
            },
        )
        .await;
        let refused = all(
            reads_as(&at_follower, r.ino.0, "f", true).await,
            reads_as(&at_follower, file.ino.0, "", true).await,
        );
        let served = all(
            reads_as(&at_leader, r.ino.0, "f", true).await,
            reads_as(&at_leader, file.ino.0, "", true).await,
        );
        if cluster.leader_of(0).await != Some(leader) {
            continue; // leadership moved meanwhile
        }
        let names = ["lookup", "readdir", "getattr", "listxattr", "open"];
        for (what, (no, yes)) in names.iter().zip(refused.iter().zip(&served)) {
            let e = no
                .as_ref()
                .expect_err(&format!("a follower served a session {what}"));
            assert!(e.starts_with("NotLeader"), "{what}: {e}");
            assert!(yes.is_ok(), "the leader refused a session {what}: {yes:?}");
        }
        return;
    }
    panic!("leadership kept moving");
}
