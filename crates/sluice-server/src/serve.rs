//! `sluice serve`: the engine, its flush timer, the gRPC and HTTP front doors, the admin
//! listener, reloads (SIGHUP, `POST /reload`, file changes) and graceful shutdown, started
//! in named steps: load the config, build the engine on its store, bind every listener, serve
//! the front doors, start the flush timer, the reload watcher and the gateways, then wait for
//! the signal and shut down.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;
use sluice_config::{Gateway, ListenerLimits, ServiceConfig, StoreConfig};
use sluice_core::{Clock, CoarseClock, StdClock};
use sluice_engine::{Engine, EngineOptions, FlushReport, StateDir};
use sluice_rls::SharedEngine;
use sluice_store::{
    CounterStore, EtcdStore, EtcdStoreOptions, MemoryStore, RedisStore, RedisStoreOptions,
};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tonic::service::interceptor::InterceptedService;

use crate::access::Token;
use crate::admin::{admin_router, with_token};
use crate::admission::{Admission, Buffering, Door, Doors};
use crate::error::{Result, ServerError};
use crate::grpc_lane::GrpcLane;
use crate::guarded::ConnectionCap;
use crate::hot_lane::HotLane;
use crate::lifecycle::{keep_spill, open_state, wait_for_termination};
use crate::listener::{connection_budget, guarded_incoming, protect, serve_http};
use crate::service::Service;

/// The store `config` names; `true` for the memory store (nothing shared).
fn store_of(
    config: &ServiceConfig,
    clock: &Arc<dyn Clock>,
) -> Result<(Arc<dyn CounterStore>, bool)> {
    let tls_root_pem = config
        .store_ca_file
        .as_deref()
        .map(|f| {
            std::fs::read(f).map_err(|e| {
                ServerError::file_because(format!("cannot read store_ca_file {}", f.display()), e)
            })
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
        other => return Err(ServerError::UnsupportedStore(format!("{other:?}"))),
    })
}

async fn bind(listener: &'static str, addr: std::net::SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen {
            listener,
            addr,
            source,
        })
}

/// Runs until SIGTERM or Ctrl-C.
pub async fn run(config_path: &Path) -> Result<()> {
    run_until(config_path, wait_for_termination()).await
}

/// Runs until `stop` completes, then shuts down as on SIGTERM: no new connections, a flush
/// while calls in flight finish (within `shutdown_timeout`), a last flush and the spill. One
/// service per process: the metrics recorder it installs is the process's.
pub async fn run_until(config_path: &Path, stop: impl Future<Output = ()>) -> Result<()> {
    let config = sluice_config::load(config_path)?;
    crate::rule_listing::log_warnings(&config);
    let prometheus = crate::recorder::install()?;
    let clock: Arc<dyn Clock> = Arc::new(CoarseClock::new());
    let doors = Doors::new(clock.clone());
    let Built {
        engine,
        store_is_memory,
        description,
    } = build_engine(&config, clock)?;
    let state = open_state(&config.lifecycle, &engine)?;
    let engine: SharedEngine = Arc::new(ArcSwap::from_pointee(engine));
    let service = Arc::new(Service::new(
        config_path,
        &config,
        engine.clone(),
        prometheus.clone(),
        store_is_memory,
        doors.clone(),
    ));
    spawn_status_sampler(service.clone());
    let access = Access::read(&config)?;
    let max_connections = connection_budget(&config.listeners, 2 + config.gateways.len());
    let sockets = Sockets::bind(&config).await?;
    tracing::info!(
        http = %config.listen.http, grpc = %config.listen.grpc, admin = %config.listen.admin,
        store = %description, domains = config.rules.domains().count(),
        "sluice serving"
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let front = FrontDoors {
        engine: engine.clone(),
        rls_options: service.rls_options().clone(),
        max_connections,
        limits: config.listeners.clone(),
        doors,
        rlqs: sluice_rls::rlqs::RlqsLimits::from(&config.rlqs),
        stop: stop_rx,
    };
    let admin = front.admin(sockets.admin, &service, &config, &access);
    let (flusher, calls_done) = spawn_flusher(&engine, prometheus);
    let reloader = spawn_reloader(service.clone(), front.stop.clone());
    let mut gateways = front.gateways(&config, sockets.gateways, &service, &access)?;
    // Last: the API's and gRPC's workers answer from the moment they start.
    let mut http = front.api(sockets.http, &access)?;
    let mut grpc = front.grpc(sockets.grpc, &access)?;
    let servers = tokio::spawn(async move {
        admin.await;
        // Every worker is waited for; the first failure is the answer.
        let mut first = None;
        for (workers, what) in [
            (&mut http, "http worker"),
            (&mut grpc, "grpc worker"),
            (&mut gateways, "gateway worker"),
        ] {
            while let Some(done) = workers.join_next().await {
                if let Err(e) = done.map_err(|e| ServerError::task(what, e)).and_then(|r| r) {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    });
    stop.await;
    let running = Running {
        stop: stop_tx,
        servers,
        calls_done,
        flusher,
        reloader,
    };
    running
        .shut_down(&engine, config.lifecycle.shutdown_timeout, state.as_deref())
        .await
}

/// The engine `build_engine` made, before it is shared.
struct Built {
    engine: Engine,
    store_is_memory: bool,
    /// The store, as the start's log line names it.
    description: String,
}

/// Connects the store and builds the engine on it with the config's rules.
fn build_engine(config: &ServiceConfig, clock: Arc<dyn Clock>) -> Result<Built> {
    let (store, store_is_memory) = store_of(config, &clock)?;
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
    Ok(Built {
        engine,
        store_is_memory,
        description,
    })
}

/// Samples the rates for the status page's history, for as long as the process runs.
fn spawn_status_sampler(service: Arc<Service>) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(crate::status::SAMPLE_EVERY);
        loop {
            every.tick().await;
            service.book.sample(&service.engine.load());
        }
    });
}

/// The bearer tokens and TLS acceptors of the listeners, read from their files at start.
struct Access {
    admin_token: Option<Token>,
    api_token: Option<Token>,
    http_tls: Option<TlsAcceptor>,
    grpc_tls: Option<TlsAcceptor>,
}

impl Access {
    fn read(config: &ServiceConfig) -> Result<Self> {
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
        Ok(Access {
            admin_token,
            api_token,
            http_tls,
            grpc_tls,
        })
    }
}

/// Every listening socket, bound before anything is served: a port in use fails the start.
struct Sockets {
    /// The API's workers' sockets (`SO_REUSEPORT`).
    http: Vec<std::net::TcpListener>,
    /// The gRPC listener's workers' sockets (`SO_REUSEPORT`).
    grpc: Vec<std::net::TcpListener>,
    admin: TcpListener,
    /// Each gateway's workers' sockets (`SO_REUSEPORT`).
    gateways: Vec<(Vec<std::net::TcpListener>, Gateway)>,
}

impl Sockets {
    async fn bind(config: &ServiceConfig) -> Result<Self> {
        let workers = config
            .api_workers
            .map_or_else(crate::workers::cpus, std::num::NonZeroUsize::get);
        let http = crate::workers::bind_workers("http", config.listen.http, workers)?;
        let grpc = crate::workers::bind_workers("grpc", config.listen.grpc, workers)?;
        let admin = bind("admin", config.listen.admin).await?;
        let mut gateways = Vec::with_capacity(config.gateways.len());
        for g in &config.gateways {
            let workers = g
                .workers
                .map_or_else(crate::workers::cpus, std::num::NonZeroUsize::get);
            gateways.push((
                crate::workers::bind_workers("gateway", g.listen, workers)?,
                g.clone(),
            ));
        }
        Ok(Sockets {
            http,
            grpc,
            admin,
            gateways,
        })
    }
}

/// What every listener is served with: the engine, the RLS options, the limits and the
/// connection cap, the listeners' refusals and the stop signal.
struct FrontDoors {
    engine: SharedEngine,
    rls_options: sluice_rls::SharedOptions,
    limits: ListenerLimits,
    /// Each API listener's connection cap (`connection_budget`).
    max_connections: usize,
    doors: Doors,
    /// The bounds of RLQS streams (`rlqs:`).
    rlqs: sluice_rls::rlqs::RlqsLimits,
    stop: watch::Receiver<bool>,
}

impl FrontDoors {
    /// The admission of one of the main runtime's listeners (bodies read whole).
    fn admission(&self, listener: &'static str, door: Door) -> Admission {
        Admission::new(
            listener,
            door,
            Buffering::Whole(self.limits.max_body_bytes),
            &self.limits,
            &self.doors,
        )
    }

    /// The HTTP/JSON API (`/json`, `/v1/acquire`, ...), behind the API token when set: one
    /// worker thread per socket (workers.rs), one connection cap and one admission over all.
    fn api(
        &self,
        listeners: Vec<std::net::TcpListener>,
        access: &Access,
    ) -> Result<tokio::task::JoinSet<Result<()>>> {
        let (router, hot) = sluice_rls::http_api(self.engine.clone(), self.rls_options.clone());
        let router = with_token(router, access.api_token.clone());
        let admission = self.admission("http", Door::Http);
        let hot = Arc::new(HotLane::new(
            hot,
            admission.clone(),
            access.api_token.clone(),
            self.limits.request_timeout,
            self.limits.max_body_bytes,
        ));
        let router = protect(router, &self.limits, admission)
            .layer(axum::middleware::from_fn(crate::door_metrics::count_api));
        let cap = ConnectionCap::new("http", self.max_connections);
        let mut set = tokio::task::JoinSet::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let http = crate::workers::Http {
                router: router.clone(),
                hot: Some(hot.clone()),
                limits: self.limits.clone(),
                cap: cap.clone(),
                tls: access.http_tls.clone(),
                stop: self.stop.clone(),
            };
            let worker = crate::workers::spawn("http", i, listener, |l| http.serve(l))?;
            crate::workers::join_in(&mut set, "http worker", worker);
        }
        Ok(set)
    }

    /// The admin endpoints (admin.rs), behind the admin token or the `Host` check.
    fn admin(
        &self,
        listener: TcpListener,
        service: &Arc<Service>,
        config: &ServiceConfig,
        access: &Access,
    ) -> impl Future<Output = ()> + Send + use<> {
        let router = admin_router(
            service.clone(),
            access.admin_token.clone(),
            crate::host_check::AllowedHosts::new(&config.access.admin_hosts),
        );
        serve_http(
            listener,
            protect(router, &self.limits, self.admission("admin", Door::Http)),
            None,
            self.limits.clone(),
            ConnectionCap::new("admin", self.limits.admin_max_connections),
            access.http_tls.clone(),
            self.stop.clone(),
        )
    }

    /// Envoy's RLS and RLQS over gRPC, behind the API token when set: one worker thread per
    /// socket (workers.rs), one connection cap, one admission and one RLQS service (its
    /// streams' bounds) over all.
    fn grpc(
        &self,
        listeners: Vec<std::net::TcpListener>,
        access: &Access,
    ) -> Result<tokio::task::JoinSet<Result<()>>> {
        let limits = &self.limits;
        let builder = tonic::transport::Server::builder()
            .timeout(limits.request_timeout)
            .max_concurrent_streams(limits.http2_max_concurrent_streams)
            .http2_max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
            .layer(self.admission("grpc", Door::Grpc))
            .layer(GrpcLane::new(
                sluice_rls::RateLimitGrpc::shared(self.engine.clone(), self.rls_options.clone()),
                access.api_token.clone(),
                limits.max_body_bytes,
            ));
        let cap = ConnectionCap::new("grpc", self.max_connections);
        let rls = sluice_rls::grpc_service_shared(self.engine.clone(), self.rls_options.clone());
        let rlqs = sluice_rls::rlqs::rlqs_service(
            self.engine.clone(),
            self.rls_options.clone(),
            self.rlqs.clone(),
            self.stop.clone(),
        );
        let mut set = tokio::task::JoinSet::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let (mut builder, cap, rls, rlqs) =
                (builder.clone(), cap.clone(), rls.clone(), rlqs.clone());
            let (tls, token, stop) = (
                access.grpc_tls.clone(),
                access.api_token.clone(),
                self.stop.clone(),
            );
            let (idle, handshake) = (limits.idle_timeout, limits.header_read_timeout);
            let worker = crate::workers::spawn("grpc", i, listener, move |listener| async move {
                let incoming = guarded_incoming(listener, cap, idle, tls, handshake);
                let stop = stopped(stop);
                let served = match token {
                    Some(token) => {
                        let guard = crate::access::grpc_interceptor(token);
                        builder
                            .add_service(InterceptedService::new(rls, guard.clone()))
                            .add_service(InterceptedService::new(rlqs, guard))
                            .serve_with_incoming_shutdown(incoming, stop)
                            .await
                    }
                    None => {
                        builder
                            .add_service(rls)
                            .add_service(rlqs)
                            .serve_with_incoming_shutdown(incoming, stop)
                            .await
                    }
                };
                served.map_err(|e| ServerError::task("grpc listener", e))
            })?;
            crate::workers::join_in(&mut set, "grpc worker", worker);
        }
        Ok(set)
    }

    /// Opens the geoip databases (watched for changes) and starts every gateway's workers.
    fn gateways(
        &self,
        config: &ServiceConfig,
        sockets: Vec<(Vec<std::net::TcpListener>, Gateway)>,
        service: &Arc<Service>,
        access: &Access,
    ) -> Result<tokio::task::JoinSet<Result<()>>> {
        let geo = crate::geo::open(config.geoip.as_ref())?;
        if let (Some(geo), Some(geoip)) = (&geo, &config.geoip) {
            crate::geo::watch(geo.clone(), geoip, self.stop.clone());
        }
        crate::gateway_workers::start(
            sockets,
            &crate::gateway_workers::Shared {
                engine: &self.engine,
                service,
                geo: geo.as_ref(),
                limits: &self.limits,
                max_connections: self.max_connections,
                tls: access.http_tls.as_ref(),
                stop: &self.stop,
                doors: &self.doors,
            },
        )
    }
}

/// Resolves once `stop` turns true.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// Flushes at span boundaries, Prometheus upkeep on the same beat; once the sender is used
/// (every call in flight has finished), a last flush of everything.
fn spawn_flusher(
    engine: &SharedEngine,
    prometheus: PrometheusHandle,
) -> (JoinHandle<FlushReport>, oneshot::Sender<()>) {
    let (served_tx, served_rx) = oneshot::channel::<()>();
    let engine = engine.clone();
    let flusher = tokio::spawn(sluice_engine::run_flush_loop(
        move || engine.load_full(),
        move || prometheus.run_upkeep(),
        async move {
            let _ = served_rx.await;
        },
    ));
    (flusher, served_tx)
}

/// Reloads on SIGHUP and when a watched file changes, until `stop`. Called before the
/// listeners answer: the files' first reading is taken with the service (`Service::seen`), so
/// a change made as soon as the instance is ready (a ConfigMap updated right after a rollout)
/// is a change, and the SIGHUP handler is in place before any reload can be asked (without
/// it, an early SIGHUP ends the process).
fn spawn_reloader(service: Arc<Service>, stop: watch::Receiver<bool>) -> JoinHandle<()> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    tokio::spawn(async move {
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
}

/// The tasks a running service stops at shutdown.
struct Running {
    /// Turns true at shutdown: the listeners stop accepting.
    stop: watch::Sender<bool>,
    /// Every listener's task, done when their calls in flight are.
    servers: JoinHandle<Result<()>>,
    /// Tells the flush loop the calls are done: its last flush.
    calls_done: oneshot::Sender<()>,
    flusher: JoinHandle<FlushReport>,
    reloader: JoinHandle<()>,
}

impl Running {
    /// No new connections; a flush at once while calls in flight finish (cut off after
    /// `timeout`), the flush loop's last flush, leaving the fleet, the spill kept in `state`.
    async fn shut_down(
        self,
        engine: &SharedEngine,
        timeout: Duration,
        state: Option<&StateDir>,
    ) -> Result<()> {
        tracing::info!(
            ?timeout,
            "shutting down: no new connections; flushing now and while calls in flight finish"
        );
        let _ = self.stop.send(true);
        let first_flush = {
            let engine = engine.load_full();
            tokio::spawn(async move { engine.flush().await })
        };
        let served = match tokio::time::timeout(timeout, self.servers).await {
            Ok(served) => served.map_err(|e| ServerError::task("listener task", e))?,
            Err(_) => {
                tracing::warn!(
                    ?timeout,
                    "calls still in flight at shutdown_timeout are cut off"
                );
                Ok(())
            }
        };
        let _ = first_flush.await;
        let _ = self.calls_done.send(());
        let _ = self.reloader.await;
        let report = self
            .flusher
            .await
            .map_err(|e| ServerError::task("flush task", e))?;
        let engine = engine.load_full();
        engine.leave_fleet().await;
        let spill = engine.spill().await;
        keep_spill(state, &spill, &report);
        served
    }
}
