//! A `geoip` database file is read at start and whenever it changes: any bytes give a
//! database or an error that names the file, never a panic; a database that loads answers
//! lookups of any address (a country is a short code; an ASN a number), never a panic.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_http::GeoIp;

fn file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("sluice-fuzz-geo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir.join("country.mmdb")
    })
}

fuzz_target!(|data: &[u8]| {
    let file = file();
    std::fs::write(file, data).expect("write the database");
    let geo = match GeoIp::open(std::slice::from_ref(file)) {
        Ok(geo) => geo,
        Err(e) => {
            assert!(e.to_string().contains("country.mmdb"), "{e}");
            return;
        }
    };
    // Addresses from the input's first bytes, and a few fixed ones.
    let mut v4 = [0u8; 4];
    let mut v6 = [0u8; 16];
    for (i, b) in data.iter().take(16).enumerate() {
        v6[i] = *b;
        if i < 4 {
            v4[i] = *b;
        }
    }
    for ip in [
        IpAddr::V4(Ipv4Addr::from(v4)),
        IpAddr::V6(Ipv6Addr::from(v6)),
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ] {
        if let Some(country) = geo.country(ip) {
            assert!(
                !country.is_empty()
                    && country.len() <= 16
                    && country.bytes().all(|b| b.is_ascii_alphanumeric()),
                "{country:?}"
            );
        }
        let _ = geo.asn(ip);
    }
});
