//! The disk fault: node data directories on small tmpfs mounts, and "disk full".
//!
//! When a run injects disk faults, each node's data directory is a tmpfs of a fixed size,
//! mounted in the harness's private mount namespace (see `net`), so the host never sees it
//! and the kernel drops it when the harness's processes are gone; [`Disks`] also unmounts
//! them on drop. Filling a disk allocates one file over all of its free space; draining it
//! removes the file.

use crate::net::NetNs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// Name of the file that fills a data directory.
const FILLER: &str = "jepsen-disk-filler";

/// Errors mounting or filling a data directory.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A file system call failed.
    #[error("{what} {path}: {source}")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: String,
        /// The cause.
        source: nix::Error,
    },
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// The mounted data directories.
#[derive(Debug)]
pub struct Disks {
    dirs: Vec<PathBuf>,
}

impl Disks {
    /// Mounts a tmpfs of `size_mib` MiB on each of `dirs` (created if missing). `_ns` proves
    /// the mounts land in the harness's private mount namespace.
    pub fn mount(_ns: &NetNs, dirs: &[PathBuf], size_mib: u64) -> Result<Disks, DiskError> {
        let mut disks = Disks { dirs: Vec::new() };
        for d in dirs {
            std::fs::create_dir_all(d).map_err(|source| DiskError::Io {
                what: "create",
                path: d.display().to_string(),
                source,
            })?;
            nix::mount::mount(
                Some("tmpfs"),
                d.as_path(),
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                Some(format!("size={size_mib}m,mode=0755").as_str()),
            )
            .map_err(|source| DiskError::Sys {
                what: "mount a tmpfs on",
                path: d.display().to_string(),
                source,
            })?;
            disks.dirs.push(d.clone());
        }
        Ok(disks)
    }

    /// Allocates every free byte of the file system holding `dir`; returns how many.
    pub fn fill(dir: &Path) -> Result<u64, DiskError> {
        let path = dir.join(FILLER);
        let sys = |what, source| DiskError::Sys {
            what,
            path: path.display().to_string(),
            source,
        };
        let st = nix::sys::statvfs::statvfs(dir).map_err(|e| sys("statvfs", e))?;
        let free = st.blocks_available() as u64 * st.fragment_size() as u64;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| DiskError::Io {
                what: "create",
                path: path.display().to_string(),
                source,
            })?;
        if free > 0 {
            // Nodes write concurrently: if the space shrank meanwhile, take what is left.
            let mut want = free as i64;
            for _ in 0..8 {
                match nix::fcntl::fallocate(f.as_fd(), nix::fcntl::FallocateFlags::empty(), 0, want)
                {
                    Ok(()) => break,
                    Err(nix::Error::ENOSPC) => want -= want / 8,
                    Err(e) => return Err(sys("fallocate", e)),
                }
            }
        }
        Ok(free)
    }

    /// Removes the filler from `dir`, if any.
    pub fn drain(dir: &Path) -> Result<(), DiskError> {
        let path = dir.join(FILLER);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(DiskError::Io {
                what: "remove",
                path: path.display().to_string(),
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for d in &self.dirs {
            let _ = nix::mount::umount2(d.as_path(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
