use std::path::PathBuf;

/// What went wrong, naming the certificate, field or file concerned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: generating a key: {source}")]
    Key {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("{what}: signing the certificate: {source}")]
    Sign {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("{field} {value:?}: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("CA certificate: {0}")]
    CaCertificate(String),
    #[error("CA key: {0}")]
    CaKey(String),
    #[error("{}: reading: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: writing: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Load {
        path: PathBuf,
        #[source]
        source: Box<Error>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
