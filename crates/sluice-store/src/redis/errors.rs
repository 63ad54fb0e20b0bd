//! Store errors from redis-rs errors, classified once by their kind (never by their text).

use redis::RedisError;

use crate::StoreError;

/// Classifies a redis-rs error once, by its kind: the connection (unavailable), a topology
/// change (read-only replica, moved slot), or a refusal.
pub(crate) fn map_error(e: &RedisError) -> StoreError {
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        return StoreError::Unavailable(e.to_string());
    }
    match e.kind() {
        redis::ErrorKind::Server(kind) => classify_server(kind, e.to_string()),
        redis::ErrorKind::ClusterConnectionNotFound => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Refused(e.to_string()),
    }
}

/// Classifies an error reply of one command in a pipeline.
pub(crate) fn map_server_error(e: &redis::ServerError) -> StoreError {
    let message = match e.details() {
        Some(details) => format!("{} {details}", e.code()),
        None => e.code().to_owned(),
    };
    match e.kind() {
        Some(kind) => classify_server(kind, message),
        None => StoreError::Refused(message),
    }
}

fn classify_server(kind: redis::ServerErrorKind, message: String) -> StoreError {
    use redis::ServerErrorKind as K;
    match kind {
        K::ReadOnly => StoreError::ReadOnly(message),
        K::Moved | K::Ask | K::TryAgain | K::ClusterDown | K::MasterDown => {
            StoreError::Redirected(message)
        }
        _ => StoreError::Refused(message),
    }
}
