//! What every stream of the RLQS service shares: the engine, the options, the door's bounds,
//! the peers' streams, the demand book and the stop signal.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::sync::watch;

use super::demand::DemandBook;
use super::limits::{PeerStreams, RlqsLimits};
use crate::{SharedEngine, SharedOptions};

/// What every stream of the service shares.
pub(super) struct Shared {
    pub(super) engine: SharedEngine,
    pub(super) options: SharedOptions,
    pub(super) limits: RlqsLimits,
    pub(super) peers: Arc<PeerStreams>,
    pub(super) demand: DemandBook,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) next_id: AtomicU64,
}
