//! The configuration store of a real cluster: etcd, through its v3 JSON
//! gateway (`POST /v3/kv/range`, `POST /v3/kv/txn`) with a blocking HTTP
//! client — no async runtime. The configuration is one key; its etcd
//! `mod_revision` is the revision [`ConfigStore`] compares on, so a
//! compare-and-swap is one etcd transaction: compare the key's
//! `mod_revision` (or, before the first configuration, its
//! `create_revision` = 0, which etcd reports for a key that is absent),
//! put on success, read it back on failure.
//!
//! The gateway speaks proto3 JSON: bytes are base64, 64-bit integers are
//! strings, and fields at their default (0, false, empty) are left out —
//! a failed transaction has no `succeeded`, an absent key no `kvs`.
//!
//! [`LocalEtcd`] starts a real etcd server on 127.0.0.1 with a data
//! directory of its own and stops it by its pid: what tests and the
//! single-host demo use.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use std::time::Duration;
use txn::config::{check_successor, ConfigError, ConfigStore, Configuration, Stored, Swap};

/// The key a cluster's configuration lives under unless told otherwise.
pub const DEFAULT_KEY: &str = "/loch/configuration";

/// A configuration store in etcd.
pub struct EtcdStore {
    agent: ureq::Agent,
    /// `http://host:port`, no trailing slash.
    endpoint: String,
    key: String,
}

impl EtcdStore {
    /// A store at `endpoint` (`http://127.0.0.1:2379`), the configuration
    /// under `key`, every request bounded by `timeout`.
    pub fn new(endpoint: &str, key: &str, timeout: Duration) -> Result<EtcdStore, ConfigError> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        if !endpoint.starts_with("http://") {
            return Err(ConfigError::Store(format!(
                "etcd endpoint {endpoint:?}: only http:// endpoints are supported"
            )));
        }
        if key.is_empty() {
            return Err(ConfigError::Store("an empty etcd key".into()));
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            // A non-2xx answer is read as the gateway's error body.
            .http_status_as_error(false)
            .build();
        Ok(EtcdStore {
            agent: ureq::Agent::new_with_config(config),
            endpoint,
            key: key.to_string(),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// One gateway call: `body` to `/v3/kv/{what}`, the answer as JSON.
    fn call(&self, what: &str, body: Value) -> Result<Value, ConfigError> {
        let url = format!("{}/v3/kv/{what}", self.endpoint);
        let store = |s: String| ConfigError::Store(s);
        let mut resp = self
            .agent
            .post(&url)
            .send_json(&body)
            .map_err(|e| store(format!("cannot reach etcd at {url}: {e}")))?;
        let status = resp.status();
        let v: Value = resp
            .body_mut()
            .read_json()
            .map_err(|e| store(format!("etcd at {url} answered {status} with no JSON: {e}")))?;
        if !status.is_success() {
            let msg = v.get("message").or_else(|| v.get("error"));
            return Err(store(format!(
                "etcd at {url} refused the request ({status}): {}",
                msg.and_then(Value::as_str).unwrap_or("no message")
            )));
        }
        Ok(v)
    }

    /// Puts an empty mark at `{key}/{name}`, beside the configuration:
    /// machines that cannot meet on the bootstrap channel (its
    /// coordinator may have failed) meet here.
    pub fn mark(&self, name: &str) -> Result<(), ConfigError> {
        let key = format!("{}/{name}", self.key);
        self.call("put", json!({ "key": B64.encode(&key), "value": "" }))?;
        Ok(())
    }

    /// The names of the marks under `{key}/{prefix}` ([`Self::mark`]).
    pub fn marks(&self, prefix: &str) -> Result<Vec<String>, ConfigError> {
        let base = format!("{}/", self.key);
        let from = format!("{base}{prefix}");
        // Every key that starts with `from`: up to its last byte plus one
        // (no key ends in 0xff here: keys are UTF-8 and end in ASCII).
        let mut end = from.clone().into_bytes();
        let last = end.pop().ok_or_else(|| nonsense("an empty prefix"))?;
        end.push(
            last.checked_add(1)
                .ok_or_else(|| nonsense("a prefix ending in 0xff"))?,
        );
        let v = self.call(
            "range",
            json!({ "key": B64.encode(&from), "range_end": B64.encode(&end), "keys_only": true }),
        )?;
        let kvs = match v.get("kvs") {
            None => return Ok(Vec::new()),
            Some(Value::Array(kvs)) => kvs,
            Some(_) => return Err(nonsense("kvs is not a list")),
        };
        kvs.iter()
            .map(|kv| {
                let k = kv
                    .get("key")
                    .and_then(Value::as_str)
                    .ok_or_else(|| nonsense("a mark without its key"))?;
                let k = B64
                    .decode(k)
                    .map_err(|e| nonsense(&format!("key is not base64: {e}")))?;
                let k = String::from_utf8(k).map_err(|_| nonsense("a key that is not UTF-8"))?;
                k.strip_prefix(&base)
                    .map(str::to_string)
                    .ok_or_else(|| nonsense("a key outside the range asked for"))
            })
            .collect()
    }

    /// The stored configuration in a range answer's `kvs`, if any.
    fn stored_in(&self, range: &Value) -> Result<Option<Stored>, ConfigError> {
        let kvs = match range.get("kvs") {
            None => return Ok(None),
            Some(Value::Array(kvs)) => kvs,
            Some(_) => return Err(nonsense("kvs is not a list")),
        };
        let kv = match kvs.as_slice() {
            [] => return Ok(None),
            [kv] => kv,
            _ => return Err(nonsense("more than one value under one key")),
        };
        let revision = int(kv, "mod_revision")?;
        let value = match kv.get("value") {
            // An empty value is left out: it is no configuration.
            None => Vec::new(),
            Some(v) => B64
                .decode(
                    v.as_str()
                        .ok_or_else(|| nonsense("value is not a string"))?,
                )
                .map_err(|e| nonsense(&format!("value is not base64: {e}")))?,
        };
        Ok(Some(Stored {
            revision,
            config: Configuration::decode(&value)?,
        }))
    }
}

fn nonsense(what: &str) -> ConfigError {
    ConfigError::Store(format!("etcd answered nonsense: {what}"))
}

/// A proto3 JSON int64 (a string, or absent for 0).
fn int(v: &Value, field: &str) -> Result<u64, ConfigError> {
    match v.get(field) {
        None => Ok(0),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| nonsense(&format!("{field} = {s:?} is not a number"))),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| nonsense(&format!("{field} = {n} is not a revision"))),
        Some(_) => Err(nonsense(&format!("{field} is not a number"))),
    }
}

impl ConfigStore for EtcdStore {
    fn read(&self) -> Result<Option<Stored>, ConfigError> {
        let v = self.call("range", json!({ "key": B64.encode(&self.key) }))?;
        self.stored_in(&v)
    }

    fn cas(&self, expected: Option<u64>, new: &Configuration) -> Result<Swap, ConfigError> {
        // The number rule needs the stored configuration: read it at the
        // revision compared, refuse a stale or invalid successor, and let
        // the transaction catch any write since.
        let stored = self.read()?;
        if stored.as_ref().map(|s| s.revision) != expected {
            return Ok(Swap::Lost(stored));
        }
        check_successor(stored.as_ref().map(|s| &s.config), new)?;
        let key = B64.encode(&self.key);
        let compare = match expected {
            None => {
                json!({"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"})
            }
            Some(r) => {
                json!({"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": r.to_string()})
            }
        };
        let v = self.call(
            "txn",
            json!({
                "compare": [compare],
                "success": [{"request_put": {"key": key, "value": B64.encode(new.encode())}}],
                "failure": [{"request_range": {"key": key}}],
            }),
        )?;
        let header = v.get("header").ok_or_else(|| nonsense("no header"))?;
        if v.get("succeeded").and_then(Value::as_bool).unwrap_or(false) {
            return Ok(Swap::Done(int(header, "revision")?));
        }
        let range = v
            .get("responses")
            .and_then(|r| r.get(0))
            .and_then(|r| r.get("response_range"))
            .ok_or_else(|| nonsense("a failed transaction without its read"))?;
        Ok(Swap::Lost(self.stored_in(range)?))
    }
}

/// A real etcd server on 127.0.0.1, its data in a fresh directory, stopped
/// (by its pid) and the directory removed on drop.
pub struct LocalEtcd {
    child: std::process::Child,
    dir: std::path::PathBuf,
    endpoint: String,
}

/// The etcd binary: `$LOCH_ETCD`, else `etcd` on the PATH.
pub fn etcd_binary() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("LOCH_ETCD") {
        return Some(p.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

/// Two ports free on 127.0.0.1 just now (the OS picks them).
fn free_ports() -> std::io::Result<(u16, u16)> {
    let a = std::net::TcpListener::bind("127.0.0.1:0")?;
    let b = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

impl LocalEtcd {
    /// Starts etcd and waits (up to `ready_within`) until it answers.
    pub fn start(ready_within: Duration) -> Result<LocalEtcd, String> {
        let bin = etcd_binary().ok_or("no etcd binary (install etcd-server, or set LOCH_ETCD)")?;
        let dir = std::env::temp_dir().join(format!(
            "loch-etcd-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (client, peer) = free_ports().map_err(|e| format!("choosing ports: {e}"))?;
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log")).map_err(|e| e.to_string())?;
        let child = std::process::Command::new(&bin)
            .arg("--name")
            .arg("loch")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--listen-client-urls")
            .arg(&endpoint)
            .arg("--advertise-client-urls")
            .arg(&endpoint)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("loch={peer_url}"))
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let mut me = LocalEtcd {
            child,
            dir,
            endpoint,
        };
        let store = me.store(DEFAULT_KEY).map_err(|e| e.to_string())?;
        let until = std::time::Instant::now() + ready_within;
        loop {
            match store.read() {
                Ok(_) => return Ok(me),
                Err(e) if std::time::Instant::now() >= until => {
                    return Err(format!("etcd did not answer within {ready_within:?}: {e}"))
                }
                Err(_) => {}
            }
            if let Ok(Some(status)) = me.child.try_wait() {
                let log = std::fs::read_to_string(me.dir.join("etcd.log")).unwrap_or_default();
                let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                return Err(format!("etcd exited ({status}) before answering: {tail}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A store on this server, the configuration under `key`.
    pub fn store(&self, key: &str) -> Result<EtcdStore, ConfigError> {
        EtcdStore::new(&self.endpoint, key, Duration::from_secs(2))
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        // Only a child not yet reaped still owns its pid.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child's pid: try_wait just said it
            // has not been reaped, and nothing reaps it before the wait
            // below, so the pid cannot have been reused.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
