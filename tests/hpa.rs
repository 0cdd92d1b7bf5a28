//! The HPA end to end: the ha overlay applied to the real apiserver, the queue's external
//! metrics API registered through the aggregation layer (the queue accepts only the
//! apiserver's front-proxy client certificate), and kube-controller-manager's HPA
//! controller (with its Deployment and ReplicaSet controllers, so the scale status follows)
//! scaling the reconciler Deployment up when the queue's backlog rises and back down after
//! it drains.

#![allow(clippy::unwrap_used)]

#[path = "deploy_support.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{
    NAMESPACE, Queue, TestPki, apply_cleanly, await_apiservice_available, build_for_loopback,
    inject_ca_bundle, install_cert_manager_crds, kubectl, queue_client,
};
use switchyard_proto::{
    common::v1::WorkKey,
    queue::v1::{
        Credit, Done, EnqueueItem, EnqueueRequest, Outcome, WorkRequest, WorkerHello, outcome,
        queue_client::QueueClient, work_request::Request as Msg, work_response::Response as Reply,
    },
};
use switchyard_runtime::Role;
use switchyard_testenv::ControlPlane;
use switchyard_work::shard::shard_of;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const RS: &str = "apps/v1/ReplicaSet";
const SHARDS: u32 = 16;
/// Keys enqueued: with the ha overlay's target of 100 keys per reconciler this asks for 10.
const BACKLOG: usize = 1000;
const MIN_REPLICAS: i64 = 2;
const SCALED_REPLICAS: i64 = 10;
/// Scaling up goes 2 → 6 → 10 in two 15 s policy periods; the HPA syncs every second here.
const SCALE_TIMEOUT: Duration = Duration::from_secs(120);
const METRIC_PATH: &str =
    "/apis/external.metrics.k8s.io/v1beta1/namespaces/switchyard/switchyard_queue_backlog";

/// The ha overlay's HPA as shipped, except the scale-down stabilisation window (300 s), so
/// that the test sees the scale-down within minutes.
const FAST_SCALE_DOWN: &str = r#"  - target: {kind: HorizontalPodAutoscaler, name: switchyard-reconciler}
    patch: |-
      - op: replace
        path: /spec/behavior/scaleDown
        value: {stabilizationWindowSeconds: 5, selectPolicy: Max, policies: [{type: Percent, value: 100, periodSeconds: 15}]}
"#;

async fn get_json(plane: &ControlPlane, args: &[&str]) -> Value {
    let out = kubectl(plane, args, None).await;
    assert!(out.success, "kubectl {args:?}: {}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

/// The reconciler Deployment's scale subresource and the HPA's status.
async fn observe(plane: &ControlPlane) -> (Value, Value) {
    let scale = get_json(
        plane,
        &[
            "get",
            "--raw",
            "/apis/apps/v1/namespaces/switchyard/deployments/switchyard-reconciler/scale",
        ],
    )
    .await;
    let hpa = get_json(
        plane,
        &[
            "get",
            "hpa",
            "switchyard-reconciler",
            "--namespace",
            NAMESPACE,
            "-o",
            "json",
        ],
    )
    .await;
    (scale, hpa["status"].clone())
}

/// Waits until the scale subresource and the HPA status agree on `replicas`, with the HPA
/// reading `metric` as the backlog's average per replica.
async fn await_scaled(plane: &ControlPlane, replicas: i64, average: &str, why: &str) {
    let deadline = Instant::now() + SCALE_TIMEOUT;
    let mut seen = Vec::new();
    loop {
        let (scale, status) = observe(plane).await;
        let now = (
            scale["spec"]["replicas"].as_i64(),
            scale["status"]["replicas"].as_i64(),
            status["desiredReplicas"].as_i64(),
            status["currentReplicas"].as_i64(),
            status["currentMetrics"][0]["external"]["current"]["averageValue"]
                .as_str()
                .map(str::to_owned),
        );
        if seen.last() != Some(&now) {
            seen.push(now.clone());
        }
        let r = Some(replicas);
        if now == (r, r, r, r, Some(average.to_owned())) {
            eprintln!("{why}: (scale spec, scale status, desired, current, average) went {seen:?}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{why}: expected {replicas} replicas at an average of {average} within {SCALE_TIMEOUT:?}; \
             (scale spec, scale status, desired, current, average) went {seen:?}\nHPA status: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn enqueue(client: &mut QueueClient<tonic::transport::Channel>, n: usize) {
    let mut by_shard: Vec<Vec<EnqueueItem>> = vec![Vec::new(); SHARDS as usize];
    for i in 0..n {
        let name = format!("rs-{i}");
        by_shard[shard_of(RS, "default", &name, SHARDS) as usize].push(EnqueueItem {
            key: Some(WorkKey {
                controller: RS.into(),
                namespace: "default".into(),
                name,
            }),
            ..Default::default()
        });
    }
    for (shard, items) in by_shard.into_iter().enumerate() {
        client
            .enqueue(EnqueueRequest {
                batch_id: shard as u64,
                shard: shard as u32,
                items,
            })
            .await
            .unwrap();
    }
}

/// Leases `n` keys as one worker and reports each done.
async fn drain(client: &mut QueueClient<tonic::transport::Channel>, n: usize) {
    let (tx, rx) = mpsc::channel(n + 2);
    let send = |request| WorkRequest {
        request: Some(request),
    };
    tx.send(send(Msg::Hello(WorkerHello {
        worker_id: "hpa-test".into(),
        controllers: vec![RS.into()],
    })))
    .await
    .unwrap();
    tx.send(send(Msg::Credit(Credit { items: n as u32 })))
        .await
        .unwrap();
    let mut stream = client
        .work(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let (mut leased, mut acked) = (0, 0);
    while acked < n {
        let message = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("the queue answers within 30 s")
            .unwrap()
            .expect("the work stream stays open");
        match message.response.unwrap() {
            Reply::Item(item) => {
                leased += 1;
                tx.send(send(Msg::Outcome(Outcome {
                    shard: item.shard,
                    epoch: item.epoch,
                    lease_id: item.lease_id,
                    result: Some(outcome::Result::Done(Done {})),
                    duration: None,
                    observed: Default::default(),
                    namespace_observed: Default::default(),
                })))
                .await
                .unwrap();
            }
            Reply::OutcomeAck(ack) => {
                assert!(ack.applied, "outcome refused: {}", ack.reason);
                acked += 1;
            }
            Reply::LeaseExtended(_) => {}
        }
    }
    assert_eq!(leased, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hpa_scales_reconcilers_up_on_queue_backlog_and_down_after_it_drains() {
    let plane = ControlPlane::shared().expect("control plane");
    // The ha overlay's certificates come from cert-manager: its CRDs are installed, and the
    // test injects the CA of the queue's certificate as its CA injector would.
    install_cert_manager_crds(plane).await;
    let pki = TestPki::shared(plane);
    let queue = Queue::start(SHARDS, plane.front_proxy_ca(), &pki.queue).await;
    let manifests = build_for_loopback(plane, "ha", queue.metrics_port, FAST_SCALE_DOWN).await;
    assert!(manifests.contains("stabilizationWindowSeconds: 5"));
    apply_cleanly(plane, "ha overlay", &manifests).await;
    inject_ca_bundle(plane, &pki.ca_pem).await;
    await_apiservice_available(plane).await;

    // Through the aggregation layer, as the HPA controller reads it.
    let discovery = get_json(
        plane,
        &["get", "--raw", "/apis/external.metrics.k8s.io/v1beta1"],
    )
    .await;
    assert_eq!(
        discovery["resources"][0]["name"], "switchyard_queue_backlog",
        "{discovery}"
    );
    let values = get_json(
        plane,
        &[
            "get",
            "--raw",
            &format!("{METRIC_PATH}?labelSelector=controller%3Dapps.v1.ReplicaSet"),
        ],
    )
    .await;
    assert_eq!(values["items"][0]["value"], "0", "{values}");
    let bad = kubectl(
        plane,
        &[
            "get",
            "--raw",
            &format!("{METRIC_PATH}?labelSelector=controller%20in%20(a"),
        ],
        None,
    )
    .await;
    assert!(
        !bad.success && bad.stderr.contains("BadRequest") && bad.stderr.contains("unclosed '('"),
        "a malformed selector is a 400 naming the problem, also through the apiserver: {bad:?}"
    );

    let kcm = plane
        .start_controller_manager(
            &[
                "horizontal-pod-autoscaler-controller",
                "deployment-controller",
                "replicaset-controller",
            ],
            &["--horizontal-pod-autoscaler-sync-period=1s"],
        )
        .await
        .expect("kube-controller-manager starts");

    await_scaled(
        plane,
        MIN_REPLICAS,
        "0",
        "no backlog: the HPA keeps the minimum",
    )
    .await;

    // A reconciler may both enqueue and work.
    let mut client = queue_client(&queue, Role::Reconciler).await;
    enqueue(&mut client, BACKLOG).await;
    await_scaled(
        plane,
        SCALED_REPLICAS,
        "100",
        "a backlog of 1000 at 100 per replica",
    )
    .await;

    drain(&mut client, BACKLOG).await;
    await_scaled(plane, MIN_REPLICAS, "0", "the backlog drained").await;

    let (_, status) = observe(plane).await;
    let conditions = status["conditions"].as_array().unwrap();
    let active = conditions
        .iter()
        .find(|c| c["type"] == "ScalingActive")
        .unwrap();
    assert_eq!(active["status"], "True", "{status:#}");
    drop(kcm);
    queue.stop().await;
}
