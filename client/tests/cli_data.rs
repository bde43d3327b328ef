//! The `talon` data subcommands — put, get, cat, import — driven through `cli::run_with`.

mod common;

use common::Fixture;
use talon_client::cli::{run_with, Cli};
use talon_client::Client;

async fn talon(c: &Client, args: &[&str]) -> (bool, Vec<u8>) {
    let mut argv = vec!["talon"];
    argv.extend_from_slice(args);
    let cli = <Cli as clap::Parser>::try_parse_from(argv).expect("arguments parse");
    let mut out = Vec::new();
    let ok = run_with(c, cli.command, &mut out)
        .await
        .expect("write output");
    (ok, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_cat_import() {
    let fx = Fixture::start(1).await;
    let c = &fx.client;
    let dir = tempfile::tempdir().expect("tempdir");
    let small = dir.path().join("small.txt");
    std::fs::write(&small, b"hello\n").expect("write");
    let large = dir.path().join("large.bin");
    let big: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&large, &big).expect("write");
    let s = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_string();

    assert!(talon(c, &["mkdir", "/d"]).await.0);
    assert!(
        talon(c, &["put", &s(&small), "/d"]).await.0,
        "put into a directory"
    );
    assert!(talon(c, &["put", &s(&large), "/d/big"]).await.0);
    let (ok, out) = talon(c, &["cat", "/d/small.txt", "/d/small.txt"]).await;
    assert!(ok);
    assert_eq!(out, b"hello\nhello\n");
    let (ok, out) = talon(c, &["cat", "/d/big"]).await;
    assert!(ok && out == big);
    assert!(!talon(c, &["cat", "/d/missing"]).await.0);
    assert!(
        !talon(c, &["cat", "/d"]).await.0,
        "cat of a directory fails"
    );

    let back = dir.path().join("back");
    assert!(talon(c, &["get", "/d/big", &s(&back)]).await.0);
    assert_eq!(std::fs::read(&back).expect("read back"), big);
    let into = dir.path().join("into");
    std::fs::create_dir(&into).expect("mkdir");
    assert!(talon(c, &["get", "/d/small.txt", &s(&into)]).await.0);
    assert_eq!(
        std::fs::read(into.join("small.txt")).expect("read"),
        b"hello\n"
    );

    let (ok, out) = talon(c, &["import", &s(dir.path()), "/imported"]).await;
    assert!(ok);
    let line = String::from_utf8_lossy(&out);
    assert!(line.starts_with("imported 4 files"), "{line}");
    assert!(line.contains("files/s") && line.contains("MB/s"), "{line}");
    assert_eq!(
        c.read_file("/imported/into/small.txt").await.expect("read"),
        b"hello\n"
    );
    fx.shutdown().await;
}
