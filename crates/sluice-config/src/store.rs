//! `store:` in `sluice.yaml`: where counters are shared, parsed from a URL (`memory`,
//! `redis://`, `rediss://`, `redis+sentinel://`, `redis+cluster://`). No password ever
//! reaches an error message or a `Debug` output.

use serde_saphyr::Spanned;

use crate::error::{Located, suggestion};
use crate::target::{
    ClusterTarget, Credentials, EtcdTarget, RedisTarget, SentinelTarget, StandaloneTarget,
    StoreConfig,
};

fn split_authority(rest: &str) -> (Option<&str>, &str, Option<&str>) {
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..], path),
        None => (None, authority, path),
    }
}

/// `user:password` or `password`, percent-decoded (a password may hold `@`, `/` or `:` as
/// `%40`, `%2F`, `%3A`).
fn parse_auth(userinfo: Option<&str>) -> Option<Credentials> {
    let info = userinfo?;
    match info.split_once(':') {
        Some((user, pass)) => Some(Credentials::new(
            (!user.is_empty()).then(|| decode(user)),
            decode(pass),
        )),
        None => Some(Credentials::new(None, decode(info))),
    }
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Sentinel URL options: `sentinel_username`, `sentinel_password`, `sentinel_tls`.
struct SentinelOptions {
    auth: Option<Credentials>,
    tls: bool,
}

fn sentinel_options(value: &Spanned<String>, query: &str) -> Result<SentinelOptions, Located> {
    let (mut user, mut password, mut tls) = (None, None, false);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, v) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "sentinel_username" => user = Some(decode(v)),
            "sentinel_password" => password = Some(decode(v)),
            "sentinel_tls" => {
                tls = match v {
                    "true" | "yes" | "1" => true,
                    "false" | "no" | "0" => false,
                    other => {
                        return Err(Located::at(
                            value,
                            format!(
                                "invalid sentinel_tls `{other}` in store URL; write `sentinel_tls=true` or `false`"
                            ),
                        ));
                    }
                }
            }
            other => {
                return Err(Located::at(
                    value,
                    format!(
                        "unknown store URL option `{other}`; {}",
                        suggestion(
                            other,
                            &["sentinel_username", "sentinel_password", "sentinel_tls"]
                        )
                    ),
                ));
            }
        }
    }
    let auth = match (user, password) {
        (user, Some(password)) => Some(Credentials::new(user, password)),
        (Some(_), None) => {
            return Err(Located::at(
                value,
                "store URL sets `sentinel_username` without `sentinel_password`",
            ));
        }
        (None, None) => None,
    };
    Ok(SentinelOptions { auth, tls })
}

fn parse_hosts(
    value: &Spanned<String>,
    hosts: &str,
    default_port: u16,
) -> Result<Vec<String>, Located> {
    let mut out = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(Located::at(
                value,
                format!(
                    "empty host in store URL `{}`; write `host:port` entries separated by commas",
                    crate::redact_url(&value.value)
                ),
            ));
        }
        let with_port = if host
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !host.ends_with(']')
        {
            host.to_owned()
        } else {
            format!("{host}:{default_port}")
        };
        out.push(with_port);
    }
    Ok(out)
}

/// Parses a store URL (docs/CONFIG.md lists the forms).
pub(crate) fn parse_store(value: &Spanned<String>) -> Result<StoreConfig, Located> {
    let url = value.value.trim();
    // What error messages show: never the password.
    let shown = crate::redact_url(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Located::at(
            value,
            format!(
                "invalid store `{shown}`; write `memory://`, `redis://host:6379`, `rediss://host:6380`, `redis+sentinel://h1:26379,h2:26379/mymaster`, `redis+cluster://h1:7000,h2:7001` or `etcd://h1:2379,h2:2379`"
            ),
        ));
    };
    let schemes = [
        "memory",
        "redis",
        "rediss",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
        "etcd",
        "etcds",
    ];
    match scheme {
        "memory" => {
            if !rest.is_empty() {
                return Err(Located::at(
                    value,
                    "the memory store takes no address; write `memory://`",
                ));
            }
            Ok(StoreConfig::Memory)
        }
        "redis" | "rediss" => {
            let (_, hosts, _) = split_authority(rest);
            if hosts.is_empty() || hosts.contains(',') {
                return Err(Located::at(
                    value,
                    format!(
                        "invalid store `{shown}`; a {scheme}:// URL names one server, e.g. `{scheme}://127.0.0.1:6379/0`; for several, use redis+sentinel:// or redis+cluster://"
                    ),
                ));
            }
            Ok(StoreConfig::Redis(RedisTarget::Standalone(
                StandaloneTarget {
                    url: url.to_owned(),
                },
            )))
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
            let options = sentinel_options(value, query)?;
            let (userinfo, hosts, path) = split_authority(rest);
            let mut parts = path.unwrap_or("").split('/');
            let master = parts.next().unwrap_or("").to_owned();
            if master.is_empty() {
                return Err(Located::at(
                    value,
                    format!(
                        "store `{shown}` names no master; append the master name, e.g. `redis+sentinel://{hosts}/mymaster`"
                    ),
                ));
            }
            let db = match parts.next() {
                None | Some("") => 0,
                Some(db) => db.parse().map_err(|_| Located::at(value, format!("invalid database `{db}` in store URL; write a number, e.g. `/mymaster/0`")))?,
            };
            Ok(StoreConfig::Redis(RedisTarget::Sentinel(SentinelTarget {
                sentinels: parse_hosts(value, hosts, 26379)?,
                master,
                tls: scheme.starts_with("rediss"),
                auth: parse_auth(userinfo),
                db,
                sentinel_auth: options.auth,
                sentinel_tls: options.tls,
            })))
        }
        "redis+cluster" | "rediss+cluster" => {
            let (userinfo, hosts, _) = split_authority(rest);
            Ok(StoreConfig::Redis(RedisTarget::Cluster(ClusterTarget {
                nodes: parse_hosts(value, hosts, 6379)?,
                tls: scheme.starts_with("rediss"),
                auth: parse_auth(userinfo),
            })))
        }
        "etcd" | "etcds" => {
            let (userinfo, hosts, path) = split_authority(rest);
            if path.is_some_and(|p| !p.is_empty()) {
                return Err(Located::at(
                    value,
                    format!(
                        "store `{shown}` has a path; an etcd store is only its endpoints, e.g. `{scheme}://h1:2379,h2:2379`"
                    ),
                ));
            }
            let auth = parse_auth(userinfo);
            if auth.as_ref().is_some_and(|a| a.user().is_none()) {
                return Err(Located::at(
                    value,
                    format!(
                        "store `{shown}` has a password but no user; etcd logs in as a user: `{scheme}://user:password@host:2379`"
                    ),
                ));
            }
            Ok(StoreConfig::Etcd(EtcdTarget {
                endpoints: parse_hosts(value, hosts, 2379)?,
                tls: scheme == "etcds",
                auth,
            }))
        }
        other => Err(Located::at(
            value,
            format!(
                "unknown store scheme `{other}://`; {}",
                suggestion(other, &schemes)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::target::{Credentials, RedisTarget, SentinelTarget, StoreConfig};

    fn store(url: &str) -> Result<StoreConfig, String> {
        crate::parse_service(std::path::Path::new("t.yaml"), &format!("store: {url}\n"))
            .map(|c| c.store)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn sentinel_urls_carry_logins_for_the_data_nodes_and_the_sentinels() {
        let StoreConfig::Redis(RedisTarget::Sentinel(SentinelTarget {
            sentinels,
            master,
            auth,
            db,
            tls,
            sentinel_auth,
            sentinel_tls,
        })) = store("rediss+sentinel://app:p%40ss@s1,s2:26380/mymaster/2?sentinel_username=watch&sentinel_password=s%2Fcret&sentinel_tls=true")
            .unwrap()
        else {
            panic!("not a sentinel store");
        };
        assert_eq!(sentinels, ["s1:26379", "s2:26380"]);
        assert_eq!(
            (master.as_str(), db, tls, sentinel_tls),
            ("mymaster", 2, true, true)
        );
        assert_eq!(auth, Some(Credentials::new(Some("app".into()), "p@ss")));
        assert_eq!(
            sentinel_auth,
            Some(Credentials::new(Some("watch".into()), "s/cret"))
        );

        let StoreConfig::Redis(RedisTarget::Sentinel(SentinelTarget {
            sentinel_auth,
            sentinel_tls,
            ..
        })) = store("redis+sentinel://s1/m?sentinel_password=x").unwrap()
        else {
            panic!("not a sentinel store");
        };
        assert_eq!(
            (sentinel_auth, sentinel_tls),
            (Some(Credentials::new(None, "x")), false)
        );
    }

    #[test]
    fn bad_sentinel_url_options_are_named() {
        let e = store("redis+sentinel://s1/m?sentinel_pasword=x").unwrap_err();
        assert!(
            e.contains("unknown store URL option `sentinel_pasword`")
                && e.contains("`sentinel_password`"),
            "{e}"
        );
        let e = store("redis+sentinel://s1/m?sentinel_tls=maybe").unwrap_err();
        assert!(e.contains("invalid sentinel_tls `maybe`"), "{e}");
        let e = store("redis+sentinel://s1/m?sentinel_username=u").unwrap_err();
        assert!(e.contains("without `sentinel_password`"), "{e}");
    }

    #[test]
    fn etcd_urls_name_endpoints_tls_and_a_user() {
        use crate::target::EtcdTarget;
        assert_eq!(
            store("etcds://sluice:p%40ss@e1,e2:2380").unwrap(),
            StoreConfig::Etcd(EtcdTarget {
                endpoints: vec!["e1:2379".into(), "e2:2380".into()],
                tls: true,
                auth: Some(Credentials::new(Some("sluice".into()), "p@ss")),
            })
        );
        let e = store("etcd://secret@e1").unwrap_err();
        assert!(e.contains("no user") && !e.contains("secret"), "{e}");
        let e = store("etcd://e1:2379/prefix").unwrap_err();
        assert!(e.contains("has a path"), "{e}");
        let e = store("etcd://e1,,e2").unwrap_err();
        assert!(e.contains("empty host"), "{e}");
    }
}
