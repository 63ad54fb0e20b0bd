//! The gRPC listener's hot lane: a unary `ShouldRateLimit` whose message is already read (the
//! listener's admission reads bodies whole before the call takes its slot) is answered here
//! by `sluice-rls`'s handler from the message bytes, without tonic's routing, codec and
//! response streams per call. The call keeps the listener's defences (its slot, the request
//! timeout around this layer); a call with the API token missing, another path, content type
//! or encoding, a compressed message or not exactly one message goes on to tonic unchanged.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::{Bytes, Frame};
use sluice_rls::{RateLimitGrpc, SHOULD_RATE_LIMIT_PATH};
use tonic::body::Body;
use tower::{BoxError, Layer, Service, ServiceExt as _};

use crate::access::Token;
use crate::admission::{Ready, read_ready};

/// The lane, as a layer of the gRPC listener's services.
#[derive(Clone)]
pub(crate) struct GrpcLane {
    rls: RateLimitGrpc,
    token: Option<Token>,
    /// The largest message the listener reads.
    max_body: usize,
}

impl GrpcLane {
    pub(crate) fn new(rls: RateLimitGrpc, token: Option<Token>, max_body: usize) -> Self {
        Self {
            rls,
            token,
            max_body,
        }
    }

    /// Whether a call with these headers is one this lane answers (the message is checked
    /// once read).
    fn takes(&self, request: &Request<Body>) -> bool {
        if request.uri().path() != SHOULD_RATE_LIMIT_PATH {
            return false;
        }
        let headers = request.headers();
        let grpc = headers.get(http::header::CONTENT_TYPE).is_some_and(|t| {
            matches!(
                t.as_bytes(),
                b"application/grpc" | b"application/grpc+proto"
            )
        });
        if !grpc || headers.contains_key("grpc-encoding") {
            return false;
        }
        match &self.token {
            Some(token) => token.accepts(
                headers
                    .get(http::header::AUTHORIZATION)
                    .map(HeaderValue::as_bytes),
            ),
            None => true,
        }
    }
}

/// The one message of a unary call's body, if the body holds exactly one, uncompressed.
fn one_message(body: &[u8]) -> Option<&[u8]> {
    let (&[compressed, a, b, c, d], message) = body.split_first_chunk::<5>()?;
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    (compressed == 0 && message.len() == len).then_some(message)
}

impl<S> Layer<S> for GrpcLane {
    type Service = GrpcLaned<S>;

    fn layer(&self, inner: S) -> GrpcLaned<S> {
        GrpcLaned {
            lane: self.clone(),
            inner,
        }
    }
}

/// A service behind the lane.
#[derive(Clone)]
pub(crate) struct GrpcLaned<S> {
    lane: GrpcLane,
    inner: S,
}

impl<S> Service<Request<Body>> for GrpcLaned<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The services behind are always ready (tonic's routes, the admission's decision
        // per call).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (lane, inner) = (self.lane.clone(), self.inner.clone());
        if !lane.takes(&request) {
            return Box::pin(async move { inner.oneshot(request).await.map_err(Into::into) });
        }
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = match read_ready(body, lane.max_body) {
                Ready::Whole(bytes) => bytes,
                Ready::Later(read) => {
                    let request = Request::from_parts(parts, Body::new(read));
                    return inner.oneshot(request).await.map_err(Into::into);
                }
                Ready::Broken => {
                    return Ok(
                        tonic::Status::cancelled("the request body could not be read").into_http(),
                    );
                }
            };
            let Some(message) = one_message(&body) else {
                let request =
                    Request::from_parts(parts, Body::new(http_body_util::Full::new(body)));
                return inner.oneshot(request).await.map_err(Into::into);
            };
            Ok(match lane.rls.answer_message(message).await {
                Ok(framed) => {
                    let mut response = Response::new(Body::new(Unary(Some(framed), true)));
                    response.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/grpc"),
                    );
                    response
                }
                Err(status) => status.into_http(),
            })
        })
    }
}

/// A unary answer's body: the message, then the trailers of a call that succeeded.
struct Unary(Option<Bytes>, bool);

impl hyper::body::Body for Unary {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(message) = self.0.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if std::mem::take(&mut self.1) {
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none() && !self.1
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arc_swap::ArcSwap;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
    use http_body_util::BodyExt as _;
    use prost::Message as _;

    use super::*;

    const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";

    fn rls() -> RateLimitGrpc {
        let (engine, _) = crate::test_engine::engine(RULES);
        let options = Arc::new(ArcSwap::from_pointee(sluice_rls::RlsOptions::default()));
        RateLimitGrpc::shared(engine, options)
    }

    /// A service that answers every call `UNIMPLEMENTED`, to stand behind the lane where the
    /// lane must answer itself.
    fn nothing_behind()
    -> impl Service<
        Request<Body>,
        Response = Response<Body>,
        Error = tonic::Status,
        Future = impl Send,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(|_: Request<Body>| async {
            Ok::<_, tonic::Status>(tonic::Status::unimplemented("behind the lane").into_http())
        })
    }

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut body = vec![0];
        body.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        body.extend_from_slice(message);
        body
    }

    fn call(path: &str, body: Vec<u8>) -> Request<Body> {
        Request::post(path)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Body::new(http_body_util::Full::new(Bytes::from(body))))
            .unwrap()
    }

    fn ask(domain: &str, user: &str) -> Vec<u8> {
        let request = RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: user.into(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        framed(&request.encode_to_vec())
    }

    /// What a client sees of an answer: the status, headers and trailers gRPC reads, the body.
    async fn seen(response: Response<Body>) -> (u16, Vec<(String, String)>, Bytes) {
        let status = response.status().as_u16();
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter(|(name, _)| *name != "date")
            .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
            .collect();
        let collected = response.into_body().collect().await.unwrap();
        if let Some(trailers) = collected.trailers() {
            headers.extend(trailers.iter().map(|(n, v)| {
                (
                    format!("trailer {n}"),
                    String::from_utf8_lossy(v.as_bytes()).into(),
                )
            }));
        }
        headers.sort();
        (status, headers, collected.to_bytes())
    }

    #[tokio::test]
    async fn the_lane_answers_as_tonic_does_answer_for_answer() {
        let tonic_only = RateLimitServiceServer::new(rls());
        let laned = GrpcLane::new(rls(), None, 1024).layer(nothing_behind());
        let calls = [
            ask("edge", "alice"),
            ask("edge", "alice"),
            ask("edge", "alice"),
            ask("nowhere", "alice"),
            ask("edge", ""),
            framed(&[0xff, 0xff, 0xff]),
            framed(&[]),
        ];
        for (i, body) in calls.into_iter().enumerate() {
            let path = SHOULD_RATE_LIMIT_PATH;
            let expected = seen(
                tonic_only
                    .clone()
                    .oneshot(call(path, body.clone()))
                    .await
                    .unwrap(),
            )
            .await;
            let answered = seen(laned.clone().oneshot(call(path, body)).await.unwrap()).await;
            assert_eq!(answered, expected, "call {i}");
        }
    }

    #[tokio::test]
    async fn calls_the_lane_does_not_take_reach_the_service_behind_whole() {
        // Behind the lane: a service that says how many body bytes it received.
        let behind = tower::service_fn(|request: Request<Body>| async move {
            let body = request.into_body().collect().await?.to_bytes();
            let mut response = Response::new(Body::default());
            response
                .headers_mut()
                .insert("x-behind", HeaderValue::from(body.len()));
            Ok::<_, tonic::Status>(response)
        });
        let token = Token::for_tests(b"0123456789abcdef");
        let laned = GrpcLane::new(rls(), Some(token), 1024).layer(behind);
        let good = HeaderValue::from_static("Bearer 0123456789abcdef");
        let with = |mut request: Request<Body>, name: &'static str, value: &HeaderValue| {
            request.headers_mut().insert(name, value.clone());
            request
        };
        let mut compressed = ask("edge", "a");
        compressed[0] = 1;
        let mut two = ask("edge", "a");
        two.extend(ask("edge", "b"));
        let mut short = ask("edge", "a");
        short.pop();
        // The lane's own path with the right token, then one header changed.
        let authorized =
            |body: Vec<u8>| with(call(SHOULD_RATE_LIMIT_PATH, body), "authorization", &good);
        let changed = |name: &'static str, value: &'static str| {
            with(
                authorized(ask("edge", "a")),
                name,
                &HeaderValue::from_static(value),
            )
        };
        let mut elsewhere = authorized(ask("edge", "a"));
        *elsewhere.uri_mut() = http::Uri::from_static("/other.Service/Call");
        let cases = [
            ("no token", call(SHOULD_RATE_LIMIT_PATH, ask("edge", "a"))),
            ("wrong token", changed("authorization", "Bearer nope")),
            ("another path", elsewhere),
            ("another encoding", changed("grpc-encoding", "gzip")),
            ("grpc-web", changed("content-type", "application/grpc-web")),
            ("compressed", authorized(compressed)),
            ("two messages", authorized(two)),
            ("cut short", authorized(short)),
        ];
        for (what, request) in cases {
            let sent = hyper::body::Body::size_hint(request.body())
                .exact()
                .unwrap()
                .to_string();
            let response = laned.clone().oneshot(request).await.unwrap();
            let behind = response
                .headers()
                .get("x-behind")
                .map(|v| v.to_str().unwrap().to_owned());
            assert_eq!(behind.as_deref(), Some(sent.as_str()), "{what}");
        }
        // The token on the lane's own path: answered here.
        let request = authorized(ask("edge", "a"));
        let (_, headers, body) = seen(laned.clone().oneshot(request).await.unwrap()).await;
        assert!(
            headers.contains(&("trailer grpc-status".into(), "0".into())),
            "{headers:?}"
        );
        assert!(!body.is_empty());
    }
}
