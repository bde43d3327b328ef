//! Shared fixture of the FUSE tests: a real in-process cluster and a real kernel mount of
//! it in a temporary directory, driven from plain blocking `std::fs` code on the test
//! thread while a tokio runtime owned by the fixture answers the kernel.
//!
//! Every test mounts its own file system and always unmounts it: [`Mounted`]'s `Drop`
//! unmounts through the session, and falls back to `fusermount3 -u -z` if the mount point is
//! still a mount (also when the test panicked). Mounts of one test binary are made one at a
//! time: the machines are small, and a starved Raft election makes timings flaky.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use talon_client::fuse::{Mount, MountOptions};
use talon_client::{Client, ClientOptions};
use talon_testkit::{TestCluster, TestClusterBuilder};

/// The strict prefix of the fixture's clusters.
pub const STRICT_PREFIX: &str = "/ckpt";

/// The relaxed staleness bound of the fixture's clusters (ms).
pub const STALENESS_MS: u64 = 500;

static GATE: Mutex<()> = Mutex::new(());

/// A cluster and a mount of it.
pub struct Mounted {
    /// The mount point.
    pub root: PathBuf,
    /// A client of the cluster, independent of the mount.
    pub client: Client,
    mount: Option<Mount>,
    cluster: Option<TestCluster>,
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    _gate: MutexGuard<'static, ()>,
}

impl Mounted {
    /// A one-node cluster of 8 partitions, mounted with `allow_other` (so the permission
    /// tests can act as another user).
    pub fn start() -> Mounted {
        Mounted::start_with(1)
    }

    /// A cluster of `nodes` nodes, mounted.
    pub fn start_with(nodes: u64) -> Mounted {
        Mounted::start_on(TestCluster::builder().nodes(nodes))
    }

    /// The cluster `builder` makes (8 partitions, replication min(3, nodes), the fixture's
    /// strict prefix and staleness bound), mounted.
    pub fn start_on(builder: TestClusterBuilder) -> Mounted {
        let gate = GATE.lock().unwrap_or_else(|e| e.into_inner());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("build a runtime");
        let nodes = builder.node_count();
        let cluster = rt
            .block_on(
                builder
                    .partitions(8)
                    .replication(nodes.min(3) as u32)
                    .strict_prefixes(vec![STRICT_PREFIX.into()])
                    .relaxed_staleness_ms(STALENESS_MS)
                    .start(),
            )
            .expect("start the test cluster");
        let client = rt
            .block_on(Client::connect(&cluster.addrs(), ClientOptions::default()))
            .expect("connect a client");
        let (dir, root, mount) = mount_in_temp_dir(client.clone(), &rt);
        Mounted {
            root,
            client,
            mount: Some(mount),
            cluster: Some(cluster),
            _dir: dir,
            rt,
            _gate: gate,
        }
    }

    /// `rel` under the mount point.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    /// Stops the node that leads partition `p` (the cluster must have more than one node);
    /// returns its id.
    pub fn stop_leader_of(&mut self, p: u32) -> u64 {
        let cluster = self.cluster.as_mut().expect("running cluster");
        self.rt.block_on(async {
            let id = cluster.leader_of(p).await.expect("a leader");
            cluster.stop_node(id).await;
            id
        })
    }

    /// Stops node `id` cleanly and starts it again on its data; the mount stays.
    pub fn restart_node(&mut self, id: u64) {
        let cluster = self.cluster.as_mut().expect("running cluster");
        self.rt.block_on(async {
            cluster.stop_node(id).await;
            cluster.restart_node(id).await.expect("restart the node");
        })
    }

    /// The running cluster.
    pub fn cluster(&self) -> &TestCluster {
        self.cluster.as_ref().expect("running cluster")
    }

    /// Runs `f` on the fixture's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The fixture's runtime, for driving the library from other threads.
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.rt.handle().clone()
    }

    /// A second mount of the same cluster through its own client (its own caches), like a
    /// second machine's; unmounted when dropped.
    pub fn mount_again(&self) -> OtherMount {
        let cluster = self.cluster.as_ref().expect("running cluster");
        let client = self
            .rt
            .block_on(Client::connect(&cluster.addrs(), ClientOptions::default()))
            .expect("connect a second client");
        let (dir, root, mount) = mount_in_temp_dir(client, &self.rt);
        OtherMount {
            root,
            mount: Some(mount),
            _dir: dir,
        }
    }
}

/// Mounts `client`'s namespace at `mnt` in a new temp dir, with `allow_other` (so the
/// permission tests can act as another user); returns the dir, the mount point, the mount.
fn mount_in_temp_dir(
    client: Client,
    rt: &tokio::runtime::Runtime,
) -> (tempfile::TempDir, PathBuf, Mount) {
    let dir = tempfile::tempdir().expect("create a temp dir");
    // Other users must reach the mount point for the permission tests.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod the temp dir");
    let root = dir.path().join("mnt");
    std::fs::create_dir(&root).expect("create the mount point");
    let opts = MountOptions {
        allow_other: true,
        ..MountOptions::new(&root)
    };
    let mount = Mount::start(client, &opts, rt.handle().clone()).expect("mount the cluster");
    (dir, root, mount)
}

/// A second mount of a fixture's cluster (see [`Mounted::mount_again`]). Drop it before
/// the [`Mounted`] it came from.
pub struct OtherMount {
    /// The mount point.
    pub root: PathBuf,
    mount: Option<Mount>,
    _dir: tempfile::TempDir,
}

impl OtherMount {
    /// `rel` under the mount point.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }
}

impl Drop for OtherMount {
    fn drop(&mut self) {
        talon_client::fuse::unmount_clean(self.mount.take(), &self.root);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        talon_client::fuse::unmount_clean(self.mount.take(), &self.root);
        if let Some(c) = self.cluster.take() {
            self.rt.block_on(c.shutdown());
        }
    }
}

/// The errno of an I/O result that must be an error.
#[track_caller]
pub fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("not an OS error: {e}")),
    }
}

/// Polls `check` every 20 ms until it holds or `limit` passes; returns whether it held.
pub fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
