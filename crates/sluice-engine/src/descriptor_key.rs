//! The in-memory key of a descriptor under one rule, built without allocating.

use std::cell::RefCell;
use std::fmt::Write as _;

thread_local! {
    static BUFFER: RefCell<String> = RefCell::new(String::with_capacity(128));
}

/// Runs `f` with the descriptor's values encoded as `<len>:<value>` pairs in a reused
/// per-thread buffer, so looking up a tracked key allocates nothing.
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
        f(&buf)
    })
}
