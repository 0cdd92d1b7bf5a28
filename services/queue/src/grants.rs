//! Which controllers each reconciler identity may work on: what a Work stream's hello may
//! declare, as the RPC table says which methods a role may call.
//!
//! The installation's own reconciler (the service account `<prefix>switchyard-reconciler`
//! whose prefix is this queue's own) may declare any controller. Any other reconciler
//! identity (an SDK user's `greeting-switchyard-reconciler`, say) may declare only the
//! controllers a `--work-grant ACCOUNT=CONTROLLER` gives it; naming the installation's own
//! account in a grant narrows it to what is listed too. Without one, its hello is refused, so
//! that one controller's binary cannot take another's leases.

use std::collections::HashMap;

use switchyard_queue_core::MAX_CONTROLLER_LEN;
use switchyard_runtime::{Identity, Role};

/// Any controller: `--work-grant ACCOUNT=*`.
const ANY: &str = "*";

/// One `--work-grant ACCOUNT=CONTROLLER`, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkGrant {
    pub account: String,
    /// A controller name, or `*` for any.
    pub controller: String,
}

impl std::str::FromStr for WorkGrant {
    type Err = String;

    fn from_str(flag: &str) -> Result<Self, Self::Err> {
        let (account, controller) = flag
            .split_once('=')
            .ok_or_else(|| format!("{flag:?}: expected ACCOUNT=CONTROLLER"))?;
        if !switchyard_selector::names::is_dns_subdomain(account) {
            return Err(format!(
                "{flag:?}: {account:?} is not a service account name (lowercase letters, \
                 digits, '-' and '.', at most 253)"
            ));
        }
        if controller.trim().is_empty() || controller.len() > MAX_CONTROLLER_LEN {
            return Err(format!(
                "{flag:?}: the controller must be 1 to {MAX_CONTROLLER_LEN} characters, or *"
            ));
        }
        Ok(Self {
            account: account.to_owned(),
            controller: controller.to_owned(),
        })
    }
}

/// The table a hello is checked against.
#[derive(Clone, Debug, Default)]
pub struct WorkGrants {
    /// The installation's own reconciler account, which may declare any controller unless
    /// granted otherwise; `None` without identities (plaintext, for development).
    installation: Option<String>,
    granted: HashMap<String, Vec<String>>,
}

/// A controller the caller may not declare.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "hello.controllers[{index}]: the service account {account:?} may not work on {controller:?} \
     (--work-grant {account}={controller} would allow it)"
)]
pub struct NotGranted {
    pub index: usize,
    pub account: String,
    pub controller: String,
}

impl WorkGrants {
    /// The table for a queue whose own identity is `own` (`None` checks nothing).
    pub fn new(own: Option<&Identity>, grants: &[WorkGrant]) -> Self {
        let installation = own.map(|own| {
            let prefix = own
                .service_account
                .strip_suffix(Role::Queue.service_account())
                .unwrap_or_default();
            format!("{prefix}{}", Role::Reconciler.service_account())
        });
        let mut granted: HashMap<String, Vec<String>> = HashMap::new();
        for grant in grants {
            granted
                .entry(grant.account.clone())
                .or_default()
                .push(grant.controller.clone());
        }
        Self {
            installation,
            granted,
        }
    }

    /// Checks that `account` may declare each of `controllers`.
    pub fn check(&self, account: &str, controllers: &[String]) -> Result<(), NotGranted> {
        if self.installation.is_none() {
            return Ok(());
        }
        let allowed = |controller: &str| match self.granted.get(account) {
            Some(listed) => listed.iter().any(|c| c == ANY || c == controller),
            None => self.installation.as_deref() == Some(account),
        };
        match controllers.iter().position(|c| !allowed(c)) {
            None => Ok(()),
            Some(index) => Err(NotGranted {
                index,
                account: account.to_owned(),
                controller: controllers[index].clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(service_account: &str) -> Identity {
        Identity {
            trust_domain: "cluster.local".into(),
            namespace: "switchyard".into(),
            service_account: service_account.into(),
        }
    }

    fn grants(own: &str, flags: &[&str]) -> WorkGrants {
        let flags: Vec<WorkGrant> = flags.iter().map(|f| f.parse().unwrap()).collect();
        WorkGrants::new(Some(&identity(own)), &flags)
    }

    fn names(controllers: &[&str]) -> Vec<String> {
        controllers.iter().map(|c| (*c).to_owned()).collect()
    }

    #[test]
    fn the_installation_s_reconciler_may_declare_any_controller_others_only_theirs() {
        let table = grants(
            "prod-switchyard-queue",
            &["greeting-switchyard-reconciler=example.switchyard.io/v1/Greeting"],
        );
        let builtins = names(&["apps/v1/Deployment", "example.switchyard.io/v1/Greeting"]);
        assert_eq!(table.check("prod-switchyard-reconciler", &builtins), Ok(()));
        // Another installation's reconciler is not this one's.
        assert!(table.check("switchyard-reconciler", &builtins).is_err());
        let greeting = names(&["example.switchyard.io/v1/Greeting"]);
        assert_eq!(
            table.check("greeting-switchyard-reconciler", &greeting),
            Ok(())
        );
        assert_eq!(
            table
                .check("greeting-switchyard-reconciler", &builtins)
                .unwrap_err()
                .to_string(),
            "hello.controllers[0]: the service account \"greeting-switchyard-reconciler\" may \
             not work on \"apps/v1/Deployment\" (--work-grant \
             greeting-switchyard-reconciler=apps/v1/Deployment would allow it)"
        );
        assert!(
            table
                .check("other-switchyard-reconciler", &greeting)
                .is_err()
        );
    }

    #[test]
    fn a_grant_narrows_the_installation_s_reconciler_and_a_star_allows_any() {
        let table = grants(
            "switchyard-queue",
            &[
                "switchyard-reconciler=apps/v1/ReplicaSet",
                "wide-switchyard-reconciler=*",
            ],
        );
        assert_eq!(
            table.check("switchyard-reconciler", &names(&["apps/v1/ReplicaSet"])),
            Ok(())
        );
        assert_eq!(
            table
                .check(
                    "switchyard-reconciler",
                    &names(&["apps/v1/ReplicaSet", "v1/Namespace"])
                )
                .map_err(|e| e.index),
            Err(1)
        );
        assert_eq!(
            table.check("wide-switchyard-reconciler", &names(&["v1/Namespace"])),
            Ok(())
        );
    }

    #[test]
    fn without_identities_nothing_is_checked() {
        let table = WorkGrants::new(None, &[]);
        assert_eq!(table.check("", &names(&["apps/v1/Deployment"])), Ok(()));
    }

    #[test]
    fn a_flag_names_what_is_wrong() {
        for (flag, says) in [
            ("greeting", "expected ACCOUNT=CONTROLLER"),
            ("=apps/v1/ReplicaSet", "is not a service account name"),
            (
                "spiffe://cluster.local/ns/x/sa/y=apps/v1/ReplicaSet",
                "is not a service account name",
            ),
            (
                "Greeting=apps/v1/ReplicaSet",
                "is not a service account name",
            ),
            ("greeting=", "the controller must be 1 to"),
        ] {
            let error = flag.parse::<WorkGrant>().unwrap_err();
            assert!(error.contains(says), "{flag}: {error}");
        }
    }
}
