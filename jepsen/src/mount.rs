//! A FUSE mount of the cluster (`talon mount`), for the workload that goes through the
//! kernel rather than the library.
//!
//! The mount process is the harness's child, in its private mount namespace, started under
//! a parent-death signal like the nodes. Dropping a [`FuseMount`] asks it to unmount
//! (SIGTERM, which `talon mount` answers with a clean unmount), kills it if it does not
//! exit in time, and lazily detaches the mount point whatever happened.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Errors starting a mount.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The mount process could not be started.
    #[error("start {bin}: {source}")]
    Spawn {
        /// The binary.
        bin: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The mount did not appear.
    #[error("{0}")]
    NotMounted(String),
}

/// A running `talon mount`.
#[derive(Debug)]
pub struct FuseMount {
    child: Option<Child>,
    mnt: PathBuf,
}

fn is_mounted(mnt: &Path) -> bool {
    let want = mnt.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|s| {
            s.lines()
                .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
        })
        .unwrap_or(false)
}

impl FuseMount {
    /// Mounts the cluster at `seeds` on `mnt` (created if missing) with the `talon` binary,
    /// logging to `log`; waits up to 30 s for the mount to appear.
    pub fn start(
        talon_bin: &Path,
        seeds: &[String],
        mnt: &Path,
        log: &Path,
    ) -> Result<FuseMount, MountError> {
        let spawn = |source| MountError::Spawn {
            bin: talon_bin.display().to_string(),
            source,
        };
        std::fs::create_dir_all(mnt).map_err(spawn)?;
        let out = std::fs::File::create(log).map_err(spawn)?;
        let err = out.try_clone().map_err(spawn)?;
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(talon_bin)
            .arg("--cluster")
            .arg(seeds.join(","))
            .arg("mount")
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(spawn)?;
        let mut m = FuseMount {
            child: Some(child),
            mnt: mnt.to_path_buf(),
        };
        let until = Instant::now() + Duration::from_secs(30);
        // Bounded by time.
        while !is_mounted(mnt) {
            let exited = m
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
                .is_some();
            if exited || Instant::now() >= until {
                return Err(MountError::NotMounted(format!(
                    "talon mount {} did not come up; see {}",
                    mnt.display(),
                    log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(m)
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let until = Instant::now() + Duration::from_secs(5);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
