//! A cluster as one process per node on this host: a private directory for
//! its files, free ports for its control channel, and the node processes
//! themselves — started, waited for with a bound, stopped by SIGTERM, and
//! killed and reaped on every path out (a panic included) so that no node
//! outlives its cluster; a launcher killed outright (SIGKILL, the OOM
//! killer), which runs no code on its way out, has its nodes sent SIGTERM
//! by the kernel. What the processes run (`loch node` and its cluster
//! file) is the caller's; this owns their lifetimes.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A fresh directory only this user can enter (0700), for a cluster file,
/// its secret and the nodes' files; removed with everything in it on drop.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Creates `$TMPDIR/loch-<tag>-<pid>-<ns>`.
    pub fn new(tag: &str) -> Result<PrivateDir, String> {
        let path = std::env::temp_dir().join(format!(
            "loch-{tag}-{}-{}",
            std::process::id(),
            nicdrv::clock::unix_ns()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(PrivateDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `data` to `name` in the directory, readable by this user
    /// only (0600), replacing any file of that name.
    pub fn write(&self, name: &str, data: &[u8]) -> Result<PathBuf, String> {
        let p = self.path.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&p)
            .map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        f.write_all(data)
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        Ok(p)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `n` distinct free TCP ports on 127.0.0.1. Every listener is held until
/// all are bound, so the ports differ; another process may still take one
/// before a node binds it (rare: that node then fails with a clear "cannot
/// listen" error).
pub fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let ls: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot find a free port: {e}"))?;
    ls.iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// Waits for `c` until `by`; `None` if it is still running then (or cannot
/// be waited for).
pub fn wait_until(c: &mut Child, by: Instant) -> Option<ExitStatus> {
    loop {
        match c.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < by => std::thread::sleep(Duration::from_millis(10)),
            _ => return None,
        }
    }
}

/// One node's process, and the threads draining its piped output (so a
/// full pipe never stalls a node while another is waited for).
#[derive(Debug)]
struct NodeProcess {
    id: u32,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

/// The node processes of a cluster, by node id. Drop kills (SIGKILL) and
/// reaps every one still running.
#[derive(Debug, Default)]
pub struct Processes {
    nodes: Vec<NodeProcess>,
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<String>> {
    pipe.map(|mut p| {
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = p.read_to_string(&mut out);
            out
        })
    })
}

impl Processes {
    pub fn new() -> Processes {
        Processes::default()
    }

    /// Starts node `id`'s process from `cmd` (stdin closed). Whatever of
    /// stdout and stderr `cmd` pipes is collected for [`Processes::output`].
    /// The node is sent SIGTERM when the thread calling this ends (Linux's
    /// parent-death signal): call it from a thread that outlives the
    /// cluster, as a launcher's main thread does.
    /// A node's earlier process, once exited, is replaced (a compute node
    /// started again for the next run); a running one is an error.
    pub fn spawn(&mut self, id: u32, cmd: &mut Command) -> Result<(), String> {
        if let Some(i) = self.nodes.iter().position(|n| n.id == id) {
            if matches!(self.nodes[i].child.try_wait(), Ok(None)) {
                return Err(format!("node {id} is still running"));
            }
            self.nodes.remove(i);
        }
        let launcher = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec, where
        // only async-signal-safe calls are allowed: prctl(2) and getppid(2)
        // are plain system calls that allocate and lock nothing.
        unsafe {
            cmd.pre_exec(move || {
                // SIGTERM to the node when the thread that started it ends
                // (the launcher dies): a node stops on SIGTERM as on a
                // stop, removing its memory files, where SIGKILL on the
                // launcher left memory nodes serving nobody, holding
                // their memory, until someone found them.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher died before the request took: nothing
                // would send it now. (An error without allocating: ESRCH,
                // no such process.)
                if libc::getppid() != launcher {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            })
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start node {id}: {e}"))?;
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        self.nodes.push(NodeProcess {
            id,
            child,
            stdout,
            stderr,
        });
        Ok(())
    }

    /// Node `id`, which this started: the methods below take only those
    /// ids (the caller's own, from [`Processes::ids`]), and another is a
    /// caller's bug, asserted.
    fn node(&mut self, id: u32) -> &mut NodeProcess {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("node {id} was never started"))
    }

    /// The ids of the nodes started, in order.
    pub fn ids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// The operating system's process id of node `id`.
    pub fn pid(&mut self, id: u32) -> u32 {
        self.node(id).child.id()
    }

    /// Waits for node `id` until `by`; `None` if it is still running.
    pub fn wait(&mut self, id: u32, by: Instant) -> Option<ExitStatus> {
        wait_until(&mut self.node(id).child, by)
    }

    /// What node `id` printed on its piped stdout and stderr, once it has
    /// exited (empty for a stream not piped, or taken before).
    pub fn output(&mut self, id: u32) -> (String, String) {
        let n = self.node(id);
        let join =
            |h: Option<JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        (join(n.stdout.take()), join(n.stderr.take()))
    }

    /// Sends `signal` to node `id` if it is still running.
    pub fn signal(&mut self, id: u32, signal: libc::c_int) {
        let c = &mut self.node(id).child;
        if matches!(c.try_wait(), Ok(None)) {
            // SAFETY: kill(2) takes no pointers; the pid is our own child's,
            // not yet reaped (try_wait just saw it running), so it cannot
            // name another process.
            unsafe { libc::kill(c.id() as libc::pid_t, signal) };
        }
    }

    /// Waits for node `id` until `by` as [`Processes::wait`] does, calling
    /// `tick` every 10 ms meanwhile (to watch for a stop request and pass
    /// it on: `kill -INT` reaches only the launcher, Ctrl-C at a terminal
    /// the whole group).
    pub fn wait_watching(
        &mut self,
        id: u32,
        by: Instant,
        mut tick: impl FnMut(&mut Processes),
    ) -> Option<ExitStatus> {
        loop {
            let step = (Instant::now() + Duration::from_millis(10)).min(by);
            if let Some(s) = self.wait(id, step) {
                return Some(s);
            }
            if Instant::now() >= by {
                return None;
            }
            tick(self);
        }
    }

    /// Stops node `id`: SIGTERM, then a wait until `by`; its exit status,
    /// `None` if it did not stop in time.
    pub fn terminate(&mut self, id: u32, by: Instant) -> Option<ExitStatus> {
        self.signal(id, libc::SIGTERM);
        self.wait(id, by)
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if matches!(n.child.try_wait(), Ok(None)) {
                let _ = n.child.kill();
                let _ = n.child.wait();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_dir_is_private_and_gone_on_drop() {
        let d = PrivateDir::new("test").unwrap();
        let f = d.write("secret", b"abc").unwrap();
        d.write("secret", b"xy").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"xy");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(d.path()), 0o700);
        assert_eq!(mode(&f), 0o600);
        let p = d.path().to_path_buf();
        drop(d);
        assert!(!p.exists());
    }

    #[test]
    fn ports_are_distinct() {
        let mut p = free_ports(8).unwrap();
        p.sort_unstable();
        p.dedup();
        assert_eq!(p.len(), 8);
    }

    #[test]
    fn processes_are_waited_for_stopped_and_reaped() {
        let mut ps = Processes::new();
        ps.spawn(
            0,
            Command::new("sh")
                .args(["-c", "echo out; echo err >&2"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )
        .unwrap();
        ps.spawn(1, Command::new("sleep").arg("30")).unwrap();
        ps.spawn(2, Command::new("sleep").arg("30")).unwrap();
        assert!(ps
            .spawn(2, &mut Command::new("true"))
            .unwrap_err()
            .contains("still running"));
        let by = Instant::now() + Duration::from_secs(10);
        assert!(ps.wait(0, by).unwrap().success());
        assert_eq!(ps.output(0), ("out\n".into(), "err\n".into()));
        // An exited node is started again (the next run's compute node).
        ps.spawn(0, &mut Command::new("true")).unwrap();
        assert!(ps.wait(0, by).unwrap().success());
        // Still running: the bounded wait gives up.
        assert!(ps.wait(1, Instant::now()).is_none());
        let s = ps.terminate(1, by).expect("sleep ignores no SIGTERM");
        assert!(!s.success());
        // A watched wait sees the stop its tick sends.
        let mut ticks = 0;
        let s = ps.wait_watching(2, by, |ps| {
            ticks += 1;
            ps.signal(2, libc::SIGINT);
        });
        assert!(!s.expect("SIGINT ends sleep").success());
        assert!(ticks >= 1);
        ps.spawn(3, Command::new("sleep").arg("30")).unwrap();
        let pid = ps.pid(3);
        drop(ps);
        // Reaped on drop: the pid is no longer our child.
        // SAFETY: waitpid(2) with a null status pointer writes nothing.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
        assert_eq!(r, -1);
    }

    /// The launcher's part of the test below, in a process of its own
    /// (ignored: not a test by itself): starts a node (`sleep 30`), says
    /// its pid, and waits to be killed.
    #[test]
    #[ignore = "the launcher of a_node_stops_when_its_launcher_is_killed, run by it"]
    fn launcher_for_a_test() {
        let mut ps = Processes::new();
        ps.spawn(0, Command::new("sleep").arg("30")).unwrap();
        println!("node pid {}", ps.pid(0));
        std::io::stdout().flush().unwrap();
        std::thread::sleep(Duration::from_secs(30));
    }

    /// Whether process `pid` is gone (or a zombie: dead, not yet reaped by
    /// whoever inherited it).
    fn gone(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            // The state follows the command's closing parenthesis.
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z'),
        }
    }

    /// A launcher killed with SIGKILL runs no drop: its node is stopped by
    /// the parent-death signal instead. Before, the node outlived it (a
    /// `loch demo --processes` killed so left its memory nodes serving,
    /// their memory files held).
    #[test]
    fn a_node_stops_when_its_launcher_is_killed() {
        let exe = std::env::current_exe().unwrap();
        let mut launcher = Command::new(exe)
            .args([
                "--exact",
                "processes::tests::launcher_for_a_test",
                "--ignored",
                "--nocapture",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(launcher.stdout.take().unwrap());
        let mut line = String::new();
        let pid = loop {
            line.clear();
            let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            assert!(n > 0, "the launcher ended without starting its node");
            if let Some(p) = line.trim().strip_prefix("node pid ") {
                break p.parse::<u32>().unwrap();
            }
        };
        assert!(!gone(pid), "the node runs");
        launcher.kill().unwrap();
        launcher.wait().unwrap();
        let by = Instant::now() + Duration::from_secs(10);
        while !gone(pid) && Instant::now() < by {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !gone(pid) {
            // SAFETY: kill(2) takes no pointers; the pid was the node's,
            // seen alive just now.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("node {pid} outlived its launcher by 10 s");
        }
    }
}
