//! A worker's session with one queue replica: one Work stream.
//!
//! ```text
//!  open: hello(worker id, controllers) + credit(n) ─► queue
//!  next() ◄─ Event::Lease | Applied | Refused | Extended ◄─ queue
//!  Replies (cloned into each reconcile): complete(lease, outcome) / extend(lease, by) / credit(n)
//!  close(): half-close; the queue applies the outcomes sent, returns the leases not answered
//! ```
//!
//! Credits are how many leases the queue may send before the worker grants more; one
//! message grants at most [`MAX_CREDIT`], so larger grants go as several messages.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use switchyard_proto::queue::v1::{WorkRequest, WorkResponse, queue_client::QueueClient};
use switchyard_runtime::{Dialer, Role, trace::TraceFields};
use switchyard_work::{MAX_CREDIT, WorkKey};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::{Error, Result, convert};

/// A key leased to this worker: reconcile it, then answer with an [`Outcome`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub key: WorkKey,
    pub shard: u32,
    /// The shard's fencing epoch when the lease was granted; the answer echoes it.
    pub epoch: u64,
    /// Identifies the lease; the answer echoes it.
    pub id: String,
    /// 1 for the first attempt since the key's failures were last forgotten.
    pub attempt: u32,
    /// When the lease expires unless extended or answered.
    pub deadline: Option<SystemTime>,
    /// When the key was queued.
    pub queued_at: Option<SystemTime>,
    /// When the watcher received the event behind the oldest add the lease covers (the
    /// watcher's clock); none when no event caused it.
    pub observed_at: Option<SystemTime>,
    /// Trace contexts of the adds the lease covers, oldest first.
    pub causes: Vec<TraceFields>,
    /// Causes the queue dropped beyond those it keeps.
    pub causes_dropped: u32,
    /// The queue's lease span, the parent of the reconcile's; empty when not traced.
    pub trace_context: TraceFields,
    /// The shard's read floor: read each kind at least at these cache versions.
    pub read_floor: ReadFloor,
    /// How long the queue replica had served the shard when it granted the lease; none from
    /// a queue that does not say. A floor of a shard that moved lately may lack the previous
    /// owner's last writes.
    pub shard_held_for: Option<Duration>,
}

/// Per kind ("group/version/Kind", "v1/Pod" for the core group), a cache resourceVersion.
pub type Versions = BTreeMap<String, u64>;

/// A lease's read floor, or what a reconcile read at: per kind over every namespace, and per
/// kind in the lease key's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadFloor {
    pub kinds: Versions,
    pub namespace: Versions,
}

impl ReadFloor {
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty() && self.namespace.is_empty()
    }
}

impl Lease {
    /// How long the lease has left, if it has a deadline still ahead.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .and_then(|deadline| deadline.duration_since(SystemTime::now()).ok())
            .filter(|d| !d.is_zero())
    }
}

/// How a reconcile ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Reconciled; the queue forgets the key's failures.
    Done,
    /// Reconciled; look again after the delay.
    RequeueAfter(Duration),
    /// Failed for this reason (logged, and kept as the key's last error by the queue for
    /// `DescribeKey`): retried with backoff.
    Failed(String),
    /// Drop the key and its failures without requeueing.
    Forget,
}

/// What the queue sent on a work stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Lease(Box<Lease>),
    /// The outcome of the lease was applied.
    Applied {
        lease_id: String,
    },
    /// The outcome was refused (the lease expired, or its shard moved; the key is the
    /// queue's again), or the outcome or extension named a lease another stream holds.
    Refused {
        lease_id: String,
        reason: String,
    },
    Extended {
        lease_id: String,
        deadline: Option<SystemTime>,
    },
}

/// The sending half of a work stream; clone it into the tasks that answer leases.
#[derive(Clone, Debug)]
pub struct Replies {
    tx: UnboundedSender<WorkRequest>,
}

impl Replies {
    fn send(&self, request: WorkRequest) -> Result<()> {
        self.tx.send(request).map_err(|_| Error::Closed)
    }

    /// Answers a lease; `took` is how long the reconcile ran.
    pub fn complete(&self, lease: &Lease, outcome: Outcome, took: Duration) -> Result<()> {
        self.complete_observed(lease, outcome, took, &ReadFloor::default())
    }

    /// Answers a lease with the cache versions the reconcile read at, which raise its
    /// shard's read floor.
    pub fn complete_observed(
        &self,
        lease: &Lease,
        outcome: Outcome,
        took: Duration,
        observed: &ReadFloor,
    ) -> Result<()> {
        self.send(convert::outcome(lease, outcome, took, observed))
    }

    /// Extends a lease to `by` from now.
    pub fn extend(&self, lease: &Lease, by: Duration) -> Result<()> {
        self.send(convert::extend(lease, by))
    }

    /// Lets the queue send `items` more leases.
    pub fn credit(&self, mut items: u32) -> Result<()> {
        while items > 0 {
            let grant = items.min(MAX_CREDIT);
            self.send(convert::credit(grant))?;
            items -= grant;
        }
        Ok(())
    }
}

/// One Work stream to a queue replica.
#[derive(Debug)]
pub struct WorkSession {
    inbound: tonic::Streaming<WorkResponse>,
    replies: Replies,
}

impl WorkSession {
    /// Connects to the queue replica at `address` (`host:port`) through `dialer`, says who
    /// the worker is and which controllers it reconciles (empty: all), and grants `credits`
    /// leases.
    pub async fn open(
        dialer: &Dialer,
        address: &str,
        worker_id: &str,
        controllers: Vec<String>,
        credits: u32,
    ) -> Result<Self> {
        let channel = dialer
            .connect(&crate::endpoint(dialer, address)?, Role::Queue)
            .await
            .map_err(|error| Error::Unavailable(error.to_string()))?;
        let (tx, rx) = unbounded_channel();
        let replies = Replies { tx };
        replies.send(convert::hello(worker_id, controllers))?;
        replies.credit(credits)?;
        let inbound = QueueClient::new(channel)
            .work(UnboundedReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Self { inbound, replies })
    }

    /// The sending half, for the tasks that answer leases.
    pub fn replies(&self) -> &Replies {
        &self.replies
    }

    /// The next event; `None` when the queue ended the stream.
    pub async fn next(&mut self) -> Result<Option<Event>> {
        loop {
            let Some(response) = self.inbound.message().await? else {
                return Ok(None);
            };
            if let Some(event) = convert::event(response) {
                return Ok(Some(event));
            }
        }
    }

    /// Half-closes the stream (once every clone of [`Replies`] is gone too) and reads what
    /// the queue still sends for at most `wait`: the acknowledgements of the last outcomes,
    /// until the queue ends the stream.
    pub async fn close(self, wait: Duration) {
        let Self {
            mut inbound,
            replies,
        } = self;
        drop(replies);
        let _ = tokio::time::timeout(wait, async {
            while let Ok(Some(_)) = inbound.message().await {}
        })
        .await;
    }
}
