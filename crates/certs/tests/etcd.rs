//! components/etcd's TLS settings with the certificates switchyard-certs writes, on the
//! harness's etcd (the version the component runs): every `ETCD_*` variable of the built
//! StatefulSet is passed as it is, only the addresses moved to loopback and the Secret's mount
//! to a temporary directory. The component's Job then applies etcd's access table as it does
//! in a cluster (etcd's own certificate, the endpoints of the ConfigMap): the queue's and the
//! elector's certificates reach Switchyard's keys; the watcher's, the reconciler's and the
//! observer's are refused by etcd's RBAC; no certificate, or one from another CA, is refused
//! by TLS.

#![allow(clippy::unwrap_used)]

use std::{
    net::TcpListener,
    path::Path,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_norway::Value;
use switchyard_testenv::Binaries;

/// How long a one-member etcd gets to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Where the component mounts the Secret switchyard-etcd-tls.
const MOUNT: &str = "/var/run/switchyard/tls/";

struct Etcd(Child);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn docs(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name_prefix: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(name_prefix))
        })
        .unwrap_or_else(|| panic!("{kind} {name_prefix}* in the build"))
}

/// `scheme://host:port` of the component, with the host and port this test uses.
fn to_loopback(url: &str, listen: bool, ports: &[(u16, u16)]) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let port: u16 = rest.rsplit_once(':').unwrap().1.parse().unwrap();
    let port = ports.iter().find(|(from, _)| *from == port).unwrap().1;
    let host = if listen { "127.0.0.1" } else { "localhost" };
    format!("{scheme}://{host}:{port}")
}

fn etcdctl(binaries: &Binaries, endpoint: &str, tls: &[(&str, &Path)], args: &[&str]) -> Output {
    let mut command = Command::new(binaries.path("etcdctl"));
    command
        .arg(format!("--endpoints={endpoint}"))
        .args(["--dial-timeout=2s", "--command-timeout=3s"]);
    for (flag, path) in tls {
        command.arg(format!("--{flag}={}", path.display()));
    }
    command.args(args).env_clear().output().unwrap()
}

/// The arguments of the component's Job that applies etcd's access table.
fn access_job(objects: &[Value]) -> Vec<String> {
    let job = find(objects, "Job", "switchyard-etcd-access");
    let pod = &job["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tls")
        .unwrap();
    assert_eq!(
        volume["secret"]["secretName"], "switchyard-etcd-tls",
        "the Job administers with etcd's certificate"
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["command"][0], "/usr/local/bin/switchyard-etcd-access",
        "{container:?}"
    );
    assert_eq!(
        container["envFrom"][0]["configMapRef"]["name"]
            .as_str()
            .map(|n| n.starts_with("switchyard-etcd-endpoints")),
        Some(true)
    );
    container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_etcd_component_serves_mutual_tls_to_switchyard_identities_only() {
    let binaries = Binaries::locate().expect("control plane binaries");
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    let other = tmp.path().join("other");
    for out in [&certs, &other] {
        let status = Command::new(env!("CARGO_BIN_EXE_switchyard-certs"))
            .arg("--out")
            .arg(out)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
    }

    let overlay =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kustomize/overlays/with-etcd");
    let built = Command::new(binaries.path("kustomize"))
        .arg("build")
        .arg(&overlay)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let objects = docs(&String::from_utf8(built.stdout).unwrap());

    // The elector and the queue dial etcd over TLS.
    let endpoints = find(&objects, "ConfigMap", "switchyard-etcd-endpoints")["data"]
        ["SWITCHYARD_ETCD_ENDPOINTS"]
        .as_str()
        .unwrap();
    for url in endpoints.split(',') {
        assert!(
            url.starts_with("https://") && url.contains(".switchyard-etcd.switchyard.svc:"),
            "{url}: https, by a name the etcd certificate carries"
        );
    }

    let statefulset = find(&objects, "StatefulSet", "switchyard-etcd");
    let pod = &statefulset["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tls")
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], "switchyard-etcd-tls");
    let container = &pod["containers"][0];
    assert!(
        container["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "tls" && m["mountPath"] == MOUNT.trim_end_matches('/'))
    );

    let (client, peer, metrics) = (free_port(), free_port(), free_port());
    let ports = [(2379, client), (2380, peer), (2381, metrics)];
    let identity = certs.join("switchyard-etcd");
    let mut command = Command::new(binaries.path("etcd"));
    command
        .env_clear()
        .env("ETCD_NAME", "switchyard-etcd-0")
        .env(
            "ETCD_INITIAL_CLUSTER",
            format!(
                "switchyard-etcd-0={}",
                to_loopback("https://x:2380", false, &ports)
            ),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(tmp.path().join("etcd.log")).unwrap());
    let mut tls_settings = 0;
    for var in container["env"].as_sequence().unwrap() {
        let (name, Some(value)) = (var["name"].as_str().unwrap(), var["value"].as_str()) else {
            continue;
        };
        let value = if name == "ETCD_DATA_DIR" {
            tmp.path().join("data").display().to_string()
        } else if name.ends_with("_URLS") {
            to_loopback(value, name.starts_with("ETCD_LISTEN_"), &ports)
        } else if let Some(file) = value.strip_prefix(MOUNT) {
            tls_settings += 1;
            identity.join(file).display().to_string()
        } else {
            value.to_owned()
        };
        command.env(name, value);
    }
    assert_eq!(tls_settings, 6, "client and peer: cert, key, trusted CA");
    let _etcd = Etcd(command.spawn().unwrap());

    let endpoint = format!("https://localhost:{client}");
    let file = |identity: &str, name: &str| certs.join(identity).join(name);
    let as_identity = |identity: &str| {
        vec![
            ("cacert", certs.join("ca.crt")),
            ("cert", file(identity, "tls.crt")),
            ("key", file(identity, "tls.key")),
        ]
    };
    let run = |tls: &[(&str, std::path::PathBuf)], args: &[&str]| {
        let tls: Vec<_> = tls.iter().map(|(f, p)| (*f, p.as_path())).collect();
        etcdctl(&binaries, &endpoint, &tls, args)
    };
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let out = run(&as_identity("switchyard-etcd"), &["endpoint", "health"]);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "etcd with the component's settings answers its own certificate: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(tmp.path().join("etcd.log")).unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // What the Job does in a cluster: its flags, with the Secret's mount moved here.
    let job_args = access_job(&objects);
    let mut etcd_tls = switchyard_shards::EtcdTlsArgs::default();
    for arg in &job_args {
        let (flag, value) = arg.split_once('=').unwrap();
        let value = value.strip_prefix(MOUNT).unwrap();
        let path = Some(file("switchyard-etcd", value));
        match flag {
            "--etcd-tls-cert" => etcd_tls.etcd_tls_cert = path,
            "--etcd-tls-key" => etcd_tls.etcd_tls_key = path,
            "--etcd-tls-ca" => etcd_tls.etcd_tls_ca = path,
            other => panic!("unexpected Job flag {other}"),
        }
    }
    let admin = switchyard_shards::Etcd::from_args(
        std::slice::from_ref(&endpoint),
        &etcd_tls,
        &switchyard_runtime::TlsArgs::plaintext(),
    )
    .unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut client = admin.connect().await.unwrap();
        for _ in 0..2 {
            switchyard_shards::access::apply(&mut client, &[switchyard_shards::access::ADMIN])
                .await
                .unwrap();
        }
    });

    let shard = "/switchyard/shards/00000";
    let put = run(&as_identity("switchyard-queue"), &["put", shard, "v"]);
    assert!(
        put.status.success(),
        "the queue writes a shard: {}",
        String::from_utf8_lossy(&put.stderr)
    );
    let read = run(
        &as_identity("switchyard-elector"),
        &["get", shard, "--print-value-only"],
    );
    assert_eq!(String::from_utf8_lossy(&read.stdout).trim(), "v");
    for identity in [
        "switchyard-watcher",
        "switchyard-reconciler",
        "switchyard-observer",
    ] {
        for args in [&["get", shard][..], &["put", shard, "forged"]] {
            let out = run(&as_identity(identity), args);
            assert!(
                !out.status.success()
                    && String::from_utf8_lossy(&out.stderr).contains("permission denied"),
                "{identity} {args:?}: refused by etcd's RBAC: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let read = run(
        &as_identity("switchyard-etcd"),
        &["get", shard, "--print-value-only"],
    );
    assert_eq!(String::from_utf8_lossy(&read.stdout).trim(), "v");

    let ca = certs.join("ca.crt");
    let stranger = other.join("switchyard-queue");
    let (stranger_crt, stranger_key) = (stranger.join("tls.crt"), stranger.join("tls.key"));
    let refused: [(&str, Vec<(&str, &Path)>); 2] = [
        ("no client certificate", vec![("cacert", ca.as_path())]),
        (
            "a certificate of another CA",
            vec![
                ("cacert", ca.as_path()),
                ("cert", stranger_crt.as_path()),
                ("key", stranger_key.as_path()),
            ],
        ),
    ];
    for (what, tls) in refused {
        let out = etcdctl(&binaries, &endpoint, &tls, &["get", shard]);
        assert!(!out.status.success(), "{what}: refused");
    }
}
