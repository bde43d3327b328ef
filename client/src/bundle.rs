//! Bundles: the lookups, getattrs, creates and removes that many tasks of one client send
//! to one node at the same moment, carried by one `Bundle` RPC.
//!
//! A small request costs both ends more in its RPC than in its work: HTTP/2 framing, socket
//! writes and reads, and the wake-ups between them. Sixty-four tasks creating empty files
//! through the library, one RPC each, kept a node's two cores busy at a third of the rate
//! the same node reached when each RPC carried many creates (`bench/README.md`). So a
//! [`Bundler`] lets at most `window` RPCs of one lane be in flight to its node. A request
//! that finds them all under way waits; when one returns, everything waiting (up to the
//! cluster's `max_batch`) leaves in one bundle. A caller alone never waits and its request
//! travels as its own RPC; the more callers at once, the larger the bundles.
//!
//! Requests of unlike latency do not share a bundle, whose answer comes when its slowest
//! request is served: relaxed reads (served by any replica from its own state), strict
//! reads (after the leader's read barrier) and writes (after a commit) have lanes of their
//! own.
//!
//! The node serves each bundled request with the handler its own RPC would have reached and
//! answers it with the same reply or the same status, so the router's retries and error
//! mapping see no difference. A bundle that fails as a whole (the connection, the request
//! timeout) fails each of its requests with that status, as their own RPCs would have. A
//! node that does not know the RPC answers `Unimplemented`; its requests are then asked to
//! retry, and from then on travel on their own.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use talon_model::TalonError;
use talon_proto::v1 as pb;
use talon_proto::v1::bundled_reply::Reply;
use talon_proto::v1::bundled_request::Request as Req;
use talon_proto::v1::namespace_client::NamespaceClient;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// What one bundled request ends with.
pub(crate) type Answer = Result<Reply, Status>;

/// Requests of like latency, bundled together.
#[derive(Clone, Copy)]
enum Lane {
    RelaxedRead = 0,
    StrictRead = 1,
    Write = 2,
}

fn lane_of(req: &Req) -> Lane {
    let relaxed = |h: &Option<pb::RequestHeader>| h.as_ref().is_some_and(|h| h.relaxed_read);
    match req {
        Req::Lookup(q) if relaxed(&q.header) => Lane::RelaxedRead,
        Req::GetAttr(q) if relaxed(&q.header) => Lane::RelaxedRead,
        Req::Lookup(_) | Req::GetAttr(_) => Lane::StrictRead,
        Req::Create(_) | Req::Remove(_) => Lane::Write,
    }
}

/// One lane's RPCs under way and the requests waiting for one of them to return.
#[derive(Default)]
struct Queue {
    in_flight: usize,
    waiting: Vec<(Req, oneshot::Sender<Answer>)>,
}

/// Bundles the small requests of one client to one node (module docs).
pub struct Bundler {
    client: NamespaceClient<Channel>,
    rt: tokio::runtime::Handle,
    /// RPCs of one lane in flight at once.
    window: usize,
    /// Most requests in one bundle: the cluster map's `max_batch`, which the node enforces
    /// (the router keeps it current).
    max: Arc<AtomicUsize>,
    /// Set once the node answered that it has no `Bundle` RPC.
    unsupported: AtomicBool,
    lanes: [Mutex<Queue>; 3],
    /// Bundles sent, and the requests they carried.
    bundles: AtomicU64,
    bundled: AtomicU64,
}

impl std::fmt::Debug for Bundler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundler")
            .field("window", &self.window)
            .field("max", &self.max.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Bundler {
    /// A bundler of the requests sent through `channel`, `window` RPCs in flight per lane,
    /// at most `max` requests per bundle; none when `window` is 0 or there is no runtime to
    /// send bundles from.
    pub fn new(channel: Channel, window: usize, max: Arc<AtomicUsize>) -> Option<Arc<Bundler>> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        (window > 0).then(|| {
            Arc::new(Bundler {
                client: NamespaceClient::new(channel),
                rt,
                window,
                max,
                unsupported: AtomicBool::new(false),
                lanes: Default::default(),
                bundles: AtomicU64::new(0),
                bundled: AtomicU64::new(0),
            })
        })
    }

    /// The bundles sent so far, and the requests they carried.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.bundles.load(Ordering::Relaxed),
            self.bundled.load(Ordering::Relaxed),
        )
    }

    fn queue(&self, lane: Lane) -> MutexGuard<'_, Queue> {
        match self.lanes[lane as usize].lock() {
            Ok(q) => q,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Sends `req` on its own if its lane has room, or else in the next bundle.
    pub(crate) async fn send(self: &Arc<Self>, req: Req) -> Answer {
        if self.unsupported.load(Ordering::Relaxed) {
            return alone(self.client.clone(), req).await;
        }
        let lane = lane_of(&req);
        let turn = {
            let mut q = self.queue(lane);
            if q.in_flight < self.window && q.waiting.is_empty() {
                q.in_flight += 1;
                Turn::Now(req)
            } else {
                let (tx, rx) = oneshot::channel();
                q.waiting.push((req, tx));
                Turn::Bundled(rx)
            }
        };
        match turn {
            Turn::Bundled(rx) => rx
                .await
                .unwrap_or_else(|_| Err(Status::unavailable("the bundle was dropped"))),
            Turn::Now(req) => {
                // Frees the slot however this ends, a caller's timeout dropping it included.
                let _slot = Slot {
                    bundler: self.clone(),
                    lane,
                };
                alone(self.client.clone(), req).await
            }
        }
    }

    /// A slot of `lane` came free: it goes to the requests waiting, if any.
    fn release(self: &Arc<Self>, lane: Lane) {
        let mut q = self.queue(lane);
        if q.waiting.is_empty() {
            q.in_flight = q.in_flight.saturating_sub(1);
            return;
        }
        let take = q.waiting.len().min(self.max.load(Ordering::Relaxed));
        let batch: Vec<_> = q.waiting.drain(..take).collect();
        drop(q);
        let slot = Slot {
            bundler: self.clone(),
            lane,
        };
        self.rt.spawn(async move {
            slot.bundler.run(batch).await;
            drop(slot);
        });
    }

    /// Sends `batch` and answers each of its requests.
    async fn run(&self, batch: Vec<(Req, oneshot::Sender<Answer>)>) {
        // A caller that gave up (its deadline) needs no answer.
        let (reqs, txs): (Vec<Req>, Vec<_>) =
            batch.into_iter().filter(|(_, tx)| !tx.is_closed()).unzip();
        if reqs.len() <= 1 {
            if let (Some(req), Some(tx)) = (reqs.into_iter().next(), txs.into_iter().next()) {
                let _ = tx.send(alone(self.client.clone(), req).await);
            }
            return;
        }
        let n = reqs.len();
        self.bundles.fetch_add(1, Ordering::Relaxed);
        self.bundled.fetch_add(n as u64, Ordering::Relaxed);
        let bundle = pb::BundleRequest {
            requests: reqs
                .into_iter()
                .map(|r| pb::BundledRequest { request: Some(r) })
                .collect(),
        };
        let answers: Vec<Answer> = match self.client.clone().bundle(bundle).await {
            Ok(reply) => {
                let replies = reply.into_inner().replies;
                if replies.len() == n {
                    replies.into_iter().map(answer).collect()
                } else {
                    let s = Status::internal(format!(
                        "a bundle of {n} requests got {} answers",
                        replies.len()
                    ));
                    vec![Err(s); n]
                }
            }
            Err(s) if s.code() == Code::Unimplemented => {
                self.unsupported.store(true, Ordering::Relaxed);
                let s = Status::from(TalonError::Retry(
                    "the node serves no bundles; sending requests on their own".into(),
                ));
                vec![Err(s); n]
            }
            Err(s) => vec![Err(s); n],
        };
        for (tx, a) in txs.into_iter().zip(answers) {
            let _ = tx.send(a);
        }
    }
}

/// When a request leaves: now, on its own RPC, or in a later bundle.
enum Turn {
    Now(Req),
    Bundled(oneshot::Receiver<Answer>),
}

/// One RPC slot of a lane, given back on drop.
struct Slot {
    bundler: Arc<Bundler>,
    lane: Lane,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.bundler.release(self.lane);
    }
}

/// The answer to one request of a bundle.
fn answer(r: pb::BundledReply) -> Answer {
    match r.reply {
        Some(Reply::Status(s)) => Err(Status::with_details(
            Code::from(s.code),
            s.message,
            s.details.into(),
        )),
        Some(r) => Ok(r),
        None => Err(Status::internal("a bundled request got no answer")),
    }
}

/// `req` as its own RPC.
async fn alone(mut c: NamespaceClient<Channel>, req: Req) -> Answer {
    match req {
        Req::Lookup(q) => c.lookup(q).await.map(|r| Reply::Entry(r.into_inner())),
        Req::GetAttr(q) => c.get_attr(q).await.map(|r| Reply::Attr(r.into_inner())),
        Req::Create(q) => c.create(q).await.map(|r| Reply::Entry(r.into_inner())),
        Req::Remove(q) => c.remove(q).await.map(|r| Reply::Remove(r.into_inner())),
    }
}
