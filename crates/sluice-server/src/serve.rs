//! `sluice serve`: the engine, its flush timer, the gRPC and HTTP front doors, the admin
//! listener, reloads (SIGHUP, `POST /reload`, file changes) and graceful shutdown.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sluice_config::{ServiceConfig, StoreConfig};
use sluice_core::{Clock, CoarseClock, StdClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_rls::{RlsOptions, SharedEngine};
use sluice_store::{
    CounterStore, EtcdStore, EtcdStoreOptions, MemoryStore, RedisStore, RedisStoreOptions,
};
use tokio::sync::watch;

use crate::access::Token;
use crate::admin::{admin_router, with_token};
use crate::admission::{Admission, Buffering, Door};
use crate::guarded::ConnectionCap;
use crate::lifecycle::{keep_spill, open_state, wait_for_termination};
use crate::listener::{connection_budget, guarded_incoming, protect, serve_http};

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

fn store_of(
    config: &ServiceConfig,
    clock: &Arc<dyn Clock>,
) -> anyhow::Result<(Arc<dyn CounterStore>, bool)> {
    let tls_root_pem = config
        .store_ca_file
        .as_deref()
        .map(|f| {
            std::fs::read(f)
                .map_err(|e| anyhow::anyhow!("cannot read store_ca_file {}: {e}", f.display()))
        })
        .transpose()?;
    let options = RedisStoreOptions {
        tls_root_pem,
        timeout: config.store_timeout,
        timeout_per_item: config.flush_timeout_per_key,
        max_items_per_call: config.flush_chunk_items,
        ..RedisStoreOptions::default()
    };
    Ok(match &config.store {
        StoreConfig::Memory => (Arc::new(MemoryStore::new(clock.clone())), true),
        StoreConfig::Redis(target) => (
            Arc::new(RedisStore::connect(target.clone(), options)?),
            false,
        ),
        StoreConfig::Etcd(target) => {
            let options = EtcdStoreOptions {
                timeout: config.store_timeout,
                tls_root_pem: options.tls_root_pem,
                ..EtcdStoreOptions::default()
            };
            (
                // etcd keeps no clock: the host's system clock stands in for it (see
                // `EtcdStore::connect`).
                Arc::new(EtcdStore::connect(target, options, Arc::new(StdClock))?),
                false,
            )
        }
        other => anyhow::bail!("store {other:?} is not supported by this build"),
    })
}

impl Service {
    /// Loads the config again and swaps the engine; on any error the running rules stay.
    pub(crate) async fn reload(&self, why: &str) -> Result<String, String> {
        let _one_at_a_time = self.reload_lock.lock().await;
        self.reload_locked(why)
    }

    /// Reloads when a watched file changed since the last reload of any trigger, or a rule file
    /// appeared in or left a rules directory; `None` when nothing changed.
    async fn reload_if_changed(&self, why: &str) -> Option<Result<String, String>> {
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

async fn bind(what: &str, addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what}); is another process using it?"))
}

/// The Prometheus recorder, with histograms (not summaries: buckets add up across instances)
/// and every family described and registered (see `sluice_engine::METRIC_FAMILIES`).
fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    use metrics_exporter_prometheus::Matcher;
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("sluice_flush_duration_seconds".into()),
            sluice_engine::FLUSH_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("sluice_decision_duration_seconds".into()),
                sluice_engine::DECISION_BUCKETS,
            )
        })
        .context("cannot set the metrics' histogram buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    sluice_engine::describe_metrics(env!("CARGO_PKG_VERSION"));
    Ok(handle)
}

/// Runs until SIGTERM or Ctrl-C.
pub async fn run(config_path: &Path) -> anyhow::Result<()> {
    let config = sluice_config::load(config_path)?;
    crate::rule_listing::log_warnings(&config);
    let prometheus = install_metrics()?;
    let clock: Arc<dyn Clock> = Arc::new(CoarseClock::new());
    let doors = crate::admission::Doors::new(clock.clone());
    let (store, store_is_memory) = store_of(&config, &clock)?;
    let description = store.describe();
    let engine = Engine::new(
        &config.rules,
        &config.defaults,
        store,
        clock,
        EngineOptions {
            shared_store: !store_is_memory,
            expected_instances: config.expected_instances,
            max_keys_per_rule: config.max_keys_per_rule,
            flush_chunk_items: config.flush_chunk_items,
            exact_calls: config.exact,
            ..EngineOptions::default()
        },
    );
    let state = open_state(&config.lifecycle, &engine)?;
    let engine: SharedEngine = Arc::new(ArcSwap::from_pointee(engine));
    let rls_options: sluice_rls::SharedOptions = Arc::new(ArcSwap::from_pointee(RlsOptions {
        api_domain: config.api_domain.clone(),
        response_headers: config.rls_response_headers,
        max_body: config.listeners.max_body_bytes,
        adhoc_max_keys: config.adhoc_max_keys,
        ..RlsOptions::default()
    }));
    let service = Arc::new(Service {
        config_path: config_path.to_path_buf(),
        engine: engine.clone(),
        prometheus: prometheus.clone(),
        store_is_memory,
        reload_lock: tokio::sync::Mutex::new(()),
        rules_text: parking_lot::Mutex::new(crate::rule_listing::render(&config)),
        book: crate::status::Book::new(
            config_path.to_path_buf(),
            config.access.status_full_keys,
            engine.load().now() / 1_000_000,
        ),
        running: parking_lot::Mutex::new(config.clone()),
        seen: parking_lot::Mutex::new(watched_files(&config.file, &config.rule_paths)),
        rls_options: rls_options.clone(),
        gateways: parking_lot::Mutex::new(Vec::new()),
        doors: doors.clone(),
    });
    tokio::spawn({
        let service = service.clone();
        async move {
            let mut every = tokio::time::interval(crate::status::SAMPLE_EVERY);
            loop {
                every.tick().await;
                service.book.sample(&service.engine.load());
            }
        }
    });
    let admin_token = config
        .access
        .admin_token_file
        .as_deref()
        .map(|f| Token::read(f, "access.admin_token_file"))
        .transpose()?;
    let api_token = config
        .access
        .api_token_file
        .as_deref()
        .map(|f| Token::read(f, "access.api_token_file"))
        .transpose()?;
    let (http_tls, grpc_tls) = match &config.access.tls {
        Some(files) => (
            Some(crate::tls::acceptor(files, crate::tls::HTTP_ALPN)?),
            Some(crate::tls::acceptor(files, crate::tls::GRPC_ALPN)?),
        ),
        None => (None, None),
    };
    let limits = config.listeners.clone();
    let max_connections = connection_budget(&limits, 2 + config.gateways.len());

    let http_listener = bind("http", config.listen.http).await?;
    let grpc_listener = bind("grpc", config.listen.grpc).await?;
    let admin_listener = bind("admin", config.listen.admin).await?;
    let mut gateway_listeners = Vec::with_capacity(config.gateways.len());
    for g in &config.gateways {
        let workers = g
            .workers
            .map_or_else(crate::gateway_workers::cpus, std::num::NonZeroUsize::get);
        gateway_listeners.push((
            crate::gateway_workers::bind_workers(g.listen, workers)?,
            g.clone(),
        ));
    }
    tracing::info!(
        http = %config.listen.http, grpc = %config.listen.grpc, admin = %config.listen.admin,
        store = %description, domains = config.rules.domains().count(),
        "sluice serving"
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await.map(|_| ());
    };

    let http = serve_http(
        http_listener,
        protect(
            with_token(
                sluice_rls::http_router_shared(engine.clone(), rls_options.clone()),
                api_token.clone(),
            ),
            &limits,
            Admission::new(
                "http",
                Door::Http,
                Buffering::Whole(limits.max_body_bytes),
                &limits,
                &doors,
            ),
        )
        .layer(axum::middleware::from_fn(crate::door_metrics::count_api)),
        limits.clone(),
        ConnectionCap::new("http", max_connections),
        http_tls.clone(),
        stop_rx.clone(),
    );
    let admin = serve_http(
        admin_listener,
        protect(
            admin_router(
                service.clone(),
                admin_token,
                crate::host_check::AllowedHosts::new(&config.access.admin_hosts),
            ),
            &limits,
            Admission::new(
                "admin",
                Door::Http,
                Buffering::Whole(limits.max_body_bytes),
                &limits,
                &doors,
            ),
        ),
        limits.clone(),
        ConnectionCap::new("admin", limits.admin_max_connections),
        http_tls.clone(),
        stop_rx.clone(),
    );
    let grpc = {
        let mut builder = tonic::transport::Server::builder()
            .timeout(limits.request_timeout)
            .max_concurrent_streams(limits.http2_max_concurrent_streams)
            .http2_max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
            .layer(Admission::new(
                "grpc",
                Door::Grpc,
                Buffering::Whole(limits.max_body_bytes),
                &limits,
                &doors,
            ));
        let incoming = guarded_incoming(
            grpc_listener,
            ConnectionCap::new("grpc", max_connections),
            limits.idle_timeout,
            grpc_tls,
            limits.header_read_timeout,
        );
        let service = sluice_rls::grpc_service_shared(engine.clone(), rls_options);
        let serving: std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>,
        > = match api_token {
            Some(token) => Box::pin(
                builder
                    .add_service(tonic::service::interceptor::InterceptedService::new(
                        service,
                        crate::access::grpc_interceptor(token),
                    ))
                    .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone())),
            ),
            None => Box::pin(
                builder
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone())),
            ),
        };
        serving
    };

    // Flush at span boundaries, Prometheus upkeep on the same beat; once every call in flight
    // has finished, a last flush of everything.
    let (served_tx, served_rx) = tokio::sync::oneshot::channel::<()>();
    let flusher = {
        let engine = engine.clone();
        let prometheus = prometheus.clone();
        tokio::spawn(sluice_engine::run_flush_loop(
            move || engine.load_full(),
            move || prometheus.run_upkeep(),
            async move {
                let _ = served_rx.await;
            },
        ))
    };

    // Reload on SIGHUP and when a watched file changes.
    let reloader = {
        let service = service.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut hup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut poll = tokio::time::interval(Duration::from_secs(2));
            loop {
                let hup_signal = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = stopped(stop.clone()) => break,
                    _ = hup_signal => { let _ = service.reload("SIGHUP").await; }
                    _ = poll.tick() => { let _ = service.reload_if_changed("file change").await; }
                }
            }
        })
    };

    let geo = crate::geo::open(config.geoip.as_ref())?;
    if let (Some(geo), Some(geoip)) = (&geo, &config.geoip) {
        crate::geo::watch(geo.clone(), geoip, stop_rx.clone());
    }
    let mut gateways = crate::gateway_workers::start(
        gateway_listeners,
        &crate::gateway_workers::Shared {
            engine: &engine,
            service: &service,
            geo: geo.as_ref(),
            limits: &limits,
            max_connections,
            tls: http_tls.as_ref(),
            stop: &stop_rx,
            doors: &doors,
        },
    )?;
    let servers = tokio::spawn(async move {
        let ((), (), g) = tokio::join!(http, admin, grpc);
        g.context("grpc listener")?;
        while let Some(done) = gateways.join_next().await {
            done.context("gateway task")?.context("gateway worker")?;
        }
        anyhow::Ok(())
    });

    wait_for_termination().await;
    let timeout = config.lifecycle.shutdown_timeout;
    tracing::info!(
        ?timeout,
        "shutting down: no new connections; flushing now and while calls in flight finish"
    );
    let _ = stop_tx.send(true);
    let first_flush = {
        let engine = engine.load_full();
        tokio::spawn(async move { engine.flush().await })
    };
    let served = match tokio::time::timeout(timeout, servers).await {
        Ok(served) => served.context("listener task")?,
        Err(_) => {
            tracing::warn!(
                ?timeout,
                "calls still in flight at shutdown_timeout are cut off"
            );
            Ok(())
        }
    };
    let _ = first_flush.await;
    let _ = served_tx.send(());
    let _ = reloader.await;
    let report = flusher.await.context("flush task")?;
    let engine = engine.load_full();
    engine.leave_fleet().await;
    let spill = engine.spill().await;
    keep_spill(state.as_deref(), &spill, &report);
    served
}
