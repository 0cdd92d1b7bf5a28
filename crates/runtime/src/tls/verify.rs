//! The rustls hooks that read the current material at every handshake.

use std::sync::Arc;

use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme,
    client::{
        ResolvesClientCert,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        verify_server_cert_signed_by_trust_anchor,
    },
    pki_types::{CertificateDer, ServerName, UnixTime},
    server::{
        ClientHello, ParsedCertificate, ResolvesServerCert,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
    sign::CertifiedKey,
};

use super::{Identity, Role, Tls};

impl Tls {
    /// The signature algorithms of the crypto provider, for every verifier.
    fn algorithms(&self) -> &rustls::crypto::WebPkiSupportedAlgorithms {
        &self.inner.provider.signature_verification_algorithms
    }
}

/// This service's current certificate, for the server and for clients.
#[derive(Debug)]
pub(super) struct CurrentKey(pub(super) Tls);

impl ResolvesServerCert for CurrentKey {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().key.clone())
    }
}

impl ResolvesClientCert for CurrentKey {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Client certificates checked against the current CA; a client may offer none (the
/// authorization layer then refuses every call but the open ones).
#[derive(Debug)]
pub(super) struct CurrentClientVerifier(pub(super) Tls);

impl ClientCertVerifier for CurrentClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional; every Switchyard client has exactly one certificate.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let material = self.0.current();
        let verified =
            material
                .client_verifier
                .verify_client_cert(end_entity, intermediates, now)?;
        material.check_serials(end_entity, intermediates)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, self.0.algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, self.0.algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.algorithms().supported_schemes()
    }
}

/// A server's certificate: chained to the current CA and naming the expected role in this
/// service's trust domain and namespace. The address dialed is not checked: queue members
/// are reached at Pod IPs, and the identity is what the shard map promises.
#[derive(Debug)]
pub(super) struct PeerVerifier {
    pub(super) tls: Tls,
    pub(super) expected: Role,
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let material = self.tls.current();
        let parsed = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &material.roots,
            intermediates,
            now,
            self.tls.algorithms().all,
        )?;
        material.check_serials(end_entity, intermediates)?;
        let identity = Identity::of_certificate(end_entity).map_err(|e| {
            Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(e))))
        })?;
        match identity.role_among(&material.identity) {
            Some(role) if role == self.expected => Ok(ServerCertVerified::assertion()),
            _ => Err(Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(Arc::new(UnexpectedPeer {
                    identity,
                    expected: self.expected,
                })),
            ))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, self.tls.algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, self.tls.algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.tls.algorithms().supported_schemes()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the server is {identity}, not a {expected} of this installation")]
struct UnexpectedPeer {
    identity: Identity,
    expected: Role,
}
