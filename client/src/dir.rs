//! Directory listings in pages, with bounded memory whatever the directory's size.
//!
//! A strict directory's entries all live on one partition; a relaxed directory's are
//! spread over every partition. A listing therefore walks the directory's partitions in
//! order and, within each, pages through names in byte order: the [`DirCursor`] is the
//! index of the partition in `dir_partitions(dir, class, P)` and the last name returned
//! from it. Entries of a relaxed directory are read from any replica, so a listing may
//! miss entries younger than the staleness bound; entries of a strict directory are read
//! from the leader.

use crate::client::{read_kind, Client};
use crate::router::ReadKind;
use crate::settle::Scope;
use crate::types::DirEntry;
use crate::wire::replies;
use crate::wire::requests::{self, Header};
use futures::{Stream, StreamExt};
use talon_model::placement::dir_partitions;
use talon_model::{Ino, TalonError};

/// Where a listing continues: a partition (by position in the directory's partition list)
/// and the last name returned from it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DirCursor {
    /// Position in `dir_partitions(dir, class, P)`.
    pub index: u32,
    /// Continue strictly after this name; empty starts the partition from its beginning.
    pub after: Vec<u8>,
}

impl DirCursor {
    /// The beginning of a listing.
    pub fn start() -> DirCursor {
        DirCursor::default()
    }

    /// The cursor after a page from partition position `index` with `partitions` in all:
    /// the same partition after `last` when it has more, else the next partition, else
    /// the end (`None`).
    pub fn advance(
        index: u32,
        partitions: usize,
        more: bool,
        last: Option<&[u8]>,
    ) -> Option<DirCursor> {
        match (more, last) {
            (true, Some(name)) => Some(DirCursor {
                index,
                after: name.to_vec(),
            }),
            _ if (index as usize) + 1 < partitions => Some(DirCursor {
                index: index + 1,
                after: Vec::new(),
            }),
            _ => None,
        }
    }
}

impl Client {
    /// One page of directory `dir` from `cursor`: at most `limit` entries (capped by the
    /// cluster's `max_batch`) and the cursor to continue from, `None` at the end. A page is
    /// empty only at the end. With `plus`, every entry carries its attributes.
    pub async fn readdir_page(
        &self,
        dir: Ino,
        cursor: &DirCursor,
        limit: u32,
        plus: bool,
    ) -> Result<(Vec<DirEntry>, Option<DirCursor>), TalonError> {
        self.readdir_page_read(dir, cursor, limit, plus, false)
            .await
    }

    /// [`Client::readdir_page`], read from the partition leaders when `strict` even for a
    /// relaxed directory (so nothing acknowledged is missed).
    pub async fn readdir_page_read(
        &self,
        dir: Ino,
        cursor: &DirCursor,
        limit: u32,
        plus: bool,
        strict: bool,
    ) -> Result<(Vec<DirEntry>, Option<DirCursor>), TalonError> {
        // A `ClassChanged` answer (the class changed while the directory was empty) drops
        // the class, so the next attempt routes by the new one.
        self.settle(Scope::Dir(dir), |_| {
            self.readdir_page_once(dir, cursor, limit, plus, strict)
        })
        .await
    }

    async fn readdir_page_once(
        &self,
        dir: Ino,
        cursor: &DirCursor,
        limit: u32,
        plus: bool,
        strict: bool,
    ) -> Result<(Vec<DirEntry>, Option<DirCursor>), TalonError> {
        let class = self.dir_class(dir).await?;
        let map = self.router().map();
        let parts = dir_partitions(dir, class, map.partitions);
        let limit = limit.clamp(1, map.max_batch);
        let read = if strict {
            ReadKind::StrictRead
        } else {
            read_kind(class)
        };
        let mut cur = cursor.clone();
        loop {
            let Some(&p) = parts.get(cur.index as usize) else {
                return Ok((Vec::new(), None));
            };
            let epoch = self.epoch();
            let read = self.read_for(p, read);
            let req = requests::read_dir(Header::new(p, read, epoch), dir, &cur.after, limit, plus);
            let reply = self
                .call(p, read, |mut c| {
                    let req = req.clone();
                    async move { c.read_dir(req).await }
                })
                .await?;
            let (entries, more) = replies::read_dir(reply)?;
            let last = entries.last().map(|e| e.name.as_slice());
            let next = DirCursor::advance(cur.index, parts.len(), more, last);
            if !entries.is_empty() {
                return Ok((entries, next));
            }
            match next {
                Some(n) => cur = n,
                None => return Ok((Vec::new(), None)),
            }
        }
    }

    /// A lazy listing of directory `dir`, `page` entries per RPC.
    pub fn read_dir_ino(&self, dir: Ino, page: u32, plus: bool) -> ReadDir {
        ReadDir {
            client: self.clone(),
            dir,
            cursor: Some(DirCursor::start()),
            page,
            plus,
            strict: false,
        }
    }
}

/// A directory listing that fetches one page at a time; memory stays bounded by the page
/// size however large the directory.
pub struct ReadDir {
    client: Client,
    dir: Ino,
    cursor: Option<DirCursor>,
    page: u32,
    plus: bool,
    strict: bool,
}

impl ReadDir {
    /// The directory being listed.
    pub fn dir(&self) -> Ino {
        self.dir
    }

    /// Asks for attributes with every entry (readdirplus).
    pub fn with_attrs(mut self, plus: bool) -> ReadDir {
        self.plus = plus;
        self
    }

    /// Reads every page from the partition leaders, so the listing includes every entry
    /// created before it started, even in a relaxed directory.
    pub fn linearizable(mut self, strict: bool) -> ReadDir {
        self.strict = strict;
        self
    }

    /// The next page of entries, or `None` when the listing is done.
    pub async fn next_page(&mut self) -> Result<Option<Vec<DirEntry>>, TalonError> {
        let Some(cursor) = self.cursor.take() else {
            return Ok(None);
        };
        let (entries, next) = match self
            .client
            .readdir_page_read(self.dir, &cursor, self.page, self.plus, self.strict)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // Leave the cursor where it was so the caller may try again.
                self.cursor = Some(cursor);
                return Err(e);
            }
        };
        self.cursor = next;
        Ok((!entries.is_empty()).then_some(entries))
    }

    /// The listing as a stream of entries; it ends after the first error.
    pub fn into_stream(self) -> impl Stream<Item = Result<DirEntry, TalonError>> {
        futures::stream::unfold((self, false), |(mut rd, failed)| async move {
            if failed {
                return None;
            }
            match rd.next_page().await {
                Ok(Some(page)) => Some((Ok(page), (rd, false))),
                Ok(None) => None,
                Err(e) => Some((Err(e), (rd, true))),
            }
        })
        .flat_map(|page| match page {
            Ok(entries) => futures::stream::iter(entries.into_iter().map(Ok).collect::<Vec<_>>()),
            Err(e) => futures::stream::iter(vec![Err(e)]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_stays_on_a_partition_with_more_then_moves_on() {
        let c = DirCursor::advance(0, 8, true, Some(b"m"));
        assert_eq!(
            c,
            Some(DirCursor {
                index: 0,
                after: b"m".to_vec()
            })
        );
        let c = DirCursor::advance(0, 8, false, Some(b"m"));
        assert_eq!(
            c,
            Some(DirCursor {
                index: 1,
                after: Vec::new()
            })
        );
        assert_eq!(DirCursor::advance(7, 8, false, Some(b"z")), None);
        assert_eq!(DirCursor::advance(0, 1, false, None), None);
        // "more" without entries cannot make progress on that partition: move on.
        assert_eq!(
            DirCursor::advance(2, 8, true, None),
            Some(DirCursor {
                index: 3,
                after: vec![]
            })
        );
        assert_eq!(DirCursor::advance(7, 8, true, None), None);
    }
}
