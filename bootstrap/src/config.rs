//! The cluster file: one TOML document describing every node, the backend,
//! huge pages, the lock-table size and where the cluster secret lives.
//! Every field, its unit and its default: `docs/cluster-file.md`.
//!
//! Promises: a `ClusterConfig` that exists has passed every check below;
//! every rejection is a [`ConfigError`] naming the file, the field (as a path
//! such as `nodes[2].address`) and the problem in one sentence, and carrying
//! every other problem the checks found. Unknown keys
//! are errors. Parsing never panics, whatever the text (see the
//! `config_parse` fuzz target).
//!
//! ```toml
//! secret_file = "secret"        # relative paths are relative to this file
//! lock_table_words = 4096
//! huge_pages = true             # or a page count, e.g. 512
//!
//! [backend]
//! kind = "mlx5"                 # or "emu"
//! device = "mlx5_0"
//! port = 1                      # 1 when left out
//! gid_index = 3                 # RoCE: the port's GID table entry to route
//!                               # by (see `show_gids`); 0 when left out
//! traffic_class = 106           # RoCE: every packet's IP traffic class
//!                               # (DSCP << 2), for a lossless class; 0
//!                               # when left out
//!
//! [[nodes]]
//! id = 0
//! roles = ["memory", "compute"]
//! address = "10.0.0.1:7000"
//! cores = [2, 3]
//! memory = "256MiB"
//! ```

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::auth::{ClusterSecret, SECRET_BYTES_MAX, SECRET_BYTES_MIN};

/// A rejected cluster file: which file, which field, what is wrong — and
/// the file's other problems, so that one run reports them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// A path into the document (`nodes[2].address`), or `line L column C`
    /// where only the TOML parser's position is known.
    pub field: String,
    pub problem: String,
    /// The file's other problems, in the order the checks found them (a
    /// TOML syntax error stops the checks: it is always alone).
    pub more: Vec<ConfigError>,
}

impl ConfigError {
    /// The first of `errors` carrying the others; `None` if there are none.
    fn all(mut errors: Vec<ConfigError>) -> Option<ConfigError> {
        if errors.is_empty() {
            return None;
        }
        let mut first = errors.remove(0);
        first.more.extend(errors);
        Some(first)
    }

    /// How many problems this reports.
    pub fn count(&self) -> usize {
        1 + self.more.len()
    }
}

impl fmt::Display for ConfigError {
    /// One line per problem: `file: field: problem`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}",
            self.file.display(),
            self.field,
            self.problem
        )?;
        for e in &self.more {
            write!(f, "\n{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// The roles a node plays; at least one is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub memory: bool,
    pub compute: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub id: u32,
    pub roles: Roles,
    /// `host:port` of the node's control channel.
    pub address: String,
    /// CPU ids the node pins its cores to; no duplicates.
    pub cores: Vec<u32>,
    /// Bytes this node exports; non-zero exactly when `roles.memory`.
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Emu,
    Mlx5 {
        device: String,
        port: u8,
        /// The GID table index of `port` that RoCE routes by (RoCE v2 over
        /// IPv4 is often 1 or 3); InfiniBand ignores it.
        gid_index: u8,
        /// The traffic class of every packet's global route header (on
        /// RoCE v2 the IP header's DSCP << 2 and ECN bits): what puts
        /// Loch's traffic in a fabric's lossless (PFC) class.
        traffic_class: u8,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugePages {
    Off,
    /// As many as the node's memory needs.
    On,
    /// Exactly this many pages.
    Count(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The file this came from (for messages).
    pub file: PathBuf,
    /// Sorted by id; ids and addresses unique.
    pub nodes: Vec<NodeConfig>,
    pub backend: Backend,
    pub huge_pages: HugePages,
    pub lock_table_words: u64,
    /// Resolved against the config file's directory when relative.
    pub secret_file: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    secret_file: Option<String>,
    lock_table_words: Option<u64>,
    huge_pages: Option<toml::Value>,
    backend: Option<RawBackend>,
    nodes: Option<Vec<RawNode>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    kind: String,
    device: Option<String>,
    port: Option<i64>,
    gid_index: Option<toml::Value>,
    traffic_class: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: i64,
    roles: Vec<String>,
    address: String,
    #[serde(default)]
    cores: Vec<i64>,
    memory: Option<toml::Value>,
}

/// The largest cluster file read: 4096 nodes of a few lines each fit
/// many times over.
pub const CONFIG_BYTES_MAX: u64 = 4 << 20;

/// The most memory a node may export, and the most lock-table bytes: what
/// a global address's 47-bit offset reaches.
pub const MEMORY_BYTES_MAX: u64 = nicdrv::GlobalAddr::MAX_OFFSET;

/// The regular file at `path`, read up to one byte past `max`: the caller
/// refuses more than `max` (a path that names `/dev/zero` is an error
/// then, not memory read without end). Anything but a regular file is an
/// error (`InvalidInput`, "not a regular file") before a byte is read:
/// opened without blocking and looked at as opened, so a FIFO (whose open
/// would wait for a writer without end) or a device is refused, with no
/// window for the path to change between the look and the read. For the
/// files that must be files: a cluster file (its secret's path may be
/// relative to the file's own) and its secret.
pub fn read_file_at_most(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    read_at_most(path, max, false)
}

/// As [`read_file_at_most`], and a pipe too: a FIFO, `/dev/stdin` fed by
/// a pipe, a shell's `<(command)`. A pipe is read until its writers close
/// it (a writer that holds it open and writes nothing keeps the read
/// waiting, as for any reader of a pipe); its open never waits, and a FIFO
/// no writer has opened reads as nothing, which is an error (`InvalidInput`)
/// rather than an empty file. For a workload file and a font.
pub fn read_input_at_most(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    read_at_most(path, max, true)
}

fn read_at_most(path: &Path, max: u64, pipes: bool) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    use std::os::unix::io::AsRawFd;
    let invalid = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    let pipe = pipes && kind.is_fifo();
    if !kind.is_file() && !pipe {
        return Err(invalid(if pipes {
            "not a regular file or a pipe"
        } else {
            "not a regular file"
        }));
    }
    if pipe {
        // The open did not wait for a writer; the read waits for the
        // writers to finish. F_GETFL and F_SETFL take the descriptor
        // `file` owns, open until it drops, and touch nothing else: a
        // FIFO opened by path is its own open file description, so the
        // flag does not change a descriptor this process inherited.
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on an open descriptor with integer arguments
        // reads or writes no memory of ours.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // A regular file's reads ignore O_NONBLOCK.
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if pipe && bytes.is_empty() {
        return Err(invalid(
            "a pipe with nothing in it (a FIFO no writer had opened, or one closed empty)",
        ));
    }
    Ok(bytes)
}

impl ClusterConfig {
    /// Reads, parses and validates `path`, and checks the secret file it
    /// names (exists, at least 32 bytes, not group/world-accessible).
    pub fn load(path: impl AsRef<Path>) -> Result<ClusterConfig, ConfigError> {
        let path = path.as_ref();
        let problem = |problem: String| ConfigError {
            file: path.to_path_buf(),
            field: "(file)".into(),
            problem,
            more: Vec::new(),
        };
        let bytes = read_file_at_most(path, CONFIG_BYTES_MAX)
            .map_err(|e| problem(format!("cannot read the cluster file: {e}")))?;
        if bytes.len() as u64 > CONFIG_BYTES_MAX {
            return Err(problem(format!(
                "the cluster file is larger than {} KiB: not a cluster file",
                CONFIG_BYTES_MAX >> 10
            )));
        }
        let text = String::from_utf8(bytes)
            .map_err(|e| problem(format!("the cluster file is not UTF-8 text: {e}")))?;
        let config = Self::parse(path, &text)?;
        config.secret()?;
        Ok(config)
    }

    /// Parses and validates `text` as if read from `file`; touches no file.
    /// Every field is checked, and every problem found is in the error.
    pub fn parse(file: &Path, text: &str) -> Result<ClusterConfig, ConfigError> {
        let c = Check { file };
        let raw: RawFile = toml::from_str(text).map_err(|e| c.syntax(text, &e))?;
        // In this order, so that the problems of a file are always listed
        // in the same order.
        let mut errs = Vec::new();
        let secret_file = keep(&mut errs, c.secret_file(raw.secret_file));
        let lock_table_words = keep(&mut errs, c.lock_table_words(raw.lock_table_words));
        let huge_pages = keep(&mut errs, c.huge_pages(raw.huge_pages));
        let backend = keep(&mut errs, c.backend(raw.backend));
        let nodes = c.nodes(raw.nodes, &mut errs);
        if let Some(e) = ConfigError::all(errs) {
            return Err(e);
        }
        // No error: every field was kept.
        let (
            Some(secret_file),
            Some(lock_table_words),
            Some(huge_pages),
            Some(backend),
            Some(nodes),
        ) = (secret_file, lock_table_words, huge_pages, backend, nodes)
        else {
            unreachable!("a field without a value has an error");
        };
        Ok(ClusterConfig {
            file: file.to_path_buf(),
            nodes,
            backend,
            huge_pages,
            lock_table_words,
            secret_file,
        })
    }

    pub fn node(&self, id: u32) -> Option<&NodeConfig> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The node that coordinates rendezvous and barriers: the lowest id.
    pub fn coordinator(&self) -> &NodeConfig {
        &self.nodes[0] // parse guarantees at least one node
    }

    /// Reads the cluster secret, checking it is at least 32 bytes and not
    /// readable by group or others. Errors name the `secret_file` field.
    pub fn secret(&self) -> Result<ClusterSecret, ConfigError> {
        let err = |problem: String| ConfigError {
            file: self.file.clone(),
            field: "secret_file".into(),
            problem,
            more: Vec::new(),
        };
        let shown = self.secret_file.display();
        let meta = std::fs::metadata(&self.secret_file)
            .map_err(|e| err(format!("cannot read {shown}: {e}")))?;
        if !meta.is_file() {
            return Err(err(format!("{shown} is not a regular file")));
        }
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(err(format!(
                "{shown} is accessible by group or others (mode {:o}): run `chmod 600 {shown}`",
                mode & 0o777
            )));
        }
        // A secret is a key, not a file's worth of data: a huge file (a
        // path mistaken for the secret's) is refused, never read whole.
        let bytes = read_file_at_most(&self.secret_file, SECRET_BYTES_MAX as u64)
            .map_err(|e| err(format!("cannot read {shown}: {e}")))?;
        if bytes.len() > SECRET_BYTES_MAX {
            return Err(err(format!(
                "{shown} holds more than {SECRET_BYTES_MAX} bytes, more than a secret: is it the right file?"
            )));
        }
        if bytes.len() < SECRET_BYTES_MIN {
            return Err(err(format!(
                "{shown} holds {} bytes; the secret needs at least {SECRET_BYTES_MIN}: run `head -c 32 /dev/urandom > {shown}`",
                bytes.len()
            )));
        }
        Ok(ClusterSecret::new(bytes))
    }
}

/// The value of a check that passed; a failed one's error joins `errs`.
fn keep<T>(errs: &mut Vec<ConfigError>, r: Result<T, ConfigError>) -> Option<T> {
    r.map_err(|e| errs.push(e)).ok()
}

/// The checks of a cluster file's fields, each naming the field it
/// rejects.
struct Check<'a> {
    file: &'a Path,
}

impl Check<'_> {
    fn err(&self, field: &str, problem: String) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            field: field.to_string(),
            problem,
            more: Vec::new(),
        }
    }

    /// A TOML error, named by the key (as a field path where the table is
    /// known) or the place it is at.
    fn syntax(&self, text: &str, e: &toml::de::Error) -> ConfigError {
        let field = match e.span() {
            Some(span) => {
                let (line, col) = line_col(text, span.start);
                let at = text.get(span.clone()).unwrap_or("").trim();
                let key = at
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if at.is_empty() || at.len() > 40 || !key {
                    format!("line {line} column {col}")
                } else {
                    // Name the key as a field path where the table is
                    // known, e.g. `nodes[0].speed`.
                    let field = match table_at(text, span.start) {
                        Some(t) => format!("{t}.{at}"),
                        None => at.to_string(),
                    };
                    format!("{field} (line {line} column {col})")
                }
            }
            None => "(document)".into(),
        };
        self.err(&field, e.message().trim().to_string())
    }

    /// The secret file's path, relative to the cluster file's directory.
    fn secret_file(&self, raw: Option<String>) -> Result<PathBuf, ConfigError> {
        let file = self.file;
        Ok(match raw {
            Some(s) if !s.trim().is_empty() => {
                let p = PathBuf::from(s);
                if p.is_relative() {
                    file.parent().unwrap_or(Path::new("")).join(p)
                } else {
                    p
                }
            }
            Some(_) => return Err(self.err("secret_file", "is empty: give the path of the cluster secret file".into())),
            None => {
                return Err(self.err(
                    "secret_file",
                    "missing: give the path of the cluster secret file, e.g. secret_file = \"/etc/loch/secret\"".into(),
                ))
            }
        })
    }

    fn lock_table_words(&self, raw: Option<u64>) -> Result<u64, ConfigError> {
        Ok(match raw {
            Some(0) => return Err(self.err("lock_table_words", "must be greater than zero".into())),
            Some(n) if n > MEMORY_BYTES_MAX / 8 => {
                return Err(self.err(
                    "lock_table_words",
                    format!(
                    "{n} words is more than a global address's 47-bit offset reaches ({} words)",
                    MEMORY_BYTES_MAX / 8
                ),
                ))
            }
            Some(n) => n,
            None => {
                return Err(self.err(
                    "lock_table_words",
                    "missing: give the lock-table size in 8-byte words".into(),
                ))
            }
        })
    }

    fn huge_pages(&self, raw: Option<toml::Value>) -> Result<HugePages, ConfigError> {
        Ok(match raw {
            None | Some(toml::Value::Boolean(false)) => HugePages::Off,
            Some(toml::Value::Boolean(true)) => HugePages::On,
            Some(toml::Value::Integer(0)) => HugePages::Off,
            Some(toml::Value::Integer(n)) if n > 0 => HugePages::Count(n as u64),
            Some(other) => {
                return Err(self.err(
                    "huge_pages",
                    format!("must be true, false or a page count, not {other}"),
                ))
            }
        })
    }

    fn backend(&self, raw: Option<RawBackend>) -> Result<Backend, ConfigError> {
        let Some(b) = raw else {
            return Err(self.err(
                "backend",
                "missing: add a [backend] table with kind = \"emu\" or \"mlx5\"".into(),
            ));
        };
        match b.kind.as_str() {
            "emu" => {
                if b.device.is_some()
                    || b.port.is_some()
                    || b.gid_index.is_some()
                    || b.traffic_class.is_some()
                {
                    return Err(self.err(
                        "backend",
                        "device, port, gid_index and traffic_class apply only to kind = \"mlx5\""
                            .into(),
                    ));
                }
                Ok(Backend::Emu)
            }
            "mlx5" => self.mlx5(b),
            other => Err(self.err(
                "backend.kind",
                format!("unknown backend `{other}`: use \"emu\" or \"mlx5\""),
            )),
        }
    }

    fn mlx5(&self, b: RawBackend) -> Result<Backend, ConfigError> {
        let device = match b.device {
            Some(d) if !d.is_empty() && !d.contains('/') && d != "." && d != ".." => d,
            Some(d) => {
                return Err(self.err(
                    "backend.device",
                    format!("`{d}` is not a device name such as mlx5_0"),
                ))
            }
            None => {
                return Err(self.err(
                    "backend.device",
                    "missing: name the RDMA device, e.g. device = \"mlx5_0\"".into(),
                ))
            }
        };
        let port = match b.port {
            None => 1,
            Some(p) if (1..=255).contains(&p) => p as u8,
            Some(p) => {
                return Err(self.err(
                    "backend.port",
                    format!("{p} is not a port number (1..=255)"),
                ))
            }
        };
        let gid_index = self.byte(
            "backend.gid_index",
            b.gid_index,
            "a GID table index (0..=255)",
        )?;
        let traffic_class = self.byte(
            "backend.traffic_class",
            b.traffic_class,
            "a traffic class (0..=255; DSCP << 2)",
        )?;
        Ok(Backend::Mlx5 {
            device,
            port,
            gid_index,
            traffic_class,
        })
    }

    /// An optional field holding a byte, 0 when absent; any other value
    /// (out of range, or not an integer) is refused as not `what`.
    fn byte(&self, field: &str, v: Option<toml::Value>, what: &str) -> Result<u8, ConfigError> {
        match v {
            None => Ok(0),
            Some(toml::Value::Integer(n)) if (0..=255).contains(&n) => Ok(n as u8),
            Some(v) => Err(self.err(field, format!("{v} is not {what}"))),
        }
    }

    /// The nodes, sorted by id: ids and addresses unique, at least one
    /// memory and one compute node, at most `NODES_MAX`. Every node's every problem joins
    /// `errs`; `None` if there was any.
    fn nodes(
        &self,
        raw: Option<Vec<RawNode>>,
        errs: &mut Vec<ConfigError>,
    ) -> Option<Vec<NodeConfig>> {
        let raw_nodes = match raw {
            Some(n) if !n.is_empty() => n,
            _ => {
                errs.push(self.err("nodes", "no nodes: add at least one [[nodes]] table".into()));
                return None;
            }
        };
        if raw_nodes.len() > crate::channel::NODES_MAX {
            errs.push(self.err(
                "nodes",
                format!(
                    "{} nodes; a cluster has at most {} (the control channel's rendezvous)",
                    raw_nodes.len(),
                    crate::channel::NODES_MAX
                ),
            ));
            return None;
        }
        let before = errs.len();
        let mut nodes = Vec::with_capacity(raw_nodes.len());
        let mut ids = HashSet::new();
        let mut addresses = HashSet::new();
        let mut all_roles = Vec::with_capacity(raw_nodes.len());
        for (i, n) in raw_nodes.iter().enumerate() {
            let roles = keep(errs, self.roles(i, &n.roles));
            all_roles.push(roles);
            if let Some(node) = self.node(i, n, roles, &mut ids, &mut addresses, errs) {
                nodes.push(node);
            }
        }
        // Which roles the cluster lacks, once every node's roles are
        // known (a misspelt role is its own problem, not this one too).
        let roles: Option<Vec<Roles>> = all_roles.into_iter().collect();
        if let Some(roles) = roles {
            if !roles.iter().any(|r| r.memory) {
                errs.push(self.err("nodes", "no node has the \"memory\" role".into()));
            }
            if !roles.iter().any(|r| r.compute) {
                errs.push(self.err("nodes", "no node has the \"compute\" role".into()));
            }
        }
        if errs.len() > before {
            return None;
        }
        nodes.sort_by_key(|n| n.id);
        Some(nodes)
    }

    /// Node `i` of the file, whose `roles` were checked already (`None`:
    /// they failed); `ids` and `addresses` are the earlier nodes' (this
    /// one's join them). Each field is checked whatever the others hold;
    /// `None` if any failed.
    fn node(
        &self,
        i: usize,
        n: &RawNode,
        roles: Option<Roles>,
        ids: &mut HashSet<u32>,
        addresses: &mut HashSet<String>,
        errs: &mut Vec<ConfigError>,
    ) -> Option<NodeConfig> {
        let f = |name: &str| format!("nodes[{i}].{name}");
        let id = keep(
            errs,
            u32::try_from(n.id)
                .map_err(|_| {
                    self.err(
                        &f("id"),
                        format!("{} is not a node id (0..=4294967295)", n.id),
                    )
                })
                .and_then(|id| match ids.insert(id) {
                    true => Ok(id),
                    false => Err(self.err(&f("id"), format!("duplicate node id {id}"))),
                }),
        );
        let address = keep(
            errs,
            check_address(&n.address)
                .map_err(|p| self.err(&f("address"), p))
                .and_then(|a| match addresses.insert(a.to_ascii_lowercase()) {
                    true => Ok(a),
                    false => Err(self.err(&f("address"), format!("duplicate address {a}"))),
                }),
        );
        let cores = keep(
            errs,
            self.cores(i, &n.cores).and_then(|c| {
                if c.is_empty() && roles.is_some_and(|r| r.compute) {
                    Err(self.err(&f("cores"), "a compute node needs at least one core".into()))
                } else {
                    Ok(c)
                }
            }),
        );
        let memory_bytes = roles.and_then(|r| keep(errs, self.memory(i, n, r)));
        Some(NodeConfig {
            id: id?,
            roles: roles?,
            address: address?,
            cores: cores?,
            memory_bytes: memory_bytes?,
        })
    }

    fn roles(&self, i: usize, raw: &[String]) -> Result<Roles, ConfigError> {
        let f = |name: &str| format!("nodes[{i}].{name}");
        let mut roles = Roles {
            memory: false,
            compute: false,
        };
        for (j, r) in raw.iter().enumerate() {
            let slot = match r.as_str() {
                "memory" => &mut roles.memory,
                "compute" => &mut roles.compute,
                other => {
                    return Err(self.err(
                        &format!("nodes[{i}].roles[{j}]"),
                        format!("unknown role `{other}`: use \"memory\" or \"compute\""),
                    ))
                }
            };
            if *slot {
                return Err(self.err(
                    &format!("nodes[{i}].roles[{j}]"),
                    format!("role `{r}` listed twice"),
                ));
            }
            *slot = true;
        }
        if !roles.memory && !roles.compute {
            return Err(self.err(
                &f("roles"),
                "empty: give \"memory\", \"compute\" or both".into(),
            ));
        }
        Ok(roles)
    }

    fn cores(&self, i: usize, raw: &[i64]) -> Result<Vec<u32>, ConfigError> {
        let mut cores = Vec::with_capacity(raw.len());
        let mut seen = BTreeSet::new();
        for (j, &c) in raw.iter().enumerate() {
            let core = u32::try_from(c).map_err(|_| {
                self.err(
                    &format!("nodes[{i}].cores[{j}]"),
                    format!("{c} is not a CPU id"),
                )
            })?;
            if !seen.insert(core) {
                return Err(self.err(
                    &format!("nodes[{i}].cores[{j}]"),
                    format!("CPU {core} listed twice"),
                ));
            }
            cores.push(core);
        }
        Ok(cores)
    }

    fn memory(&self, i: usize, n: &RawNode, roles: Roles) -> Result<u64, ConfigError> {
        let f = |name: &str| format!("nodes[{i}].{name}");
        Ok(match (&n.memory, roles.memory) {
            (None, true) => {
                return Err(self.err(
                    &f("memory"),
                    "missing: a memory node must say how much it exports, e.g. memory = \"256MiB\""
                        .into(),
                ))
            }
            (None, false) => 0,
            (Some(_), false) => {
                return Err(self.err(
                    &f("memory"),
                    "only memory nodes export memory: add the \"memory\" role or drop this key"
                        .into(),
                ))
            }
            (Some(v), true) => {
                let bytes = match v {
                    toml::Value::String(s) => {
                        parse_size(s).map_err(|p| self.err(&f("memory"), p))?
                    }
                    toml::Value::Integer(b) => {
                        return Err(self.err(
                            &f("memory"),
                            format!("{b} has no unit: write a string such as \"{b}MiB\" (units: B, KiB, MiB, GiB, TiB)"),
                        ))
                    }
                    other => {
                        return Err(self.err(
                            &f("memory"),
                            format!("{other} is not a size such as \"256MiB\""),
                        ))
                    }
                };
                if bytes == 0 {
                    return Err(self.err(
                        &f("memory"),
                        "is zero: a memory node must export some memory".into(),
                    ));
                }
                if !bytes.is_multiple_of(8) {
                    return Err(self.err(
                        &f("memory"),
                        format!("{bytes} bytes is not a multiple of 8 (memory is exported in 8-byte words)"),
                    ));
                }
                if bytes > MEMORY_BYTES_MAX {
                    return Err(self.err(
                        &f("memory"),
                        format!(
                            "{bytes} bytes is more than a global address's 47-bit offset reaches ({MEMORY_BYTES_MAX} bytes)"
                        ),
                    ));
                }
                bytes
            }
        })
    }
}

/// The table a byte offset lies in, from the last header above it:
/// `nodes[k]` for the k-th `[[nodes]]`, `backend`, or None at top level.
/// (A heuristic for messages only; inline tables are not tracked.)
fn table_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset.min(text.len()))?;
    let mut table = None;
    let mut nodes = 0usize;
    for line in before.lines() {
        let l = line.trim();
        if l.starts_with("[[") {
            let name = l
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim();
            if name == "nodes" {
                nodes += 1;
                table = Some(format!("nodes[{}]", nodes - 1));
            } else {
                table = Some(name.to_string());
            }
        } else if l.starts_with('[') {
            table = Some(
                l.trim_start_matches('[')
                    .split(']')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string(),
            );
        }
    }
    table
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// `host:port`, port 1..=65535, host non-empty (IPv6 in brackets).
fn check_address(a: &str) -> Result<String, String> {
    let bad = |why: &str| format!("`{a}` is not host:port ({why})");
    let (host, port) = a.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(bad("write IPv6 hosts in brackets, e.g. [::1]:7000"));
    }
    if host.chars().any(|c| c.is_whitespace()) {
        return Err(bad("space in host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 => Ok(a.to_string()),
        _ => Err(bad("port must be 1..=65535")),
    }
}

/// Sizes such as `"256MiB"`, `"1 GiB"`, `"4096B"`: a unit is required
/// (a bare number is refused rather than read as bytes), and binary units
/// only, so nobody wonders whether "M" meant 10^6.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let bad = || format!("`{s}` is not a size such as \"256MiB\" (units: B, KiB, MiB, GiB, TiB)");
    if num.is_empty() {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match unit.trim() {
        "" => {
            return Err(format!(
                "`{s}` has no unit: write \"{num}MiB\", or \"{num}B\" for bytes (units: B, KiB, MiB, GiB, TiB)"
            ))
        }
        "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}
