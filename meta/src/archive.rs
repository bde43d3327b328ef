//! The packed form of a partition snapshot: the files of a checkpoint in one stream,
//! written from a directory and read back into one through a single copy buffer, so a
//! snapshot of gigabytes never sits in memory whole (not when built, sent or installed).
//!
//! Layout: the magic `TALONSNP`, the format version (`format::FORMAT`, u32 big-endian), then
//! per file its name (u16 big-endian length, bytes) and contents (u64 big-endian length,
//! bytes), then a zero name length. It knows nothing of Raft or RocksDB: `sm.rs` decides
//! which directory goes in and where it comes out.

use std::io::{self, Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"TALONSNP";

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Writes the regular files of `dir` (those `keep` accepts, in name order) to `out`;
/// returns the bytes written.
pub fn pack(dir: &Path, keep: impl Fn(&str) -> bool, out: &mut impl Write) -> io::Result<u64> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type()?.is_file() && keep(&name) {
            names.push(name);
        }
    }
    names.sort();
    out.write_all(MAGIC)?;
    out.write_all(&crate::format::FORMAT.to_be_bytes())?;
    let mut written = (MAGIC.len() + 4) as u64;
    for name in names {
        let len = u16::try_from(name.len()).map_err(|_| invalid("file name too long"))?;
        let mut f = std::fs::File::open(dir.join(&name))?;
        let size = f.metadata()?.len();
        out.write_all(&len.to_be_bytes())?;
        out.write_all(name.as_bytes())?;
        out.write_all(&size.to_be_bytes())?;
        let copied = io::copy(&mut (&mut f).take(size), out)?;
        if copied != size {
            return Err(invalid(format!("{name} shrank while packed")));
        }
        written += 2 + name.len() as u64 + 8 + size;
    }
    out.write_all(&0u16.to_be_bytes())?;
    Ok(written + 2)
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

    fn packed(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let src = tempfile::tempdir().expect("temp dir");
        for (name, data) in files {
            std::fs::write(src.path().join(name), data).expect("write");
        }
        let mut out = Vec::new();
        let n = pack(src.path(), |n| n != "LOCK", &mut out).expect("pack");
        assert_eq!(n, out.len() as u64);
        out
    }

    #[test]
    fn a_directory_round_trips() {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let out = packed(&[
            ("000007.sst", big.clone()),
            ("MANIFEST-000005", b"m".to_vec()),
            ("empty", Vec::new()),
            ("LOCK", b"skipped".to_vec()),
        ]);
        let dst = tempfile::tempdir().expect("temp dir");
        assert_eq!(unpack(&mut out.as_slice(), dst.path()).expect("unpack"), 3);
        assert_eq!(
            std::fs::read(dst.path().join("000007.sst")).expect("read"),
            big
        );
        assert_eq!(std::fs::read(dst.path().join("empty")).expect("read"), b"");
        assert!(!dst.path().join("LOCK").exists());
    }

    #[test]
    fn a_cut_stream_a_bad_name_or_another_version_is_refused() {
        let out = packed(&[("a", vec![1; 1000])]);
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
