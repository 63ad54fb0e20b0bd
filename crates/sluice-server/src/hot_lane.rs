//! The API listener's hot lane: `POST /v1/acquire` and `POST /json` whose body came in with
//! the request's head are answered here, under the same defences as the router's requests
//! (the API token, one of the listener's in-flight slots, the request timeout, the body
//! limit) but without the router's layers and extractors per request. Everything else,
//! including a hot route whose body is still arriving, is handed back for the router with
//! nothing of it lost, and gets the full admission (the waiting room, the body deadline).

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, Request};
use hyper::body::Bytes;
use sluice_rls::{HotRoute, HotRoutes};

use crate::access::Token;
use crate::admission::{Admission, Ready, Refusal, read_ready};
use crate::door_metrics::result_of;
use crate::listener::overload_response;

/// The hot lane of one API listener (shared by its workers).
#[derive(Debug)]
pub(crate) struct HotLane {
    routes: HotRoutes,
    admission: Admission,
    token: Option<Token>,
    timeout: Duration,
    /// The smaller of the listener's `max_body_bytes` and the routes' own limit.
    max_body: usize,
}

impl HotLane {
    pub(crate) fn new(
        routes: HotRoutes,
        admission: Admission,
        token: Option<Token>,
        timeout: Duration,
        max_body: usize,
    ) -> Self {
        let max_body = max_body.min(routes.max_body());
        Self {
            routes,
            admission,
            token,
            timeout,
            max_body,
        }
    }

    /// The hot route `request` asks for, if it is one and carries the API token when one is
    /// set (a request without it is the router's to refuse, with its usual answer).
    pub(crate) fn route<B>(&self, request: &Request<B>) -> Option<HotRoute> {
        let route = HotRoute::of(request.method(), request.uri().path())?;
        if let Some(token) = &self.token {
            let header = request
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(HeaderValue::as_bytes);
            if !token.accepts(header) {
                return None;
            }
        }
        Some(route)
    }

    /// Answers `request` on `route` if its body is all in, or hands it back for the router.
    pub(crate) async fn serve<B>(
        &self,
        route: HotRoute,
        request: Request<B>,
    ) -> Result<Response, Request<Body>>
    where
        B: hyper::body::Body<Data = Bytes> + Unpin + Send + 'static,
        B::Error: Into<tower::BoxError>,
    {
        let (parts, body) = request.into_parts();
        let body = match read_ready(body, self.max_body) {
            Ready::Whole(body) => body,
            Ready::Later(read) => return Err(Request::from_parts(parts, Body::new(read))),
            Ready::Broken => {
                let refused = self.admission.refused(Refusal::BodyError);
                return Ok(counted(route, overload_response(&refused, self.timeout)));
            }
        };
        let slot = match self.admission.slot_now() {
            Ok(slot) => slot,
            Err(refused) => return Ok(counted(route, overload_response(&refused, self.timeout))),
        };
        let answered = tokio::time::timeout(self.timeout, self.routes.answer(route, &body)).await;
        drop(slot);
        let response = match answered {
            Ok((status, json)) => {
                let mut response = Response::new(Body::from(json));
                *response.status_mut() = status;
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                response
            }
            Err(_) => {
                let elapsed: tower::BoxError = Box::new(tower::timeout::error::Elapsed::new());
                overload_response(&elapsed, self.timeout)
            }
        };
        Ok(counted(route, response))
    }
}

/// `response`, counted in `sluice_requests_total` as the router's answers are.
fn counted(route: HotRoute, response: Response) -> Response {
    metrics::counter!("sluice_requests_total", "door" => route.door(), "result" => result_of(response.status()))
        .increment(1);
    response
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;

    use arc_swap::ArcSwap;
    use http_body_util::{BodyExt as _, Full, StreamBody};
    use hyper::body::Frame;
    use sluice_config::ListenerLimits;
    use tower::ServiceExt as _;

    use super::*;
    use crate::admission::{Buffering, Door, Doors};

    const RULES: &str = "domain: default\ndescriptors:\n  - key: item\n    descriptors:\n      - key: user\n        rate_limit: { unit: minute, requests_per_unit: 2 }\n";

    /// The API's router and hot lane over one fresh engine, with `limits` and `token`.
    fn api(limits: &ListenerLimits, token: Option<Token>) -> (axum::Router, HotLane, Doors) {
        let (engine, clock) = crate::test_engine::engine(RULES);
        let options = Arc::new(ArcSwap::from_pointee(sluice_rls::RlsOptions::default()));
        let (router, hot) = sluice_rls::http_api(engine, options);
        let doors = Doors::new(clock);
        let admission = Admission::new("http", Door::Http, Buffering::Whole(1024), limits, &doors);
        let lane = HotLane::new(hot, admission, token, limits.request_timeout, 1024);
        (router, lane, doors)
    }

    fn post(path: &str, body: &str) -> Request<Full<Bytes>> {
        Request::post(path)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap()
    }

    async fn parts(response: Response) -> (u16, Option<HeaderValue>, Bytes) {
        let status = response.status().as_u16();
        let kind = response.headers().get(http::header::CONTENT_TYPE).cloned();
        (
            status,
            kind,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    }

    #[tokio::test]
    async fn the_lane_answers_as_the_router_does_answer_for_answer() {
        let limits = ListenerLimits::default();
        let (router, _, _) = api(&limits, None);
        let (_, lane, _) = api(&limits, None);
        let calls = [
            ("/v1/acquire", r#"{"user":"alice","item":"reports"}"#),
            (
                "/v1/acquire",
                r#"{"user":"alice","item":"reports","amount":1}"#,
            ),
            ("/v1/acquire", r#"{"user":"alice","item":"reports"}"#),
            (
                "/v1/acquire",
                r#"{"user":"bob","item":"x","limit":{"requests":5,"window":"1m"}}"#,
            ),
            (
                "/v1/acquire",
                r#"{"user":"bob","item":"x","limit":{"requests":5,"window":60}}"#,
            ),
            (
                "/v1/acquire",
                r#"{"user":"bob","item":"x","limit":{"requests":5,"window":-1}}"#,
            ),
            ("/v1/acquire", r#"{"user":"","item":"x"}"#),
            ("/v1/acquire", "not json"),
            (
                "/json",
                r#"{"domain":"default","descriptors":[{"entries":[{"key":"item","value":"a"},{"key":"user","value":"b"}]}]}"#,
            ),
            (
                "/json",
                r#"{"domain":"default","descriptors":[{"entries":[{"key":"item","value":"a"},{"key":"user","value":"b"}]}],"hitsAddend":5}"#,
            ),
            ("/json", r#"{"domain":"nowhere","descriptors":[]}"#),
            ("/json", r#"{"domain":"default","nonsense":1}"#),
        ];
        for (path, body) in calls {
            let route = lane.route(&post(path, body)).expect("a hot route");
            let hot = lane.serve(route, post(path, body)).await.expect("answered");
            let routed = router.clone().oneshot(post(path, body)).await.unwrap();
            let (hot, routed) = (parts(hot).await, parts(routed).await);
            assert_eq!((hot.0, &hot.1), (routed.0, &routed.1), "{path} {body}");
            let (mut hot, mut routed) = (json(&hot.2), json(&routed.2));
            // Ad-hoc limits run on the process's clock: the two answers come a few
            // milliseconds apart, and so do their reset times.
            let reset = |a: &mut serde_json::Value| a["reset_after_ms"].take().as_u64();
            if let (Some(a), Some(b)) = (reset(&mut hot), reset(&mut routed)) {
                assert!(a.abs_diff(b) < 1_000, "{path} {body}: {a} ms and {b} ms");
            }
            assert_eq!(hot, routed, "{path} {body}");
        }
    }

    fn json(body: &Bytes) -> serde_json::Value {
        serde_json::from_slice(body).unwrap()
    }

    #[test]
    fn only_posts_to_the_two_routes_with_the_token_take_the_lane() {
        let token = Token::for_tests(b"0123456789abcdef");
        let (_, lane, _) = api(&ListenerLimits::default(), Some(token));
        let with = |mut request: Request<Full<Bytes>>, header: &'static str| {
            request.headers_mut().insert(
                http::header::AUTHORIZATION,
                HeaderValue::from_static(header),
            );
            request
        };
        let body = r#"{"user":"a","item":"b"}"#;
        assert_eq!(lane.route(&post("/v1/acquire", body)), None, "no token");
        assert_eq!(lane.route(&with(post("/json", body), "Bearer nope")), None);
        let good = "Bearer 0123456789abcdef";
        assert_eq!(
            lane.route(&with(post("/v1/acquire", body), good)),
            Some(HotRoute::Acquire)
        );
        assert_eq!(
            lane.route(&with(post("/json", body), good)),
            Some(HotRoute::Json)
        );
        for path in [
            "/v1/acquire/batch",
            "/v1/refill",
            "/json/",
            "/v1/acquire?x=1",
        ] {
            let request = with(post(path, body), good);
            let expected = (path == "/v1/acquire?x=1").then_some(HotRoute::Acquire);
            assert_eq!(lane.route(&request), expected, "{path}");
        }
        let mut get = with(post("/json", body), good);
        *get.method_mut() = http::Method::GET;
        assert_eq!(lane.route(&get), None);
    }

    #[tokio::test]
    async fn a_body_still_arriving_or_too_long_goes_back_to_the_router_whole() {
        let (_, lane, _) = api(&ListenerLimits::default(), None);
        // Half the body now, the rest later: handed back with nothing lost.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(2);
        tx.send(Ok(Frame::data(Bytes::from_static(b"{\"user\":\"a\","))))
            .await
            .unwrap();
        let stream = tokio_stream_of(rx);
        let request = Request::post("/v1/acquire")
            .body(StreamBody::new(stream))
            .unwrap();
        let Err(back) = lane.serve(HotRoute::Acquire, request).await else {
            panic!("a body still arriving was answered");
        };
        tx.send(Ok(Frame::data(Bytes::from_static(b"\"item\":\"b\"}"))))
            .await
            .unwrap();
        drop(tx);
        let body = back.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], br#"{"user":"a","item":"b"}"#);
        // Over the limit (1,024 bytes here): the router's to refuse, every byte still there.
        let long = format!(r#"{{"user":"{}","item":"b"}}"#, "a".repeat(2000));
        let Err(back) = lane
            .serve(HotRoute::Acquire, post("/v1/acquire", &long))
            .await
        else {
            panic!("a body over the limit was answered");
        };
        let body = back.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), long.len());
    }

    #[tokio::test]
    async fn a_full_listener_sheds_and_a_broken_body_is_refused_and_both_are_counted() {
        let limits = ListenerLimits {
            max_requests_in_flight: 1,
            ..ListenerLimits::default()
        };
        let (_, lane, doors) = api(&limits, None);
        let held = lane.admission.slot_now().expect("the one slot");
        let body = r#"{"user":"a","item":"b"}"#;
        let shed = lane
            .serve(HotRoute::Acquire, post("/v1/acquire", body))
            .await
            .unwrap();
        assert_eq!(shed.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(shed.headers().contains_key(http::header::RETRY_AFTER));
        drop(held);
        let served = lane
            .serve(HotRoute::Acquire, post("/v1/acquire", body))
            .await
            .unwrap();
        assert_eq!(served.status(), http::StatusCode::OK);

        let broken = futures_util::stream::iter([
            Ok(Frame::data(Bytes::from_static(b"{"))),
            Err(std::io::Error::other("reset")),
        ]);
        let request = Request::post("/json")
            .body(StreamBody::new(broken))
            .unwrap();
        let refused = lane.serve(HotRoute::Json, request).await.unwrap();
        assert_eq!(refused.status(), http::StatusCode::BAD_REQUEST);
        let report = doors.report();
        assert_eq!(report.listeners[0].shed_in_flight, 1);
        assert_eq!(report.shedding().count(), 1);
    }

    /// A stream of what `rx` receives.
    fn tokio_stream_of<T: Send + 'static>(
        rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Unpin + Send + 'static {
        Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            let item = rx.recv().await?;
            Some((item, rx))
        }))
    }
}
