//! The watches the controllers declare in code ([`crate::Builder`]), registered with
//! every watcher replica the reconciler reads from (`switchyard.watcher.v1.Watches/Register`).
//!
//! ```text
//!  start ─► Register at each --watcher-addr ─► first answer: every informer listed ─► workers start
//!             │ unreachable / UNAVAILABLE: retried with backoff
//!             └ refused (unknown kind, malformed, conflicts with the watcher's file): the start
//!               fails with the watcher's message, which names the kind or field
//!  running: each stream held open (the registration lives as long as it does); when it ends
//!           (the watcher restarted), register again with backoff, until shutdown
//! ```

use std::time::Duration;

use switchyard_proto::{
    common::v1::GroupVersionKind as ProtoGvk,
    watcher::v1::{
        ControllerWatches, Predicate as ProtoPredicate, RegisterRequest, RegisterResponse,
        Watch as ProtoWatch, watches_client::WatchesClient,
    },
};
use switchyard_runtime::{Backoff, Dialer, Drain, Role};
use tonic::{Code, Streaming, transport::Channel};
use tracing::{info, warn};

use crate::{Predicate, Watch, Watches};

/// First and last pause between registration attempts: a watcher that restarts is back in
/// seconds, and a reconciler should follow it about as fast.
const RETRY: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));

/// Why the controllers' watches could not be registered with the watcher.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// `--watcher-addr` is not a `host:port` list.
    #[error("--watcher-addr: {0:?} is not a host:port list")]
    Address(String),
    /// The watcher refused them (unknown kind, malformed, in conflict with its file).
    #[error("the watcher at {address} refused the controllers' watches ({code:?}): {message}")]
    Refused {
        /// The watcher replica that refused them.
        address: String,
        /// Its gRPC code.
        code: Code,
        /// Its message, which names the kind or field.
        message: String,
    },
    /// Shutdown began first.
    #[error("shutdown began before the watches were registered")]
    Shutdown,
}

/// One reconciler's registration, for every watcher replica.
#[derive(Debug)]
pub struct Registration {
    request: RegisterRequest,
    replicas: Vec<(String, WatchesClient<Channel>)>,
}

impl Registration {
    /// The registration of `declared` (controller name and watches) by `registrant` with the
    /// watchers at `addresses` (`host:port`, several separated by commas).
    pub fn new(
        dialer: &Dialer,
        addresses: &str,
        registrant: &str,
        declared: &[(String, Watches)],
    ) -> Result<Self, RegistrationError> {
        let replicas = addresses
            .split(',')
            .map(str::trim)
            .map(|address| {
                dialer
                    .channel(address, Role::Watcher)
                    .map(|channel| (address.to_owned(), WatchesClient::new(channel)))
                    .map_err(|_| RegistrationError::Address(addresses.to_owned()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            request: request(registrant, declared),
            replicas,
        })
    }

    /// Registers with every replica and returns once each has listed what the watches
    /// need. A refusal is returned at once; an unreachable watcher is retried until
    /// shutdown.
    pub async fn register(&self, drain: &Drain) -> Result<Vec<Held>, RegistrationError> {
        let mut held = Vec::new();
        for (address, client) in &self.replicas {
            let mut backoff = Backoff::new(RETRY.0, RETRY.1);
            loop {
                match register_once(client.clone(), &self.request).await {
                    Ok(stream) => {
                        info!(watcher = %address, controllers = self.request.controllers.len(), "watches registered");
                        held.push(Held {
                            address: address.clone(),
                            client: client.clone(),
                            stream,
                        });
                        break;
                    }
                    Err(status) if transient(status.code()) => {
                        warn!(watcher = %address, error = %status.message(), retry_in = ?backoff.current(), "cannot register the watches yet; retrying");
                    }
                    Err(status) => {
                        return Err(RegistrationError::Refused {
                            address: address.clone(),
                            code: status.code(),
                            message: status.message().to_owned(),
                        });
                    }
                }
                if !backoff.wait(drain).await {
                    return Err(RegistrationError::Shutdown);
                }
            }
        }
        Ok(held)
    }

    /// Holds every registration until shutdown, registering again with a replica whose
    /// stream ends.
    pub async fn hold(self, held: Vec<Held>, drain: Drain) {
        let request = &self.request;
        let holds = held.into_iter().map(|h| h.hold(request, drain.clone()));
        futures::future::join_all(holds).await;
    }
}

/// A registration that one watcher replica accepted: its open stream.
#[derive(Debug)]
pub struct Held {
    address: String,
    client: WatchesClient<Channel>,
    stream: Streaming<RegisterResponse>,
}

impl Held {
    async fn hold(mut self, request: &RegisterRequest, drain: Drain) {
        let mut backoff = Backoff::new(RETRY.0, RETRY.1);
        loop {
            // Nothing more is sent after the first answer: the stream ends with the watcher.
            let ended = tokio::select! {
                message = self.stream.message() => message,
                _ = drain.clone().signaled() => return,
            };
            match ended {
                Ok(_) => {
                    warn!(watcher = %self.address, "the watcher ended the registration; registering again")
                }
                Err(status) => {
                    warn!(watcher = %self.address, error = %status.message(), "the registration stream broke; registering again")
                }
            }
            loop {
                if !backoff.wait(&drain).await {
                    return;
                }
                match register_once(self.client.clone(), request).await {
                    Ok(stream) => {
                        info!(watcher = %self.address, "watches registered again");
                        self.stream = stream;
                        backoff.reset();
                        break;
                    }
                    Err(status) => {
                        warn!(watcher = %self.address, code = ?status.code(), error = %status.message(), retry_in = ?backoff.current(), "registering the watches again failed; retrying");
                    }
                }
            }
        }
    }
}

/// Opens a registration and waits for its answer (every informer listed).
async fn register_once(
    mut client: WatchesClient<Channel>,
    request: &RegisterRequest,
) -> Result<Streaming<RegisterResponse>, tonic::Status> {
    let mut stream = client.register(request.clone()).await?.into_inner();
    match stream.message().await? {
        Some(_) => Ok(stream),
        None => Err(tonic::Status::unavailable(
            "the watcher closed the registration before answering",
        )),
    }
}

/// Failures that a later attempt may not meet: the watcher is down, restarting or busy.
fn transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
    )
}

fn request(registrant: &str, declared: &[(String, Watches)]) -> RegisterRequest {
    RegisterRequest {
        registrant: registrant.to_owned(),
        controllers: declared
            .iter()
            .map(|(name, watches)| ControllerWatches {
                name: name.clone(),
                reconciles: Some(watch(&watches.reconciles)),
                owns: watches.owns.iter().map(watch).collect(),
                by_label: watches.by_label.iter().map(watch).collect(),
                by_namespace: watches.by_namespace.iter().map(watch).collect(),
                by_selector: watches.by_selector.iter().map(watch).collect(),
                by_placement: watches.by_placement.iter().map(watch).collect(),
                by_name: watches.by_name.iter().map(watch).collect(),
                namespaces: watches.namespaces.clone(),
            })
            .collect(),
    }
}

fn watch(watch: &Watch) -> ProtoWatch {
    let gvk = |g: &switchyard_k8s::kube::api::GroupVersionKind| ProtoGvk {
        group: g.group.clone(),
        version: g.version.clone(),
        kind: g.kind.clone(),
    };
    ProtoWatch {
        gvk: Some(gvk(&watch.gvk)),
        predicates: watch
            .options
            .predicates
            .iter()
            .filter_map(|p| match p {
                Predicate::GenerationChanged => Some(ProtoPredicate::GenerationChanged as i32),
                Predicate::LabelsChanged => Some(ProtoPredicate::LabelsChanged as i32),
                Predicate::AnnotationsChanged => Some(ProtoPredicate::AnnotationsChanged as i32),
                Predicate::FieldChanged(_) | Predicate::NotWrittenBy(_) => None,
            })
            .collect(),
        fields_changed: watch
            .options
            .predicates
            .iter()
            .filter_map(|p| match p {
                Predicate::FieldChanged(pointer) => Some(pointer.clone()),
                _ => None,
            })
            .collect(),
        not_written_by: watch
            .options
            .predicates
            .iter()
            .filter_map(|p| match p {
                Predicate::NotWrittenBy(manager) => Some(manager.clone()),
                _ => None,
            })
            .collect(),
        metadata_only: watch.options.metadata_only,
        through: watch.through.as_ref().map(gvk),
        label: watch.label.clone().unwrap_or_default(),
        batch_period: watch
            .options
            .batch_period
            .and_then(|period| prost_types::Duration::try_from(period).ok()),
        batch_status_updates_only: watch.options.batch_status_updates_only,
        label_selector: watch.options.label_selector.clone().unwrap_or_default(),
        field_selector: watch.options.field_selector.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use switchyard_k8s::k8s_openapi::api::{
        apps::v1::{Deployment, ReplicaSet},
        core::v1::Pod,
    };

    use super::*;
    use crate::{Options, gvk_of};

    #[test]
    fn declared_watches_become_the_registration() {
        let mut through = Watch::of::<Pod>(
            Options::default()
                .metadata_only()
                .batch_period(std::time::Duration::from_millis(250)),
        );
        through.through = Some(gvk_of::<ReplicaSet>());
        let watches = Watches {
            reconciles: Watch::of::<Deployment>(
                Options::default().predicates([Predicate::GenerationChanged]),
            ),
            owns: vec![Watch::of::<ReplicaSet>(Options::default()), through],
            by_label: vec![],
            by_namespace: vec![],
            by_selector: vec![],
            by_placement: vec![],
            by_name: vec![],
            namespaces: vec!["team-a".into()],
        };
        let request = request("w1", &[("apps/v1/Deployment".into(), watches)]);
        assert_eq!(request.registrant, "w1");
        let controller = &request.controllers[0];
        assert_eq!(controller.namespaces, ["team-a"]);
        let reconciles = controller.reconciles.as_ref().unwrap();
        assert_eq!(reconciles.gvk.as_ref().unwrap().group, "apps");
        assert_eq!(
            reconciles.predicates,
            [ProtoPredicate::GenerationChanged as i32]
        );
        let pod = &controller.owns[1];
        assert_eq!(pod.gvk.as_ref().unwrap().kind, "Pod");
        assert_eq!(pod.through.as_ref().unwrap().kind, "ReplicaSet");
        assert!(pod.metadata_only && pod.label.is_empty());
        assert_eq!(pod.batch_period.unwrap().nanos, 250_000_000);
        assert_eq!(controller.owns[0].batch_period, None);
    }

    #[test]
    fn only_an_unreachable_or_busy_watcher_is_retried_at_start() {
        assert!(transient(Code::Unavailable));
        for refused in [
            Code::NotFound,
            Code::InvalidArgument,
            Code::FailedPrecondition,
            Code::PermissionDenied,
        ] {
            assert!(!transient(refused), "{refused:?}");
        }
    }
}
