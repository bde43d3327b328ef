//! Bulk import of a local directory tree (e.g. an ImageNet-style class-per-directory
//! tree) through the batch path: [`Client::import`].
//!
//! The tree is walked breadth first. Each directory is made with one `Create` (an existing
//! directory is reused, so an import can be re-run), the regular files of a directory are
//! created with `create_batch` in batches of [`ImportOptions::batch`] (not exclusively:
//! existing files are overwritten), and their bodies are written concurrently: a small
//! file is read whole and stored with one `WriteSmall` (many concurrent ones are merged
//! into one Raft proposal by the server), a large one is streamed through a [`File`].
//!
//! Memory stays bounded whatever the tree's size: the walk hands files to the writers
//! through a bounded queue, at most [`ImportOptions::concurrency`] small bodies and
//! [`ImportOptions::large_concurrency`] streamed files are in memory at once, and only one
//! directory's listing is held at a time. Symlinks are recreated as symlinks; other special
//! files are skipped. A file that fails is counted and reported in the summary (the first
//! [`MAX_REPORTED_FAILURES`] of them); the import goes on, like `cp -r`.
//!
//! [`File`]: crate::File

use crate::client::Client;
use crate::file::OpenOptions;
use crate::types::{CreateSpec, MkdirOptions};
use futures::stream::{self, StreamExt};
use std::collections::VecDeque;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use talon_model::{Errno, FileKind, Ino, TalonError};

/// Buffer of a streamed (large) file's local reads.
pub(crate) const COPY_BUFFER: usize = 1 << 20;

/// Failures kept, with their paths, in an [`ImportSummary`].
pub const MAX_REPORTED_FAILURES: usize = 100;

/// How an import runs.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Small-file bodies written at once.
    pub concurrency: usize,
    /// Large files streamed at once.
    pub large_concurrency: usize,
    /// Files created per `create_batch` call (and the depth of the queue to the writers).
    pub batch: usize,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            concurrency: 64,
            large_concurrency: 2,
            batch: 4096,
        }
    }
}

/// Live counters of an import, for a progress display; updated as files finish.
#[derive(Debug, Default)]
pub struct ImportProgress {
    /// Regular files written (and symlinks made).
    pub files: AtomicU64,
    /// Bytes of file contents written.
    pub bytes: AtomicU64,
    /// Directories made or reused.
    pub dirs: AtomicU64,
    /// Entries that failed.
    pub failed: AtomicU64,
}

/// What an import did.
#[derive(Clone, Debug)]
pub struct ImportSummary {
    /// Regular files written (and symlinks made).
    pub files: u64,
    /// Bytes of file contents written.
    pub bytes: u64,
    /// Directories made or reused.
    pub dirs: u64,
    /// Entries that failed.
    pub failed: u64,
    /// The first failures: local path and error.
    pub failures: Vec<(PathBuf, TalonError)>,
    /// Wall-clock time of the whole import.
    pub elapsed: Duration,
}

impl ImportSummary {
    /// Files per second.
    pub fn files_per_sec(&self) -> f64 {
        self.files as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Megabytes (10^6 bytes) per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl std::fmt::Display for ImportSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} files, {} directories, {:.1} MB in {:.1} s: {:.0} files/s, {:.1} MB/s",
            self.files,
            self.dirs,
            self.bytes as f64 / 1e6,
            self.elapsed.as_secs_f64(),
            self.files_per_sec(),
            self.mb_per_sec()
        )?;
        if self.failed > 0 {
            write!(f, "; {} failed", self.failed)?;
        }
        Ok(())
    }
}

/// Why an import could not start.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The source could not be read.
    #[error("read {}: {source}", path.display())]
    Local {
        /// The local path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The destination directory could not be made.
    #[error("make directory {path}: {source}")]
    Destination {
        /// The destination path.
        path: String,
        /// The error.
        source: TalonError,
    },
}

/// One body to write.
struct Job {
    ino: Ino,
    local: PathBuf,
    size: u64,
}

/// One entry of a local directory.
struct LocalEntry {
    name: Vec<u8>,
    path: PathBuf,
    kind: LocalKind,
    size: u64,
    perm: u32,
}

enum LocalKind {
    File,
    Dir,
    Symlink,
    Other,
}

fn list_local(dir: &Path) -> std::io::Result<Vec<LocalEntry>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let meta = e.path().symlink_metadata()?;
        let ft = meta.file_type();
        let kind = if ft.is_file() {
            LocalKind::File
        } else if ft.is_dir() {
            LocalKind::Dir
        } else if ft.is_symlink() {
            LocalKind::Symlink
        } else {
            LocalKind::Other
        };
        out.push(LocalEntry {
            name: e.file_name().as_bytes().to_vec(),
            path: e.path(),
            kind,
            size: meta.len(),
            perm: meta.permissions().mode() & 0o7777,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Shared state of one import's walk and writers.
struct Run<'a> {
    client: &'a Client,
    progress: &'a ImportProgress,
    failures: Mutex<Vec<(PathBuf, TalonError)>>,
    small_max: u64,
    large: tokio::sync::Semaphore,
}

impl Run<'_> {
    fn fail(&self, path: &Path, e: TalonError) {
        tracing::warn!(path = %path.display(), error = %e, "import failed");
        self.progress.failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut f) = self.failures.lock() {
            if f.len() < MAX_REPORTED_FAILURES {
                f.push((path.to_path_buf(), e));
            }
        }
    }

    /// Walks `src` (already made as `root`), queueing every regular file for the writers.
    async fn walk(
        &self,
        src: PathBuf,
        root: Ino,
        batch: usize,
        tx: tokio::sync::mpsc::Sender<Job>,
    ) {
        let mut queue = VecDeque::from([(src, root)]);
        while let Some((local, dir)) = queue.pop_front() {
            let listed = {
                let local = local.clone();
                tokio::task::spawn_blocking(move || list_local(&local)).await
            };
            let entries = match listed {
                Ok(Ok(e)) => e,
                Ok(Err(e)) => {
                    self.fail(&local, TalonError::posix(io_errno(&e), e.to_string()));
                    continue;
                }
                Err(e) => {
                    self.fail(&local, TalonError::Unavailable(format!("list task: {e}")));
                    continue;
                }
            };
            let mut files = Vec::new();
            for e in entries {
                match e.kind {
                    LocalKind::Dir => match self.make_dir(dir, &e.name).await {
                        Ok(ino) => queue.push_back((e.path, ino)),
                        Err(err) => self.fail(&e.path, err),
                    },
                    LocalKind::File => files.push(e),
                    LocalKind::Symlink => self.make_symlink(dir, &e).await,
                    LocalKind::Other => {
                        tracing::info!(path = %e.path.display(), "skipping a special file");
                    }
                }
            }
            for part in chunks_of(files, batch) {
                let specs = part
                    .iter()
                    .map(|e| {
                        let spec = CreateSpec {
                            exclusive: false,
                            ..CreateSpec::file(e.perm)
                        };
                        (e.name.clone(), spec)
                    })
                    .collect();
                let created = self.client.create_batch(dir, specs).await;
                for (e, r) in part.into_iter().zip(created) {
                    match r {
                        Ok(a) if a.kind == FileKind::Regular => {
                            let job = Job {
                                ino: a.ino,
                                local: e.path,
                                size: e.size,
                            };
                            if tx.send(job).await.is_err() {
                                return;
                            }
                        }
                        Ok(_) => self.fail(
                            &e.path,
                            TalonError::posix(Errno::EEXIST, "exists and is not a regular file"),
                        ),
                        Err(err) => self.fail(&e.path, err),
                    }
                }
            }
        }
    }

    async fn make_dir(&self, parent: Ino, name: &[u8]) -> Result<Ino, TalonError> {
        let attr = match self
            .client
            .create(parent, name, CreateSpec::dir(0o755, None))
            .await
        {
            Err(e) if e.errno() == Errno::EEXIST => self.client.lookup(parent, name).await?,
            r => r?,
        };
        if attr.kind != FileKind::Directory {
            return Err(TalonError::posix(
                Errno::ENOTDIR,
                "exists and is not a directory",
            ));
        }
        self.progress.dirs.fetch_add(1, Ordering::Relaxed);
        Ok(attr.ino)
    }

    async fn make_symlink(&self, parent: Ino, e: &LocalEntry) {
        let target = match std::fs::read_link(&e.path) {
            Ok(t) => t.as_os_str().as_bytes().to_vec(),
            Err(err) => {
                return self.fail(&e.path, TalonError::posix(io_errno(&err), err.to_string()))
            }
        };
        match self
            .client
            .create(parent, &e.name, CreateSpec::symlink(target))
            .await
        {
            Ok(_) => {
                self.progress.files.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) if err.errno() == Errno::EEXIST => {}
            Err(err) => self.fail(&e.path, err),
        }
    }

    /// Writes one body.
    async fn write(&self, job: Job) {
        let r = if job.size <= self.small_max {
            match tokio::fs::read(&job.local).await {
                Ok(data) => self
                    .client
                    .write_file_ino(job.ino, &data)
                    .await
                    .map(|_| data.len() as u64),
                Err(e) => Err(TalonError::posix(io_errno(&e), e.to_string())),
            }
        } else {
            let _permit = self.large.acquire().await;
            self.stream(&job).await
        };
        match r {
            Ok(n) => {
                self.progress.files.fetch_add(1, Ordering::Relaxed);
                self.progress.bytes.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => self.fail(&job.local, e),
        }
    }

    async fn stream(&self, job: &Job) -> Result<u64, TalonError> {
        let local_err = |e: std::io::Error| TalonError::posix(io_errno(&e), e.to_string());
        let src = tokio::fs::File::open(&job.local).await.map_err(local_err)?;
        // Large pieces: each local read is a trip to the blocking pool.
        let mut src = tokio::io::BufReader::with_capacity(COPY_BUFFER, src);
        let opts = OpenOptions {
            read: false,
            truncate: true,
            ..OpenOptions::read_write()
        };
        let mut dst = self.client.open_ino(job.ino, opts).await?;
        let n = tokio::io::copy(&mut src, &mut dst)
            .await
            .map_err(local_err)?;
        dst.close().await?;
        Ok(n)
    }
}

fn chunks_of<T>(mut v: Vec<T>, n: usize) -> Vec<Vec<T>> {
    let n = n.max(1);
    let mut out = Vec::new();
    while v.len() > n {
        let rest = v.split_off(n);
        out.push(std::mem::replace(&mut v, rest));
    }
    if !v.is_empty() {
        out.push(v);
    }
    out
}

/// The errno of a local I/O error (EIO when it has none).
fn io_errno(e: &std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(Errno::EIO.0))
}

impl Client {
    /// Copies the local tree at `src` into directory `dst` (made with its parents if
    /// missing): `src`'s contents land directly in `dst`. A regular file `src` is copied to
    /// `dst` itself. `progress` is updated as files finish. See the module docs.
    pub async fn import(
        &self,
        src: &Path,
        dst: &str,
        opts: &ImportOptions,
        progress: &ImportProgress,
    ) -> Result<ImportSummary, ImportError> {
        let start = Instant::now();
        let meta = tokio::fs::metadata(src)
            .await
            .map_err(|source| ImportError::Local {
                path: src.to_path_buf(),
                source,
            })?;
        let run = Run {
            client: self,
            progress,
            failures: Mutex::new(Vec::new()),
            small_max: self.data_limits().0,
            large: tokio::sync::Semaphore::new(opts.large_concurrency.max(1)),
        };
        let dest = |source| ImportError::Destination {
            path: dst.to_string(),
            source,
        };
        if meta.is_file() {
            let attr = self
                .create_file(dst, meta.permissions().mode() & 0o7777)
                .await;
            let attr = attr.map_err(dest)?;
            run.write(Job {
                ino: attr.ino,
                local: src.to_path_buf(),
                size: meta.len(),
            })
            .await;
        } else {
            let mk = MkdirOptions {
                parents: true,
                ..MkdirOptions::default()
            };
            let root = self.mkdir(dst, mk).await.map_err(dest)?;
            progress.dirs.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = tokio::sync::mpsc::channel::<Job>(opts.batch.max(1));
            let jobs = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|j| (j, rx)) });
            let writers = jobs
                .map(|job| run.write(job))
                .buffer_unordered(opts.concurrency.max(1))
                .for_each(|()| async {});
            tokio::join!(
                run.walk(src.to_path_buf(), root.ino, opts.batch, tx),
                writers
            );
        }
        let failures = run.failures.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(ImportSummary {
            files: progress.files.load(Ordering::Relaxed),
            bytes: progress.bytes.load(Ordering::Relaxed),
            dirs: progress.dirs.load(Ordering::Relaxed),
            failed: progress.failed.load(Ordering::Relaxed),
            failures,
            elapsed: start.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_order_and_bound() {
        let parts = chunks_of((0..10).collect(), 4);
        assert_eq!(parts, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        assert!(chunks_of(Vec::<u8>::new(), 4).is_empty());
    }
}
