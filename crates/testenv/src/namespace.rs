use std::path::PathBuf;

use rand::distr::{Alphanumeric, SampleString};
use switchyard_k8s::{Api, Client, DeleteParams, Namespace, ObjectMeta, PostParams};

use crate::{ControlPlane, Result, cluster::create_default_service_account};

/// A namespace of its own for one test, deleted when dropped.
#[derive(Debug)]
pub struct TestNamespace {
    name: String,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    /// Creates `<prefix>-<random>` with its `default` ServiceAccount.
    pub async fn create(plane: &ControlPlane, client: &Client, prefix: &str) -> Result<Self> {
        let suffix = Alphanumeric
            .sample_string(&mut rand::rng(), 6)
            .to_lowercase();
        let name = format!("{prefix}-{suffix}");
        let api: Api<Namespace> = Api::all(client.clone());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("switchyard.dev/test".to_owned(), prefix.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &namespace).await?;
        create_default_service_account(client, &name).await?;
        Ok(Self {
            name,
            kubeconfig: plane.kubeconfig().to_owned(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Drop cannot await, and the test's runtime may be shutting down: delete from a
        // thread with its own runtime. Best effort; the control plane goes away anyway.
        let name = std::mem::take(&mut self.name);
        let kubeconfig = self.kubeconfig.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let kubeconfig =
                    switchyard_k8s::kube::config::Kubeconfig::read_from(&kubeconfig).ok()?;
                let config =
                    switchyard_k8s::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                        .await
                        .ok()?;
                let client = Client::try_from(config).ok()?;
                Api::<Namespace>::all(client)
                    .delete(&name, &DeleteParams::background())
                    .await
                    .ok()
            })
        })
        .join();
    }
}
