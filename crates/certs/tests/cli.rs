//! The `switchyard-certs` binary as a user runs it: the files it writes, the identities and
//! names in them, their chain to the CA, the Component's YAML, its errors; and the names
//! agree with what `components/cert-manager` asks cert-manager for.

#![allow(clippy::unwrap_used)]

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use base64::Engine;
use serde_norway::Value;
use switchyard_certs::{identities, spiffe_id};
use x509_parser::{
    certificate::X509Certificate, extensions::GeneralName, pem::parse_x509_pem, prelude::FromDer,
};

fn run(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard-certs"))
        .args(args)
        .env_clear()
        .output()
        .unwrap()
}

fn run_ok(args: &[&std::ffi::OsStr]) {
    let out = run(args);
    assert!(
        out.status.success(),
        "switchyard-certs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn der(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).unwrap();
    parse_x509_pem(&pem).unwrap().1.contents
}

/// URIs, DNS names and IPs (as text) of a certificate's SAN extension.
fn sans(cert: &X509Certificate<'_>) -> (Vec<String>, Vec<String>, Vec<String>) {
    let (mut uris, mut dns, mut ips) = (vec![], vec![], vec![]);
    let san = cert.subject_alternative_name().unwrap().unwrap();
    for name in &san.value.general_names {
        match name {
            GeneralName::URI(uri) => uris.push((*uri).to_owned()),
            GeneralName::DNSName(name) => dns.push((*name).to_owned()),
            GeneralName::IPAddress(ip) => ips.push(match ip.len() {
                4 => std::net::IpAddr::from(<[u8; 4]>::try_from(*ip).unwrap()).to_string(),
                _ => std::net::IpAddr::from(<[u8; 16]>::try_from(*ip).unwrap()).to_string(),
            }),
            other => panic!("unexpected SAN {other:?}"),
        }
    }
    (uris, dns, ips)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn os(s: &str) -> &std::ffi::OsStr {
    s.as_ref()
}

/// Checks every identity's directory under `out` against `ca_pem_path`.
fn check_identities(out: &Path, ca: &Path, trust_domain: &str, namespace: &str) {
    let ca_der = der(ca);
    let ca_cert = X509Certificate::from_der(&ca_der).unwrap().1;
    assert!(ca_cert.is_ca());
    for identity in identities::ALL {
        let dir = out.join(identity.service_account);
        let leaf_der = der(&dir.join("tls.crt"));
        let leaf = X509Certificate::from_der(&leaf_der).unwrap().1;
        let what = identity.service_account;

        let (uris, dns, ips) = sans(&leaf);
        assert_eq!(
            uris,
            [spiffe_id(trust_domain, namespace, identity.service_account)],
            "{what}"
        );
        assert_eq!(dns, identity.dns_names(namespace), "{what}");
        assert_eq!(ips, ["127.0.0.1", "::1"], "{what}");
        let eku = leaf.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth, "{what}: {eku:?}");
        assert!(!leaf.is_ca(), "{what}");
        assert!(leaf.validity().is_valid(), "{what}");

        // Chains to the CA: named by it and signed with its key.
        assert_eq!(leaf.issuer(), ca_cert.subject(), "{what}");
        leaf.verify_signature(Some(ca_cert.public_key()))
            .unwrap_or_else(|e| panic!("{what}: signature: {e}"));
        assert_eq!(
            std::fs::read(dir.join("ca.crt")).unwrap(),
            std::fs::read(ca).unwrap()
        );
        assert_eq!(mode(&dir.join("tls.key")), 0o600, "{what}");
    }
}

#[test]
fn it_writes_a_ca_a_certificate_per_identity_and_a_component_that_makes_them_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("certs");
    run_ok(&[os("--out"), out.as_os_str()]);

    assert_eq!(mode(&out.join("ca.key")), 0o600);
    check_identities(&out, &out.join("ca.crt"), "cluster.local", "switchyard");

    let component: Value =
        serde_norway::from_str(&std::fs::read_to_string(out.join("kustomization.yaml")).unwrap())
            .unwrap();
    assert_eq!(component["kind"], "Component");
    let generators = component["secretGenerator"].as_sequence().unwrap();
    assert_eq!(generators.len(), identities::ALL.len());
    for (generator, identity) in generators.iter().zip(identities::ALL) {
        let sa = identity.service_account;
        assert_eq!(generator["name"], identity.secret_name().as_str());
        assert_eq!(generator["namespace"], "switchyard");
        assert_eq!(generator["type"], "kubernetes.io/tls");
        assert_eq!(generator["options"]["disableNameSuffixHash"], true);
        let files: Vec<_> = generator["files"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            files,
            [
                format!("tls.crt={sa}/tls.crt"),
                format!("tls.key={sa}/tls.key"),
                format!("ca.crt={sa}/ca.crt")
            ]
        );
    }

    let patch: Value = serde_norway::from_str(
        &std::fs::read_to_string(out.join("apiservice-cabundle.yaml")).unwrap(),
    )
    .unwrap();
    // A JSON patch of the APIService the kustomization targets: the injector's annotation
    // removed, caBundle set.
    let patches = component["patches"].as_sequence().unwrap();
    assert_eq!(patches[0]["path"], "apiservice-cabundle.yaml");
    assert_eq!(patches[0]["target"]["kind"], "APIService");
    assert_eq!(
        patches[0]["target"]["name"],
        "v1beta1.external.metrics.k8s.io"
    );
    assert_eq!(patch[0]["op"], "remove");
    assert_eq!(
        patch[0]["path"],
        "/metadata/annotations/cert-manager.io~1inject-ca-from"
    );
    assert_eq!(patch[1]["path"], "/spec/caBundle");
    let bundle = base64::engine::general_purpose::STANDARD
        .decode(patch[1]["value"].as_str().unwrap())
        .unwrap();
    assert_eq!(bundle, std::fs::read(out.join("ca.crt")).unwrap());
}

#[test]
fn another_trust_domain_and_namespace_reach_every_identity_name_and_secret() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("certs");
    run_ok(&[
        os("--out"),
        out.as_os_str(),
        os("--trust-domain=example.org"),
        os("--namespace=controllers"),
        os("--days=30"),
    ]);
    check_identities(&out, &out.join("ca.crt"), "example.org", "controllers");
    let leaf_der = der(&out.join("switchyard-queue/tls.crt"));
    let leaf = X509Certificate::from_der(&leaf_der).unwrap().1;
    let days = leaf.validity().time_to_expiration().unwrap().whole_days();
    assert!((29..=30).contains(&days), "{days}");
    let component = std::fs::read_to_string(out.join("kustomization.yaml")).unwrap();
    assert_eq!(
        component.matches("namespace: controllers").count(),
        identities::ALL.len()
    );
}

#[test]
fn an_existing_ca_signs_the_new_certificates_and_its_key_stays_where_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    run_ok(&[os("--out"), first.as_os_str()]);
    let second = tmp.path().join("second");
    run_ok(&[
        os("--out"),
        second.as_os_str(),
        os("--ca-cert"),
        first.join("ca.crt").as_os_str(),
        os("--ca-key"),
        first.join("ca.key").as_os_str(),
    ]);
    assert!(!second.join("ca.key").exists());
    assert_eq!(
        std::fs::read(second.join("ca.crt")).unwrap(),
        std::fs::read(first.join("ca.crt")).unwrap()
    );
    check_identities(
        &second,
        &first.join("ca.crt"),
        "cluster.local",
        "switchyard",
    );
    // New keys, not copies.
    assert_ne!(
        std::fs::read(second.join("switchyard-queue/tls.key")).unwrap(),
        std::fs::read(first.join("switchyard-queue/tls.key")).unwrap()
    );
}

#[test]
fn bad_input_fails_with_a_message_naming_the_path_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let good = tmp.path().join("good");
    run_ok(&[os("--out"), good.as_os_str()]);
    let out = tmp.path().join("out");
    let missing = tmp.path().join("missing.key");
    let not_a_ca = good.join("switchyard-queue/tls.crt");
    let (ca_crt, ca_key) = (good.join("ca.crt"), good.join("ca.key"));

    let cases: Vec<(Vec<&std::ffi::OsStr>, String)> = vec![
        (
            vec![os("--out"), file.as_os_str()],
            format!("{}: writing", file.display()),
        ),
        (
            vec![
                os("--out"),
                out.as_os_str(),
                os("--ca-cert"),
                ca_crt.as_os_str(),
                os("--ca-key"),
                missing.as_os_str(),
            ],
            format!("{}: reading", missing.display()),
        ),
        (
            vec![
                os("--out"),
                out.as_os_str(),
                os("--ca-cert"),
                not_a_ca.as_os_str(),
                os("--ca-key"),
                ca_key.as_os_str(),
            ],
            format!(
                "{}: CA certificate: CN=switchyard-queue is not a CA",
                not_a_ca.display()
            ),
        ),
        (
            vec![
                os("--out"),
                out.as_os_str(),
                os("--trust-domain=Not.Lowercase"),
            ],
            "trust_domain \"Not.Lowercase\"".to_owned(),
        ),
        (
            vec![os("--out"), out.as_os_str(), os("--ca-cert=x")],
            "--ca-key".to_owned(),
        ),
    ];
    for (args, expected) in cases {
        let result = run(&args);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{args:?} must fail");
        assert!(
            stderr.contains(&expected),
            "{args:?}: {expected:?} in {stderr}"
        );
        assert!(!out.exists(), "{args:?}: nothing written");
    }
}

/// components/cert-manager asks cert-manager for the certificates switchyard-certs makes:
/// the same Secrets, identities, DNS names, IPs and usages.
#[test]
fn the_cert_manager_component_names_what_switchyard_certs_issues() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/kustomize/components/cert-manager/certificates.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let certificates: Vec<Value> = serde_norway::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect();
    assert_eq!(certificates.len(), identities::ALL.len());
    let strings = |v: &Value| -> Vec<String> {
        v.as_sequence()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    for (certificate, identity) in certificates.iter().zip(identities::ALL) {
        let sa = identity.service_account;
        let spec = &certificate["spec"];
        assert_eq!(certificate["kind"], "Certificate");
        assert_eq!(certificate["metadata"]["name"], sa);
        assert_eq!(spec["secretName"], identity.secret_name().as_str());
        assert_eq!(spec["commonName"], sa);
        assert_eq!(
            strings(&spec["uris"]),
            [spiffe_id("cluster.local", "switchyard", sa)]
        );
        assert_eq!(strings(&spec["dnsNames"]), identity.dns_names("switchyard"));
        assert_eq!(strings(&spec["ipAddresses"]), ["127.0.0.1", "::1"]);
        let usages = strings(&spec["usages"]);
        assert!(
            usages.contains(&"server auth".to_owned())
                && usages.contains(&"client auth".to_owned()),
            "{sa}: {usages:?}"
        );
        assert_eq!(spec["issuerRef"]["name"], "switchyard-ca");
    }
}
