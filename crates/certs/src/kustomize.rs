//! The kustomize Component `switchyard-certs` writes beside the certificates.
//!
//! ```text
//!  DIR/kustomization.yaml      kind: Component
//!     secretGenerator          switchyard-<x>-tls (kubernetes.io/tls, no name suffix) from DIR/switchyard-<x>/
//!     patches                  apiservice-cabundle.yaml: the APIService trusts DIR/ca.crt
//!                              and, where components/cert-manager is in the build, its
//!                              issuers and Certificates are dropped (they would fight over
//!                              the same Secrets)
//! ```
//!
//! A Component, not a Kustomization, so it adds to any overlay:
//! `resources: [<deploy/kustomize>/overlays/ha]` with `components: [DIR]`.

use base64::Engine;

use crate::identities::Identity;

/// The APIService of components/external-metrics.
pub const APISERVICE: &str = "v1beta1.external.metrics.k8s.io";
/// The caBundle patch, in the Component's directory.
pub const CA_BUNDLE_PATCH: &str = "apiservice-cabundle.yaml";

/// `kustomization.yaml`: a Secret per identity in `namespace`, the caBundle patch, and the
/// removal of cert-manager's objects.
pub fn component(identities: &[Identity], namespace: &str) -> String {
    let mut out = String::from(
        "# Written by switchyard-certs: the certificates beside this file as Secrets, and the\n\
         # external metrics APIService trusting their CA. Add this directory to an overlay's\n\
         # `components:` (docs/certificates.md). It holds private keys: do not commit it.\n\
         apiVersion: kustomize.config.k8s.io/v1alpha1\n\
         kind: Component\n\
         secretGenerator:\n",
    );
    for identity in identities {
        let dir = identity.service_account;
        out.push_str(&format!(
            "  - name: {secret}\n    namespace: {namespace}\n    type: kubernetes.io/tls\n    \
             files: [tls.crt={dir}/tls.crt, tls.key={dir}/tls.key, ca.crt={dir}/ca.crt]\n    \
             options: {{disableNameSuffixHash: true}}\n",
            secret = identity.secret_name(),
        ));
    }
    out.push_str(&format!(
        "patches:\n\
         \x20 # Where components/external-metrics is in the build (a target that matches\n\
         \x20 # nothing is no error).\n\
         \x20 - path: {CA_BUNDLE_PATCH}\n    target: {{kind: APIService, name: {APISERVICE}}}\n\
         \x20 # These certificates replace cert-manager's: where components/cert-manager is in\n\
         \x20 # the build, its issuers and Certificates go (a target that matches nothing is no\n\
         \x20 # error).\n\
         \x20 - target: {{group: cert-manager.io}}\n    patch: |-\n      $patch: delete\n      \
         apiVersion: cert-manager.io/v1\n      kind: Certificate\n      metadata: {{name: any}}\n"
    ));
    out
}

/// `apiservice-cabundle.yaml`: the external metrics APIService (components/external-metrics)
/// verifies the queue's certificate with `ca_pem`, and no longer waits for cert-manager's CA
/// injector. A JSON patch: a strategic merge patch with a `target` would set the annotation
/// to the string "null" instead of removing it.
pub fn ca_bundle_patch(ca_pem: &str) -> String {
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "# Written by switchyard-certs: the CA that signed the queue's serving certificate.\n\
         - op: remove\n  path: /metadata/annotations/cert-manager.io~1inject-ca-from\n\
         - op: add\n  path: /spec/caBundle\n  value: {bundle}\n"
    )
}
