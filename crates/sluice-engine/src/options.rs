//! [`EngineOptions`]: the engine's settings that are not in the rule files.

/// Settings that are not in the rule files.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// This instance's id in the store's per-node entries; unique per process by default.
    pub node_id: Option<String>,
    /// Whether the store is shared with other instances. With an unshared (memory) store,
    /// `synced` rules behave as `local` ones.
    pub shared_store: bool,
    /// Tracked keys per rule before new keys go to the fixed-size sketch.
    pub max_keys_per_rule: usize,
    /// Instances assumed by `exact` rules' `on_store_error: local` (MAX / instances each).
    pub expected_instances: u64,
    /// Correct this instance's clock by the store's `TIME` (read in every flush), so that
    /// instances with skewed clocks agree on window numbers. Tests that drive the engine with a
    /// manual clock against a real Redis turn it off.
    pub follow_store_clock: bool,
    /// Most items (keys and windows) per flush pipeline: a larger flush goes in several, each
    /// within the store's per-call timeout, so a key spray cannot make every flush time out.
    pub flush_chunk_items: usize,
    /// How `exact` rules call the store: the time budget per request and the circuit breaker.
    pub exact_calls: sluice_config::ExactCalls,
    /// Cut exact-mode store calls off at `exact_calls.timeout` with a tokio timer (it needs a
    /// runtime with time enabled). The simulator, which polls futures itself on manual
    /// clocks, turns it off; the breaker works either way.
    pub exact_budget_timer: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            node_id: None,
            shared_store: true,
            max_keys_per_rule: 1_000_000,
            expected_instances: 1,
            follow_store_clock: true,
            flush_chunk_items: sluice_config::DEFAULT_FLUSH_CHUNK_ITEMS,
            exact_calls: sluice_config::ExactCalls::default(),
            exact_budget_timer: true,
        }
    }
}
