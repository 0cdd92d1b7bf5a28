//! Assignment properties over random member sets: balanced, deterministic, and a membership
//! change moves few shards.

use std::collections::HashMap;

use proptest::prelude::*;
use switchyard_elector_core::{MemberId, assign};

const SHARDS: u32 = 256;
const SLACK: u32 = 1;

fn load(owners: &[MemberId]) -> HashMap<&str, u32> {
    let mut load = HashMap::new();
    for o in owners {
        *load.entry(o.as_str()).or_insert(0) += 1;
    }
    load
}

fn moved(a: &[MemberId], b: &[MemberId]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

fn member_set() -> impl Strategy<Value = Vec<MemberId>> {
    prop::collection::btree_set("[a-z]{3,12}-[0-9]{1,3}", 1..12)
        .prop_map(|s| s.into_iter().collect())
}

proptest! {
    #[test]
    fn balanced_and_deterministic(members in member_set()) {
        let owners = assign(SHARDS, &members, SLACK).unwrap();
        let cap = SHARDS.div_ceil(members.len() as u32) + SLACK;
        let load = load(&owners);
        prop_assert!(load.values().all(|l| *l <= cap), "{:?} above cap {}", load, cap);
        prop_assert!(owners.iter().all(|o| members.contains(o)));
        // The same member set in any order gives the same assignment.
        let mut reversed = members.clone();
        reversed.reverse();
        prop_assert_eq!(assign(SHARDS, &reversed, SLACK).unwrap(), owners);
    }

    #[test]
    fn a_joining_member_takes_about_its_share(members in member_set(), new in "[a-z]{3,12}-new") {
        let before = assign(SHARDS, &members, SLACK).unwrap();
        let mut more = members.clone();
        more.push(new.clone());
        let after = assign(SHARDS, &more, SLACK).unwrap();
        let fair = SHARDS.div_ceil(more.len() as u32) as usize;
        let moved = moved(&before, &after);
        // Ideal is `fair`; the cap pushes some more along (worst measured: 1.71x, docs/elector.md).
        prop_assert!(moved <= 2 * fair + 4, "moved {} of {}, fair share {}", moved, SHARDS, fair);
        let gained = after.iter().filter(|o| **o == new).count();
        // Bounded loads cap members from above only; from below, the worst case measured over
        // 20,000 random member sets was 0.36 of the fair share (docs/elector.md).
        prop_assert!(gained * 4 >= fair, "new member got {} of fair {}", gained, fair);
    }

    #[test]
    fn a_leaving_member_frees_about_its_own_shards(members in member_set(), pick in any::<prop::sample::Index>()) {
        prop_assume!(members.len() >= 2);
        let gone = members[pick.index(members.len())].clone();
        let before = assign(SHARDS, &members, SLACK).unwrap();
        let rest: Vec<MemberId> = members.iter().filter(|m| **m != gone).cloned().collect();
        let after = assign(SHARDS, &rest, SLACK).unwrap();
        let held = before.iter().filter(|o| **o == gone).count();
        let moved = moved(&before, &after);
        prop_assert!(moved >= held);
        // Ideal is `held` (worst measured: 2x, docs/elector.md).
        prop_assert!(moved <= 2 * held + 4, "moved {}, the member held {}", moved, held);
    }
}
