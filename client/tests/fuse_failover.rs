//! A mount of a three-node cluster keeps working when a partition leader's node stops: the
//! client library finds the new leader within its operation timeout, so applications see
//! a pause, never an error.

mod fuse_support;

use fuse_support::Mounted;
use std::fs;

#[test]
fn mount_survives_a_leader_change() {
    let mut m = Mounted::start_with(3);
    fs::create_dir(m.path("data")).expect("mkdir");
    for i in 0..20 {
        fs::write(m.path(&format!("data/f{i}")), format!("file {i}")).expect("write");
    }
    // Partition 0 holds the root directory.
    let stopped = m.stop_leader_of(0);
    eprintln!("stopped node {stopped}");
    for i in 0..20 {
        let got = fs::read_to_string(m.path(&format!("data/f{i}"))).expect("read after failover");
        assert_eq!(got, format!("file {i}"));
    }
    for i in 20..40 {
        fs::write(m.path(&format!("data/f{i}")), format!("file {i}")).expect("write after");
    }
    fs::rename(m.path("data"), m.path("moved")).expect("rename after failover");
    assert_eq!(fs::read_dir(m.path("moved")).expect("readdir").count(), 40);
}
