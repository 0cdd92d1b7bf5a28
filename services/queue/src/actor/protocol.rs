//! What the gRPC handlers and the actor say to each other: the commands, the replies, and
//! the [`Handle`] that sends them.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use switchyard_queue_core::{
    ControllerId, KeyPhase, LastOutcome, Lease, LeaseId, Origin, Outcome, Priority, ReadFloor,
    Refused, ShardStats, ValidKey, WorkerId,
};
use tokio::sync::{mpsc, oneshot};

/// An add, validated by the gRPC edge (the key carries its controller and shard).
#[derive(Debug)]
pub struct Add {
    pub key: ValidKey,
    pub priority: Priority,
    pub delay: Duration,
    /// What caused the add (its trace context, when its event was observed), kept with the
    /// key.
    pub origin: Origin,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Added {
    pub added: u32,
    pub coalesced: u32,
}

/// What the actor sends a worker's stream.
#[derive(Debug)]
pub enum ToWorker {
    Item(Lease),
    Ack {
        lease: LeaseId,
        result: Result<(), Refused>,
    },
    Extended {
        lease: LeaseId,
        result: Result<Instant, Refused>,
    },
    /// A message of the worker was invalid; its stream ends with INVALID_ARGUMENT.
    Invalid(String),
}

/// Why a batch was refused: its shard is not served here. Nothing of it is applied, except
/// when ownership moves mid-batch (after some keys were added; the sender resends the batch
/// and the added keys coalesce). The edge checked every key before (each hashes to `shard`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnqueueError {
    #[error("shard {shard} is not served by this replica")]
    NotOwner { shard: u32 },
    /// The queue is full and as many batches as it holds already wait for room.
    #[error("the queue is full and {waiting} batches already wait for room; retry later")]
    Busy { waiting: usize },
}

pub(super) type EnqueueReply = oneshot::Sender<Result<Added, EnqueueError>>;

/// The keys failing now, with their views, and how many fail in all.
pub(super) type FailingKeys = (Vec<(ValidKey, Described)>, usize);

/// A worker's outcome, as [`Command::Complete`] carries it.
#[derive(Debug)]
pub struct Completion {
    pub shard: u32,
    pub epoch: u64,
    pub lease: LeaseId,
    pub outcome: Outcome,
    /// What the reconcile read at: raises the shard's read floor once applied.
    pub observed: ReadFloor,
    /// A failed reconcile's reason.
    pub error: Option<String>,
}

#[derive(Debug)]
pub enum Command {
    Enqueue {
        shard: u32,
        adds: Vec<Add>,
        reply: EnqueueReply,
    },
    Connect {
        /// The worker_id of its hello.
        name: Arc<str>,
        controllers: Vec<ControllerId>,
        tx: mpsc::UnboundedSender<ToWorker>,
        reply: oneshot::Sender<WorkerId>,
    },
    /// The edge refused a message of this worker's stream; the stream ends with this reason.
    Invalid {
        worker: WorkerId,
        reason: String,
    },
    Credit {
        worker: WorkerId,
        items: u32,
    },
    Complete {
        worker: WorkerId,
        done: Completion,
    },
    Extend {
        worker: WorkerId,
        shard: u32,
        epoch: u64,
        lease: LeaseId,
        by: Duration,
    },
    Disconnect {
        worker: WorkerId,
        /// A clean close returns the worker's leases at once; a broken stream leaves them to
        /// expire (the worker may still be reconciling them).
        clean: bool,
    },
    Stats {
        controller: Option<ControllerId>,
        reply: oneshot::Sender<Vec<ShardStats>>,
    },
    /// The Work streams open now.
    Workers {
        reply: oneshot::Sender<Vec<WorkerView>>,
    },
    /// One key now; `None` when its shard is not served here.
    Describe {
        key: ValidKey,
        reply: oneshot::Sender<Option<Described>>,
    },
    /// The keys with failures not yet forgotten (`Queue::failing`), and how many in all.
    Failing {
        controller: Option<ControllerId>,
        limit: usize,
        reply: oneshot::Sender<FailingKeys>,
    },
    /// Serve `shard` at `epoch` (starting empty).
    Acquire {
        shard: u32,
        epoch: u64,
    },
    /// Serve `shard` again at `epoch`, written by this member's renewal of `from`: with the
    /// keys kept since it was suspended at `from`, if it was.
    Resume {
        shard: u32,
        from: u64,
        epoch: u64,
    },
    /// Stop serving `shard` for now, keeping its keys.
    Suspend {
        shard: u32,
    },
    /// Stop leasing `shard`; in-flight outcomes still count.
    Drain {
        shard: u32,
    },
    /// Stop serving `shard` entirely.
    Release {
        shard: u32,
    },
    /// Leases in flight in `shard`.
    InFlight {
        shard: u32,
        reply: oneshot::Sender<usize>,
    },
}

/// The sending side, cloned into every handler.
#[derive(Clone, Debug)]
pub struct Handle {
    pub(super) tx: mpsc::Sender<Command>,
}

#[derive(Debug, thiserror::Error)]
#[error("the queue is shutting down")]
pub struct Closed;

impl Handle {
    /// Sends `command`, waiting while the actor's queue of commands is full.
    pub async fn send(&self, command: Command) -> Result<(), Closed> {
        self.tx.send(command).await.map_err(|_| Closed)
    }

    pub async fn enqueue(
        &self,
        shard: u32,
        adds: Vec<Add>,
    ) -> Result<Result<Added, EnqueueError>, Closed> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Enqueue { shard, adds, reply }).await?;
        rx.await.map_err(|_| Closed)
    }

    pub async fn connect(
        &self,
        name: Arc<str>,
        controllers: Vec<ControllerId>,
        tx: mpsc::UnboundedSender<ToWorker>,
    ) -> Result<WorkerId, Closed> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Connect {
            name,
            controllers,
            tx,
            reply,
        })
        .await?;
        rx.await.map_err(|_| Closed)
    }

    pub async fn in_flight(&self, shard: u32) -> Result<usize, Closed> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::InFlight { shard, reply }).await?;
        rx.await.map_err(|_| Closed)
    }

    pub async fn stats(&self, controller: Option<ControllerId>) -> Result<Vec<ShardStats>, Closed> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Stats { controller, reply }).await?;
        rx.await.map_err(|_| Closed)
    }

    pub async fn workers(&self) -> Result<Vec<WorkerView>, Closed> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Workers { reply }).await?;
        rx.await.map_err(|_| Closed)
    }

    pub async fn describe(&self, key: ValidKey) -> Result<Option<Described>, Closed> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Describe { key, reply }).await?;
        rx.await.map_err(|_| Closed)
    }

    pub async fn failing(
        &self,
        controller: Option<ControllerId>,
        limit: usize,
    ) -> Result<(Vec<(ValidKey, Described)>, usize), Closed> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Failing {
            controller,
            limit,
            reply,
        })
        .await?;
        rx.await.map_err(|_| Closed)
    }
}

/// One open Work stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerView {
    pub name: Arc<str>,
    pub controllers: Vec<ControllerId>,
    /// Items granted and not yet sent.
    pub credits: u32,
    pub in_flight: usize,
    /// Outcomes accepted from it.
    pub finished: u64,
}

/// A key now, with its workers named (the core knows them by number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    pub epoch: u64,
    pub phase: KeyPhase,
    /// The worker holding the lease, when leased.
    pub holder: Option<Arc<str>>,
    pub failures: u32,
    /// The latest outcome, with the name of the worker that held that lease.
    pub last: Option<(LastOutcome, Option<Arc<str>>)>,
}
