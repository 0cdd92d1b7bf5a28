//! Both sides of the protocol together: the leader's plan and each member's step, driven by
//! random interleavings of leader rounds, member steps, crashes and rejoins, against a small
//! model of etcd (one revision counter, the map, the registrations).
//!
//! Checked after every operation: no shard is served by two members at once, a member
//! serves a shard only at an epoch written after its current registration (so every fresh
//! start of a shard has an epoch of its own), and a member resumes a shard with the keys it
//! kept only if no other member was given the shard since it suspended it. Checked at the end: once the leader and the
//! members have run without faults, every shard is served by its desired owner, at the epoch
//! the map names, and by no one else.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use switchyard_elector_core::{
    MemberId, ShardState, Transition, assign,
    member::{DrainProgress, Effect, Local, handed_over, renewed, step, want},
    plan, released, renewable,
};

const SHARDS: u32 = 12;
const SLACK: u32 = 1;
const IDS: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
enum Op {
    Leader,
    Step {
        member: usize,
        idle: bool,
        grace_over: bool,
    },
    Crash(usize),
    Join(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Leader),
        6 => (0..IDS.len(), any::<bool>(), any::<bool>())
            .prop_map(|(member, idle, grace_over)| Op::Step { member, idle, grace_over }),
        1 => (0..IDS.len()).prop_map(Op::Crash),
        2 => (0..IDS.len()).prop_map(Op::Join),
    ]
}

#[derive(Debug)]
struct Member {
    id: MemberId,
    /// The revision of this member's registration while it holds its lease.
    registered: Option<i64>,
    local: Vec<Option<Local>>,
    /// Per shard, the epoch it serves at (set by Acquire, cleared by Stop).
    serving: Vec<Option<u64>>,
    /// Per shard, the keys kept since a Suspend: the epoch they are of, and how many times
    /// the shard had changed owner then.
    kept: Vec<Option<(u64, u64)>>,
}

#[derive(Debug)]
struct World {
    revision: i64,
    map: Vec<ShardState>,
    members: Vec<Member>,
    now: Instant,
    /// Per shard, how many writes gave it to another owner (the leader's transitions and
    /// hand-overs; not renewals, which keep the owner).
    owner_changes: Vec<u64>,
    /// Resumes of keys kept across a change of owner.
    violations: Vec<String>,
}

impl World {
    fn new() -> Self {
        Self {
            revision: 1,
            map: vec![ShardState::Unassigned; SHARDS as usize],
            members: IDS
                .iter()
                .map(|id| Member {
                    id: (*id).to_owned(),
                    registered: None,
                    local: vec![None; SHARDS as usize],
                    serving: vec![None; SHARDS as usize],
                    kept: vec![None; SHARDS as usize],
                })
                .collect(),
            now: Instant::now(),
            owner_changes: vec![0; SHARDS as usize],
            violations: Vec::new(),
        }
    }

    fn write(&mut self) -> u64 {
        self.revision += 1;
        u64::try_from(self.revision).expect("revisions are positive")
    }

    fn alive(&self) -> Vec<MemberId> {
        self.members
            .iter()
            .filter(|m| m.registered.is_some())
            .map(|m| m.id.clone())
            .collect()
    }

    fn leader(&mut self) {
        let alive = self.alive();
        let Some(desired) = assign(SHARDS, &alive, SLACK) else {
            return;
        };
        for transition in plan(&self.map, &desired, &alive) {
            let epoch = self.write();
            let shard = match &transition {
                Transition::Activate { shard, .. } | Transition::Release { shard, .. } => *shard,
            };
            self.owner_changes[shard as usize] += 1;
            match transition {
                Transition::Activate { shard, owner, .. } => {
                    self.map[shard as usize] = ShardState::Active { owner, epoch };
                }
                Transition::Release { shard, owner, next } => {
                    let kept = match &self.map[shard as usize] {
                        ShardState::Active { epoch, .. } | ShardState::Releasing { epoch, .. } => {
                            *epoch
                        }
                        ShardState::Unassigned => 0,
                    };
                    self.map[shard as usize] = ShardState::Releasing {
                        owner,
                        epoch: kept,
                        next,
                    };
                }
            }
        }
    }

    fn step(&mut self, index: usize, drain: DrainProgress) {
        self.now += Duration::from_millis(10);
        for shard in 0..SHARDS {
            let s = shard as usize;
            let member = &self.members[index];
            let wanted = want(&member.id, member.registered, Some(&self.map[s]));
            let held = member.registered.is_some();
            let next = step(member.local[s], wanted, held, drain, self.now);
            let mut local = next.local;
            for effect in next.effects {
                let changes = self.owner_changes[s];
                let member = &mut self.members[index];
                match effect {
                    Effect::Acquire(epoch) => {
                        member.serving[s] = Some(epoch);
                        member.kept[s] = None;
                    }
                    Effect::Resume { from, epoch } => {
                        if member.kept[s] != Some((from, changes)) {
                            self.violations.push(format!(
                                "{} resumed shard {shard} from epoch {from} with keys {:?}, \
                                 the shard having changed owner {changes} times",
                                member.id, member.kept[s]
                            ));
                        }
                        member.serving[s] = Some(epoch);
                        member.kept[s] = None;
                    }
                    Effect::Suspend => {
                        member.kept[s] = member.serving[s].take().map(|epoch| (epoch, changes));
                    }
                    Effect::Discard => member.kept[s] = None,
                    Effect::Drain(_) => {}
                    Effect::Stop { .. } => {
                        member.serving[s] = None;
                        member.kept[s] = None;
                    }
                    Effect::Renew(epoch) => {
                        let id = member.id.clone();
                        let ok = renewable(&self.map[s], shard, &id, epoch).is_ok();
                        let written = ok.then(|| self.write());
                        if let Some(epoch) = written {
                            self.map[s] = ShardState::Active { owner: id, epoch };
                        }
                        local = renewed(local, written);
                    }
                    Effect::HandOver(epoch) => {
                        let id = self.members[index].id.clone();
                        let next = released(&self.map[s], shard, &id, epoch);
                        if let Ok(owner) = &next {
                            self.owner_changes[s] += 1;
                            let epoch = self.write();
                            self.map[s] = ShardState::Active {
                                owner: owner.clone(),
                                epoch,
                            };
                        }
                        local = handed_over(epoch, next.is_ok());
                    }
                }
            }
            self.members[index].local[s] = local;
        }
    }

    /// The member notices its lease may have expired before etcd expires it (it counts from
    /// the renewal's send), so it stops serving first; then its registration is gone.
    fn crash(&mut self, index: usize) {
        self.members[index].registered = None;
        self.step(
            index,
            DrainProgress {
                idle: true,
                grace_over: false,
            },
        );
    }

    fn join(&mut self, index: usize) {
        if self.members[index].registered.is_none() {
            let revision = i64::try_from(self.write()).expect("revisions fit");
            self.members[index].registered = Some(revision);
        }
    }

    fn check_safety(&self) -> Result<(), TestCaseError> {
        prop_assert!(self.violations.is_empty(), "{:?}", self.violations);
        for shard in 0..SHARDS as usize {
            let servers: Vec<&str> = self
                .members
                .iter()
                .filter(|m| m.serving[shard].is_some())
                .map(|m| m.id.as_str())
                .collect();
            prop_assert!(servers.len() <= 1, "shard {shard} served by {servers:?}");
            for m in &self.members {
                prop_assert_eq!(
                    m.serving[shard].is_some(),
                    m.local[shard].is_some_and(Local::served),
                    "{} shard {}: the actor and the step disagree",
                    &m.id,
                    shard
                );
                if let (Some(epoch), Some(registered)) = (m.serving[shard], m.registered) {
                    prop_assert!(
                        i64::try_from(epoch).is_ok_and(|e| e > registered),
                        "{} serves shard {} at epoch {} from before its registration {}",
                        &m.id,
                        shard,
                        epoch,
                        registered
                    );
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_shard_is_ever_served_twice_and_every_shard_settles(ops in prop::collection::vec(op(), 1..120)) {
        let mut world = World::new();
        for op in ops {
            match op {
                Op::Leader => world.leader(),
                Op::Step { member, idle, grace_over } => {
                    world.step(member, DrainProgress { idle, grace_over });
                }
                Op::Crash(member) => world.crash(member),
                Op::Join(member) => world.join(member),
            }
            world.check_safety()?;
        }

        // Without faults, the leader and the members settle on the desired assignment.
        let alive = world.alive();
        let idle = DrainProgress { idle: true, grace_over: false };
        for _ in 0..8 {
            world.leader();
            for member in 0..IDS.len() {
                world.step(member, idle);
            }
            world.check_safety()?;
        }
        let Some(desired) = assign(SHARDS, &alive, SLACK) else {
            return Ok(());
        };
        for (shard, owner) in desired.iter().enumerate() {
            let ShardState::Active { owner: active, epoch } = &world.map[shard] else {
                return Err(TestCaseError::fail(format!("shard {shard} not active: {:?}", world.map[shard])));
            };
            prop_assert_eq!(active, owner);
            for m in &world.members {
                let expected = (&m.id == owner).then_some(*epoch);
                prop_assert_eq!(m.serving[shard], expected, "{} shard {}", &m.id, shard);
            }
        }
    }
}
