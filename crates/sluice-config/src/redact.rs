//! Passwords out of every message: store URLs are shown as `scheme://user:***@host`, and an
//! error that quotes a `sluice.yaml` loses every password the file holds.

/// `url` with its password (and a Sentinel `sentinel_password=`) replaced by `***`, for
/// errors and logs: a store URL is never shown whole.
pub fn redact_url(url: &str) -> String {
    let mut out = match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            let shown = if user.is_empty() {
                "***".to_owned()
            } else {
                format!("{user}:***")
            };
            format!("{}://{shown}@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    };
    if let Some(i) = out.find("sentinel_password=") {
        let start = i + "sentinel_password=".len();
        let end = out[start..].find('&').map_or(out.len(), |n| start + n);
        out.replace_range(start..end, "***");
    }
    out
}

/// The passwords written in `text` (a `sluice.yaml`): the part after `user:` of the user info
/// before every `@` (in a URL or in what is left of one), and every `password=` value. An error
/// about the file has each of them removed wherever it appears, whatever the quote around it
/// looks like.
pub fn secrets_in(text: &str) -> Vec<&str> {
    let ends = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | ',');
    let mut found = Vec::new();
    for word in text.split(ends) {
        let mut rest = word;
        while let Some(at) = rest.find('@') {
            let before = &rest[..at];
            let info = &before[before.rfind('/').map_or(0, |i| i + 1)..];
            if let Some((user, password)) = info.split_once(':')
                && !user.is_empty()
                && !password.is_empty()
            {
                found.push(password);
            } else if let Some(password) = info.strip_prefix(':')
                && !password.is_empty()
            {
                found.push(password);
            }
            rest = &rest[at + 1..];
        }
        let mut rest = word;
        while let Some(i) = rest.find("password=") {
            let after = &rest[i + "password=".len()..];
            let value = &after[..after.find('&').unwrap_or(after.len())];
            if !value.is_empty() {
                found.push(value);
            }
            rest = after;
        }
    }
    found
}

/// `host`, `host:port` or `[v6]:port`.
fn is_host_port(part: &str) -> bool {
    match part.rsplit_once(':') {
        None => true,
        Some((host, port)) => {
            (!host.contains(':') || host.starts_with('['))
                && port.bytes().all(|b| b.is_ascii_digit())
        }
    }
}

/// `text` (an error message that may quote the user's file) with every password-like part in
/// it replaced by `***`: in a word with an `@`, the user info before it (after its first `:`,
/// or all of it), even when the URL around it is mangled; in a URL cut before its `@`,
/// anything after a `:` that is not a port; and `password=` values. It may hide more than a
/// password (an e-mail's name, a host list), never less.
pub fn redact_secrets(text: &str) -> String {
    let ends_word = |c: char| c.is_whitespace() || matches!(c, '`' | '"' | '\'' | ',' | ';');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(ends_word).unwrap_or(rest.len());
        let (word, tail) = rest.split_at(end);
        out.push_str(&redact_word(word));
        let sep = tail.chars().next().map_or(0, char::len_utf8);
        out.push_str(&tail[..sep]);
        rest = &tail[sep..];
    }
    let key = "password=";
    let mut from = 0;
    while let Some(i) = out[from..].find(key) {
        let start = from + i + key.len();
        let end = out[start..]
            .find(|c: char| c == '&' || ends_word(c))
            .map_or(out.len(), |n| start + n);
        out.replace_range(start..end, "***");
        from = start + 3;
    }
    out
}

fn redact_word(word: &str) -> String {
    // Every `@`: the user info before it (from the last `/` or `@`) loses all after its first
    // `:`, or all of it.
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(at) = rest.find('@') {
        let before = &rest[..at];
        let info_start = before.rfind('/').map_or(0, |i| i + 1);
        let info = &before[info_start..];
        let kept = match info.find(':') {
            Some(colon) if colon > 0 => &info[..=colon],
            _ => "",
        };
        out.push_str(&before[..info_start]);
        out.push_str(kept);
        out.push_str("***@");
        rest = &rest[at + 1..];
    }
    // A URL cut before its `@`: `host:port` stays, anything else after a `:` may be the start
    // of a password.
    if let Some(scheme) = rest.find("://") {
        let authority_start = scheme + 3;
        let authority_end = rest[authority_start..]
            .find('/')
            .map_or(rest.len(), |i| authority_start + i);
        let authority = &rest[authority_start..authority_end];
        if !is_host_port(authority)
            && let Some(colon) = authority.find(':')
        {
            out.push_str(&rest[..=authority_start + colon]);
            out.push_str("***");
            out.push_str(&rest[authority_end..]);
            return out;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_urls_lose_their_passwords() {
        // Found by fuzzing: a malformed file's error quoted the store line.
        assert_eq!(
            redact_secrets(
                "expected a mapping, found `sto:e rredis+sentinel://app:S3cretPass@10.0.0.1:26379,10.0.0`"
            ),
            "expected a mapping, found `sto:e rredis+sentinel://app:***@10.0.0.1:26379,10.0.0`"
        );
        // Cut before the `@`: whatever follows `user:` goes, a port stays.
        assert_eq!(
            redact_secrets("found `redis://app:S3cretPa`"),
            "found `redis://app:***`"
        );
        assert_eq!(
            redact_secrets("bad `redis://h:6379/0` and `rediss://:pw@h`"),
            "bad `redis://h:6379/0` and `rediss://***@h`"
        );
        assert_eq!(
            redact_secrets("`m?sentinel_password=w%40tch&x=1`"),
            "`m?sentinel_password=***&x=1`"
        );
        assert_eq!(redact_secrets("no url here"), "no url here");
        assert_eq!(
            secrets_in(
                "store: redis+sentinel://app:S3cret@h:1/m?sentinel_password=w%40tch\nx: rediss://:pw@h"
            ),
            ["S3cret", "w%40tch", "pw"]
        );
        // A mangled scheme still has its user info hidden (also found by fuzzing).
        assert_eq!(
            redact_secrets("found `sto:e rredis+sentinel:/1app:S3cretPass@10.0.0.1:26379,10.0.0`"),
            "found `sto:e rredis+sentinel:/1app:***@10.0.0.1:26379,10.0.0`"
        );
        assert_eq!(
            redact_secrets(
                "store `redis+sentinel://10.0.0.1:26379,10.0.0.2:26379` names no master"
            ),
            "store `redis+sentinel://10.0.0.1:26379,10.0.0.2:26379` names no master"
        );
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact_url(
                "redis+sentinel://app:S3cretPass@s1:26379/m?sentinel_password=w%40tch&sentinel_tls=true"
            ),
            "redis+sentinel://app:***@s1:26379/m?sentinel_password=***&sentinel_tls=true"
        );
        assert_eq!(redact_url("redis://:pw@h:6379/0"), "redis://***@h:6379/0");
        assert_eq!(redact_url("redis://pw@h"), "redis://***@h");
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact_url("memory://"), "memory://");
    }
}
