//! Short runs of every workload under every fault kind, each ending in a verdict: a fresh
//! 5-node cluster of real `talon-meta` processes per test, faults in turn (`--schedule
//! each`), then the checker. A test passes only on a VALID verdict.
//!
//! The tests run the `talon-jepsen` binary with `talon-meta` and `talon` (for the FUSE
//! mount) from the same target directory (a workspace build or test run builds them all),
//! or from `$TALON_META_BIN` and `$TALON_BIN`.
//! The harness needs root (a network namespace of its own, nftables inside it).
//!
//! Every run checks strictly (no `--lenient`): since finding F1 was fixed the server
//! answers a re-sent rename, unlink, link or xattr change from its record of the first
//! copy, so no answer is a guess and no request applies twice (finding F4 was the latter).

mod common;

use common::binary;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a run may take, start-up, faults, recovery and checking included.
const WALL: Duration = Duration::from_secs(300);

/// Runs the harness with `args` and asserts a VALID verdict.
fn run(args: &[&str]) {
    let (ok, stdout, tail) = run_harness(args);
    assert!(
        ok && stdout.contains("verdict: VALID"),
        "talon-jepsen {args:?} did not find the history valid\n{}",
        tail
    );
}

/// Runs the harness; returns whether it exited 0, its output, and the tail of its errors.
fn run_harness(args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_talon-jepsen"))
        .arg("run")
        .args(args)
        .arg("--meta-bin")
        .arg(binary("TALON_META_BIN", "talon-meta", "talon-meta"))
        .arg("--talon-bin")
        .arg(binary("TALON_BIN", "talon-client", "talon"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start talon-jepsen");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for talon-jepsen") {
            break Some(st);
        }
        if start.elapsed() > WALL {
            // SIGKILL: its nodes die with it (parent-death signal), its namespace with them.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    println!("{stdout}");
    let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    match status {
        None => panic!("talon-jepsen ran over {WALL:?}\n{}", tail.join("\n")),
        Some(st) => (
            st.success(),
            stdout,
            format!("exit {st}\n{}", tail.join("\n")),
        ),
    }
}

/// Every fault kind in turn, each held 1.5-2.5 s after 1 s of quiet: 13 faults in ~46 s.
const EACH: &[&str] = &[
    "--schedule",
    "each",
    "--time",
    "48",
    "--hold",
    "1.5,2.5",
    "--quiet",
    "1",
    "--seed",
    "20261123",
];

/// Strict reads are linearizable and no write is lost or applied twice (F1, F4).
#[test]
fn register_under_every_fault() {
    let mut a = vec!["--workload", "register"];
    a.extend_from_slice(EACH);
    run(&a);
}

/// Nothing acknowledged is lost, and the client reads back its own creates. With a 250 ms
/// staleness bound, reads back in the quiet spells outlast the client's session window
/// and reach followers, also right after an election (F11).
#[test]
fn set_under_every_fault() {
    let mut a = vec!["--workload", "set", "--staleness-ms", "250"];
    a.extend_from_slice(EACH);
    run(&a);
}

/// The set workload with every create made through a FUSE mount (`open(O_CREAT|O_EXCL)`).
#[test]
fn set_through_a_fuse_mount_under_every_fault() {
    let mut a = vec!["--workload", "set-fuse"];
    a.extend_from_slice(EACH);
    run(&a);
}

/// Strict listings never see half of a rename (F3), and a move answered ENOENT or EEXIST
/// did not take effect (F1).
#[test]
fn rename_under_every_fault() {
    let mut a = vec!["--workload", "rename"];
    a.extend_from_slice(EACH);
    run(&a);
}

/// Checkpoints replaced by renames and rewritten in place, read whole and slowly, never
/// torn; with a 4 s unlinked grace, the files replaced and the chunks rewrites took out are
/// reclaimed within the run, under the faults, while slow readers hold some of them.
#[test]
fn checkpoint_under_every_fault() {
    let mut a = vec![
        "--workload",
        "checkpoint",
        "--concurrency",
        "4",
        "--checkpoint-kib",
        "5132",
        "--unlinked-grace-ms",
        "4000",
    ];
    a.extend_from_slice(EACH);
    run(&a);
}

/// A file's link count, on its inode's partition, moves with the link names on three other
/// partitions: every count read is one plus the links held at some moment within it.
#[test]
fn links_under_every_fault() {
    let mut a = vec!["--workload", "links"];
    a.extend_from_slice(EACH);
    run(&a);
}

#[test]
fn register_with_five_replicas_under_combined_faults() {
    run(&[
        "--workload",
        "register",
        "--replication",
        "5",
        "--schedule",
        "random",
        "--time",
        "20",
        "--hold",
        "1.5,2.5",
        "--quiet",
        "1",
        "--seed",
        "5",
    ]);
}

/// Crashes exactly at each fail point in turn (2PC prepare/decision, a participant's
/// apply of the commit, the two halves of a snapshot install, a log append before its
/// fsync), on renames across partitions, each a two-phase commit: no file is lost or
/// doubled and every listing sees each file once.
#[test]
fn rename_under_crashes_at_every_fail_point() {
    run(&[
        "--workload",
        "rename",
        "--nemesis",
        "crash",
        "--schedule",
        "each",
        "--time",
        "30",
        "--hold",
        "1.5,2.5",
        "--quiet",
        "1",
        "--seed",
        "20261124",
    ]);
}

/// Clock jumps on partition leaders while renames cross partitions: a forward jump makes
/// young prepared transactions look stale, so recovery races the coordinator for their
/// decision (the first recorded one must win); no file is lost or doubled.
#[test]
fn rename_under_clock_jumps() {
    run(&[
        "--workload",
        "rename",
        "--nemesis",
        "clock-jump",
        "--schedule",
        "each",
        "--time",
        "30",
        "--hold",
        "3,6",
        "--quiet",
        "1",
        "--seed",
        "20261126",
    ]);
}
