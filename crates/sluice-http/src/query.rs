//! How the limiter finds a query parameter. Upstreams disagree on what a query says: Rack 2,
//! Go before 1.17 and Python before 3.9.2 split it on `;` as well as `&` (`?x=1;user=bob`
//! carries `user=bob`), and ASP.NET Core compares names in any case (`?USER=bob` is `user`).
//! A limiter that reads only one of those spellings counts a request the upstream serves as
//! someone else. By default ([`QueryReading`]'s `false` fields) a parameter is found in every
//! spelling any of them reads; the caller refuses a name found twice, and a value cut at a `;`
//! (`?user=bob;x=1`: `bob` to a `;` reader, `bob;x=1` to an `&` reader). A parameter after a
//! `;` (`?x=1;user=bob`) counts: an `&` reader sees no `user` there, a `;` reader sees `bob`,
//! the value counted.

use sluice_config::PathMatching;

use crate::value::query_value;

/// How the query's parameters are read (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryReading {
    /// `;` is data, only `&` separates parameters (`strict_query_separators`).
    pub strict_separators: bool,
    /// Names are compared exactly, not in any case (`strict_query_names`).
    pub strict_names: bool,
}

impl From<PathMatching> for QueryReading {
    fn from(m: PathMatching) -> Self {
        Self {
            strict_separators: m.strict_query_separators,
            strict_names: m.strict_query_names,
        }
    }
}

/// One parameter with the name looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found<'a> {
    /// The raw (still encoded) value.
    pub value: &'a str,
    /// Whether its value was cut at a `;`: an `&`-only reader reads the same name with the
    /// rest of the pair in its value, so the value counted is not the one every upstream reads.
    pub cut_at_semicolon: bool,
}

fn same_name(sent: &str, name: &str, reading: QueryReading) -> bool {
    let same = |k: &str| {
        if reading.strict_names {
            k == name
        } else if k.is_ascii() && name.is_ascii() {
            k.eq_ignore_ascii_case(name)
        } else {
            k.chars()
                .flat_map(char::to_lowercase)
                .eq(name.chars().flat_map(char::to_lowercase))
        }
    };
    same(sent) || (sent.contains(['%', '+']) && same(&query_value(sent)))
}

/// Every parameter of `query` named `name` (compared decoded: `%6Bey` is `key`), in each
/// spelling `reading` allows.
pub(crate) fn query_params<'a>(
    query: Option<&'a str>,
    name: &'a str,
    reading: QueryReading,
) -> impl Iterator<Item = Found<'a>> + 'a {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .flat_map(move |pair| {
            let separators: &[char] = if reading.strict_separators {
                &[]
            } else {
                &[';']
            };
            // Only the first part has the name an `&` reader sees, and only when its `=` comes
            // before the `;` (`user;x=1` is the name `user;x` to it).
            let whole = pair.len();
            pair.split(separators)
                .enumerate()
                .map(move |(i, part)| (part, i == 0 && part.len() < whole && part.contains('=')))
        })
        .filter_map(move |(part, cut_at_semicolon)| {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            same_name(k, name, reading).then_some(Found {
                value: v,
                cut_at_semicolon,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(query: &str, name: &str, reading: QueryReading) -> Vec<&'static str> {
        let query: &'static str = Box::leak(query.to_owned().into_boxed_str());
        let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
        query_params(Some(query), name, reading)
            .map(|f| f.value)
            .collect()
    }

    #[test]
    fn semicolons_separate_and_names_match_in_any_case_by_default() {
        let d = QueryReading::default();
        assert_eq!(values("x=1;user=bob", "user", d), ["bob"]);
        assert_eq!(values("USER=bob", "user", d), ["bob"]);
        assert_eq!(values("%55ser=bob", "user", d), ["bob"]);
        assert_eq!(values("user=a&User=b;uSeR=c", "user", d), ["a", "b", "c"]);
        assert_eq!(values("users=a&use=b", "user", d), Vec::<&str>::new());
        assert_eq!(values("ÜSER=a", "üser", d), ["a"], "beyond ASCII too");
    }

    #[test]
    fn a_value_cut_at_a_semicolon_is_marked() {
        let d = QueryReading::default();
        let cut = |q: &'static str| -> Vec<bool> {
            query_params(Some(q), "user", d)
                .map(|f| f.cut_at_semicolon)
                .collect()
        };
        assert_eq!(cut("user=bob;x=1&k=2"), [true]);
        assert_eq!(cut("x=1;user=bob"), [false], "an `&` reader sees no `user`");
        assert_eq!(cut("user;x=1"), [false], "nor here (its name is `user;x`)");
        assert_eq!(
            cut("x=1;y&user=bob"),
            [false],
            "a `;` elsewhere is no matter"
        );
    }

    #[test]
    fn each_setting_keeps_its_distinction() {
        let seps = QueryReading {
            strict_separators: true,
            ..Default::default()
        };
        assert_eq!(values("x=1;user=bob", "user", seps), Vec::<&str>::new());
        assert_eq!(values("user=bob;x=1", "user", seps), ["bob;x=1"]);
        assert!(!query_params(Some("user=bob;x"), "user", seps).any(|f| f.cut_at_semicolon));
        let names = QueryReading {
            strict_names: true,
            ..Default::default()
        };
        assert_eq!(values("USER=bob&user=al", "user", names), ["al"]);
        assert_eq!(values("x;user=al", "user", names), ["al"]);
    }
}
