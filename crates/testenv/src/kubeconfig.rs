use std::path::Path;

use base64::{Engine, engine::general_purpose::STANDARD};

use crate::{Result, pki::Pki};

/// Writes an admin kubeconfig for `server` with the certificates embedded, so it keeps
/// working wherever the file is copied.
pub(crate) fn write(path: &Path, server: &str, pki: &Pki) -> Result<()> {
    let data = |p: &Path| -> Result<String> { Ok(STANDARD.encode(std::fs::read(p)?)) };
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "switchyard-testenv",
            "cluster": {
                "server": server,
                "certificate-authority-data": data(&pki.ca_cert)?,
            },
        }],
        "users": [{
            "name": "admin",
            "user": {
                "client-certificate-data": data(&pki.admin_cert)?,
                "client-key-data": data(&pki.admin_key)?,
            },
        }],
        "contexts": [{
            "name": "switchyard-testenv",
            "context": {"cluster": "switchyard-testenv", "user": "admin"},
        }],
        "current-context": "switchyard-testenv",
    });
    let yaml = serde_norway::to_string(&config)
        .map_err(|e| crate::Error::Setup(format!("failed to encode kubeconfig: {e}")))?;
    std::fs::write(path, yaml)?;
    Ok(())
}
