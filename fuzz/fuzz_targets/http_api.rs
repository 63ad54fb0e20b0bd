//! The HTTP API's bodies (`/json`, `/v1/acquire`, `/v1/acquire/batch`, `/v1/refill`): any body
//! gets a decision or a 4xx that says what is wrong, never a 500 or a panic.
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

#[derive(Arbitrary, Debug)]
struct Input {
    route: u8,
    json_content_type: bool,
    body: Vec<u8>,
}

const ROUTES: [&str; 4] = ["/json", "/v1/acquire", "/v1/acquire/batch", "/v1/refill"];

fuzz_target!(|input: Input| {
    // One engine for the whole run, as in `sluice serve`: state left by earlier inputs (keys
    // at their cap, ad-hoc shapes) is part of what is fuzzed.
    static APP: OnceLock<(axum::Router, sluice_rls::HotRoutes)> = OnceLock::new();
    let (app, hot) = APP.get_or_init(|| {
        let options = sluice_rls::RlsOptions {
            api_domain: "api".to_owned(),
            ..Default::default()
        };
        sluice_rls::http_api(
            sluice_fuzz::shared_engine(),
            std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(options)),
        )
    });
    let route = ROUTES[usize::from(input.route) % ROUTES.len()];
    let mut request = http::Request::post(route);
    if input.json_content_type {
        request = request.header("content-type", "application/json");
    }
    let runtime = sluice_fuzz::runtime();
    // The hot lane's answer to the same body (`sluice serve` answers `/json` and `/v1/acquire`
    // this way when the body came with the head): the same kinds of answer.
    if let Some(route) = sluice_rls::HotRoute::of(&http::Method::POST, route) {
        let (status, body) = runtime.block_on(hot.answer(route, &input.body));
        assert!(
            status.is_success() || status.is_client_error(),
            "hot {route:?}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        assert!(serde_json::from_slice::<serde_json::Value>(&body).is_ok());
    }
    let request = request.body(axum::body::Body::from(input.body)).unwrap();
    let (status, body) = runtime.block_on(async {
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    });
    assert!(
        status.is_success() || status.is_client_error(),
        "{route}: {status} {}",
        String::from_utf8_lossy(&body)
    );
    if status.is_success() {
        assert!(serde_json::from_slice::<serde_json::Value>(&body).is_ok());
    }
});
