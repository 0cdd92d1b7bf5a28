#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;

use x509_parser::{
    certificate::X509Certificate, extensions::GeneralName, pem::parse_x509_pem, prelude::FromDer,
};

use super::*;

/// The DER of the first PEM block.
fn der(pem: &str) -> Vec<u8> {
    parse_x509_pem(pem.as_bytes()).unwrap().1.contents
}

fn uris(cert: &X509Certificate<'_>) -> Vec<String> {
    let san = cert.subject_alternative_name().unwrap().unwrap();
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some((*uri).to_owned()),
            _ => None,
        })
        .collect()
}

fn signed_by(leaf_pem: &str, ca_pem: &str) -> bool {
    let (leaf_der, ca_der) = (der(leaf_pem), der(ca_pem));
    let leaf = X509Certificate::from_der(&leaf_der).unwrap().1;
    let ca = X509Certificate::from_der(&ca_der).unwrap().1;
    leaf.issuer() == ca.subject() && leaf.verify_signature(Some(ca.public_key())).is_ok()
}

#[test]
fn a_service_leaf_carries_its_identity_names_and_both_usages_and_chains_to_the_ca() {
    let ca = Authority::generate("test-ca").unwrap();
    let issued = ca
        .issue(&Leaf::service(
            "cluster.local",
            "switchyard",
            "switchyard-queue",
        ))
        .unwrap();
    let leaf_der = der(&issued.cert_pem);
    let leaf = X509Certificate::from_der(&leaf_der).unwrap().1;

    assert_eq!(
        uris(&leaf),
        ["spiffe://cluster.local/ns/switchyard/sa/switchyard-queue"]
    );
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    let dns: Vec<_> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some(*d),
            _ => None,
        })
        .collect();
    assert_eq!(
        dns,
        [
            "switchyard-queue",
            "switchyard-queue.switchyard",
            "switchyard-queue.switchyard.svc",
            "switchyard-queue.switchyard.svc.cluster.local",
            "localhost"
        ]
    );
    let ips: Vec<_> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::IPAddress(ip) => Some(ip.to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(
        ips,
        [vec![127, 0, 0, 1], Ipv6Addr::LOCALHOST.octets().to_vec()]
    );

    let eku = leaf.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth, "{eku:?}");
    assert!(!leaf.is_ca());
    assert!(leaf.validity().is_valid());
    let year = leaf.validity().time_to_expiration().unwrap();
    assert!(year > time::Duration::days(364) && year <= time::Duration::days(365));
    assert!(signed_by(&issued.cert_pem, ca.cert_pem()));

    // The key in the file is the certificate's key.
    let key = KeyPair::from_pem(&issued.key_pem).unwrap();
    assert_eq!(key.der_bytes(), &*leaf.public_key().subject_public_key.data);
}

#[test]
fn a_leaf_can_be_expired_foreign_or_of_any_identity() {
    let ca = Authority::generate("test-ca").unwrap();
    let other = Authority::generate("other-ca").unwrap();
    let day = Duration::from_secs(24 * 3600);
    let expired = Leaf {
        not_before: SystemTime::now() - 2 * day,
        not_after: SystemTime::now() - day,
        ..Leaf::service("cluster.local", "switchyard", "switchyard-watcher")
    };
    let issued = ca.issue(&expired).unwrap();
    let der = der(&issued.cert_pem);
    let cert = X509Certificate::from_der(&der).unwrap().1;
    assert!(!cert.validity().is_valid(), "expired");
    assert!(signed_by(&issued.cert_pem, ca.cert_pem()));

    let foreign = other
        .issue(&Leaf::service(
            "cluster.local",
            "switchyard",
            "switchyard-watcher",
        ))
        .unwrap();
    assert!(signed_by(&foreign.cert_pem, other.cert_pem()));
    assert!(!signed_by(&foreign.cert_pem, ca.cert_pem()));

    let stranger = ca
        .issue(&Leaf::service("example.org", "elsewhere", "intruder"))
        .unwrap();
    let der = super::tests::der(&stranger.cert_pem);
    assert_eq!(
        uris(&X509Certificate::from_der(&der).unwrap().1),
        ["spiffe://example.org/ns/elsewhere/sa/intruder"]
    );
}

#[test]
fn a_bad_identity_or_validity_is_refused_naming_the_field() {
    let ca = Authority::generate("test-ca").unwrap();
    let base = Leaf::service("cluster.local", "switchyard", "switchyard-queue");
    let cases = [
        (
            Leaf {
                trust_domain: "Cluster.Local".into(),
                ..base.clone()
            },
            "trust_domain \"Cluster.Local\"",
        ),
        (
            Leaf {
                namespace: "a/b".into(),
                ..base.clone()
            },
            "namespace \"a/b\"",
        ),
        (
            Leaf {
                service_account: String::new(),
                ..base.clone()
            },
            "service_account \"\"",
        ),
        (
            Leaf {
                service_account: "..".into(),
                ..base.clone()
            },
            "service_account \"..\"",
        ),
        (
            Leaf {
                not_after: base.not_before,
                ..base.clone()
            },
            "not_after",
        ),
        (
            Leaf {
                dns: vec!["ünicode.example".into()],
                ..base.clone()
            },
            "dns \"ünicode.example\": must be ASCII",
        ),
    ];
    for (leaf, expected) in cases {
        let error = ca.issue(&leaf).unwrap_err().to_string();
        assert!(error.starts_with(expected), "{expected}: {error}");
    }
}

#[test]
fn a_ca_from_its_pem_issues_leaves_that_chain_to_the_same_certificate() {
    let ca = Authority::generate("test-ca").unwrap();
    let again = Authority::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
    assert_eq!(again.cert_pem(), ca.cert_pem());
    let issued = again
        .issue(&Leaf::service(
            "cluster.local",
            "switchyard",
            "switchyard-elector",
        ))
        .unwrap();
    assert!(signed_by(&issued.cert_pem, ca.cert_pem()));
}

#[test]
fn from_pem_refuses_a_leaf_a_stranger_s_key_and_garbage() {
    let ca = Authority::generate("test-ca").unwrap();
    let other = Authority::generate("other-ca").unwrap();
    let leaf = ca
        .issue(&Leaf::service(
            "cluster.local",
            "switchyard",
            "switchyard-queue",
        ))
        .unwrap();
    let cases = [
        (
            leaf.cert_pem.as_str(),
            leaf.key_pem.as_str(),
            "CA certificate: CN=switchyard-queue is not a CA",
        ),
        (
            ca.cert_pem(),
            other.key_pem(),
            "CA key: not the key of the CA certificate CN=test-ca",
        ),
        (
            "not pem",
            ca.key_pem(),
            "CA certificate: not a PEM certificate",
        ),
        (ca.cert_pem(), "not pem", "CA key: not a PEM private key"),
    ];
    for (cert, key, expected) in cases {
        let error = Authority::from_pem(cert, key).unwrap_err().to_string();
        assert!(error.starts_with(expected), "{expected}: {error}");
    }
}

#[test]
fn load_names_the_file_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::generate("test-ca").unwrap();
    ca.write(dir.path()).unwrap();
    let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    Authority::load(&cert, &key).unwrap();

    let missing = dir.path().join("missing.key");
    let error = Authority::load(&cert, &missing).unwrap_err().to_string();
    assert!(
        error.starts_with(&format!("{}: reading", missing.display())),
        "{error}"
    );

    std::fs::write(&key, "garbage").unwrap();
    let error = Authority::load(&cert, &key).unwrap_err().to_string();
    assert!(
        error.starts_with(&format!("{}: CA key: not a PEM private key", key.display())),
        "{error}"
    );
}

#[test]
fn keys_are_written_readable_by_their_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::generate("test-ca").unwrap();
    let issued = ca
        .issue(&Leaf::service(
            "cluster.local",
            "switchyard",
            "switchyard-queue",
        ))
        .unwrap();
    let out = dir.path().join("queue");
    std::fs::create_dir(&out).unwrap();
    // A key file left with wider permissions is narrowed, not just overwritten.
    std::fs::write(out.join("tls.key"), "old").unwrap();
    std::fs::set_permissions(out.join("tls.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    issued.write(&out, ca.cert_pem()).unwrap();

    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&out.join("tls.key")), 0o600);
    assert_eq!(
        std::fs::read_to_string(out.join("tls.key")).unwrap(),
        issued.key_pem
    );
    assert_eq!(
        std::fs::read_to_string(out.join("tls.crt")).unwrap(),
        issued.cert_pem
    );
    assert_eq!(
        std::fs::read_to_string(out.join("ca.crt")).unwrap(),
        ca.cert_pem()
    );
    ca.write(dir.path()).unwrap();
    assert_eq!(mode(&dir.path().join("ca.key")), 0o600);
}

#[test]
fn writing_into_a_path_that_is_a_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let ca = Authority::generate("test-ca").unwrap();
    let error = ca.write(&file.join("sub")).unwrap_err().to_string();
    assert!(
        error.starts_with(&format!("{}: writing", file.join("sub").display())),
        "{error}"
    );
}
