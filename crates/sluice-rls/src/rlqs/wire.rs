//! A report kept as its wire bytes, and answers written as wire bytes.
//!
//! Decoded whole, a report costs far more than its bytes: a two-byte empty usage becomes an
//! 88-byte struct (a 1 MiB report, about 46 MB), and its answer, built as structs, as much
//! again. So a report's usages are kept undecoded ([`WireReport`]: their bytes, copied once,
//! at most twice the message: a domain field repeated after the usages is held in both) and
//! decoded one at a time, after the stream's pace; and answers are written as wire bytes as
//! they are made ([`WireResponse`]), sent in parts of at most [`RESPONSE_PART_BYTES`]. What one
//! stream holds is then a few times its largest message, whatever the message says.

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};

/// The most bytes of actions one response carries; a longer answer goes in several.
pub const RESPONSE_PART_BYTES: usize = 64 * 1024;

/// `RateLimitQuotaUsageReports`, its usages left undecoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireReport {
    /// The report's domain (field 1).
    pub domain: String,
    /// Each usage (field 2) as its length (varint) and bytes.
    usages: Vec<u8>,
    count: usize,
}

impl WireReport {
    /// Usages it carries.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it carries no usage.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes it holds (the domain and the usages' wire bytes).
    pub fn held_bytes(&self) -> usize {
        self.domain.capacity() + self.usages.capacity()
    }

    /// Its usages, decoded one at a time.
    pub fn usages(&self) -> impl Iterator<Item = Result<BucketQuotaUsage, prost::DecodeError>> {
        let mut rest = self.usages.as_slice();
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            Some(next_usage(&mut rest))
        })
    }
}

fn next_usage(rest: &mut &[u8]) -> Result<BucketQuotaUsage, prost::DecodeError> {
    let len = prost::encoding::decode_varint(rest)?;
    let len = usize::try_from(len).unwrap_or(usize::MAX).min(rest.len());
    let (one, after) = rest.split_at(len);
    *rest = after;
    BucketQuotaUsage::decode(one)
}

impl Message for WireReport {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.domain.is_empty() {
            prost::encoding::string::encode(1, &self.domain, buf);
        }
        let mut rest = self.usages.as_slice();
        while !rest.is_empty() {
            let Ok(len) = prost::encoding::decode_varint(&mut rest) else {
                return;
            };
            let len = usize::try_from(len).unwrap_or(usize::MAX).min(rest.len());
            prost::encoding::encode_key(2, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(len as u64, buf);
            buf.put_slice(&rest[..len]);
            rest = &rest[len..];
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            1 => prost::encoding::string::merge(wire_type, &mut self.domain, buf, ctx),
            2 => {
                let mut one = Vec::new();
                prost::encoding::bytes::merge(wire_type, &mut one, buf, ctx)?;
                if self.usages.capacity() == 0 {
                    // Once, the rest of the message: the usages never need more.
                    self.usages.reserve_exact(buf.remaining() + one.len() + 10);
                }
                prost::encoding::encode_varint(one.len() as u64, &mut self.usages);
                self.usages.extend_from_slice(&one);
                self.count += 1;
                Ok(())
            }
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let domain = if self.domain.is_empty() {
            0
        } else {
            prost::encoding::string::encoded_len(1, &self.domain)
        };
        domain + self.count * prost::encoding::key_len(2) + self.usages.len()
    }

    fn clear(&mut self) {
        self.domain.clear();
        self.usages.clear();
        self.count = 0;
    }
}

/// `RateLimitQuotaResponse` written as its wire bytes: actions appended one by one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireResponse {
    actions: Vec<u8>,
    count: usize,
}

impl WireResponse {
    /// Appends an action (field 1).
    pub fn push(&mut self, action: &BucketAction) {
        prost::encoding::encode_key(1, WireType::LengthDelimited, &mut self.actions);
        prost::encoding::encode_varint(action.encoded_len() as u64, &mut self.actions);
        action.encode_raw(&mut self.actions);
        self.count += 1;
    }

    /// Actions it carries.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it carries no action.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether it is large enough to send before adding more.
    pub fn is_full(&self) -> bool {
        self.actions.len() >= RESPONSE_PART_BYTES
    }
}

impl Message for WireResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.actions);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Sluice never reads responses; a decoded one is skipped.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.actions.len()
    }

    fn clear(&mut self) {
        self.actions.clear();
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
    };

    fn usage(user: &str, allowed: u64) -> BucketQuotaUsage {
        BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("user".to_owned(), user.to_owned())].into(),
            }),
            time_elapsed: None,
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        }
    }

    #[test]
    fn usages_read_one_by_one_are_the_ones_sent() {
        let sent = RateLimitQuotaUsageReports {
            domain: "edge".to_owned(),
            bucket_quota_usages: vec![usage("alice", 3), usage("bob", 0)],
        };
        let report = WireReport::decode(sent.encode_to_vec().as_slice()).unwrap();
        assert_eq!((report.domain.as_str(), report.len()), ("edge", 2));
        let read: Vec<_> = report.usages().map(Result::unwrap).collect();
        assert_eq!(read, sent.bucket_quota_usages);
        assert_eq!(report.encode_to_vec(), sent.encode_to_vec());
    }

    #[test]
    fn a_report_of_empty_usages_holds_no_more_than_its_bytes() {
        // 500,000 empty usages: two bytes each on the wire, 88 each decoded whole.
        let sent = RateLimitQuotaUsageReports {
            domain: String::new(),
            bucket_quota_usages: vec![BucketQuotaUsage::default(); 500_000],
        };
        let bytes = sent.encode_to_vec();
        let report = WireReport::decode(bytes.as_slice()).unwrap();
        assert_eq!(report.len(), 500_000);
        assert!(
            report.held_bytes() <= bytes.len() + 16,
            "{} held for {} bytes",
            report.held_bytes(),
            bytes.len()
        );
    }

    #[test]
    fn a_response_written_as_bytes_reads_as_the_actions() {
        let actions: Vec<BucketAction> = ["a", "b"]
            .iter()
            .map(|u| BucketAction {
                bucket_id: usage(u, 0).bucket_id,
                bucket_action: None,
            })
            .collect();
        let mut wire = WireResponse::default();
        for a in &actions {
            wire.push(a);
        }
        assert_eq!(wire.len(), 2);
        let read = RateLimitQuotaResponse::decode(wire.encode_to_vec().as_slice()).unwrap();
        assert_eq!(read.bucket_action, actions);
    }
}
