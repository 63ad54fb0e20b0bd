//! One request of a replay, as `tests/common/fleet.rs` sends it: a keep-alive HTTP/1.1
//! connection to an instance and a `/json` check of a key (and its tenant) on it.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

pub(super) type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// An answer: what each rule decided, its time until reset, and when it came (wall clock, ns).
pub(super) type Answer = (Decided, Option<Duration>, u64);

/// What a request's rules decided: the user's (`key`), and the tenant's when the request carried
/// one and the user's rule admitted it (a denial stops the counting: the tenant never saw it).
#[derive(Clone, Copy, Debug)]
pub(super) struct Decided {
    pub(super) user: bool,
    pub(super) tenant: Option<bool>,
}

/// A keep-alive connection to `port`, tried for up to 3 s (an instance that has just started
/// may not listen yet).
pub(super) async fn connect(port: u16) -> Sender {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut tries = 0;
    let stream = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => break stream,
            Err(e) if tries >= 60 => panic!("connect to {addr}: {e}"),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    stream.set_nodelay(true).ok();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

/// One `/json` check of `key` (and `tenant`, a second descriptor, when given) at cost `cost`:
/// `Some((decided, until_reset))`, `None` on any other answer. `until_reset` is the answer's time until the window that counted the request
/// ends (`durationUntilReset`), when it has one.
/// A keep-alive connection the server closed while it sat in the pool (its idle timeout) fails
/// before the request is sent: the request goes again on a new connection (it cannot have been
/// counted), and `sender` is replaced by it.
pub(super) async fn check(
    sender: &mut Sender,
    port: u16,
    (key, tenant): (&str, Option<&str>),
    cost: u32,
) -> Option<(Decided, Option<Duration>)> {
    let tenant_descriptor = tenant.map_or(String::new(), |t| {
        format!(r#",{{"entries":[{{"key":"tenant","value":"{t}"}}]}}"#)
    });
    let body = format!(
        r#"{{"domain":"sim","descriptors":[{{"entries":[{{"key":"key","value":"{key}"}}]}}{tenant_descriptor}],"hitsAddend":{cost}}}"#
    );
    let mut request = http::Request::builder()
        .method("POST")
        .uri("/json")
        .header("host", "fleet")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .ok()?;
    let mut fresh = false;
    let response = loop {
        if sender.ready().await.is_err() && !fresh {
            *sender = connect(port).await;
            fresh = true;
            continue;
        }
        match sender.try_send_request(request).await {
            Ok(response) => break response,
            Err(mut e) => match e.take_message() {
                Some(unsent) if !fresh => {
                    request = unsent;
                    *sender = connect(port).await;
                    fresh = true;
                }
                _ => return None,
            },
        }
    };
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    let allowed = match status {
        200 => true,
        429 => false,
        _ => return None,
    };
    let v = serde_json::from_slice::<serde_json::Value>(&body).ok();
    let until_reset = v.as_ref().and_then(|v| {
        let d = v["statuses"][0]["durationUntilReset"].as_str()?;
        Duration::try_from_secs_f64(d.strip_suffix('s')?.parse().ok()?).ok()
    });
    let decided = match tenant {
        None => Decided {
            user: allowed,
            tenant: None,
        },
        Some(_) => {
            let ok = |i: usize| {
                v.as_ref()?["statuses"][i]["code"]
                    .as_str()
                    .map(|c| c == "OK")
            };
            let user = ok(0)?;
            Decided {
                user,
                tenant: if user { Some(ok(1)?) } else { None },
            }
        }
    };
    Some((decided, until_reset))
}
