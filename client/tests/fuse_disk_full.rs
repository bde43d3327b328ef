//! A full disk through the mount is an answer, not an outage: a one-node cluster whose data
//! directory sits on a 64 MiB tmpfs is filled with 200 KB files until a write fails. The
//! failure is ENOSPC; every file written before reads back whole; listing and statfs work
//! and statfs shows the disk full; deleting files makes room and writes succeed again; and
//! the node restarts on the full disk.

mod fuse_support;

use fuse_support::Mounted;
use std::io::Write;
use std::time::{Duration, Instant};
use talon_meta::config::SpaceConfig;
use talon_testkit::{SmallFs, TestCluster};

const FS_BYTES: u64 = 64 << 20;
const FILE_BYTES: usize = 200_000;
/// More than the file system can hold, so the loop must stop on an error.
const MAX_FILES: usize = 1_000;

/// File `i`'s contents: incompressible, so the disk really fills.
fn body(i: usize) -> Vec<u8> {
    talon_testkit::pattern(i as u64, FILE_BYTES)
}

/// Writes file `i` whole and syncs it, so an error of the write reaches the caller (a plain
/// close would drop it).
fn write(m: &Mounted, i: usize) -> std::io::Result<()> {
    let mut f = std::fs::File::create(m.path(&format!("/data/f{i:04}")))?;
    f.write_all(&body(i))?;
    f.sync_all()
}

fn statfs_avail(m: &Mounted) -> (u64, u64) {
    let st = rustix::fs::statvfs(&m.root).expect("statfs of the mount");
    (st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)
}

#[test]
fn a_full_disk_refuses_writes_with_enospc_and_keeps_serving() {
    // `RUST_LOG=warn` shows what the node says about its disk.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let fs = SmallFs::mount(FS_BYTES).expect("mount a small tmpfs");
    let mut m = Mounted::start_on(
        TestCluster::builder()
            .nodes(1)
            .data_dir(1, fs.path.join("node1"))
            .space(SpaceConfig::default())
            // Deleted files are reclaimed after half the grace on a nearly full disk; the
            // default grace would keep them for 15 s.
            .unlinked_grace_ms(1000),
    );
    std::fs::create_dir(m.path("/data")).expect("mkdir");

    let mut written = 0;
    let err = loop {
        assert!(
            written < MAX_FILES,
            "{MAX_FILES} files fit on a {FS_BYTES}-byte disk"
        );
        match write(&m, written) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "the write that does not fit fails with ENOSPC, after {written} files: {err}"
    );
    // The disk is used, not refused early: at least half of it holds files (each stored
    // twice until a snapshot: in the log and in the state).
    assert!(
        written * FILE_BYTES * 2 >= FS_BYTES as usize / 2,
        "only {written} files fit"
    );
    let (total, avail) = statfs_avail(&m);
    assert!(
        avail < total / 10,
        "statfs shows the disk full: {avail} of {total} bytes available"
    );

    // Everything written before reads back whole, and the directory lists.
    for i in 0..written {
        let got = std::fs::read(m.path(&format!("/data/f{i:04}"))).expect("read back");
        assert!(got == body(i), "file {i} reads back whole");
    }
    let listed = std::fs::read_dir(m.path("/data")).expect("ls").count();
    assert!(
        listed >= written,
        "{listed} entries listed, {written} written"
    );

    // Deleting files through the mount makes room; writes succeed again.
    for i in (0..written).step_by(2) {
        std::fs::remove_file(m.path(&format!("/data/f{i:04}"))).expect("rm on a full disk");
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let again = loop {
        match write(&m, MAX_FILES) {
            Ok(()) => break true,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("writing after deletes: {e}"),
        }
        if Instant::now() >= deadline {
            break false;
        }
    };
    assert!(again, "deleting half the files made room for a new one");

    // Fill it again, then restart the node on the full disk: it starts, and every file
    // still there reads back whole.
    let mut i = MAX_FILES + 1;
    while write(&m, i).is_ok() {
        i += 1;
        assert!(i < 2 * MAX_FILES, "the disk fills again");
    }
    m.restart_node(1);
    for i in (1..written).step_by(2).chain([MAX_FILES]) {
        let path = m.path(&format!("/data/f{i:04}"));
        let got = std::fs::read(&path).expect("read back after the restart");
        assert!(
            got == body(i),
            "file {i} reads back whole after the restart"
        );
    }
    drop(m);
    drop(fs);
}
