//! Test fixtures: real `redis-server` processes on free loopback ports, started and stopped by
//! the test that owns them. Nothing here talks to a server it did not start. Also small
//! MaxMind-format databases for the geography tests ([`country_database`], [`asn_database`]).
//!
//! ```no_run
//! let mut redis = sluice_testkit::RedisServer::start();
//! let url = redis.url();          // redis://127.0.0.1:<free port>/
//! redis.kill();                   // SIGKILL, as a crash would
//! redis.restart();                // same port, empty data
//! ```

mod cluster;
pub mod conformance;
mod etcd;
mod geo;
mod link;
mod netns;
mod ports;
mod process;
mod resp;
mod sentinel;
mod server;
mod tls;

pub use cluster::RedisCluster;
pub use etcd::{EtcdCluster, etcd_available};
pub use geo::{CountryLayout, asn_database, country_database};
pub use link::DelayLink;
pub use netns::{Lab, STORE_PORT};
pub use ports::{free_port, wait_until};
pub use process::redis_available;
pub use resp::{ping, raw_command, raw_command_as};
pub use sentinel::RedisSentinel;
pub use server::RedisServer;
pub use tls::make_certificates;
