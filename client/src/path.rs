//! Path syntax: splitting an absolute path into validated components, and the cluster's
//! strict-prefix policy.
//!
//! Paths are bytes (names need not be UTF-8) and must be absolute. Empty components and `.`
//! are dropped and `..` removes the previous component lexically — the client resolves
//! `..` before it looks anything up, so `/a/link/..` is `/a` even when `link` is a symlink
//! (the shell's `cd -L` view, not the kernel's). Every remaining component passes
//! `talon_model::validate_name`, so a bad name fails here with the errno a local file
//! system gives and never reaches a server.

use talon_model::name::{validate_name, PATH_MAX};
use talon_model::{Errno, TalonError};

/// A normalised absolute path: its components, root first. The root itself is empty.
pub type Components = Vec<Vec<u8>>;

/// Splits `path` into normalised components.
pub fn components(path: &[u8]) -> Result<Components, TalonError> {
    if path.is_empty() {
        return Err(TalonError::posix(Errno::ENOENT, "empty path"));
    }
    if path.len() > PATH_MAX {
        return Err(TalonError::posix(
            Errno::ENAMETOOLONG,
            "path longer than PATH_MAX",
        ));
    }
    if path.contains(&0) {
        return Err(TalonError::posix(Errno::EINVAL, "path contains a NUL byte"));
    }
    if path[0] != b'/' {
        return Err(TalonError::posix(
            Errno::EINVAL,
            format!(
                "{:?} is not an absolute path",
                String::from_utf8_lossy(path)
            ),
        ));
    }
    let mut out: Components = Vec::new();
    for c in path.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                out.pop();
            }
            name => {
                validate_name(name).map_err(|errno| {
                    TalonError::posix(
                        errno,
                        format!("bad name {:?}", String::from_utf8_lossy(name)),
                    )
                })?;
                out.push(name.to_vec());
            }
        }
    }
    Ok(out)
}

/// Components of `base` followed by the (relative or absolute) `target`, normalised — how
/// a symlink found in directory `base` continues a path.
pub fn resolve_link(base: &[Vec<u8>], target: &[u8]) -> Result<Components, TalonError> {
    let mut full = Vec::new();
    if target.first() != Some(&b'/') {
        full.extend_from_slice(&join(base));
        full.push(b'/');
    }
    full.extend_from_slice(target);
    components(&full)
}

/// The path of `comps` as bytes: `/` for the root, `/a/b` otherwise.
pub fn join(comps: &[Vec<u8>]) -> Vec<u8> {
    if comps.is_empty() {
        return b"/".to_vec();
    }
    let mut out = Vec::with_capacity(comps.iter().map(|c| c.len() + 1).sum());
    for c in comps {
        out.push(b'/');
        out.extend_from_slice(c);
    }
    out
}

/// The path of `comps` for messages.
pub fn display(comps: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(&join(comps)).into_owned()
}

/// True when the directory at `comps` is one of `prefixes` or lies under one, by whole
/// components: `/checkpoints` covers `/checkpoints` and `/checkpoints/a`, not
/// `/checkpointsX`. A prefix that is not a valid absolute path never matches.
pub fn under_strict_prefix(comps: &[Vec<u8>], prefixes: &[String]) -> bool {
    prefixes.iter().any(|p| match components(p.as_bytes()) {
        Ok(pc) => pc.len() <= comps.len() && pc.iter().zip(comps).all(|(a, b)| a == b),
        Err(_) => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(p: &str) -> Components {
        components(p.as_bytes()).expect("valid path")
    }

    #[test]
    fn normalises() {
        assert!(c("/").is_empty());
        assert_eq!(
            c("//a///b/./c/"),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert_eq!(c("/a/b/../c"), vec![b"a".to_vec(), b"c".to_vec()]);
        assert!(c("/..").is_empty());
        assert_eq!(join(&c("/a//b/")), b"/a/b".to_vec());
        assert_eq!(join(&[]), b"/".to_vec());
    }

    #[test]
    fn rejects_bad_paths() {
        let errno = |p: &[u8]| components(p).err().map(|e| e.errno());
        assert_eq!(errno(b"relative"), Some(Errno::EINVAL));
        assert_eq!(errno(b""), Some(Errno::ENOENT));
        assert_eq!(errno(b"/a\0b"), Some(Errno::EINVAL));
        let long = format!("/{}", "x".repeat(256));
        assert_eq!(errno(long.as_bytes()), Some(Errno::ENAMETOOLONG));
        assert_eq!(errno(&[b'/'; PATH_MAX + 1]), Some(Errno::ENAMETOOLONG));
    }

    #[test]
    fn strict_prefixes_match_whole_components() {
        let prefixes = vec!["/checkpoints".to_string(), "/control/".to_string()];
        assert!(under_strict_prefix(&c("/checkpoints"), &prefixes));
        assert!(under_strict_prefix(&c("/checkpoints/a/b"), &prefixes));
        assert!(under_strict_prefix(&c("/control"), &prefixes));
        assert!(!under_strict_prefix(&c("/checkpointsX"), &prefixes));
        assert!(!under_strict_prefix(&c("/data/checkpoints"), &prefixes));
        assert!(!under_strict_prefix(&c("/"), &prefixes));
        assert!(under_strict_prefix(&c("/anything"), &["/".to_string()]));
        assert!(!under_strict_prefix(&c("/a"), &["relative".to_string()]));
    }

    #[test]
    fn symlink_targets_continue_from_their_directory() {
        let base = c("/a/b");
        assert_eq!(resolve_link(&base, b"../c").ok(), Some(c("/a/c")));
        assert_eq!(resolve_link(&base, b"/x/y").ok(), Some(c("/x/y")));
        assert_eq!(resolve_link(&base, b"d").ok(), Some(c("/a/b/d")));
    }
}
