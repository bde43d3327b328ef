//! Training-data patterns through a real FUSE mount: an ImageNet-style tree copied in with
//! the usual tools and read back identically, and the checkpoint pattern (write `x.tmp`,
//! rename it over `x` in a strict directory) seen by concurrent readers as whole files only.

mod fuse_support;

use fuse_support::Mounted;
use rand::RngCore;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
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

#[test]
fn checkpoint_readers_see_whole_old_or_whole_new_files() {
    let m = Mounted::start();
    // Under the cluster's strict prefix: a strict directory.
    let dir = m.path("ckpt");
    fs::create_dir(&dir).expect("mkdir ckpt");
    let size = 300 * 1024;
    let body = |gen: u64| {
        let mut b = gen.to_le_bytes().to_vec();
        b.resize(size, (gen % 251) as u8);
        b
    };
    fs::write(dir.join("step"), body(0)).expect("first checkpoint");

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let written = std::thread::scope(|s| {
        for _ in 0..3 {
            let (dir, stop, reads) = (&dir, stop.clone(), reads.clone());
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let got = fs::read(dir.join("step")).expect("read the checkpoint");
                    assert_eq!(got.len(), size, "a whole file");
                    let mut gen = [0u8; 8];
                    gen.copy_from_slice(&got[..8]);
                    let gen = u64::from_le_bytes(gen);
                    assert!(
                        got[8..].iter().all(|&b| b == (gen % 251) as u8),
                        "checkpoint {gen} mixes contents"
                    );
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(4);
        let mut gen = 0;
        while Instant::now() < deadline || gen < 5 {
            gen += 1;
            let tmp = dir.join("step.tmp");
            let mut f = fs::File::create(&tmp).expect("create tmp");
            f.write_all(&body(gen)).expect("write tmp");
            f.sync_all().expect("fsync tmp");
            drop(f);
            fs::rename(&tmp, dir.join("step")).expect("rename over the checkpoint");
        }
        stop.store(true, Ordering::Relaxed);
        gen
    });
    assert!(reads.load(Ordering::Relaxed) > 0);
    let last = fs::read(dir.join("step")).expect("read");
    assert_eq!(&last[..8], &written.to_le_bytes());
}
