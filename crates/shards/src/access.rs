//! Who may touch Switchyard's keys in etcd: etcd's own RBAC, one role per service that
//! writes there, applied by [`apply`] (the harness's etcd, and the `switchyard-etcd-access`
//! Job of `components/etcd`).
//!
//! etcd runs with `--client-cert-auth`: once auth is enabled, a request without a token is
//! made as the user named by the client certificate's common name. Every Switchyard
//! certificate has its service account as CN (`switchyard-certs`, `components/cert-manager`),
//! so etcd tells the roles apart by CN, not by the SPIFFE URI SAN the services check:
//!
//! ```text
//!  CN switchyard-queue    ─► role switchyard-queue    write     /switchyard/members/
//!                                                     readwrite /switchyard/shards/
//!  CN switchyard-elector  ─► role switchyard-elector  readwrite /switchyard/members/ (reads;
//!                                                               revokes a gone member's lease)
//!                                                     readwrite /switchyard/shards/
//!                                                     readwrite /switchyard/elector/
//!                                                     readwrite /switchyard/draining/
//!  CN switchyard-etcd     ─► root (etcd's own certificate: the one that applies this table)
//!  any other CN           ─► no user: every request refused
//! ```
//!
//! A role is static and members come and go, so etcd cannot hold a member to its own keys:
//! any queue certificate may register any member id and write any shard record (the records
//! are fenced by revision, not by owner). That is the limit of this table.

use etcd_client::{
    Client, Permission, PermissionType, RoleRevokePermissionOptions, UserAddOptions,
};
use tracing::info;

use crate::{draining::DRAINING_PREFIX, member::MEMBERS_PREFIX, store::SHARDS_PREFIX};

/// The etcd election the elector replicas campaign in; its keys are `<ELECTION>/<lease>`.
pub const ELECTION: &str = "/switchyard/elector";

/// The user of etcd's own certificate (its CN), which [`apply`] makes an administrator.
pub const ADMIN: &str = "switchyard-etcd";

/// etcd's built-in administrator role, and the user etcd requires before auth is enabled.
const ROOT: &str = "root";

/// What one prefix allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Write,
    ReadWrite,
}

/// One service's role: its user (the CN of its certificate) and what it may do where.
#[derive(Clone, Copy, Debug)]
pub struct Role {
    pub user: &'static str,
    pub grants: &'static [(&'static str, Access)],
}

/// Queue members register under [`MEMBERS_PREFIX`] (a put with their lease, then its revoke)
/// and hand over or renew their shards under [`SHARDS_PREFIX`] (a read, then a fenced txn).
pub const QUEUE: Role = Role {
    user: "switchyard-queue",
    grants: &[
        (MEMBERS_PREFIX, Access::Write),
        (SHARDS_PREFIX, Access::ReadWrite),
    ],
};

/// The elector campaigns under [`ELECTION`], reads and watches the members (and revokes the
/// lease of a member found gone, which needs write on its key), writes the map, and keeps
/// the operators' draining marks under [`DRAINING_PREFIX`].
pub const ELECTOR: Role = Role {
    user: "switchyard-elector",
    grants: &[
        (MEMBERS_PREFIX, Access::ReadWrite),
        (SHARDS_PREFIX, Access::ReadWrite),
        ("/switchyard/elector/", Access::ReadWrite),
        (DRAINING_PREFIX, Access::ReadWrite),
    ],
};

/// Every role; no other certificate of the installation's CA has a user in etcd.
pub const ROLES: [Role; 2] = [QUEUE, ELECTOR];

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd answered role {role} with a permission of unknown type {value}")]
    UnknownPermission { role: String, value: i32 },
}

impl Access {
    fn permission_type(self) -> PermissionType {
        match self {
            Access::Write => PermissionType::Write,
            Access::ReadWrite => PermissionType::Readwrite,
        }
    }
}

/// Makes etcd's users and roles those of [`ROLES`], `admins` administrators (besides the
/// `root` user etcd requires, which no Switchyard certificate names), and enables auth.
/// Idempotent: a second run changes nothing; a permission a role has beyond the table is
/// revoked. `client` must be an administrator once auth is on (before, anyone is).
pub async fn apply(client: &mut Client, admins: &[&str]) -> Result<(), AccessError> {
    let roles = client.role_list().await?.roles().to_vec();
    let users = client.user_list().await?.users().to_vec();
    let ensure_user = async |client: &mut Client, user: &str, role: &str| {
        if !users.iter().any(|u| u == user) {
            // No password: the user is whoever presents a certificate with this CN.
            client
                .user_add(user, "", Some(UserAddOptions::new().with_no_pwd()))
                .await?;
        }
        client.user_grant_role(user, role).await?;
        Ok::<_, AccessError>(())
    };
    if !roles.iter().any(|r| r == ROOT) {
        client.role_add(ROOT).await?;
    }
    ensure_user(client, ROOT, ROOT).await?;
    for admin in admins {
        ensure_user(client, admin, ROOT).await?;
    }
    for role in ROLES {
        if !roles.iter().any(|r| r == role.user) {
            client.role_add(role.user).await?;
        }
        for permission in client.role_get(role.user).await?.permissions() {
            let value = permission.get_type();
            let kind =
                PermissionType::try_from(value).map_err(|_| AccessError::UnknownPermission {
                    role: role.user.to_owned(),
                    value,
                })?;
            let wanted = role.grants.iter().any(|(prefix, access)| {
                permission.key() == prefix.as_bytes()
                    && permission.range_end() == prefix_end(prefix)
                    && kind == access.permission_type()
            });
            if !wanted {
                let options = (!permission.range_end().is_empty()).then(|| {
                    RoleRevokePermissionOptions::new()
                        .with_range_end(permission.range_end().to_vec())
                });
                client
                    .role_revoke_permission(role.user, permission.key().to_vec(), options)
                    .await?;
            }
        }
        for (prefix, access) in role.grants {
            client
                .role_grant_permission(
                    role.user,
                    Permission::new(access.permission_type(), *prefix).with_prefix(),
                )
                .await?;
        }
        ensure_user(client, role.user, role.user).await?;
    }
    client.auth_enable().await?;
    info!(
        roles = ?ROLES.iter().map(|r| r.user).collect::<Vec<_>>(),
        ?admins,
        "etcd auth enabled"
    );
    Ok(())
}

/// The end of the range a prefix covers, as etcd stores it (the prefix with its last byte
/// incremented).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_covers_every_prefix_the_services_write() {
        let covers = |role: &Role, key: &str, write: bool| {
            role.grants.iter().any(|(prefix, access)| {
                key.starts_with(prefix) && (write || *access == Access::ReadWrite)
            })
        };
        let member = format!("{MEMBERS_PREFIX}q-0");
        let shard = crate::store::shard_key(7);
        let campaign = format!("{ELECTION}/694d7b1f");
        let mark = format!("{DRAINING_PREFIX}q-0");
        assert!(covers(&ELECTOR, &mark, true) && covers(&ELECTOR, &mark, false));
        assert!(
            !covers(&QUEUE, &mark, true),
            "members do not mark themselves"
        );
        assert!(covers(&QUEUE, &member, true));
        assert!(covers(&QUEUE, &shard, true) && covers(&QUEUE, &shard, false));
        assert!(
            !covers(&QUEUE, &campaign, true),
            "queue members do not campaign"
        );
        for key in [&member, &shard, &campaign] {
            assert!(
                covers(&ELECTOR, key, true) && covers(&ELECTOR, key, false),
                "{key}"
            );
        }
    }

    #[test]
    fn a_prefix_ends_where_etcd_ends_it() {
        assert_eq!(prefix_end("/switchyard/shards/"), b"/switchyard/shards0");
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80");
    }
}
