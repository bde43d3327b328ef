//! The FUSE mount: a Talon namespace as a local directory tree (`talon mount`, `talon up`).
//!
//! - [`fs`]: the kernel's requests, each answered from a task on the client's runtime.
//! - [`handles`]: open files and directory listings (readdir offsets over Talon cursors).
//! - [`convert`]: attributes, times, TTLs, and the one mapping of errors to errnos.
//! - [`data`]: the bridge to the client's file data API.
//!
//! This module owns the mount's lifetime: it checks the mount point first (so a missing,
//! non-directory or already mounted path is a clear error, not a kernel errno), mounts with
//! `default_permissions` (the kernel checks mode bits) and, by default when root mounts,
//! `allow_other` (a mount made by root for a training job that runs as another user must
//! be usable by it; the mode bits still decide what each user may do), and unmounts on
//! shutdown, on drop of the [`Mount`] (also when a panic unwinds), or notices an external
//! `fusermount3 -u`.

pub mod convert;
pub mod data;
pub mod fs;
pub mod handles;

pub use fs::{negotiate, TalonFs, CLASS_XATTR};

use crate::client::Client;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Where to mount; must be an existing directory that is not a mount point already.
    pub mountpoint: PathBuf,
    /// How long the kernel caches entries and attributes of relaxed paths. `None` takes
    /// the cluster's relaxed staleness bound. Strict paths are never cached.
    pub relaxed_ttl: Option<Duration>,
    /// Let users other than the one mounting use the mount (`allow_other`), their access
    /// checked from the mode bits. The default when running as root; other users need
    /// `user_allow_other` in /etc/fuse.conf to set it.
    pub allow_other: bool,
    /// Threads reading requests from the kernel. Requests are answered from runtime tasks,
    /// so one is enough to keep many in flight; more help only at very high request rates.
    pub threads: usize,
}

impl MountOptions {
    /// Options for mounting at `mountpoint`, with the defaults for the rest.
    pub fn new(mountpoint: impl Into<PathBuf>) -> MountOptions {
        MountOptions {
            mountpoint: mountpoint.into(),
            relaxed_ttl: None,
            allow_other: running_as_root(),
            threads: 2,
        }
    }
}

/// Whether this process runs as root (and so may let other users use its mounts).
pub fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Why a mount could not be made or ended.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The mount point does not exist.
    #[error("mount point {0} does not exist")]
    Missing(PathBuf),
    /// The mount point is not a directory.
    #[error("mount point {0} is not a directory")]
    NotADirectory(PathBuf),
    /// Something is mounted there already, or a dead FUSE mount is left there.
    #[error("mount point {0} is busy: {1} (try `talon umount {0}`)")]
    Busy(PathBuf, String),
    /// The mount point cannot be examined.
    #[error("mount point {0}: {1}")]
    Inaccessible(PathBuf, std::io::Error),
    /// The kernel or `fusermount3` refused.
    #[error("mount {0}: {1}")]
    Fuse(PathBuf, std::io::Error),
    /// Unmounting failed.
    #[error("unmount {0}: {1}")]
    Unmount(PathBuf, String),
}

/// Checks that `path` can be mounted on; returns its absolute form.
pub fn check_mountpoint(path: &Path) -> Result<PathBuf, MountError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MountError::Missing(path.to_path_buf()))
        }
        // ENOTCONN: a FUSE mount whose process died is still attached there.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(MountError::Busy(
                path.to_path_buf(),
                "a disconnected FUSE mount is still attached".into(),
            ))
        }
        Err(e) => return Err(MountError::Inaccessible(path.to_path_buf(), e)),
    };
    if !meta.is_dir() {
        return Err(MountError::NotADirectory(path.to_path_buf()));
    }
    let abs =
        std::fs::canonicalize(path).map_err(|e| MountError::Inaccessible(path.to_path_buf(), e))?;
    if let Some(fstype) = mounted_at(&abs) {
        return Err(MountError::Busy(
            abs,
            format!("a {fstype} file system is mounted there"),
        ));
    }
    Ok(abs)
}

/// The type of the file system mounted exactly at `path`, if any (from the mount table).
fn mounted_at(path: &Path) -> Option<String> {
    mount_entry(path).map(|(_, fstype)| fstype)
}

/// The device (`major:minor`) and type of the file system mounted exactly at `path`, if
/// any: the mount table's last entry for it, the one on top.
fn mount_entry(path: &Path) -> Option<(String, String)> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    entry_in(&table, &path.to_string_lossy())
}

/// [`mount_entry`] of `want` in the mount table `table` (`/proc/self/mountinfo`'s format).
fn entry_in(table: &str, want: &str) -> Option<(String, String)> {
    table.lines().rev().find_map(|line| {
        // id parent major:minor root MOUNTPOINT options... - FSTYPE source options
        let mut fields = line.split(' ');
        let dev = fields.nth(2)?;
        let point = fields.nth(1)?;
        if unescape_mount_path(point) != want {
            return None;
        }
        let mut rest = line.split(" - ").nth(1)?.split(' ');
        Some((dev.to_string(), rest.next()?.to_string()))
    })
}

/// The mount options and session threads of a mount named `name`: `default_permissions`,
/// devices and set-ID bits honoured, `allow_other` as asked, `threads` session threads
/// reading the kernel's requests (each on its own clone of the device when there are
/// several). Every mount [`Mount::start_fs`] makes has them.
fn session_config(name: &str, allow_other: bool, threads: usize) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(name.into()),
        fuser::MountOption::Subtype(name.into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::Dev,
        fuser::MountOption::Suid,
    ];
    if allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(threads.max(1));
    config.clone_fd = threads > 1;
    config
}

/// Gives the mount the read-ahead it offers the kernel at INIT ([`fs::MAX_READAHEAD`]).
/// The kernel takes the smaller of that and its device's `read_ahead_kb`, 128 KiB unless
/// set, so a sequential reader of a large file (a checkpoint loaded at a job's start) would
/// be sent 128 KiB reads; 1 MiB ones cost a quarter of the requests. The setting is the
/// device's, in sysfs, which only root may write: otherwise the kernel's default stays.
fn widen_readahead(mountpoint: &Path) {
    let Some((dev, _)) = mount_entry(mountpoint) else {
        tracing::debug!(mountpoint = %mountpoint.display(), "not in the mount table");
        return;
    };
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    if let Err(e) = std::fs::write(&path, format!("{}\n", fs::MAX_READAHEAD >> 10)) {
        tracing::debug!("read-ahead left at the kernel's default ({path}: {e})");
    }
}

/// Undoes the octal escapes (`\040` for a space) of a path in the mount table.
fn unescape_mount_path(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).and_then(|d| {
            let d = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(d, 8).ok()
        });
        match (b[i], octal) {
            (b'\\', Some(v)) => {
                out.push(v);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A live mount. Dropping it unmounts.
pub struct Mount {
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

impl Mount {
    /// Mounts `client`'s namespace as `opts` says; requests are answered on runtime `rt`.
    /// Returns once the kernel has accepted the mount.
    pub fn start(
        client: Client,
        opts: &MountOptions,
        rt: tokio::runtime::Handle,
    ) -> Result<Mount, MountError> {
        let ttl = opts
            .relaxed_ttl
            .unwrap_or(client.cluster_map().relaxed_staleness);
        let fs = TalonFs::new(client, rt, ttl);
        let shared = fs.shared();
        Mount::start_fs(fs, "talon", opts, |session| {
            shared.set_notifier(session.notifier())
        })
    }

    /// Mounts file system `fs`, named `name`, as `opts` says (its `relaxed_ttl` is `fs`'s
    /// business), with the options every Talon mount has (`session_config`); `started`
    /// is given the session before anything else is done with it. `Mount::start` mounts
    /// Talon's with it, and `talon-bench memfs` its in-memory ceiling.
    pub fn start_fs<FS: fuser::Filesystem + Send + 'static>(
        fs: FS,
        name: &str,
        opts: &MountOptions,
        started: impl FnOnce(&fuser::BackgroundSession),
    ) -> Result<Mount, MountError> {
        let mountpoint = check_mountpoint(&opts.mountpoint)?;
        let config = session_config(name, opts.allow_other, opts.threads);
        let session = fuser::spawn_mount(fs, &mountpoint, &config)
            .map_err(|e| MountError::Fuse(mountpoint.clone(), e))?;
        started(&session);
        widen_readahead(&mountpoint);
        tracing::info!(mountpoint = %mountpoint.display(), "mounted");
        Ok(Mount {
            session: Some(session),
            mountpoint,
        })
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// True once the session has ended (someone unmounted it from outside).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts and waits for the session to end.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<(), MountError> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let r = if session.guard.is_finished() {
            session.join()
        } else {
            session.umount_and_join()
        };
        r.map_err(|e| MountError::Unmount(self.mountpoint.clone(), e.to_string()))?;
        tracing::info!(mountpoint = %self.mountpoint.display(), "unmounted");
        Ok(())
    }

    /// Waits until `shutdown` resolves or the mount is unmounted from outside, then
    /// unmounts (if still mounted).
    pub async fn serve_until(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), MountError> {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tick.tick() => if self.is_finished() { break },
            }
        }
        // Unmounting waits for the session thread; keep the runtime's workers free.
        tokio::task::spawn_blocking(move || self.unmount_inner())
            .await
            .map_err(|e| MountError::Unmount(PathBuf::new(), e.to_string()))?
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.unmount_inner() {
            tracing::warn!("{e}");
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// True if a file system is mounted exactly at `path` (per the mount table).
pub fn is_mounted(path: &Path) -> bool {
    mounted_at(path).is_some()
}

/// Unmounts `mount`, then makes sure nothing stays attached at `mountpoint`: a mount the
/// session could not take down (busy, or its owner panicking) is detached lazily. For
/// tools and tests that must always leave the mount point clean.
pub fn unmount_clean(mount: Option<Mount>, mountpoint: &Path) {
    if let Some(m) = mount {
        if let Err(e) = m.unmount() {
            tracing::warn!("{e}");
        }
    }
    if is_mounted(mountpoint) {
        if let Err(e) = unmount_path(mountpoint, true) {
            tracing::warn!("{e}");
        }
    }
}

/// Unmounts whatever FUSE mount is at `mountpoint` (`fusermount3 -u`), also one whose
/// process died.
pub fn unmount_path(mountpoint: &Path, lazy: bool) -> Result<(), MountError> {
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg(mountpoint).output().map_err(|e| {
        MountError::Unmount(mountpoint.to_path_buf(), format!("run fusermount3: {e}"))
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(MountError::Unmount(
            mountpoint.to_path_buf(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_table_paths_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path(r"/x\"), r"/x\");
    }

    #[test]
    fn a_mount_point_is_found_with_its_device() {
        let table = "22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
                     41 22 0:39 / /mnt/a\\040b rw,nosuid shared:20 - fuse.talon talon rw,user_id=0\n\
                     44 41 0:41 / /mnt/a\\040b rw shared:21 - tmpfs tmpfs rw\n";
        assert_eq!(
            entry_in(table, "/mnt/a b"),
            Some(("0:41".to_string(), "tmpfs".to_string())),
            "the mount on top"
        );
        assert_eq!(
            entry_in(table, "/"),
            Some(("252:0".to_string(), "ext4".to_string()))
        );
        assert_eq!(entry_in(table, "/mnt"), None);
    }

    #[test]
    fn bad_mount_points_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope");
        assert!(matches!(
            check_mountpoint(&missing),
            Err(MountError::Missing(_))
        ));
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        assert!(matches!(
            check_mountpoint(&file),
            Err(MountError::NotADirectory(_))
        ));
        assert!(check_mountpoint(dir.path()).is_ok());
        assert!(matches!(
            check_mountpoint(Path::new("/proc")),
            Err(MountError::Busy(..))
        ));
    }
}
