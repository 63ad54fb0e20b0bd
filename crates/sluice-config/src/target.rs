//! Where counters are shared: the store a `sluice.yaml` names, as plain data. The store crate
//! connects to these same types, so there is one description of a Redis deployment. Nothing
//! here prints a password: [`Credentials`] shows `***`, a standalone URL is redacted.

use std::fmt;

/// Where counters are shared.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreConfig {
    /// The embedded in-memory store (one process).
    Memory,
    /// A Redis deployment.
    Redis(RedisTarget),
    /// An etcd v3 cluster (synced mode only).
    Etcd(EtcdTarget),
}

/// An etcd v3 cluster: its client endpoints and how to log in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTarget {
    /// Client endpoints, `host:port`, tried in turn when one fails.
    pub endpoints: Vec<String>,
    /// TLS to the endpoints (`etcds://`).
    pub tls: bool,
    /// etcd user and password (etcd's authentication must be enabled on the cluster).
    pub auth: Option<Credentials>,
}

/// A Redis deployment and how to log in.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisTarget {
    /// One server.
    Standalone(StandaloneTarget),
    /// Sentinels monitoring a master.
    Sentinel(SentinelTarget),
    /// A Redis Cluster.
    Cluster(ClusterTarget),
}

/// One Redis server: a `redis://` or `rediss://` (TLS) URL, credentials included. Its `Debug`
/// output redacts the password.
#[derive(Clone, PartialEq, Eq)]
pub struct StandaloneTarget {
    /// The URL as written.
    pub url: String,
}

impl fmt::Debug for StandaloneTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandaloneTarget")
            .field("url", &crate::redact_url(&self.url))
            .finish()
    }
}

/// Redis behind Sentinel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelTarget {
    /// Sentinel addresses, `host:port`.
    pub sentinels: Vec<String>,
    /// The monitored master's name.
    pub master: String,
    /// TLS to the data nodes.
    pub tls: bool,
    /// ACL login for the data nodes.
    pub auth: Option<Credentials>,
    /// Database number.
    pub db: u32,
    /// Login for the Sentinels themselves (`?sentinel_username=..&sentinel_password=..`).
    pub sentinel_auth: Option<Credentials>,
    /// TLS to the Sentinels (`?sentinel_tls=true`).
    pub sentinel_tls: bool,
}

/// Redis Cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTarget {
    /// Seed node addresses, `host:port`.
    pub nodes: Vec<String>,
    /// TLS to the nodes.
    pub tls: bool,
    /// ACL login.
    pub auth: Option<Credentials>,
}

/// A login: an ACL user (or none: the default user) and a password. `Debug` and `Display`
/// show the user and `***`, never the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: Option<String>,
    password: String,
}

impl Credentials {
    /// A login as `user` (or the default user) with `password`.
    pub fn new(user: Option<String>, password: impl Into<String>) -> Self {
        Self {
            user,
            password: password.into(),
        }
    }

    /// The ACL user, if one is named.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password (to hand to the client library; never to a log).
    pub fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Display for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:***", self.user.as_deref().unwrap_or(""))
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_password_is_ever_printed() {
        let credentials = Credentials::new(Some("app".into()), "hunter2");
        let login = Some(credentials.clone());
        let targets = [
            StoreConfig::Redis(RedisTarget::Standalone(StandaloneTarget {
                url: "redis://app:hunter2@h:6379/0".into(),
            })),
            StoreConfig::Redis(RedisTarget::Sentinel(SentinelTarget {
                sentinels: vec!["s:26379".into()],
                master: "m".into(),
                tls: false,
                auth: login.clone(),
                db: 0,
                sentinel_auth: login.clone(),
                sentinel_tls: false,
            })),
            StoreConfig::Redis(RedisTarget::Cluster(ClusterTarget {
                nodes: vec!["n:7000".into()],
                tls: true,
                auth: login.clone(),
            })),
        ];
        for target in &targets {
            let shown = format!("{target:?} {target:#?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("app"), "{shown}");
        }
        assert_eq!(credentials.to_string(), "app:***");
        assert_eq!(credentials.password(), "hunter2");
    }
}
