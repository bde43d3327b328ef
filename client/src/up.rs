//! `talon up`: the single-node embedded default. One process creates (or reopens) a local
//! data directory, runs a metadata node in it, connects a client to that node and mounts
//! the namespace, until SIGINT or SIGTERM; then it unmounts and stops the node cleanly.
//!
//! The node listens on a fixed address (default [`DEFAULT_LISTEN`], the address the other
//! `talon` commands use when no `--cluster` is given), because the cluster layout stored at
//! first start names it: reopening the data directory with another address is refused by
//! the node with a clear error rather than silently making the data unreachable.

use crate::client::Client;
use crate::fuse::{Mount, MountError, MountOptions};
use crate::options::ClientOptions;
use crate::transport::LocalNode;
use std::path::{Path, PathBuf};
use std::time::Duration;
use talon_meta::config::{Config, NodeEntry};
use talon_meta::server::RunningNode;

/// The node's address when none is given.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7001";

/// Partitions of a single-node namespace.
pub const PARTITIONS: u32 = 16;

/// What `talon up` runs.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// The data directory (created if missing).
    pub data_dir: PathBuf,
    /// Where to mount (created if missing).
    pub mountpoint: PathBuf,
    /// The node's listen address.
    pub listen: String,
    /// Kernel cache TTL of relaxed paths (`None`: the cluster's staleness bound).
    pub relaxed_ttl: Option<Duration>,
    /// Mount with `allow_other`.
    pub allow_other: bool,
}

/// Why `talon up` failed.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// A directory could not be created.
    #[error("create {0}: {1}")]
    CreateDir(PathBuf, std::io::Error),
    /// The listen address is taken or invalid.
    #[error("listen on {0}: {1} (is another `talon up` or talon-meta running? see --listen)")]
    Listen(String, std::io::Error),
    /// The node did not start.
    #[error("start the metadata node in {0}: {1}")]
    Node(PathBuf, String),
    /// The client could not reach the node.
    #[error("connect to the embedded node at {0}: {1}")]
    Connect(String, String),
    /// Mounting failed.
    #[error(transparent)]
    Mount(#[from] MountError),
}

/// The node configuration `talon up` uses for `data_dir` and `listen`.
pub fn node_config(data_dir: &Path, listen: &str) -> Config {
    let mut c = Config {
        node_id: 1,
        listen: listen.to_string(),
        data_dir: data_dir.to_path_buf(),
        ..Config::default()
    };
    c.cluster.nodes = vec![NodeEntry {
        id: 1,
        addr: listen.to_string(),
    }];
    c.cluster.partitions = PARTITIONS;
    c.cluster.replication = 1;
    c
}

/// Runs `talon up` until `shutdown` resolves or the mount is unmounted from outside.
/// `announce` is called with each line worth telling the user.
pub async fn run(
    opts: UpOptions,
    shutdown: impl std::future::Future<Output = ()>,
    mut announce: impl FnMut(String),
) -> Result<(), UpError> {
    for dir in [&opts.data_dir, &opts.mountpoint] {
        std::fs::create_dir_all(dir).map_err(|e| UpError::CreateDir(dir.clone(), e))?;
    }
    // Fail before starting anything if the mount point is unusable.
    crate::fuse::check_mountpoint(&opts.mountpoint)?;
    // The cluster layout names the address it was first started with, so a port the
    // kernel picks (0) would be one the layout, and so every client, cannot reach.
    if opts.listen.rsplit(':').next() == Some("0") {
        return Err(UpError::Listen(
            opts.listen.clone(),
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "talon up needs a fixed port: the cluster layout stores the address",
            ),
        ));
    }
    let config = node_config(&opts.data_dir, &opts.listen);
    let listener = tokio::net::TcpListener::bind(&opts.listen)
        .await
        .map_err(|e| UpError::Listen(opts.listen.clone(), e))?;
    let node = RunningNode::start(config, listener)
        .await
        .map_err(|e| UpError::Node(opts.data_dir.clone(), e.to_string()))?;
    let addr = node.addr.to_string();
    announce(format!(
        "talon: metadata node serving at {addr} (data in {})",
        opts.data_dir.display()
    ));
    // The mount calls this process's node directly, not over loopback TCP; the listener
    // still serves every other client. The node is named as the cluster map names it (the
    // address as given, which may be a host name).
    let local = LocalNode::new(
        opts.listen.clone(),
        talon_meta::service::api(node.node.clone()),
        talon_meta::service::MAX_CLIENT_MESSAGE,
    );
    let result = serve(&opts, local, shutdown, &mut announce).await;
    node.shutdown().await;
    announce("talon: stopped".into());
    result
}

async fn serve(
    opts: &UpOptions,
    local: LocalNode,
    shutdown: impl std::future::Future<Output = ()>,
    announce: &mut impl FnMut(String),
) -> Result<(), UpError> {
    let addr = local.addr().to_string();
    let client =
        Client::connect_local(std::slice::from_ref(&addr), ClientOptions::default(), local)
            .await
            .map_err(|e| UpError::Connect(addr, e.to_string()))?;
    let mount_opts = MountOptions {
        relaxed_ttl: opts.relaxed_ttl,
        allow_other: opts.allow_other,
        ..MountOptions::new(&opts.mountpoint)
    };
    let rt = tokio::runtime::Handle::current();
    let mount = tokio::task::spawn_blocking(move || Mount::start(client, &mount_opts, rt))
        .await
        .map_err(|e| MountError::Fuse(opts.mountpoint.clone(), std::io::Error::other(e)))??;
    announce(format!(
        "talon: mounted at {} (Ctrl-C to unmount and stop)",
        mount.mountpoint().display()
    ));
    mount.serve_until(shutdown).await?;
    Ok(())
}
