//! `talon-bench memfs` mounted for real: mdtest's phases run through it with no errors and
//! leave what they should, a file reads back what was written, and SIGTERM unmounts it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use talon_bench::mdtest::{self, MdtestArgs};
use talon_bench::target::TargetSpec;

fn is_mounted(dir: &Path) -> bool {
    talon_client::fuse::is_mounted(&std::fs::canonicalize(dir).expect("canonical path"))
}

/// Kills memfs and lazily unmounts its mount point if the test ends before it does.
struct Cleanup<'a>(&'a Path, Option<u32>);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Some(pid) = self
            .1
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        if is_mounted(self.0) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(self.0)
                .status();
        }
    }
}

#[test]
fn mdtest_runs_through_memfs_and_sigterm_unmounts_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mount point");
    let mut child = Command::new(env!("CARGO_BIN_EXE_talon-bench"))
        .arg("memfs")
        .arg(&mnt)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start memfs");
    let mut cleanup = Cleanup(&mnt, Some(child.id()));
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let first = lines.next().expect("a line").expect("read stderr");
    assert!(first.contains("mounted at"), "memfs said: {first}");

    std::fs::write(mnt.join("f"), b"hello").expect("write");
    assert_eq!(std::fs::read(mnt.join("f")).expect("read"), b"hello");
    std::fs::remove_file(mnt.join("f")).expect("remove");

    let args = MdtestArgs {
        target: Some(TargetSpec::Posix(mnt.clone())),
        dir: "run".into(),
        quiet: true,
        tasks: 2,
        items: 20,
        unique_dir: true,
        files_only: true,
        write_bytes: 4096,
        read_bytes: 4096,
        ..MdtestArgs::default()
    };
    let report = mdtest::run(&args).expect("mdtest");
    assert_eq!(report.errors, 0);
    let left: Vec<_> = std::fs::read_dir(&mnt)
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "mdtest left {left:?}");

    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "memfs did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    cleanup.1 = None;
    assert!(status.success(), "memfs exited with {status}");
    assert!(!is_mounted(&mnt), "still mounted after SIGTERM");
}
