//! TLS to PostgreSQL with rustls: the connector for RDS, Aurora and RDS
//! Proxy, whose certificates chain to Amazon's own RDS certificate
//! authorities, not to a public root.

use crate::{StoreError, StoreErrorKind};
use rustls::pki_types::{pem::PemObject, CertificateDer};
use std::sync::Arc;

/// The connector of [`PostgresStore::connect_tls`](super::PostgresStore::connect_tls),
/// for a pool of your own: TLS 1.2 or 1.3, the server's certificate checked
/// against `root_certificates` and its name against the host name.
pub type TlsConnector = tokio_postgres_rustls::MakeRustlsConnect;

/// A connector that trusts the certificate authorities in
/// `root_certificates` (PEM, one or more certificates: Amazon RDS's
/// `global-bundle.pem`, or a private CA's), and nothing else.
///
/// An empty or malformed PEM is a
/// [`Misconfigured`](StoreErrorKind::Misconfigured) error.
pub fn tls_connector(root_certificates: &[u8]) -> Result<TlsConnector, StoreError> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(root_certificates) {
        let certificate = certificate.map_err(|error| {
            StoreError::new(
                StoreErrorKind::Misconfigured,
                format!("the PostgreSQL root certificates are not valid PEM: {error}"),
            )
        })?;
        roots.add(certificate).map_err(|error| {
            StoreError::new(
                StoreErrorKind::Misconfigured,
                "a PostgreSQL root certificate is not a valid certificate",
            )
            .with_source(error)
        })?;
    }
    if roots.is_empty() {
        return Err(StoreError::new(
            StoreErrorKind::Misconfigured,
            "no certificate in the PostgreSQL root certificates (expected PEM)",
        ));
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|error| {
        StoreError::new(StoreErrorKind::Misconfigured, "TLS could not be set up").with_source(error)
    })?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}
