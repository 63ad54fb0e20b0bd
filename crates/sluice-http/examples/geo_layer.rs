//! Limiting by country in a tower service behind one trusted proxy: 3 requests per minute for
//! each country, 1 for addresses the database does not know. The country database is a
//! MaxMind-format file: pass one (`GeoLite2-Country.mmdb`, or `geo-whois-asn-country.mmdb` from
//! the npm package `@ip-location-db/geo-whois-asn-country-mmdb`), or the example builds a small
//! one (192.0.2.0/24 is DE, 198.51.100.0/24 is US).
//!
//! Run: `cargo run -p sluice-http --example geo_layer [-- country.mmdb]`

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use sluice_config::HeaderStyle;
use sluice_core::{Clock, CoarseClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_http::{GeoIp, LimitPolicy, RateLimitLayer};
use sluice_store::MemoryStore;
use tower::{Service, ServiceExt};

const RULES: &str = "domain: app
descriptors:
  - key: country
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: country
    value: unknown
    rate_limit: { unit: minute, requests_per_unit: 1 }
";
const ROUTES: &str = "gateways:
  - listen: 127.0.0.1:1
    upstream: http://127.0.0.1:2
    domain: app
    routes:
      - match: { path_prefix: / }
        rate_limits:
          - actions: [{ country: {} }]
";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database = match std::env::args().nth(1) {
        Some(file) => PathBuf::from(file),
        None => {
            let file = std::env::temp_dir().join("sluice-geo-layer-example.mmdb");
            std::fs::write(
                &file,
                sluice_testkit::country_database(
                    sluice_testkit::CountryLayout::MaxMind,
                    &[("192.0.2.0/24", "DE"), ("198.51.100.0/24", "US")],
                ),
            )?;
            file
        }
    };
    let geo = Arc::new(GeoIp::open(&[database])?);
    // `geoip:` must be in the text for the `country` action to parse; the layer is given the
    // databases themselves.
    let config = sluice_config::parse_service(
        Path::new("routes.yaml"),
        &format!("geoip: {{ databases: [unused.mmdb] }}\n{ROUTES}"),
    )?;
    let rules = sluice_config::RuleSet::new(vec![sluice_config::parse_domain(
        Path::new("rules.yaml"),
        RULES,
    )?])?;
    let clock: Arc<dyn Clock> = Arc::new(CoarseClock::new());
    let store = Arc::new(MemoryStore::new(clock.clone()));
    let engine = Engine::new(
        &rules,
        &Default::default(),
        store,
        clock,
        EngineOptions {
            shared_store: false,
            ..Default::default()
        },
    );
    let layer = RateLimitLayer::new(
        Arc::new(ArcSwap::from_pointee(engine)),
        LimitPolicy {
            domain: "app".into(),
            routes: config.gateways[0].routes.clone(),
            headers: HeaderStyle::Ietf,
            // One proxy in front appends the address it saw to X-Forwarded-For.
            trusted_hops: 1,
            refund_upstream_failures: false,
            geo: Some(geo.clone()),
            path_matching: Default::default(),
        },
    );
    let inner = tower::service_fn(|_req: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hello")))
    });
    let mut service = tower::Layer::layer(&layer, inner);
    for client in ["192.0.2.7", "198.51.100.9", "203.0.113.5"] {
        let country = geo.country(client.parse()?);
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let mut request = http::Request::builder()
                .uri("/hello")
                // The client forged the first entry; the proxy appended the real address.
                .header("x-forwarded-for", format!("10.9.9.9, {client}"))
                .body(String::new())?;
            request
                .extensions_mut()
                .insert("10.0.0.2:40000".parse::<SocketAddr>()?);
            let response = service.ready().await?.call(request).await?;
            statuses.push(response.status().as_u16());
        }
        println!("{client} ({country:?}): {statuses:?}");
    }
    Ok(())
}
