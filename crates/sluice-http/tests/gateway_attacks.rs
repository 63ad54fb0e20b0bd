//! Attacks on the gateway, in process: the gateway router served on a real dual-stack `[::]`
//! socket, a real upstream on loopback that counts what reaches it, the engine on a manual
//! clock. Each test is an attack that got through before its fix, and the figure it checks is
//! what reached the upstream. Every loop is bounded.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use sluice_engine::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const RULES: &str = r#"
domain: edge
descriptors:
  - key: masked_remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: remote_address
    value: 127.0.0.5
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: generic_key
    value: login
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: generic_key
    value: orders
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: generic_key
    value: search
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: generic_key
    value: items
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: generic_key
    value: slow
    rate_limit: { unit: minute, requests_per_unit: 3 }
"#;

/// What the test upstream does with each request, after counting it.
#[derive(Clone, Copy)]
enum Upstream {
    /// 200 and close.
    Answer,
    /// Holds the connection without a word (a slow handler, or one waiting for a slow body).
    Hang,
    /// Closes the connection without an answer (a crash after reading the request).
    Reset,
}

/// The heads of the requests that reached an upstream.
#[derive(Clone, Default)]
struct Seen {
    count: Arc<AtomicU64>,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Seen {
    fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }
}

async fn upstream(mode: Upstream) -> (u16, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Seen::default();
    let out = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65_536 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                seen.count.fetch_add(1, Ordering::SeqCst);
                seen.heads
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                match mode {
                    Upstream::Answer => {
                        let _ = stream
                            .write_all(
                                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                            )
                            .await;
                    }
                    Upstream::Hang => {
                        // Until the gateway gives up and closes its side.
                        let _ = stream.read(&mut buf).await;
                    }
                    Upstream::Reset => drop(stream),
                }
            });
        }
    });
    (port, out)
}

fn engine() -> Arc<ArcSwap<Engine>> {
    common::engine(RULES)
}

/// Starts a gateway to `upstream` on a dual-stack `[::]` socket (IPv4 clients arrive as
/// `::ffff:a.b.c.d`, as on any such listener); returns its port.
async fn gateway(upstream: u16, settings: &str, routes: &str) -> u16 {
    let yaml = format!(
        "gateways:\n  - listen: 127.0.0.1:1\n    upstream: http://127.0.0.1:{upstream}\n    domain: edge\n{settings}    routes:\n{routes}"
    );
    let config = sluice_config::parse_service(Path::new("gateway.yaml"), &yaml).unwrap();
    let router = sluice_http::gateway_router(engine(), &config.gateways[0], None).unwrap();
    let socket = TcpSocket::new_v6().unwrap();
    socket.bind("[::]:0".parse().unwrap()).unwrap();
    let listener = socket.listen(128).unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    port
}

/// Sends `request` from the loopback address `from` to the gateway; returns the status (0: no
/// answer).
async fn send_from(from: &str, port: u16, request: &[u8]) -> u16 {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))
        .unwrap();
    let mut stream: TcpStream = socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap();
    stream.write_all(request).await.unwrap();
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response));
    let _ = read.await;
    String::from_utf8_lossy(&response)
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

async fn get(port: u16, target: &str, method: &str, extra: &str) -> u16 {
    let request =
        format!("{method} {target} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n");
    send_from("127.0.0.1", port, request.as_bytes()).await
}

/// On a `[::]` socket IPv4 peers are `::ffff:a.b.c.d`: read as IPv6, five different /24s
/// shared one `::/64` limit, and a rule for `127.0.0.5` did not see 127.0.0.5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv4_clients_on_a_dual_stack_listener_are_limited_as_ipv4() {
    let (up, seen) = upstream(Upstream::Answer).await;
    let routes = "      - match: { path: /ban }\n        rate_limits:\n          - actions: [{ remote_address: {} }]\n      - match: { path_prefix: / }\n        rate_limits:\n          - actions: [{ masked_remote_address: { v4_prefix_mask_len: 24, v6_prefix_mask_len: 64 } }]\n";
    let port = gateway(up, "", routes).await;
    // Five /24s, four requests each, 3 per /24: each network gets its own 3.
    for net in 1..=5 {
        let from = format!("127.0.{net}.9");
        let mut statuses = Vec::new();
        for _ in 0..4 {
            let request = b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            statuses.push(send_from(&from, port, request).await);
        }
        assert_eq!(statuses, [200, 200, 200, 429], "{from}");
    }
    assert_eq!(seen.count(), 15, "five networks, three each");
    // The upstream is told the IPv4 address, as an IPv4 listener would tell it.
    let heads = seen.heads.lock().unwrap().clone();
    assert!(
        heads
            .iter()
            .all(|h| h.to_ascii_lowercase().contains("x-forwarded-for: 127.0.")),
        "{heads:?}"
    );
    assert!(heads.iter().all(|h| !h.contains("::ffff:")), "{heads:?}");
    // A rule written for 127.0.0.5 holds 127.0.0.5 (2 per minute).
    let before = seen.count();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let request = b"GET /ban HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        statuses.push(send_from("127.0.0.5", port, request).await);
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(seen.count() - before, 2);
}

/// With refunds on, a slow upstream turned every request into a refunded 504 while it still
/// did the work: 8 of 8 reached it under a limit of 3. A 504, or a connection lost after the
/// request was sent, is counted now; only a connection that could not be opened is refunded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_never_return_a_request_the_upstream_may_have_served() {
    let routes = "      - match: { path_prefix: / }\n        rate_limits:\n          - actions: [{ generic_key: { descriptor_value: slow } }]\n";
    let settings = "    upstream_timeout: 300ms\n    refund_upstream_failures: true\n";
    for (mode, failure) in [(Upstream::Hang, 504), (Upstream::Reset, 502)] {
        let (up, seen) = upstream(mode).await;
        let port = gateway(up, settings, routes).await;
        let mut statuses = Vec::new();
        for _ in 0..8 {
            statuses.push(get(port, "/work", "POST", "Content-Length: 0\r\n").await);
        }
        assert_eq!(seen.count(), 3, "the upstream sees at most the limit");
        assert_eq!(
            statuses,
            [failure, failure, failure, 429, 429, 429, 429, 429]
        );
    }
    // A connection refused: the request was never sent, and is refunded.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let port = gateway(dead_port, settings, routes).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(get(port, "/work", "GET", "").await);
    }
    assert_eq!(statuses, [502; 5], "refused connections are refunded");
}

const SPELLING_ROUTES: &str = "      - match: { path: /login }\n        rate_limits:\n          - actions: [{ generic_key: { descriptor_value: login } }]\n      - match: { path: /search, method: GET }\n        rate_limits:\n          - actions: [{ generic_key: { descriptor_value: search } }]\n      - match: { path_template: '/orders/{id}' }\n        rate_limits:\n          - actions: [{ generic_key: { descriptor_value: orders } }]\n      - match: { path_prefix: / }\n        rate_limits:\n          - actions: [{ request_headers: { header_name: x-user-id, descriptor_key: user } }]\n";

/// Sends each (method, target, extra headers) once; returns the statuses.
async fn send_all(port: u16, table: &[(&str, &str, &str)]) -> Vec<u16> {
    let mut statuses = Vec::new();
    for (method, target, extra) in table {
        statuses.push(get(port, target, method, extra).await);
    }
    statuses
}

/// Spellings that Express, Rails, Spring, Tomcat, IIS serve as the limited route used to
/// skip it: each table goes against a limit of 3, and exactly 3 reach the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_of_a_limited_route_reach_the_upstream_only_up_to_its_limit() {
    let (up, seen) = upstream(Upstream::Answer).await;
    let port = gateway(up, "", SPELLING_ROUTES).await;
    let login: [(&str, &str, &str); 14] = [
        ("GET", "/login/", ""),
        ("GET", "/LOGIN", ""),
        ("GET", "/login;jsessionid=1", ""),
        ("GET", "/login/.", ""),
        ("GET", "/Login;x=1/", ""),
        ("GET", "/;x/login", ""),
        ("GET", "//LOGIN//", ""),
        ("GET", "/%4cogin", ""),
        ("GET", "/login/%2e", ""),
        ("HEAD", "/login", ""),
        ("POST", "/login", "Content-Length: 0\r\n"),
        ("GET", "http://other.example/LOGIN/", ""),
        ("GET", "/login?x=1", ""),
        ("GET", "/login", ""),
    ];
    let statuses = send_all(port, &login).await;
    assert_eq!(&statuses[..3], [200, 200, 200], "{statuses:?}");
    assert!(statuses[3..].iter().all(|&s| s == 429), "{statuses:?}");
    assert_eq!(seen.count(), 3, "{statuses:?}");
    // Tomcat's traversal (`..;`) and IIS's backslash are refused, never served unlimited.
    let refused = [
        ("GET", "/x/..;/login", ""),
        ("GET", "/x/%2e%2e;/login", ""),
        ("GET", "/.;/login", ""),
    ];
    assert_eq!(send_all(port, &refused).await, [400, 400, 400]);
    assert_eq!(seen.count(), 3);

    // `/orders/{id}`: a trailing slash, another case, a parameter.
    let orders = [
        ("GET", "/orders/17/", ""),
        ("GET", "/ORDERS/17", ""),
        ("GET", "/orders/17;v=2", ""),
        ("GET", "/Orders/18/", ""),
        ("GET", "/orders/;x", ""),
        ("GET", "/orders/19", ""),
    ];
    let statuses = send_all(port, &orders).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    assert_eq!(seen.count(), 6);

    // HEAD on a GET route is the GET handler's work: counted there.
    let search = [
        ("HEAD", "/search", ""),
        ("HEAD", "/search/", ""),
        ("GET", "/Search", ""),
        ("HEAD", "/search", ""),
        ("GET", "/search", ""),
    ];
    let statuses = send_all(port, &search).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(seen.count(), 9);

    // Two x-user-id headers: the first was counted, the upstream got both. Now refused, and
    // so is the `x_user_id` spelling that Rack and Django read as `x-user-id`.
    let mut statuses = Vec::new();
    for i in 0..6 {
        let extra = format!("x-user-id: fresh{i}\r\nx-user-id: mallory\r\n");
        statuses.push(get(port, "/a", "GET", &extra).await);
    }
    for i in 0..3 {
        let extra = format!("x-user-id: fresh-{i}\r\nX_User_Id: mallory\r\n");
        statuses.push(get(port, "/a", "GET", &extra).await);
    }
    assert_eq!(statuses, [400; 9]);
    assert_eq!(seen.count(), 9, "the upstream never saw them");
    // One header, once: limited at 3 as ever.
    let mallory = [("GET", "/a", "x-user-id: mallory\r\n"); 4];
    assert_eq!(send_all(port, &mallory).await, [200, 200, 200, 429]);
    assert_eq!(seen.count(), 12);
    let heads = seen.heads.lock().unwrap().clone();
    assert!(
        heads
            .iter()
            .all(|h| h.to_ascii_lowercase().matches("x-user-id").count() <= 1),
        "{heads:?}"
    );
}

/// A request smuggled in the body of another (`Content-Length` and `Transfer-Encoding`
/// together) is read by the gateway as a request of its own and limited like one: the upstream
/// gets re-framed requests only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_smuggled_in_a_body_is_limited_like_any_other() {
    let (up, seen) = upstream(Upstream::Answer).await;
    let port = gateway(up, "", SPELLING_ROUTES).await;
    let one = "GET /login HTTP/1.1\r\nHost: x\r\n\r\n";
    let smuggled = one.repeat(5);
    let request = format!(
        "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}GET /login HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        smuggled.len()
    );
    let _ = send_from("127.0.0.1", port, request.as_bytes()).await;
    // The POST (no user: not limited) and three of the six /login.
    assert!(seen.count() <= 4, "{}", seen.count());
    let heads = seen.heads.lock().unwrap().clone();
    assert!(
        heads
            .iter()
            .all(|h| !h.to_ascii_lowercase().contains("transfer-encoding")
                || !h.to_ascii_lowercase().contains("content-length")),
        "{heads:?}"
    );
}

const USER_QUERY_ROUTES: &str = "      - match: { path_prefix: / }\n        rate_limits:\n          - actions: [{ query_parameter: { query_parameter_name: user, descriptor_key: user } }]\n";

/// Rack 2, Go before 1.17 and Python before 3.9.2 split a query on `;`: `?x=N;user=bob` is
/// bob to them, while the limiter saw no `user` and skipped the descriptor (8 of 8 reached
/// the upstream). Now `user` is found after a `;` too, and a value cut at a `;` (bob to one
/// server, `bob;x=1` to another) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_parameter_after_a_semicolon_is_limited() {
    let (up, seen) = upstream(Upstream::Answer).await;
    let port = gateway(up, "", USER_QUERY_ROUTES).await;
    let targets: Vec<String> = (0..8).map(|i| format!("/a?x={i};user=bob")).collect();
    let table: Vec<(&str, &str, &str)> = targets.iter().map(|t| ("GET", t.as_str(), "")).collect();
    let statuses = send_all(port, &table).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429]);
    assert_eq!(seen.count(), 3, "the limit, not 8");
    let refused = [
        ("GET", "/a?user=carol;x=1", ""),
        ("GET", "/a?user=dan;user=erin", ""),
        ("GET", "/a?x=1;user=fay&user=gus", ""),
    ];
    assert_eq!(send_all(port, &refused).await, [400, 400, 400]);
    assert_eq!(seen.count(), 3);
    // `strict_query_separators`: `;` is data, as the operator says the upstream reads it.
    let (up, seen) = upstream(Upstream::Answer).await;
    let port = gateway(up, "    strict_query_separators: true\n", USER_QUERY_ROUTES).await;
    send_all(port, &table).await;
    assert_eq!(seen.count(), 8);
}

/// ASP.NET Core reads `?USER=bob` as `user`: the limiter looked for `user` only and skipped
/// the descriptor (8 of 8 reached the upstream). Names are compared in any case now, and the
/// name in two spellings is a repeat (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_parameter_in_another_case_is_limited() {
    let (up, seen) = upstream(Upstream::Answer).await;
    let port = gateway(up, "", USER_QUERY_ROUTES).await;
    let table = [
        ("GET", "/a?USER=bob", ""),
        ("GET", "/a?User=bob", ""),
        ("GET", "/a?uSeR=bob", ""),
        ("GET", "/a?%55SER=bob", ""),
        ("GET", "/a?USER=%62ob", ""),
        ("GET", "/a?x=1&USER=bob", ""),
        ("GET", "/a?user=bob", ""),
        ("GET", "/a?USER=bob", ""),
    ];
    let statuses = send_all(port, &table).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429]);
    assert_eq!(seen.count(), 3, "the limit, not 8");
    let repeat = [("GET", "/a?user=carol&USER=dan", "")];
    assert_eq!(send_all(port, &repeat).await, [400]);
    assert_eq!(seen.count(), 3);
    // `strict_query_names`: `USER` is another parameter, as the operator says it is upstream.
    let (up, seen) = upstream(Upstream::Answer).await;
    let port = gateway(up, "    strict_query_names: true\n", USER_QUERY_ROUTES).await;
    send_all(port, &table).await;
    assert_eq!(seen.count(), 8, "only one of 8 spells `user`");
}

const ITEMS_ROUTES: &str = "      - match: { path: /items, method: DELETE }\n        rate_limits:\n          - actions: [{ generic_key: { descriptor_value: items } }]\n";

/// Express's method-override, Symfony, Laravel, Rails and Spring serve `POST` with
/// `X-HTTP-Method-Override: DELETE` (or `?_method=DELETE`) as `DELETE`: a `DELETE` route's
/// limit let 8 of 8 through. Where routes tell methods apart such a request is refused (400),
/// so only real `DELETE`s reach the upstream, up to the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_override_does_not_escape_a_method_route() {
    let (up, seen) = upstream(Upstream::Answer).await;
    let port = gateway(up, "", ITEMS_ROUTES).await;
    let post = "Content-Length: 0\r\n";
    let table = [
        (
            "POST",
            "/items",
            "X-HTTP-Method-Override: DELETE\r\nContent-Length: 0\r\n",
        ),
        (
            "POST",
            "/items",
            "X-HTTP-Method: DELETE\r\nContent-Length: 0\r\n",
        ),
        (
            "POST",
            "/items",
            "X-Method-Override: delete\r\nContent-Length: 0\r\n",
        ),
        (
            "POST",
            "/items",
            "X_HTTP_Method_Override: DELETE\r\nContent-Length: 0\r\n",
        ),
        ("POST", "/items?_method=DELETE", post),
        ("DELETE", "/items", ""),
        ("DELETE", "/items", ""),
        ("DELETE", "/items", ""),
    ];
    let statuses = send_all(port, &table).await;
    assert_eq!(statuses, [400, 400, 400, 400, 400, 200, 200, 200]);
    assert_eq!(seen.count(), 3, "the limit, not 8");
    let more = [
        ("POST", "/items?x=1;_METHOD=delete", post),
        ("DELETE", "/items", ""),
    ];
    assert_eq!(send_all(port, &more).await, [400, 429]);
    assert_eq!(seen.count(), 3);
    // `ignore_method_override`: the upstream has no such filter, the override is its data.
    let (up, seen) = upstream(Upstream::Answer).await;
    let port = gateway(up, "    ignore_method_override: true\n", ITEMS_ROUTES).await;
    assert_eq!(send_all(port, &table[..5]).await, [200; 5]);
    assert_eq!(seen.count(), 5);
}
