//! [`ServerError`]: what starting and running the service can fail with. Each error says what
//! was wrong and where; the cause, when there is one, is its `source`.

use std::net::SocketAddr;

/// Why the service could not start, or why it stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The config (`sluice.yaml` or a rule file) could not be read or is not valid.
    #[error(transparent)]
    Config(#[from] sluice_config::ConfigError),
    /// The store the config names could not be set up.
    #[error(transparent)]
    Store(#[from] sluice_store::StoreError),
    /// The config names a store this build does not support.
    #[error("store {0} is not supported by this build")]
    UnsupportedStore(String),
    /// The state directory (`lifecycle.state_dir`) could not be taken or read.
    #[error(transparent)]
    State(#[from] sluice_engine::StateError),
    /// A file the config names (a token, a certificate or key, the store's CA, a geoip
    /// database) cannot be used: `what` names the setting, the file and what is wrong.
    #[error("{what}")]
    File {
        /// The setting, the file and what is wrong with it.
        what: String,
        /// The error reading or parsing it, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A listener's address could not be bound.
    #[error("cannot listen on {addr} ({listener}); is another process using it?")]
    Listen {
        /// The listener: `http`, `grpc`, `admin` or `gateway`.
        listener: &'static str,
        /// The address in the config.
        addr: SocketAddr,
        /// The socket's error.
        #[source]
        source: std::io::Error,
    },
    /// A gateway's `upstream` is not a URI.
    #[error("invalid gateway upstream `{upstream}`")]
    Upstream {
        /// The upstream as written.
        upstream: String,
        /// Why it is not a URI.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// The metrics recorder could not be installed.
    #[error("{what}")]
    Metrics {
        /// The step that failed.
        what: &'static str,
        /// The exporter's error.
        #[source]
        source: metrics_exporter_prometheus::BuildError,
    },
    /// A thread or a runtime of the service could not be started.
    #[error("{what}")]
    Start {
        /// What could not be started.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A task of the running service failed or panicked.
    #[error("{task}")]
    Task {
        /// The task: a listener, a gateway worker, the flush loop.
        task: &'static str,
        /// What happened to it.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ServerError {
    /// A file the config names that cannot be used, with no further cause.
    pub(crate) fn file(what: String) -> Self {
        ServerError::File { what, source: None }
    }

    /// A file the config names that cannot be used, because of `source`.
    pub(crate) fn file_because(
        what: String,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let source = Some(Box::new(source) as Box<dyn std::error::Error + Send + Sync>);
        ServerError::File { what, source }
    }

    /// A task of the service that failed with `source`.
    pub(crate) fn task(
        task: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ServerError::Task {
            task,
            source: source.into(),
        }
    }
}

/// What the service's functions return.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;
