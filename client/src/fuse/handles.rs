//! Open-file and open-directory state, keyed by the `fh` number the kernel hands back on
//! every later call.
//!
//! A directory listing in Talon continues from a [`DirCursor`] (partition position plus
//! last name), which does not fit the kernel's `u64` readdir offset. So each open directory
//! keeps a `DirListing`: a window of the listing in memory, where an entry's offset is
//! its index in the whole listing (0 and 1 are `.` and `..`). The window only grows by a
//! page at a time as the kernel's offset reaches its end, and entries before the offset the
//! kernel asks for are dropped first, so memory stays bounded by one page plus what one
//! kernel call has not yet taken, however large the directory. A seek backwards (rewinddir,
//! or a seekdir to an offset already dropped) restarts the listing from the beginning.

use crate::dir::DirCursor;
use crate::types::DirEntry;
use dashmap::DashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use talon_model::{Attr, FileKind, Ino, TalonError};

/// Handles of one kind, numbered from 1 and never reused within a mount.
pub(crate) struct HandleTable<T> {
    next: AtomicU64,
    open: DashMap<u64, Arc<T>>,
}

impl<T> HandleTable<T> {
    pub fn new() -> Self {
        HandleTable {
            next: AtomicU64::new(1),
            open: DashMap::new(),
        }
    }

    /// Stores `v`; returns its handle number.
    pub fn insert(&self, v: T) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.open.insert(fh, Arc::new(v));
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<T>> {
        self.open.get(&fh).map(|v| v.value().clone())
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<T>> {
        self.open.remove(&fh).map(|(_, v)| v)
    }

    /// Every open handle, for a clean shutdown.
    pub fn drain(&self) -> Vec<Arc<T>> {
        let keys: Vec<u64> = self.open.iter().map(|e| *e.key()).collect();
        keys.into_iter().filter_map(|k| self.remove(k)).collect()
    }
}

/// One entry of a listing as the kernel sees it.
#[derive(Clone, Debug)]
pub(crate) struct ListedEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
    /// Attributes, when the listing brought them (for readdirplus).
    pub attr: Option<Attr>,
}

impl From<DirEntry> for ListedEntry {
    fn from(e: DirEntry) -> Self {
        ListedEntry {
            name: e.name,
            ino: e.ino,
            kind: e.kind,
            attr: e.attr,
        }
    }
}

/// The state of one open directory's listing (see the module docs).
pub(crate) struct DirListing {
    /// The directory and its attributes at opendir (for `.`).
    pub dir: Attr,
    /// The parent's ino (for `..`).
    pub parent: Ino,
    /// Offset (index in the whole listing) of `window[0]`.
    base: u64,
    window: Vec<ListedEntry>,
    /// Where the next page starts; `None` once the listing reached its end.
    cursor: Option<DirCursor>,
}

impl DirListing {
    pub fn new(dir: Attr, parent: Ino) -> DirListing {
        let mut l = DirListing {
            dir,
            parent,
            base: 0,
            window: Vec::new(),
            cursor: None,
        };
        l.restart();
        l
    }

    fn restart(&mut self) {
        self.base = 0;
        self.window = vec![
            ListedEntry {
                name: b".".to_vec(),
                ino: self.dir.ino,
                kind: FileKind::Directory,
                attr: Some(self.dir.clone()),
            },
            ListedEntry {
                name: b"..".to_vec(),
                ino: self.parent,
                kind: FileKind::Directory,
                attr: None,
            },
        ];
        self.cursor = Some(DirCursor::start());
    }

    /// Makes the entry at `offset` available (unless the listing ends before it), fetching
    /// pages with `fetch`; returns the entries from `offset` on that are in memory, each
    /// with its offset. An empty answer means the end of the directory.
    pub async fn entries_from<F, Fut>(
        &mut self,
        offset: u64,
        mut fetch: F,
    ) -> Result<Vec<(u64, ListedEntry)>, TalonError>
    where
        F: FnMut(DirCursor) -> Fut,
        Fut: Future<Output = Result<(Vec<DirEntry>, Option<DirCursor>), TalonError>>,
    {
        if offset < self.base {
            self.restart();
        }
        loop {
            // Entries before `offset` have been returned for good: drop them.
            let skip = usize::try_from(offset - self.base)
                .unwrap_or(usize::MAX)
                .min(self.window.len());
            if skip > 0 {
                self.window.drain(..skip);
                self.base += skip as u64;
            }
            if self.base == offset && !self.window.is_empty() {
                break;
            }
            let Some(cursor) = self.cursor.take() else {
                break;
            };
            match fetch(cursor.clone()).await {
                Ok((page, next)) => {
                    self.window.extend(page.into_iter().map(ListedEntry::from));
                    self.cursor = next;
                }
                Err(e) => {
                    // Leave the cursor in place so a retry continues where this failed.
                    self.cursor = Some(cursor);
                    return Err(e);
                }
            }
        }
        if self.base != offset {
            return Ok(Vec::new());
        }
        Ok(self
            .window
            .iter()
            .enumerate()
            .map(|(i, e)| (self.base + i as u64, e.clone()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talon_model::{Class, Time};

    fn attr(ino: u64) -> Attr {
        Attr {
            ino: Ino(ino),
            kind: FileKind::Directory,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 2,
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
            crtime: Time::default(),
            generation: 0,
            class: Class::Relaxed,
            rdev: 0,
            parent: Ino(1),
        }
    }

    type Page = Result<(Vec<DirEntry>, Option<DirCursor>), TalonError>;

    /// A directory of `n` files named f0000.., served in pages of `page`.
    fn source(n: usize, page: usize) -> impl FnMut(DirCursor) -> std::future::Ready<Page> {
        move |c: DirCursor| {
            let start: usize = if c.after.is_empty() {
                0
            } else {
                String::from_utf8_lossy(&c.after[1..])
                    .parse::<usize>()
                    .map(|i| i + 1)
                    .unwrap_or(n)
            };
            let end = (start + page).min(n);
            let entries: Vec<DirEntry> = (start..end)
                .map(|i| DirEntry {
                    name: format!("f{i:04}").into_bytes(),
                    ino: Ino(100 + i as u64),
                    kind: FileKind::Regular,
                    attr: None,
                })
                .collect();
            let next = (end < n).then(|| DirCursor {
                index: 0,
                after: format!("f{:04}", end - 1).into_bytes(),
            });
            std::future::ready(Ok((entries, next)))
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    /// Reads the whole listing the way the kernel does: `take` entries per call.
    fn read_all(l: &mut DirListing, n: usize, take: usize) -> Vec<String> {
        let mut names = Vec::new();
        let mut offset = 0;
        loop {
            let got = block_on(l.entries_from(offset, source(n, 7))).expect("list");
            if got.is_empty() {
                return names;
            }
            for (off, e) in got.into_iter().take(take) {
                assert_eq!(off, offset, "offsets are consecutive indices");
                names.push(String::from_utf8_lossy(&e.name).into_owned());
                offset = off + 1;
            }
        }
    }

    #[test]
    fn lists_every_entry_once_with_dot_entries_first() {
        let mut l = DirListing::new(attr(5), Ino(1));
        let names = read_all(&mut l, 50, 3);
        assert_eq!(names.len(), 52);
        assert_eq!(&names[..2], &[".", ".."]);
        assert_eq!(names[2], "f0000");
        assert_eq!(names[51], "f0049");
        // The window never held much more than one page.
        assert!(l.window.len() <= 7 + 3);
    }

    #[test]
    fn empty_directory_has_only_dot_entries() {
        let mut l = DirListing::new(attr(5), Ino(1));
        assert_eq!(read_all(&mut l, 0, 10), vec![".", ".."]);
    }

    #[test]
    fn seeking_back_restarts_the_listing() {
        let mut l = DirListing::new(attr(5), Ino(1));
        let _ = read_all(&mut l, 20, 4);
        let again = block_on(l.entries_from(0, source(20, 7))).expect("list");
        assert_eq!(again[0].1.name, b".");
        let mid = block_on(l.entries_from(10, source(20, 7))).expect("list");
        assert_eq!(mid[0].0, 10);
        assert_eq!(mid[0].1.name, b"f0008");
        let back = block_on(l.entries_from(4, source(20, 7))).expect("list");
        assert_eq!(back[0].1.name, b"f0002");
    }
}
