//! Counter stores for Sluice: the shared state behind `synced` and `exact` mode.
//!
//! A [`CounterStore`] takes a whole span's flush as one batch ([`CounterStore::flush`]): per key
//! and window it adds this instance's count, records this instance's contribution entry, and
//! returns the global total, the previous window's total and every instance's entry. It also
//! runs the `exact` mode algorithms atomically ([`CounterStore::exact`]) and reads the store's
//! clock. Implementations: [`MemoryStore`] (embedded; also the simulator's store, with injected
//! latency and outages) and [`RedisStore`] (standalone, TLS, ACL).
//!
//! ```
//! use sluice_store::{CounterKey, CounterStore, FlushItem, MemoryStore};
//! use sluice_core::ManualClock;
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! # tokio_test();
//! # fn tokio_test() { tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = MemoryStore::new(Arc::new(ManualClock::new(1_000_000_000)));
//! let key = CounterKey::new("edge/user", &["alice"]);
//! let item = FlushItem { key: key.as_str().into(), window: 7, delta: 3, ttl: Duration::from_secs(120), entry: None, want_previous: false, first_write: true };
//! let reply = store.flush(&[item.clone()], None).await.unwrap();
//! assert_eq!(reply.results[0].as_ref().unwrap().total, 3);
//! let reply = store.flush(&[item], None).await.unwrap();
//! assert_eq!(reply.results[0].as_ref().unwrap().total, 6);
//! # }) }
//! ```

mod error;
mod etcd;
mod exact;
#[doc(hidden)]
pub mod fuzzing;
mod key;
mod memory;
mod node_entry;
mod redis;
mod window_counter;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use error::StoreError;
pub use etcd::{EtcdStore, EtcdStoreOptions};
pub use exact::{ExactAlgorithm, ExactRequest, decide_in_memory};
pub use key::CounterKey;
pub use memory::MemoryStore;
pub use node_entry::NodeEntry;
pub use redis::{RedisStore, RedisStoreOptions, packed_flush};
/// Where a Redis deployment is: the same types `sluice.yaml`'s `store:` is parsed into.
pub use sluice_config::{
    ClusterTarget, Credentials, EtcdTarget, RedisTarget, SentinelTarget, StandaloneTarget,
};
use sluice_core::{Decision, Nanos};

/// A boxed future, so that stores can be chosen at run time (`Arc<dyn CounterStore>`).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Add `delta` to `key` in `window`, and (optionally) record this instance's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlushItem {
    /// The counter's base key (see [`CounterKey`]).
    pub key: Arc<str>,
    /// Window number (`time / window`).
    pub window: u64,
    /// Count to add (may be zero to only read back).
    pub delta: u64,
    /// How long the window's keys live (two windows).
    pub ttl: Duration,
    /// This instance's contribution entry; `None` skips the per-node hash.
    pub entry: Option<NodeEntry>,
    /// Read the previous window's total too (the engine asks once per window, for rules that
    /// use it).
    pub want_previous: bool,
    /// This instance's first write of the key in this window: set the keys' TTL.
    pub first_write: bool,
}

impl FlushItem {
    /// The Redis commands this item costs in a flush pipeline: `INCRBY`; on a first write
    /// `PEXPIRE`; `GET` of the previous window when asked; with an entry `HSET`, `HGETALL`
    /// (and `PEXPIRE` on a first write). The memory store counts the same, so the simulator
    /// reports the load a Redis would take.
    pub fn redis_commands(&self) -> u64 {
        let first = u64::from(self.first_write);
        1 + first + u64::from(self.want_previous) + self.entry.as_ref().map_or(0, |_| 2 + first)
    }
}

/// Names one flush, so that a flush whose outcome is unknown (it timed out, or the connection
/// broke after it was sent) can be settled later with [`CounterStore::landed`] instead of being
/// sent again blindly (which would count it twice if it did arrive).
///
/// Each pipeline of the flush ends with a marker: the token written at a key that shares the
/// hash tag (the Cluster slot) of the pipeline's first item. A store runs a connection's
/// commands in order, so a marker that is there means every count before it was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlushReceipt {
    /// The flushing instance's id.
    pub owner: Arc<str>,
    /// Unique among this owner's flushes, across its restarts too.
    pub token: u64,
}

impl FlushReceipt {
    /// The marker's key for a pipeline whose first item is `first`: the item's key (so the
    /// same hash tag), `:r:`, the owner. Stable while the same key leads the flush, so markers
    /// do not pile up; it lives as long as the longest-lived counter of the pipeline.
    pub fn marker_key(&self, first: &FlushItem) -> String {
        format!("{}:r:{}", first.key, self.owner)
    }
}

/// What the store holds for one flushed key after the flush.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlushOutcome {
    /// The global count in the window, this flush included.
    pub total: u64,
    /// The global count in the previous window, when asked for and readable.
    pub previous_total: Option<u64>,
    /// Every instance's entry for the window (this one's included) when an entry was written.
    pub entries: Vec<NodeEntry>,
}

/// The reply to a whole flush.
#[derive(Clone, Debug, Default)]
pub struct FlushReply {
    /// One result per item, in order. A key can fail alone (e.g. someone wrote another type at it).
    pub results: Vec<Result<FlushOutcome, StoreError>>,
    /// The store's clock when it ran the flush, in nanoseconds since the epoch.
    pub store_time: Option<Nanos>,
    /// How many round trips the flush took (one per store node).
    pub round_trips: usize,
}

/// The instances that use a store, as an announcement found them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Presence {
    /// Instances that announced themselves recently, the announcing one included (0: the store
    /// does not know).
    pub live: u64,
    /// The store's clock when it answered, in nanoseconds since the epoch.
    pub store_time: Nanos,
}

/// The store key of the list of live instances (a sorted set: instance id, scored by its last
/// announcement in milliseconds of the store's clock).
pub const FLEET_KEY: &str = "sluice:v1:fleet";

/// Whether a flush also reads the store's clock (one `TIME` on Redis). A flush that needs no
/// new clock reading (an early sync moments after a span's flush) skips it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlushTime {
    /// Read it: the reply carries the store's time.
    #[default]
    Read,
    /// Do not: the reply's store time is `None`.
    Skip,
}

/// The shared store of counters.
pub trait CounterStore: Send + Sync + 'static {
    /// Applies a batch of counts: one pipeline per store node. With a receipt, each pipeline
    /// ends by writing its marker (see [`FlushReceipt`]). With [`FlushTime::Read`] the reply
    /// carries the store's clock ([`FlushReply::store_time`]).
    fn flush_timed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: Option<&'a FlushReceipt>,
        time: FlushTime,
    ) -> StoreFuture<'a, FlushReply>;

    /// [`CounterStore::flush_timed`] that reads the store's clock too.
    fn flush<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: Option<&'a FlushReceipt>,
    ) -> StoreFuture<'a, FlushReply> {
        self.flush_timed(items, receipt, FlushTime::Read)
    }

    /// Settles a flush under `receipt` whose outcome was unknown: per item, whether the
    /// pipeline that carried it was applied (its marker is there), or `None` when the node that
    /// holds its marker did not answer (Cluster: the other nodes' items are settled). `items`
    /// must be the flush's items exactly as sent: the pipelines and their first items, which
    /// name the markers, are recomputed from them (after a Cluster failover the new master
    /// serves the same slots).
    fn landed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: &'a FlushReceipt,
    ) -> StoreFuture<'a, Vec<Option<bool>>>;

    /// Decides one request of an `exact` mode rule atomically in the store.
    fn exact<'a>(&'a self, request: &'a ExactRequest) -> StoreFuture<'a, Decision>;

    /// Whether [`CounterStore::exact`] decides (false: it refuses every request, as etcd
    /// does; synced rules then never ask it).
    fn runs_exact(&self) -> bool {
        true
    }

    /// The store's current time, in nanoseconds since the epoch.
    fn time(&self) -> StoreFuture<'_, Nanos>;

    /// Announces instance `node` as live at the store's time and returns how many instances
    /// announced themselves within `live_for` (this one included), with the store's time.
    /// Stores that keep no such list answer with `live: 0` (unknown).
    fn announce<'a>(&'a self, node: &'a str, live_for: Duration) -> StoreFuture<'a, Presence> {
        let _ = (node, live_for);
        Box::pin(async move {
            Ok(Presence {
                live: 0,
                store_time: self.time().await?,
            })
        })
    }

    /// Takes instance `node` off the fleet's list (it is stopping), so that the instances
    /// left, and one started in its place, count it no more at their next announcement.
    /// Stores whose entries only expire (etcd: a lease of `live_for`) do nothing.
    fn leave<'a>(&'a self, node: &'a str) -> StoreFuture<'a, ()> {
        let _ = node;
        Box::pin(async { Ok(()) })
    }

    /// A short description for logs (`memory`, `redis://host:port`; never credentials).
    fn describe(&self) -> String;
}
