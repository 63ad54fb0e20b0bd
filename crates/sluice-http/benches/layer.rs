//! Latency the rate-limit layer adds to a request, in process: each call of the layered
//! service timed alone (1M calls), against the same inner service without the layer.
//! Run: `cargo bench -p sluice-http --bench layer`

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use arc_swap::ArcSwap;
use axum::body::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use sluice_config::HeaderStyle;
use sluice_core::{Clock, CoarseClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_http::{LimitPolicy, RateLimitLayer};
use sluice_store::MemoryStore;
use tower::Service;

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the layer waited"),
    }
}

fn percentiles(mut ns: Vec<u64>) -> (u64, u64, u64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 - 1.0) * q) as usize];
    (at(0.5), at(0.99), at(0.999))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rules_yaml = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: second, requests_per_unit: 1000000000 }\n";
    let config = sluice_config::parse_service(
        Path::new("bench.yaml"),
        "gateways:\n  - listen: 127.0.0.1:1\n    upstream: http://127.0.0.1:2\n    domain: edge\n    routes:\n      - match: { path_prefix: / }\n        rate_limits: [{ actions: [{ request_headers: { header_name: x-user-id, descriptor_key: user } }] }]\n",
    )
    .unwrap();
    let rules = sluice_config::RuleSet::new(vec![
        sluice_config::parse_domain(Path::new("e.yaml"), rules_yaml).unwrap(),
    ])
    .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(CoarseClock::new());
    let store = Arc::new(MemoryStore::new(clock.clone()));
    for mode in ["local", "synced"] {
        let engine = Engine::new(
            &rules,
            &Default::default(),
            store.clone(),
            clock.clone(),
            EngineOptions {
                shared_store: mode == "synced",
                ..Default::default()
            },
        );
        let layer = RateLimitLayer::new(
            Arc::new(ArcSwap::from_pointee(engine)),
            LimitPolicy {
                domain: "edge".into(),
                routes: config.gateways[0].routes.clone(),
                headers: HeaderStyle::Ietf,
                trusted_hops: 0,
                refund_upstream_failures: false,
                geo: None,
                path_matching: Default::default(),
            },
        );
        let inner = tower::service_fn(|_r: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        });
        let mut plain = inner;
        let mut limited = tower::Layer::layer(&layer, inner);
        let users: Vec<String> = (0..10_000).map(|i| format!("user-{i}")).collect();
        let request = |i: usize| {
            Request::builder()
                .uri("/x")
                .header("x-user-id", users[i % users.len()].as_str())
                .body(())
                .unwrap()
        };
        let calls = 1_000_000;
        let time = |f: &mut dyn FnMut(usize)| {
            let mut out = Vec::with_capacity(calls);
            for i in 0..calls {
                let start = quanta::Instant::now();
                f(i);
                out.push(start.elapsed().as_nanos() as u64);
            }
            percentiles(out)
        };
        let base = time(&mut |i| {
            let _ = ready(plain.call(request(i)));
        });
        let with = time(&mut |i| {
            let _ = ready(limited.call(request(i)));
        });
        println!(
            "layer/{mode}: per call p50 {} ns, p99 {} ns, p99.9 {} ns; without the layer p50 {} ns, p99 {} ns; added p50 {} ns, p99 {} ns",
            with.0,
            with.1,
            with.2,
            base.0,
            base.1,
            with.0.saturating_sub(base.0),
            with.1.saturating_sub(base.1)
        );
    }
}
