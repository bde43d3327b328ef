//! The `talon` command: argument definitions and the code behind each subcommand. The
//! binary only parses arguments, sets up logging and calls [`run`], so every command can be
//! driven from a test.
//!
//! Output goes to stdout; every failure is one line `talon: <op> <path>: <message>` on
//! stderr, and the exit status is 1 if any operand failed. Commands taking several paths
//! go on after a failure, like their coreutils namesakes.

use crate::client::Client;
use crate::options::ClientOptions;
use crate::types::{DirEntry, MkdirOptions};
use clap::{Args, Parser, Subcommand};
use comfy_table::{presets, CellAlignment, Table};
use std::io::Write;
use std::path::PathBuf;
use talon_model::{Attr, Class, Errno, FileKind, TalonError, Time};

/// The cluster used when neither `--cluster` nor `TALON_CLUSTER` is given.
pub const DEFAULT_CLUSTER: &str = "127.0.0.1:7001";

/// Deadline of each command's operations (and of finding the cluster).
pub const CLI_OP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `talon`: use a Talon namespace from the command line.
#[derive(Debug, Parser)]
#[command(name = "talon", version, about)]
pub struct Cli {
    /// Cluster nodes, comma separated `host:port`.
    #[arg(long, global = true, env = "TALON_CLUSTER", default_value = DEFAULT_CLUSTER)]
    pub cluster: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List a directory, page by page.
    Ls {
        /// Long format: kind and mode, links, owner, size, mtime, name.
        #[arg(short = 'l')]
        long: bool,
        /// The directory (or file) to list.
        #[arg(default_value = "/")]
        path: String,
    },
    /// Show the attributes of a path (a final symlink is not followed).
    Stat {
        /// The path.
        path: String,
    },
    /// Create directories.
    Mkdir(MkdirArgs),
    /// Rename SRC to DST, replacing DST if it exists.
    Mv {
        /// Source path.
        src: String,
        /// Destination path.
        dst: String,
    },
    /// Remove files, or directory trees with -r.
    Rm {
        /// Remove directories and their contents.
        #[arg(short = 'r', short_alias = 'R', long = "recursive")]
        recursive: bool,
        /// Paths to remove.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Make a hard link LINK to TARGET, or a symlink with -s.
    Ln {
        /// Make a symbolic link.
        #[arg(short = 's')]
        symbolic: bool,
        /// What the link points at.
        target: String,
        /// The link to create.
        link: String,
    },
    /// Create empty regular files, or update the times of existing ones.
    Touch {
        /// Paths to touch.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Show a directory's consistency class, or set it with --set.
    Policy {
        /// The directory.
        path: String,
        /// New class: strict or relaxed (the directory must be empty).
        #[arg(long)]
        set: Option<Class>,
    },
    /// Show every node's partitions: role, leader, term, applied index.
    Status,
    /// Copy a local file into the namespace (into REMOTE if it is a directory).
    Put {
        /// The local file.
        local: std::path::PathBuf,
        /// Where to write it.
        remote: String,
    },
    /// Copy a file out of the namespace (into LOCAL if it is a directory).
    Get {
        /// The file to copy.
        remote: String,
        /// Where to write it.
        local: std::path::PathBuf,
    },
    /// Write files' contents to stdout.
    Cat {
        /// Files to print.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Bulk-load a local directory tree into directory DST (made if missing).
    Import {
        /// The local directory (or file).
        src: std::path::PathBuf,
        /// The directory to load it into.
        dst: String,
        /// Small-file bodies written at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
    },
    /// Mount the namespace at MOUNTPOINT until SIGINT or SIGTERM (FUSE).
    Mount(MountArgs),
    /// Unmount a Talon mount (also one whose process died).
    Umount {
        /// The mount point.
        mountpoint: PathBuf,
    },
    /// Run a single-node Talon in this process and mount it, until SIGINT or SIGTERM.
    #[cfg(feature = "server")]
    Up(UpArgs),
}

/// Arguments of `talon mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// Where to mount: an existing, empty directory.
    pub mountpoint: PathBuf,
    /// Seconds the kernel may cache entries and attributes of relaxed paths (default: the
    /// cluster's staleness bound). Strict paths are never cached.
    #[arg(long, value_name = "SECS")]
    pub relaxed_ttl: Option<f64>,
    /// Who may use the mount.
    #[command(flatten)]
    pub access: AccessArgs,
}

/// Who may use a mount: every user (their access checked from the mode bits) or only the
/// one who made it.
#[derive(Debug, Args)]
pub struct AccessArgs {
    /// Let every user use the mount, each checked against the mode bits: the default when
    /// run as root. Other users need `user_allow_other` in /etc/fuse.conf for it.
    #[arg(long, conflicts_with = "private")]
    pub allow_other: bool,
    /// Only the user who mounts may use the mount: the default for users other than root.
    #[arg(long)]
    pub private: bool,
}

impl AccessArgs {
    /// Whether to mount with `allow_other`, telling a user other than root how to share.
    fn allow_other(&self) -> bool {
        if self.private {
            return false;
        }
        if self.allow_other || crate::fuse::running_as_root() {
            return true;
        }
        eprintln!(
            "talon: only you can use this mount; to share it, add `user_allow_other` to \
             /etc/fuse.conf and pass --allow-other"
        );
        false
    }
}

/// Arguments of `talon up`.
#[cfg(feature = "server")]
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where to mount (created if missing).
    #[arg(default_value = "talon-mnt")]
    pub mountpoint: PathBuf,
    /// The data directory (created if missing; reopened if it exists).
    #[arg(long, default_value = "talon-data")]
    pub data: PathBuf,
    /// The embedded node's address; other `talon` commands reach it with `--cluster`.
    #[arg(long, default_value = crate::up::DEFAULT_LISTEN)]
    pub listen: String,
    /// Seconds the kernel may cache entries and attributes of relaxed paths.
    #[arg(long, value_name = "SECS")]
    pub relaxed_ttl: Option<f64>,
    /// Who may use the mount.
    #[command(flatten)]
    pub access: AccessArgs,
}

/// Arguments of `talon mkdir`.
#[derive(Debug, Args)]
pub struct MkdirArgs {
    /// Make the new directories strict (linearizable, co-located entries).
    #[arg(long, conflicts_with = "relaxed")]
    pub strict: bool,
    /// Make the new directories relaxed (spread entries, bounded-stale reads).
    #[arg(long)]
    pub relaxed: bool,
    /// Create missing parents; an existing directory is not an error.
    #[arg(short = 'p', long = "parents")]
    pub parents: bool,
    /// Directories to create.
    #[arg(required = true)]
    pub paths: Vec<String>,
}

/// The seeds in a `--cluster` value.
pub fn seeds(cluster: &str) -> Vec<String> {
    cluster
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Runs the command; returns the process exit status.
pub async fn run(cli: Cli) -> i32 {
    // Commands that manage a mount or a node rather than talk to a cluster.
    let command = match cli.command {
        Command::Mount(args) => return mount(&cli.cluster, args).await,
        Command::Umount { mountpoint } => return umount(&mountpoint),
        #[cfg(feature = "server")]
        Command::Up(args) => return up(args).await,
        other => other,
    };
    // Long enough to ride out a leader election, short enough for a person at a terminal.
    let opts = ClientOptions {
        op_timeout: CLI_OP_TIMEOUT,
        ..ClientOptions::default()
    };
    let client = match Client::connect(&seeds(&cli.cluster), opts).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("talon: connect {}: {e}", cli.cluster);
            return 1;
        }
    };
    let mut out = std::io::stdout().lock();
    match run_with(&client, command, &mut out).await {
        Ok(true) => 0,
        _ => 1,
    }
}

/// A `--relaxed-ttl` value in seconds as a duration; `None` if it is not a finite,
/// non-negative number.
fn ttl_secs(secs: Option<f64>) -> Result<Option<std::time::Duration>, String> {
    secs.map(|s| {
        std::time::Duration::try_from_secs_f64(s)
            .map_err(|_| format!("--relaxed-ttl {s}: not a number of seconds"))
    })
    .transpose()
}

/// `talon mount`: connects, mounts, serves until SIGINT/SIGTERM or an external unmount.
async fn mount(cluster: &str, args: MountArgs) -> i32 {
    let shown = args.mountpoint.display().to_string();
    let relaxed_ttl = match ttl_secs(args.relaxed_ttl) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("talon: mount {shown}: {e}");
            return 1;
        }
    };
    // Fail fast on a bad mount point, before looking for the cluster.
    if let Err(e) = crate::fuse::check_mountpoint(&args.mountpoint) {
        eprintln!("talon: {e}");
        return 1;
    }
    let client = match Client::connect(&seeds(cluster), ClientOptions::default()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("talon: connect {cluster}: {e}");
            return 1;
        }
    };
    let opts = crate::fuse::MountOptions {
        relaxed_ttl,
        allow_other: args.access.allow_other(),
        ..crate::fuse::MountOptions::new(&args.mountpoint)
    };
    let rt = tokio::runtime::Handle::current();
    let mounted =
        tokio::task::spawn_blocking(move || crate::fuse::Mount::start(client, &opts, rt)).await;
    let m = match mounted {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => {
            eprintln!("talon: {e}");
            return 1;
        }
        Err(e) => {
            eprintln!("talon: mount {shown}: {e}");
            return 1;
        }
    };
    eprintln!("talon: mounted {cluster} at {shown}");
    match m.serve_until(crate::fuse::shutdown_signal()).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("talon: {e}");
            1
        }
    }
}

/// `talon umount`.
fn umount(mountpoint: &std::path::Path) -> i32 {
    match crate::fuse::unmount_path(mountpoint, false) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("talon: {e}");
            1
        }
    }
}

/// `talon up`.
#[cfg(feature = "server")]
async fn up(args: UpArgs) -> i32 {
    let relaxed_ttl = match ttl_secs(args.relaxed_ttl) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("talon: up: {e}");
            return 1;
        }
    };
    let opts = crate::up::UpOptions {
        data_dir: args.data,
        mountpoint: args.mountpoint,
        listen: args.listen,
        relaxed_ttl,
        allow_other: args.access.allow_other(),
    };
    match crate::up::run(opts, crate::fuse::shutdown_signal(), |line| {
        eprintln!("{line}")
    })
    .await
    {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("talon: up: {e}");
            1
        }
    }
}

/// Runs `command` against `client`, writing results to `out` and failures to stderr.
/// Returns whether every operand succeeded; `Err` only for a failed write to `out`.
pub async fn run_with(
    client: &Client,
    command: Command,
    out: &mut impl Write,
) -> std::io::Result<bool> {
    let mut ok = true;
    let mut fail = |op: &str, path: &str, e: &TalonError| {
        eprintln!("talon: {op} {path}: {}", describe(e));
        ok = false;
    };
    match command {
        Command::Ls { long, path } => {
            if let Err(e) = ls(client, &path, long, out).await {
                match e {
                    LsError::Io(e) => return Err(e),
                    LsError::Talon(e) => fail("ls", &path, &e),
                }
            }
        }
        Command::Stat { path } => match client.stat(&path).await {
            Ok(a) => write_stat(out, &path, &a)?,
            Err(e) => fail("stat", &path, &e),
        },
        Command::Mkdir(args) => {
            let class = match (args.strict, args.relaxed) {
                (true, _) => Some(Class::Strict),
                (_, true) => Some(Class::Relaxed),
                _ => None,
            };
            for p in &args.paths {
                let opts = MkdirOptions {
                    class,
                    parents: args.parents,
                    ..MkdirOptions::default()
                };
                if let Err(e) = client.mkdir(p, opts).await {
                    fail("mkdir", p, &e);
                }
            }
        }
        Command::Mv { src, dst } => {
            if let Err(e) = client.rename(&src, &dst).await {
                fail("mv", &format!("{src} {dst}"), &e);
            }
        }
        Command::Rm { recursive, paths } => {
            for p in &paths {
                let r = if recursive {
                    client.remove_all(p).await
                } else {
                    match client.stat(p).await {
                        Ok(a) if a.kind == FileKind::Directory => Err(TalonError::posix(
                            Errno::EISDIR,
                            "is a directory (use rm -r)",
                        )),
                        Ok(_) => client.unlink(p).await,
                        Err(e) => Err(e),
                    }
                };
                if let Err(e) = r {
                    fail("rm", p, &e);
                }
            }
        }
        Command::Ln {
            symbolic,
            target,
            link,
        } => {
            let r = if symbolic {
                client.symlink(&target, &link).await
            } else {
                client.hard_link(&target, &link).await
            };
            if let Err(e) = r {
                fail("ln", &link, &e);
            }
        }
        Command::Touch { paths } => {
            for p in &paths {
                if let Err(e) = client.touch(p).await {
                    fail("touch", p, &e);
                }
            }
        }
        Command::Policy { path, set: None } => match client.policy(&path).await {
            Ok(c) => writeln!(out, "{path}: {}", c.as_str())?,
            Err(e) => fail("policy", &path, &e),
        },
        Command::Policy {
            path,
            set: Some(class),
        } => {
            if let Err(e) = client.set_policy(&path, class).await {
                fail("policy", &path, &e);
            }
        }
        Command::Put { local, remote } => {
            match crate::transfer::put(client, &local, &remote).await {
                Ok((path, n)) => writeln!(out, "{path}: {n} bytes")?,
                Err(e) => fail("put", &remote, &e),
            }
        }
        Command::Get { remote, local } => {
            if let Err(e) = crate::transfer::get(client, &remote, &local).await {
                fail("get", &remote, &e);
            }
        }
        Command::Cat { paths } => {
            for p in &paths {
                match crate::transfer::cat(client, p, out).await {
                    Ok(()) => {}
                    Err(crate::transfer::CatError::Io(e)) => return Err(e),
                    Err(crate::transfer::CatError::Talon(e)) => fail("cat", p, &e),
                }
            }
        }
        Command::Import {
            src,
            dst,
            concurrency,
        } => {
            let opts = crate::import::ImportOptions {
                concurrency,
                ..Default::default()
            };
            match crate::transfer::import(client, &src, &dst, &opts).await {
                Ok(summary) => {
                    for (path, e) in &summary.failures {
                        eprintln!("talon: import {}: {}", path.display(), describe(e));
                    }
                    writeln!(out, "imported {summary}")?;
                    if summary.failed > 0 {
                        ok = false;
                    }
                }
                Err(e) => fail("import", &dst, &e),
            }
        }
        Command::Status => {
            if !write_status(client, out).await? {
                ok = false;
            }
        }
        // These run without a client; see `run`.
        Command::Mount(_) | Command::Umount { .. } => {
            eprintln!("talon: mount and umount are run by `talon` itself, not over a client");
            ok = false;
        }
        #[cfg(feature = "server")]
        Command::Up(_) => {
            eprintln!("talon: up is run by `talon` itself, not over a client");
            ok = false;
        }
    }
    Ok(ok)
}

enum LsError {
    Io(std::io::Error),
    Talon(TalonError),
}

impl From<TalonError> for LsError {
    fn from(e: TalonError) -> Self {
        LsError::Talon(e)
    }
}

impl From<std::io::Error> for LsError {
    fn from(e: std::io::Error) -> Self {
        LsError::Io(e)
    }
}

async fn ls(client: &Client, path: &str, long: bool, out: &mut impl Write) -> Result<(), LsError> {
    let attr = client.stat(path).await?;
    if attr.kind != FileKind::Directory {
        if long {
            writeln!(out, "{}", long_line(&attr, path.as_bytes()))?;
        } else {
            writeln!(out, "{path}")?;
        }
        return Ok(());
    }
    let mut pages = client.read_dir(path).await?.with_attrs(long);
    while let Some(page) = pages.next_page().await? {
        for e in page {
            writeln!(out, "{}", entry_line(&e, long))?;
        }
    }
    Ok(())
}

fn entry_line(e: &DirEntry, long: bool) -> String {
    match (&e.attr, long) {
        (Some(a), true) => long_line(a, &e.name),
        _ => String::from_utf8_lossy(&e.name).into_owned(),
    }
}

/// The `ls -l` line of an inode.
pub fn long_line(a: &Attr, name: &[u8]) -> String {
    format!(
        "{}{} {:>3} {:>5} {:>5} {:>10} {} {}",
        kind_char(a.kind),
        mode_string(a.perm),
        a.nlink,
        a.uid,
        a.gid,
        a.size,
        format_time(a.mtime),
        String::from_utf8_lossy(name)
    )
}

fn kind_char(k: FileKind) -> char {
    match k {
        FileKind::Regular => '-',
        FileKind::Directory => 'd',
        FileKind::Symlink => 'l',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDevice => 'c',
        FileKind::BlockDevice => 'b',
    }
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::Regular => "regular file",
        FileKind::Directory => "directory",
        FileKind::Symlink => "symbolic link",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "character special file",
        FileKind::BlockDevice => "block special file",
    }
}

/// `rwxr-xr-x` for permission bits, with set-id and sticky bits as `ls` shows them.
pub fn mode_string(perm: u32) -> String {
    let mut s = String::with_capacity(9);
    for (i, special, lower, upper) in [
        (6, 0o4000, 's', 'S'),
        (3, 0o2000, 's', 'S'),
        (0, 0o1000, 't', 'T'),
    ] {
        let bits = (perm >> i) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let x = bits & 1 != 0;
        s.push(match (perm & special != 0, x) {
            (true, true) => lower,
            (true, false) => upper,
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// `YYYY-MM-DD HH:MM:SS` in UTC (seconds since the epoch, past what a calendar shows).
pub fn format_time(t: Time) -> String {
    match chrono::DateTime::from_timestamp(t.secs, 0) {
        Some(d) => d.format("%Y-%m-%d %H:%M:%S").to_string(),
        None => format!("{}s since 1970", t.secs),
    }
}

fn write_stat(out: &mut impl Write, path: &str, a: &Attr) -> std::io::Result<()> {
    writeln!(out, "  File: {path}")?;
    writeln!(
        out,
        "  Kind: {}  Class: {}",
        kind_name(a.kind),
        a.class.as_str()
    )?;
    writeln!(
        out,
        " Inode: {} (partition {})  Links: {}  Size: {}",
        a.ino,
        a.ino.home(),
        a.nlink,
        a.size
    )?;
    writeln!(
        out,
        "Access: ({:04o}/{}{})  Uid: {}  Gid: {}",
        a.perm,
        kind_char(a.kind),
        mode_string(a.perm),
        a.uid,
        a.gid
    )?;
    if matches!(a.kind, FileKind::CharDevice | FileKind::BlockDevice) {
        writeln!(out, "Device: {}:{}", a.rdev >> 8, a.rdev & 0xff)?;
    }
    writeln!(out, "Access: {}", format_time(a.atime))?;
    writeln!(out, "Modify: {}", format_time(a.mtime))?;
    writeln!(out, "Change: {}", format_time(a.ctime))?;
    writeln!(out, " Birth: {}", format_time(a.crtime))?;
    Ok(())
}

/// A table for the terminal: no borders, a header row, two spaces between columns, the
/// columns in `text` aligned left and the others (numbers) right.
fn plain_table(header: &[&str], text: &[usize]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_header(header.iter().copied());
    for (i, c) in t.column_iter_mut().enumerate() {
        c.set_padding((0, 2));
        if !text.contains(&i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// `t`'s lines, without the padding after the last column.
fn render(t: &Table) -> String {
    t.lines().map(|l| l.trim_end().to_string() + "\n").collect()
}

async fn write_status(client: &Client, out: &mut impl Write) -> std::io::Result<bool> {
    let mut ok = true;
    let mut parts = plain_table(
        &[
            "NODE", "ADDR", "PART", "ROLE", "LEADER", "TERM", "APPLIED", "ENTRIES", "INODES",
        ],
        &[1, 3],
    );
    let mut spaces = plain_table(&["NODE", "SPACE", "USED", "SIZE", "WRITABLE"], &[1]);
    let mut loads = plain_table(
        &[
            "NODE",
            "RESIDENT",
            "PEAK",
            "MEMTABLES",
            "CACHE",
            "APPENDS",
            "SYNCS",
            "PER-SYNC",
        ],
        &[],
    );
    for n in client.status().await {
        if let Some(l) = &n.load {
            let per_sync = match l.log_syncs {
                0 => "-".to_string(),
                s => format!("{:.2}", l.log_appends as f64 / s as f64),
            };
            loads.add_row(vec![
                n.node_id.to_string(),
                mib(l.resident),
                mib(l.peak_resident),
                mib(l.memtables),
                mib(l.cache),
                l.log_appends.to_string(),
                l.log_syncs.to_string(),
                per_sync,
            ]);
        }
        if let Some(s) = &n.space {
            spaces.add_row(vec![
                n.node_id.to_string(),
                s.level.clone(),
                format!("{:.1}%", s.used * 100.0),
                s.total.to_string(),
                s.usable.to_string(),
            ]);
        }
        match n.partitions {
            Ok(ps) => {
                for p in ps {
                    parts.add_row(vec![
                        n.node_id.to_string(),
                        n.addr.clone(),
                        p.id.to_string(),
                        p.role,
                        p.leader.to_string(),
                        p.term.to_string(),
                        p.applied_index.to_string(),
                        p.entries.to_string(),
                        p.inodes.to_string(),
                    ]);
                }
            }
            Err(e) => {
                parts.add_row(vec![
                    n.node_id.to_string(),
                    n.addr.clone(),
                    "-".to_string(),
                    format!("unreachable: {}", describe(&e)),
                ]);
                ok = false;
            }
        }
    }
    write!(out, "{}", render(&parts))?;
    writeln!(out)?;
    write!(out, "{}", render(&spaces))?;
    writeln!(out)?;
    write!(out, "{}", render(&loads))?;
    Ok(ok)
}

/// `bytes` in MiB, one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1}M", bytes as f64 / (1 << 20) as f64)
}

/// A user-facing message for an error: the C library's wording for POSIX errors.
pub fn describe(e: &TalonError) -> String {
    let TalonError::Posix { errno, .. } = e else {
        return e.to_string();
    };
    // The C library's wording, from nix's table (it answers "Unknown errno" for a number
    // it does not know, and then the error's own text says more).
    match nix::errno::Errno::from_raw(errno.0) {
        nix::errno::Errno::UnknownErrno => e.to_string(),
        known => known.desc().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn arguments_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_mkdir_and_policy() {
        let cli = Cli::try_parse_from([
            "talon",
            "--cluster",
            "a:1,b:2",
            "mkdir",
            "--strict",
            "-p",
            "/x",
        ])
        .expect("parses");
        assert_eq!(
            seeds(&cli.cluster),
            vec!["a:1".to_string(), "b:2".to_string()]
        );
        assert!(matches!(
            cli.command,
            Command::Mkdir(MkdirArgs {
                strict: true,
                parents: true,
                ..
            })
        ));
        let cli =
            Cli::try_parse_from(["talon", "policy", "/x", "--set", "relaxed"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Policy {
                set: Some(Class::Relaxed),
                ..
            }
        ));
        assert!(Cli::try_parse_from(["talon", "mkdir", "--strict", "--relaxed", "/x"]).is_err());
        assert!(Cli::try_parse_from(["talon", "policy", "/x", "--set", "fast"]).is_err());
    }

    #[test]
    fn formats_modes_and_times() {
        assert_eq!(mode_string(0o755), "rwxr-xr-x");
        assert_eq!(mode_string(0o4755), "rwsr-xr-x");
        assert_eq!(mode_string(0o1777), "rwxrwxrwt");
        assert_eq!(mode_string(0o2644), "rw-r-Sr--");
        assert_eq!(
            format_time(Time { secs: 0, nanos: 0 }),
            "1970-01-01 00:00:00"
        );
        assert_eq!(
            format_time(Time {
                secs: 951_782_400,
                nanos: 0
            }),
            "2000-02-29 00:00:00"
        );
        assert_eq!(
            format_time(Time {
                secs: 1_700_000_000,
                nanos: 0
            }),
            "2023-11-14 22:13:20"
        );
        assert_eq!(
            format_time(Time { secs: -1, nanos: 0 }),
            "1969-12-31 23:59:59"
        );
    }

    #[test]
    fn describes_posix_errors_like_libc() {
        let e = TalonError::posix(Errno::ENOENT, "x");
        assert_eq!(describe(&e), "No such file or directory");
        assert!(describe(&TalonError::Invalid("bad".into())).contains("bad"));
    }
}
