//! The packed form of a partition snapshot: the files of a checkpoint in one stream, read
//! from the files themselves as the stream is sent ([`Layout`], [`PackReader`]) and read
//! back into a directory through a single copy buffer, so a snapshot of gigabytes never
//! sits in memory whole (not when built, sent or installed) and is never copied on the
//! sender's disk.
//!
//! Layout: the magic `TALONSNP`, the format version (`format::FORMAT`, u32 big-endian), then
//! per file its name (u16 big-endian length, bytes) and contents (u64 big-endian length,
//! bytes), then a zero name length. It knows nothing of Raft or RocksDB: `sm.rs` decides
//! which directory goes in and where it comes out.

use std::future::Future;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

const MAGIC: &[u8; 8] = b"TALONSNP";

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// One piece of a packed stream: bytes of its own (the magic, a file's header, the end
/// mark) or a file's contents, read from the file when the stream reaches them.
#[derive(Debug)]
enum Part {
    Bytes(Vec<u8>),
    File { path: PathBuf, len: u64 },
}

impl Part {
    fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::File { len, .. } => *len,
        }
    }
}

/// The packed stream of a directory's files, laid out but not copied: each piece with its
/// offset in the stream. A directory of immutable files (a RocksDB checkpoint) is thus sent
/// as a pack without a second copy of it on disk.
#[derive(Debug)]
pub struct Layout {
    /// Pieces in stream order, each with its first offset; none is empty.
    parts: Vec<(u64, Part)>,
    len: u64,
}

impl Layout {
    /// The stream of the regular files of `dir` that `keep` accepts, in name order, at their
    /// sizes now.
    pub fn of(dir: &Path, keep: impl Fn(&str) -> bool) -> io::Result<Layout> {
        let mut files = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type()?.is_file() && keep(&name) {
                files.push((name, e.metadata()?.len()));
            }
        }
        files.sort();
        let mut layout = Layout {
            parts: Vec::new(),
            len: 0,
        };
        let mut head = MAGIC.to_vec();
        head.extend_from_slice(&crate::format::FORMAT.to_be_bytes());
        for (name, size) in files {
            let len = u16::try_from(name.len()).map_err(|_| invalid("file name too long"))?;
            head.extend_from_slice(&len.to_be_bytes());
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(&size.to_be_bytes());
            if size > 0 {
                layout.push(Part::Bytes(std::mem::take(&mut head)));
                layout.push(Part::File {
                    path: dir.join(&name),
                    len: size,
                });
            }
        }
        head.extend_from_slice(&0u16.to_be_bytes());
        layout.push(Part::Bytes(head));
        Ok(layout)
    }

    fn push(&mut self, part: Part) {
        let len = part.len();
        if len > 0 {
            self.parts.push((self.len, part));
            self.len += len;
        }
    }

    /// The stream's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the stream is empty (never, for a laid-out directory: it has its magic).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Up to `want` bytes of the stream from offset `pos` (fewer only at its end). A file
    /// shorter than when it was laid out is an error.
    pub fn read_at(&self, pos: u64, want: usize) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let want = want.min(usize::try_from(self.len.saturating_sub(pos)).unwrap_or(usize::MAX));
        let mut out = Vec::with_capacity(want);
        // The piece holding `pos`: the last one starting at or before it.
        let mut i = self
            .parts
            .partition_point(|(start, _)| *start <= pos)
            .saturating_sub(1);
        let mut at = pos;
        while out.len() < want && i < self.parts.len() {
            let (start, part) = &self.parts[i];
            let off = at - start;
            let n = (part.len() - off).min((want - out.len()) as u64) as usize;
            match part {
                Part::Bytes(b) => out.extend_from_slice(&b[off as usize..off as usize + n]),
                Part::File { path, .. } => {
                    let old = out.len();
                    out.resize(old + n, 0);
                    std::fs::File::open(path)?
                        .read_exact_at(&mut out[old..], off)
                        .map_err(|e| match e.kind() {
                            io::ErrorKind::UnexpectedEof => {
                                invalid(format!("{} shrank after it was laid out", path.display()))
                            }
                            _ => e,
                        })?;
                }
            }
            at += n as u64;
            i += 1;
        }
        Ok(out)
    }
}

/// Most bytes one read of a [`PackReader`] takes from the disk at once.
const READ_MAX: usize = 4 << 20;

/// A [`Layout`] read as an async stream, with seeks: the files' reads run on the runtime's
/// blocking threads, as `tokio::fs::File`'s do.
pub struct PackReader {
    layout: Arc<Layout>,
    pos: u64,
    reading: Option<tokio::task::JoinHandle<io::Result<Vec<u8>>>>,
    /// Whatever keeps the laid-out files in place while they are read, dropped with the
    /// reader.
    _hold: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for PackReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackReader")
            .field("len", &self.layout.len())
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

impl PackReader {
    /// A reader at the start of `layout`'s stream, holding `hold` until it is dropped.
    pub fn new(layout: Layout, hold: impl Send + Sync + 'static) -> PackReader {
        PackReader {
            layout: Arc::new(layout),
            pos: 0,
            reading: None,
            _hold: Box::new(hold),
        }
    }
}

impl AsyncRead for PackReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if let Some(h) = this.reading.as_mut() {
                let res = std::task::ready!(Pin::new(h).poll(cx));
                this.reading = None;
                let bytes = res.map_err(io::Error::other)??;
                // A caller may come back with a smaller buffer: the rest is read again.
                let n = bytes.len().min(buf.remaining());
                buf.put_slice(&bytes[..n]);
                this.pos += n as u64;
                return Poll::Ready(Ok(()));
            }
            if this.pos >= this.layout.len() || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let (layout, pos, want) =
                (this.layout.clone(), this.pos, buf.remaining().min(READ_MAX));
            this.reading = Some(tokio::task::spawn_blocking(move || {
                layout.read_at(pos, want)
            }));
        }
    }
}

impl AsyncSeek for PackReader {
    fn start_seek(mut self: Pin<&mut Self>, to: io::SeekFrom) -> io::Result<()> {
        if self.reading.is_some() {
            return Err(io::Error::other("a seek while a read is under way"));
        }
        let len = self.layout.len();
        let pos = match to {
            io::SeekFrom::Start(p) => Some(p),
            io::SeekFrom::End(d) => len.checked_add_signed(d),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "a seek before the stream's start",
            )
        })?;
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(Ok(self.pos))
    }
}

/// A partition snapshot's bytes as openraft moves them: a stored snapshot read as the pack
/// of its checkpoint, or the file a snapshot being received is written into (and read back
/// from by the install). A stored snapshot is not written to.
#[derive(Debug)]
pub enum Stream {
    /// A laid-out directory, read.
    Pack(PackReader),
    /// A file, read and written.
    File(tokio::fs::File),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Pack(r) => Pin::new(r).poll_read(cx, buf),
            Stream::File(f) => Pin::new(f).poll_read(cx, buf),
        }
    }
}

impl AsyncSeek for Stream {
    fn start_seek(self: Pin<&mut Self>, to: io::SeekFrom) -> io::Result<()> {
        match self.get_mut() {
            Stream::Pack(r) => Pin::new(r).start_seek(to),
            Stream::File(f) => Pin::new(f).start_seek(to),
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match self.get_mut() {
            Stream::Pack(r) => Pin::new(r).poll_complete(cx),
            Stream::File(f) => Pin::new(f).poll_complete(cx),
        }
    }
}

fn read_only() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "a stored snapshot is not written to",
    )
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Pack(_) => Poll::Ready(Err(read_only())),
            Stream::File(f) => Pin::new(f).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Pack(_) => Poll::Ready(Ok(())),
            Stream::File(f) => Pin::new(f).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Pack(_) => Poll::Ready(Ok(())),
            Stream::File(f) => Pin::new(f).poll_shutdown(cx),
        }
    }
}

/// Reads a packed stream from `input` into the files of `dir` (which must exist), each
/// synced to disk with the directory; returns how many files it wrote. A stream in another
/// format version, a name that is not a plain file name, or a stream cut short is an error.
pub fn unpack(input: &mut impl Read, dir: &Path) -> io::Result<usize> {
    let mut magic = [0u8; 8];
    input.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(invalid("not a packed snapshot"));
    }
    let mut word = [0u8; 4];
    input.read_exact(&mut word)?;
    let found = u32::from_be_bytes(word);
    if found != crate::format::FORMAT {
        return Err(invalid(
            crate::format::FormatMismatch::new("a packed snapshot", found, crate::format::FORMAT)
                .to_string(),
        ));
    }
    let mut count = 0;
    loop {
        let mut len = [0u8; 2];
        input.read_exact(&mut len)?;
        let len = u16::from_be_bytes(len) as usize;
        if len == 0 {
            break;
        }
        let mut name = vec![0u8; len];
        input.read_exact(&mut name)?;
        let name = String::from_utf8(name).map_err(|_| invalid("file name not UTF-8"))?;
        if name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
            return Err(invalid(format!("file name {name:?}")));
        }
        let mut size = [0u8; 8];
        input.read_exact(&mut size)?;
        let size = u64::from_be_bytes(size);
        let mut f = std::fs::File::create(dir.join(&name))?;
        let copied = io::copy(&mut input.take(size), &mut f)?;
        if copied != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{name}: {copied} of {size} bytes"),
            ));
        }
        f.sync_all()?;
        count += 1;
    }
    std::fs::File::open(dir)?.sync_all()?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory holding `files`.
    fn dir_of(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
        let src = tempfile::tempdir().expect("temp dir");
        for (name, data) in files {
            std::fs::write(src.path().join(name), data).expect("write");
        }
        src
    }

    /// The whole packed stream of `dir`, all but its `LOCK`.
    fn packed(dir: &Path) -> Vec<u8> {
        let layout = Layout::of(dir, |n| n != "LOCK").expect("lay out");
        let out = layout.read_at(0, layout.len() as usize).expect("read");
        assert_eq!(layout.len(), out.len() as u64);
        out
    }

    /// A table file of `big`, a small one, an empty one, and a lock the pack leaves out.
    fn checkpoint_like(big: &[u8]) -> tempfile::TempDir {
        dir_of(&[
            ("000007.sst", big.to_vec()),
            ("MANIFEST-000005", b"m".to_vec()),
            ("empty", Vec::new()),
            ("LOCK", b"skipped".to_vec()),
        ])
    }

    #[test]
    fn a_directory_round_trips() {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let out = packed(checkpoint_like(&big).path());
        let dst = tempfile::tempdir().expect("temp dir");
        assert_eq!(unpack(&mut out.as_slice(), dst.path()).expect("unpack"), 3);
        assert_eq!(
            std::fs::read(dst.path().join("000007.sst")).expect("read"),
            big
        );
        assert_eq!(std::fs::read(dst.path().join("empty")).expect("read"), b"");
        assert!(!dst.path().join("LOCK").exists());
    }

    /// The reader gives the whole pack's bytes, from any offset a seek puts it at, in
    /// reads of any size, without copying the files first.
    #[tokio::test]
    async fn a_laid_out_directory_reads_as_its_pack_from_any_offset() {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let src = checkpoint_like(&big);
        let whole = packed(src.path());
        let layout = Layout::of(src.path(), |n| n != "LOCK").expect("lay out");
        assert_eq!(layout.len(), whole.len() as u64);

        let mut r = PackReader::new(layout, ());
        let mut all = Vec::new();
        r.read_to_end(&mut all).await.expect("read");
        assert_eq!(all, whole);
        for (at, n) in [(0, 5), (9, 40), (30, 299_990), (whole.len() - 7, 100)] {
            assert_eq!(
                r.seek(io::SeekFrom::Start(at as u64)).await.expect("seek"),
                at as u64
            );
            let mut got = vec![0u8; n];
            let mut filled = 0;
            while filled < n {
                let k = r.read(&mut got[filled..]).await.expect("read");
                if k == 0 {
                    break;
                }
                filled += k;
            }
            let end = (at + n).min(whole.len());
            assert_eq!(&got[..filled], &whole[at..end], "at {at}");
        }
        let dst = tempfile::tempdir().expect("temp dir");
        assert_eq!(
            unpack(&mut whole.as_slice(), dst.path()).expect("unpack"),
            3
        );

        // A file cut after it was laid out is an error, not a short stream.
        let layout = Layout::of(src.path(), |n| n != "LOCK").expect("lay out");
        std::fs::write(src.path().join("000007.sst"), b"short").expect("cut");
        let e = PackReader::new(layout, ())
            .read_to_end(&mut Vec::new())
            .await
            .expect_err("a cut file");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn a_cut_stream_a_bad_name_or_another_version_is_refused() {
        let out = packed(dir_of(&[("a", vec![1; 1000])]).path());
        let dst = tempfile::tempdir().expect("temp dir");
        let cut = unpack(&mut &out[..out.len() - 10], dst.path()).expect_err("cut short");
        assert_eq!(cut.kind(), io::ErrorKind::UnexpectedEof);

        let mut evil = MAGIC.to_vec();
        evil.extend_from_slice(&crate::format::FORMAT.to_be_bytes());
        evil.extend_from_slice(&5u16.to_be_bytes());
        evil.extend_from_slice(b"../x1");
        evil.extend_from_slice(&1u64.to_be_bytes());
        evil.push(0);
        let e = unpack(&mut evil.as_slice(), dst.path()).expect_err("a path");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);

        let mut newer = out.clone();
        newer[8..12].copy_from_slice(&(crate::format::FORMAT + 1).to_be_bytes());
        let e = unpack(&mut newer.as_slice(), dst.path()).expect_err("newer");
        assert!(e.to_string().contains("newer release"), "{e}");
    }
}
