//! The certificates Switchyard's services use in tests and in `make run`: one CA for the
//! test process and a certificate per role, made with `switchyard-certs`' library (the same
//! one a user's `switchyard-certs` command runs).
//!
//! Every service started through [`crate::ServiceProcess`] gets its role's `--tls-*` flags;
//! tests reach services with [`Pki::dialer`] as the role they play.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use switchyard_certs::{Authority, DEFAULT_NAMESPACE, DEFAULT_TRUST_DOMAIN, Issued, Leaf};
use switchyard_runtime::{Dialer, Role, TlsArgs};
use tonic::transport::Channel;

/// A CA and one certificate per role, in a directory of their own.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
    ca: Authority,
    _temp: Option<tempfile::TempDir>,
}

/// The three files of one identity.
#[derive(Clone, Debug)]
pub struct Files {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl Files {
    /// `--tls-cert=… --tls-key=… --tls-ca=…`.
    pub fn flags(&self) -> Vec<String> {
        vec![
            format!("--tls-cert={}", self.cert.display()),
            format!("--tls-key={}", self.key.display()),
            format!("--tls-ca={}", self.ca.display()),
        ]
    }

    pub fn args(&self) -> TlsArgs {
        TlsArgs::files(&self.cert, &self.key, &self.ca)
    }
}

/// A shared PKI's directory is this and the id of the process that made it.
const SHARED_PREFIX: &str = "switchyard-pki-";

/// Removes the shared PKI directories under `temp` whose process is gone (killed before it
/// could remove its own). A directory named after a live process is left, even if that
/// process is not the one that made it.
fn remove_orphaned(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(SHARED_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The service account of etcd's own (serving) certificate.
pub const ETCD_ACCOUNT: &str = "switchyard-etcd";

impl Pki {
    /// The test process's PKI, made on first use. Its directory lives as long as the
    /// process (services started from it read the files until they stop) and is removed
    /// when the process exits; the directories of test processes that were killed instead
    /// are removed by the next one to make its own.
    pub fn shared() -> &'static Pki {
        static SHARED: OnceLock<Pki> = OnceLock::new();
        extern "C" fn remove_shared() {
            if let Some(pki) = SHARED.get() {
                let _ = std::fs::remove_dir_all(&pki.dir);
            }
        }
        SHARED.get_or_init(|| {
            let temp = std::env::temp_dir();
            remove_orphaned(&temp);
            let dir = temp.join(format!("{SHARED_PREFIX}{}", std::process::id()));
            let pki = Pki::create(&dir, "switchyard test CA").expect("the test PKI is written");
            crate::process::register_at_exit(remove_shared);
            pki
        })
    }

    /// A new PKI in a temporary directory removed on drop: for tests that need a second,
    /// foreign CA.
    pub fn temporary(name: &str) -> crate::Result<Pki> {
        let temp = tempfile::Builder::new()
            .prefix("switchyard-pki-temporary-")
            .tempdir()?;
        let mut pki = Pki::create(temp.path(), name)?;
        pki._temp = Some(temp);
        Ok(pki)
    }

    /// A CA and a certificate for every role and for etcd, written under `dir`.
    pub fn create(dir: &Path, ca_name: &str) -> crate::Result<Pki> {
        let ca = Authority::generate(ca_name).map_err(setup)?;
        let pki = Pki {
            dir: dir.to_owned(),
            ca,
            _temp: None,
        };
        std::fs::create_dir_all(dir)?;
        std::fs::write(pki.ca_path(), pki.ca.cert_pem())?;
        for role in Role::ALL {
            pki.issue_as(role.service_account(), role.service_account())?;
        }
        pki.issue_as(ETCD_ACCOUNT, ETCD_ACCOUNT)?;
        Ok(pki)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn ca(&self) -> &Authority {
        &self.ca
    }

    /// The files of `role`'s certificate.
    pub fn files(&self, role: Role) -> Files {
        self.files_of(role.service_account())
    }

    /// The files written under `name` by [`Self::issue_as`] or [`Self::write`].
    pub fn files_of(&self, name: &str) -> Files {
        let dir = self.dir.join(name);
        Files {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
        }
    }

    /// Issues a fresh certificate for `service_account` (default names and validity) and
    /// writes it under `name`, replacing what was there: a rotation.
    pub fn issue_as(&self, name: &str, service_account: &str) -> crate::Result<Files> {
        let leaf = Leaf::service(DEFAULT_TRUST_DOMAIN, DEFAULT_NAMESPACE, service_account);
        self.write(name, &self.ca.issue(&leaf).map_err(setup)?)
    }

    /// Writes `issued` under `name`, with this PKI's CA.
    pub fn write(&self, name: &str, issued: &Issued) -> crate::Result<Files> {
        issued
            .write(&self.dir.join(name), self.ca.cert_pem())
            .map_err(setup)?;
        Ok(self.files_of(name))
    }

    /// `role`'s `--tls-*` flags.
    pub fn flags(&self, role: Role) -> Vec<String> {
        self.files(role).flags()
    }

    /// A dialer that presents `role`'s certificate.
    pub fn dialer(&self, role: Role) -> Dialer {
        Dialer::from_args(&self.files(role).args()).expect("the test PKI's files load")
    }

    /// A channel, connected now, to the `peer` at `address`, as `role`.
    pub async fn channel(
        &self,
        role: Role,
        peer: Role,
        address: impl std::fmt::Display,
    ) -> crate::Result<Channel> {
        let dialer = self.dialer(role);
        let address = address.to_string();
        let endpoint = dialer.endpoint(&address, peer).map_err(setup)?;
        dialer.connect(&endpoint, peer).await.map_err(setup)
    }
}

fn setup(error: impl std::fmt::Display) -> crate::Error {
    crate::Error::Setup(error.to_string())
}

/// The role a service binary plays, from its file name (`switchyard-queue` → queue).
pub fn role_of_program(program: &Path) -> Option<Role> {
    let name = program.file_name()?.to_str()?;
    Role::ALL
        .into_iter()
        .find(|role| role.service_account() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_directories_of_gone_processes_are_removed_and_others_kept() {
        let temp = tempfile::tempdir().unwrap();
        let mut exited = std::process::Command::new("true").spawn().unwrap();
        exited.wait().unwrap();
        let gone = temp.path().join(format!("{SHARED_PREFIX}{}", exited.id()));
        let live = temp
            .path()
            .join(format!("{SHARED_PREFIX}{}", std::process::id()));
        let temporary = temp.path().join("switchyard-pki-temporary-123456");
        for dir in [&gone, &live, &temporary] {
            std::fs::create_dir_all(dir.join("switchyard-queue")).unwrap();
        }

        remove_orphaned(temp.path());

        assert!(
            !gone.exists(),
            "the directory of an exited process is removed"
        );
        assert!(live.exists(), "a live process's directory is kept");
        assert!(
            temporary.exists(),
            "a temporary PKI is its owner's to remove"
        );
    }
}
