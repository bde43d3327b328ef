//! Training-data patterns through a real FUSE mount: an ImageNet-style tree copied in with
//! the usual tools and read back identically, and the checkpoint pattern (write `x.tmp`,
//! rename it over `x`) seen by concurrent readers, in other processes, on another mount and
//! through the library, as whole files only and never as an error.

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
const READER_STOP_ENV: &str = "TALON_TEST_READ_UNTIL";

/// Generation `gen` of the checkpoint: its number, then one byte value throughout.
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
/// itself with this test selected). Reads the named checkpoint whole in a loop until the
/// stop file appears (at most two minutes), and fails on any error or torn file.
#[test]
#[ignore = "a reader process of the checkpoint stress test"]
fn checkpoint_reader_process() {
    let (Some(file), Some(stop)) = (
        std::env::var_os(READER_FILE_ENV),
        std::env::var_os(READER_STOP_ENV),
    ) else {
        panic!("run by the checkpoint stress test, with {READER_FILE_ENV} and {READER_STOP_ENV}");
    };
    let (file, stop) = (Path::new(&file), Path::new(&stop));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut reads = 0u64;
    while !stop.exists() && Instant::now() < deadline {
        let got = fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        if let Err(e) = ckpt_generation(&got) {
            panic!("{}: {e}", file.display());
        }
        reads += 1;
    }
    println!("reads={reads}");
}

/// Starts a reader process of `file` (see `checkpoint_reader_process`).
fn spawn_reader(file: &Path, stop: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "checkpoint_reader_process",
            "--ignored",
            "--nocapture",
        ])
        .env(READER_FILE_ENV, file)
        .env(READER_STOP_ENV, stop)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a reader process")
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
        let stop = local.path().join(format!("stop-{class}"));
        let readers: Vec<_> = [
            dir.join("step"),
            dir.join("step"),
            other.path(rel).join("step"),
        ]
        .iter()
        .map(|f| spawn_reader(f, &stop))
        .collect();

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
        let mut reads = 0u64;
        for r in readers {
            let out = r.wait_with_output().expect("wait for a reader");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{class}: a reader failed: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            reads += stdout
                .lines()
                .find_map(|l| l.strip_prefix("reads="))
                .and_then(|n| n.parse::<u64>().ok())
                .expect("a reader's count");
        }
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
