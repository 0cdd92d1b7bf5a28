//! The gRPC edge of registered watches (`switchyard.watcher.v1.Watches`): a reconciler
//! registers its controllers' watches for as long as its response stream stays open.
//!
//! ```text
//!  Register(request) ─► proto to core, validated (INVALID_ARGUMENT naming the field)
//!     ─► Informers::register: conflicts with the file, discovery, informers, initial lists
//!     ─► one RegisterResponse (every kind it needs, listed)
//!     ─► the stream stays open and holds the registration until the reconciler closes it
//!        or goes away (the stream is dropped), or the watcher drains (the stream ends)
//! ```

use std::{pin::Pin, sync::Arc};

use futures::{Stream, StreamExt, stream};
use switchyard_proto::{
    common::v1::GroupVersionKind,
    watcher::v1::{self as proto, RegisterRequest, RegisterResponse, watches_server},
};
use switchyard_runtime::{Drain, authz::Caller};
use switchyard_watcher_core::{
    Config, ControllerWatches, Gvk, MAX_FIELD_PREDICATES, Predicate, Registration, Watch,
};
use tonic::{Request, Response, Status};
use tracing::warn;

use crate::{
    error::{ApiError, invalid},
    informers::{Informers, RegisterError},
};

#[derive(Clone, Debug)]
pub struct WatchesService {
    informers: Arc<Informers>,
    /// The file, whose `registrations` say which kinds each service account may watch.
    config: Arc<Config>,
    drain: Drain,
}

impl WatchesService {
    pub fn new(informers: Arc<Informers>, config: Arc<Config>, drain: Drain) -> Self {
        Self {
            informers,
            config,
            drain,
        }
    }

    pub fn into_server(self) -> watches_server::WatchesServer<Self> {
        watches_server::WatchesServer::new(self)
    }
}

type RegisterStream = Pin<Box<dyn Stream<Item = Result<RegisterResponse, Status>> + Send>>;

#[tonic::async_trait]
impl watches_server::Watches for WatchesService {
    type RegisterStream = RegisterStream;

    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterStream>, Status> {
        let caller = request.extensions().get::<Caller>().cloned();
        let RegisterRequest {
            registrant,
            controllers,
        } = request.into_inner();
        let named = registrant.clone();
        let refused = |error: ApiError| {
            warn!(registrant = %named, %error, "registration refused");
            Status::from(error)
        };
        let registration = registration(registrant, controllers).map_err(refused)?;
        // Without identities (plaintext, for development) nothing is checked.
        if let Some(caller) = caller {
            registration
                .check_access(&self.config, &caller.identity.service_account)
                .map_err(|denied| refused(ApiError::Denied(denied.0)))?;
        }
        let registered = self
            .informers
            .register(registration, &self.drain)
            .await
            .map_err(|e| refused(e.into()))?;
        let response = RegisterResponse {
            synced: registered.kinds().iter().map(proto_gvk).collect(),
        };
        let drain = self.drain.clone();
        let held = stream::once(async move {
            drain.signaled().await;
            drop(registered);
            None
        })
        .filter_map(std::future::ready);
        Ok(Response::new(Box::pin(
            stream::iter([Ok(response)]).chain(held),
        )))
    }
}

/// The request in the core's terms; the error names the field.
fn registration(
    registrant: String,
    controllers: Vec<proto::ControllerWatches>,
) -> Result<Registration, ApiError> {
    let mut declared = Vec::with_capacity(controllers.len());
    for (c, controller) in controllers.into_iter().enumerate() {
        let proto::ControllerWatches {
            name,
            reconciles,
            owns,
            by_label,
            by_namespace,
            by_selector,
            by_placement,
            by_name,
            namespaces,
        } = controller;
        let at = format!("controllers[{c}]");
        let list = |list: &str, watches: Vec<proto::Watch>| -> Result<Vec<Watch>, ApiError> {
            watches
                .into_iter()
                .enumerate()
                .map(|(i, w)| watch(&format!("{at}.{list}[{i}]"), w))
                .collect()
        };
        declared.push(ControllerWatches {
            name,
            reconciles: reconciles
                .map(|w| watch(&format!("{at}.reconciles"), w))
                .transpose()?,
            owns: list("owns", owns)?,
            by_label: list("by_label", by_label)?,
            by_namespace: list("by_namespace", by_namespace)?,
            by_selector: list("by_selector", by_selector)?,
            by_placement: list("by_placement", by_placement)?,
            by_name: list("by_name", by_name)?,
            namespaces,
        });
    }
    Registration::new(registrant, declared).map_err(|e| RegisterError::from(e).into())
}

fn watch(field: &str, watch: proto::Watch) -> Result<Watch, ApiError> {
    let proto::Watch {
        gvk,
        predicates,
        metadata_only,
        through,
        label,
        batch_period,
        batch_status_updates_only,
        label_selector,
        fields_changed,
        field_selector,
        not_written_by,
    } = watch;
    let batch_period = batch_period
        .map(|period| {
            switchyard_proto::duration(period)
                .ok_or_else(|| invalid(format!("{field}.batch_period"), "must not be negative"))
        })
        .transpose()?
        .filter(|period| !period.is_zero());
    if fields_changed.len() > MAX_FIELD_PREDICATES {
        return Err(invalid(
            format!("{field}.fields_changed"),
            format!(
                "{} given; at most {MAX_FIELD_PREDICATES}",
                fields_changed.len()
            ),
        ));
    }
    let fields = fields_changed
        .into_iter()
        .enumerate()
        .map(|(i, pointer)| {
            let predicate = Predicate::FieldChanged(pointer);
            match predicate.problem() {
                Some(problem) => Err(invalid(format!("{field}.fields_changed[{i}]"), problem)),
                None => Ok(predicate),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let predicates: Vec<Predicate> = predicates
        .into_iter()
        .enumerate()
        .map(|(p, value)| match proto::Predicate::try_from(value) {
            Ok(proto::Predicate::GenerationChanged) => Ok(Predicate::GenerationChanged),
            Ok(proto::Predicate::LabelsChanged) => Ok(Predicate::LabelsChanged),
            Ok(proto::Predicate::AnnotationsChanged) => Ok(Predicate::AnnotationsChanged),
            Ok(proto::Predicate::Unspecified) | Err(_) => Err(invalid(
                format!("{field}.predicates[{p}]"),
                format!(
                    "{value} is not a predicate (GENERATION_CHANGED, LABELS_CHANGED or ANNOTATIONS_CHANGED)"
                ),
            )),
        })
        .chain(fields.into_iter().map(Ok))
        .collect::<Result<_, _>>()?;
    let mut predicates = predicates;
    if not_written_by.len() > 1 {
        return Err(invalid(
            format!("{field}.not_written_by"),
            format!("{} given; at most one", not_written_by.len()),
        ));
    }
    if let Some(manager) = not_written_by.into_iter().next() {
        let predicate = Predicate::NotWrittenBy(manager);
        if let Some(problem) = predicate.problem() {
            return Err(invalid(format!("{field}.not_written_by[0]"), problem));
        }
        predicates.push(predicate);
    }
    Ok(Watch {
        gvk: gvk
            .map(|gvk| checked_gvk(&format!("{field}.gvk"), gvk))
            .transpose()?,
        predicates,
        metadata_only,
        through: through
            .map(|gvk| checked_gvk(&format!("{field}.through"), gvk))
            .transpose()?,
        label,
        batch_period,
        batch_status_only: batch_status_updates_only,
        label_selector,
        field_selector,
    })
}

/// `gvk` in the core's terms, each part no longer than Kubernetes allows (a group is a DNS
/// subdomain, a version and a lowercased kind DNS labels), so that no refusal quotes a
/// part of any size; the error names the field.
pub(crate) fn checked_gvk(field: &str, gvk: GroupVersionKind) -> Result<Gvk, ApiError> {
    let GroupVersionKind {
        group,
        version,
        kind,
    } = gvk;
    for (part, value, most) in [
        ("group", &group, 253),
        ("version", &version, 63),
        ("kind", &kind, 63),
    ] {
        if value.len() > most {
            return Err(invalid(
                format!("{field}.{part}"),
                format!("{} bytes, at most {most}", value.len()),
            ));
        }
    }
    Ok(Gvk {
        group,
        version,
        kind,
    })
}

fn proto_gvk(gvk: &Gvk) -> GroupVersionKind {
    GroupVersionKind {
        group: gvk.group.clone(),
        version: gvk.version.clone(),
        kind: gvk.kind.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gvk(group: &str, version: &str, kind: &str) -> Option<GroupVersionKind> {
        Some(GroupVersionKind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
        })
    }

    fn widgets() -> proto::ControllerWatches {
        proto::ControllerWatches {
            name: "example.com/v1/Widget".into(),
            reconciles: Some(proto::Watch {
                gvk: gvk("example.com", "v1", "Widget"),
                predicates: vec![proto::Predicate::GenerationChanged as i32],
                ..Default::default()
            }),
            owns: vec![proto::Watch {
                gvk: gvk("", "v1", "ConfigMap"),
                metadata_only: true,
                ..Default::default()
            }],
            by_label: vec![],
            by_namespace: vec![],
            by_selector: vec![],
            by_placement: vec![],
            by_name: vec![],
            namespaces: vec![],
        }
    }

    fn refused(controllers: Vec<proto::ControllerWatches>) -> Status {
        match registration("r".into(), controllers) {
            Ok(_) => panic!("accepted"),
            Err(error) => error.into(),
        }
    }

    #[test]
    fn a_registration_converts_every_field() {
        let registration = registration("r".into(), vec![widgets()]).unwrap();
        assert_eq!(registration.registrant(), "r");
        let kinds: Vec<String> = registration.kinds().map(|(g, _)| g.to_string()).collect();
        assert_eq!(kinds, ["v1/ConfigMap", "example.com/v1/Widget"]);
    }

    #[test]
    fn a_kind_longer_than_kubernetes_allows_is_refused_by_its_length() {
        let mut bad = widgets();
        bad.owns[0].through = gvk("x".repeat(254).as_str(), "v1", "Widget");
        let status = refused(vec![bad]);
        assert_eq!(
            (status.code(), status.message()),
            (
                tonic::Code::InvalidArgument,
                "controllers[0].owns[0].through.group: 254 bytes, at most 253"
            )
        );
        let mut bad = widgets();
        bad.reconciles.as_mut().unwrap().gvk = gvk("", "v1", &"K".repeat(70_000));
        assert_eq!(
            refused(vec![bad]).message(),
            "controllers[0].reconciles.gvk.kind: 70000 bytes, at most 63"
        );
    }

    #[test]
    fn field_predicates_are_json_pointers_named_by_their_field_when_wrong() {
        let mut fields = widgets();
        fields.owns[0].fields_changed = vec!["/status/phase".into()];
        let registration = registration("r".into(), vec![fields.clone()]).unwrap();
        assert_eq!(registration.registrant(), "r");
        fields.owns[0].fields_changed.push("status".into());
        assert_eq!(
            refused(vec![fields.clone()]).message(),
            "controllers[0].owns[0].fields_changed[1]: fieldChanged \"status\" is not a JSON \
             pointer: it starts with '/', as \"/status/phase\""
        );
        fields.owns[0].fields_changed = vec!["/a".into(); MAX_FIELD_PREDICATES + 1];
        assert_eq!(
            refused(vec![fields]).message(),
            "controllers[0].owns[0].fields_changed: 17 given; at most 16"
        );
    }

    #[test]
    fn a_writer_predicate_names_a_field_manager_within_the_apiserver_limit() {
        let mut writers = widgets();
        writers.owns[0].not_written_by = vec!["widgets".into()];
        assert!(registration("r".into(), vec![writers.clone()]).is_ok());
        writers.owns[0].not_written_by = vec!["m".repeat(129)];
        assert_eq!(
            refused(vec![writers.clone()]).message(),
            "controllers[0].owns[0].not_written_by[0]: notWrittenBy is 129 bytes; a field \
             manager is at most 128"
        );
        writers.owns[0].not_written_by = vec!["a".into(), "b".into()];
        assert_eq!(
            refused(vec![writers]).message(),
            "controllers[0].owns[0].not_written_by: 2 given; at most one"
        );
    }

    #[test]
    fn a_field_selector_is_checked_and_named_by_its_field_when_wrong() {
        let mut fields = widgets();
        fields.owns[0].field_selector = "spec.nodeName=node-1,status.phase!=Running".into();
        assert!(registration("r".into(), vec![fields.clone()]).is_ok());
        fields.owns[0].field_selector = "spec.nodeName".into();
        assert_eq!(
            refused(vec![fields]).message(),
            "controllers[0].owns[0].field_selector: \"spec.nodeName\" is no requirement: a \
             field, '=', '==' or '!=', and a value"
        );
    }

    #[test]
    fn malformed_registrations_are_invalid_arguments_naming_the_field() {
        let mut bad = widgets();
        bad.owns[0].predicates = vec![proto::Predicate::LabelsChanged as i32, 0];
        let status = refused(vec![widgets(), bad]);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "controllers[1].owns[0].predicates[1]: 0 is not a predicate (GENERATION_CHANGED, LABELS_CHANGED or ANNOTATIONS_CHANGED)"
        );
        let mut bad = widgets();
        bad.owns[0].gvk = gvk("", "v1", "configmap");
        let status = refused(vec![bad]);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status
                .message()
                .starts_with("controllers[0].owns[0].gvk.kind: \"configmap\""),
            "{}",
            status.message()
        );
    }
}
