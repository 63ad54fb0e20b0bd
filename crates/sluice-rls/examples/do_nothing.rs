//! The decision service's ceiling on its own stack: axum answering every HTTP request with a
//! constant JSON body, and tonic answering every RLS `ShouldRateLimit` with `OK`, served the
//! way `sluice serve` serves its listeners (one thread per worker, each with its own
//! single-threaded runtime and `SO_REUSEPORT` socket) but doing no work at all.
//! `scripts/bench-service.sh` measures it beside Sluice and nginx (docs/BENCHMARKS.md).
//!
//! `cargo run --release -p sluice-rls --example do_nothing -- HTTP_ADDR GRPC_ADDR [WORKERS]`

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// Answers every call `OK`.
struct Constant;

#[tonic::async_trait]
impl RateLimitService for Constant {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

/// A listening socket on `addr` that shares the port with the other workers' sockets.
fn socket(addr: std::net::SocketAddr) -> std::net::TcpListener {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .expect("socket");
    s.set_reuse_address(true).expect("SO_REUSEADDR");
    s.set_reuse_port(true).expect("SO_REUSEPORT");
    s.set_nonblocking(true).expect("non-blocking");
    s.bind(&addr.into()).expect("bind");
    s.listen(1024).expect("listen");
    s.into()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: do_nothing HTTP_ADDR GRPC_ADDR [WORKERS]";
    let http: std::net::SocketAddr = args.next().expect(usage).parse().expect(usage);
    let grpc: std::net::SocketAddr = args.next().expect(usage).parse().expect(usage);
    let workers: usize = args.next().map_or(2, |w| w.parse().expect(usage));
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let (http, grpc) = (socket(http), socket(grpc));
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(async move {
                    let app = axum::Router::new().fallback(|body: axum::body::Bytes| async move {
                        let _ = body.len();
                        (
                            [("content-type", "application/json")],
                            r#"{"allowed":true,"remaining":999999,"retry_after_ms":null,"reset_after_ms":0}"#,
                        )
                    });
                    let http = tokio::net::TcpListener::from_std(http).expect("listener");
                    let grpc = tokio::net::TcpListener::from_std(grpc).expect("listener");
                    let incoming = futures_stream(grpc);
                    let (h, g) = tokio::join!(
                        std::future::IntoFuture::into_future(axum::serve(http, app)),
                        tonic::transport::Server::builder()
                            .add_service(RateLimitServiceServer::new(Constant))
                            .serve_with_incoming(incoming),
                    );
                    h.expect("http");
                    g.expect("grpc");
                });
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// The accepted connections of `listener`, with `TCP_NODELAY` as Sluice sets it.
fn futures_stream(
    listener: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| {
            let _ = stream.set_nodelay(true);
            stream
        });
        Some((accepted, listener))
    })
}
