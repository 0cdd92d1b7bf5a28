//! `kubectl switchyard drain <member>`: marks a queue replica draining (the elector's
//! `DrainMember`), then follows the map until the replica holds no shard. Each shard leaves
//! by the planned handover: the replica stops leasing it, lets its leases finish (bounded by
//! its --drain-grace), and hands it to its next owner.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde::Serialize;
use switchyard_proto::elector::v1::{DrainMemberRequest, ShardMap, ShardState};

use crate::{
    DRAIN_POLL,
    connect::{Connections, Error, Result, call},
    render::{Style, Table, human},
};

#[derive(Debug, Serialize)]
pub struct Drained {
    pub member: String,
    /// The mark was cleared (`--undo`) rather than set.
    pub undo: bool,
    /// Shards it held when the mark was written.
    pub shards_before: u32,
    /// Where those shards went, by new owner.
    pub moved_to: BTreeMap<String, u32>,
    pub seconds: f64,
}

fn held_by<'a>(map: &'a ShardMap, member: &'a str) -> impl Iterator<Item = u32> + 'a {
    map.shards
        .iter()
        .filter(move |s| s.member_id == member && s.state() != ShardState::Unassigned)
        .map(|s| s.shard)
}

pub async fn run(
    connections: &Connections,
    member: &str,
    undo: bool,
    timeout: Duration,
) -> Result<Drained> {
    let start = Instant::now();
    let (_, before) = connections.shard_map().await?;
    let held: Vec<u32> = held_by(&before, member).collect();
    let (address, mut elector) = connections.elector().await?;
    call(
        "elector",
        &address,
        "DrainMember",
        connections.timeout,
        async {
            elector
                .drain_member(DrainMemberRequest {
                    member_id: member.to_owned(),
                    undo,
                })
                .await
        },
    )
    .await?;
    if undo {
        return Ok(Drained {
            member: member.to_owned(),
            undo,
            shards_before: held.len() as u32,
            moved_to: BTreeMap::new(),
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    let deadline = start + timeout;
    loop {
        let (_, map) = connections.shard_map().await?;
        let still: Vec<u32> = held_by(&map, member).collect();
        if still.is_empty() {
            let mut moved_to = BTreeMap::new();
            for shard in &held {
                if let Some(s) = map.shards.get(*shard as usize) {
                    *moved_to.entry(s.member_id.clone()).or_insert(0) += 1;
                }
            }
            return Ok(Drained {
                member: member.to_owned(),
                undo,
                shards_before: held.len() as u32,
                moved_to,
                seconds: start.elapsed().as_secs_f64(),
            });
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout(format!(
                "member {member:?} still holds {} shard(s) after {:?} (for example shard {}); \
                 it stays marked draining: run drain again to keep waiting, or --undo",
                still.len(),
                timeout,
                still[0]
            )));
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

pub fn table(drained: &Drained, style: Style) -> String {
    if drained.undo {
        return format!(
            "member {} is no longer draining; it gets shards again\n",
            drained.member
        );
    }
    let mut out = format!(
        "member {} drained: {} shard(s) moved in {}\n",
        drained.member,
        drained.shards_before,
        human(drained.seconds)
    );
    if !drained.moved_to.is_empty() {
        let mut t = Table::new(&["NOW SERVED BY", "SHARDS"]);
        for (owner, count) in &drained.moved_to {
            t.row(vec![owner.as_str().into(), (*count).into()]);
        }
        out.push_str(&t.render(style));
    }
    out
}
