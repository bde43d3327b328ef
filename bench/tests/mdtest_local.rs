//! mdtest against a local temporary directory: the files and directories it makes and
//! removes are the ones the flags ask for, and the JSON report has its documented shape.

use std::path::Path;
use talon_bench::mdtest::{self, MdtestArgs};
use talon_bench::target::TargetSpec;

/// Regular files and directories below `root` (not counting it).
fn count(root: &Path) -> (usize, usize) {
    let (mut files, mut dirs) = (0, 0);
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("list") {
            let e = e.expect("entry");
            let t = e.file_type().expect("type");
            if t.is_dir() {
                dirs += 1;
                stack.push(e.path());
            } else {
                files += 1;
            }
        }
    }
    (files, dirs)
}

fn args(dir: &Path) -> MdtestArgs {
    MdtestArgs {
        target: Some(TargetSpec::Posix(dir.to_path_buf())),
        dir: "run".into(),
        quiet: true,
        ..MdtestArgs::default()
    }
}

#[test]
fn create_then_stat_read_remove_leaves_what_the_flags_say() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let run = tmp.path().join("run");
    // 3 tasks, a tree of depth 1 and fan-out 2 (3 directories) each, 12 files per task
    // with 100 bytes each.
    let base = MdtestArgs {
        tasks: 3,
        items: 12,
        depth: 1,
        branch: 2,
        unique_dir: true,
        files_only: true,
        write_bytes: 100,
        read_bytes: 100,
        ..args(tmp.path())
    };
    let report = mdtest::run(&MdtestArgs {
        create: true,
        ..base.clone()
    })
    .expect("create");
    assert_eq!(report.errors, 0);
    // test-dir.0-0 + 3 trees of 3 directories.
    assert_eq!(count(&run), (36, 1 + 9));
    let size =
        std::fs::metadata(run.join("test-dir.0-0/mdtest_tree.2.0/mdtest_tree.2.1/file.mdtest.2.5"))
            .expect("a file of task 2 in directory 1")
            .len();
    assert_eq!(size, 100);

    let report = mdtest::run(&MdtestArgs {
        stat: true,
        read: true,
        ..base.clone()
    })
    .expect("stat and read");
    assert_eq!(report.errors, 0);
    let calls: Vec<(&str, u64)> = report.iterations[0]
        .phases
        .iter()
        .map(|p| (p.phase, p.calls))
        .collect();
    assert_eq!(calls, vec![("File stat", 36), ("File read", 36)]);

    let report = mdtest::run(&MdtestArgs {
        remove: true,
        ..base
    })
    .expect("remove");
    assert_eq!(report.errors, 0);
    assert!(!run.exists() || count(&run) == (0, 0));
}

#[test]
fn a_full_run_cleans_up_and_counts_every_phase() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let report = mdtest::run(&MdtestArgs {
        tasks: 2,
        items: 8,
        iterations: 2,
        ..args(tmp.path())
    })
    .expect("run");
    assert_eq!(report.errors, 0);
    assert_eq!(report.iterations.len(), 2);
    for it in &report.iterations {
        let names: Vec<&str> = it.phases.iter().map(|p| p.phase).collect();
        assert_eq!(
            names,
            [
                "Tree creation",
                "Directory creation",
                "Directory stat",
                "Directory rename",
                "Directory removal",
                "File creation",
                "File stat",
                "File read",
                "File removal",
                "Tree removal"
            ]
        );
        for p in &it.phases {
            let want = if p.phase.starts_with("Tree") { 1 } else { 16 };
            assert_eq!((p.ops, p.calls), (want, want), "{}", p.phase);
            assert!(p.rate > 0.0 && p.seconds > 0.0);
            assert_eq!(p.latency.count, p.calls, "every call is timed: {}", p.phase);
            assert!(p.latency.p50_ms <= p.latency.max_ms, "{}", p.phase);
        }
    }
    for row in &report.summary {
        assert!(row.ran, "{}", row.phase);
        let calls = if row.phase.starts_with("Tree") { 2 } else { 32 };
        assert_eq!(
            row.latency.count, calls,
            "{} over both iterations",
            row.phase
        );
    }
    assert_eq!(count(tmp.path()), (0, 0), "everything removed");
    let table = report.table();
    assert!(
        table.contains("SUMMARY rate (in ops/sec): (of 2 iterations)"),
        "{table}"
    );
    assert!(table.contains("   File creation      "), "{table}");
    assert!(
        table.contains("Latency per call (in ms): (of 2 iterations, every task)"),
        "{table}"
    );
    assert!(table.contains("Command line used: talon-bench mdtest --tasks 2 -n 8 -i 2 -d run"));
}

#[test]
fn failures_are_counted_not_fatal() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Stat files nobody made: every stat fails, the run still reports.
    std::fs::create_dir_all(tmp.path().join("run/test-dir.0-0")).expect("mkdir");
    let report = mdtest::run(&MdtestArgs {
        items: 5,
        files_only: true,
        stat: true,
        ..args(tmp.path())
    })
    .expect("run");
    assert_eq!(report.errors, 5);
    let p = &report.iterations[0].phases[0];
    assert_eq!((p.phase, p.errors), ("File stat", 5));
    assert!(
        p.first_error
            .as_deref()
            .is_some_and(|e| e.contains("file.mdtest.0.0")),
        "{:?}",
        p.first_error
    );
}

#[test]
fn the_json_report_has_its_documented_shape() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let report = mdtest::run(&MdtestArgs {
        items: 4,
        files_only: true,
        ..args(tmp.path())
    })
    .expect("run");
    let v = serde_json::to_value(&report).expect("json");
    for key in [
        "workload",
        "command",
        "target",
        "dir",
        "tasks",
        "items_per_task",
        "items_per_dir",
        "dirs_in_tree",
        "iterations",
        "summary",
        "errors",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["workload"], "mdtest");
    assert_eq!(v["target"], format!("posix:{}", tmp.path().display()));
    let phase = &v["iterations"][0]["phases"][0];
    for key in [
        "phase",
        "ops",
        "calls",
        "errors",
        "seconds",
        "rate",
        "task_seconds",
    ] {
        assert!(phase.get(key).is_some(), "phase lacks {key}: {phase}");
    }
    assert!(phase.get("first_error").is_none(), "no error, no key");
    let rows = v["summary"].as_array().expect("summary rows");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["phase"].as_str()).collect();
    assert_eq!(
        names,
        [
            "File creation",
            "File stat",
            "File read",
            "File removal",
            "Tree creation",
            "Tree removal"
        ]
    );
    for r in rows {
        for key in ["ran", "max", "min", "mean", "stddev"] {
            assert!(r.get(key).is_some(), "row lacks {key}: {r}");
        }
    }
}
