//! A reverse proxy with nothing but hyper: the ceiling `scripts/bench-gateway.sh` measures
//! the gateway against (what the HTTP stack alone costs, without limits or defences).
//! `WORKERS` threads, each with its own single-threaded runtime and `SO_REUSEPORT` socket as
//! the gateway's workers, each with hyper-util's pooled client (`pool`), or an upstream
//! connection per client connection driven in that connection's task (`inline`).
//!
//! `bare_proxy pool|inline LISTEN UPSTREAM WORKERS`

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt as _;
use hyper::Request;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

type Upstream = Connection<TokioIo<TcpStream>, Incoming>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, mode, listen, upstream, workers] = args.as_slice() else {
        eprintln!("usage: bare_proxy pool|inline LISTEN UPSTREAM WORKERS");
        std::process::exit(2);
    };
    let inline = match mode.as_str() {
        "pool" => false,
        "inline" => true,
        other => panic!("unknown mode {other}"),
    };
    let listen: SocketAddr = listen.parse().expect("LISTEN: an address");
    let upstream: SocketAddr = upstream.parse().expect("UPSTREAM: an address");
    let workers: usize = workers.parse().expect("WORKERS: a number");
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let socket = socket2::Socket::new(
                socket2::Domain::for_address(listen),
                socket2::Type::STREAM,
                None,
            )
            .expect("socket");
            socket.set_reuse_port(true).expect("SO_REUSEPORT");
            socket.set_nonblocking(true).expect("non-blocking");
            socket.bind(&listen.into()).expect("bind");
            socket.listen(1024).expect("listen");
            let listener: std::net::TcpListener = socket.into();
            std::thread::spawn(move || serve(listener, upstream, inline))
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
}

fn serve(listener: std::net::TcpListener, upstream: SocketAddr, inline: bool) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Client<HttpConnector, Incoming> =
            Client::builder(TokioExecutor::new()).build(connector);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let io = TokioIo::new(stream);
            if inline {
                tokio::spawn(serve_inline(io, upstream));
            } else {
                let client = client.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |mut req: Request<Incoming>| {
                        let client = client.clone();
                        async move {
                            let target = target(&req, upstream);
                            *req.uri_mut() = target;
                            let response =
                                client.request(req).await.map_err(std::io::Error::other)?;
                            Ok::<_, std::io::Error>(response.map(|b| b.boxed()))
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(io, service).await;
                });
            }
        }
    });
}

fn target(req: &Request<Incoming>, upstream: SocketAddr) -> hyper::Uri {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    format!("http://{upstream}{path}")
        .parse()
        .expect("a valid target")
}

/// One client connection, with its own upstream connection polled in the same task.
async fn serve_inline(io: TokioIo<TcpStream>, upstream: SocketAddr) {
    let slot: Arc<Mutex<Option<SendRequest<Incoming>>>> = Arc::default();
    let (connections, mut opened) = tokio::sync::mpsc::channel::<Upstream>(1);
    let service = service_fn(move |req: Request<Incoming>| {
        let (slot, connections) = (slot.clone(), connections.clone());
        async move {
            let taken = slot.lock().expect("slot").take();
            let mut send = match taken {
                Some(send) if !send.is_closed() => send,
                _ => {
                    let stream = TcpStream::connect(upstream)
                        .await
                        .map_err(std::io::Error::other)?;
                    let _ = stream.set_nodelay(true);
                    let (send, connection) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream))
                            .await
                            .map_err(std::io::Error::other)?;
                    let _ = connections.send(connection).await;
                    send
                }
            };
            send.ready().await.map_err(std::io::Error::other)?;
            let response = send.send_request(req).await;
            *slot.lock().expect("slot") = Some(send);
            response
                .map(|r| r.map(|b| b.boxed()))
                .map_err(std::io::Error::other)
        }
    });
    let client_side = http1::Builder::new().serve_connection(io, service);
    let upstream_side = async move {
        while let Some(connection) = opened.recv().await {
            let _ = connection.await;
        }
    };
    tokio::select! {
        _ = client_side => {}
        () = upstream_side => {}
    }
}
