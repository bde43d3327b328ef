//! Where a workload runs: a path of any mounted file system, or a Talon cluster through the
//! embedded client library.
//!
//! Every workload drives a [`Fs`], a small set of blocking, path-based calls, from plain OS
//! threads, so the same task code measures Talon's FUSE mount, a kernel file system, another
//! FUSE file system and the library side by side:
//!
//! - [`PosixFs`] makes the system calls mdtest's POSIX backend makes, directly through
//!   `rustix` (no buffering, no allocation per call beyond the path): for a create
//!   `open(O_CREAT|O_RDWR)`, `write` and `close`; `stat`; for a read `open(O_RDONLY)`,
//!   `read` and `close`; `unlink`, `mkdir`, `rmdir`, `rename`.
//! - [`TalonFs`] maps each call onto the public `talon-client` API (`open` with create +
//!   `write_at` + `close`, `stat`, `read_file`, ...), each blocking its calling thread on a
//!   shared tokio runtime that owns the client's connections.
//!
//! Errors are `std::io::Error`s; a Talon error keeps its errno's kind and its message.

use anyhow::Context;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use talon_client::{
    Client, ClientOptions, CreateSpec, ImportOptions, ImportProgress, Ino, MkdirOptions,
    OpenOptions, TalonError,
};

/// A workload target as the command line names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// `posix:PATH`: a directory of any mounted file system.
    Posix(PathBuf),
    /// `talon:HOST:PORT[,HOST:PORT...]`: a cluster through the client library.
    Talon(Vec<String>),
}

impl FromStr for TargetSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("posix:") {
            if path.is_empty() {
                return Err("posix: needs a path, e.g. posix:/mnt/talon".into());
            }
            Ok(TargetSpec::Posix(PathBuf::from(path)))
        } else if let Some(addrs) = s.strip_prefix("talon:") {
            let seeds: Vec<String> = addrs
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect();
            if seeds.is_empty() {
                return Err("talon: needs addresses, e.g. talon:127.0.0.1:7001".into());
            }
            Ok(TargetSpec::Talon(seeds))
        } else {
            Err(format!(
                "unknown target {s:?}: expected posix:PATH or talon:HOST:PORT[,HOST:PORT...]"
            ))
        }
    }
}

impl std::fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetSpec::Posix(p) => write!(f, "posix:{}", p.display()),
            TargetSpec::Talon(seeds) => write!(f, "talon:{}", seeds.join(",")),
        }
    }
}

/// The blocking, path-based calls every workload is made of. Paths are absolute in the
/// target's own namespace (a local path for POSIX, a Talon path for the library).
pub trait Fs: Send + Sync {
    /// Makes one directory.
    fn mkdir(&self, path: &str) -> io::Result<()>;
    /// Makes a directory and any missing parents; an existing directory is fine.
    fn mkdir_all(&self, path: &str) -> io::Result<()>;
    /// Removes an empty directory.
    fn rmdir(&self, path: &str) -> io::Result<()>;
    /// Creates (or opens) a regular file read-write, writes `data` at offset 0 if it is not
    /// empty, and closes it.
    fn create(&self, path: &str, data: &[u8]) -> io::Result<()>;
    /// The size of the file or directory at `path`.
    fn stat(&self, path: &str) -> io::Result<u64>;
    /// Opens a file read-only, reads up to `len` bytes from offset 0 into the front of `buf`
    /// (nothing when `len` is 0: an open and a close), closes it; returns the bytes read.
    fn open_read(&self, path: &str, len: usize, buf: &mut Vec<u8>) -> io::Result<usize>;
    /// Reads a whole file into the front of `buf`; returns its length. `buf` is scratch
    /// space a worker reuses: its length may exceed the file's.
    fn read_whole(&self, path: &str, buf: &mut Vec<u8>) -> io::Result<usize>;
    /// Writes a new file of `len` bytes at `path` (replacing what was there) in pieces of
    /// at most [`WRITE_PIECE`] bytes, each filled by `fill(offset, piece)`, and closes it.
    fn write_file(&self, path: &str, len: u64, fill: &dyn Fn(u64, &mut [u8])) -> io::Result<()>;
    /// Opens a file to read at any offset until the reader is dropped.
    fn open_reader(&self, path: &str) -> io::Result<Box<dyn ReadAt>>;
    /// Removes a file.
    fn unlink(&self, path: &str) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to` as `rename(2)` does.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Creates empty regular files `names` in directory `dir`, in as few calls as the
    /// target can; one result per name, in order. `None` if the target has no batch calls.
    fn create_batch(&self, _dir: &str, _names: &[String]) -> Option<Vec<io::Result<()>>> {
        None
    }
    /// The sizes of `names` in directory `dir`, as [`Fs::create_batch`] asks.
    fn stat_batch(&self, _dir: &str, _names: &[String]) -> Option<Vec<io::Result<u64>>> {
        None
    }
    /// Whether anything exists at `path`.
    fn exists(&self, path: &str) -> bool {
        self.stat(path).is_ok()
    }
    /// Forgets what this side caches about file contents and names, so the next reads go
    /// to the storage or servers: the page cache for POSIX (needs root), a fresh client
    /// (empty path cache) for the library.
    fn drop_caches(&self) -> io::Result<()>;
    /// Server round trips made so far, where the target can count them: the client
    /// library's RPC counter (`Client::rpc_count`). `None` for a mounted path, whose round
    /// trips happen inside another process.
    fn round_trips(&self) -> Option<u64> {
        None
    }
    /// Copies the local tree at `src` into `dst` with the target's own bulk loader, if it
    /// has one (`None` otherwise): Talon's `import`, the path `talon import` takes.
    fn bulk_import(&self, _src: &Path, _dst: &str) -> Option<io::Result<Imported>> {
        None
    }
}

/// An open file read at offsets ([`Fs::open_reader`]).
pub trait ReadAt: Send {
    /// Reads up to `buf.len()` bytes at `offset` into `buf`; returns how many (fewer only at
    /// the end of the file).
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
}

/// Most bytes [`Fs::write_file`] writes in one call.
pub const WRITE_PIECE: usize = 1 << 20;

/// The pieces of a file of `len` bytes [`Fs::write_file`] writes: (offset, length).
fn pieces(len: u64) -> impl Iterator<Item = (u64, usize)> {
    (0..len)
        .step_by(WRITE_PIECE)
        .map(move |at| (at, (len - at).min(WRITE_PIECE as u64) as usize))
}

/// What a bulk import did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Imported {
    /// Files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Entries that failed.
    pub failed: u64,
    /// Seconds the import took.
    pub seconds: f64,
}

/// How a report names the target: `posix:…`, `talon:…`, or `local` when none was given.
pub fn describe(spec: Option<&TargetSpec>) -> String {
    spec.map_or_else(|| "local".to_string(), |t| t.to_string())
}

/// The `--target` flag of a reproducing command line, or nothing when none was given.
pub fn target_flag(spec: Option<&TargetSpec>) -> String {
    spec.map_or_else(String::new, |t| {
        format!(" --target {}", crate::mdtest::shell_word(&t.to_string()))
    })
}

/// Opens the target `spec` names.
pub fn open(spec: &TargetSpec) -> anyhow::Result<Arc<dyn Fs>> {
    Ok(match spec {
        TargetSpec::Posix(_) => Arc::new(PosixFs),
        TargetSpec::Talon(seeds) => Arc::new(TalonFs::connect(seeds)?),
    })
}

/// The directory a workload works in: `dir` inside the target's root. Without an explicit
/// target, `dir` is a local path as given (mdtest's `-d`); with `posix:ROOT` it is taken
/// inside ROOT; with `talon:` it is a path from Talon's root.
pub fn work_dir(spec: Option<&TargetSpec>, dir: &str) -> String {
    let inner = dir.trim_start_matches("./").trim_start_matches('/');
    let inner = if inner == "." { "" } else { inner };
    match spec {
        None => dir.trim_end_matches('/').to_string(),
        Some(TargetSpec::Posix(root)) => {
            let root = root.display().to_string();
            let root = root.trim_end_matches('/');
            match (root.is_empty(), inner.is_empty()) {
                (_, true) if root.is_empty() => "/".into(),
                (_, true) => root.to_string(),
                (true, false) => format!("/{}", inner.trim_end_matches('/')),
                (false, false) => format!("{root}/{}", inner.trim_end_matches('/')),
            }
        }
        Some(TargetSpec::Talon(_)) => format!("/{}", inner.trim_end_matches('/')),
    }
}

/// Any mounted file system, through direct system calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct PosixFs;

impl PosixFs {
    /// Reads up to `limit` bytes from offset 0 into the front of `buf`, growing it in
    /// 1 MiB steps but never shrinking or re-zeroing it, so a worker's buffer is allocated
    /// once per run, not once per file; returns the bytes read.
    fn read_to(fd: &OwnedFd, buf: &mut Vec<u8>, limit: usize) -> io::Result<usize> {
        let mut got = 0;
        while got < limit {
            let want = limit.min(got + (1 << 20));
            if buf.len() < want {
                buf.resize(want, 0);
            }
            let n = rustix::io::pread(fd, &mut buf[got..want], got as u64)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got)
    }
}

/// A file of a mounted file system read with `pread`.
struct PosixReader(OwnedFd);

impl ReadAt for PosixReader {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            let n = rustix::io::pread(&self.0, &mut buf[got..], offset + got as u64)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got)
    }
}

impl Fs for PosixFs {
    fn mkdir(&self, path: &str) -> io::Result<()> {
        Ok(rustix::fs::mkdir(
            path,
            rustix::fs::Mode::from_raw_mode(0o755),
        )?)
    }

    fn mkdir_all(&self, path: &str) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        Ok(rustix::fs::rmdir(path)?)
    }

    fn create(&self, path: &str, data: &[u8]) -> io::Result<()> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            path,
            OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )?;
        let mut done = 0;
        while done < data.len() {
            let n = rustix::io::write(&fd, &data[done..])?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"));
            }
            done += n;
        }
        drop(fd);
        Ok(())
    }

    fn stat(&self, path: &str) -> io::Result<u64> {
        Ok(rustix::fs::stat(path)?.st_size as u64)
    }

    fn open_read(&self, path: &str, len: usize, buf: &mut Vec<u8>) -> io::Result<usize> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        if len == 0 {
            return Ok(0);
        }
        Self::read_to(&fd, buf, len)
    }

    fn read_whole(&self, path: &str, buf: &mut Vec<u8>) -> io::Result<usize> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        Self::read_to(&fd, buf, usize::MAX)
    }

    fn write_file(&self, path: &str, len: u64, fill: &dyn Fn(u64, &mut [u8])) -> io::Result<()> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            path,
            OFlags::CREATE | OFlags::TRUNC | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )?;
        let mut buf = vec![0u8; WRITE_PIECE];
        for (at, n) in pieces(len) {
            fill(at, &mut buf[..n]);
            let mut done = 0;
            while done < n {
                let w = rustix::io::pwrite(&fd, &buf[done..n], at + done as u64)?;
                if w == 0 {
                    return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"));
                }
                done += w;
            }
        }
        Ok(())
    }

    fn open_reader(&self, path: &str) -> io::Result<Box<dyn ReadAt>> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Box::new(PosixReader(fd)))
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        Ok(rustix::fs::unlink(path)?)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        Ok(rustix::fs::rename(from, to)?)
    }

    fn drop_caches(&self) -> io::Result<()> {
        rustix::fs::sync();
        std::fs::write("/proc/sys/vm/drop_caches", b"3\n")
    }
}

/// A Talon cluster through the embedded client library (public API only).
pub struct TalonFs {
    rt: tokio::runtime::Runtime,
    seeds: Vec<String>,
    client: RwLock<Client>,
}

/// A Talon error as an `io::Error` of its errno's kind, keeping the message.
fn io_err(e: TalonError) -> io::Error {
    let kind = io::Error::from_raw_os_error(e.errno().0).kind();
    io::Error::new(kind, e.to_string())
}

impl TalonFs {
    /// Connects to the cluster through `seeds` on a runtime of its own.
    pub fn connect(seeds: &[String]) -> anyhow::Result<TalonFs> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("talon-bench-rt")
            .build()
            .context("start a tokio runtime")?;
        let client = rt
            .block_on(Client::connect(seeds, ClientOptions::default()))
            .with_context(|| format!("connect to {}", seeds.join(",")))?;
        Ok(TalonFs {
            rt,
            seeds: seeds.to_vec(),
            client: RwLock::new(client),
        })
    }

    fn client(&self) -> Client {
        match self.client.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// `call` on directory `dir`'s inode, for a batch of `n` (each fails as the
    /// directory's resolution does, if it does).
    fn batch_in<T, F, Fut>(&self, dir: &str, n: usize, call: F) -> Vec<io::Result<T>>
    where
        F: FnOnce(Client, Ino) -> Fut,
        Fut: std::future::Future<Output = Vec<Result<T, TalonError>>>,
    {
        let c = self.client();
        let results = self.rt.block_on(async move {
            match c.stat(dir).await {
                Ok(parent) => call(c, parent.ino).await,
                Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
            }
        });
        results.into_iter().map(|r| r.map_err(io_err)).collect()
    }

    fn block<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, TalonError>>,
    ) -> io::Result<T> {
        self.rt.block_on(f).map_err(io_err)
    }
}

impl Fs for TalonFs {
    fn mkdir(&self, path: &str) -> io::Result<()> {
        let c = self.client();
        self.block(async move { c.mkdir(path, MkdirOptions::default()).await.map(|_| ()) })
    }

    fn mkdir_all(&self, path: &str) -> io::Result<()> {
        let c = self.client();
        let opts = MkdirOptions {
            parents: true,
            ..MkdirOptions::default()
        };
        self.block(async move { c.mkdir(path, opts).await.map(|_| ()) })
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        let c = self.client();
        self.block(async move { c.rmdir(path).await })
    }

    fn create(&self, path: &str, data: &[u8]) -> io::Result<()> {
        let c = self.client();
        let opts = OpenOptions {
            read: true,
            write: true,
            create: true,
            ..OpenOptions::default()
        };
        self.block(async move {
            let mut f = c.open(path, opts).await?;
            if !data.is_empty() {
                f.write_at(0, data).await?;
            }
            f.close().await
        })
    }

    fn stat(&self, path: &str) -> io::Result<u64> {
        let c = self.client();
        self.block(async move { c.stat(path).await.map(|a| a.size) })
    }

    fn create_batch(&self, dir: &str, names: &[String]) -> Option<Vec<io::Result<()>>> {
        let specs = names
            .iter()
            .map(|n| (n.as_bytes().to_vec(), CreateSpec::file(0o644)))
            .collect();
        let results = self.batch_in(dir, names.len(), |c, parent| async move {
            c.create_batch(parent, specs).await
        });
        Some(results.into_iter().map(|r| r.map(drop)).collect())
    }

    fn stat_batch(&self, dir: &str, names: &[String]) -> Option<Vec<io::Result<u64>>> {
        let names: Vec<Vec<u8>> = names.iter().map(|n| n.as_bytes().to_vec()).collect();
        let results = self.batch_in(dir, names.len(), |c, parent| async move {
            c.lookup_batch(parent, names).await
        });
        Some(results.into_iter().map(|r| r.map(|a| a.size)).collect())
    }

    fn open_read(&self, path: &str, len: usize, buf: &mut Vec<u8>) -> io::Result<usize> {
        let c = self.client();
        let data = self.block(async move {
            let mut f = c.open(path, OpenOptions::read_only()).await?;
            let data = if len > 0 {
                f.read_at(0, len as u64).await?
            } else {
                Vec::new()
            };
            f.close().await?;
            Ok(data)
        })?;
        *buf = data;
        Ok(buf.len())
    }

    fn read_whole(&self, path: &str, buf: &mut Vec<u8>) -> io::Result<usize> {
        let c = self.client();
        *buf = self.block(async move { c.read_file(path).await })?;
        Ok(buf.len())
    }

    fn write_file(&self, path: &str, len: u64, fill: &dyn Fn(u64, &mut [u8])) -> io::Result<()> {
        let c = self.client();
        let opts = OpenOptions {
            write: true,
            create: true,
            truncate: true,
            ..OpenOptions::default()
        };
        let mut f = self.block(async move { c.open(path, opts).await })?;
        let mut buf = vec![0u8; WRITE_PIECE];
        for (at, n) in pieces(len) {
            fill(at, &mut buf[..n]);
            self.block(f.write_at(at, &buf[..n]))?;
        }
        self.block(f.close())
    }

    fn open_reader(&self, path: &str) -> io::Result<Box<dyn ReadAt>> {
        let c = self.client();
        let file = self.block(async move { c.open(path, OpenOptions::read_only()).await })?;
        Ok(Box::new(TalonReader {
            rt: self.rt.handle().clone(),
            file: Some(file),
        }))
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let c = self.client();
        self.block(async move { c.unlink(path).await })
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let c = self.client();
        self.block(async move { c.rename(from, to).await })
    }

    fn drop_caches(&self) -> io::Result<()> {
        let fresh = self
            .rt
            .block_on(Client::connect(&self.seeds, ClientOptions::default()))
            .map_err(|e| io::Error::other(format!("reconnect: {e}")))?;
        match self.client.write() {
            Ok(mut c) => *c = fresh,
            Err(poisoned) => *poisoned.into_inner() = fresh,
        }
        Ok(())
    }

    fn round_trips(&self) -> Option<u64> {
        Some(self.client().rpc_count())
    }

    fn bulk_import(&self, src: &Path, dst: &str) -> Option<io::Result<Imported>> {
        let c = self.client();
        let progress = ImportProgress::default();
        let r = self
            .rt
            .block_on(c.import(src, dst, &ImportOptions::default(), &progress));
        Some(match r {
            Ok(s) => Ok(Imported {
                files: s.files,
                bytes: s.bytes,
                failed: s.failed,
                seconds: s.elapsed.as_secs_f64(),
            }),
            Err(e) => Err(io::Error::other(e.to_string())),
        })
    }
}

/// A Talon file read at offsets through the library, closed when dropped.
struct TalonReader {
    rt: tokio::runtime::Handle,
    file: Option<talon_client::File>,
}

impl ReadAt for TalonReader {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("the file was closed"))?;
        let data = self
            .rt
            .block_on(file.read_at(offset, buf.len() as u64))
            .map_err(io_err)?;
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        Ok(n)
    }
}

impl Drop for TalonReader {
    fn drop(&mut self) {
        if let Some(f) = self.file.take() {
            // A read-only file has nothing to commit; its close ends its open session.
            let _ = self.rt.block_on(f.close());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_written_in_whole_pieces_and_a_short_tail() {
        let p: Vec<(u64, usize)> = pieces(2 * WRITE_PIECE as u64 + 10).collect();
        let w = WRITE_PIECE as u64;
        assert_eq!(p, vec![(0, WRITE_PIECE), (w, WRITE_PIECE), (2 * w, 10)]);
        assert_eq!(pieces(0).count(), 0);
    }

    #[test]
    fn target_specs_parse_and_print_back() {
        let p: TargetSpec = "posix:/mnt/x".parse().expect("posix");
        assert_eq!(p, TargetSpec::Posix("/mnt/x".into()));
        assert_eq!(p.to_string(), "posix:/mnt/x");
        let t: TargetSpec = "talon:127.0.0.1:7001, 127.0.0.1:7002"
            .parse()
            .expect("talon");
        assert_eq!(
            t,
            TargetSpec::Talon(vec!["127.0.0.1:7001".into(), "127.0.0.1:7002".into()])
        );
        assert!("nfs:/x".parse::<TargetSpec>().is_err());
        assert!("talon:".parse::<TargetSpec>().is_err());
        assert!("posix:".parse::<TargetSpec>().is_err());
    }

    #[test]
    fn work_dir_places_the_directory_inside_the_target() {
        assert_eq!(work_dir(None, "/dev/shm/x/"), "/dev/shm/x");
        assert_eq!(work_dir(None, "./out"), "./out");
        let posix = TargetSpec::Posix("/mnt/t/".into());
        assert_eq!(work_dir(Some(&posix), "/run1"), "/mnt/t/run1");
        assert_eq!(work_dir(Some(&posix), "./run1"), "/mnt/t/run1");
        assert_eq!(work_dir(Some(&posix), "."), "/mnt/t");
        let talon = TargetSpec::Talon(vec!["a:1".into()]);
        assert_eq!(work_dir(Some(&talon), "./out"), "/out");
        assert_eq!(work_dir(Some(&talon), "/bench/a/"), "/bench/a");
    }
}
