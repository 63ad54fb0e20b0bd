//! `GET /status.json` on the admin listener: the engine's state ([`Engine::status`]) with what
//! only `serve` knows (the config file, reloads, version, uptime) and the decisions per second
//! of every rule over the last minutes, sampled every [`SAMPLE_EVERY`] into a fixed ring.
//! The format is documented in docs/OPERATIONS.md and stable: fields are only ever added.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use sluice_engine::{DecisionCounts, Engine, EngineStatus};

use crate::admission::{Doors, ListenerReport};

/// How often the rates are sampled.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept: ten minutes.
const SAMPLES: usize = 120;
/// Heavy keys per rule in the answer.
const TOP_KEYS: usize = 10;

/// The status format's version: bumped only if a field changes meaning or goes away.
pub(crate) const FORMAT: u32 = 1;

/// A reload's outcome, as the status shows it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ReloadOutcome {
    pub at_ms: u64,
    /// `http`, `signal` or `file`.
    pub trigger: String,
    pub ok: bool,
    pub message: String,
}

/// What `serve` knows beyond the engine.
#[derive(Debug)]
pub(crate) struct Book {
    config_file: PathBuf,
    /// Show rule keys in full (`access.status_full_keys`); else see [`crate::key_mask`].
    full_keys: bool,
    started_ms: u64,
    loaded_ms: Mutex<u64>,
    last_reload: Mutex<Option<ReloadOutcome>>,
    history: Mutex<VecDeque<Sample>>,
}

#[derive(Clone, Debug)]
struct Sample {
    at_ms: u64,
    counts: HashMap<(String, String), DecisionCounts>,
}

/// One rule's decisions per second over one sample interval.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct Rates {
    pub allowed: f64,
    pub denied: f64,
    pub shadow_denied: f64,
}

/// One point of a rule's chart.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Point {
    pub at_ms: u64,
    #[serde(flatten)]
    pub rates: Rates,
}

#[derive(Debug, Serialize)]
pub(crate) struct Status {
    pub format: u32,
    pub version: &'static str,
    /// The git commit it was built from, and the build date (`build_info.rs`).
    pub commit: &'static str,
    pub build_date: &'static str,
    pub now_ms: u64,
    pub uptime_s: u64,
    pub config: ConfigStatus,
    #[serde(flatten)]
    pub engine: EngineStatus,
    /// Per rule (`domain/id`): decisions per second over the last interval and the charts.
    pub rates: Vec<RuleRates>,
    /// What each listener refused, and whether it is shedding now.
    pub listeners: Vec<ListenerReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ConfigStatus {
    pub file: String,
    pub loaded_at_ms: u64,
    pub last_reload: Option<ReloadOutcome>,
}

#[derive(Debug, Serialize)]
pub(crate) struct RuleRates {
    pub domain: String,
    pub id: String,
    pub now: Rates,
    pub history: Vec<Point>,
}

fn per_second(before: &DecisionCounts, after: &DecisionCounts, secs: f64) -> Rates {
    // A reload that changed the rule starts its counts again: no negative rates.
    let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    Rates {
        allowed: rate(before.allowed, after.allowed),
        denied: rate(before.denied, after.denied),
        shadow_denied: rate(before.shadow_denied, after.shadow_denied),
    }
}

impl Book {
    pub(crate) fn new(config_file: PathBuf, full_keys: bool, now_ms: u64) -> Self {
        Self {
            config_file,
            full_keys,
            started_ms: now_ms,
            loaded_ms: Mutex::new(now_ms),
            last_reload: Mutex::new(None),
            history: Mutex::new(VecDeque::with_capacity(SAMPLES)),
        }
    }

    pub(crate) fn reloaded(&self, outcome: ReloadOutcome) {
        if outcome.ok {
            *self.loaded_ms.lock() = outcome.at_ms;
        }
        *self.last_reload.lock() = Some(outcome);
    }

    /// Takes one sample of every rule's decisions.
    pub(crate) fn sample(&self, engine: &Engine) {
        let at_ms = engine.now() / 1_000_000;
        let counts = engine
            .status(0)
            .rules
            .into_iter()
            .map(|r| ((r.domain, r.id), r.decisions))
            .collect();
        let mut history = self.history.lock();
        if history.len() == SAMPLES {
            history.pop_front();
        }
        history.push_back(Sample { at_ms, counts });
    }

    pub(crate) fn status(&self, engine: &Engine, doors: &Doors) -> Status {
        let now_ms = engine.now() / 1_000_000;
        let mut status = engine.status(TOP_KEYS);
        if !self.full_keys {
            for key in status
                .rules
                .iter_mut()
                .flat_map(|r| r.heavy_keys.iter_mut())
            {
                key.key = crate::key_mask::mask(&key.key);
            }
        }
        let history = self.history.lock();
        let rates = status
            .rules
            .iter()
            .map(|r| {
                let key = (r.domain.clone(), r.id.clone());
                let points: Vec<Point> = history
                    .iter()
                    .zip(history.iter().skip(1))
                    .filter_map(|(a, b)| {
                        let secs = (b.at_ms.saturating_sub(a.at_ms) as f64 / 1e3).max(1e-3);
                        let rates = per_second(a.counts.get(&key)?, b.counts.get(&key)?, secs);
                        Some(Point {
                            at_ms: b.at_ms,
                            rates,
                        })
                    })
                    .collect();
                // Now: from the last sample to this moment's counts.
                let now = history
                    .back()
                    .and_then(|last| {
                        let before = last.counts.get(&key)?;
                        let secs = now_ms.saturating_sub(last.at_ms) as f64 / 1e3;
                        (secs >= 0.5).then(|| per_second(before, &r.decisions, secs))
                    })
                    .or_else(|| points.last().map(|p| p.rates))
                    .unwrap_or_default();
                RuleRates {
                    domain: r.domain.clone(),
                    id: r.id.clone(),
                    now,
                    history: points,
                }
            })
            .collect();
        Status {
            format: FORMAT,
            version: crate::build_info::VERSION,
            commit: crate::build_info::COMMIT,
            build_date: crate::build_info::BUILD_DATE,
            now_ms,
            uptime_s: now_ms.saturating_sub(self.started_ms) / 1000,
            config: ConfigStatus {
                file: self.config_file.display().to_string(),
                loaded_at_ms: *self.loaded_ms.lock(),
                last_reload: self.last_reload.lock().clone(),
            },
            engine: status,
            rates,
            listeners: doors.report().listeners,
        }
    }
}
