//! The spill: counts that could not reach the store when an instance stopped, kept in its
//! `state_dir` for the next start to deliver exactly once.
//!
//! A spill holds two kinds of counts. *Pending* counts were never sent, or are known not to
//! have arrived: the next start sends them. *Doubts* are flushes whose outcome is unknown
//! (they timed out): the next start first asks the store for their receipt's marker, drops
//! what arrived and sends only what did not. The file is written before every send of a
//! replay (what is about to be sent becomes a doubt under its receipt), so an instance killed
//! at any point leaves a file that neither loses nor doubles a count.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_store::{FlushItem, FlushReceipt};

/// The spill file's format version.
const VERSION: u32 = 1;

/// The spill file's name in the state directory.
const SPILL_FILE: &str = "spill.json";

/// Counts that did not reach the store (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spill {
    version: u32,
    pub(crate) doubts: Vec<SpilledDoubt>,
    pub(crate) pending: Vec<SpilledCount>,
}

/// A flush whose outcome is unknown for some items.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpilledDoubt {
    /// The receipt's owner and token: they name the marker that says whether it arrived.
    pub owner: String,
    pub token: u64,
    /// The items exactly as sent (the store recomputes the pipelines and markers from them).
    pub sent: Vec<SpilledCount>,
    /// Per item of `sent`: whether its outcome is still unknown.
    pub unknown: Vec<bool>,
}

/// One key's count in one window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpilledCount {
    /// The counter's base key in the store.
    pub key: String,
    pub window: u64,
    pub delta: u64,
    /// The window keys' lifetime in the store, in milliseconds.
    pub ttl_ms: u64,
    /// Store-corrected time (ms since the epoch) after which the window's keys are gone from
    /// the store: the count no longer matters to anyone and is not sent.
    pub expires_at_ms: u64,
}

impl SpilledCount {
    /// `item`'s count, spilled at `now_ms`.
    pub(crate) fn of(item: &FlushItem, delta: u64, now_ms: u64) -> Self {
        let ttl_ms = u64::try_from(item.ttl.as_millis()).unwrap_or(u64::MAX);
        Self {
            key: item.key.to_string(),
            window: item.window,
            delta,
            ttl_ms,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
        }
    }

    /// The flush item that adds this count (the replaying instance has no entry for the key;
    /// it sets the keys' lifetime again, as a first write does).
    pub(crate) fn item(&self) -> FlushItem {
        FlushItem {
            key: Arc::from(self.key.as_str()),
            window: self.window,
            delta: self.delta,
            ttl: Duration::from_millis(self.ttl_ms),
            entry: None,
            want_previous: false,
            first_write: true,
        }
    }
}

impl SpilledDoubt {
    pub(crate) fn receipt(&self) -> FlushReceipt {
        FlushReceipt {
            owner: Arc::from(self.owner.as_str()),
            token: self.token,
        }
    }

    /// The counts whose outcome is still unknown.
    pub(crate) fn unknown_counts(&self) -> impl Iterator<Item = &SpilledCount> {
        self.sent
            .iter()
            .zip(&self.unknown)
            .filter(|(_, u)| **u)
            .map(|(c, _)| c)
    }
}

impl Spill {
    pub(crate) fn new(doubts: Vec<SpilledDoubt>, pending: Vec<SpilledCount>) -> Self {
        Self {
            version: VERSION,
            doubts,
            pending,
        }
    }

    /// Whether it holds no count at all.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.doubts.iter().all(|d| d.unknown_counts().count() == 0)
    }

    /// Counts it holds: pending ones plus those in doubt (some of which may have arrived).
    pub fn counts(&self) -> u64 {
        let pending: u64 = self.pending.iter().map(|c| c.delta).sum();
        let doubted: u64 = self
            .doubts
            .iter()
            .flat_map(SpilledDoubt::unknown_counts)
            .map(|c| c.delta)
            .sum();
        pending.saturating_add(doubted)
    }

    /// Adds `other`'s counts to this spill.
    pub(crate) fn merge(&mut self, other: Spill) {
        self.doubts.extend(other.doubts);
        self.pending.extend(other.pending);
    }
}

/// Why the state directory or its spill file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// A file operation failed.
    #[error("state_dir: cannot {what} {path}: {source}")]
    Io {
        /// What was being done (`create`, `read`, `write`, ...).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the directory's lock.
    #[error(
        "state_dir {0} is in use by another running sluice serve; give each instance its own directory"
    )]
    InUse(PathBuf),
    /// The spill file is not one this version wrote.
    #[error(
        "state_dir: {path} is not a spill file this version can read ({detail}); move it away to start without it (its counts would not be delivered)"
    )]
    Unreadable {
        /// The spill file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
}

/// An instance's state directory, locked for as long as this value lives.
#[derive(Debug)]
pub struct StateDir {
    dir: PathBuf,
    _lock: File,
}

impl StateDir {
    /// Creates `dir` if needed and takes its lock: a second instance given the same directory
    /// gets [`StateError::InUse`].
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| StateError::Io { what, path, source }
        };
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        let lock_path = dir.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io("open", &lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StateError::InUse(dir.to_path_buf()));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", &lock_path)(e)),
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// The spill file's path.
    pub fn spill_path(&self) -> PathBuf {
        self.dir.join(SPILL_FILE)
    }

    /// The spill an earlier run left, if any.
    pub fn read_spill(&self) -> Result<Option<Spill>, StateError> {
        let path = self.spill_path();
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StateError::Io {
                    what: "read",
                    path,
                    source,
                });
            }
        };
        let unreadable = |detail: String| StateError::Unreadable {
            path: path.clone(),
            detail,
        };
        let spill: Spill = serde_json::from_slice(&text).map_err(|e| unreadable(e.to_string()))?;
        if spill.version != VERSION {
            return Err(unreadable(format!("format version {}", spill.version)));
        }
        let misaligned = spill.doubts.iter().any(|d| d.sent.len() != d.unknown.len());
        if misaligned {
            return Err(unreadable(
                "a doubt's items and flags differ in number".into(),
            ));
        }
        Ok(Some(spill))
    }

    /// Writes `spill` atomically (a temporary file, synced, renamed over the old one), or
    /// removes the file when the spill is empty.
    pub fn save(&self, spill: &Spill) -> Result<(), StateError> {
        let path = self.spill_path();
        if spill.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StateError::Io {
                    what: "remove",
                    path,
                    source: e,
                }),
                _ => Ok(()),
            };
        }
        let tmp = self.dir.join(format!("{SPILL_FILE}.tmp"));
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| StateError::Io { what, path, source }
        };
        let text = serde_json::to_vec(spill).map_err(|e| StateError::Io {
            what: "encode",
            path: path.clone(),
            source: e.into(),
        })?;
        let mut file = File::create(&tmp).map_err(io("create", &tmp))?;
        file.write_all(&text).map_err(io("write", &tmp))?;
        file.sync_all().map_err(io("sync", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
        // The rename itself is durable once the directory is synced.
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync", &self.dir))
    }
}
