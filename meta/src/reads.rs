//! Reads of one replica's own state that both a client's request and another node's
//! question need: a file (its inode and checked body) and a directory's class.
//!
//! It sits below the node, so the node can answer a peer's question without reaching up to
//! the operation modules (`data`, `namespace`) that also use these reads. It only reads a
//! store: no routing, no consistency barrier (callers take the barrier they need first).

use crate::keys;
use crate::records::{dec, storage_error, BodyView, Fatal, InodeRec};
use crate::sm::SmStore;
use crate::view::View;
use std::sync::Arc;
use talon_model::{Attr, Class, Errno, FileKind, Ino, Layout, TalonError};

fn posix(errno: Errno, msg: impl Into<String>) -> TalonError {
    TalonError::posix(errno, msg)
}

/// A file as `Open` answers it: attributes, layout (chunked files), body (small files).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct OpenFile {
    /// Attributes.
    pub attr: Attr,
    /// Where the file's bytes are.
    pub layout: Layout,
    /// Body of a small file, when asked for.
    #[serde(with = "serde_bytes")]
    pub body: Option<Vec<u8>>,
}

/// A file's inode and (small, asked for) body from a partition replica's store: the
/// packed store's read path (one point-in-time view, the inode, the body and its checksum),
/// without holding the calling thread while the body is read from the disk (see
/// [`SmStore::read_unblocking`]).
pub async fn read_stored_unblocking(
    store: &Arc<SmStore>,
    ino: Ino,
    want_body: bool,
) -> Result<Option<OpenFile>, TalonError> {
    let got = store
        .read_unblocking(move |v| stored(v, ino, want_body))
        .await?;
    checked(store.partition(), ino, got)
}

/// The inode and, if wanted and small, the body: Some(Some) if it matches its checksum (an
/// absent body is empty), Some(None) if not. The body is copied out of the store once,
/// into the answer, and only if it is sound.
type Stored = Option<(InodeRec, Option<Option<Vec<u8>>>)>;

fn stored(v: &View<'_>, ino: Ino, want_body: bool) -> Result<Stored, Fatal> {
    let Some(rec) = v.inode(ino)? else {
        return Ok(None);
    };
    let body = if want_body && rec.attr.kind == FileKind::Regular && rec.layout == Layout::Small {
        let read = v.read_self_checked(&keys::body(ino), |b| {
            let body: BodyView = dec(b, "body")?;
            Ok::<_, Fatal>(body.verify().then(|| body.data.to_vec()))
        })?;
        Some(read.transpose()?.unwrap_or(Some(Vec::new())))
    } else {
        None
    };
    Ok(Some((rec, body)))
}

/// The file of a [`stored`] read; EIO if its body failed its checksum.
fn checked(partition: u32, ino: Ino, got: Stored) -> Result<Option<OpenFile>, TalonError> {
    let Some((rec, body)) = got else {
        return Ok(None);
    };
    let InodeRec { attr, layout, .. } = rec;
    let body = match body {
        None => None,
        Some(Some(data)) => Some(data),
        Some(None) => {
            tracing::error!(ino = %ino, partition, "checksum mismatch in the body of inode {ino}");
            return Err(posix(
                Errno::EIO,
                format!("checksum mismatch in the body of inode {ino}"),
            ));
        }
    };
    Ok(Some(OpenFile { attr, layout, body }))
}

/// The class of `dir` as its home partition's replica `store` knows it: ENOENT if removed or absent,
/// ENOTDIR if not a directory.
pub fn dir_class(store: &SmStore, dir: Ino) -> Result<Class, TalonError> {
    let rec = store
        .read(|v| {
            if v.get(&crate::keys::tombstone(dir))?.is_some() {
                return Ok(None);
            }
            v.inode(dir)
        })
        .map_err(storage_error)?;
    match rec {
        None => Err(posix(Errno::ENOENT, format!("no directory {dir}"))),
        Some(r) if r.attr.kind != FileKind::Directory => {
            Err(posix(Errno::ENOTDIR, format!("{dir} is not a directory")))
        }
        Some(r) => Ok(r.attr.class),
    }
}
