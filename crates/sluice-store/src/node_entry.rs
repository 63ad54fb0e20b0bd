//! [`NodeEntry`]: one instance's contribution to a key in a window, as the stores write it
//! (`count:at_ms:rate_milli`) and read it back, with the instance names shared while reading.

use std::sync::Arc;

/// One instance's contribution to a key in a window (the predictive policy, docs/SYNCED.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEntry {
    /// The instance's id.
    pub node: Arc<str>,
    /// Its admitted count in the window.
    pub count: u64,
    /// When it flushed, in store-corrected milliseconds since the epoch.
    pub at_ms: u64,
    /// Its demand rate (hits offered per second, denied ones included), in thousandths.
    pub rate_milli: u64,
}

impl NodeEntry {
    /// `count:at_ms:rate_milli`, the hash field's value.
    pub(crate) fn encode_into(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(out, "{}:{}:{}", self.count, self.at_ms, self.rate_milli);
    }

    pub(crate) fn decode(node: &str, value: &str, names: &mut NodeNames) -> Option<Self> {
        let mut parts = value.split(':');
        let count = parts.next()?.parse().ok()?;
        let at_ms = parts.next()?.parse().ok()?;
        let rate_milli = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(Self {
            node: names.get(node),
            count,
            at_ms,
            rate_milli,
        })
    }
}

/// The instance ids met while reading one flush's replies: a fleet has a handful, and every
/// shared key names them all, so each entry clones one of these instead of allocating its own.
#[derive(Default)]
pub(crate) struct NodeNames(Vec<Arc<str>>);

impl NodeNames {
    pub(crate) fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(known) = self.0.iter().find(|n| &***n == name) {
            return known.clone();
        }
        let new: Arc<str> = name.into();
        // Bounded: entries someone wrote under many names are read, not remembered.
        if self.0.len() < 64 {
            self.0.push(new.clone());
        }
        new
    }
}
