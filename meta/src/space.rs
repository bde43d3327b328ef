//! Space on a node's data file system: how full it is, what may still be written there,
//! and the reserve that lets a node on a full disk start, apply and delete.
//!
//! Owns the fullness [`Level`], computed from `statvfs` of the data directory against the
//! `[space]` thresholds and cached between refreshes (the node's space loop refreshes it
//! every half second; the write path only reads it), the reserve file `space.reserve` in
//! the data directory, and the usable space that statfs reports. It must not propose,
//! touch Raft or open stores: what a node does at each level is `Node::space_round`'s.
//!
//! Levels, from the fraction of the file system in use (the reserve counted as used, held
//! or released, since it is never the users'):
//! - `Ok`, then `NearFull` past `nearfull_ratio`: the node frees what it can sooner (deleted
//!   values compacted away at once; unlinked files and chunks rewrites took out after
//!   half their grace, `Files::reclaim_grace`).
//! - `Full` past `full_ratio`: new entries and data are refused with ENOSPC at the edge,
//!   before anything is proposed; half the reserve is released.
//! - `Critical`: less than a sliver is left, even after the release (a follower whose
//!   leader, on another node, still accepts writes). Log appends wait for room instead of
//!   failing inside RocksDB, which would stop the node's Raft groups; small ones (the
//!   deletes that give room back) only at half that floor. A write that finds the disk
//!   full all the same waits for room and tries again ([`Gate::write_waiting`]).
//!
//! The reserve's other half, the restart share, only a start-up releases: whatever takes
//! the room a full node gave back (its own snapshots, compactions, another process), a
//! node that stops then still has room to replay its log's WAL and apply again what its
//! stores had not flushed when it opens them again.

use crate::config::SpaceConfig;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use talon_model::{Errno, TalonError};
use tokio_util::sync::CancellationToken;

/// How old a reading the write path trusts.
pub const FRESH: std::time::Duration = std::time::Duration::from_millis(20);

/// Log appends of at most this many bytes wait at half the critical floor only (see
/// [`Space::wait_for_log_room`]).
pub const SMALL_APPEND: u64 = 64 << 10;

/// How often a store write that found the disk full tries again once there is room
/// (RocksDB looks for room to recover every 5 s).
const WRITE_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// The reserve file's name in the data directory.
pub const RESERVE_FILE: &str = "space.reserve";

/// How full the data file system is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Below `nearfull_ratio`.
    Ok,
    /// Past `nearfull_ratio`.
    NearFull,
    /// Past `full_ratio`: new entries and data are refused.
    Full,
    /// Almost nothing left: log appends wait.
    Critical,
}

impl Level {
    /// The name `status` shows.
    pub fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::NearFull => "nearfull",
            Level::Full => "full",
            Level::Critical => "critical",
        }
    }
}

/// Size and free space of a file system, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsSpace {
    /// Size of the file system.
    pub total: u64,
    /// Free bytes, including those reserved for root.
    pub free: u64,
    /// Free bytes available to unprivileged users.
    pub avail: u64,
}

/// One look at the file system, with what it means.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    /// The file system as `statvfs` saw it.
    pub fs: FsSpace,
    /// Bytes held in the reserve file at the time.
    pub held: u64,
    /// The level.
    pub level: Level,
    /// Fraction of the file system in use, the reserve counted as used (held or not).
    pub used: f64,
}

impl Reading {
    /// Bytes that may still be written before the disk counts as full: what statfs
    /// reports as free and available.
    pub fn usable(&self, cfg: &SpaceConfig) -> u64 {
        user_free(cfg, self.fs, self.held).saturating_sub(Floors::of(cfg, self.fs.total).full)
    }
}

/// The free-space floors of a file system, in bytes: below `critical` log appends wait;
/// below `full` (of the users' share) new data is refused; below `nearfull` the node frees
/// what it can. Each lies well above the one before, whatever the ratios, so that users
/// are refused before the node's own writes must wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Floors {
    /// Raw free bytes below which log appends wait.
    pub critical: u64,
    /// Users' free bytes below which new data is refused.
    pub full: u64,
    /// Users' free bytes below which the node frees what it can at once.
    pub nearfull: u64,
}

impl Floors {
    /// The floors of a file system of `total` bytes. Critical: half the reserve (twice the
    /// node's memtable budget at most, see `crate::tuning`; flushing it needs about as
    /// much disk as the budget) plus 1 MiB, at least 3 MiB, at most 1/8 of the disk.
    pub fn of(cfg: &SpaceConfig, total: u64) -> Floors {
        let critical = ((reserve_size(cfg, total) / 2).max(2 << 20) + (1 << 20)).min(total / 8);
        let ratio = |r: f64| (total as f64 * (1.0 - r)) as u64;
        let full = ratio(cfg.full_ratio).max(2 * critical);
        let nearfull = ratio(cfg.nearfull_ratio).max(full + full / 2);
        Floors {
            critical,
            full,
            nearfull,
        }
    }
}

/// The level of a file system of `fs` with `held` bytes in the reserve, and the fraction
/// in use. The reserve is set aside whether it is held or released: users get only what
/// lies beyond it, so releasing it on a full disk gives its room to the node's own writes
/// (applying, deleting, restarting), never to new data.
pub fn level_of(cfg: &SpaceConfig, fs: FsSpace, held: u64) -> (Level, f64) {
    if fs.total == 0 {
        return (Level::Ok, 0.0);
    }
    let free = user_free(cfg, fs, held);
    let used = 1.0 - free as f64 / fs.total as f64;
    let f = Floors::of(cfg, fs.total);
    let level = if fs.avail < f.critical {
        Level::Critical
    } else if free < f.full {
        Level::Full
    } else if free < f.nearfull {
        Level::NearFull
    } else {
        Level::Ok
    };
    (level, used)
}

/// Free bytes beyond the reserve: what new data may use.
fn user_free(cfg: &SpaceConfig, fs: FsSpace, held: u64) -> u64 {
    let released = reserve_size(cfg, fs.total).saturating_sub(held);
    fs.avail.saturating_sub(released).min(fs.total)
}

/// The reserve's size on a file system of `total` bytes.
pub fn reserve_size(cfg: &SpaceConfig, total: u64) -> u64 {
    cfg.reserve_bytes.min(total / 16)
}

/// The share of the reserve that a running node keeps when its disk fills, for its next
/// start-up: half of it, which is at least twice the node's memtable budget
/// (`crate::tuning::Tuning::budget_for`), and so more than what opening its stores
/// replays and flushes.
pub fn restart_share(cfg: &SpaceConfig, total: u64) -> u64 {
    reserve_size(cfg, total) / 2
}

/// Size and free space of the file system holding `dir`.
pub fn statvfs(dir: &Path) -> std::io::Result<FsSpace> {
    let st = rustix::fs::statvfs(dir)?;
    let unit = st.f_frsize.max(1);
    Ok(FsSpace {
        total: st.f_blocks.saturating_mul(unit),
        free: st.f_bfree.saturating_mul(unit),
        avail: st.f_bavail.saturating_mul(unit),
    })
}

struct State {
    reading: Reading,
    at: Instant,
    announced: Level,
    full_since: Option<Instant>,
    /// Bytes that background writes under way (snapshot builds) have claimed and not yet
    /// written, or not yet given back.
    claimed: u64,
}

/// Room claimed on the disk for a background write under way, given back when dropped.
#[derive(Debug)]
pub struct Claim<'a> {
    space: &'a Space,
    bytes: u64,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut g = self.space.lock();
        g.claimed = g.claimed.saturating_sub(self.bytes);
    }
}

/// The space of one node's data directory.
pub struct Space {
    dir: PathBuf,
    cfg: SpaceConfig,
    state: Mutex<State>,
}

impl std::fmt::Debug for Space {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Space({})", self.dir.display())
    }
}

impl Space {
    /// Opens the space of `dir` (which must exist) and releases its reserve, so that what
    /// start-up writes (new log and table files) has room even on a full disk.
    pub fn open(dir: &Path, cfg: SpaceConfig) -> std::io::Result<Space> {
        let reserve = dir.join(RESERVE_FILE);
        match std::fs::remove_file(&reserve) {
            Ok(()) => tracing::info!("released the space reserve at start-up"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let fs = statvfs(dir)?;
        let (level, used) = level_of(&cfg, fs, 0);
        Ok(Space {
            dir: dir.to_path_buf(),
            cfg,
            state: Mutex::new(State {
                reading: Reading {
                    fs,
                    held: 0,
                    level,
                    used,
                },
                at: Instant::now(),
                announced: Level::Ok,
                claimed: 0,
                full_since: (level >= Level::Full).then(Instant::now),
            }),
        })
    }

    /// The thresholds.
    pub fn config(&self) -> &SpaceConfig {
        &self.cfg
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The last reading.
    pub fn reading(&self) -> Reading {
        self.lock().reading
    }

    /// The last level.
    pub fn level(&self) -> Level {
        self.lock().reading.level
    }

    /// Records `level` as the one last announced (logged) and returns the one before.
    pub fn announce(&self, level: Level) -> Level {
        std::mem::replace(&mut self.lock().announced, level)
    }

    /// Since when the disk has counted as full (a write refused, or a reading past the
    /// floor), if it does: until a reading is half way back to the nearfull floor.
    pub fn full_since(&self) -> Option<Instant> {
        self.lock().full_since
    }

    /// Looks at the file system again.
    pub fn refresh(&self) -> std::io::Result<Reading> {
        let fs = statvfs(&self.dir)?;
        let mut g = self.lock();
        let held = g.reading.held;
        let (level, used) = level_of(&self.cfg, fs, held);
        g.reading = Reading {
            fs,
            held,
            level,
            used,
        };
        g.at = Instant::now();
        // Full from the first refusal (or reading past the threshold) until the disk is
        // clearly below it again, so that leadership does not flap at the threshold.
        if level >= Level::Full {
            g.full_since.get_or_insert_with(Instant::now);
        } else {
            let f = Floors::of(&self.cfg, fs.total);
            if user_free(&self.cfg, fs, held) >= (f.full + f.nearfull) / 2 {
                g.full_since = None;
            }
        }
        Ok(g.reading)
    }

    /// Refuses new entries and `incoming` bytes of data while the disk is full, or would
    /// be with them: ENOSPC, naming the node, the partition and the threshold. The data is
    /// counted four times, a margin over the three copies it takes until the log is purged
    /// (the log's WAL, the log's files once flushed, the state's files; the state keeps no
    /// WAL). A reading older than
    /// [`FRESH`] is taken again first: a writer can fill a disk faster than the space loop
    /// looks.
    pub fn check_room(&self, node: u64, partition: u32, incoming: u64) -> Result<(), TalonError> {
        let r = self.fresh();
        let after = FsSpace {
            avail: r.fs.avail.saturating_sub(incoming.saturating_mul(4)),
            ..r.fs
        };
        let (level, used) = level_of(&self.cfg, after, r.held);
        if level < Level::Full {
            return Ok(());
        }
        self.lock().full_since.get_or_insert_with(Instant::now);
        let floor = Floors::of(&self.cfg, r.fs.total).full;
        Err(TalonError::posix(
            Errno::ENOSPC,
            format!(
                "node {node}, partition {partition}: data file system full, {:.1}% used \
                 (new data stops with less than {floor} bytes free beyond the reserve: \
                 space.full_ratio {}, at least twice the log's floor)",
                used * 100.0,
                self.cfg.full_ratio
            ),
        ))
    }

    /// Whether the node's own background writes (snapshots it builds or receives) may add
    /// `bytes` to the disk and still leave the critical floor free, as log appends do,
    /// counting what other background writes under way have claimed. A node on a nearly
    /// full disk took in and built snapshots regardless before, which filled it to the
    /// last byte, failed its next write and left nothing for its next start-up. The error
    /// says why.
    pub fn has_room(&self, bytes: u64) -> Result<(), String> {
        self.claim(bytes).map(drop)
    }

    /// As [`Space::has_room`], and holds `bytes` for the caller until the claim is dropped,
    /// so that concurrent background writes (snapshot builds of several partitions) do
    /// not each count the same free bytes.
    pub fn claim(&self, bytes: u64) -> Result<Claim<'_>, String> {
        let r = self.fresh();
        let floor = Floors::of(&self.cfg, r.fs.total).critical;
        let mut g = self.lock();
        let need = floor.saturating_add(bytes).saturating_add(g.claimed);
        if r.fs.total != 0 && r.fs.avail < need {
            return Err(format!(
                "no room for {bytes} more bytes: {} bytes free, {} claimed by other \
                 snapshots under way, and the node leaves {floor} free",
                r.fs.avail, g.claimed
            ));
        }
        g.claimed = g.claimed.saturating_add(bytes);
        Ok(Claim { space: self, bytes })
    }

    /// The last reading, taken again first if older than [`FRESH`].
    fn fresh(&self) -> Reading {
        if self.lock().at.elapsed() <= FRESH {
            return self.reading();
        }
        self.refresh().unwrap_or_else(|e| {
            tracing::warn!("statvfs of the data directory: {e}");
            self.reading()
        })
    }

    /// Waits until `bytes` more of log can be written without going below the critical
    /// floor (a follower's leader, elsewhere, may still take writes while this disk has
    /// none left), or until `cancel` fires (the node stops): an error then. A small append
    /// (at most [`SMALL_APPEND`]) may go down to half the floor: on a full disk, where new
    /// data is refused at the edge, those are the deletes, attribute changes and reclaims
    /// that give room back, and the node's own background writes (snapshots, compactions)
    /// may have claimed everything down to the floor.
    pub async fn wait_for_log_room(
        &self,
        bytes: u64,
        cancel: &CancellationToken,
    ) -> std::io::Result<()> {
        let mut waited = false;
        loop {
            let r = self.fresh();
            let floor = log_floor(Floors::of(&self.cfg, r.fs.total).critical, bytes);
            if r.fs.total == 0 || r.fs.avail >= floor.saturating_add(bytes.saturating_mul(2)) {
                if waited {
                    tracing::info!("log appends go on: the disk has room again");
                }
                return Ok(());
            }
            if !waited {
                tracing::warn!(free = r.fs.avail, floor, "log appends wait for disk space");
                waited = true;
            }
            tokio::select! {
                _ = cancel.cancelled() => {
                    return Err(std::io::Error::other("the node stops while its disk is full"));
                }
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            }
        }
    }

    /// Runs `size`, one of the methods that write or cut the reserve file, on a blocking
    /// thread: writing and syncing the reserve takes a second or two, not for a runtime
    /// worker.
    pub async fn off_runtime(
        space: &Arc<Space>,
        size: fn(&Space) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let space = space.clone();
        tokio::task::spawn_blocking(move || size(&space))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }

    /// Grows the reserve file back to the whole reserve if the disk is not nearly full.
    pub fn hold_reserve(&self) -> std::io::Result<()> {
        let r = self.reading();
        if r.level != Level::Ok {
            return Ok(());
        }
        self.grow_reserve(reserve_size(&self.cfg, r.fs.total))
    }

    /// Grows the reserve file to `size` bytes if it holds less. The bytes are written
    /// before they count, so a reading taken meanwhile sees them as used: the level can
    /// only look worse for a moment, never better. A write that fails leaves the file as
    /// it was.
    fn grow_reserve(&self, size: u64) -> std::io::Result<()> {
        let held = self.reading().held;
        if held >= size {
            return Ok(());
        }
        let path = self.dir.join(RESERVE_FILE);
        if let Err(e) = append_zeros(&path, held, size) {
            let undone = if held == 0 {
                std::fs::remove_file(&path)
            } else {
                shrink_file(&path, held)
            };
            if let Err(u) = undone {
                tracing::warn!("shrink the space reserve back after a failed write: {u}");
            }
            return Err(e);
        }
        self.lock().reading.held = size;
        tracing::info!(bytes = size, "holding the space reserve");
        Ok(())
    }

    /// Holds the restart share again once a start-up has opened the stores, if the disk
    /// can take it and still leave the critical floor free: opening replayed each WAL
    /// into table files and then deleted it, which gave back about the room the share had
    /// made. Holding it before the node writes anything else keeps it for the next
    /// start-up. A disk that cannot take it is full of the node's own data, and only room
    /// made by an operator lets such a node start again after a stop; holding the share
    /// anyway left the Raft groups starting after it without room for their first write.
    pub fn hold_restart_share(&self) -> std::io::Result<()> {
        let r = self.refresh()?;
        let keep = restart_share(&self.cfg, r.fs.total);
        if r.held >= keep {
            return Ok(());
        }
        let floor = Floors::of(&self.cfg, r.fs.total).critical;
        let need = (keep - r.held).saturating_add(floor);
        if r.fs.avail < need {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "{} bytes free, the share is {keep} and the critical floor {floor}",
                    r.fs.avail
                ),
            ));
        }
        self.grow_reserve(keep)
    }

    /// Sizes the reserve file to the restart share while the disk counts as full.
    /// Shrinks it, giving the rest of its room to the node's own writes (applying,
    /// deleting); or grows it back when a start-up could not (see
    /// [`Space::hold_restart_share`]) and the disk has room again.
    pub fn keep_restart_share(&self) -> std::io::Result<()> {
        let r = self.reading();
        let keep = restart_share(&self.cfg, r.fs.total);
        if r.held < keep {
            // Not yet held again since a start-up on a full disk: only with room to spare.
            return match self.hold_restart_share() {
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => Ok(()),
                other => other,
            };
        }
        if r.held == keep {
            return Ok(());
        }
        let path = self.dir.join(RESERVE_FILE);
        let kept = match shrink_file(&path, keep) {
            Ok(()) => keep,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        self.lock().reading.held = kept;
        tracing::info!(kept, "released the space reserve but its restart share");
        Ok(())
    }
}

/// The free bytes a log append of `bytes` must leave: the critical floor, or half of it
/// for a small append (see [`Space::wait_for_log_room`]).
fn log_floor(critical: u64, bytes: u64) -> u64 {
    if bytes <= SMALL_APPEND {
        critical / 2
    } else {
        critical
    }
}

/// Cuts the file at `path` to `len` bytes and syncs it, freeing the blocks beyond.
fn shrink_file(path: &Path, len: u64) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.set_len(len)?;
    f.sync_all()
}

/// Writes zeros to `path` from byte `from` to byte `to` and syncs them: allocated blocks,
/// not a hole. The file is created if missing.
fn append_zeros(path: &Path, from: u64, to: u64) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    f.set_len(from)?;
    f.seek(std::io::SeekFrom::Start(from))?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = to.saturating_sub(from);
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        f.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn cfg() -> SpaceConfig {
        SpaceConfig {
            nearfull_ratio: 0.85,
            full_ratio: 0.95,
            reserve_bytes: 64 * MIB,
        }
    }

    fn fs(total: u64, avail: u64) -> FsSpace {
        FsSpace {
            total,
            free: avail,
            avail,
        }
    }

    #[test]
    fn levels_follow_the_floors() {
        let c = cfg();
        let t = 10_000 * MIB;
        let f = Floors::of(&c, t);
        // Ratios set the floors on a large disk; the critical floor is far below.
        assert_eq!((f.full, f.nearfull), (500 * MIB, 1500 * MIB));
        assert!(f.critical < f.full / 2);
        // The reserve is held: what is free on disk is the users'.
        let held = reserve_size(&c, t);
        assert_eq!(level_of(&c, fs(t, 5000 * MIB), held).0, Level::Ok);
        assert_eq!(level_of(&c, fs(t, 1400 * MIB), held).0, Level::NearFull);
        assert_eq!(level_of(&c, fs(t, 400 * MIB), held).0, Level::Full);
        assert_eq!(level_of(&c, fs(t, 20 * MIB), held).0, Level::Critical);
    }

    #[test]
    fn on_a_small_disk_users_stop_well_before_the_log() {
        let c = cfg();
        for t in [16 * MIB, 48 * MIB, 64 * MIB, 256 * MIB] {
            let f = Floors::of(&c, t);
            assert!(f.critical >= MIB && f.critical <= t / 8, "{t}: {f:?}");
            assert!(f.full >= 2 * f.critical, "{t}: {f:?}");
            assert!(f.nearfull > f.full, "{t}: {f:?}");
        }
    }

    #[test]
    fn a_released_reserve_stays_out_of_the_users_reach() {
        let c = cfg();
        let t = 10_000 * MIB;
        let reserve = reserve_size(&c, t);
        // Full with the reserve held; releasing it frees disk but not the users' share.
        let (held_level, held_used) = level_of(&c, fs(t, 400 * MIB), reserve);
        let (level, used) = level_of(&c, fs(t, 400 * MIB + reserve), 0);
        assert_eq!((held_level, level), (Level::Full, Level::Full));
        assert!((held_used - used).abs() < 1e-9);
    }

    #[test]
    fn the_reserve_is_at_most_a_sixteenth() {
        let c = cfg();
        assert_eq!(reserve_size(&c, 64 * MIB), 4 * MIB);
        assert_eq!(reserve_size(&c, 100_000 * MIB), 64 * MIB);
    }

    #[test]
    fn usable_space_stops_at_the_full_threshold() {
        let c = cfg();
        let t = 1000 * MIB;
        let reserve = reserve_size(&c, t);
        let r = |avail, held| {
            let (level, used) = level_of(&c, fs(t, avail), held);
            Reading {
                fs: fs(t, avail),
                held,
                level,
                used,
            }
        };
        let full = Floors::of(&c, t).full;
        assert_eq!(r(500 * MIB, reserve).usable(&c), 500 * MIB - full);
        assert_eq!(r(40 * MIB, reserve).usable(&c), 0);
        assert_eq!(r(500 * MIB + reserve, 0).usable(&c), 500 * MIB - full);
    }

    #[test]
    fn small_log_appends_may_use_half_the_critical_floor() {
        let critical = 4 * MIB;
        // A delete's entry, a few hundred bytes, and the largest small append.
        assert_eq!(log_floor(critical, 300), 2 * MIB);
        assert_eq!(log_floor(critical, SMALL_APPEND), 2 * MIB);
        // A file's body waits at the whole floor.
        assert_eq!(log_floor(critical, SMALL_APPEND + 1), critical);
        assert_eq!(log_floor(critical, 200_000), critical);
    }

    #[test]
    fn claims_do_not_count_the_same_free_bytes_twice() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Space::open(
            dir.path(),
            SpaceConfig {
                reserve_bytes: MIB,
                nearfull_ratio: 1.0,
                full_ratio: 1.0,
            },
        )
        .expect("open");
        let avail = s.refresh().expect("refresh").fs.avail;
        assert!(s.has_room(avail.saturating_mul(2)).is_err());
        // The critical floor is a few MiB here: 60 % of the free space fits once, not twice.
        let most = avail / 10 * 6;
        let first = s.claim(most).expect("room for the first claim");
        assert!(
            s.claim(most).is_err(),
            "the same bytes are not claimed twice"
        );
        drop(first);
        assert!(
            s.claim(most).is_ok(),
            "a dropped claim gives its bytes back"
        );
    }

    #[test]
    fn open_releases_all_and_a_full_disk_half_of_the_reserve() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(RESERVE_FILE), b"old").expect("write");
        let small = SpaceConfig {
            reserve_bytes: MIB,
            nearfull_ratio: 1.0,
            full_ratio: 1.0,
        };
        let s = Space::open(dir.path(), small.clone()).expect("open");
        assert!(!dir.path().join(RESERVE_FILE).exists());
        s.refresh().expect("refresh");
        s.hold_reserve().expect("hold");
        let len = || {
            std::fs::metadata(dir.path().join(RESERVE_FILE))
                .map(|m| m.len())
                .unwrap_or(0)
        };
        assert_eq!(len(), MIB);
        s.keep_restart_share().expect("release");
        assert_eq!(len(), MIB / 2, "the restart share stays");
        s.hold_reserve().expect("hold again");
        assert_eq!(len(), MIB);
        drop(s);
        let s = Space::open(dir.path(), small).expect("open again");
        assert!(!dir.path().join(RESERVE_FILE).exists());
        s.hold_restart_share().expect("hold the share");
        assert_eq!(len(), MIB / 2);
    }
}

/// Where a node's stores wait for disk space: the node's space, and its stop signal.
#[derive(Clone, Debug)]
pub struct Gate {
    /// The node's data file system.
    pub space: Arc<Space>,
    /// Fires when the node stops; a waiting write then fails.
    pub cancel: CancellationToken,
}

/// Whether `e`, an error of RocksDB, reports a full disk: in the write itself, or in the
/// memtable flush or compaction whose failure RocksDB now answers every write with. RocksDB
/// spells its no-space status with this fixed text (not the C library's message, which
/// the locale could change), and the Rust binding passes only the text on.
pub fn is_no_space(e: &impl std::fmt::Display) -> bool {
    e.to_string().contains("No space left on device")
}

impl Gate {
    /// Waits until `bytes` more of log can be written (see [`Space::wait_for_log_room`]).
    pub async fn log_room(&self, bytes: u64) -> std::io::Result<()> {
        self.space.wait_for_log_room(bytes, &self.cancel).await
    }

    /// Runs `write`, a write of `store` (named in the log), until it succeeds or fails for
    /// another reason than a full disk, and waits for room between tries. Once a memtable
    /// flush has run out of room, RocksDB refuses every write until it has recovered by
    /// itself, which it tries when the disk has room again; an error instead would stop the
    /// Raft group that asked for the write, and with it the partition on this node, until
    /// the node restarts. Every try writes the whole batch anew (RocksDB takes the batch it
    /// writes), and the stores' batches put and delete whole keys, so that is harmless.
    /// Ends with an error when the node stops. Without a gate, `write` is tried once.
    pub async fn write_waiting<E: std::error::Error + Send + Sync + 'static>(
        gate: Option<&Gate>,
        store: impl std::fmt::Display,
        mut write: impl FnMut() -> Result<(), E>,
    ) -> std::io::Result<()> {
        let mut waited = false;
        loop {
            let e = match write() {
                Ok(()) => {
                    if waited {
                        tracing::info!("writes of {store} go on after a full disk");
                    }
                    return Ok(());
                }
                Err(e) => e,
            };
            let Some(g) = gate.filter(|_| is_no_space(&e)) else {
                return Err(std::io::Error::other(e));
            };
            if !waited {
                tracing::warn!("a write of {store} found the disk full; it waits for room: {e}");
                waited = true;
            }
            g.log_room(0).await?;
            tokio::select! {
                _ = g.cancel.cancelled() => {
                    return Err(std::io::Error::other("the node stops while its disk is full"));
                }
                _ = tokio::time::sleep(WRITE_RETRY) => {}
            }
        }
    }
}
