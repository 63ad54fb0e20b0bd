//! Small MaxMind-format (`.mmdb`) databases for the tests of the `country` and `asn` actions,
//! in the layouts public databases use.

use mmdb_writer::Writer;
use mmdb_writer::ipnet::IpNet;
use serde::Serialize;

/// How a database writes a country.
#[derive(Clone, Copy, Debug)]
pub enum CountryLayout {
    /// MaxMind's GeoLite2 / GeoIP2 Country and City: `{country: {iso_code: "DE"}}`.
    MaxMind,
    /// The `ip-location-db` packages: `{country_code: "DE"}`, and no description in the
    /// metadata.
    IpLocationDb,
}

#[derive(Serialize)]
struct IsoCode<'a> {
    iso_code: &'a str,
}

#[derive(Serialize)]
struct MaxMindCountry<'a> {
    country: IsoCode<'a>,
}

#[derive(Serialize)]
struct FlatCountry<'a> {
    country_code: &'a str,
}

#[derive(Serialize)]
struct Asn<'a> {
    autonomous_system_number: u32,
    autonomous_system_organization: &'a str,
}

/// A writer; with a description as MaxMind's databases have, or none as the `ip-location-db`
/// packages ship (which `maxminddb`'s verification complains of).
fn writer(database_type: &str, description: bool) -> Writer {
    let builder = Writer::builder(database_type);
    if description {
        builder
            .description(&[("en", "Sluice test database")])
            .build()
    } else {
        builder.build()
    }
}

fn net(network: &str) -> IpNet {
    network
        .parse()
        .unwrap_or_else(|e| panic!("network `{network}`: {e}"))
}

/// A country database: each `(network, ISO code)`, e.g. `("192.0.2.0/24", "DE")`.
pub fn country_database(layout: CountryLayout, entries: &[(&str, &str)]) -> Vec<u8> {
    let mut writer = writer(
        "Sluice-Test-Country",
        matches!(layout, CountryLayout::MaxMind),
    );
    for &(network, code) in entries {
        let inserted = match layout {
            CountryLayout::MaxMind => writer.insert(
                net(network),
                &MaxMindCountry {
                    country: IsoCode { iso_code: code },
                },
            ),
            CountryLayout::IpLocationDb => {
                writer.insert(net(network), &FlatCountry { country_code: code })
            }
        };
        inserted.expect("insert a country");
    }
    writer.to_bytes().expect("write the database")
}

/// An ASN database in GeoLite2-ASN's layout: each `(network, number)`.
pub fn asn_database(entries: &[(&str, u32)]) -> Vec<u8> {
    let mut writer = writer("Sluice-Test-ASN", true);
    for &(network, number) in entries {
        writer
            .insert(
                net(network),
                &Asn {
                    autonomous_system_number: number,
                    autonomous_system_organization: "Example",
                },
            )
            .expect("insert an ASN");
    }
    writer.to_bytes().expect("write the database")
}
