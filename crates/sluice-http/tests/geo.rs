//! `GeoIp`: countries and ASNs from MaxMind-format databases the tests build (in the layouts
//! of MaxMind's GeoLite2 and of the `ip-location-db` packages), the `country` and `asn`
//! actions, and reloads of a changed file (a bad new version keeps the one in use).

use std::net::IpAddr;
use std::path::PathBuf;

use http::{HeaderMap, Method};
use sluice_http::{GeoError, GeoIp, RequestParts, descriptors};
use sluice_testkit::{CountryLayout, asn_database, country_database};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-geo-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn countries_and_asns_come_from_the_first_database_that_knows_the_address() {
    let dir = dir("lookup");
    let (country, flat, asn) = (
        dir.join("country.mmdb"),
        dir.join("flat.mmdb"),
        dir.join("asn.mmdb"),
    );
    std::fs::write(
        &country,
        country_database(
            CountryLayout::MaxMind,
            &[("192.0.2.0/24", "DE"), ("2001:db8:1::/48", "JP")],
        ),
    )
    .unwrap();
    std::fs::write(
        &flat,
        country_database(
            CountryLayout::IpLocationDb,
            &[("192.0.2.0/24", "FR"), ("198.51.100.0/24", "US")],
        ),
    )
    .unwrap();
    std::fs::write(&asn, asn_database(&[("192.0.2.0/25", 64_500)])).unwrap();
    let geo = GeoIp::open(&[country, flat, asn]).unwrap();
    // The first database answers; the second fills in what the first does not know.
    assert_eq!(geo.country(ip("192.0.2.7")).as_deref(), Some("DE"));
    assert_eq!(geo.country(ip("198.51.100.9")).as_deref(), Some("US"));
    assert_eq!(geo.country(ip("2001:db8:1::5")).as_deref(), Some("JP"));
    // An IPv4 address mapped into IPv6 is the IPv4 address.
    assert_eq!(geo.country(ip("::ffff:192.0.2.7")).as_deref(), Some("DE"));
    assert_eq!(geo.country(ip("203.0.113.1")), None, "in no database");
    assert_eq!(geo.asn(ip("192.0.2.7")), Some(64_500));
    assert_eq!(geo.asn(ip("192.0.2.200")), None, "outside the /25");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_file_that_is_not_a_database_is_refused_with_its_path() {
    let dir = dir("bad");
    let file = dir.join("country.mmdb");
    std::fs::write(&file, b"not a database at all").unwrap();
    let err = GeoIp::open(std::slice::from_ref(&file)).unwrap_err();
    assert!(matches!(err, GeoError::Invalid { .. }), "{err:?}");
    assert!(err.to_string().contains("country.mmdb"), "{err}");
    let missing = GeoIp::open(&[dir.join("missing.mmdb")]).unwrap_err();
    assert!(matches!(missing, GeoError::Read { .. }), "{missing:?}");
    // A database cut short (a half-copied download) is refused whole, not at a lookup.
    let good = country_database(CountryLayout::MaxMind, &[("192.0.2.0/24", "DE")]);
    std::fs::write(&file, &good[..good.len() / 2]).unwrap();
    assert!(GeoIp::open(std::slice::from_ref(&file)).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_changed_file_is_swapped_in_and_a_bad_version_keeps_the_one_in_use() {
    let dir = dir("reload");
    let file = dir.join("country.mmdb");
    std::fs::write(
        &file,
        country_database(CountryLayout::MaxMind, &[("192.0.2.0/24", "DE")]),
    )
    .unwrap();
    let geo = GeoIp::open(std::slice::from_ref(&file)).unwrap();
    assert!(geo.reload_changed().is_empty(), "nothing changed");
    // A new version (a different size, so the change shows whatever the clock's resolution).
    std::fs::write(
        &file,
        country_database(
            CountryLayout::MaxMind,
            &[("192.0.2.0/24", "FR"), ("198.51.100.0/24", "US")],
        ),
    )
    .unwrap();
    let results = geo.reload_changed();
    assert_eq!(results.len(), 1);
    assert!(results[0].1.is_ok(), "{results:?}");
    assert_eq!(geo.country(ip("192.0.2.7")).as_deref(), Some("FR"));
    // A broken version is refused once, and the one in use stays.
    std::fs::write(&file, b"garbage").unwrap();
    let results = geo.reload_changed();
    assert!(results[0].1.is_err(), "{results:?}");
    assert_eq!(geo.country(ip("192.0.2.7")).as_deref(), Some("FR"));
    assert!(
        geo.reload_changed().is_empty(),
        "not tried again until it changes"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_actions_build_country_and_asn_entries_with_a_value_for_unknown_addresses() {
    let dir = dir("actions");
    let file = dir.join("geo.mmdb");
    std::fs::write(
        &file,
        country_database(CountryLayout::MaxMind, &[("192.0.2.0/24", "DE")]),
    )
    .unwrap();
    let asn_file = dir.join("asn.mmdb");
    std::fs::write(&asn_file, asn_database(&[("192.0.2.0/24", 64_500)])).unwrap();
    let geo = GeoIp::open(&[file, asn_file]).unwrap();
    let config = sluice_config::parse_service(
        &dir.join("sluice.yaml"),
        "geoip: { databases: [geo.mmdb, asn.mmdb] }
gateways:
  - listen: 127.0.0.1:1
    upstream: http://127.0.0.1:2
    domain: edge
    routes:
      - match: { path_prefix: / }
        rate_limits:
          - actions: [{ country: {} }, { asn: { descriptor_key: network, default_value: none } }]
",
    )
    .unwrap();
    let route = &config.gateways[0].routes[0];
    let headers = HeaderMap::new();
    let build = |client: Option<IpAddr>, geo: Option<&GeoIp>| {
        let parts = RequestParts {
            method: &Method::GET,
            path: "/",
            query: None,
            headers: &headers,
            client,
            geo,
            head_as_get: true,
            query_reading: Default::default(),
        };
        descriptors(route, &parts)
            .iter()
            .map(|d| {
                d.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        build(Some(ip("192.0.2.7")), Some(&geo)),
        ["country=DE,network=64500"]
    );
    assert_eq!(
        build(Some(ip("203.0.113.1")), Some(&geo)),
        ["country=unknown,network=none"]
    );
    // No client address, or no databases: the descriptor is skipped, as `remote_address`'s.
    assert!(build(None, Some(&geo)).is_empty());
    assert!(build(Some(ip("192.0.2.7")), None).is_empty());
    std::fs::remove_dir_all(&dir).ok();
}
