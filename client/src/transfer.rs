//! The data commands of the `talon` CLI: `put`, `get`, `cat` and `import`. [`crate::cli`]
//! parses their arguments and reports their errors; the work is here.
//!
//! Every transfer streams through a [`File`](crate::File), so memory stays bounded for any
//! file size. Local I/O errors come back as `TalonError::Posix` with the local errno and a
//! message naming the local path, so the CLI reports both kinds of failure the same way.

use crate::client::Client;
use crate::file::OpenOptions;
use crate::import::{ImportOptions, ImportProgress, ImportSummary, COPY_BUFFER};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use talon_model::{Errno, FileKind, TalonError};
use tokio::io::AsyncWriteExt;

/// Bytes `cat` reads per request.
const CAT_PIECE: u64 = 4 << 20;

/// A local I/O error as a `TalonError` naming `path`.
pub fn local_error(path: &Path, e: std::io::Error) -> TalonError {
    TalonError::posix(
        Errno(e.raw_os_error().unwrap_or(Errno::EIO.0)),
        format!("{}: {e}", path.display()),
    )
}

fn base_name(path: &Path) -> Result<String, TalonError> {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            TalonError::posix(
                Errno::EINVAL,
                format!("{} has no file name", path.display()),
            )
        })
}

/// `talon put LOCAL REMOTE`: copies a local file to `remote` (into it, if it is a
/// directory). Returns the remote path written and the bytes copied.
pub async fn put(client: &Client, local: &Path, remote: &str) -> Result<(String, u64), TalonError> {
    let src = tokio::fs::File::open(local)
        .await
        .map_err(|e| local_error(local, e))?;
    let mut src = tokio::io::BufReader::with_capacity(COPY_BUFFER, src);
    let target = match client.stat(remote).await {
        Ok(a) if a.kind == FileKind::Directory => {
            format!("{}/{}", remote.trim_end_matches('/'), base_name(local)?)
        }
        _ => remote.to_string(),
    };
    let mut dst = client.open(&target, OpenOptions::create_truncate()).await?;
    let n = tokio::io::copy_buf(&mut src, &mut dst)
        .await
        .map_err(|e| local_error(local, e))?;
    dst.close().await?;
    Ok((target, n))
}

/// `talon get REMOTE LOCAL`: copies `remote` to a local file (into it, if it is a
/// directory). Returns the bytes copied.
pub async fn get(client: &Client, remote: &str, local: &Path) -> Result<u64, TalonError> {
    let src = client.open(remote, OpenOptions::read_only()).await?;
    let mut src = tokio::io::BufReader::with_capacity(COPY_BUFFER, src);
    let target: PathBuf = if local.is_dir() {
        local.join(base_name(Path::new(remote))?)
    } else {
        local.to_path_buf()
    };
    let dst = tokio::fs::File::create(&target)
        .await
        .map_err(|e| local_error(&target, e))?;
    let mut dst = tokio::io::BufWriter::with_capacity(COPY_BUFFER, dst);
    let n = tokio::io::copy_buf(&mut src, &mut dst)
        .await
        .map_err(|e| local_error(&target, e))?;
    dst.flush().await.map_err(|e| local_error(&target, e))?;
    Ok(n)
}

/// Why `cat` stopped.
#[derive(Debug, thiserror::Error)]
pub enum CatError {
    /// Writing the output failed.
    #[error("write output: {0}")]
    Io(#[from] std::io::Error),
    /// Reading the file failed.
    #[error(transparent)]
    Talon(#[from] TalonError),
}

/// `talon cat REMOTE`: writes the file's contents to `out`, piece by piece.
pub async fn cat(client: &Client, remote: &str, out: &mut impl Write) -> Result<(), CatError> {
    let mut f = client.open(remote, OpenOptions::read_only()).await?;
    let mut at = 0;
    loop {
        let piece = f.read_at(at, CAT_PIECE).await?;
        if piece.is_empty() {
            return Ok(());
        }
        out.write_all(&piece)?;
        at += piece.len() as u64;
    }
}

/// `talon import SRC DST`: [`Client::import`] with a progress line on stderr (when it is a
/// terminal). Returns the summary.
pub async fn import(
    client: &Client,
    src: &Path,
    dst: &str,
    opts: &ImportOptions,
) -> Result<ImportSummary, TalonError> {
    let progress = Arc::new(ImportProgress::default());
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    let ticker = {
        let (bar, progress) = (bar.clone(), progress.clone());
        let start = Instant::now();
        tokio::spawn(async move {
            loop {
                let secs = start.elapsed().as_secs_f64().max(1e-3);
                let files = progress.files.load(Ordering::Relaxed);
                let bytes = progress.bytes.load(Ordering::Relaxed);
                bar.set_message(format!(
                    "{files} files, {:.1} MB, {} dirs, {} failed — {:.0} files/s, {:.1} MB/s",
                    bytes as f64 / 1e6,
                    progress.dirs.load(Ordering::Relaxed),
                    progress.failed.load(Ordering::Relaxed),
                    files as f64 / secs,
                    bytes as f64 / 1e6 / secs
                ));
                bar.tick();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let r = client.import(src, dst, opts, &progress).await;
    ticker.abort();
    bar.finish_and_clear();
    r.map_err(|e| match e {
        crate::import::ImportError::Local { path, source } => local_error(&path, source),
        crate::import::ImportError::Destination { source, .. } => source,
    })
}
