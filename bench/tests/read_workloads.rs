//! The read workloads (imagenet, traverse) on a local temporary directory and through the
//! library on an in-process cluster: they build the tree the flags describe, read every
//! file once per epoch, and clean up unless told to keep the tree.

use std::path::Path;
use talon_bench::imagenet::{self, ImagenetArgs};
use talon_bench::records::{self, RecordsArgs};
use talon_bench::target::TargetSpec;
use talon_bench::traverse::{self, TraverseArgs};
use talon_client::{Client, ClientOptions};
use talon_testkit::TestCluster;

fn local_files(root: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("list") {
            let e = e.expect("entry");
            if e.file_type().expect("type").is_dir() {
                stack.push(e.path());
            } else {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .expect("below root")
                    .display()
                    .to_string();
                out.push((rel, e.metadata().expect("stat").len()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn imagenet_builds_reads_every_file_per_epoch_and_feeds_the_loader() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let args = ImagenetArgs {
        target: Some(TargetSpec::Posix(tmp.path().to_path_buf())),
        dir: "inet".into(),
        files: 60,
        classes: 4,
        size: 2000,
        spread: 0.5,
        build_tasks: 3,
        workers: 4,
        epochs: 2,
        accelerators: vec![1, 2],
        batch: 4,
        step_ms: 1,
        steps: 3,
        readers: 2,
        keep: true,
        quiet: true,
        ..ImagenetArgs::default()
    };
    let report = imagenet::run(&args).expect("run");
    assert_eq!(report.errors, 0);
    let files = local_files(&tmp.path().join("inet"));
    assert_eq!(files.len(), 60);
    assert!(files.iter().all(|(_, len)| (1000..=3000).contains(len)));
    assert_eq!(files[0].0, "n00000000/img_00000000.JPEG");
    let bytes: u64 = files.iter().map(|(_, l)| l).sum();
    assert_eq!(report.bytes, bytes);
    assert_eq!(report.epochs.len(), 2);
    for e in &report.epochs {
        assert_eq!((e.files, e.bytes, e.latency.count), (60, bytes, 60));
    }
    assert_eq!(report.loader.len(), 2);
    assert!(report
        .loader
        .iter()
        .all(|l| l.utilisation > 0.0 && l.utilisation <= 1.0));
    let v = serde_json::to_value(&report).expect("json");
    for key in [
        "command",
        "target",
        "build",
        "epochs",
        "loader",
        "max_accelerators_at_90",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    for key in ["p50_ms", "p99_ms", "p999_ms"] {
        assert!(
            v["epochs"][0]["latency"].get(key).is_some(),
            "missing {key}"
        );
    }

    // Reuse the tree, then remove it.
    let again = imagenet::run(&ImagenetArgs {
        no_build: true,
        keep: false,
        accelerators: vec![],
        epochs: 1,
        ..args
    })
    .expect("second run");
    assert_eq!((again.errors, again.epochs[0].bytes), (0, bytes));
    assert!(again.build.is_none());
    assert!(local_files(&tmp.path().join("inet")).is_empty());
}

#[test]
fn traverse_reads_every_leaf_file_and_cleans_up() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let report = traverse::run(&TraverseArgs {
        target: Some(TargetSpec::Posix(tmp.path().to_path_buf())),
        dir: "deep".into(),
        depth: 4,
        fanout: 2,
        files_per_leaf: 3,
        size: 100,
        workers: 3,
        quiet: true,
        ..TraverseArgs::default()
    })
    .expect("run");
    assert_eq!(report.errors, 0);
    assert_eq!((report.dirs, report.files), (2 + 4 + 8 + 16, 48));
    for e in &report.epochs {
        assert_eq!((e.files, e.bytes), (48, 4800));
        assert_eq!(
            e.round_trips_per_file, None,
            "a mounted path counts no RPCs"
        );
    }
    assert!(!tmp.path().join("deep").exists());
}

/// The records workload writes its shards, reads and checks every record, and removes
/// the shards; a shard whose bytes changed fails the records read from it.
#[test]
fn records_are_read_back_as_written_and_cleaned_up() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let args = RecordsArgs {
        target: Some(TargetSpec::Posix(tmp.path().to_path_buf())),
        dir: "shards".into(),
        shards: 2,
        shard_mib: 1,
        record: 1000,
        reads: 200,
        workers: 3,
        epochs: 2,
        keep: true,
        quiet: true,
        ..RecordsArgs::default()
    };
    let report = records::run(&args).expect("run");
    assert_eq!(report.errors, 0, "{:?}", report.epochs[0].first_error);
    assert_eq!(report.epochs.len(), 2);
    for e in &report.epochs {
        assert_eq!((e.reads, e.latency.count), (600, 600));
    }
    let files = local_files(&tmp.path().join("shards"));
    assert_eq!(
        files,
        vec![
            ("shard_00000.bin".to_string(), 1 << 20),
            ("shard_00001.bin".to_string(), 1 << 20)
        ]
    );
    let none = RecordsArgs {
        shards: 0,
        ..RecordsArgs::default()
    };
    assert!(records::run(&none).is_err(), "no shards to read");
    // Spoil a shard: the records read from it fail their check.
    std::fs::write(
        tmp.path().join("shards/shard_00001.bin"),
        vec![7u8; 1 << 20],
    )
    .expect("spoil");
    let spoiled = records::run(&RecordsArgs {
        no_build: true,
        keep: false,
        epochs: 1,
        ..args
    })
    .expect("run again");
    assert!(spoiled.build.is_none());
    let failed = spoiled.epochs[0].errors;
    assert!(
        (200..=400).contains(&failed),
        "{failed} of 600 from the spoiled half"
    );
    assert!(!tmp.path().join("shards").exists());
}

#[test]
fn read_workloads_through_the_library() {
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
    let target = Some(TargetSpec::Talon(cluster.addrs()));
    let report = imagenet::run(&ImagenetArgs {
        target: target.clone(),
        dir: "/inet".into(),
        files: 40,
        classes: 4,
        size: 5000,
        workers: 4,
        epochs: 1,
        cold: true,
        keep: true,
        quiet: true,
        ..ImagenetArgs::default()
    })
    .expect("imagenet");
    assert_eq!(report.errors, 0);
    assert_eq!(report.epochs[0].bytes, report.bytes);
    let client = rt
        .block_on(Client::connect(&cluster.addrs(), ClientOptions::default()))
        .expect("connect");
    let data = rt
        .block_on(client.read_file("/inet/n00000001/img_00000005.JPEG"))
        .expect("an image");
    assert!((3750..=6250).contains(&data.len()), "{}", data.len());

    // The bulk loader builds the same tree.
    let imported = imagenet::run(&ImagenetArgs {
        target: target.clone(),
        dir: "/inet-import".into(),
        files: 40,
        classes: 4,
        size: 5000,
        workers: 4,
        epochs: 1,
        import: true,
        quiet: true,
        ..ImagenetArgs::default()
    })
    .expect("imagenet --import");
    assert_eq!(imported.errors, 0);
    let build = imported.build.as_ref().expect("a build");
    assert_eq!((build.files, build.bytes), (40, report.bytes));
    assert_eq!(imported.epochs[0].bytes, report.bytes);

    // Shards of several chunks, read at random offsets.
    let report = records::run(&RecordsArgs {
        target: target.clone(),
        dir: "/shards".into(),
        shards: 2,
        shard_mib: 9,
        record: 5000,
        reads: 100,
        workers: 2,
        epochs: 1,
        cold: true,
        quiet: true,
        ..RecordsArgs::default()
    })
    .expect("records");
    assert_eq!(report.errors, 0, "{:?}", report.epochs[0].first_error);
    assert_eq!(report.epochs[0].reads, 200);

    let report = traverse::run(&TraverseArgs {
        target,
        dir: "/deep".into(),
        depth: 3,
        fanout: 2,
        files_per_leaf: 2,
        size: 10,
        workers: 2,
        quiet: true,
        ..TraverseArgs::default()
    })
    .expect("traverse");
    assert_eq!(report.errors, 0);
    assert_eq!(report.epochs[1].bytes, 160);
    // The library counts its round trips: a whole-file read needs at least one (the body
    // is not cached in the client), and a path resolved from a cold cache needs more.
    for e in &report.epochs {
        let trips = e
            .round_trips_per_file
            .expect("the library counts round trips");
        assert!(
            trips >= 1.0,
            "epoch {}: {trips} round trips per file",
            e.epoch
        );
    }
    let json = serde_json::to_value(&report).expect("json");
    assert!(
        json["epochs"][0]["round_trips_per_file"].is_number(),
        "{json}"
    );
    let gone = rt.block_on(client.stat("/deep"));
    assert!(gone.is_err(), "the tree is removed");
    rt.block_on(cluster.shutdown());
}
