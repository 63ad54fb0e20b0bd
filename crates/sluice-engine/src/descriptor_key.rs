//! The in-memory key of a descriptor under one rule, built without allocating, and never
//! longer than [`MAX_KEY_BYTES`].

use std::cell::RefCell;
use std::fmt::Write as _;

/// The longest in-memory key kept as it is. A longer one (long or many values) is replaced by
/// its digest ([`write_digest`], 39 bytes), so a rule's map costs at most its key cap times a
/// fixed size per key, whatever the values: the key cap is a byte budget too.
pub const MAX_KEY_BYTES: usize = 128;

thread_local! {
    static BUFFER: RefCell<String> = RefCell::new(String::with_capacity(128));
}

/// Runs `f` with the descriptor's values encoded as `<len>:<value>` pairs in a reused
/// per-thread buffer, so looking up a tracked key allocates nothing. An encoding longer than
/// [`MAX_KEY_BYTES`] is replaced by its digest (it starts with a letter, never a digit like
/// an encoding, so the two cannot meet); every instance computes the same one.
pub(crate) fn with_key<V: AsRef<str>, R>(
    values: impl Iterator<Item = V>,
    f: impl FnOnce(&str) -> R,
) -> R {
    BUFFER.with(|cell| {
        let mut buf = cell.borrow_mut();
        buf.clear();
        for v in values {
            let v = v.as_ref();
            let _ = write!(buf, "{}:", v.len());
            buf.push_str(v);
        }
        if buf.len() > MAX_KEY_BYTES {
            let digest = ring::digest::digest(&ring::digest::SHA256, buf.as_bytes());
            buf.clear();
            push_digest(&mut buf, digest.as_ref());
        }
        f(&buf)
    })
}

/// Appends `sha256:` and the first 128 bits of the SHA-256 of `bytes` in hex (39 bytes): the
/// stand-in for a value or key too long to keep, the same on every instance and every version.
/// Finding two inputs with one digest takes about 2^64 hashes.
pub fn write_digest(out: &mut String, bytes: &[u8]) {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    push_digest(out, digest.as_ref());
}

fn push_digest(out: &mut String, digest: &[u8]) {
    out.push_str("sha256:");
    for b in &digest[..16] {
        let _ = write!(out, "{b:02x}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_become_fixed_size_digests_and_short_ones_stay() {
        let short = with_key(["alice"].iter(), str::to_owned);
        assert_eq!(short, "5:alice");
        let long_value = "x".repeat(1024);
        let long = with_key([long_value.as_str()].iter(), str::to_owned);
        assert_eq!(long.len(), 39);
        assert!(long.starts_with("sha256:"), "{long}");
        // Distinct values stay distinct keys; the same value gets the same key.
        let other = with_key(["y".repeat(1024).as_str()].iter(), str::to_owned);
        assert_ne!(long, other);
        assert_eq!(long, with_key([long_value.as_str()].iter(), str::to_owned));
        // Many short values add up: the whole encoding is what is capped.
        let many: Vec<String> = (0..40).map(|i| format!("v{i}")).collect();
        assert_eq!(with_key(many.iter(), |k| k.len()), 39);
        let mut digest = String::new();
        write_digest(&mut digest, b"abc");
        assert_eq!(digest, "sha256:ba7816bf8f01cfea414140de5dae2223");
    }
}
