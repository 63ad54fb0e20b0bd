//! The running service's shared state: what the admin endpoints read (engine, metrics, status
//! book, rule listing, listeners' refusals) and the reload paths change (engine, RLS options,
//! gateways), with the reload itself. The admin router and the gateways take it; it knows
//! neither of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;
use sluice_config::ServiceConfig;
use sluice_rls::SharedEngine;

/// How the admin endpoints and the reload paths share state.
pub(crate) struct Service {
    config_path: PathBuf,
    pub(crate) engine: SharedEngine,
    pub(crate) prometheus: PrometheusHandle,
    pub(crate) store_is_memory: bool,
    reload_lock: tokio::sync::Mutex<()>,
    /// The config file, reloads and the rates' history, for the status page.
    pub(crate) book: crate::status::Book,
    /// The running rules as `sluice check` prints them (`GET /rlconfig`).
    pub(crate) rules_text: parking_lot::Mutex<String>,
    /// The settings in effect: the start's, with what reloads applied.
    running: parking_lot::Mutex<ServiceConfig>,
    /// The Envoy RLS and HTTP API options a reload may change.
    rls_options: sluice_rls::SharedOptions,
    /// The files the last reload (or the start) read, with their modification times: the file
    /// watcher reloads when the files under the config's rule paths differ from these, so a
    /// change that `POST /reload` or `SIGHUP` already applied is not reloaded a second time.
    seen: parking_lot::Mutex<Vec<(PathBuf, Option<SystemTime>)>>,
    /// Each gateway worker's handle, by the gateway's listen address.
    pub(crate) gateways:
        parking_lot::Mutex<Vec<(std::net::SocketAddr, sluice_http::GatewayHandle)>>,
    /// What each listener refused, for readiness and the status page.
    pub(crate) doors: crate::admission::Doors,
}

impl Service {
    /// The state of a service started from `config` (read from `config_path`).
    pub(crate) fn new(
        config_path: &Path,
        config: &ServiceConfig,
        engine: SharedEngine,
        prometheus: PrometheusHandle,
        store_is_memory: bool,
        doors: crate::admission::Doors,
    ) -> Self {
        let rls_options: sluice_rls::SharedOptions =
            Arc::new(ArcSwap::from_pointee(sluice_rls::RlsOptions {
                api_domain: config.api_domain.clone(),
                response_headers: config.rls_response_headers,
                max_body: config.listeners.max_body_bytes,
                adhoc_max_keys: config.adhoc_max_keys,
                ..sluice_rls::RlsOptions::default()
            }));
        let started_ms = engine.load().now() / 1_000_000;
        Service {
            config_path: config_path.to_path_buf(),
            engine,
            prometheus,
            store_is_memory,
            reload_lock: tokio::sync::Mutex::new(()),
            rules_text: parking_lot::Mutex::new(crate::rule_listing::render(config)),
            book: crate::status::Book::new(
                config_path.to_path_buf(),
                config.access.status_full_keys,
                started_ms,
            ),
            running: parking_lot::Mutex::new(config.clone()),
            seen: parking_lot::Mutex::new(watched_files(&config.file, &config.rule_paths)),
            rls_options,
            gateways: parking_lot::Mutex::new(Vec::new()),
            doors,
        }
    }

    /// The Envoy RLS and HTTP API options, shared with the front doors (a reload swaps them).
    pub(crate) fn rls_options(&self) -> &sluice_rls::SharedOptions {
        &self.rls_options
    }

    /// Loads the config again and swaps the engine; on any error the running rules stay.
    pub(crate) async fn reload(&self, why: &str) -> Result<String, String> {
        let _one_at_a_time = self.reload_lock.lock().await;
        self.reload_locked(why)
    }

    /// Reloads when a watched file changed since the last reload of any trigger, or a rule file
    /// appeared in or left a rules directory; `None` when nothing changed.
    pub(crate) async fn reload_if_changed(&self, why: &str) -> Option<Result<String, String>> {
        let _one_at_a_time = self.reload_lock.lock().await;
        let now = self.watched_files();
        if now == *self.seen.lock() {
            return None;
        }
        Some(self.reload_locked(why))
    }

    /// The files of the config in effect, with their modification times (no lock held while
    /// reading them).
    fn watched_files(&self) -> Vec<(PathBuf, Option<SystemTime>)> {
        let (file, rule_paths) = {
            let running = self.running.lock();
            (running.file.clone(), running.rule_paths.clone())
        };
        watched_files(&file, &rule_paths)
    }

    /// [`Service::reload`] with the reload lock held.
    fn reload_locked(&self, why: &str) -> Result<String, String> {
        // Read before loading: a file written while the reload reads it looks changed to the
        // watcher, which loads it once more.
        let before = self.watched_files();
        let result = self.reload_now(why);
        // On success `running` names the new config's rule paths; a failed reload keeps the
        // old ones, and the watcher waits for the next change rather than failing again.
        let after = self.watched_files();
        *self.seen.lock() = after
            .into_iter()
            .map(|(file, time)| {
                let read = before
                    .iter()
                    .find(|(f, _)| *f == file)
                    .map_or(time, |b| b.1);
                (file, read)
            })
            .collect();
        let (ok, message) = match &result {
            Ok(m) => (true, m.clone()),
            Err(e) => (false, e.clone()),
        };
        self.book.reloaded(crate::status::ReloadOutcome {
            at_ms: self.engine.load().now() / 1_000_000,
            trigger: why.to_owned(),
            ok,
            message,
        });
        result
    }

    fn reload_now(&self, why: &str) -> Result<String, String> {
        let failed = |e: String| {
            tracing::error!(trigger = why, error = %e, "reload failed; the running rules stay");
            metrics::counter!("sluice_reloads_total", "result" => "error").increment(1);
            Err(e)
        };
        let config = match sluice_config::load(&self.config_path) {
            Ok(c) => c,
            Err(e) => return failed(e.to_string()),
        };
        for g in &config.gateways {
            if let Err(e) = sluice_http::GatewayHandle::check(g) {
                return failed(format!("invalid gateway upstream `{}`: {e}", g.upstream));
            }
        }
        crate::rule_listing::log_warnings(&config);
        let mut running = self.running.lock();
        let changes = crate::reload::changes(&running, &config);
        let old = self.engine.load_full();
        let new = old.reload(&config.rules, &config.defaults);
        *self.rules_text.lock() = crate::rule_listing::render(&config);
        let summary = new.reload_summary();
        let (kept, domains) = (summary.kept, summary.domains);
        // Counts of rules that went away still reach the store: the flusher keeps sweeping
        // them until the requests holding the old engine are done.
        self.engine.store(Arc::new(new));
        drop(old);
        let mut options = (**self.rls_options.load()).clone();
        options.api_domain.clone_from(&config.api_domain);
        options.response_headers = config.rls_response_headers;
        options.adhoc_max_keys = config.adhoc_max_keys;
        self.rls_options.store(Arc::new(options));
        for (listen, handle) in self.gateways.lock().iter() {
            if let Some(g) = config.gateways.iter().find(|g| g.listen == *listen) {
                // Checked above: it cannot fail here.
                let _ = handle.apply(g);
            }
        }
        *running = crate::reload::in_effect(&running, &config);
        metrics::counter!("sluice_reloads_total", "result" => "ok").increment(1);
        let mut message = summary.to_string();
        if !changes.applied.is_empty() {
            message.push_str(&format!("; applied: {}", changes.applied.join(", ")));
        }
        if changes.need_restart.is_empty() {
            tracing::info!(trigger = why, kept, domains, "{message}");
        } else {
            message.push_str(&format!(
                "; NOT applied, read only at start (restart to apply): {}",
                changes.need_restart.join(", ")
            ));
            tracing::warn!(trigger = why, kept, domains, "{message}");
        }
        Ok(message)
    }
}

/// Modification times of the config file and every rule file it names (a directory's files
/// listed anew on each call).
fn watched_files(file: &Path, rule_paths: &[PathBuf]) -> Vec<(PathBuf, Option<SystemTime>)> {
    let mut files = vec![file.to_path_buf()];
    for p in rule_paths {
        if p.is_dir() {
            if let Ok(dir) = std::fs::read_dir(p) {
                // The files a reload reads (`*.yaml`, `*.yml`): an editor's swap file coming
                // and going reloads nothing.
                let mut entries: Vec<PathBuf> = dir
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                    .collect();
                entries.sort();
                files.extend(entries);
            }
        } else {
            files.push(p.clone());
        }
    }
    files.dedup();
    files
        .into_iter()
        .map(|f| {
            let t = std::fs::metadata(&f).and_then(|m| m.modified()).ok();
            (f, t)
        })
        .collect()
}
