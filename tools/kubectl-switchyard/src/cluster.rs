//! The installation as the apiserver sees it: the services' Deployments and StatefulSets in
//! the installation's namespace, read through the kubeconfig (`--kubeconfig`, `--context`,
//! as kubectl reads them): desired and ready replicas, and the version of the image.

use std::path::PathBuf;

use serde::Serialize;
use switchyard_k8s::{
    Api, Client, Config, Deployment,
    k8s_openapi::api::{
        apps::v1::StatefulSet,
        core::v1::{PodTemplateSpec, Secret, Service},
    },
    kube::{
        self,
        api::ListParams,
        config::{KubeConfigOptions, Kubeconfig},
    },
};
use switchyard_runtime::error_chain;

use crate::connect::{Error, Result};

/// The label every Switchyard workload carries: `switchyard-<service>`.
const NAME_LABEL: &str = "app.kubernetes.io/name";

#[derive(Clone, Debug, clap::Args)]
pub struct ClusterArgs {
    /// kubeconfig to read the installation's Deployments and StatefulSets from; by default,
    /// as kubectl finds it: the files KUBECONFIG lists (merged), else ~/.kube/config. Without
    /// any, only the address flags are used
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use instead of its current context
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace Switchyard is installed in
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_NAMESPACE",
        default_value = "switchyard"
    )]
    pub switchyard_namespace: String,
    /// The client, made once per run: the identity, the published addresses and the
    /// workloads are each read with it.
    #[arg(skip)]
    client: Connection,
}

/// A client for the kubeconfig's context and its server, once made.
#[derive(Clone, Default)]
struct Connection(std::sync::Arc<tokio::sync::OnceCell<Option<(Client, String)>>>);

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = self
            .0
            .get()
            .and_then(|c| c.as_ref())
            .map(|(_, s)| s.as_str());
        f.debug_tuple("Connection").field(&server).finish()
    }
}

#[derive(Debug, Serialize)]
pub struct Workload {
    pub kind: &'static str,
    pub name: String,
    pub replicas: i32,
    pub ready: i32,
    pub updated: i32,
    /// The tag of the first container's image.
    pub version: String,
}

impl ClusterArgs {
    /// The kubeconfig as kubectl finds it, with where it came from for errors: `--kubeconfig`,
    /// else the files `KUBECONFIG` lists (merged), else `~/.kube/config`; `None` without any.
    fn kubeconfig(&self) -> Result<Option<(Kubeconfig, String)>> {
        let read = |path: &std::path::Path, origin: String| {
            Kubeconfig::read_from(path)
                .map(|k| Some((k, origin.clone())))
                .map_err(|e| Error::Config(format!("{origin}: {}", error_chain(&e))))
        };
        if let Some(path) = &self.kubeconfig {
            return read(path, format!("--kubeconfig {}", path.display()));
        }
        match Kubeconfig::from_env() {
            Ok(Some(kubeconfig)) => return Ok(Some((kubeconfig, "KUBECONFIG".into()))),
            Ok(None) => {}
            Err(e) => return Err(Error::Config(format!("KUBECONFIG: {}", error_chain(&e)))),
        }
        let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
            return Ok(None);
        };
        let path = PathBuf::from(home).join(".kube").join("config");
        match path.is_file() {
            true => read(&path, path.display().to_string()),
            false => Ok(None),
        }
    }

    /// The namespace of the kubeconfig's context (`--context`, else its current one), as
    /// kubectl defaults `-n` to it.
    pub fn context_namespace(&self) -> Option<String> {
        let (kubeconfig, _) = self.kubeconfig().ok()??;
        let name = self
            .context
            .clone()
            .or_else(|| kubeconfig.current_context.clone())?;
        kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == name)?
            .context
            .as_ref()?
            .namespace
            .clone()
    }

    /// A client for the kubeconfig's context, and its server, or `None` without a kubeconfig.
    async fn client(&self) -> Result<Option<(Client, String)>> {
        self.client
            .0
            .get_or_try_init(|| self.connect())
            .await
            .cloned()
    }

    async fn connect(&self) -> Result<Option<(Client, String)>> {
        let Some((kubeconfig, origin)) = self.kubeconfig()? else {
            return Ok(None);
        };
        let invalid = |reason: String| Error::Config(format!("{origin}: {reason}"));
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| invalid(error_chain(&e)))?;
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(|e| invalid(error_chain(&e)))?;
        Ok(Some((client, server)))
    }

    /// The installation's workloads, or `None` without a kubeconfig.
    pub async fn workloads(&self, timeout: std::time::Duration) -> Result<Option<Vec<Workload>>> {
        let Some((client, server)) = self.client().await? else {
            return Ok(None);
        };
        let unreachable = |error: kube::Error| Error::Unreachable {
            what: "apiserver",
            address: server.clone(),
            reason: error_chain(&error),
        };
        let namespace = &self.switchyard_namespace;
        let list = async {
            let deployments = Api::<Deployment>::namespaced(client.clone(), namespace)
                .list(&ListParams::default().labels(NAME_LABEL))
                .await
                .map_err(unreachable)?;
            let sets = Api::<StatefulSet>::namespaced(client.clone(), namespace)
                .list(&ListParams::default().labels(NAME_LABEL))
                .await
                .map_err(unreachable)?;
            Ok::<_, Error>((deployments, sets))
        };
        let (deployments, sets) =
            tokio::time::timeout(timeout, list)
                .await
                .map_err(|_| Error::Unreachable {
                    what: "apiserver",
                    address: server.clone(),
                    reason: format!("no answer within {timeout:?}"),
                })??;
        let ours = |labels: Option<&std::collections::BTreeMap<String, String>>| {
            labels
                .and_then(|l| l.get(NAME_LABEL))
                .is_some_and(|name| name.starts_with("switchyard-"))
        };
        let mut workloads: Vec<Workload> = deployments
            .items
            .iter()
            .filter(|d| ours(d.metadata.labels.as_ref()))
            .map(|d| {
                let status = d.status.clone().unwrap_or_default();
                Workload {
                    kind: "Deployment",
                    name: d.metadata.name.clone().unwrap_or_default(),
                    replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                    ready: status.ready_replicas.unwrap_or(0),
                    updated: status.updated_replicas.unwrap_or(0),
                    version: version(d.spec.as_ref().map(|s| &s.template)),
                }
            })
            .collect();
        workloads.extend(
            sets.items
                .iter()
                .filter(|s| ours(s.metadata.labels.as_ref()))
                .map(|s| {
                    let status = s.status.clone().unwrap_or_default();
                    Workload {
                        kind: "StatefulSet",
                        name: s.metadata.name.clone().unwrap_or_default(),
                        replicas: s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                        ready: status.ready_replicas.unwrap_or(0),
                        updated: status.updated_replicas.unwrap_or(0),
                        version: version(s.spec.as_ref().map(|s| &s.template)),
                    }
                }),
        );
        workloads.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Some(workloads))
    }
}

/// An identity read from its Secret in the installation's namespace, written to a private
/// directory (mode 0700, files 0600) that is removed when this is dropped.
#[derive(Debug)]
pub struct SecretIdentity {
    dir: tempfile::TempDir,
}

impl SecretIdentity {
    /// The three files, as the `--tls-*` flags would name them.
    pub fn tls(&self) -> crate::CliTls {
        crate::CliTls {
            tls_cert: Some(self.dir.path().join("tls.crt")),
            tls_key: Some(self.dir.path().join("tls.key")),
            tls_ca: Some(self.dir.path().join("ca.crt")),
            insecure_plaintext: false,
        }
    }
}

impl ClusterArgs {
    /// The identity in the Secret `name` of the installation's namespace (tls.crt, tls.key,
    /// ca.crt, as cert-manager and switchyard-certs write them), read with the kubeconfig's
    /// user; `None` without a kubeconfig. A Secret that is missing or that the user may not
    /// read is an error naming it and what to do instead.
    pub async fn identity(
        &self,
        name: &str,
        timeout: std::time::Duration,
    ) -> Result<Option<SecretIdentity>> {
        let Some((client, server)) = self.client().await? else {
            return Ok(None);
        };
        let namespace = &self.switchyard_namespace;
        let secret = format!("Secret {namespace}/{name}");
        let instead = "give --tls-cert, --tls-key and --tls-ca";
        let secrets = Api::<Secret>::namespaced(client, namespace);
        let found = match tokio::time::timeout(timeout, secrets.get(name)).await {
            Err(_) => {
                return Err(Error::Unreachable {
                    what: "apiserver",
                    address: server,
                    reason: format!("no answer within {timeout:?} reading {secret}"),
                });
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 403 => {
                return Err(Error::Config(format!(
                    "no identity: the kubeconfig's user may not read {secret} ({}); {instead}, \
                     or ask for get on that Secret",
                    status.message
                )));
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => {
                return Err(Error::Config(format!(
                    "no identity: {secret} does not exist (is Switchyard installed in \
                     {namespace}? --switchyard-namespace); {instead}"
                )));
            }
            Ok(Err(error)) => {
                return Err(Error::Unreachable {
                    what: "apiserver",
                    address: server,
                    reason: format!("reading {secret}: {}", error_chain(&error)),
                });
            }
            Ok(Ok(found)) => found,
        };
        let data = found.data.unwrap_or_default();
        let dir = tempfile::Builder::new()
            .prefix("kubectl-switchyard-")
            .tempdir()
            .map_err(|e| Error::Config(format!("a directory for {secret}'s files: {e}")))?;
        for key in ["tls.crt", "tls.key", "ca.crt"] {
            let bytes = data
                .get(key)
                .ok_or_else(|| Error::Config(format!("{secret} has no {key}; {instead}")))?;
            write_private(&dir.path().join(key), &bytes.0)
                .map_err(|e| Error::Config(format!("writing {secret}'s {key}: {e}")))?;
        }
        Ok(Some(SecretIdentity { dir }))
    }
}

/// Services of the installation that run outside the cluster and are published in its
/// namespace as Services of type ExternalName (as `make run` publishes its local processes):
/// the electors' gRPC addresses and every service's admin port.
#[derive(Debug, Default)]
pub struct Published {
    pub electors: Vec<String>,
    pub admins: Vec<String>,
}

impl ClusterArgs {
    /// The installation's ExternalName Services (labelled `app.kubernetes.io/part-of:
    /// switchyard`, ports named `grpc` and `admin`); `None` without a kubeconfig. Services of
    /// other types are inside the cluster, which this command does not reach by itself.
    pub async fn published(&self, timeout: std::time::Duration) -> Result<Option<Published>> {
        let Some((client, server)) = self.client().await? else {
            return Ok(None);
        };
        let services = Api::<Service>::namespaced(client, &self.switchyard_namespace);
        let params = ListParams::default().labels(PART_OF);
        let list = match tokio::time::timeout(timeout, services.list(&params)).await {
            Ok(Ok(list)) => list,
            Ok(Err(error)) => {
                return Err(Error::Unreachable {
                    what: "apiserver",
                    address: server,
                    reason: format!(
                        "listing the Services of {}: {}",
                        self.switchyard_namespace,
                        error_chain(&error)
                    ),
                });
            }
            Err(_) => {
                return Err(Error::Unreachable {
                    what: "apiserver",
                    address: server,
                    reason: format!("no answer within {timeout:?}"),
                });
            }
        };
        let mut published = Published::default();
        for service in list.items {
            let Some(spec) = service.spec else { continue };
            let (Some("ExternalName"), Some(host)) =
                (spec.type_.as_deref(), spec.external_name.as_deref())
            else {
                continue;
            };
            let port = |name: &str| {
                spec.ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name))
                    .map(|p| format!("{host}:{}", p.port))
            };
            let elector = service
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(NAME_LABEL))
                .is_some_and(|name| name == "switchyard-elector");
            if let (true, Some(grpc)) = (elector, port("grpc")) {
                published.electors.push(grpc);
            }
            published.admins.extend(port("admin"));
        }
        published.electors.sort();
        published.admins.sort();
        Ok(Some(published))
    }
}

/// The label every object of an installation carries.
const PART_OF: &str = "app.kubernetes.io/part-of=switchyard";

fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(bytes)
}

/// The version a workload runs: its Pods' `app.kubernetes.io/version` label (the release
/// overlay sets it), else the tag of its first image, else that image's digest, shortened.
fn version(template: Option<&PodTemplateSpec>) -> String {
    if let Some(version) = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get("app.kubernetes.io/version"))
    {
        return version.clone();
    }
    let image = template
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    image_version(&image)
}

/// `registry/name:tag[@digest]` → `tag`; `registry/name@sha256:…` → `sha256:` and 12 hex
/// digits; anything else as it is.
fn image_version(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let last = name.rsplit('/').next().unwrap_or_default();
    match (last.split_once(':'), digest) {
        (Some((_, tag)), _) => tag.to_owned(),
        (None, Some(digest)) => digest.chars().take("sha256:".len() + 12).collect(),
        (None, None) => image.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::image_version;

    #[test]
    fn a_workload_version_is_the_tag_else_the_short_digest() {
        assert_eq!(image_version("ghcr.io/switchyard/queue:0.1.0"), "0.1.0");
        assert_eq!(
            image_version("localhost:5000/queue:0.2.0@sha256:ab"),
            "0.2.0"
        );
        assert_eq!(
            image_version("ghcr.io/switchyard/queue@sha256:0123456789abcdef0123"),
            "sha256:0123456789ab"
        );
        assert_eq!(
            image_version("localhost:5000/queue"),
            "localhost:5000/queue"
        );
    }
}
