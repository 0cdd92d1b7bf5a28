//! Shard ownership, in one place for every service.
//!
//! ```text
//!                       etcd                                   elector (leader)
//!   /switchyard/members/<id>  ◄── member::join (queue replica)     │ plans with
//!   /switchyard/shards/<n>    ◄── store::{release, renew}          │ switchyard-elector-core,
//!         │                        (queue replica, fenced)         │ writes the map (fenced)
//!         └──────────────────────────────────────────────────────► │
//!                                                                  ▼
//!                                                  WatchShardMap (gRPC stream)
//!                                                                  │
//!       follow::follow_elector ──► ShardView (active owner per shard): watcher, reconciler
//!       follow::follow_elector_as(member_view) ──► every shard's state: queue member
//! ```
//!
//! - [`view`]: [`ShardView`], the active owner of each shard, and [`STATIC_EPOCH`] for the one
//!   static queue that serves every shard without an elector;
//! - [`follow`]: the one follower of the elector's `WatchShardMap` stream;
//! - [`route`]: where a client of the queue finds it (`--queue-addr` or `--elector-addr`);
//! - [`access`]: etcd's users and roles: who may read and write which of these prefixes;
//! - [`draining`]: members an operator marked draining, which the leader gives no shards;
//! - [`member`]: a queue replica's registration under its own etcd lease;
//! - [`store`]: the map's layout in etcd and the two writes a member makes itself: the fenced
//!   release of a drained shard and the renewal of an epoch from an earlier registration.
//!
//! The shard states and the rules for both sides (the leader's plan, a member's step) are pure
//! code in `switchyard-elector-core`, re-exported here.

pub mod access;
pub mod draining;
pub mod etcd;
pub mod follow;
pub mod member;
pub mod route;
pub mod store;
pub mod view;

pub use etcd::{Etcd, EtcdConfigError, EtcdTlsArgs};
pub use follow::{FollowError, follow_elector, follow_elector_as, member_view};
pub use route::{NoRoute, Route};
pub use switchyard_ownership::{MemberId, ReleaseError, ShardState};
pub use view::{Owner, STATIC_EPOCH, ShardView};
