//! The `talon` command's subcommands, driven through `cli::run_with` against a cluster.

mod common;

use common::Fixture;
use talon_client::cli::{run_with, Cli, Command};
use talon_client::Client;

async fn talon(c: &Client, args: &[&str]) -> (bool, String) {
    let mut argv = vec!["talon"];
    argv.extend_from_slice(args);
    let cli = <Cli as clap::Parser>::try_parse_from(argv).expect("arguments parse");
    let mut out = Vec::new();
    let ok = run_with(c, cli.command, &mut out)
        .await
        .expect("write output");
    (ok, String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subcommands() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;
    assert!(talon(c, &["mkdir", "-p", "/a/b"]).await.0);
    assert!(talon(c, &["mkdir", "--strict", "/s"]).await.0);
    assert!(
        !talon(c, &["mkdir", "/a"]).await.0,
        "mkdir of an existing dir fails"
    );
    assert!(talon(c, &["touch", "/a/f", "/a/g"]).await.0);
    assert!(
        talon(c, &["touch", "/a/f"]).await.0,
        "touch of an existing file succeeds"
    );
    assert!(talon(c, &["ln", "-s", "/a/f", "/a/link"]).await.0);
    assert!(talon(c, &["ln", "/a/f", "/a/hard"]).await.0);

    let (ok, ls) = talon(c, &["ls", "/a"]).await;
    assert!(ok);
    let mut names: Vec<&str> = ls.lines().collect();
    names.sort();
    assert_eq!(names, vec!["b", "f", "g", "hard", "link"]);
    let (ok, long) = talon(c, &["ls", "-l", "/a"]).await;
    assert!(ok);
    assert!(
        long.lines()
            .any(|l| l.starts_with("drwxr-xr-x") && l.ends_with(" b")),
        "{long}"
    );
    assert!(
        long.lines()
            .any(|l| l.starts_with("-rw-r--r--   2") && l.ends_with(" f")),
        "{long}"
    );
    assert!(
        long.lines()
            .any(|l| l.starts_with('l') && l.ends_with(" link")),
        "{long}"
    );

    let (ok, st) = talon(c, &["stat", "/a/f"]).await;
    assert!(
        ok && st.contains("regular file") && st.contains("Links: 2"),
        "{st}"
    );
    assert_eq!(talon(c, &["policy", "/s"]).await.1.trim(), "/s: strict");
    assert_eq!(talon(c, &["policy", "/a"]).await.1.trim(), "/a: relaxed");
    assert!(talon(c, &["policy", "/a/b", "--set", "strict"]).await.0);
    assert_eq!(talon(c, &["policy", "/a/b"]).await.1.trim(), "/a/b: strict");
    assert!(
        !talon(c, &["policy", "/a", "--set", "strict"]).await.0,
        "non-empty"
    );

    assert!(talon(c, &["mv", "/a/g", "/s/g"]).await.0);
    assert!(
        !talon(c, &["rm", "/a"]).await.0,
        "rm of a directory without -r fails"
    );
    assert!(!talon(c, &["rm", "/nope"]).await.0);
    assert!(talon(c, &["rm", "/s/g"]).await.0);
    assert!(talon(c, &["rm", "-r", "/a", "/s"]).await.0);
    assert_eq!(talon(c, &["ls", "/"]).await.1.trim(), "");

    let (ok, status) = talon(c, &["status"]).await;
    assert!(ok, "{status}");
    assert!(status.contains("LEADER"), "{status}");
    let sections: Vec<&str> = status.split("\n\n").collect();
    let [replicas, space, load] = sections[..] else {
        panic!("three tables: {status}");
    };
    assert_eq!(
        replicas.lines().count(),
        1 + 3 * 8,
        "one line per replica: {status}"
    );
    assert!(space.starts_with("NODE  SPACE"), "{status}");
    assert_eq!(
        space.lines().count(),
        1 + 3,
        "one space line per node: {status}"
    );
    // Memory and the log's group commit, one line per node; every node has appended the
    // entries of the creates above, each made durable by a sync.
    assert!(load.starts_with("NODE  RESIDENT"), "{status}");
    let loads: Vec<Vec<&str>> = load
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(loads.len(), 3, "one load line per node: {status}");
    for l in &loads {
        let (appends, syncs): (u64, u64) =
            (l[5].parse().expect("appends"), l[6].parse().expect("syncs"));
        assert!(appends > 0 && syncs > 0 && syncs <= appends, "{status}");
        assert!(
            l[1].ends_with('M') && l[1] != "0.0M",
            "resident memory: {status}"
        );
    }
    assert!(matches!(
        <Cli as clap::Parser>::try_parse_from(["talon", "status"]).map(|c| c.command),
        Ok(Command::Status)
    ));
    fx.shutdown().await;
}
