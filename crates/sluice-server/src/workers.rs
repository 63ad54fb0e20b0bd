//! Worker threads for an HTTP listener, as nginx's workers: the listening sockets they share
//! (`SO_REUSEPORT`, the kernel spreads the connections), and one thread per worker with its
//! own single-threaded runtime, so a request never crosses threads (no work stealing, no
//! wake-up of another thread per request). The HTTP/JSON API, the gRPC listener and every
//! gateway are served this way; the engine is shared, its flush runs on the main runtime.

use sluice_config::ListenerLimits;
use tokio::sync::watch;

use crate::error::{Result, ServerError};
use crate::guarded::ConnectionCap;
use crate::listener::serve_http;

/// Worker threads when the config does not say: one per CPU.
pub(crate) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// `count` listening sockets on one address, spread over by the kernel (`SO_REUSEPORT`). A
/// plain bind first checks that no other process listens there (sockets with `SO_REUSEPORT`
/// would otherwise share the port with another `sluice serve` of the same user without a
/// word) and picks the port for `:0`.
pub(crate) fn bind_workers(
    listener: &'static str,
    addr: std::net::SocketAddr,
    count: usize,
) -> Result<Vec<std::net::TcpListener>> {
    let open = |addr: std::net::SocketAddr, reuse_port: bool| -> std::io::Result<socket2::Socket> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(reuse_port)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        Ok(socket)
    };
    let failed = |source| ServerError::Listen {
        listener,
        addr,
        source,
    };
    let bound = {
        let probe = open(addr, false).map_err(failed)?;
        probe.listen(1).map_err(failed)?;
        let local = probe.local_addr().map_err(failed)?;
        local
            .as_socket()
            .ok_or_else(|| failed(std::io::Error::other("the socket has no IP address")))?
    };
    (0..count.max(1))
        .map(|_| {
            let socket = open(bound, true).map_err(failed)?;
            socket.listen(1024).map_err(failed)?;
            Ok(socket.into())
        })
        .collect()
}

/// An HTTP worker's serving: its router or service (cloned per connection), the listener's
/// limits, the connection cap all its workers share, TLS and the stop signal.
pub(crate) struct Http<S = axum::Router> {
    pub router: S,
    /// The API listener's hot lane (hot_lane.rs); none on a gateway.
    pub hot: Option<std::sync::Arc<crate::hot_lane::HotLane>>,
    pub limits: ListenerLimits,
    pub cap: ConnectionCap,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub stop: watch::Receiver<bool>,
}

impl<S: crate::listener::HttpService> Http<S> {
    /// Serves on `listener` until the stop signal (listener.rs `serve_http`).
    pub(crate) async fn serve(self, listener: tokio::net::TcpListener) -> Result<()> {
        serve_http(
            listener,
            self.router,
            self.hot,
            self.limits,
            self.cap,
            self.tls,
            self.stop,
        )
        .await;
        Ok(())
    }
}

/// Starts one worker thread (named `{name}-{index}`) with its own single-threaded runtime,
/// on which `serve` runs with the worker's socket (called there, so that whatever it spawns
/// runs on this worker); it ends when `serve` has. The runtime and the socket's registration
/// are made here, so that a worker that cannot start fails the start.
pub(crate) fn spawn<F, Fut>(
    name: &str,
    index: usize,
    listener: std::net::TcpListener,
    serve: F,
) -> Result<std::thread::JoinHandle<Result<()>>>
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ServerError::Start {
            what: "cannot start a worker's runtime",
            source,
        })?;
    let listener = {
        let _in_runtime = runtime.enter();
        tokio::net::TcpListener::from_std(listener).map_err(|source| ServerError::Start {
            what: "cannot register a worker's listener",
            source,
        })?
    };
    std::thread::Builder::new()
        .name(format!("{name}-{index}"))
        .spawn(move || runtime.block_on(serve(listener)))
        .map_err(|source| ServerError::Start {
            what: "cannot start a worker thread",
            source,
        })
}

/// Waits for worker threads in `set` (without holding a runtime thread while they run).
pub(crate) fn join_in(
    set: &mut tokio::task::JoinSet<Result<()>>,
    what: &'static str,
    thread: std::thread::JoinHandle<Result<()>>,
) {
    set.spawn_blocking(move || {
        thread
            .join()
            .unwrap_or_else(|_| Err(ServerError::task(what, "it panicked")))
    });
}
