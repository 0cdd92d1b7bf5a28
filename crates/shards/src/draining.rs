//! Members marked draining by an operator (`Elector.DrainMember`, `kubectl switchyard
//! drain`): the leader gives them no shards, so their shards move away by the planned
//! handover while they keep serving until each is released.
//!
//! ```text
//!  /switchyard/draining/<member id> = <revision of the member's registration>
//! ```
//!
//! A mark names one registration: it holds while `/switchyard/members/<id>` still has that
//! `mod_revision`. A member that restarts registers again (a new revision), so the mark no
//! longer holds and the member gets shards as before; stale marks are removed by the next
//! [`mark`] or [`unmark`]. Only the elector writes here (etcd's access table).

use std::collections::BTreeSet;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};

use crate::member::MEMBERS_PREFIX;

pub const DRAINING_PREFIX: &str = "/switchyard/draining/";

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("member {0:?} is not registered")]
    NotFound(String),
    #[error(
        "member {member:?} is the only member not draining: no other member could take its shards"
    )]
    NoOtherMember { member: String },
    #[error("member {0:?} registered again while it was being marked; try again")]
    Changed(String),
}

/// The registered members with the revision of each registration, and the marks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registrations {
    pub members: Vec<(String, i64)>,
    /// Member id, the revision its mark names, and the mark's own `mod_revision`.
    pub marks: Vec<(String, i64, i64)>,
}

impl Registrations {
    /// Members whose mark names their current registration.
    pub fn draining(&self) -> BTreeSet<String> {
        self.marks
            .iter()
            .filter(|(id, registration, _)| {
                self.members
                    .iter()
                    .any(|(member, revision)| member == id && revision == registration)
            })
            .map(|(id, ..)| id.clone())
            .collect()
    }

    /// Marks that name no current registration.
    fn stale(&self) -> impl Iterator<Item = &(String, i64, i64)> {
        let draining = self.draining();
        self.marks
            .iter()
            .filter(move |(id, ..)| !draining.contains(id))
    }
}

/// Reads the members and the marks.
pub async fn read(client: &mut Client) -> Result<Registrations, DrainError> {
    let prefixed = Some(GetOptions::new().with_prefix());
    let members = client.get(MEMBERS_PREFIX, prefixed.clone()).await?;
    let marks = client.get(DRAINING_PREFIX, prefixed).await?;
    Ok(Registrations {
        members: members
            .kvs()
            .iter()
            .filter_map(|kv| {
                let id = kv.key_str().ok()?.strip_prefix(MEMBERS_PREFIX)?;
                Some((id.to_owned(), kv.mod_revision()))
            })
            .collect(),
        marks: marks
            .kvs()
            .iter()
            .filter_map(|kv| {
                let id = kv.key_str().ok()?.strip_prefix(DRAINING_PREFIX)?;
                let registration = kv.value_str().ok()?.parse().ok()?;
                Some((id.to_owned(), registration, kv.mod_revision()))
            })
            .collect(),
    })
}

fn member_key(id: &str) -> String {
    format!("{MEMBERS_PREFIX}{id}")
}

fn mark_key(id: &str) -> String {
    format!("{DRAINING_PREFIX}{id}")
}

/// Marks `member`'s current registration draining. Refused when it is not registered, or
/// when every other member is draining (its shards would have nowhere to go).
pub async fn mark(client: &mut Client, member: &str) -> Result<(), DrainError> {
    let registrations = read(client).await?;
    let Some((_, revision)) = registrations.members.iter().find(|(id, _)| id == member) else {
        return Err(DrainError::NotFound(member.to_owned()));
    };
    let draining = registrations.draining();
    if !registrations
        .members
        .iter()
        .any(|(id, _)| id != member && !draining.contains(id))
    {
        return Err(DrainError::NoOtherMember {
            member: member.to_owned(),
        });
    }
    let txn = Txn::new()
        .when([Compare::mod_revision(
            member_key(member),
            CompareOp::Equal,
            *revision,
        )])
        .and_then([TxnOp::put(mark_key(member), revision.to_string(), None)]);
    if !client.txn(txn).await?.succeeded() {
        return Err(DrainError::Changed(member.to_owned()));
    }
    remove_stale(client, &registrations).await
}

/// Clears `member`'s mark (and stale ones). Clearing a mark that is not there is no error.
pub async fn unmark(client: &mut Client, member: &str) -> Result<(), DrainError> {
    client.delete(mark_key(member), None).await?;
    let registrations = read(client).await?;
    remove_stale(client, &registrations).await
}

/// Deletes the marks that name no current registration, each only if unchanged since read.
async fn remove_stale(
    client: &mut Client,
    registrations: &Registrations,
) -> Result<(), DrainError> {
    for (id, _, mod_revision) in registrations.stale() {
        let key = mark_key(id);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                *mod_revision,
            )])
            .and_then([TxnOp::delete(key, None)]);
        client.txn(txn).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_holds_for_the_registration_it_names_only() {
        let registrations = Registrations {
            members: vec![("q0".into(), 10), ("q1".into(), 12), ("q2".into(), 30)],
            marks: vec![
                ("q0".into(), 10, 40),
                // q1 registered again (revision 12) after it was marked at revision 11.
                ("q1".into(), 11, 41),
                // q9 is gone.
                ("q9".into(), 5, 42),
            ],
        };
        assert_eq!(
            registrations.draining().into_iter().collect::<Vec<_>>(),
            ["q0"]
        );
        let stale: Vec<&str> = registrations.stale().map(|(id, ..)| id.as_str()).collect();
        assert_eq!(stale, ["q1", "q9"]);
    }
}
