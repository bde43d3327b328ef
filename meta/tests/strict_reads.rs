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

/// Directory `dir` of class `c` with a file `f` in it: their attributes.
async fn dir_with_file(
    client: &talon_client::Client,
    dir: &str,
    c: Class,
) -> (talon_client::Attr, talon_client::Attr) {
    let options = MkdirOptions {
        class: Some(c),
        ..Default::default()
    };
    client.mkdir(dir, options).await.expect("mkdir");
    let file = client
        .create_file(&format!("{dir}/f"), 0o644)
        .await
        .expect("create f");
    (client.stat(dir).await.expect("stat"), file)
}

/// A raw client of node `n`'s namespace service.
async fn connect(cluster: &common::TestCluster, n: u64) -> NamespaceClient<Channel> {
    let addr = &cluster.addrs()[(n - 1) as usize];
    NamespaceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// The reads [`reads`] makes, in its order.
const READS: [&str; 5] = ["lookup", "readdir", "getattr", "listxattr", "open"];

/// What relaxed-flagged reads answer at `raw` (`Ok` if served, else the error): a lookup of
/// `f` in directory `dir` and a listing of it, a getattr, listxattr and open of `file`;
/// session reads if `session`.
async fn reads(
    raw: &NamespaceClient<Channel>,
    dir: u64,
    file: u64,
    session: bool,
) -> Vec<Result<(), String>> {
    fn done<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Result<(), String> {
        r.map(|_| ())
            .map_err(|s| format!("{:?}", TalonError::from(s)))
    }
    let header = || {
        Some(pb::RequestHeader {
            partition: 0,
            epoch: 0,
            relaxed_read: true,
            session_read: session,
        })
    };
    let mut raw = raw.clone();
    let lookup = pb::LookupRequest {
        header: header(),
        parent: dir,
        name: b"f".to_vec(),
    };
    let list_dir = pb::ReadDirRequest {
        header: header(),
        dir,
        after: vec![],
        limit: 16,
        plus: false,
    };
    let getattr = pb::GetAttrRequest {
        header: header(),
        ino: file,
    };
    let list = pb::ListXattrRequest {
        header: header(),
        ino: file,
    };
    let open = pb::OpenRequest {
        header: header(),
        ino: file,
        want_body: false,
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
    let (s, strict) = dir_with_file(&client, "/s", Class::Strict).await;
    let (r, loose) = dir_with_file(&client, "/r", Class::Relaxed).await;

    let leader = common::settled_leader(&cluster, 0).await;
    let follower = (1..=3).find(|&n| n != leader).expect("a follower");
    let raw = connect(&cluster, follower).await;

    for _ in 0..5 {
        // The follower serves relaxed reads now: the relaxed directory and its file answer.
        common::eventually(
            Duration::from_secs(30),
            "relaxed reads served by the follower",
            || async {
                let served = reads(&raw, r.ino.0, loose.ino.0, false).await;
                served.iter().all(Result::is_ok).then_some(())
            },
        )
        .await;
        // The same reads of the strict directory and file are strict ones: refused here.
        let answers = reads(&raw, s.ino.0, strict.ino.0, false).await;
        if cluster.leader_of(0).await == Some(follower) {
            continue; // leadership moved here meanwhile: a strict read may be served
        }
        for (what, a) in READS.iter().zip(&answers) {
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
    let (r, file) = dir_with_file(&client, "/r", Class::Relaxed).await;
    for _ in 0..5 {
        let leader = common::settled_leader(&cluster, 0).await;
        let follower = (1..=3).find(|&n| n != leader).expect("a follower");
        let (at_leader, at_follower) = (
            connect(&cluster, leader).await,
            connect(&cluster, follower).await,
        );
        common::eventually(
            Duration::from_secs(30),
            "relaxed reads served by the follower",
            || async {
                let served = reads(&at_follower, r.ino.0, file.ino.0, false).await;
                served.iter().all(Result::is_ok).then_some(())
            },
        )
        .await;
        let refused = reads(&at_follower, r.ino.0, file.ino.0, true).await;
        let served = reads(&at_leader, r.ino.0, file.ino.0, true).await;
        if cluster.leader_of(0).await != Some(leader) {
            continue; // leadership moved meanwhile
        }
        for (what, (no, yes)) in READS.iter().zip(refused.iter().zip(&served)) {
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

/// A writer of log lines into a shared buffer.
#[derive(Clone, Default)]
struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A strict read leaves the trace the fault harness keeps (target
/// `talon_meta::strict_reads`, at debug): the barrier it passed, with the log id it waited
/// for, and its answer, with the entry's inode and the applied id of the state it read. A
/// relaxed read leaves no answer line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_read_leaves_its_trace() {
    let lines = Lines::default();
    let sink = lines.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "talon_meta::strict_reads=debug",
        ))
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .init();
    let (_cluster, client) = common::cluster(1, P).await;
    let (_, strict) = dir_with_file(&client, "/s", Class::Strict).await;
    let (_, loose) = dir_with_file(&client, "/r", Class::Relaxed).await;
    let read = client
        .read_file("/s/f")
        .await
        .expect("read the strict file");
    assert!(read.is_empty());
    client
        .read_file("/r/f")
        .await
        .expect("read the relaxed file");

    let log = String::from_utf8_lossy(&lines.0.lock().expect("log lines")).into_owned();
    assert!(
        log.lines()
            .any(|l| l.contains("read barrier passed") && l.contains("read_log_id=Some(")),
        "no barrier line in:\n{log}"
    );
    let answers: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("strict lookup answered") && l.contains("name=f "))
        .collect();
    assert!(
        answers
            .iter()
            .any(|l| l.contains(&format!("ino=Some({})", strict.ino.0))
                && l.contains("applied=Some(")),
        "no answer naming inode {} in:\n{log}",
        strict.ino.0
    );
    assert!(
        !answers
            .iter()
            .any(|l| l.contains(&format!("ino=Some({})", loose.ino.0))),
        "a relaxed read traced as strict:\n{log}"
    );
}
