//! Training-data patterns through a real FUSE mount: an ImageNet-style tree copied in with
//! the usual tools and read back identically, and the checkpoint pattern (write `x.tmp`,
//! rename it over `x`) seen by concurrent readers, in other processes, on another mount and
//! through the library, as whole files only and never as an error; and the read-ahead a
//! checkpoint is read with.

mod fuse_support;

use fuse_support::Mounted;
use rand::RngCore;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Class directories and files per class of the generated tree.
const CLASSES: usize = 20;
const FILES_PER_CLASS: usize = 50;
/// About the size of an ImageNet JPEG.
const FILE_SIZE: usize = 110 * 1024;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn make_tree(root: &Path) {
    let mut rng = rand::rng();
    let mut buf = vec![0u8; FILE_SIZE];
    for c in 0..CLASSES {
        let dir = root.join(format!("n{:08}", 1_440_764 + c));
        fs::create_dir_all(&dir).expect("mkdir class");
        for f in 0..FILES_PER_CLASS {
            rng.fill_bytes(&mut buf);
            // Sizes vary a little around the typical one.
            let len = FILE_SIZE - (f * 97) % 4096;
            fs::write(dir.join(format!("img_{f:05}.JPEG")), &buf[..len]).expect("write image");
        }
    }
}

#[test]
fn imagenet_tree_copies_in_and_reads_back_identically() {
    let m = Mounted::start();
    let local = tempfile::tempdir().expect("tempdir");
    let src = local.path().join("train");
    make_tree(&src);

    let started = Instant::now();
    run(Command::new("cp").arg("-r").arg(&src).arg(&m.root));
    eprintln!(
        "cp -r of {} files took {:?}",
        CLASSES * FILES_PER_CLASS,
        started.elapsed()
    );
    let dst = m.path("train");
    let started = Instant::now();
    run(Command::new("diff").arg("-r").arg(&src).arg(&dst));
    eprintln!("diff -r took {:?}", started.elapsed());

    let count = |dir: &Path| {
        run(Command::new("sh")
            .arg("-c")
            .arg("find . | wc -l")
            .current_dir(dir))
        .trim()
        .parse::<usize>()
        .expect("a count")
    };
    let want = 1 + CLASSES + CLASSES * FILES_PER_CLASS;
    assert_eq!(count(&src), want);
    assert_eq!(count(&dst), want);

    // tar of the mounted tree lists the same members as tar of the local one.
    let list = |dir: &Path| {
        let mut names: Vec<String> = run(Command::new("sh")
            .arg("-c")
            .arg("tar cf - . | tar tvf - | awk '{print $3, $6}'")
            .current_dir(dir))
        .lines()
        .map(str::to_string)
        .collect();
        names.sort();
        names
    };
    let started = Instant::now();
    assert_eq!(list(&src), list(&dst));
    eprintln!("tar took {:?}", started.elapsed());
    let started = Instant::now();

    // Shuffled whole-file reads from several threads see the right bytes.
    let files: Vec<(std::path::PathBuf, std::path::PathBuf)> = (0..CLASSES)
        .flat_map(|c| (0..FILES_PER_CLASS).map(move |f| (c, f)))
        .map(|(c, f)| {
            let rel = format!("n{:08}/img_{f:05}.JPEG", 1_440_764 + c);
            (src.join(&rel), dst.join(&rel))
        })
        .collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let files = &files;
            s.spawn(move || {
                for (i, (a, b)) in files.iter().enumerate() {
                    if (i * 7 + t) % 4 == 0 {
                        assert_eq!(fs::read(a).expect("read local"), fs::read(b).expect("read"));
                    }
                }
            });
        }
    });
    eprintln!("threaded reads took {:?}", started.elapsed());
}

/// Size of the test checkpoints: small files (one body record each).
const CKPT_SIZE: usize = 300 * 1024;
/// Reader processes: the file to read and the file whose existence tells them to stop.
const READER_FILE_ENV: &str = "TALON_TEST_READ_CHECKPOINT";
const READER_READY_ENV: &str = "TALON_TEST_READ_READY";
const READER_STOP_ENV: &str = "TALON_TEST_READ_UNTIL";

/// Generation `gen` of the checkpoint: its number, then one byte value throughout.
/// A checkpoint is read in requests of a megabyte: the mount gives its device the
/// read-ahead it offers the kernel, whose own default (128 KiB) would cap every read.
#[test]
fn the_mount_reads_ahead_a_megabyte() {
    use std::os::unix::fs::MetadataExt;
    let m = Mounted::start();
    let dev = fs::metadata(&m.root).expect("stat the mount").dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    let kb = fs::read_to_string(&path).expect("read the device's read-ahead");
    assert_eq!(kb.trim(), "1024", "{path}");
}

fn ckpt_body(gen: u64) -> Vec<u8> {
    let mut b = gen.to_le_bytes().to_vec();
    b.resize(CKPT_SIZE, (gen % 251) as u8);
    b
}

/// The generation of a checkpoint read whole, or a description of what is wrong with it.
fn ckpt_generation(got: &[u8]) -> Result<u64, String> {
    if got.len() != CKPT_SIZE {
        return Err(format!(
            "{} bytes, not {CKPT_SIZE}: not a whole file",
            got.len()
        ));
    }
    let mut g = [0u8; 8];
    g.copy_from_slice(&got[..8]);
    let gen = u64::from_le_bytes(g);
    match got[8..].iter().position(|&b| b != (gen % 251) as u8) {
        None => Ok(gen),
        Some(at) => Err(format!(
            "checkpoint {gen} mixes contents at byte {}",
            at + 8
        )),
    }
}

/// Not a test of its own: the body of the reader processes that
/// `checkpoint_replacement_under_load_never_fails_a_reader` starts (the test binary runs
/// itself with this test selected). Reads the named checkpoint whole in a loop, creates the
/// ready file after its first read, stops when the stop file appears (or after five
/// minutes), and fails on any error or torn file.
#[test]
#[ignore = "a reader process of the checkpoint stress test"]
fn checkpoint_reader_process() {
    let env = |k: &str| {
        std::env::var_os(k).unwrap_or_else(|| panic!("run by the checkpoint stress test: no {k}"))
    };
    let (file, ready, stop) = (
        env(READER_FILE_ENV),
        env(READER_READY_ENV),
        env(READER_STOP_ENV),
    );
    let (file, ready, stop) = (Path::new(&file), Path::new(&ready), Path::new(&stop));
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut reads = 0u64;
    while !stop.exists() && Instant::now() < deadline {
        let got = fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        if let Err(e) = ckpt_generation(&got) {
            panic!("{}: {e}", file.display());
        }
        reads += 1;
        if reads == 1 {
            fs::write(ready, b"").expect("write the ready file");
        }
    }
    println!("reads={reads}");
}

/// Reader processes (see `checkpoint_reader_process`); killed if still running when
/// dropped, so a failing test leaves none behind holding the mount.
struct Readers(Vec<(std::process::Child, std::path::PathBuf)>);

impl Readers {
    /// Starts one reader per file; `scratch` holds their ready files and `stop`.
    fn start(files: &[std::path::PathBuf], scratch: &Path, stop: &Path) -> Readers {
        let start = |(i, file): (usize, &std::path::PathBuf)| {
            let ready = scratch.join(format!("ready-{i}"));
            let child = Command::new(std::env::current_exe().expect("the test binary"))
                .args([
                    "--exact",
                    "checkpoint_reader_process",
                    "--ignored",
                    "--nocapture",
                ])
                .env(READER_FILE_ENV, file)
                .env(READER_READY_ENV, &ready)
                .env(READER_STOP_ENV, stop)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a reader process");
            (child, ready)
        };
        Readers(files.iter().enumerate().map(start).collect())
    }

    /// Waits (at most two minutes) until every reader has read the file once; a reader
    /// that ended before that fails the test.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        for (child, ready) in &mut self.0 {
            while !ready.exists() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("a reader ended before its first read: {status}");
                }
                assert!(
                    Instant::now() < deadline,
                    "readers not ready in two minutes"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Waits for every reader to end; returns their reads, failing on any reader's error.
    fn finish(mut self, what: &str) -> u64 {
        let mut reads = 0;
        for (child, _) in std::mem::take(&mut self.0) {
            let out = child.wait_with_output().expect("wait for a reader");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{what}: a reader failed: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            reads += stdout
                .lines()
                .find_map(|l| l.strip_prefix("reads="))
                .and_then(|n| n.parse::<u64>().ok())
                .expect("a reader's count");
        }
        reads
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        for (child, _) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The checkpoint pattern under load, in a strict and in a relaxed directory: a writer
/// writes `step.tmp`, fsyncs it and renames it over `step` in a tight loop while reader
/// processes read `step` whole through the same mount and through a second mount, a
/// library client reads it by path, and two threads keep the CPU busy. Every read must
/// succeed with one whole generation: the kernel's lookup of `step` can resolve the old
/// inode just before the rename removes it, and its open by inode must still succeed.
#[test]
fn checkpoint_replacement_under_load_never_fails_a_reader() {
    let m = Mounted::start();
    let other = m.mount_again();
    let local = tempfile::tempdir().expect("tempdir");
    for (class, rel) in [("strict", "ckpt/run"), ("relaxed", "data/run")] {
        let dir = m.path(rel);
        fs::create_dir_all(&dir).expect("mkdir the run directory");
        fs::write(dir.join("step"), ckpt_body(0)).expect("first checkpoint");
        let scratch = local.path().join(class);
        fs::create_dir(&scratch).expect("mkdir scratch");
        let stop = scratch.join("stop");
        let files = [
            dir.join("step"),
            dir.join("step"),
            other.path(rel).join("step"),
        ];
        let mut readers = Readers::start(&files, &scratch, &stop);
        readers.wait_ready();

        let done = AtomicBool::new(false);
        let lib_reads = AtomicU64::new(0);
        let written = std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut x = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                });
            }
            let (client, rt, path) = (m.client.clone(), m.handle(), format!("/{rel}/step"));
            let (done, lib_reads) = (&done, &lib_reads);
            s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let got = rt
                        .block_on(client.read_file(&path))
                        .unwrap_or_else(|e| panic!("library read of {path}: {e}"));
                    if let Err(e) = ckpt_generation(&got) {
                        panic!("library read of {path}: {e}");
                    }
                    lib_reads.fetch_add(1, Ordering::Relaxed);
                }
            });
            let deadline = Instant::now() + Duration::from_secs(4);
            let mut gen = 0;
            while Instant::now() < deadline || gen < 5 {
                gen += 1;
                let tmp = dir.join("step.tmp");
                let mut f = fs::File::create(&tmp).expect("create tmp");
                f.write_all(&ckpt_body(gen)).expect("write tmp");
                f.sync_all().expect("fsync tmp");
                drop(f);
                fs::rename(&tmp, dir.join("step")).expect("rename over the checkpoint");
            }
            done.store(true, Ordering::Relaxed);
            gen
        });
        fs::write(&stop, b"").expect("tell the readers to stop");
        let reads = readers.finish(class);
        eprintln!(
            "{class}: {written} replacements; {reads} reads by processes, {} by the library",
            lib_reads.load(Ordering::Relaxed)
        );
        assert!(reads > 0, "{class}: the reader processes read nothing");
        let last = fs::read(dir.join("step")).expect("read the last checkpoint");
        assert_eq!(
            ckpt_generation(&last),
            Ok(written),
            "{class}: the last checkpoint"
        );
    }
    drop(other);
}
