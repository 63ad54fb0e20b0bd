//! Connections to the three kinds of deployment.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Cmd, ConnectionAddr, Pipeline, RedisFuture, Value};
use tokio::sync::OnceCell;

use super::cluster::ClusterBackend;
use super::{RedisStoreOptions, map_error};
use crate::{SentinelTarget, StoreError};

pub(super) enum Backend {
    Standalone {
        client: redis::Client,
        conn: OnceCell<ConnectionManager>,
    },
    Sentinel(SentinelBackend),
    Cluster(ClusterBackend),
}

/// Any of the connections, usable wherever redis-rs wants a connection.
pub(super) enum Conn {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Manager(c) => c.req_packed_command(cmd),
            Conn::Multiplexed(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Manager(c) => c.get_db(),
            Conn::Multiplexed(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

fn addr(host_port: &str, tls: bool) -> Result<ConnectionAddr, StoreError> {
    let (host, port) = host_port
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?)))
        .ok_or_else(|| {
            StoreError::Refused(format!("invalid address `{host_port}`; write host:port"))
        })?;
    Ok(if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    })
}

/// Sentinel: asks the Sentinels for the master, keeps one multiplexed connection to it, and
/// forgets it on any error that may mean a failover (I/O, timeout, READONLY) and on Sentinel's
/// `+switch-master` announcement, so the next call asks again.
///
/// Redis replicates asynchronously, so a failover can promote a replica that lacks the last
/// writes, and the old master keeps accepting writes until Sentinel demotes it. So that no
/// acknowledged count is lost: a flush to a master with replicas is acknowledged only once a
/// replica has it (`WAIT 1`); a master that has lost the replicas it had (its replica was
/// just promoted) is not written to until Sentinel announces the new master or 10 s pass;
/// after an announcement only the announced master is used. A flush that is not acknowledged
/// keeps its counts and sends them again: at worst counted twice, never lost.
pub(super) struct SentinelBackend {
    client: tokio::sync::Mutex<SentinelClient>,
    current: Arc<Mutex<Option<MultiplexedConnection>>>,
    /// How the `+switch-master` watcher reaches each Sentinel (address, login, TLS).
    sentinels: Vec<redis::ConnectionInfo>,
    tls_root_pem: Option<Vec<u8>>,
    master: String,
    watching: AtomicBool,
    switches: Arc<AtomicU64>,
    /// The master announced by the last `+switch-master`.
    announced: Arc<Mutex<Option<(String, u16)>>>,
    /// Replicas of the master of the current connection (ROLE when connecting).
    pub(super) replicas: AtomicUsize,
    /// Since when the named master has had no replica while the previous one had some.
    lonely_since: Mutex<Option<tokio::time::Instant>>,
}

impl SentinelBackend {
    pub(super) fn new(
        target: &SentinelTarget,
        options: &RedisStoreOptions,
    ) -> Result<Self, StoreError> {
        let SentinelTarget {
            sentinels,
            master,
            auth,
            db,
            tls,
            sentinel_auth,
            sentinel_tls,
        } = target;
        let addrs = sentinels
            .iter()
            .map(|s| addr(s, *sentinel_tls))
            .collect::<Result<Vec<_>, _>>()?;
        let certificates = || redis::TlsCertificates {
            client_tls: None,
            root_cert: options.tls_root_pem.clone(),
        };
        let mut builder =
            SentinelClientBuilder::new(addrs.clone(), master, SentinelServerType::Master)
                .map_err(|e| map_error(&e))?
                .set_client_to_redis_db(i64::from(*db));
        if let Some(login) = auth {
            if let Some(user) = login.user() {
                builder = builder.set_client_to_redis_username(user);
            }
            builder = builder.set_client_to_redis_password(login.password());
        }
        if *tls {
            builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
            if options.tls_root_pem.is_some() {
                builder = builder.set_client_to_redis_certificates(certificates());
            }
        }
        let mut login = redis::RedisConnectionInfo::default();
        if let Some(credentials) = sentinel_auth {
            if let Some(user) = credentials.user() {
                builder = builder.set_client_to_sentinel_username(user);
                login = login.set_username(user);
            }
            builder = builder.set_client_to_sentinel_password(credentials.password());
            login = login.set_password(credentials.password());
        }
        if *sentinel_tls {
            builder = builder.set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
            if options.tls_root_pem.is_some() {
                builder = builder.set_client_to_sentinel_certificates(certificates());
            }
        }
        let client = builder.build().map_err(|e| map_error(&e))?;
        let sentinels = addrs
            .into_iter()
            .map(|a| {
                redis::IntoConnectionInfo::into_connection_info(a)
                    .map(|info| info.set_redis_settings(login.clone()))
                    .map_err(|e| map_error(&e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            client: tokio::sync::Mutex::new(client),
            current: Arc::new(Mutex::new(None)),
            sentinels,
            tls_root_pem: options.tls_root_pem.clone().filter(|_| *sentinel_tls),
            master: master.clone(),
            watching: AtomicBool::new(false),
            switches: Arc::new(AtomicU64::new(0)),
            announced: Arc::new(Mutex::new(None)),
            replicas: AtomicUsize::new(0),
            lonely_since: Mutex::new(None),
        })
    }

    pub(super) fn switches(&self) -> u64 {
        self.switches.load(Ordering::Relaxed)
    }

    /// Starts (once, from inside the runtime) a task that listens for `+switch-master` on the
    /// Sentinels (one at a time, moving on when one goes away) and drops the connection to the
    /// old master as soon as this target's master changes. It ends when the store is dropped.
    fn watch_switches(&self) {
        if self.watching.swap(true, Ordering::Relaxed) || self.sentinels.is_empty() {
            return;
        }
        let current = Arc::downgrade(&self.current);
        let (switches, announced) = (self.switches.clone(), self.announced.clone());
        let (sentinels, master) = (self.sentinels.clone(), self.master.clone());
        let roots = self.tls_root_pem.clone();
        tokio::spawn(async move {
            use futures_util::StreamExt as _;
            for sentinel in sentinels.iter().cycle() {
                if current.strong_count() == 0 {
                    return;
                }
                let subscribe = async {
                    let client = match &roots {
                        Some(pem) => redis::Client::build_with_tls(
                            sentinel.clone(),
                            redis::TlsCertificates {
                                client_tls: None,
                                root_cert: Some(pem.clone()),
                            },
                        )?,
                        None => redis::Client::open(sentinel.clone())?,
                    };
                    let mut pubsub = client.get_async_pubsub().await?;
                    pubsub.subscribe("+switch-master").await?;
                    Ok::<_, redis::RedisError>(pubsub)
                };
                let Ok(Ok(pubsub)) = tokio::time::timeout(Duration::from_secs(2), subscribe).await
                else {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                };
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    let Some(current) = current.upgrade() else {
                        return;
                    };
                    // "<master name> <old ip> <old port> <new ip> <new port>"
                    let payload: String = message.get_payload().unwrap_or_default();
                    let parts: Vec<&str> = payload.split_whitespace().collect();
                    if parts.first() != Some(&master.as_str()) {
                        continue;
                    }
                    if let (Some(host), Some(Ok(port))) =
                        (parts.get(3), parts.get(4).map(|p| p.parse::<u16>()))
                    {
                        *announced.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(((*host).to_owned(), port));
                    }
                    current.lock().unwrap_or_else(|p| p.into_inner()).take();
                    switches.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(master = %master, switch = %payload, "Sentinel announced a new master");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    pub(super) async fn connection(&self, options: &RedisStoreOptions) -> Result<Conn, StoreError> {
        self.watch_switches();
        if let Some(c) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(Conn::Multiplexed(c));
        }
        let (client, is_announced) = self.named_master().await?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.longest_call()));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| map_error(&e))?;
        // Right after a failover a Sentinel may still name the old master: check its role.
        let role: Value = redis::cmd("ROLE")
            .query_async(&mut conn)
            .await
            .map_err(|e| map_error(&e))?;
        let Some(replicas) = master_replicas(&role) else {
            return Err(StoreError::Unavailable(
                "the server Sentinel named is not a master yet".into(),
            ));
        };
        self.check_not_lonely(replicas, is_announced)?;
        self.replicas.store(replicas, Ordering::Relaxed);
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn.clone());
        Ok(Conn::Multiplexed(conn))
    }

    /// The master the Sentinels name, and whether it is the one the last `+switch-master`
    /// announced; an error while they still name another than the announced one.
    async fn named_master(&self) -> Result<(redis::Client, bool), StoreError> {
        let client =
            self.client
                .lock()
                .await
                .async_get_client()
                .await
                .map_err(|e| match map_error(&e) {
                    StoreError::Refused(m) => StoreError::Refused(format!(
                        "the Sentinels did not name master `{}`: {m}",
                        self.master
                    )),
                    other => other,
                })?;
        let resolved = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Some((host.clone(), *port))
            }
            _ => None,
        };
        let announced = self
            .announced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let is_announced = announced.is_some() && announced == resolved;
        if let (Some(expected), Some(resolved)) = (&announced, &resolved)
            && expected != resolved
        {
            return Err(StoreError::Unavailable(format!(
                "Sentinel still names {}:{} as master; {}:{} was announced",
                resolved.0, resolved.1, expected.0, expected.1
            )));
        }
        Ok((client, is_announced))
    }

    /// A master that has lost its replicas (while the previous one had some) is not used for
    /// 10 s unless a `+switch-master` announced it: its replica may just have been promoted,
    /// and this master's writes would be lost.
    fn check_not_lonely(&self, replicas: usize, is_announced: bool) -> Result<(), StoreError> {
        let had = self.replicas.load(Ordering::Relaxed);
        let mut lonely = self.lonely_since.lock().unwrap_or_else(|p| p.into_inner());
        if replicas == 0 && had > 0 && !is_announced {
            let since = *lonely.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() < Duration::from_secs(10) {
                return Err(StoreError::Unavailable(
                    "the master Sentinel names has lost its replicas (a failover in progress?); waiting for the announcement".into(),
                ));
            }
        }
        *lonely = None;
        Ok(())
    }

    pub(super) fn invalidate(&self) {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

/// The replicas a `ROLE` reply lists, or `None` when it is not a master's.
/// ROLE on a master: ["master", offset, [[host, port, offset], ...]].
fn master_replicas(role: &Value) -> Option<usize> {
    let Value::Array(parts) = role else {
        return None;
    };
    if !parts
        .first()
        .is_some_and(|v| matches!(v, Value::BulkString(b) if b == b"master"))
    {
        return None;
    }
    Some(match parts.get(2) {
        Some(Value::Array(list)) => list.len(),
        _ => 0,
    })
}
