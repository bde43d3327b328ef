//! mdtest through the client library against a real in-process cluster: the namespace
//! holds exactly the items the flags ask for after the create phases, and nothing after
//! the remove phases.

use talon_bench::mdtest::{self, MdtestArgs};
use talon_bench::target::TargetSpec;
use talon_client::{Client, ClientOptions, FileKind};
use talon_testkit::TestCluster;

/// (files, directories) below `path`, listed through a fresh client.
async fn count(client: &Client, path: &str) -> (usize, usize) {
    let (mut files, mut dirs) = (0, 0);
    let mut stack = vec![path.to_string()];
    while let Some(d) = stack.pop() {
        let mut rd = client.read_dir(&d).await.expect("read_dir");
        while let Some(page) = rd.next_page().await.expect("page") {
            for e in page {
                let name = String::from_utf8_lossy(&e.name).to_string();
                if e.kind == FileKind::Directory {
                    dirs += 1;
                    stack.push(format!("{d}/{name}"));
                } else {
                    files += 1;
                }
            }
        }
    }
    (files, dirs)
}

/// A runtime and a one-node cluster of four partitions on it.
fn one_node() -> (tokio::runtime::Runtime, TestCluster) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cluster = rt
        .block_on(
            TestCluster::builder()
                .nodes(1)
                .partitions(4)
                .replication(1)
                .start(),
        )
        .expect("start cluster");
    (rt, cluster)
}

#[test]
fn mdtest_through_the_library_makes_and_removes_what_it_says() {
    let (rt, cluster) = one_node();
    let target = TargetSpec::Talon(cluster.addrs());
    let base = MdtestArgs {
        tasks: 2,
        items: 6,
        depth: 1,
        branch: 2,
        unique_dir: true,
        write_bytes: 64,
        read_bytes: 64,
        dir: "/bench".into(),
        target: Some(target),
        quiet: true,
        ..MdtestArgs::default()
    };
    let created = mdtest::run(&MdtestArgs {
        create: true,
        ..base.clone()
    })
    .expect("create phases");
    assert_eq!(created.errors, 0, "{:?}", created.iterations);
    let client = rt
        .block_on(Client::connect(&cluster.addrs(), ClientOptions::default()))
        .expect("connect");
    // Per task: 6 files, 6 item directories and a tree of 3 directories; plus the
    // iteration directory.
    assert_eq!(rt.block_on(count(&client, "/bench")), (12, 12 + 6 + 1));
    let data = rt
        .block_on(
            client.read_file("/bench/test-dir.0-0/mdtest_tree.1.0/mdtest_tree.1.2/file.mdtest.1.5"),
        )
        .expect("read a file of task 1");
    assert_eq!(data.len(), 64);

    // Not -U: concurrent directory renames by two tasks can fail with a stale-epoch
    // error (the client retries a path operation once), a Talon issue, not the harness's.
    let rest = mdtest::run(&MdtestArgs {
        stat: true,
        read: true,
        remove: true,
        ..base
    })
    .expect("the other phases");
    assert_eq!(rest.errors, 0, "{:?}", rest.iterations);
    let names: Vec<&str> = rest.iterations[0].phases.iter().map(|p| p.phase).collect();
    assert_eq!(
        names,
        [
            "Directory stat",
            "Directory removal",
            "File stat",
            "File read",
            "File removal",
            "Tree removal"
        ]
    );
    assert!(rest.iterations[0]
        .phases
        .iter()
        .all(|p| p.calls == p.ops || p.phase == "Tree removal"));
    assert_eq!(rt.block_on(count(&client, "/bench")), (0, 0));
    rt.block_on(cluster.shutdown());
}

#[test]
fn mdtest_batches_make_and_find_every_file() {
    let (rt, cluster) = one_node();
    // 2 tasks, 12 files each in 3 directories of 4 (depth 1, branch 2), batches of 3: each
    // directory takes a call of 3 and one of 1 (a call's files share a directory).
    let base = MdtestArgs {
        tasks: 2,
        items: 12,
        depth: 1,
        branch: 2,
        unique_dir: true,
        files_only: true,
        batch: 3,
        dir: "/batched".into(),
        target: Some(TargetSpec::Talon(cluster.addrs())),
        quiet: true,
        ..MdtestArgs::default()
    };
    let made = mdtest::run(&MdtestArgs {
        create: true,
        stat: true,
        ..base.clone()
    })
    .expect("create and stat phases");
    assert_eq!(made.errors, 0, "{:?}", made.iterations);
    for p in &made.iterations[0].phases {
        if p.phase.starts_with("File") {
            assert_eq!((p.ops, p.calls), (24, 24), "{}", p.phase);
        }
    }
    let client = rt
        .block_on(Client::connect(&cluster.addrs(), ClientOptions::default()))
        .expect("connect");
    assert_eq!(rt.block_on(count(&client, "/batched")).0, 24);
    let gone = mdtest::run(&MdtestArgs {
        remove: true,
        ..base
    })
    .expect("remove phases");
    assert_eq!(gone.errors, 0, "{:?}", gone.iterations);
    assert_eq!(rt.block_on(count(&client, "/batched")), (0, 0));
    rt.block_on(cluster.shutdown());
}
