//! Services running as local processes, made findable through the cluster as an
//! installation's are, so that `kubectl switchyard` needs nothing but a kubeconfig: a Service
//! of type ExternalName (`localhost`) per process in the installation's namespace, with the
//! process's `grpc` and `admin` ports, and the observer's and operator's identities in the
//! Secrets cert-manager would fill (`switchyard-observer-tls`, `switchyard-operator-tls`).

use std::collections::BTreeMap;

use switchyard_k8s::{
    Api, Client, Namespace, ObjectMeta,
    k8s_openapi::{
        ByteString,
        api::core::v1::{Secret, Service, ServicePort, ServiceSpec},
    },
    kube::{
        self,
        api::{Patch, PatchParams},
    },
};
use switchyard_runtime::Role;

use crate::{Error, Pki, Result, ServiceProcess};

/// The field manager of what this module writes.
const MANAGER: &str = "switchyard-dev";

/// Creates `namespace` if it is missing, and applies one ExternalName Service per process:
/// `<service>-<n>` (n counting the processes of one service from 0), labelled
/// `app.kubernetes.io/name: <service>` and `app.kubernetes.io/part-of: switchyard`.
pub async fn publish_services(
    client: &Client,
    namespace: &str,
    processes: &[(&str, &ServiceProcess)],
) -> Result<()> {
    ensure_namespace(client, namespace).await?;
    let api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (service, process) in processes {
        let n = counts.entry(service).or_default();
        let name = format!("{service}-{n}");
        *n += 1;
        let port = |name: &str, port: u16| ServicePort {
            name: Some(name.to_owned()),
            port: i32::from(port),
            ..Default::default()
        };
        let object = Service {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(
                    [
                        ("app.kubernetes.io/name".to_owned(), (*service).to_owned()),
                        (
                            "app.kubernetes.io/part-of".to_owned(),
                            "switchyard".to_owned(),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("ExternalName".into()),
                external_name: Some("localhost".into()),
                ports: Some(vec![
                    port("grpc", process.grpc_addr().port()),
                    port("admin", process.admin_addr().port()),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        apply(&api, &name, &object).await?;
    }
    Ok(())
}

/// Applies the observer's and the operator's certificates from `pki` as the Secrets
/// `switchyard-observer-tls` and `switchyard-operator-tls` (tls.crt, tls.key, ca.crt).
pub async fn publish_identities(client: &Client, namespace: &str, pki: &Pki) -> Result<()> {
    ensure_namespace(client, namespace).await?;
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for role in [Role::Observer, Role::Operator] {
        let files = pki.files(role);
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map(ByteString)
                .map_err(|e| Error::Setup(format!("reading {}: {e}", path.display())))
        };
        let name = format!("{}-tls", role.service_account());
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(
                [
                    ("tls.crt".to_owned(), read(&files.cert)?),
                    ("tls.key".to_owned(), read(&files.key)?),
                    ("ca.crt".to_owned(), read(&files.ca)?),
                ]
                .into(),
            ),
            ..Default::default()
        };
        apply(&api, &name, &secret).await?;
    }
    Ok(())
}

async fn ensure_namespace(client: &Client, namespace: &str) -> Result<()> {
    let object = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    apply(&Api::<Namespace>::all(client.clone()), namespace, &object).await
}

async fn apply<K>(api: &Api<K>, name: &str, object: &K) -> Result<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let mut object = serde_json::to_value(object)
        .map_err(|e| Error::Setup(format!("serializing {name}: {e}")))?;
    object["apiVersion"] = K::api_version(&()).into();
    object["kind"] = K::kind(&()).into();
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .map_err(|e| Error::Setup(format!("applying {} {name}: {e}", K::kind(&()))))?;
    Ok(())
}
