//! Loads a MaxMind-format database as `sluice serve` does (read whole, checked), prints what
//! the `country` and `asn` actions would give a few addresses, and times a million lookups.
//!
//! ```text
//! cargo run --release -p sluice-http --example geo_lookup -- country.mmdb [ADDRESS...]
//! ```

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .ok_or("usage: geo_lookup FILE.mmdb [ADDRESS...]")?,
    );
    let mut addresses: Vec<IpAddr> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if addresses.is_empty() {
        addresses = [
            "1.1.1.1",
            "8.8.8.8",
            "81.2.69.142",
            "2a00:1450:4001::1",
            "10.0.0.1",
        ]
        .iter()
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    }
    let clock = quanta::Clock::new();
    let start = clock.now();
    let geo = sluice_http::GeoIp::open(&[path])?;
    println!("loaded and checked in {:?}", clock.now() - start);
    for a in addresses {
        println!("{a}: country {:?}, asn {:?}", geo.country(a), geo.asn(a));
    }
    let (start, mut found) = (clock.now(), 0u32);
    for i in 0..1_000_000u32 {
        // Addresses spread over the whole IPv4 space.
        let ip = IpAddr::V4(Ipv4Addr::from(i.wrapping_mul(2_654_435_761)));
        found += u32::from(geo.country(ip).is_some());
    }
    let took = clock.now() - start;
    println!(
        "1,000,000 country lookups: {:?} ({} ns each), {found} found",
        took,
        took.as_nanos() / 1_000_000
    );
    Ok(())
}
