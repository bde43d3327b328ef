//! Criterion benches of the per-operation hot paths a client pays on every call, through
//! the public APIs of `talon-model` and `talon-client` only:
//!
//! - placement: which partition holds an entry (relaxed and strict) or a chunk;
//! - name validation and path splitting, done on every path operation;
//! - the path cache: a directory-path hit, a dentry hit and miss, an insert;
//! - planning a batch: spreading a bulk load's names over the partitions.
//!
//! The server's hot paths (key encoding, a batch proposal's encode and apply, the packed
//! store's append and read) are in `server_paths.rs`.
//!
//! `cargo bench -p talon-bench --bench hot_paths`

use criterion::{criterion_main, BatchSize, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use talon_client::path_cache::PathCache;
use talon_model::{entry_partition, validate_name, Attr, Class, FileKind, Ino, Time};

fn attr(ino: u64) -> Attr {
    let t = Time::now();
    Attr {
        ino: Ino(ino),
        kind: FileKind::Regular,
        perm: 0o644,
        uid: 0,
        gid: 0,
        size: 110_000,
        nlink: 1,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        generation: 1,
        class: Class::Relaxed,
        rdev: 0,
        parent: Ino(0),
    }
}

fn placement(c: &mut Criterion) {
    let mut g = c.benchmark_group("placement");
    let parent = Ino::new(3, 12_345);
    let name = b"img_00012345.JPEG";
    g.bench_function("entry_relaxed", |b| {
        b.iter(|| entry_partition(black_box(parent), black_box(name), Class::Relaxed, 16))
    });
    g.bench_function("entry_strict", |b| {
        b.iter(|| entry_partition(black_box(parent), black_box(name), Class::Strict, 16))
    });
    g.bench_function("chunk", |b| {
        b.iter(|| talon_model::placement::chunk_partition(black_box(parent), black_box(7), 16))
    });
    g.bench_function("ino_home", |b| b.iter(|| black_box(parent).home()));
    g.finish();
}

fn names(c: &mut Criterion) {
    let mut g = c.benchmark_group("names");
    g.bench_function("validate_name", |b| {
        b.iter(|| validate_name(black_box(b"img_00012345.JPEG")))
    });
    let path: &[u8] = b"/imagenet/train/n01440764/img_00012345.JPEG";
    g.bench_function("path_components", |b| {
        b.iter(|| talon_client::path::components(black_box(path)))
    });
    g.finish();
}

fn path_cache(c: &mut Criterion) {
    let mut g = c.benchmark_group("path_cache");
    let cache = PathCache::new(1, Duration::from_secs(3600), 1 << 20);
    let dir = Ino::new(2, 77);
    // A warm cache of 100 class directories with 1,000 images each.
    for class in 0..100u64 {
        let path = format!("/imagenet/train/n{class:08}");
        cache.insert_dir(path.as_bytes(), Ino::new(2, class), Class::Relaxed, 1, true);
    }
    for i in 0..100_000u64 {
        let name = format!("img_{i:08}.JPEG");
        cache.insert_dentry(dir, Class::Relaxed, name.as_bytes(), &attr(1000 + i), 1);
    }
    g.bench_function("dir_hit", |b| {
        b.iter(|| cache.dir(black_box(b"/imagenet/train/n00000042")))
    });
    g.bench_function("dentry_hit", |b| {
        b.iter(|| cache.dentry(black_box(dir), black_box(b"img_00012345.JPEG")))
    });
    g.bench_function("dentry_miss", |b| {
        b.iter(|| cache.dentry(black_box(dir), black_box(b"img_99999999.JPEG")))
    });
    let a = attr(5);
    let mut n = 0u64;
    g.bench_function("insert_dentry", |b| {
        b.iter_batched(
            || {
                n += 1;
                format!("new_{n:010}")
            },
            |name| cache.insert_dentry(dir, Class::Relaxed, name.as_bytes(), &a, 1),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch");
    let names: Vec<Vec<u8>> = (0..1000)
        .map(|i| format!("img_{i:08}.JPEG").into_bytes())
        .collect();
    g.throughput(Throughput::Elements(names.len() as u64));
    g.bench_function("spread_1000_names_16_partitions", |b| {
        b.iter(|| {
            talon_client::batch::spread(Ino::new(1, 9), Class::Relaxed, 16, black_box(&names))
        })
    });
    g.finish();
}

mod group {
    //! The bench group; `criterion_group!` makes an undocumented public function.
    #![allow(missing_docs)]
    use super::{batch, names, path_cache, placement};
    criterion::criterion_group!(benches, placement, names, path_cache, batch);
}

criterion_main!(group::benches);
