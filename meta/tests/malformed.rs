//! Malformed requests get errors, never a panic or a dead node: bad names, unknown
//! partitions and enum values, oversized batches, bad timestamps, undecodable Raft
//! payloads, and garbage bytes on the gRPC port.

mod common;

use common::{bare_node, header};
use std::io::Write;
use talon_model::{Errno, TalonError, ROOT_INO};
use talon_proto::raft::raft_client::RaftClient;
use talon_proto::raft::RaftRequest;
use talon_proto::v1 as pb;
use talon_proto::v1::namespace_client::NamespaceClient;
use tonic::transport::Channel;

fn create(partition: u32, name: &[u8], kind: pb::FileKind) -> pb::CreateRequest {
    pb::CreateRequest {
        header: header(partition),
        parent: ROOT_INO.0,
        name: name.to_vec(),
        kind: kind as i32,
        perm: 0o644,
        ..Default::default()
    }
}

/// Sends a create to every partition and returns the error the right one gave (the other
/// partitions answer ClassChanged, which is also an error, never a success).
async fn create_err(c: &mut NamespaceClient<Channel>, name: &[u8], partitions: u32) -> TalonError {
    let mut errs = Vec::new();
    for p in 0..partitions {
        match c.create(create(p, name, pb::FileKind::Regular)).await {
            Ok(r) => panic!("create of {name:?} succeeded on partition {p}: {r:?}"),
            Err(s) => errs.push(TalonError::from(s)),
        }
    }
    errs.into_iter()
        .find(|e| !matches!(e, TalonError::ClassChanged(_)))
        .unwrap_or(TalonError::ClassChanged(String::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_errors() {
    let (cluster, mut c) = bare_node(4).await;
    let addr = cluster.addrs()[0].clone();

    for (name, want) in [
        (&b""[..], Errno::ENOENT),
        (b".", Errno::EINVAL),
        (b"..", Errno::EINVAL),
        (b"a/b", Errno::EINVAL),
        (b"nul\0byte", Errno::EINVAL),
        (&[b'x'; 256][..], Errno::ENAMETOOLONG),
    ] {
        let e = create_err(&mut c, name, 4).await;
        assert_eq!(
            e.errno(),
            want,
            "name {:?}: {e}",
            String::from_utf8_lossy(name)
        );
    }

    // Unknown partition.
    let e = TalonError::from(
        c.create(create(9999, b"f", pb::FileKind::Regular))
            .await
            .expect_err("unknown partition"),
    );
    assert!(matches!(e, TalonError::Invalid(_)), "{e}");
    // Unknown kind.
    let mut bad = create(0, b"f", pb::FileKind::Regular);
    bad.kind = 42;
    let e = TalonError::from(c.create(bad).await.expect_err("unknown kind"));
    assert!(matches!(e, TalonError::Invalid(_)), "{e}");
    // Oversized batch.
    let ops = (0..2000)
        .map(|i| pb::BatchOp {
            op: Some(pb::batch_op::Op::Getattr(pb::GetAttrRequest {
                header: None,
                ino: i,
            })),
        })
        .collect();
    let e = TalonError::from(
        c.batch(pb::BatchRequest {
            header: header(0),
            ops,
        })
        .await
        .expect_err("oversized batch"),
    );
    assert!(matches!(e, TalonError::Invalid(_)), "{e}");
    // Bad timestamp.
    let req = pb::SetAttrRequest {
        header: header(0),
        ino: ROOT_INO.0,
        mtime: Some(pb::Timestamp {
            secs: 0,
            nanos: 2_000_000_000,
        }),
        ..Default::default()
    };
    let e = TalonError::from(c.set_attr(req).await.expect_err("bad timestamp"));
    assert!(matches!(e, TalonError::Invalid(_)), "{e}");
    // An inode asked of the wrong partition.
    let e = TalonError::from(
        c.get_attr(pb::GetAttrRequest {
            header: header(1),
            ino: ROOT_INO.0,
        })
        .await
        .expect_err("wrong partition"),
    );
    assert!(matches!(e, TalonError::WrongPartition(_)), "{e}");
    // Oversized xattr value.
    let req = pb::SetXattrRequest {
        header: header(0),
        ino: ROOT_INO.0,
        name: b"user.big".to_vec(),
        value: vec![0; 70_000],
        flags: 0,
        request_id: 0,
    };
    let e = TalonError::from(c.set_xattr(req).await.expect_err("oversized xattr"));
    assert_eq!(e.errno(), Errno::E2BIG);

    // Undecodable Raft payloads.
    let mut raft = RaftClient::connect(format!("http://{addr}"))
        .await
        .expect("connect raft");
    for p in [0u32, 77] {
        let r = raft
            .append_entries(RaftRequest {
                partition: p,
                payload: vec![0xff; 64].into(),
                format: talon_meta::format::FORMAT,
            })
            .await;
        assert!(
            r.is_err(),
            "garbage append_entries on partition {p} accepted"
        );
        let r = raft
            .peer(RaftRequest {
                partition: p,
                payload: vec![1, 2, 3].into(),
                format: talon_meta::format::FORMAT,
            })
            .await;
        assert!(r.is_err(), "garbage peer call on partition {p} accepted");
    }
    // A payload in another format version (an unversioned sender's is 0) is refused
    // before it is decoded, naming both versions.
    for format in [0, talon_meta::format::FORMAT + 1] {
        let s = raft
            .vote(RaftRequest {
                partition: 0,
                payload: vec![0; 16].into(),
                format,
            })
            .await
            .expect_err("a payload in another format");
        assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
        assert!(
            s.message().contains(&format!("in format {format}"))
                && s.message()
                    .contains(&format!("reads format {}", talon_meta::format::FORMAT)),
            "{}",
            s.message()
        );
    }

    // Garbage bytes straight onto the port.
    for junk in [
        &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &[0u8; 4096][..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff",
    ] {
        let mut s = std::net::TcpStream::connect(&addr).expect("tcp connect");
        let _ = s.write_all(junk);
        drop(s);
    }

    // The node still serves.
    let ok = c
        .get_attr(pb::GetAttrRequest {
            header: header(0),
            ino: ROOT_INO.0,
        })
        .await
        .expect("getattr after abuse");
    assert_eq!(ok.into_inner().attr.map(|a| a.ino), Some(ROOT_INO.0));
    cluster.shutdown().await;
}

/// `talon-meta status` of a node that has committed creates says how many log appends its
/// syncs made durable (the group commit's factor), beside its space and memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_the_logs_appends_and_syncs() {
    let (cluster, mut c) = bare_node(1).await;
    for i in 0..3 {
        let name = format!("f{i}");
        c.create(create(0, name.as_bytes(), pb::FileKind::Regular))
            .await
            .expect("create");
    }
    let addr = cluster.addrs()[0].clone();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_talon-meta"))
        .args(["status", "--addr", &addr, "--timeout", "10"])
        .output()
        .await
        .expect("run talon-meta status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let log = text
        .lines()
        .find_map(|l| l.strip_prefix("log: "))
        .unwrap_or_else(|| panic!("no log line: {text}"));
    let n: Vec<u64> = log
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        n.len() == 2 && n[1] >= 1 && n[0] >= 3 && n[0] >= n[1],
        "{log}"
    );
    assert!(text.lines().any(|l| l.starts_with("memory: ")), "{text}");
    cluster.shutdown().await;
}

/// `talon-meta status` against an address that accepts connections but never answers
/// gives up with an error naming the address, rather than waiting forever.
#[test]
fn status_of_a_silent_address_gives_up() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("address").to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_talon-meta"))
        .args(["status", "--addr", &addr, "--timeout", "1"])
        .output()
        .expect("run talon-meta status");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "status succeeded: {err}");
    assert!(
        err.contains(&format!("{addr} did not answer within 1 s")),
        "{err}"
    );
    drop(silent);
}
