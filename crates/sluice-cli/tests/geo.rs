//! A gateway behind one trusted proxy limits by the client's country and autonomous system,
//! looked up in MaxMind-format databases the test builds; a new version of a database file is
//! taken while serving, a broken one is refused and the version in use stays.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Serve, upstream};
use sluice_testkit::{CountryLayout, asn_database, country_database, free_port, wait_until};

/// The status of a GET of `path` from `client`, as the trusted proxy in front reports it: it
/// appends the address it saw to the `X-Forwarded-For` the client sent (here a forged one).
fn get(port: u16, path: &str, client: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 198.51.100.1, {client}\r\nConnection: close\r\n\r\n"
    );
    let _ = s.write_all(request.as_bytes());
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out)
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

const RULES: &str = "domain: edge
descriptors:
  - key: country
    rate_limit: { unit: minute, requests_per_unit: 100 }
    descriptors: []
  - key: country
    value: DE
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: country
    value: unknown
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: asn
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: asn
    value: \"64500\"
    rate_limit: { unit: minute, requests_per_unit: 1 }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_limits_by_country_and_asn_and_takes_a_new_database_while_serving() {
    let dir = std::env::temp_dir().join(format!("sluice-geo-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (country, asn) = (dir.join("country.mmdb"), dir.join("asn.mmdb"));
    std::fs::write(
        &country,
        country_database(
            CountryLayout::MaxMind,
            &[("192.0.2.0/24", "DE"), ("198.51.100.0/24", "US")],
        ),
    )
    .unwrap();
    std::fs::write(&asn, asn_database(&[("192.0.2.0/24", 64_500)])).unwrap();
    let (up, _hits) = upstream();
    let port = free_port();
    let config = format!(
        "geoip:
  databases: [{}, {}]
  check_every: 200ms
gateways:
  - listen: 127.0.0.1:{port}
    upstream: http://127.0.0.1:{up}
    domain: edge
    trusted_hops: 1
    routes:
      - match: {{ path_prefix: /asn }}
        rate_limits:
          - actions: [{{ asn: {{}} }}]
      - match: {{ path_prefix: / }}
        rate_limits:
          - actions: [{{ country: {{}} }}]
",
        country.display(),
        asn.display()
    );
    let serve = Serve::start_with("geo", "memory://", &[("edge.yaml", RULES)], &config);
    assert!(wait_until(Duration::from_secs(10), || get(
        port,
        "/",
        "198.51.100.9"
    ) == 200));
    // Germany: 2 a minute, counted for every German address together.
    assert_eq!(get(port, "/", "192.0.2.7"), 200);
    assert_eq!(get(port, "/", "192.0.2.8"), 200);
    assert_eq!(get(port, "/", "192.0.2.9"), 429, "{}", serve.log_tail());
    // The US has the default 100.
    for _ in 0..5 {
        assert_eq!(get(port, "/", "198.51.100.9"), 200);
    }
    // An address no database knows is `unknown` (1 a minute).
    assert_eq!(get(port, "/", "203.0.113.5"), 200);
    assert_eq!(get(port, "/", "203.0.113.6"), 429);
    // The autonomous system 64500 (the German range): 1 a minute; others 100.
    assert_eq!(get(port, "/asn", "192.0.2.7"), 200);
    assert_eq!(get(port, "/asn", "192.0.2.50"), 429);
    assert_eq!(get(port, "/asn", "198.51.100.9"), 200);

    // A new version: the range is now French, and French addresses have room.
    std::fs::write(
        &country,
        country_database(
            CountryLayout::IpLocationDb,
            &[("192.0.2.0/24", "FR"), ("198.51.100.0/24", "US")],
        ),
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || get(port, "/", "192.0.2.7")
            == 200),
        "the new database was not taken: {}",
        serve.log_tail()
    );
    // A broken version is refused; the French one stays.
    std::fs::write(&country, b"half a download").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || serve
            .log_tail()
            .contains("geoip database not reloaded")),
        "{}",
        serve.log_tail()
    );
    for _ in 0..3 {
        assert_eq!(get(port, "/", "192.0.2.7"), 200, "still French");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_database_that_cannot_be_loaded_stops_the_start_with_its_path() {
    let dir = std::env::temp_dir().join(format!("sluice-geo-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("country.mmdb");
    std::fs::write(&file, b"not a database").unwrap();
    let config = dir.join("sluice.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: {{ http: 127.0.0.1:{}, grpc: 127.0.0.1:{}, admin: 127.0.0.1:{} }}\ngeoip: {{ databases: [country.mmdb] }}\nallow_empty_rules: true\n",
            free_port(),
            free_port(),
            free_port()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("country.mmdb") && stderr.contains("not a valid MaxMind-format"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
