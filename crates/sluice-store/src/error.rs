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
    /// A replica refused the write (`READONLY`: the master was demoted). Nothing was applied;
    /// the new master is looked up again.
    #[error("store refused the write as a replica: {0}")]
    ReadOnly(String),
    /// A Cluster node does not serve the key's slot now (`MOVED`, `ASK`, `TRYAGAIN`,
    /// `CLUSTERDOWN`, `MASTERDOWN`). Nothing was applied; the slot map is read again.
    #[error("store cluster is moving the key's slot: {0}")]
    Redirected(String),
}

impl StoreError {
    /// Whether this is a failure of the store as a whole (as opposed to one key's bad data).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Timeout(_))
    }

    /// Whether the store's topology changed under the call (a demoted master, a moved slot):
    /// the connection or slot map should be looked up again. The call was not applied.
    pub fn is_topology_change(&self) -> bool {
        matches!(self, StoreError::ReadOnly(_) | StoreError::Redirected(_))
    }

    /// A short name for metrics and logs: `unavailable`, `timeout`, `bad_reply`, `refused`,
    /// `read_only`, `redirected`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Timeout(_) => "timeout",
            StoreError::BadReply { .. } => "bad_reply",
            StoreError::Refused(_) => "refused",
            StoreError::ReadOnly(_) => "read_only",
            StoreError::Redirected(_) => "redirected",
        }
    }
}
