//! deploy/kustomize against the real apiserver: every overlay builds with the harness's
//! kustomize and applies with server-side apply, with no error and no warning, and a second
//! apply changes nothing; the service accounts can do what their services need and no more.
//! cert-manager's CRDs are installed, so its objects meet the real schema; the Component
//! switchyard-certs writes applies on an overlay in their place, and the aggregation layer
//! trusts the queue's certificate through either route's caBundle. The Prometheus Operator's
//! CRDs are installed too: components/monitoring applies on an overlay against their schema,
//! and its ServiceMonitors reach every service's admin port.

#![allow(clippy::unwrap_used)]

#[path = "deploy_support.rs"]
mod support;

use std::path::Path;

use clap::Parser;
use support::{
    APISERVICE, FIELD_MANAGER, NAMESPACE, OVERLAYS, OVERLAYS_WITH_EXTERNAL_METRICS, Queue, TestPki,
    apply_cleanly, await_apiservice_available, base_dir, build_for_loopback, build_wrapped,
    component_dir, inject_ca_bundle, install_cert_manager_crds, install_prometheus_operator_crds,
    kubectl, kustomize_build, overlay_dir, resource_versions, unregister_external_metrics,
};
use switchyard_certs::identities;
use switchyard_testenv::{Binaries, ControlPlane};

/// The tests of this binary apply overlapping objects; one at a time.
static APPLYING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_overlay_applies_cleanly_and_a_second_apply_changes_nothing() {
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    install_cert_manager_crds(plane).await;
    let pki = TestPki::shared(plane);
    // The APIService must be served for discovery to stay quiet: an unavailable aggregated
    // API makes kubectl print discovery errors.
    let queue = Queue::start(256, plane.front_proxy_ca(), &pki.queue).await;

    // The base builds on its own too, and takes no cluster-wide API over: the external
    // metrics API is components/external-metrics' (KEDA or prometheus-adapter may serve it).
    let base = kustomize_build(plane, &base_dir()).await;
    assert!(
        !base.contains("kind: APIService"),
        "the base registers no APIService"
    );
    assert!(
        !base.contains("--external-metrics"),
        "the base's queue serves no external metrics"
    );

    for overlay in OVERLAYS {
        let manifests = build_for_loopback(plane, overlay, queue.metrics_port, "").await;
        let serves_metrics = OVERLAYS_WITH_EXTERNAL_METRICS.contains(&overlay);
        assert_eq!(
            manifests.contains("kind: APIService"),
            serves_metrics,
            "{overlay}: the external metrics APIService only with components/external-metrics"
        );
        assert_eq!(
            manifests.contains("--external-metrics-addr=0.0.0.0:6443")
                && manifests.contains("--external-metrics-client-ca="),
            serves_metrics,
            "{overlay}: the queue serves the external metrics API only with the component"
        );
        assert!(
            !manifests.contains("insecureSkipTLSVerify"),
            "{overlay}: the APIService verifies the queue"
        );
        assert_eq!(
            manifests.contains("cert-manager.io/inject-ca-from: switchyard/switchyard-queue"),
            serves_metrics,
            "{overlay}: cert-manager injects the APIService's caBundle"
        );
        for identity in identities::ALL {
            let secret = identity.secret_name();
            assert!(
                manifests.contains(&format!("secretName: {secret}")),
                "{overlay}: a Certificate fills {secret}"
            );
        }
        if overlay == "otel" {
            // Traces leave over mutual TLS from every workload that has a certificate.
            let workloads = manifests
                .matches("mountPath: /var/run/switchyard/tls\n")
                .count();
            assert!(
                workloads >= 4,
                "otel: {workloads} workloads mount a certificate"
            );
            assert!(
                manifests.contains("OTEL_EXPORTER_OTLP_ENDPOINT: https://"),
                "otel: the collector is reached over TLS"
            );
            for variable in [
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            ] {
                assert_eq!(
                    manifests.matches(&format!("name: {variable}\n")).count(),
                    workloads,
                    "otel: every workload sets {variable}"
                );
            }
        }
        let first = apply_cleanly(plane, &format!("{overlay}: first apply"), &manifests).await;
        assert!(first.contains("serverside-applied"), "{overlay}: {first}");
        assert!(
            first.contains("certificate.cert-manager.io/switchyard-queue serverside-applied"),
            "{overlay}: {first}"
        );
        if serves_metrics {
            // As cert-manager's CA injector would: the queue's CA into the APIService, under
            // the injector's own field manager.
            inject_ca_bundle(plane, &pki.ca_pem).await;
            // The aggregation layer reaches the queue and verifies its certificate (its
            // status changes once, so wait before recording resource versions).
            await_apiservice_available(plane).await;
        }

        let before = resource_versions(plane, &manifests).await;
        assert!(
            before.len() > 20,
            "{overlay}: every object exists: {before:?}"
        );
        for identity in identities::ALL {
            let certificate = format!("Certificate/{NAMESPACE}/{}=", identity.service_account);
            assert!(
                before.iter().any(|object| object.starts_with(&certificate)),
                "{overlay}: {certificate} exists: {before:?}"
            );
        }
        apply_cleanly(plane, &format!("{overlay}: second apply"), &manifests).await;
        let after = resource_versions(plane, &manifests).await;
        assert_eq!(before, after, "{overlay}: the second apply changed objects");

        let diff = kubectl(
            plane,
            &[
                "diff",
                "--server-side",
                &format!("--field-manager={FIELD_MANAGER}"),
                "-f",
                "-",
            ],
            Some(&manifests),
        )
        .await;
        assert_eq!(
            diff.code,
            Some(0),
            "{overlay}: kubectl diff finds no difference\n{}\n{}",
            diff.stdout,
            diff.stderr
        );
    }
    unregister_external_metrics(plane).await;
    queue.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_manager_s_schema_is_enforced_on_what_the_component_applies() {
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    install_cert_manager_crds(plane).await;
    // A misspelt field and a field of the wrong type, in the component's own Certificate: the
    // real schema refuses both, so a passing apply of the component means something.
    let certificates = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/kustomize/components/cert-manager/certificates.yaml"),
    )
    .unwrap();
    let watcher = certificates
        .split("\n---\n")
        .find(|doc| doc.contains("name: switchyard-watcher\n"))
        .unwrap()
        .replace("namespace: switchyard", "namespace: default");
    for (broken, refused) in [
        (
            watcher.replace("  dnsNames:", "  dnsName:"),
            ".spec.dnsName: field not declared in schema",
        ),
        (
            watcher.replace("  duration: 2160h", "  duration: [2160h]"),
            "spec.duration",
        ),
    ] {
        let out = kubectl(
            plane,
            &["apply", "--server-side", "--validate=strict", "-f", "-"],
            Some(&broken),
        )
        .await;
        assert!(
            !out.success && out.stderr.contains(refused),
            "refused, naming {refused}: {out:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switchyard_certs_component_applies_on_an_overlay_and_the_apiserver_trusts_its_ca() {
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    let pki = TestPki::shared(plane);
    // Signed by the test CA, so the caBundle it sets is the one the injector test sets (the
    // apiserver keeps one APIService; two field managers may own one value, not two).
    let out = plane.dir().join("switchyard-certs");
    let written = switchyard_certs::cli::Args::try_parse_from([
        "switchyard-certs".as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
        "--ca-cert".as_ref(),
        pki.ca_cert.as_os_str(),
        "--ca-key".as_ref(),
        pki.ca_key.as_os_str(),
    ])
    .unwrap()
    .run()
    .unwrap();
    assert!(!written.generated_ca && !out.join("ca.key").exists());

    // The queue serves the certificate switchyard-certs wrote for it.
    let queue = Queue::start(256, plane.front_proxy_ca(), &out.join("switchyard-queue")).await;
    // The external metrics API added to an overlay, then the certificates (whose caBundle
    // patch needs the APIService), as docs/certificates.md says.
    let external_metrics = component_dir("external-metrics");
    let manifests = build_wrapped(
        plane,
        &overlay_dir("dev"),
        &[&external_metrics, &out],
        queue.metrics_port,
        "",
    )
    .await;
    assert!(
        !manifests.contains("cert-manager.io"),
        "cert-manager's objects and annotation are gone:\n{manifests}"
    );
    assert_eq!(
        manifests.matches("type: kubernetes.io/tls").count(),
        identities::ALL.len()
    );
    {
        use base64::Engine;
        let bundle = base64::engine::general_purpose::STANDARD.encode(&pki.ca_pem);
        assert!(manifests.contains(&format!("caBundle: {bundle}")));
    }

    apply_cleanly(plane, "dev with switchyard-certs: first apply", &manifests).await;
    await_apiservice_available(plane).await;
    let before = resource_versions(plane, &manifests).await;
    for identity in identities::ALL {
        let secret = format!("Secret/{NAMESPACE}/{}=", identity.secret_name());
        assert!(
            before.iter().any(|object| object.starts_with(&secret)),
            "{secret} exists: {before:?}"
        );
    }
    apply_cleanly(plane, "dev with switchyard-certs: second apply", &manifests).await;
    assert_eq!(before, resource_versions(plane, &manifests).await);

    // The Secret holds the files as written.
    let crt = kubectl(
        plane,
        &[
            "get",
            "secret",
            "switchyard-queue-tls",
            "--namespace",
            NAMESPACE,
            "-o",
            r"jsonpath={.data.tls\.crt}",
        ],
        None,
    )
    .await;
    {
        use base64::Engine;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(crt.stdout.trim())
            .unwrap();
        assert_eq!(
            decoded,
            std::fs::read(out.join("switchyard-queue/tls.crt")).unwrap()
        );
    }
    let skip = kubectl(
        plane,
        &[
            "get",
            "apiservice",
            APISERVICE,
            "-o",
            "jsonpath={.spec.insecureSkipTLSVerify}",
        ],
        None,
    )
    .await;
    assert_eq!(skip.stdout, "", "no insecureSkipTLSVerify");
    unregister_external_metrics(plane).await;
    queue.stop().await;
}

/// What components/monitoring must hold, read from the built manifests: for every service a
/// ServiceMonitor whose selector finds one Service, whose port reaches the admin port of that
/// service's pods, named after the service (the job label); the dashboard for Grafana's
/// sidecar; and the six alerts.
fn assert_monitoring_objects(manifests: &str) {
    let objects: Vec<serde_norway::Value> = serde_norway::Deserializer::from_str(manifests)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect();
    let of_kind = |kind: &str| -> Vec<&serde_norway::Value> {
        objects.iter().filter(|o| o["kind"] == kind).collect()
    };
    let labels_match = |selector: &serde_norway::Value, labels: &serde_norway::Value| {
        selector
            .as_mapping()
            .unwrap()
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    };
    for service in ["watcher", "queue", "reconciler", "elector"] {
        let name = format!("switchyard-{service}");
        let workload = objects
            .iter()
            .find(|o| {
                (o["kind"] == "Deployment" || o["kind"] == "StatefulSet")
                    && o["metadata"]["name"] == name.as_str()
            })
            .unwrap_or_else(|| panic!("{name}: a workload"));
        let pod = &workload["spec"]["template"];
        let admin = pod["spec"]["containers"][0]["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "admin")
            .unwrap_or_else(|| panic!("{name}: an admin container port"));
        assert_eq!(admin["containerPort"].as_u64(), Some(9990));

        let monitors: Vec<_> = of_kind("ServiceMonitor")
            .into_iter()
            .filter(|m| m["metadata"]["name"] == name.as_str())
            .collect();
        assert_eq!(monitors.len(), 1, "{name}: one ServiceMonitor");
        let monitor = &monitors[0]["spec"];
        assert_eq!(monitors[0]["metadata"]["namespace"], NAMESPACE);
        let endpoint = &monitor["endpoints"][0];
        assert_eq!(endpoint["path"], "/metrics", "{name}");
        let services: Vec<_> = of_kind("Service")
            .into_iter()
            .filter(|s| s["metadata"]["namespace"] == NAMESPACE)
            .filter(|s| {
                labels_match(
                    &monitor["selector"]["matchLabels"],
                    &s["metadata"]["labels"],
                )
            })
            .collect();
        assert_eq!(
            services.len(),
            1,
            "{name}: the ServiceMonitor selects one Service: {services:?}"
        );
        let scraped = services[0];
        assert!(
            labels_match(&scraped["spec"]["selector"], &pod["metadata"]["labels"]),
            "{name}: the Service selects the service's pods"
        );
        let port = scraped["spec"]["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == endpoint["port"])
            .unwrap_or_else(|| panic!("{name}: the Service has the ServiceMonitor's port"));
        assert_eq!(port["targetPort"], "admin", "{name}: to the admin port");
        let job_label = monitor["jobLabel"].as_str().unwrap();
        assert_eq!(
            scraped["metadata"]["labels"][job_label],
            name.as_str(),
            "{name}: the job label names the service"
        );
    }
    assert_eq!(of_kind("ServiceMonitor").len(), 4);

    let dashboards: Vec<_> = of_kind("ConfigMap")
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect();
    assert_eq!(dashboards.len(), 1, "one ConfigMap for Grafana's sidecar");
    assert_eq!(dashboards[0]["metadata"]["name"], "switchyard-dashboard");
    let dashboard: serde_json::Value =
        serde_json::from_str(dashboards[0]["data"]["switchyard.json"].as_str().unwrap()).unwrap();
    assert_eq!(dashboard["uid"], "switchyard");

    let rules = of_kind("PrometheusRule");
    assert_eq!(rules.len(), 1);
    let mut alerts: Vec<&str> = rules[0]["spec"]["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    alerts.sort_unstable();
    assert_eq!(
        alerts,
        [
            "SwitchyardApiserverClientThrottled",
            "SwitchyardBacklogGrowing",
            "SwitchyardCertificateExpiring",
            "SwitchyardNoElectorLeader",
            "SwitchyardPeerControllerManager",
            "SwitchyardReconcileErrorRatio",
            "SwitchyardReconcilerStalled",
            "SwitchyardShardWithoutOwner",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitoring_component_applies_on_an_overlay_against_the_prometheus_operator_s_schema() {
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    install_cert_manager_crds(plane).await;
    install_prometheus_operator_crds(plane).await;
    let pki = TestPki::shared(plane);
    let queue = Queue::start(256, plane.front_proxy_ca(), &pki.queue).await;
    let monitoring = component_dir("monitoring");
    let external_metrics = component_dir("external-metrics");
    let manifests = build_wrapped(
        plane,
        &overlay_dir("dev"),
        &[&external_metrics, &monitoring],
        queue.metrics_port,
        "",
    )
    .await;
    assert_monitoring_objects(&manifests);

    let first = apply_cleanly(plane, "dev with monitoring: first apply", &manifests).await;
    for applied in [
        "servicemonitor.monitoring.coreos.com/switchyard-queue serverside-applied",
        "prometheusrule.monitoring.coreos.com/switchyard serverside-applied",
        "configmap/switchyard-dashboard serverside-applied",
        "service/switchyard-reconciler-admin serverside-applied",
    ] {
        assert!(first.contains(applied), "{applied}:\n{first}");
    }
    inject_ca_bundle(plane, &pki.ca_pem).await;
    await_apiservice_available(plane).await;
    let before = resource_versions(plane, &manifests).await;
    apply_cleanly(plane, "dev with monitoring: second apply", &manifests).await;
    assert_eq!(before, resource_versions(plane, &manifests).await);

    // The schemas are enforced, so the clean apply above means something: a misspelt field
    // of a ServiceMonitor and a malformed duration of an alert are refused.
    let component = |file: &str| std::fs::read_to_string(monitoring.join(file)).unwrap();
    let monitor = component("servicemonitors.yaml")
        .split("\n---\n")
        .find(|doc| doc.contains("name: switchyard-queue\n"))
        .unwrap()
        .replace("namespace: switchyard", "namespace: default");
    let alerts = component("alerts.yaml").replace("namespace: switchyard", "namespace: default");
    for (broken, refused) in [
        (
            monitor.replace("      path: /metrics", "      paht: /metrics"),
            ".spec.endpoints[0].paht: field not declared in schema",
        ),
        (
            alerts.replace("for: 10m", "for: ten minutes"),
            "spec.groups[0].rules[0].for",
        ),
    ] {
        let out = kubectl(
            plane,
            &["apply", "--server-side", "--validate=strict", "-f", "-"],
            Some(&broken),
        )
        .await;
        assert!(
            !out.success && out.stderr.contains(refused),
            "refused, naming {refused}: {out:?}"
        );
    }
    unregister_external_metrics(plane).await;
    queue.stop().await;
}

/// The flags each workload of the base passes are its service's flags, and every service
/// mounts its own certificate where `--tls-*` point.
#[test]
fn every_service_mounts_its_certificate_and_its_flags_parse() {
    let binaries = Binaries::locate().expect("control plane binaries");
    let built = std::process::Command::new(binaries.path("kustomize"))
        .arg("build")
        .arg(base_dir())
        .output()
        .unwrap();
    assert!(built.status.success());
    let objects: Vec<serde_norway::Value> =
        serde_norway::Deserializer::from_str(&String::from_utf8(built.stdout).unwrap())
            .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
            .collect();
    let mut services = Vec::new();
    for object in &objects {
        if object["kind"] != "Deployment" && object["kind"] != "StatefulSet" {
            continue;
        }
        let pod = &object["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let service = container["name"].as_str().unwrap();
        let args: Vec<String> = container["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        for (flag, file) in [
            ("tls-cert", "tls.crt"),
            ("tls-key", "tls.key"),
            ("tls-ca", "ca.crt"),
        ] {
            let arg = format!("--{flag}=/var/run/switchyard/tls/{file}");
            assert!(args.contains(&arg), "{service}: {arg} in {args:?}");
        }
        let tls = pod["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "tls")
            .unwrap_or_else(|| panic!("{service}: a tls volume"));
        assert_eq!(
            tls["secret"]["secretName"].as_str(),
            Some(format!("switchyard-{service}-tls").as_str())
        );
        assert!(
            container["volumeMounts"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|m| { m["name"] == "tls" && m["mountPath"] == "/var/run/switchyard/tls" }),
            "{service}: the Secret mounted where --tls-* point"
        );
        parse(service, &args).unwrap_or_else(|e| panic!("{service} {args:?}: {e}"));
        // The parsers refuse what they do not know, so the check above means something.
        let mut unknown = args.clone();
        unknown.push("--no-such-flag".to_owned());
        assert!(parse(service, &unknown).is_err(), "{service}");
        services.push(service.to_owned());
    }
    services.sort();
    assert_eq!(services, ["elector", "queue", "reconciler", "watcher"]);
}

fn parse(service: &str, args: &[String]) -> Result<(), clap::Error> {
    let argv = std::iter::once(format!("switchyard-{service}")).chain(args.iter().cloned());
    match service {
        "elector" => switchyard_elector::Args::try_parse_from(argv).map(drop),
        "queue" => switchyard_queue::Args::try_parse_from(argv).map(drop),
        "reconciler" => switchyard_reconciler::Args::try_parse_from(argv).map(drop),
        "watcher" => switchyard_watcher::Args::try_parse_from(argv).map(drop),
        other => panic!("no service {other}"),
    }
}

/// The CRDs the tests install (deploy/crds of cert-manager's module) have the schemas of
/// the Helm chart's CRD templates, once the template's own lines (`{{ ... }}`) are dropped.
#[test]
fn the_installed_cert_manager_crds_are_the_chart_s() {
    let binaries = Binaries::locate().expect("control plane binaries");
    let installed: Vec<serde_norway::Value> = serde_norway::Deserializer::from_str(
        &std::fs::read_to_string(binaries.cert_manager_crds()).unwrap(),
    )
    .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
    .collect();
    assert_eq!(installed.len(), support::CERT_MANAGER_CRDS.len());
    for crd in &installed {
        let name = crd["metadata"]["name"].as_str().unwrap();
        let (plural, group) = name.split_once('.').unwrap();
        let template = binaries
            .cert_manager_chart_crds()
            .join(format!("crd-{group}_{plural}.yaml"));
        let text: String = std::fs::read_to_string(&template)
            .unwrap()
            .lines()
            .filter(|line| !line.contains("{{"))
            .map(|line| format!("{line}\n"))
            .collect();
        let chart: serde_norway::Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(chart["metadata"]["name"].as_str(), Some(name));
        assert_eq!(
            crd["spec"],
            chart["spec"],
            "{name}: deploy/crds and {} differ",
            template.display()
        );
    }
}

/// Objects of these kinds from the base: identities and their permissions.
fn rbac_only(manifests: &str) -> String {
    const KINDS: [&str; 6] = [
        "kind: Namespace",
        "kind: ServiceAccount",
        "kind: ClusterRole",
        "kind: ClusterRoleBinding",
        "kind: Role",
        "kind: RoleBinding",
    ];
    manifests
        .split("\n---\n")
        .filter(|doc| doc.lines().any(|line| KINDS.contains(&line)))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// `kubectl auth can-i <verb> <type/name> --as=<service's account> --namespace=<namespace>`.
async fn can_i_in(
    plane: &ControlPlane,
    service: &str,
    verb: &str,
    object: &str,
    namespace: &str,
) -> bool {
    let account = format!("--as=system:serviceaccount:{NAMESPACE}:switchyard-{service}");
    let namespace = format!("--namespace={namespace}");
    let args = ["auth", "can-i", verb, object, &account, &namespace];
    let out = kubectl(plane, &args, None).await;
    match out.stdout.trim() {
        "yes" => true,
        "no" => false,
        other => panic!("kubectl auth can-i {args:?}: {other:?} {}", out.stderr),
    }
}

async fn can_i(plane: &ControlPlane, service: &str, verb: &str, resource: &str) -> bool {
    let account = format!("--as=system:serviceaccount:{NAMESPACE}:switchyard-{service}");
    let mut args = vec!["auth", "can-i", verb];
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(format!("--subresource={sub}"))),
        None => (resource, None),
    };
    args.push(resource);
    if let Some(sub) = &subresource {
        args.push(sub);
    }
    args.extend([account.as_str(), "--namespace=default"]);
    let out = kubectl(plane, &args, None).await;
    match out.stdout.trim() {
        "yes" => true,
        "no" => false,
        other => panic!("kubectl auth can-i {args:?}: {other:?} {}", out.stderr),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_account_has_what_its_service_needs_and_nothing_more() {
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    let base = kustomize_build(plane, &base_dir()).await;
    let rbac = rbac_only(&base);
    assert_eq!(
        rbac.matches("kind: ClusterRoleBinding").count(),
        2 + switchyard_reconciler::BUILTINS.len(),
        "only the watcher (its own role, the garbage collector's graph) and the built-in \
         controllers' accounts are bound to cluster roles:\n{rbac}"
    );
    apply_cleanly(plane, "base RBAC", &rbac).await;
    // The apiserver's RBAC authorizer reads roles through its own informers: wait until it
    // has the last of them before asking what it allows.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let account = "--as=system:serviceaccount:switchyard:switchyard-namespace-controller";
        let out = kubectl(
            plane,
            &["auth", "can-i", "create", "events.events.k8s.io", account],
            None,
        )
        .await;
        if out.stdout.trim() == "yes" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the base RBAC took effect: {}",
            out.stdout
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    let allowed: &[(&str, &[&str], &[&str])] = &[
        (
            "watcher",
            &["get", "list", "watch"],
            &[
                "pods",
                "namespaces",
                "serviceaccounts",
                "replicasets.apps",
                "deployments.apps",
                "services",
                "endpointslices.discovery.k8s.io",
                "endpoints",
            ],
        ),
        (
            "replicaset-controller",
            &["list", "create", "delete", "patch"],
            &["pods"],
        ),
        ("replicaset-controller", &["get"], &["replicasets.apps"]),
        (
            "replicaset-controller",
            &["update"],
            &["replicasets.apps/status", "replicasets.apps/finalizers"],
        ),
        (
            "deployment-controller",
            &["get", "create", "update", "patch", "delete"],
            &["replicasets.apps"],
        ),
        ("deployment-controller", &["get"], &["deployments.apps"]),
        (
            "deployment-controller",
            &["update"],
            &["deployments.apps/status", "deployments.apps/finalizers"],
        ),
        // The garbage collector's graph and its deletions, on any resource.
        (
            "watcher",
            &["list", "watch"],
            &["secrets", "configmaps", "nodes"],
        ),
        (
            "garbage-collector",
            &["get", "patch", "delete"],
            &["configmaps", "nodes"],
        ),
        // The namespace controller: the namespace being deleted, and everything in it.
        ("namespace-controller", &["get"], &["namespaces"]),
        (
            "namespace-controller",
            &["update"],
            &["namespaces/status", "namespaces/finalize"],
        ),
        (
            "namespace-controller",
            &["list", "delete", "deletecollection"],
            &["pods", "secrets", "configmaps", "deployments.apps"],
        ),
        // The service account controller: the `default` account of every namespace.
        (
            "serviceaccount-controller",
            &["create"],
            &["serviceaccounts"],
        ),
    ];
    for builtin in switchyard_reconciler::BUILTINS {
        let controller = builtin.service_account.strip_prefix("switchyard-").unwrap();
        let records = builtin
            .permissions
            .contains(&switchyard_reconciler::RECORD_EVENTS);
        assert_eq!(
            can_i(plane, controller, "create", "events.events.k8s.io").await
                && can_i(plane, controller, "patch", "events.events.k8s.io").await,
            records,
            "{controller} records events: {records}"
        );
        // The reconciler may act as each controller's account, and as nothing else.
        let account = format!("serviceaccounts/switchyard-{controller}");
        assert!(
            can_i_in(plane, "reconciler", "impersonate", &account, NAMESPACE).await,
            "the reconciler must be allowed to impersonate {account}"
        );
    }
    for account in [
        "serviceaccounts/switchyard-watcher",
        "serviceaccounts/switchyard-queue",
        "serviceaccounts/default",
    ] {
        assert!(
            !can_i_in(plane, "reconciler", "impersonate", account, NAMESPACE).await,
            "the reconciler must not impersonate {account}"
        );
    }
    assert!(
        !can_i_in(plane, "reconciler", "impersonate", "users/admin", "default").await
            && !can_i_in(
                plane,
                "reconciler",
                "impersonate",
                "groups/system:masters",
                "default"
            )
            .await,
        "the reconciler impersonates no user or group"
    );
    for (service, verbs, resources) in allowed {
        for verb in *verbs {
            for resource in *resources {
                assert!(
                    can_i(plane, service, verb, resource).await,
                    "{service} must be allowed to {verb} {resource}"
                );
            }
        }
    }

    let denied: &[(&str, &[&str], &[&str])] = &[
        // The watcher never writes, and reads only what it watches.
        (
            "watcher",
            &["create", "update", "patch", "delete"],
            &["pods", "replicasets.apps", "deployments.apps"],
        ),
        // The garbage collector's graph lists the metadata of everything; nothing is read
        // by name but what is watched.
        (
            "watcher",
            &["get"],
            &["secrets", "configmaps", "ingresses.networking.k8s.io"],
        ),
        // The reconciler's own account writes nothing and reads nothing: its controllers'
        // requests carry their own accounts.
        (
            "reconciler",
            &["get", "list", "create", "patch", "delete"],
            &[
                "pods",
                "secrets",
                "replicasets.apps",
                "deployments.apps",
                "namespaces",
            ],
        ),
        // One controller cannot write another's objects.
        (
            "replicaset-controller",
            &["create", "delete"],
            &["replicasets.apps", "deployments.apps", "configmaps"],
        ),
        (
            "deployment-controller",
            &["create", "delete", "patch"],
            &["pods", "deployments.apps", "secrets"],
        ),
        (
            "garbage-collector",
            &["list", "watch", "create", "update"],
            &["pods", "secrets", "configmaps"],
        ),
        // The controllers read through the watcher's cache: no watch of their own. The
        // namespace controller lists and deletes anything, but updates no content, creates
        // no namespace and changes no RBAC.
        ("namespace-controller", &["watch", "update"], &["pods"]),
        (
            "namespace-controller",
            &["watch", "create", "update"],
            &["secrets", "configmaps"],
        ),
        (
            "namespace-controller",
            &["create"],
            &["events", "clusterroles.rbac.authorization.k8s.io"],
        ),
        (
            "namespace-controller",
            &["create", "update"],
            &["nodes", "namespaces"],
        ),
        // The service account controller creates accounts and does nothing else to them.
        (
            "serviceaccount-controller",
            &["get", "list", "watch", "update", "patch", "delete"],
            &["serviceaccounts", "secrets", "pods"],
        ),
        // The pod garbage collector deletes Pods and reads a Node now and then, no more.
        (
            "pod-garbage-collector",
            &["create", "list", "watch", "update"],
            &["pods"],
        ),
        (
            "pod-garbage-collector",
            &["update", "patch", "delete"],
            &["nodes"],
        ),
        // The queue and the elector need no Kubernetes access at all.
        (
            "queue",
            &["get", "list", "create", "patch", "delete"],
            &[
                "pods",
                "configmaps",
                "secrets",
                "replicasets.apps",
                "leases.coordination.k8s.io",
            ],
        ),
        (
            "elector",
            &["get", "list", "create", "patch", "delete"],
            &[
                "pods",
                "configmaps",
                "secrets",
                "replicasets.apps",
                "leases.coordination.k8s.io",
            ],
        ),
    ];
    for (service, verbs, resources) in denied {
        for verb in *verbs {
            for resource in *resources {
                assert!(
                    !can_i(plane, service, verb, resource).await,
                    "{service} must not be allowed to {verb} {resource}"
                );
            }
        }
    }

    // The queue, the elector and the controllers' accounts do not even get a token mounted.
    let controllers = switchyard_reconciler::BUILTINS
        .iter()
        .map(|b| b.service_account.strip_prefix("switchyard-").unwrap());
    for service in ["queue", "elector"].into_iter().chain(controllers) {
        let out = kubectl(
            plane,
            &[
                "get",
                "serviceaccount",
                &format!("switchyard-{service}"),
                "--namespace",
                NAMESPACE,
                "-o",
                "jsonpath={.automountServiceAccountToken}",
            ],
            None,
        )
        .await;
        assert_eq!(out.stdout, "false", "{service}: {}", out.stderr);
    }
}

/// The patch docs/deploy.md gives to admit scrapes from another namespace.
const MONITORING_NAMESPACE_PATCH: &str = r#"  - target: {kind: NetworkPolicy, name: switchyard-admin}
    patch: |-
      - op: replace
        path: /spec/ingress/0/from/0/namespaceSelector/matchLabels/kubernetes.io~1metadata.name
        value: observability
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_admits_scrapes_from_the_monitoring_namespace_only() {
    let plane = ControlPlane::shared().expect("control plane");
    let admin_policy = |manifests: &str| -> String {
        manifests
            .split("\n---\n")
            .find(|doc| {
                doc.contains("kind: NetworkPolicy") && doc.contains("name: switchyard-admin")
            })
            .unwrap()
            .to_owned()
    };
    let base = admin_policy(&kustomize_build(plane, &base_dir()).await);
    assert!(
        base.contains("kubernetes.io/metadata.name: monitoring") && base.contains("port: admin"),
        "{base}"
    );
    assert_eq!(
        base.matches("- from:").count(),
        1,
        "one source only: {base}"
    );
    let patched =
        admin_policy(&build_for_loopback(plane, "dev", 443, MONITORING_NAMESPACE_PATCH).await);
    assert!(
        patched.contains("kubernetes.io/metadata.name: observability")
            && !patched.contains("metadata.name: monitoring"),
        "{patched}"
    );
}

/// A policy's or a Certificate's field as a sorted list of strings (one value or several).
fn strings(value: &serde_json::Value) -> Vec<String> {
    let mut found: Vec<String> = match value {
        serde_json::Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        serde_json::Value::String(one) => vec![one.clone()],
        _ => Vec::new(),
    };
    found.sort();
    found
}

fn documents(path: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|doc: &serde_json::Value| !doc.is_null())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_certificate_request_policy_allows_one_identity_exactly() {
    let certificates = documents("../deploy/kustomize/components/cert-manager/certificates.yaml");
    let policies = documents("../deploy/kustomize/components/approver-policy/policies.yaml");
    assert_eq!(policies.len(), certificates.len(), "a policy per identity");
    for certificate in &certificates {
        let name = certificate["metadata"]["name"].as_str().unwrap();
        let spec = &certificate["spec"];
        let policy = policies
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no policy for {name}"));
        let allowed = &policy["spec"]["allowed"];
        // What the Certificate asks for, the policy allows, and no more.
        for (field, values) in [
            ("commonName", "value"),
            ("uris", "values"),
            ("dnsNames", "values"),
            ("ipAddresses", "values"),
        ] {
            assert_eq!(
                strings(&allowed[field][values]),
                strings(&spec[field]),
                "{name}: {field}"
            );
            assert_eq!(allowed[field]["required"], true, "{name}: {field} required");
        }
        assert_eq!(
            strings(&allowed["usages"]),
            strings(&spec["usages"]),
            "{name}: usages"
        );
        assert!(allowed["isCA"].is_null(), "{name}: never a CA");
        let constraints = &policy["spec"]["constraints"];
        assert_eq!(
            constraints["maxDuration"], spec["duration"],
            "{name}: duration"
        );
        assert_eq!(
            constraints["privateKey"]["minSize"], spec["privateKey"]["size"],
            "{name}: key size"
        );
        assert_eq!(
            policy["spec"]["selector"]["issuerRef"]["name"], spec["issuerRef"]["name"],
            "{name}: issuer"
        );
        // No other policy allows this identity's URI or common name.
        for other in policies.iter().filter(|p| p["metadata"]["name"] != name) {
            let other_allowed = &other["spec"]["allowed"];
            for uri in strings(&spec["uris"]) {
                assert!(
                    !strings(&other_allowed["uris"]["values"]).contains(&uri),
                    "{}: allows {name}'s {uri}",
                    other["metadata"]["name"]
                );
            }
            assert_ne!(
                other_allowed["commonName"]["value"], spec["commonName"],
                "{}: allows {name}'s common name",
                other["metadata"]["name"]
            );
        }
    }

    // approver-policy's own schema accepts the component, RBAC and all.
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    let crds = std::fs::read_to_string(plane.binaries().approver_policy_crds()).unwrap();
    apply_cleanly(plane, "approver-policy CRDs", &crds).await;
    let out = kubectl(
        plane,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/certificaterequestpolicies.policy.cert-manager.io",
        ],
        None,
    )
    .await;
    assert!(
        out.success,
        "approver-policy CRD established: {}",
        out.stderr
    );
    support::create_namespace(plane).await;
    let manifests = kustomize_build_component(plane, &component_dir("approver-policy")).await;
    assert_eq!(
        manifests.matches("kind: CertificateRequestPolicy").count(),
        certificates.len()
    );
    apply_cleanly(plane, "approver-policy component", &manifests).await;
    // A misspelt field is refused by the real schema, so the apply above means something.
    let broken = manifests
        .split("\n---\n")
        .find(|doc| doc.contains("kind: CertificateRequestPolicy"))
        .unwrap()
        .replace("maxDuration:", "maxDurations:");
    let out = kubectl(
        plane,
        &["apply", "--server-side", "--validate=strict", "-f", "-"],
        Some(&broken),
    )
    .await;
    assert!(
        !out.success && out.stderr.contains("maxDurations"),
        "refused, naming the field: {out:?}"
    );
}

/// `kustomize build` of a Component on its own, wrapped in a kustomization that only
/// includes it.
async fn kustomize_build_component(plane: &ControlPlane, component: &Path) -> String {
    let dir = tempfile::tempdir().unwrap();
    let relative = support::relative_to(dir.path(), component);
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ncomponents:\n  - {}\n",
            relative.display()
        ),
    )
    .unwrap();
    kustomize_build(plane, dir.path()).await
}

/// The objects of built manifests, as JSON.
fn parsed(manifests: &str) -> Vec<serde_json::Value> {
    serde_norway::Deserializer::from_str(manifests)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|doc: &serde_json::Value| !doc.is_null())
        .collect()
}

fn kind_and_name(object: &serde_json::Value) -> (String, String) {
    (
        object["kind"].as_str().unwrap().to_owned(),
        object["metadata"]["name"].as_str().unwrap().to_owned(),
    )
}

/// overlays/sdk-only runs a user's controller and nothing built in: none of the built-in
/// controllers' accounts or roles, no garbage collector, no cluster-wide rule beyond the
/// registered kinds; its watcher configuration is valid and grants the controller's identity
/// those kinds; applied, the accounts can do that and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_only_overlay_grants_only_what_the_registered_controller_needs() {
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    install_cert_manager_crds(plane).await;
    let base = parsed(&kustomize_build(plane, &base_dir()).await);
    let manifests = kustomize_build(plane, &overlay_dir("sdk-only")).await;
    let sdk = parsed(&manifests);
    let names = |objects: &[serde_json::Value]| -> std::collections::BTreeSet<(String, String)> {
        objects.iter().map(kind_and_name).collect()
    };
    let (base_names, sdk_names) = (names(&base), names(&sdk));

    // What the base has and this overlay leaves out: exactly every built-in controller's
    // account, and roles and bindings of the built-ins and the collector's graph.
    // (The watcher's ConfigMap is replaced: its name's hash differs.)
    let left_out: Vec<&(String, String)> = base_names
        .difference(&sdk_names)
        .filter(|(kind, name)| !(kind == "ConfigMap" && name.starts_with("switchyard-watcher-")))
        .collect();
    let mut accounts: Vec<&str> = left_out
        .iter()
        .filter(|(kind, _)| kind == "ServiceAccount")
        .map(|(_, name)| name.as_str())
        .collect();
    accounts.sort_unstable();
    let mut builtin: Vec<&str> = switchyard_reconciler::BUILTINS
        .iter()
        .map(|b| b.service_account)
        .collect();
    builtin.sort_unstable();
    assert_eq!(
        accounts, builtin,
        "sdk-only leaves out every built-in's account"
    );
    for (kind, name) in &left_out {
        assert!(
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding"
            ]
            .contains(&kind.as_str()),
            "sdk-only leaves out {kind}/{name}, which is not a built-in's"
        );
    }
    // Every cluster-wide rule is the watcher's or the controller's, and names its resources.
    for object in &sdk {
        let (kind, name) = kind_and_name(object);
        if kind == "ClusterRole" {
            assert!(
                ["switchyard-watcher", "switchyard-controller"].contains(&name.as_str()),
                "ClusterRole {name}"
            );
            let rules = object["rules"].to_string();
            assert!(!rules.contains("\"*\""), "ClusterRole {name}: {rules}");
        }
        if kind == "Deployment" && name == "switchyard-reconciler" {
            let container = &object["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(container["image"], "registry.example/switchyard-greeting");
            assert!(
                !container["env"]
                    .to_string()
                    .contains("SWITCHYARD_CONTROLLER_SERVICE_ACCOUNTS"),
                "the controller acts as itself: {}",
                container["env"]
            );
        }
    }
    let watcher_role = sdk
        .iter()
        .find(|o| kind_and_name(o) == ("ClusterRole".into(), "switchyard-watcher".into()))
        .unwrap();
    assert_eq!(
        watcher_role["rules"],
        serde_json::json!([
            {"apiGroups": ["example.switchyard.io"], "resources": ["greetings"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
        ])
    );
    // The watcher's configuration: valid, no collector, the controller's kinds granted to the
    // reconciler's identity and nothing to another.
    let config = sdk
        .iter()
        .find(|o| {
            o["kind"] == "ConfigMap"
                && o["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("switchyard-watcher")
        })
        .unwrap();
    let config = switchyard_watcher_core::config::Config::from_yaml(
        config["data"]["watcher.yaml"].as_str().unwrap(),
    )
    .expect("the sdk-only watcher configuration is valid");
    assert!(config.collector.is_none(), "no garbage collector");
    assert!(
        config.resources.is_empty(),
        "the file itself watches nothing"
    );
    let greeting =
        switchyard_watcher_core::config::Gvk::parse("example.switchyard.io/v1", "Greeting")
            .unwrap();
    let pod = switchyard_watcher_core::config::Gvk::parse("v1", "Pod").unwrap();
    assert!(config.access("switchyard-reconciler", &greeting).is_some());
    assert!(config.access("switchyard-reconciler", &pod).is_none());
    assert!(
        config
            .access("other-switchyard-reconciler", &greeting)
            .is_none()
    );

    // Applied over whatever other tests left, less what sdk-only leaves out.
    for (kind, name) in &left_out {
        let out = kubectl(
            plane,
            &[
                "delete",
                kind,
                name,
                "--namespace",
                NAMESPACE,
                "--ignore-not-found",
            ],
            None,
        )
        .await;
        assert!(out.success, "{kind}/{name}: {}", out.stderr);
    }
    // The controller's CRD first, as the overlay says.
    let crd = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/greeting/crd.yaml"),
    )
    .unwrap();
    apply_cleanly(plane, "the Greeting CRD", &crd).await;
    let established = kubectl(
        plane,
        &[
            "wait",
            "--for=condition=Established",
            "crd/greetings.example.switchyard.io",
            "--timeout=60s",
        ],
        None,
    )
    .await;
    assert!(established.success, "{}", established.stderr);
    apply_cleanly(plane, "sdk-only: first apply", &manifests).await;
    let before = resource_versions(plane, &manifests).await;
    apply_cleanly(plane, "sdk-only: second apply", &manifests).await;
    assert_eq!(before, resource_versions(plane, &manifests).await);
    for (service, verb, resource, allowed) in [
        ("watcher", "list", "greetings.example.switchyard.io", true),
        ("watcher", "watch", "configmaps", true),
        ("watcher", "list", "pods", false),
        ("watcher", "list", "secrets", false),
        (
            "reconciler",
            "patch",
            "greetings.example.switchyard.io",
            true,
        ),
        ("reconciler", "create", "configmaps", true),
        ("reconciler", "delete", "pods", false),
        ("reconciler", "impersonate", "serviceaccounts", false),
    ] {
        assert_eq!(
            can_i(plane, service, verb, resource).await,
            allowed,
            "sdk-only: {service} {verb} {resource}"
        );
    }
}

/// `kustomize build` of `overlay` with `component` added.
async fn build_with_component(plane: &ControlPlane, overlay: &str, component: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - {}\n",
            support::relative_to(dir.path(), &overlay_dir(overlay)).display(),
            support::relative_to(dir.path(), &component_dir(component)).display(),
        ),
    )
    .unwrap();
    kustomize_build(plane, dir.path()).await
}

/// The object of `kind` whose name is `name` or starts with it (a generated ConfigMap's
/// hash follows it).
fn find_object<'a>(
    objects: &'a [serde_json::Value],
    kind: &str,
    name: &str,
) -> &'a serde_json::Value {
    objects
        .iter()
        .find(|o| {
            let (k, n) = kind_and_name(o);
            k == kind && n.starts_with(name)
        })
        .unwrap_or_else(|| panic!("{kind}/{name} missing"))
}

/// components/webhooks on overlays/sdk-only points the apiserver at the example's two
/// webhooks: through a Service of the reconciler's pods whose port reaches the binary's
/// default webhook port, a name the reconciler's Certificate carries, with that
/// Certificate's CA injected; a NetworkPolicy admits the port; the apiserver takes it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_component_points_the_apiserver_at_the_reconciler_s_certified_service() {
    use switchyard_example_greeting::webhooks::{DEFAULT_PATH, VALIDATE_PATH};

    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    install_cert_manager_crds(plane).await;
    let manifests = build_with_component(plane, "sdk-only", "webhooks").await;
    let objects = parsed(&manifests);
    let find = |kind: &str, name: &str| find_object(&objects, kind, name);

    let service = find("Service", "switchyard-reconciler");
    assert_eq!(
        service["spec"]["selector"]["app.kubernetes.io/name"],
        "switchyard-reconciler"
    );
    let port = &service["spec"]["ports"][0];
    let container =
        &find("Deployment", "switchyard-reconciler")["spec"]["template"]["spec"]["containers"][0];
    let target = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port["targetPort"])
        .unwrap_or_else(|| panic!("no container port {}", port["targetPort"]));
    let default = switchyard_sdk::Args::try_parse_from([
        "controller",
        "--watcher-addr=w:1",
        "--queue-addr=q:1",
        "--insecure-plaintext",
    ])
    .unwrap()
    .reconciler
    .webhook_addr;
    assert_eq!(target["containerPort"], default.port());
    let dns = find("Certificate", "switchyard-reconciler")["spec"]["dnsNames"].clone();
    assert!(
        strings(&dns).contains(&"switchyard-reconciler.switchyard.svc".to_owned()),
        "the reconciler's certificate names the Service: {dns}"
    );
    for (kind, path) in [
        ("MutatingWebhookConfiguration", DEFAULT_PATH),
        ("ValidatingWebhookConfiguration", VALIDATE_PATH),
    ] {
        let config = find(kind, "switchyard-greeting");
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "switchyard/switchyard-reconciler",
            "{kind}"
        );
        let dialed = &config["webhooks"][0]["clientConfig"]["service"];
        assert_eq!(
            (
                &dialed["namespace"],
                &dialed["name"],
                &dialed["port"],
                &dialed["path"]
            ),
            (
                &serde_json::json!(NAMESPACE),
                &service["metadata"]["name"],
                &port["port"],
                &serde_json::json!(path)
            ),
            "{kind}"
        );
    }
    let policy = find("NetworkPolicy", "switchyard-reconciler-webhooks");
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], "webhooks");

    // The apiserver takes every object as written (a dry run: nothing is left registered
    // that would send Greetings to a reconciler no test runs).
    support::create_namespace(plane).await;
    support::dry_run_cleanly(plane, "sdk-only with components/webhooks", &manifests).await;
}

/// components/controller deploys a user's controller (as shipped, examples/greeting) beside
/// the built-in reconciler as an identity of its own: the watcher grants that identity
/// exactly the kinds the controller's watches name, and lists and watches them; the
/// identity writes what the controller writes and reads nothing through the apiserver; its
/// pods reach the services as a reconciler's do; the apiserver takes it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_component_runs_a_user_s_controller_as_an_identity_of_its_own() {
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    install_cert_manager_crds(plane).await;
    let manifests = build_with_component(plane, "dev", "controller").await;
    let objects = parsed(&manifests);
    let find = |kind: &str, name: &str| find_object(&objects, kind, name);
    const ACCOUNT: &str = "greeting-switchyard-reconciler";

    // The watcher's grants, as it reads them: its file and the one beside it.
    let data = &find("ConfigMap", "switchyard-watcher")["data"];
    let config = switchyard_watcher_core::Config::from_yaml_with_grants(
        data["watcher.yaml"].as_str().unwrap(),
        &[(
            "greeting.registrations.yaml".into(),
            data["greeting.registrations.yaml"].as_str().unwrap().into(),
        )],
    )
    .unwrap();
    let mut registry = switchyard_sdk::Registry::default();
    registry.register(switchyard_example_greeting::controller());
    let mut watched: Vec<String> = Vec::new();
    for (_, watches) in registry.watches() {
        for watch in watches.all() {
            let gvk =
                switchyard_watcher_core::Gvk::parse(&watch.gvk.api_version(), &watch.gvk.kind)
                    .unwrap();
            assert_eq!(
                config.grants.granted(ACCOUNT, &gvk),
                Some(switchyard_watcher_core::Objects::Full),
                "{gvk} granted in full"
            );
            watched.push(watch.gvk.kind.clone());
        }
    }
    assert_eq!(watched, ["Greeting", "ConfigMap"]);
    let role = find("ClusterRole", "switchyard-watcher")["rules"].to_string();
    assert!(
        role.contains("\"greetings\"") && role.contains("\"watch\""),
        "the watcher watches greetings: {role}"
    );

    // The identity and its pods.
    let deployment = find("Deployment", "greeting-controller");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], ACCOUNT);
    assert_eq!(
        pod["containers"][0]["image"],
        "registry.example/switchyard-greeting"
    );
    let certificate = find("Certificate", ACCOUNT);
    assert_eq!(
        certificate["spec"]["uris"][0],
        format!("spiffe://cluster.local/ns/{NAMESPACE}/sa/{ACCOUNT}")
    );
    assert_eq!(
        certificate["spec"]["secretName"],
        pod["volumes"][0]["secret"]["secretName"]
    );
    let identity =
        switchyard_runtime::Identity::parse(certificate["spec"]["uris"][0].as_str().unwrap())
            .unwrap();
    let queue = switchyard_runtime::Identity::parse(&format!(
        "spiffe://cluster.local/ns/{NAMESPACE}/sa/switchyard-queue"
    ))
    .unwrap();
    assert_eq!(
        identity.role_among(&queue),
        Some(switchyard_runtime::Role::Reconciler),
        "the queue and the watcher take it for a reconciler"
    );
    for policy in [
        "switchyard-watcher",
        "switchyard-queue",
        "switchyard-elector",
    ] {
        let from = find("NetworkPolicy", policy)["spec"]["ingress"][0]["from"].to_string();
        assert!(from.contains("greeting-controller"), "{policy}: {from}");
    }

    // Its role is what the controller declares it writes, derived from the code.
    let declared = serde_json::to_value(registry.rbac_rules()).unwrap();
    assert_eq!(
        find("ClusterRole", ACCOUNT)["rules"],
        declared,
        "the identity's role is the controller's declared writes"
    );

    // Applied, the identity may write what the controller writes and read nothing else (the
    // apiserver answers for Greetings once it serves them).
    let client = plane.client().await.unwrap();
    switchyard_sdk_test::install_crd::<switchyard_example_greeting::Greeting>(&client).await;
    apply_cleanly(plane, "the controller's identity", &rbac_only(&manifests)).await;
    let can = |verb: &'static str, resource: &'static str| async move {
        let account = format!("--as=system:serviceaccount:{NAMESPACE}:{ACCOUNT}");
        let (resource, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(format!("--subresource={s}"))),
            None => (resource, None),
        };
        let mut args = vec![
            "auth",
            "can-i",
            verb,
            resource,
            &account,
            "--namespace=default",
        ];
        if let Some(sub) = &sub {
            args.push(sub);
        }
        let out = kubectl(plane, &args, None).await;
        (out.stdout.trim() == "yes", format!("{args:?}: {out:?}"))
    };
    for (verb, resource) in [
        ("patch", "greetings.example.switchyard.io"),
        ("patch", "greetings.example.switchyard.io/status"),
        ("create", "configmaps"),
        ("delete", "configmaps"),
        ("create", "events.events.k8s.io"),
    ] {
        let (yes, asked) = can(verb, resource).await;
        assert!(yes, "{ACCOUNT} may {verb} {resource}: {asked}");
    }
    for (verb, resource) in [
        ("list", "greetings.example.switchyard.io"),
        ("watch", "configmaps"),
        ("get", "secrets"),
        ("create", "pods"),
    ] {
        let (yes, asked) = can(verb, resource).await;
        assert!(!yes, "{ACCOUNT} may not {verb} {resource}: {asked}");
    }
    // The rest as written (a dry run: no controller Deployment is left behind).
    support::dry_run_cleanly(plane, "dev with components/controller", &manifests).await;
}
