use std::time::Duration;

/// Why a store operation failed. A store failure never fails a request: the engine falls back.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or the connection broke.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store did not answer in time.
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store answered something that makes no sense for this key.
    #[error("bad reply for key `{key}`: {detail}")]
    BadReply {
        /// The key concerned.
        key: String,
        /// What was wrong.
        detail: String,
    },
    /// The store refused the operation.
    #[error("store error: {0}")]
    Refused(String),
}

impl StoreError {
    /// Whether this is a failure of the store as a whole (as opposed to one key's bad data).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Timeout(_))
    }
}
