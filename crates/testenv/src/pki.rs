//! The cluster's certificates, generated fresh for every control plane.

use std::{fs, path::Path};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::Result;

/// File paths of the generated PKI, all inside the cluster directory.
#[derive(Clone, Debug)]
pub(crate) struct Pki {
    pub ca_cert: std::path::PathBuf,
    pub serving_cert: std::path::PathBuf,
    pub serving_key: std::path::PathBuf,
    pub admin_cert: std::path::PathBuf,
    pub admin_key: std::path::PathBuf,
    pub service_account_key: std::path::PathBuf,
    pub service_account_public_key: std::path::PathBuf,
    pub front_proxy_ca_cert: std::path::PathBuf,
    pub front_proxy_client_cert: std::path::PathBuf,
    pub front_proxy_client_key: std::path::PathBuf,
}

impl Pki {
    /// A cluster CA with the apiserver's serving certificate and an admin client
    /// certificate (group system:masters), a service-account signing key, and a separate
    /// front-proxy CA with the aggregation layer's proxy client certificate.
    pub(crate) fn generate(dir: &Path) -> Result<Self> {
        let ca = new_ca("switchyard-testenv-ca")?;
        let front_proxy_ca = new_ca("switchyard-testenv-front-proxy-ca")?;
        let pki = Self {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            service_account_key: dir.join("sa.key"),
            service_account_public_key: dir.join("sa.pub"),
            front_proxy_ca_cert: dir.join("front-proxy-ca.crt"),
            front_proxy_client_cert: dir.join("front-proxy-client.crt"),
            front_proxy_client_key: dir.join("front-proxy-client.key"),
        };
        fs::write(&pki.ca_cert, ca.pem())?;
        fs::write(&pki.front_proxy_ca_cert, front_proxy_ca.pem())?;

        let (cert, key) = leaf(
            &ca,
            "kube-apiserver",
            None,
            &[
                "localhost",
                "127.0.0.1",
                "10.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        write_pair(&pki.serving_cert, &pki.serving_key, &cert, &key)?;

        let (cert, key) = leaf(
            &ca,
            "admin",
            Some("system:masters"),
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        write_pair(&pki.admin_cert, &pki.admin_key, &cert, &key)?;

        let (cert, key) = leaf(
            &front_proxy_ca,
            "front-proxy-client",
            None,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        write_pair(
            &pki.front_proxy_client_cert,
            &pki.front_proxy_client_key,
            &cert,
            &key,
        )?;

        // ES256 service-account tokens: signed with the private key, verified with the public.
        let service_account = KeyPair::generate()?;
        fs::write(&pki.service_account_key, service_account.serialize_pem())?;
        fs::write(
            &pki.service_account_public_key,
            service_account.public_key_pem(),
        )?;
        Ok(pki)
    }
}

fn new_ca(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    common_name: &str,
    organization: Option<&str>,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String)> {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())?;
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        params
            .distinguished_name
            .push(DnType::OrganizationName, org);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn write_pair(cert_path: &Path, key_path: &Path, cert: &str, key: &str) -> Result<()> {
    fs::write(cert_path, cert)?;
    fs::write(key_path, key)?;
    Ok(())
}
