//! A node of a three-node cluster is SIGKILLed under a mounted reader and writer: the
//! application sees no error, only a pause.
//!
//! The cluster is real `talon-meta` processes; the mount is the client's FUSE mount, in this
//! process; the application is plain blocking `std::fs` code on two threads, as a training
//! job and its reader would be. The writer checkpoints the way applications do (write a
//! temporary file whole, fsync, rename it over the checkpoint, in a strict directory) and
//! creates new small files; the reader keeps opening the checkpoint and files the writer has
//! already finished, and checks their whole contents. Any I/O error fails the test; how long
//! the application was held up is printed, not asserted (timings are the benchmarks' job).
//!
//! The mount is always unmounted, also when the test panics, and only one mount is made at a
//! time in this binary.

mod common;

use common::{eventually, test_raft, ProcCluster};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use talon_client::fuse::{Mount, MountOptions};
use talon_client::{Client, ClientOptions};

/// Partitions of the cluster; partition 0 holds the root directory.
const PARTITIONS: u32 = 8;
/// Writer iterations that must complete before the kill, and again after it.
const ITERATIONS_AROUND_KILL: u64 = 20;
/// Bound on the whole workload after the kill: an election is seconds, not this.
const AFTER_KILL_LIMIT: Duration = Duration::from_secs(90);
/// Most iterations of either thread, so no loop is unbounded even if stopping fails.
const MAX_ITERATIONS: u64 = 20_000;

static ONE_MOUNT_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Checkpoint generation `g`: one 16-byte record naming `g`, repeated to 64 KiB, so a torn
/// or mixed file cannot pass for a whole one.
fn checkpoint(g: u64) -> Vec<u8> {
    format!("gen {g:011}\n").repeat(4096).into_bytes()
}

/// The generation `data` is a whole copy of, if it is one.
fn whole_generation(data: &[u8]) -> Option<u64> {
    let head = std::str::from_utf8(data.get(..16)?).ok()?;
    let g = head.strip_prefix("gen ")?.trim_end().parse().ok()?;
    (data == checkpoint(g).as_slice()).then_some(g)
}

fn small_file(i: u64) -> Vec<u8> {
    format!("file {i:06};").repeat(100).into_bytes()
}

/// A kernel mount of the cluster; dropping it unmounts, lazily through `fusermount3` if
/// the session could not.
struct Mounted {
    root: PathBuf,
    mount: Option<Mount>,
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn start(client: Client, rt: &tokio::runtime::Runtime) -> Mounted {
        let dir = tempfile::tempdir().expect("create a temp dir");
        let root = dir.path().join("mnt");
        std::fs::create_dir(&root).expect("create the mount point");
        let mount = Mount::start(client, &MountOptions::new(&root), rt.handle().clone())
            .expect("mount the cluster");
        Mounted {
            root,
            mount: Some(mount),
            _dir: dir,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        talon_client::fuse::unmount_clean(self.mount.take(), &self.root);
    }
}

/// What the two application threads share: progress, errors, and the longest wait.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// The last checkpoint generation whose rename returned.
    checkpointed: AtomicU64,
    /// `data/f1` ..= `data/f{created}` have been written and fsynced.
    created: AtomicU64,
    reads: AtomicU64,
    errors: Mutex<Vec<String>>,
    /// The slowest single operation: (time, op, path).
    slowest: Mutex<(Duration, String, String)>,
}

impl Shared {
    /// Runs one application operation, timing it; an error is recorded as a failure.
    fn op<T>(&self, op: &str, path: &Path, f: impl FnOnce() -> std::io::Result<T>) -> Option<T> {
        let t = Instant::now();
        let r = f();
        let took = t.elapsed();
        let mut slowest = self.slowest.lock().unwrap_or_else(|e| e.into_inner());
        if took > slowest.0 {
            *slowest = (took, op.into(), path.display().to_string());
        }
        drop(slowest);
        r.map_err(|e| {
            self.fail(format!(
                "{op} {}: {e} (errno {:?})",
                path.display(),
                e.raw_os_error()
            ))
        })
        .ok()
    }

    fn fail(&self, what: String) {
        eprintln!("application error: {what}");
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(what);
        self.stop.store(true, Ordering::SeqCst);
    }

    fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Stops the application threads when dropped, also on a panic of the test.
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::SeqCst);
    }
}

/// One checkpoint and one new small file per iteration.
fn writer(root: PathBuf, s: Arc<Shared>) {
    let (tmp, ckpt) = (root.join("ckpt/x.tmp"), root.join("ckpt/x"));
    for g in 1..=MAX_ITERATIONS {
        if s.stopped() {
            return;
        }
        let body = checkpoint(g);
        let Some(()) = s.op("write+fsync", &tmp, || {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()
        }) else {
            return;
        };
        let Some(()) = s.op("rename", &tmp, || std::fs::rename(&tmp, &ckpt)) else {
            return;
        };
        s.checkpointed.store(g, Ordering::SeqCst);
        let path = root.join(format!("data/f{g}"));
        // fsync before close: a commit error at close(2) would be lost in `File`'s drop.
        let Some(()) = s.op("create+fsync", &path, || {
            let mut f = std::fs::File::create_new(&path)?;
            f.write_all(&small_file(g))?;
            f.sync_all()
        }) else {
            return;
        };
        s.created.store(g, Ordering::SeqCst);
    }
}

/// Reads the checkpoint and a finished small file, again and again.
fn reader(root: PathBuf, s: Arc<Shared>) {
    let ckpt = root.join("ckpt/x");
    for k in 0..MAX_ITERATIONS * 5 {
        if s.stopped() {
            return;
        }
        let floor = s.checkpointed.load(Ordering::SeqCst);
        let Some(data) = s.op("read", &ckpt, || std::fs::read(&ckpt)) else {
            return;
        };
        let ceiling = s.checkpointed.load(Ordering::SeqCst) + 1;
        match whole_generation(&data) {
            // A strict directory: a rename that returned before the open is seen by it.
            Some(g) if (floor..=ceiling).contains(&g) => {}
            Some(g) => {
                return s.fail(format!(
                    "read {}: generation {g}, acknowledged {floor}..={ceiling}",
                    ckpt.display()
                ))
            }
            None => {
                return s.fail(format!(
                    "read {}: not one whole generation ({} bytes)",
                    ckpt.display(),
                    data.len()
                ))
            }
        }
        let created = s.created.load(Ordering::SeqCst);
        if created > 0 {
            // The newest file, and one spread over the older ones.
            for i in [created, k % created + 1] {
                let path = root.join(format!("data/f{i}"));
                let Some(data) = s.op("read", &path, || std::fs::read(&path)) else {
                    return;
                };
                if data != small_file(i) {
                    return s.fail(format!(
                        "read {}: wrong contents ({} bytes)",
                        path.display(),
                        data.len()
                    ));
                }
            }
        }
        s.reads.fetch_add(1, Ordering::SeqCst);
        // Pacing, not synchronisation: leave the two cores to the nodes and the mount.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `done` every 50 ms until it holds, the application failed, or `limit` passed.
fn wait_for(s: &Shared, limit: Duration, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        let errors = s.errors();
        assert!(errors.is_empty(), "application saw errors: {errors:#?}");
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn killing_a_node_under_a_mount_is_only_a_pause() {
    let _one = ONE_MOUNT_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("build a runtime");
    let mut pc = ProcCluster::start_with(3, PARTITIONS, test_raft(20_000, 1_000), |c| {
        c.strict_prefixes = vec!["/ckpt".into()];
    });
    let client = rt.block_on(async {
        eventually(Duration::from_secs(30), "the cluster to serve", || async {
            let c = Client::connect(&pc.addrs, ClientOptions::default())
                .await
                .ok()?;
            c.stat("/").await.ok()
        })
        .await;
        for p in 0..PARTITIONS {
            eventually(
                Duration::from_secs(30),
                "a leader of every partition",
                || common::leader_of(&pc.addrs, p),
            )
            .await;
        }
        // A leader election must be a pause of the application, not an error: give each
        // operation far longer than one.
        let opts = ClientOptions {
            op_timeout: Duration::from_secs(60),
            ..ClientOptions::default()
        };
        Client::connect(&pc.addrs, opts)
            .await
            .expect("connect a client")
    });
    // Declared after the cluster: dropped, so unmounted, while the nodes still answer.
    let m = Mounted::start(client, &rt);
    std::fs::create_dir(m.path("ckpt")).expect("mkdir ckpt");
    std::fs::create_dir(m.path("data")).expect("mkdir data");
    std::fs::write(m.path("ckpt/x"), checkpoint(0)).expect("write generation 0");

    let s = Arc::new(Shared::default());
    let _stop = StopOnDrop(s.clone());
    let threads = [
        std::thread::spawn({
            let (root, s) = (m.root.clone(), s.clone());
            move || writer(root, s)
        }),
        std::thread::spawn({
            let (root, s) = (m.root.clone(), s.clone());
            move || reader(root, s)
        }),
    ];
    wait_for(
        &s,
        Duration::from_secs(60),
        "writes before the kill",
        || s.created.load(Ordering::SeqCst) >= ITERATIONS_AROUND_KILL,
    );

    // Leadership may be changing hands at any one instant: wait until a node claims it.
    let victim = rt.block_on(eventually(
        Duration::from_secs(60),
        "a leader of partition 0",
        || common::leader_of(&pc.addrs, 0),
    ));
    let (written, read) = (
        s.created.load(Ordering::SeqCst),
        s.reads.load(Ordering::SeqCst),
    );
    let killed_at = Instant::now();
    pc.kill(victim);
    eprintln!("killed node {victim} (leader of partition 0) after {written} writes, {read} reads");
    wait_for(
        &s,
        AFTER_KILL_LIMIT,
        "the application to go on after the kill",
        || {
            s.created.load(Ordering::SeqCst) >= written + ITERATIONS_AROUND_KILL
                && s.reads.load(Ordering::SeqCst) >= read + ITERATIONS_AROUND_KILL
        },
    );
    let went_on_after = killed_at.elapsed();
    s.stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("an application thread panicked");
    }
    let errors = s.errors();
    assert!(
        errors.is_empty(),
        "application saw errors: {errors:#?}\nlog of node {victim}:\n{}",
        pc.log(victim)
    );

    // Everything acknowledged is there, whole, through the mount.
    let last = s.checkpointed.load(Ordering::SeqCst);
    let data = std::fs::read(m.path("ckpt/x")).expect("read the checkpoint");
    assert_eq!(
        whole_generation(&data),
        Some(last),
        "the checkpoint after the run"
    );
    let created = s.created.load(Ordering::SeqCst);
    for i in 1..=created {
        let got = std::fs::read(m.path(&format!("data/f{i}"))).expect("read a small file");
        assert!(
            got == small_file(i),
            "data/f{i} after the run: {} bytes",
            got.len()
        );
    }
    let (took, op, path) = s.slowest.lock().unwrap_or_else(|e| e.into_inner()).clone();
    eprintln!(
        "{created} writer iterations, {} reader iterations; {} more of each within {went_on_after:?} of the kill; \
         longest single operation {took:?} ({op} {path})",
        s.reads.load(Ordering::SeqCst),
        ITERATIONS_AROUND_KILL
    );
    drop(m);
}
