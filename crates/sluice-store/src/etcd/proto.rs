//! The part of etcd's v3 gRPC API (`etcdserverpb`, `mvccpb`) the store uses, as prost
//! messages. Field numbers follow etcd's `rpc.proto` and `kv.proto`; only the fields Sluice
//! reads or writes are declared (prost skips the others on decode).
//!
//! Written out rather than generated: the maintained client crate generates them at build time
//! and so needs `protoc` on every machine that builds Sluice.

#![allow(missing_docs)]

/// `etcdserverpb.ResponseHeader`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

/// `mvccpb.KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
}

/// `etcdserverpb.RangeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
}

/// `etcdserverpb.RangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    #[prost(bool, tag = "3")]
    pub more: bool,
    #[prost(int64, tag = "4")]
    pub count: i64,
}

/// `etcdserverpb.PutRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

/// `etcdserverpb.PutResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.Compare`, the forms the store uses.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    /// `CompareResult`: 0 EQUAL.
    #[prost(int32, tag = "1")]
    pub result: i32,
    /// `CompareTarget`: 0 VERSION, 2 MOD.
    #[prost(int32, tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "CompareTarget", tags = "4, 6")]
    pub target_union: Option<CompareTarget>,
}

/// `Compare.target_union`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum CompareTarget {
    #[prost(int64, tag = "4")]
    Version(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
}

impl Compare {
    /// The key does not exist (its version is 0).
    pub fn absent(key: Vec<u8>) -> Self {
        Self {
            result: 0,
            target: 0,
            key,
            target_union: Some(CompareTarget::Version(0)),
        }
    }

    /// The key was last written at `revision`.
    pub fn written_at(key: Vec<u8>, revision: i64) -> Self {
        Self {
            result: 0,
            target: 2,
            key,
            target_union: Some(CompareTarget::ModRevision(revision)),
        }
    }
}

/// `etcdserverpb.RequestOp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2")]
    pub request: Option<Request>,
}

/// `RequestOp.request`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
}

impl RequestOp {
    /// A put of `value` at `key` under `lease`.
    pub fn put(key: Vec<u8>, value: Vec<u8>, lease: i64) -> Self {
        Self {
            request: Some(Request::Put(PutRequest { key, value, lease })),
        }
    }

    /// A read of every key starting with `prefix` (at most `limit`), or of `prefix` alone.
    pub fn range(key: Vec<u8>, range_end: Vec<u8>, limit: i64) -> Self {
        Self {
            request: Some(Request::Range(RangeRequest {
                key,
                range_end,
                limit,
            })),
        }
    }
}

/// `etcdserverpb.ResponseOp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseOp {
    #[prost(oneof = "Response", tags = "1, 2")]
    pub response: Option<Response>,
}

/// `ResponseOp.response`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
    #[prost(message, tag = "2")]
    Put(PutResponse),
}

/// `etcdserverpb.TxnRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

/// `etcdserverpb.TxnResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

/// `etcdserverpb.LeaseGrantRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    #[prost(int64, tag = "2")]
    pub id: i64,
}

/// `etcdserverpb.LeaseGrantResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

/// `etcdserverpb.AuthenticateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

/// `etcdserverpb.AuthenticateResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(string, tag = "2")]
    pub token: String,
}
