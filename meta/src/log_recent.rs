//! The entries a Raft group appended and has not applied yet, kept in memory beside its log.
//!
//! Owns what a group's log answers from memory. Every entry is read back soon after its
//! append: by the group's apply once it commits, and, on a leader, by the replication to
//! each follower before that. Read from the log's RocksDB, each read was a search of its
//! memtable, a copy of the value and a decode: a second and a third copy of every file body
//! the entry carries (bench/README.md). The entries are kept as they were appended, so a
//! read that this holds whole is a clone (file bodies are shared, not copied), and the
//! apply's read takes them out: an entry stays from its append to its apply, or until a
//! truncation, a purge or the bound cuts it off. A range this does not hold whole is read
//! from the log, as before.
//!
//! What this holds is always a run of consecutive entries that ends with the log's last
//! one, so that any range within it is the log's own: an append that does not follow the
//! last entry held starts the run again.

use crate::types::TypeConfig;
use openraft::{Entry, RaftLogId};
use std::collections::VecDeque;

/// Bytes of entries (as encoded in the log) a group keeps, past the last append's own: the
/// entries of a leader whose apply or replication falls this far behind are read from the
/// log instead. Four full chunks.
pub const RECENT_BYTES: usize = 16 << 20;

/// A group's entries from its last purge, truncation or gap up to its last append, the
/// oldest cut off past [`RECENT_BYTES`].
#[derive(Debug, Default)]
pub struct Recent {
    /// Consecutive entries, each with its size in the log.
    entries: VecDeque<(Entry<TypeConfig>, usize)>,
    /// The sizes above, summed.
    bytes: usize,
}

impl Recent {
    /// Index of the first entry held.
    fn first(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.get_log_id().index)
    }

    /// Index of the last entry held.
    fn last(&self) -> Option<u64> {
        self.entries.back().map(|(e, _)| e.get_log_id().index)
    }

    /// Keeps `appended` (entries with their sizes, in order), just written to the log
    /// after its last entry. Entries that do not follow the last one held replace them all.
    pub fn append(&mut self, appended: Vec<(Entry<TypeConfig>, usize)>) {
        let Some(first) = appended.first().map(|(e, _)| e.get_log_id().index) else {
            return;
        };
        if self.last().is_some_and(|l| l.checked_add(1) != Some(first)) {
            self.clear();
        }
        let batch = appended.len();
        let mut next = first;
        for (e, size) in appended {
            if e.get_log_id().index != next {
                // Not a run: keep none of it rather than answer for a hole.
                self.clear();
                return;
            }
            next = next.saturating_add(1);
            self.bytes += size;
            self.entries.push_back((e, size));
        }
        while self.bytes > RECENT_BYTES && self.entries.len() > batch {
            self.pop_front();
        }
    }

    /// Forgets the entries from `index` on (the log is truncated there).
    pub fn truncate(&mut self, index: u64) {
        while self.last().is_some_and(|l| l >= index) {
            self.pop_back();
        }
    }

    /// Forgets the entries up to `index` included (the log is purged up to there).
    pub fn purge(&mut self, index: u64) {
        while self.first().is_some_and(|f| f <= index) {
            self.pop_front();
        }
    }

    /// The entries of `start..end` if all of them are held, else None. Taken out of what is
    /// held (with every one before them) if `take`: the apply's read, after which no reader
    /// but a lagging follower's replication asks for them again.
    pub fn get(&mut self, start: u64, end: u64, take: bool) -> Option<Vec<Entry<TypeConfig>>> {
        let first = self.first()?;
        let last = self.last()?;
        if start >= end || start < first || end > last + 1 {
            return None;
        }
        let skip = (start - first) as usize;
        let n = (end - start) as usize;
        if !take {
            return Some(
                self.entries
                    .iter()
                    .skip(skip)
                    .take(n)
                    .map(|(e, _)| e.clone())
                    .collect(),
            );
        }
        for _ in 0..skip {
            self.pop_front();
        }
        Some((0..n).filter_map(|_| self.pop_front()).collect())
    }

    /// Takes the first entry out, with its bytes.
    fn pop_front(&mut self) -> Option<Entry<TypeConfig>> {
        let (e, size) = self.entries.pop_front()?;
        self.bytes -= size;
        Some(e)
    }

    /// Takes the last entry out, with its bytes.
    fn pop_back(&mut self) -> Option<Entry<TypeConfig>> {
        let (e, size) = self.entries.pop_back()?;
        self.bytes -= size;
        Some(e)
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    fn entries(
        range: std::ops::RangeInclusive<u64>,
        size: usize,
    ) -> Vec<(Entry<TypeConfig>, usize)> {
        range
            .map(|i| {
                let e = Entry::<TypeConfig> {
                    log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
                    payload: EntryPayload::Blank,
                };
                (e, size)
            })
            .collect()
    }

    fn indexes(got: Option<Vec<Entry<TypeConfig>>>) -> Option<Vec<u64>> {
        got.map(|v| v.iter().map(|e| e.get_log_id().index).collect())
    }

    /// Ranges held whole are answered (and the apply's read takes them and every entry
    /// before them); ranges reaching outside what is held are not.
    #[test]
    fn answers_only_ranges_held_whole() {
        let mut r = Recent::default();
        assert_eq!(indexes(r.get(1, 2, false)), None, "nothing held");
        r.append(entries(5..=9, 10));
        assert_eq!(indexes(r.get(6, 8, false)), Some(vec![6, 7]));
        assert_eq!(indexes(r.get(4, 6, false)), None, "starts before the first");
        assert_eq!(indexes(r.get(8, 11, false)), None, "ends past the last");
        assert_eq!(indexes(r.get(7, 7, false)), None, "empty");
        assert_eq!(indexes(r.get(6, 8, true)), Some(vec![6, 7]));
        assert_eq!(
            indexes(r.get(5, 6, false)),
            None,
            "taken with the range after it"
        );
        assert_eq!(indexes(r.get(8, 10, false)), Some(vec![8, 9]));
        assert_eq!(r.bytes, 20);
    }

    /// An append that does not follow the last entry starts the run again; truncation and
    /// purges cut it from either end.
    #[test]
    fn holds_one_run_that_ends_at_the_last_append() {
        let mut r = Recent::default();
        r.append(entries(1..=4, 10));
        r.append(entries(5..=6, 10));
        assert_eq!(indexes(r.get(1, 7, false)), Some(vec![1, 2, 3, 4, 5, 6]));
        r.truncate(5);
        assert_eq!(indexes(r.get(1, 5, false)), Some(vec![1, 2, 3, 4]));
        assert_eq!(indexes(r.get(4, 6, false)), None);
        r.append(entries(5..=5, 10));
        r.purge(2);
        assert_eq!(indexes(r.get(3, 6, false)), Some(vec![3, 4, 5]));
        assert_eq!(indexes(r.get(2, 4, false)), None, "purged");
        r.append(entries(9..=10, 10));
        assert_eq!(indexes(r.get(3, 4, false)), None, "a gap starts again");
        assert_eq!(indexes(r.get(9, 11, false)), Some(vec![9, 10]));
        assert_eq!(r.bytes, 20);
        r.truncate(1);
        assert_eq!((r.entries.len(), r.bytes), (0, 0));
    }

    /// Past the bound the oldest entries go, but never the last append's.
    #[test]
    fn keeps_at_most_the_bound_and_the_last_append() {
        let mut r = Recent::default();
        let chunk = 4 << 20;
        r.append(entries(1..=3, chunk));
        r.append(entries(4..=6, chunk));
        assert_eq!(indexes(r.get(3, 7, false)), Some(vec![3, 4, 5, 6]));
        assert_eq!(indexes(r.get(2, 3, false)), None, "past the bound");
        assert!(r.bytes <= RECENT_BYTES);
        r.append(entries(7..=16, chunk));
        assert_eq!(indexes(r.get(7, 17, false)).map(|v| v.len()), Some(10));
        assert_eq!(r.bytes, 10 * chunk, "the last append is kept whole");
    }
}
