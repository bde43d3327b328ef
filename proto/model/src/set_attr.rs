//! What a setattr changes: which attributes, to what. One noun in two stages, told apart by
//! how its times are given: as asked, [`SetAttr`] (`SetAttr<TimeSet>`), with times exact
//! or "now" by the server's clock; as applied, `SetAttr<Time>` (`AttrChange` in
//! `talon-meta`), every time fixed by the proposing node's clock so that replicas agree.
//! The client builds the first and sends it as a `SetAttrRequest`; the server decodes it
//! into the same type and [resolves](SetAttr::resolve) it into the second for its log.

use crate::attr::Time;
use crate::error::TalonError;
use crate::ino::Ino;
use serde::{Deserialize, Serialize};
use talon_proto::v1 as pb;

/// How to set a time in [`SetAttr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// This exact time.
    At(Time),
    /// The server's clock.
    Now,
}

impl TimeSet {
    /// The time this sets, `now` standing for the server's clock.
    pub fn at(self, now: Time) -> Time {
        match self {
            TimeSet::At(t) => t,
            TimeSet::Now => now,
        }
    }
}

/// Which attributes a setattr changes; `None` keeps one. `T` is how a time is given:
/// [`TimeSet`] as asked, [`Time`] as applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr<T = TimeSet> {
    /// New permission bits.
    pub perm: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<T>,
    /// New modification time.
    pub mtime: Option<T>,
}

/// No change (for any way of giving times, so not derived).
impl<T> Default for SetAttr<T> {
    fn default() -> Self {
        SetAttr {
            perm: None,
            uid: None,
            gid: None,
            size: None,
            atime: None,
            mtime: None,
        }
    }
}

/// A time as the request carries it: an exact time, or the "now" flag.
fn time_to_wire(t: Option<TimeSet>) -> (Option<pb::Timestamp>, bool) {
    match t {
        None => (None, false),
        Some(TimeSet::Now) => (None, true),
        Some(TimeSet::At(t)) => (Some(t.into()), false),
    }
}

fn time_from_wire(t: Option<pb::Timestamp>, now: bool) -> Result<Option<TimeSet>, TalonError> {
    if now {
        return Ok(Some(TimeSet::Now));
    }
    t.map(|t| Time::try_from(t).map(TimeSet::At)).transpose()
}

impl SetAttr<TimeSet> {
    /// This change with its "now" times read from `now`, the clock of the node that
    /// proposes it: what the log records, so every replica applies the same times.
    pub fn resolve(&self, now: Time) -> SetAttr<Time> {
        SetAttr {
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            atime: self.atime.map(|t| t.at(now)),
            mtime: self.mtime.map(|t| t.at(now)),
        }
    }

    /// The request that applies this change to inode `ino`.
    pub fn to_request(&self, header: Option<pb::RequestHeader>, ino: Ino) -> pb::SetAttrRequest {
        let (atime, atime_now) = time_to_wire(self.atime);
        let (mtime, mtime_now) = time_to_wire(self.mtime);
        pb::SetAttrRequest {
            header,
            ino: ino.0,
            perm: self.perm.map(|m| m & 0o7777),
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            atime,
            mtime,
            atime_now,
            mtime_now,
        }
    }
}

impl TryFrom<&pb::SetAttrRequest> for SetAttr<TimeSet> {
    type Error = TalonError;

    /// Decodes the change a request asks for; a "now" flag wins over a time given with it.
    fn try_from(r: &pb::SetAttrRequest) -> Result<SetAttr<TimeSet>, TalonError> {
        Ok(SetAttr {
            perm: r.perm,
            uid: r.uid,
            gid: r.gid,
            size: r.size,
            atime: time_from_wire(r.atime, r.atime_now)?,
            mtime: time_from_wire(r.mtime, r.mtime_now)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let t = Time {
            secs: 12,
            nanos: 34,
        };
        for set in [
            SetAttr::default(),
            SetAttr {
                perm: Some(0o640),
                size: Some(7),
                atime: Some(TimeSet::Now),
                mtime: Some(TimeSet::At(t)),
                ..SetAttr::default()
            },
            SetAttr {
                uid: Some(1),
                gid: Some(2),
                atime: Some(TimeSet::At(t)),
                mtime: Some(TimeSet::Now),
                ..SetAttr::default()
            },
        ] {
            let req = set.to_request(None, Ino(9));
            assert_eq!(req.ino, 9);
            assert_eq!(SetAttr::try_from(&req).expect("decodes"), set);
        }
        let now = Time { secs: 99, nanos: 0 };
        assert_eq!(TimeSet::Now.at(now), now);
        assert_eq!(TimeSet::At(t).at(now), t);
    }

    #[test]
    fn resolving_fixes_every_now() {
        let t = Time { secs: 5, nanos: 6 };
        let now = Time { secs: 99, nanos: 0 };
        let asked = SetAttr {
            size: Some(3),
            atime: Some(TimeSet::Now),
            mtime: Some(TimeSet::At(t)),
            ..SetAttr::default()
        };
        let applied: SetAttr<Time> = asked.resolve(now);
        assert_eq!(
            applied,
            SetAttr {
                size: Some(3),
                atime: Some(now),
                mtime: Some(t),
                ..SetAttr::default()
            }
        );
        assert_eq!(
            SetAttr::<TimeSet>::default().resolve(now),
            SetAttr::default()
        );
    }
}
