//! Descriptor values with `*`: each `*` matches zero or more characters, anywhere and as
//! often as written (`files/*`, `*-prod`, `x*y*z`), as in Envoy's ratelimit service.

/// A value pattern with at least one `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wildcard {
    /// The pattern as written (`files/*`).
    pattern: String,
    /// The literal pieces between the `*`s; the first is a prefix and the last a suffix
    /// (either may be empty).
    pieces: Vec<String>,
}

impl Wildcard {
    /// The pattern, when `value` has a `*`.
    pub fn new(value: &str) -> Option<Self> {
        value.contains('*').then(|| Self {
            pattern: value.to_owned(),
            pieces: value.split('*').map(str::to_owned).collect(),
        })
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether `value` matches: the first piece starts it, the last ends it, and the ones
    /// between appear in order without overlapping (leftmost first, which is enough: `*`
    /// takes any run of characters).
    pub fn matches(&self, value: &str) -> bool {
        let (first, rest) = self.pieces.split_first().expect("split gives one piece");
        let Some((last, middle)) = rest.split_last() else {
            return value == first;
        };
        let Some(mut tail) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        for piece in middle {
            match tail.find(piece.as_str()) {
                Some(at) => tail = &tail[at + piece.len()..],
                None => return false,
            }
        }
        tail.len() >= last.len() && tail.ends_with(last.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, value: &str) -> bool {
        Wildcard::new(pattern).unwrap().matches(value)
    }

    #[test]
    fn stars_anywhere_match_zero_or_more_characters() {
        assert!(m("files/*", "files/a.pdf"));
        assert!(m("files/*", "files/"));
        assert!(!m("files/*", "file"));
        assert!(m("*-prod", "api-prod"));
        assert!(m("*-prod", "-prod"));
        assert!(!m("*-prod", "api-prod-2"));
        assert!(m("a*b", "ab"));
        assert!(m("a*b", "axxb"));
        assert!(!m("a*b", "axxbc"));
        assert!(m("x*y*z", "xyz"));
        assert!(m("x*y*z", "x-y-y-z"));
        assert!(!m("x*y*z", "x-z-y"));
        assert!(m("*", ""));
        assert!(m("**", "anything"));
        // The suffix may not reuse what the prefix took.
        assert!(!m("ab*ba", "aba"));
        assert!(m("ab*ba", "abba"));
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_a_backtracking_matcher(pattern in "[ab*]{0,6}", value in "[ab]{0,8}") {
            fn slow(p: &[u8], v: &[u8]) -> bool {
                match p.split_first() {
                    None => v.is_empty(),
                    Some((b'*', rest)) => (0..=v.len()).any(|i| slow(rest, &v[i..])),
                    Some((c, rest)) => v.first() == Some(c) && slow(rest, &v[1..]),
                }
            }
            if let Some(w) = Wildcard::new(&pattern) {
                proptest::prop_assert_eq!(w.matches(&value), slow(pattern.as_bytes(), value.as_bytes()));
            }
        }
    }
}
