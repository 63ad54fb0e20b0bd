use std::fmt::Write as _;
use std::hash::Hasher;

/// The store key of one (rule, descriptor) pair, without the window suffix.
///
/// Layout: `sluice:v1:{<tag>}:<len>:<rule id><len>:<value>...`. Every part is length-prefixed, so
/// no descriptor value can produce another rule's or another descriptor's key whatever bytes it
/// contains; the Redis Cluster hash tag `{<tag>}` is a hex hash of the same parts, so a value
/// containing `{` or `}` cannot move the key to another slot, and the window and node keys of
/// one pair (`<key>:<window>`, `<key>:<window>:n`) share one slot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CounterKey(String);

/// Prefix of every key Sluice writes; the version changes when the layout does.
pub const KEY_PREFIX: &str = "sluice:v1:";

impl CounterKey {
    /// The key of `rule_id` for the descriptor `values`.
    pub fn new<V: AsRef<str>>(rule_id: &str, values: &[V]) -> Self {
        let mut encoded = String::with_capacity(8 * values.len());
        for v in values {
            let v = v.as_ref();
            let _ = write!(encoded, "{}:{v}", v.len());
        }
        Self::from_encoded(rule_id, &encoded)
    }

    /// The key of `rule_id` for values already encoded as `<len>:<value>...` (the engine's
    /// in-memory key), so the engine need not keep a store key per tracked key. The engine
    /// replaces an encoding longer than 128 bytes by `sha256:` and a digest, which starts with
    /// a letter and so can never be another descriptor's encoding.
    pub fn from_encoded(rule_id: &str, encoded_values: &str) -> Self {
        let mut key =
            String::with_capacity(KEY_PREFIX.len() + 24 + rule_id.len() + encoded_values.len());
        Self::write_encoded(&mut key, rule_id, encoded_values);
        Self(key)
    }

    /// Appends the key [`CounterKey::from_encoded`] builds to `out` (a flush reuses one buffer
    /// for all its keys).
    pub fn write_encoded(out: &mut String, rule_id: &str, encoded_values: &str) {
        // A fixed hash: every instance must compute the same tag.
        let mut hasher = Fnv::default();
        hasher.write(rule_id.as_bytes());
        hasher.write_u8(0xff);
        hasher.write(encoded_values.as_bytes());
        let _ = write!(
            out,
            "{KEY_PREFIX}{{{:016x}}}:{}:{rule_id}{encoded_values}",
            hasher.finish(),
            rule_id.len()
        );
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// FNV-1a: tiny, stable across processes, versions and platforms (unlike std's SipHash keys or
/// foldhash's per-process seeds), and good enough to spread hash tags over slots.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = h;
    }

    fn write_usize(&mut self, n: usize) {
        self.write(&(n as u64).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_cannot_collide_across_rules_or_descriptors() {
        let a = CounterKey::new("edge/user", &["a:b"]);
        let b = CounterKey::new("edge/user", &["a", "b"]);
        let c = CounterKey::new("edge/user:1", &["a"]);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
        assert_eq!(a, CounterKey::new("edge/user", &["a:b"]));
    }

    #[test]
    fn braces_in_values_do_not_change_the_hash_tag_shape() {
        let k = CounterKey::new("edge/user", &["}{evil"]);
        let s = k.as_str();
        let open = s.find('{').unwrap();
        let close = s[open..].find('}').unwrap() + open;
        assert_eq!(close - open - 1, 16, "tag is the 16-hex-digit hash: {s}");
    }
}
