//! The CA and the leaf certificates it issues.

use std::{
    fmt,
    fs::{self, OpenOptions},
    io::Write,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::Path,
    time::{Duration, SystemTime},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};

use crate::{Error, Result, spiffe_id};

/// How long a generated CA is valid: long enough that it outlives many rotations of the
/// leaves it signs (rotating the CA means replacing every Secret at once).
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a [`Leaf::service`] certificate is valid by default.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Certificates start this long before they are made, so a peer whose clock is a little
/// behind does not refuse a certificate that was just issued.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);
/// The DNS suffix of Services in the cluster (kubelet's `--cluster-domain`).
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// Mode of every private key file written: readable by its owner only.
pub const KEY_FILE_MODE: u32 = 0o600;

/// A certificate authority: a self-signed root that signs every Switchyard certificate.
pub struct Authority {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authority")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Authority {
    /// A new self-signed CA named `common_name`, valid for [`CA_VALIDITY`], that may sign
    /// leaves only (path length 0).
    pub fn generate(common_name: &str) -> Result<Self> {
        let what = || format!("CA {common_name:?}");
        let key = KeyPair::generate().map_err(|source| Error::Key {
            what: what(),
            source,
        })?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = SystemTime::now();
        params.not_before = (now - CLOCK_SKEW).into();
        params.not_after = (now + CA_VALIDITY).into();
        let cert = params.self_signed(&key).map_err(|source| Error::Sign {
            what: what(),
            source,
        })?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// An existing CA from its PEM certificate and PEM private key. The certificate must be
    /// a CA (basicConstraints CA:TRUE) and the key must be its key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| Error::CaCertificate(format!("not a PEM certificate: {e}")))?;
        let x509 = pem
            .parse_x509()
            .map_err(|e| Error::CaCertificate(format!("not an X.509 certificate: {e}")))?;
        if !x509.is_ca() {
            return Err(Error::CaCertificate(format!(
                "{} is not a CA (basicConstraints CA is not set)",
                x509.subject()
            )));
        }
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| Error::CaKey(format!("not a PEM private key: {e}")))?;
        if key.der_bytes() != &*x509.public_key().subject_public_key.data {
            return Err(Error::CaKey(format!(
                "not the key of the CA certificate {}",
                x509.subject()
            )));
        }
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| Error::CaCertificate(e.to_string()))?;
        Ok(Self {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            issuer,
        })
    }

    /// [`Authority::from_pem`] of two files; an error names the file at fault.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self> {
        let read = |path: &Path| {
            fs::read_to_string(path).map_err(|source| Error::Read {
                path: path.to_owned(),
                source,
            })
        };
        let (cert_pem, key_pem) = (read(cert_path)?, read(key_path)?);
        Self::from_pem(&cert_pem, &key_pem).map_err(|e| {
            let path = match e {
                Error::CaKey(_) => key_path,
                _ => cert_path,
            };
            Error::Load {
                path: path.to_owned(),
                source: Box::new(e),
            }
        })
    }

    /// The CA certificate, PEM: what every peer trusts (`ca.crt`, an APIService's caBundle).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key, PEM. Whoever holds it can mint any identity.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Writes `ca.crt` and `ca.key` (mode 0600) into `dir`, creating it.
    pub fn write(&self, dir: &Path) -> Result<()> {
        create_dir(dir)?;
        write_file(&dir.join("ca.crt"), &self.cert_pem, None)?;
        write_file(&dir.join("ca.key"), &self.key_pem, Some(KEY_FILE_MODE))
    }

    /// Signs a certificate for `leaf` with a new ECDSA P-256 key.
    pub fn issue(&self, leaf: &Leaf) -> Result<Issued> {
        leaf.validate()?;
        let id = leaf.spiffe_id();
        let key = KeyPair::generate().map_err(|source| Error::Key {
            what: id.clone(),
            source,
        })?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, leaf.service_account.as_str());
        params.subject_alt_names = leaf.subject_alt_names()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = leaf.not_before.into();
        params.not_after = leaf.not_after.into();
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| Error::Sign { what: id, source })?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// What a leaf certificate says: its identity, the names it is valid for, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
    /// DNS SANs (a leading `*.` makes a wildcard)
    pub dns: Vec<String>,
    /// IP SANs
    pub ips: Vec<IpAddr>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Leaf {
    /// The certificate of a service whose Service is named like its service account: the
    /// DNS names of [`service_dns_names`], `localhost`, 127.0.0.1 and ::1, valid from a
    /// little before now ([`CLOCK_SKEW`]) for [`LEAF_VALIDITY`].
    pub fn service(trust_domain: &str, namespace: &str, service_account: &str) -> Self {
        let mut dns = service_dns_names(service_account, namespace);
        dns.push("localhost".to_owned());
        let now = SystemTime::now();
        Self {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            dns,
            ips: vec![
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
            ],
            not_before: now - CLOCK_SKEW,
            not_after: now + LEAF_VALIDITY,
        }
    }

    /// The URI SAN this leaf carries.
    pub fn spiffe_id(&self) -> String {
        spiffe_id(&self.trust_domain, &self.namespace, &self.service_account)
    }

    /// The identity's parts follow the SPIFFE ID rules (a trust domain of lowercase letters,
    /// digits, `.`, `-` and `_`; path segments of letters, digits, `.`, `-` and `_`), and the
    /// validity period is not empty.
    pub(crate) fn validate(&self) -> Result<()> {
        let td_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-_".contains(c);
        let segment_char = |c: char| c.is_ascii_alphanumeric() || ".-_".contains(c);
        let check = |field, value: &str, ok: &dyn Fn(char) -> bool, rule| {
            if value.is_empty() || value == "." || value == ".." || !value.chars().all(ok) {
                return Err(Error::Invalid {
                    field,
                    value: value.to_owned(),
                    reason: rule,
                });
            }
            Ok(())
        };
        check(
            "trust_domain",
            &self.trust_domain,
            &td_char,
            "must be lowercase letters, digits, '.', '-' and '_'",
        )?;
        for (field, value) in [
            ("namespace", &self.namespace),
            ("service_account", &self.service_account),
        ] {
            check(
                field,
                value,
                &segment_char,
                "must be letters, digits, '.', '-' and '_', and not '.' or '..'",
            )?;
        }
        if self.not_after <= self.not_before {
            return Err(Error::Invalid {
                field: "not_after",
                value: format!("{:?}", self.not_after),
                reason: "must be later than not_before",
            });
        }
        Ok(())
    }

    fn subject_alt_names(&self) -> Result<Vec<SanType>> {
        let ia5 = |field, value: &str| {
            value.try_into().map_err(|_| Error::Invalid {
                field,
                value: value.to_owned(),
                reason: "must be ASCII",
            })
        };
        let mut sans = vec![SanType::URI(ia5("spiffe id", &self.spiffe_id())?)];
        for name in &self.dns {
            sans.push(SanType::DnsName(ia5("dns", name)?));
        }
        sans.extend(self.ips.iter().copied().map(SanType::IpAddress));
        Ok(sans)
    }
}

/// The four names a Service is reached by from inside the cluster: `<service>`,
/// `<service>.<namespace>`, `<service>.<namespace>.svc` and
/// `<service>.<namespace>.svc.cluster.local`.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.{CLUSTER_DOMAIN}"),
    ]
}

/// A signed leaf certificate and its private key, PEM.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Issued {
    /// Writes `tls.crt`, `tls.key` (mode 0600) and `ca.crt` into `dir`, creating it: the
    /// layout of a `kubernetes.io/tls` Secret as cert-manager fills it.
    pub fn write(&self, dir: &Path, ca_pem: &str) -> Result<()> {
        create_dir(dir)?;
        write_file(&dir.join("tls.crt"), &self.cert_pem, None)?;
        write_file(&dir.join("tls.key"), &self.key_pem, Some(KEY_FILE_MODE))?;
        write_file(&dir.join("ca.crt"), ca_pem, None)
    }
}

fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_owned(),
        source,
    })
}

/// Writes `contents` to `path`; with `mode`, the file never exists with wider permissions.
pub(crate) fn write_file(path: &Path, contents: &str, mode: Option<u32>) -> Result<()> {
    let error = |source| Error::Write {
        path: path.to_owned(),
        source,
    };
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if let Some(mode) = mode {
        options.mode(mode);
    }
    let mut file = options.open(path).map_err(error)?;
    if let Some(mode) = mode {
        // An existing file keeps its mode on open: narrow it before writing the key.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(error)?;
    }
    file.write_all(contents.as_bytes()).map_err(error)
}

#[cfg(test)]
mod tests;
