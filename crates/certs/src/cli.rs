//! The `switchyard-certs` command: a CA and a certificate per identity, written as the input
//! of a kustomize Component ([`crate::kustomize`]) for clusters without cert-manager.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    Authority, DEFAULT_NAMESPACE, DEFAULT_TRUST_DOMAIN, Result,
    authority::write_file,
    identities::{self, Identity},
    kustomize,
};

/// Common name of a CA that switchyard-certs generates.
pub const CA_COMMON_NAME: &str = "switchyard-ca";
const DAY: Duration = Duration::from_secs(24 * 3600);

/// Writes DIR/ca.crt and DIR/ca.key (unless --ca-cert names an existing CA), a directory
/// DIR/<identity>/ with tls.crt, tls.key and ca.crt for each Switchyard identity, and
/// DIR/kustomization.yaml, a kustomize Component that turns them into Secrets.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "switchyard-certs", version)]
pub struct Args {
    /// Directory to write into (created if missing; existing files are replaced)
    #[arg(long, env = "SWITCHYARD_CERTS_OUT")]
    pub out: PathBuf,
    /// Namespace Switchyard runs in: part of each identity and of each DNS name
    #[arg(long, env = "SWITCHYARD_CERTS_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// SPIFFE trust domain of the identities (the services read it from their certificates)
    #[arg(long, env = "SWITCHYARD_CERTS_TRUST_DOMAIN", default_value = DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// Days each service certificate is valid
    #[arg(long, env = "SWITCHYARD_CERTS_DAYS", default_value_t = 365,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub days: u32,
    /// PEM certificate of an existing CA to sign with, instead of generating one
    #[arg(long, env = "SWITCHYARD_CERTS_CA_CERT", requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// PEM private key of --ca-cert
    #[arg(long, env = "SWITCHYARD_CERTS_CA_KEY", requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
}

/// What [`Args::run`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// `true` when the CA was generated (and DIR/ca.key written)
    pub generated_ca: bool,
    /// Each identity's directory and SPIFFE id
    pub identities: Vec<(PathBuf, String)>,
    pub kustomization: PathBuf,
}

impl Args {
    pub fn run(self) -> Result<Written> {
        let Self {
            out,
            namespace,
            trust_domain,
            days,
            ca_cert,
            ca_key,
        } = self;
        let validity = DAY * days;
        let leaves: Vec<_> = identities::ALL
            .iter()
            .map(|identity| identity.leaf(&trust_domain, &namespace, validity))
            .collect();
        // Bad input is refused before anything is written.
        for leaf in &leaves {
            leaf.validate()?;
        }
        let (authority, generated_ca) = match (ca_cert, ca_key) {
            (Some(cert), Some(key)) => (Authority::load(&cert, &key)?, false),
            _ => (Authority::generate(CA_COMMON_NAME)?, true),
        };
        if generated_ca {
            authority.write(&out)?;
        } else {
            // The key of a CA the user keeps stays where it is.
            std::fs::create_dir_all(&out).map_err(|source| crate::Error::Write {
                path: out.clone(),
                source,
            })?;
            write_file(&out.join("ca.crt"), authority.cert_pem(), None)?;
        }
        let mut identities = Vec::new();
        for leaf in &leaves {
            let dir = out.join(&leaf.service_account);
            authority.issue(leaf)?.write(&dir, authority.cert_pem())?;
            identities.push((dir, leaf.spiffe_id()));
        }
        let kustomization = write_component(&out, &identities::ALL, &namespace, &authority)?;
        Ok(Written {
            generated_ca,
            identities,
            kustomization,
        })
    }
}

fn write_component(
    out: &Path,
    identities: &[Identity],
    namespace: &str,
    authority: &Authority,
) -> Result<PathBuf> {
    write_file(
        &out.join(kustomize::CA_BUNDLE_PATCH),
        &kustomize::ca_bundle_patch(authority.cert_pem()),
        None,
    )?;
    let path = out.join("kustomization.yaml");
    write_file(&path, &kustomize::component(identities, namespace), None)?;
    Ok(path)
}
