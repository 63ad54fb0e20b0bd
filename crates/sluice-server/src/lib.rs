//! The Sluice service: from a config file, the engine and its store, the flush timer, the
//! Envoy RLS gRPC and HTTP/JSON front doors, the gateways, the admin listener (probes, status
//! page, `/metrics`, `POST /reload`), reloads and the shutdown sequence. The `sluice` binary
//! (`sluice-cli`) parses its arguments and calls [`run`].
//!
//! ```no_run
//! # async fn serve() -> Result<(), sluice_server::ServerError> {
//! // Runs until SIGTERM or Ctrl-C, then flushes and exits.
//! sluice_server::run(std::path::Path::new("sluice.yaml")).await
//! # }
//! ```

mod access;
mod admin;
mod admission;
pub mod build_info;
mod door_metrics;
mod error;
mod gateway_workers;
mod geo;
mod grpc_lane;
mod guarded;
mod host_check;
mod hot_lane;
mod key_mask;
mod lifecycle;
mod listener;
mod recorder;
mod reload;
pub mod rule_listing;
mod serve;
mod service;
mod status;
mod status_page;
#[cfg(test)]
mod test_engine;
mod tls;
mod workers;

pub use error::ServerError;
pub use serve::{run, run_until};
