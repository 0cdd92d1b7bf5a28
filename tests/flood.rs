//! Bounded everywhere: a real queue process flooded on every RPC by many concurrent callers
//! keeps its memory bounded, pushes back (callers wait, or get RESOURCE_EXHAUSTED with
//! nothing added), and never loses a key it accepted: every key of every accepted batch is
//! leased exactly once, and no key of a refused batch ever is.

#![allow(clippy::unwrap_used)]

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use switchyard_proto::{
    common::v1::WorkKey,
    queue::v1::{
        Credit, Done, EnqueueItem, EnqueueManyRequest, EnqueueRequest, Outcome, StatsRequest,
        WorkRequest, WorkerHello, enqueue_result, outcome, queue_client::QueueClient, work_request,
        work_response,
    },
};
use switchyard_runtime::Role;
use switchyard_testenv::{Pki, ServiceProcess, resident_bytes};
use switchyard_tests::service_binary;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, transport::Channel};

const CAPACITY: usize = 20_000;
const CALLERS: usize = 2_000;
const BATCH: usize = 100;
const STREAMS: usize = 200;
/// What the queue may hold at its peak: a process with 20,000 keys, 1,024 waiting batches of
/// 100 keys and a few thousand open streams needs a few tens of MB; a queue that held every
/// flooded request would need several times this.
const RSS_BOUND: u64 = 256 << 20;

fn batch(tag: &str, i: usize) -> EnqueueRequest {
    EnqueueRequest {
        batch_id: i as u64,
        shard: 0,
        items: (0..BATCH)
            .map(|k| EnqueueItem {
                key: Some(WorkKey {
                    controller: "apps/v1/ReplicaSet".into(),
                    namespace: "flood".into(),
                    name: format!("{tag}-{i}-{k}"),
                }),
                ..EnqueueItem::default()
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_flooded_the_queue_stays_bounded_and_loses_no_accepted_key() {
    let mut queue = ServiceProcess::start(
        &service_binary("switchyard-queue"),
        &[
            "--shard-count=1",
            &format!("--queue-capacity={CAPACITY}"),
            "--log-level=warn",
        ],
        &[],
    )
    .await
    .unwrap();
    queue.wait_ready().await.unwrap();
    let addr = queue.grpc_addr();
    let pki = Pki::shared();
    // A few connections, many streams on each, as many watchers' and tools' would be.
    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(pki.channel(Role::Watcher, Role::Queue, addr).await.unwrap());
    }
    let before = queue.resident_bytes().unwrap();
    let peak = Arc::new(AtomicU64::new(before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        let pid = queue.pid();
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                if let Some(rss) = resident_bytes(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // 1. Unary Enqueue: 2,000 callers at once, 100 keys each, ten times the capacity.
    let accepted: Arc<Mutex<HashSet<String>>> = Arc::default();
    let refused: Arc<Mutex<HashSet<String>>> = Arc::default();
    let busy = Arc::new(AtomicU64::new(0));
    let mut callers = Vec::new();
    for i in 0..CALLERS {
        let mut client = QueueClient::new(channels[i % channels.len()].clone());
        let (accepted, refused, busy) = (accepted.clone(), refused.clone(), busy.clone());
        callers.push(tokio::spawn(async move {
            let request = batch("unary", i);
            let names: Vec<String> = request
                .items
                .iter()
                .map(|item| item.key.as_ref().unwrap().name.clone())
                .collect();
            match client.enqueue(request).await {
                Ok(response) => {
                    let response = response.into_inner();
                    assert_eq!(
                        (response.added + response.coalesced) as usize,
                        BATCH,
                        "a whole batch or nothing"
                    );
                    accepted.lock().unwrap().extend(names);
                }
                Err(status) if status.code() == Code::ResourceExhausted => {
                    busy.fetch_add(1, Ordering::Relaxed);
                    refused.lock().unwrap().extend(names);
                }
                Err(status) => panic!("enqueue {i}: {status}"),
            }
        }));
    }

    // 2. EnqueueStream: 200 streams, each sending batches as fast as acks come back.
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        let mut client = QueueClient::new(channels[s % channels.len()].clone());
        let accepted = accepted.clone();
        streams.push(tokio::spawn(async move {
            let (tx, rx) = mpsc::channel(1);
            let mut acks = client
                .enqueue_stream(ReceiverStream::new(rx))
                .await
                .unwrap()
                .into_inner();
            // Three batches per stream; an acknowledged batch is accepted whole.
            for b in 0..3 {
                let request = batch(&format!("stream{s}"), b);
                let names: Vec<String> = request
                    .items
                    .iter()
                    .map(|item| item.key.as_ref().unwrap().name.clone())
                    .collect();
                if tx.send(request).await.is_err() {
                    return;
                }
                match acks.message().await {
                    Ok(Some(_)) => accepted.lock().unwrap().extend(names),
                    Ok(None) => return,
                    Err(status) => {
                        assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
                        return;
                    }
                }
            }
        }));
    }

    // 2b. EnqueueMany: 200 callers at once, each a call of 4 batches of 100 keys. Each batch
    // is answered on its own: added whole, or refused busy with nothing of it added.
    let mut many = Vec::new();
    for c in 0..STREAMS {
        let mut client = QueueClient::new(channels[c % channels.len()].clone());
        let (accepted, refused) = (accepted.clone(), refused.clone());
        many.push(tokio::spawn(async move {
            let batches: Vec<EnqueueRequest> =
                (0..4).map(|b| batch(&format!("many{c}"), b)).collect();
            let names: Vec<Vec<String>> = batches
                .iter()
                .map(|b| {
                    b.items
                        .iter()
                        .map(|item| item.key.as_ref().unwrap().name.clone())
                        .collect()
                })
                .collect();
            let results = client
                .enqueue_many(EnqueueManyRequest { batches })
                .await
                .unwrap()
                .into_inner()
                .results;
            assert_eq!(results.len(), names.len(), "a result per batch");
            for (result, names) in results.into_iter().zip(names) {
                match result.result.unwrap() {
                    enqueue_result::Result::Added(added) => {
                        assert_eq!((added.added + added.coalesced) as usize, BATCH);
                        accepted.lock().unwrap().extend(names);
                    }
                    enqueue_result::Result::Refused(refusal) => {
                        assert_eq!(
                            Code::from(refusal.code),
                            Code::ResourceExhausted,
                            "{}",
                            refusal.message
                        );
                        refused.lock().unwrap().extend(names);
                    }
                }
            }
        }));
    }

    // 3. Work: 200 workers that grant credit in a loop and never read what they are sent.
    let observer = pki
        .channel(Role::Reconciler, Role::Queue, addr)
        .await
        .unwrap();
    let mut greedy = Vec::new();
    for _ in 0..STREAMS {
        let mut client = QueueClient::new(observer.clone());
        greedy.push(tokio::spawn(async move {
            let requests = tokio_stream::iter(
                std::iter::once(WorkRequest {
                    request: Some(work_request::Request::Hello(WorkerHello {
                        worker_id: "greedy".into(),
                        controllers: vec!["apps/v1/Deployment".into()],
                    })),
                })
                .chain((0..5_000).map(|_| WorkRequest {
                    request: Some(work_request::Request::Credit(Credit { items: 10_000 })),
                })),
            );
            let response = client.work(requests).await;
            // Hold the response stream without reading it.
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(response);
        }));
    }

    // 4. Stats: 500 concurrent readers.
    let stats: Vec<_> = (0..500)
        .map(|i| {
            let mut client = QueueClient::new(channels[i % channels.len()].clone());
            tokio::spawn(async move { client.stats(StatsRequest::default()).await.map(|_| ()) })
        })
        .collect();
    for reader in stats {
        reader.await.unwrap().unwrap();
    }

    // The flood is on: the queue is full, and senders wait or are refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for task in greedy {
        task.await.unwrap();
    }

    // One worker drains everything; blocked senders get room as it does.
    let leased: Arc<Mutex<Vec<String>>> = Arc::default();
    let worker = tokio::spawn(drain_all(observer.clone(), leased.clone()));
    for caller in callers {
        caller.await.unwrap();
    }
    for stream in streams {
        stream.await.unwrap();
    }
    for call in many {
        call.await.unwrap();
    }
    let accepted = std::mem::take(&mut *accepted.lock().unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    while leased.lock().unwrap().len() < accepted.len() {
        assert!(
            Instant::now() < deadline,
            "{} of {} accepted keys leased",
            leased.lock().unwrap().len(),
            accepted.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing more arrives.
    tokio::time::sleep(Duration::from_secs(1)).await;
    worker.abort();
    sampling.store(false, Ordering::Relaxed);
    sampler.await.unwrap();

    let leased = std::mem::take(&mut *leased.lock().unwrap());
    let distinct: HashSet<String> = leased.iter().cloned().collect();
    assert_eq!(distinct.len(), leased.len(), "a key leased twice");
    assert_eq!(
        distinct, accepted,
        "every accepted key, and only those, is leased"
    );
    let refused = std::mem::take(&mut *refused.lock().unwrap());
    assert!(
        refused.is_disjoint(&distinct),
        "a key of a refused batch was added"
    );
    let busy = busy.load(Ordering::Relaxed);
    let peak = peak.load(Ordering::Relaxed);
    println!(
        "flood: {} keys accepted and leased once each, {busy} unary batches refused busy, \
         resident memory {} MiB before, {} MiB at the peak",
        accepted.len(),
        before >> 20,
        peak >> 20
    );
    assert!(
        busy > 0,
        "the flood was larger than the queue could hold waiting"
    );
    assert!(
        peak < RSS_BOUND,
        "the queue's memory grew to {} MiB under the flood",
        peak >> 20
    );
    let (status, log) = queue.terminate().await.unwrap();
    assert!(status.success(), "{log}");
}

/// Leases every key of the queue and answers Done, recording each key leased.
async fn drain_all(channel: Channel, leased: Arc<Mutex<Vec<String>>>) {
    let (tx, rx) = mpsc::channel(1024);
    tx.send(WorkRequest {
        request: Some(work_request::Request::Hello(WorkerHello {
            worker_id: "drain".into(),
            controllers: vec!["apps/v1/ReplicaSet".into()],
        })),
    })
    .await
    .unwrap();
    tx.send(WorkRequest {
        request: Some(work_request::Request::Credit(Credit { items: 1000 })),
    })
    .await
    .unwrap();
    let mut inbound = QueueClient::new(channel)
        .work(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    while let Some(Ok(message)) = inbound.next().await {
        if let Some(work_response::Response::Item(item)) = message.response {
            leased
                .lock()
                .unwrap()
                .push(item.key.as_ref().unwrap().name.clone());
            let outcome = Outcome {
                shard: item.shard,
                epoch: item.epoch,
                lease_id: item.lease_id,
                result: Some(outcome::Result::Done(Done {})),
                duration: None,
                observed: Default::default(),
                namespace_observed: Default::default(),
            };
            for request in [
                work_request::Request::Outcome(outcome),
                work_request::Request::Credit(Credit { items: 1 }),
            ] {
                if tx
                    .send(WorkRequest {
                        request: Some(request),
                    })
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}
