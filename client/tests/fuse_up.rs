//! The `talon` binary's mount commands, run as a user would: `talon up` serves and mounts,
//! keeps what was written across a restart, and stops cleanly on SIGTERM; `talon mount`
//! names a bad mount point clearly.

#![cfg(feature = "server")]

mod fuse_support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

const TALON: &str = env!("CARGO_BIN_EXE_talon");
/// How long `talon up` may take to start serving and mount, on a loaded machine.
const START_LIMIT: Duration = Duration::from_secs(60);
/// How long `talon up` may take to exit after SIGTERM.
const STOP_LIMIT: Duration = Duration::from_secs(60);

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().expect("local addr").to_string()
}

/// Kills (SIGKILL) and unmounts on drop, whatever happened to the test.
struct Up {
    child: Option<Child>,
    mnt: std::path::PathBuf,
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if talon_client::fuse::is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .status();
        }
    }
}

/// Starts `talon up` and waits until it says it has mounted.
fn up(mnt: &Path, data: &Path, addr: &str) -> Up {
    let mut child = Command::new(TALON)
        .arg("up")
        .arg(mnt)
        .arg("--data")
        .arg(data)
        .args(["--listen", addr])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start talon up");
    let stderr = child.stderr.take().expect("stderr");
    let mut guard = Up {
        child: Some(child),
        mnt: mnt.to_path_buf(),
    };
    // Read stderr on a thread, so a `talon up` that hangs before mounting fails the test
    // at a deadline instead of blocking it; the thread keeps draining stderr afterwards so
    // the process never blocks on a full pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("mounted at") {
                let _ = tx.send(());
            }
        }
    });
    match rx.recv_timeout(START_LIMIT) {
        Ok(()) => {}
        Err(RecvTimeoutError::Timeout) => {
            panic!("talon up did not mount within {START_LIMIT:?}")
        }
        Err(RecvTimeoutError::Disconnected) => {
            let status = guard.child.as_mut().and_then(|c| c.wait().ok());
            panic!("talon up ended before mounting: {status:?}");
        }
    }
    guard
}

/// Sends SIGTERM and waits for a clean exit.
fn stop(mut u: Up) {
    let mut child = u.child.take().expect("running");
    let st = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("run kill");
    assert!(st.success());
    let deadline = Instant::now() + STOP_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for talon up") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("talon up did not exit within {STOP_LIMIT:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "talon up exit status {status:?}");
    assert!(
        !talon_client::fuse::is_mounted(&u.mnt),
        "unmounted on SIGTERM"
    );
}

#[test]
fn talon_up_serves_mounts_and_stops_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mnt, data) = (dir.path().join("mnt"), dir.path().join("data"));
    let addr = free_addr();
    let u = up(&mnt, &data, &addr);
    let mnt = std::fs::canonicalize(&mnt).expect("mount point exists");
    assert!(talon_client::fuse::is_mounted(&mnt));
    std::fs::create_dir(mnt.join("d")).expect("mkdir through the mount");
    std::fs::write(mnt.join("d/hello"), b"world").expect("write through the mount");
    // The other commands reach the embedded node.
    let out = Command::new(TALON)
        .args(["--cluster", &addr, "ls", "/d"])
        .output()
        .expect("talon ls");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hello");
    stop(u);

    // Reopening the data directory keeps the namespace and the contents.
    let u = up(&mnt, &data, &addr);
    assert_eq!(
        std::fs::read(mnt.join("d/hello")).expect("read after restart"),
        b"world"
    );
    // `talon umount` ends the mount; `talon up` notices and exits.
    let out = Command::new(TALON)
        .arg("umount")
        .arg(&mnt)
        .output()
        .expect("talon umount");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The guard keeps the child, so it is killed if it never exits.
    let mut u = u;
    let child = u.child.as_mut().expect("running");
    assert!(
        fuse_support::eventually(STOP_LIMIT, || matches!(child.try_wait(), Ok(Some(_)))),
        "talon up did not exit within {STOP_LIMIT:?} of its mount ending"
    );
}

#[test]
fn up_refuses_a_port_the_kernel_would_pick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(TALON)
        .arg("up")
        .arg(dir.path().join("mnt"))
        .arg("--data")
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("talon up");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fixed port"), "{err}");
    assert!(!talon_client::fuse::is_mounted(&dir.path().join("mnt")));
}

#[test]
fn mount_names_a_bad_mount_point() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing");
    let out = Command::new(TALON)
        .args(["--cluster", "127.0.0.1:1", "mount"])
        .arg(&missing)
        .output()
        .expect("talon mount");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist"), "{err}");

    let file = dir.path().join("file");
    std::fs::write(&file, b"").expect("write");
    let out = Command::new(TALON)
        .args(["--cluster", "127.0.0.1:1", "mount"])
        .arg(&file)
        .output()
        .expect("talon mount");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));

    let out = Command::new(TALON)
        .args(["--cluster", "127.0.0.1:1", "mount", "/proc"])
        .output()
        .expect("talon mount");
    assert!(String::from_utf8_lossy(&out.stderr).contains("busy"));
}
