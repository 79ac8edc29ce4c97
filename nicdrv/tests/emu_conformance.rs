//! The conformance suite on the emu backend, plus what only emu has:
//! several processes, owners that die, files that are not nodes, and
//! latency injection.

use nicdrv::conformance::{self, Harness, RawRig, TaskFactory};
use nicdrv::emu::{Backing, EmuConfig, EmuEndpoint, EmuError, EmuNic, EmuNode, EmuNodeConfig};
use nicdrv::*;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOST: u64 = 4 << 20;
const DM: u64 = 64 << 10;

enum Owner {
    Here(EmuNode),
    Child(Child, PathBuf),
    Gone,
}

struct EmuHarness {
    nic: EmuNic,
    owners: Vec<Owner>,
    endpoints: Vec<EmuEndpoint>,
}

fn shm_path(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    PathBuf::from(format!(
        "/dev/shm/loch-test-{}-{tag}-{n}",
        std::process::id()
    ))
}

/// A memory node of `HOST` and `DM` bytes owned by this process, backed by
/// the file at `path` (which tests read and write as other processes do).
fn file_node(path: &std::path::Path, id: u16) -> EmuNode {
    EmuNode::create(&EmuNodeConfig {
        id,
        host_bytes: HOST,
        dm_bytes: DM,
        backing: Backing::File(path.to_path_buf()),
    })
    .unwrap()
}

/// The node file at `path`, open for reading and writing its words.
fn open_rw(path: &std::path::Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// Waits, looking every `step`, until `ep` reads its owner dead (a death,
/// not a clean close), at most `within`; how long that took.
fn wait_owner_death(ep: &EmuEndpoint, within: Duration, step: Duration) -> Duration {
    let t0 = Instant::now();
    while ep.is_alive() {
        assert!(
            t0.elapsed() < within,
            "owner death not noticed within {within:?}"
        );
        std::thread::sleep(step);
    }
    assert!(ep.owner_died());
    t0.elapsed()
}

/// Starts a child process owning node `id` at `path`.
fn child_owner(path: &std::path::Path, id: u16) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loch-emu-child"))
        .args([
            "own",
            path.to_str().unwrap(),
            &id.to_string(),
            &HOST.to_string(),
            &DM.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "READY", "child failed to create its node");
    child
}

impl EmuHarness {
    fn with_config(cfg: EmuConfig) -> EmuHarness {
        let mut owners = Vec::new();
        let mut endpoints = Vec::new();
        for id in 0..2 {
            let node = EmuNode::create(&EmuNodeConfig {
                id,
                host_bytes: HOST,
                dm_bytes: DM,
                backing: Backing::Memfd,
            })
            .unwrap();
            node.register_all().unwrap();
            endpoints.push(node.endpoint());
            owners.push(Owner::Here(node));
        }
        EmuHarness {
            nic: EmuNic::new(cfg),
            owners,
            endpoints,
        }
    }

    fn new() -> EmuHarness {
        Self::with_config(EmuConfig::default())
    }

    /// Node 0 is owned by another process, attached by path.
    fn with_child_owner() -> EmuHarness {
        let mut h = Self::new();
        let path = shm_path("owner");
        let child = child_owner(&path, 0);
        h.endpoints[0] = EmuEndpoint::attach(&path).unwrap();
        h.owners[0] = Owner::Child(child, path);
        h
    }
}

impl Drop for EmuHarness {
    fn drop(&mut self) {
        for o in &mut self.owners {
            if let Owner::Child(c, p) = o {
                let _ = c.kill();
                let _ = c.wait();
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

fn build_executor(nic: &EmuNic, eps: &[EmuEndpoint], cfg: ExecutorConfig) -> Executor<EmuNic> {
    let cq = nic.create_cq(cfg.qp_depth() * eps.len() as u32).unwrap();
    let qps = eps
        .iter()
        .map(|e| nic.create_qp(&cq, cfg.qp_depth()).unwrap().connect(e))
        .collect();
    let mr = nic
        .register(
            HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
            Access::LOCAL_WRITE,
        )
        .unwrap();
    Executor::new(nic.clone(), cq, qps, mr, cfg).unwrap()
}

impl Harness for EmuHarness {
    type N = EmuNic;

    fn memory_nodes(&self) -> Vec<NodeId> {
        self.endpoints.iter().map(|e| e.node()).collect()
    }
    fn host_bytes(&self, node: NodeId) -> u64 {
        self.endpoints[node as usize].host_bytes()
    }
    fn dm_bytes(&self, node: NodeId) -> u64 {
        self.endpoints[node as usize].dm_bytes()
    }
    fn parallel(&self, threads: usize, tasks: usize, f: TaskFactory<EmuNic>) {
        cluster::cores::run_task_factory(
            threads,
            tasks,
            |_, cfg| build_executor(&self.nic, &self.endpoints, cfg),
            &f,
        );
    }
    fn parallel_on(&self, machines: &[Option<NodeId>], tasks: usize, f: TaskFactory<EmuNic>) {
        cluster::cores::run_task_factory(
            machines.len(),
            tasks,
            |th, cfg| {
                let nic = match machines[th] {
                    Some(n) => self.nic.on_machine(&self.endpoints[n as usize]),
                    None => self.nic.clone(),
                };
                build_executor(&nic, &self.endpoints, cfg)
            },
            &f,
        );
    }
    fn raw(&self, node: NodeId, local_bytes: usize) -> RawRig<EmuNic> {
        let mut cq = self.nic.create_cq(64).unwrap();
        let qp = self
            .nic
            .create_qp(&cq, 16)
            .unwrap()
            .connect(&self.endpoints[node as usize]);
        let mr = self
            .nic
            .register(HeapMem::zeroed(local_bytes).unwrap(), Access::LOCAL_WRITE)
            .unwrap();
        let _ = cq.poll(&mut [Completion::EMPTY; 1]);
        RawRig { cq, qp, mr }
    }
    fn kill_node(&mut self, node: NodeId) {
        match std::mem::replace(&mut self.owners[node as usize], Owner::Gone) {
            Owner::Here(n) => drop(n),
            Owner::Child(mut c, p) => {
                c.kill().unwrap();
                c.wait().unwrap();
                let _ = std::fs::remove_file(p);
                let ep = &self.endpoints[node as usize];
                let took = wait_owner_death(ep, Duration::from_secs(5), Duration::from_micros(100));
                eprintln!("owner death noticed {took:?} after the child was reaped");
            }
            Owner::Gone => {}
        }
    }
}

nicdrv::conformance_suite!(EmuHarness::new());

#[test]
fn dead_node_when_owner_process_is_killed() {
    conformance::dead_node(&mut EmuHarness::with_child_owner());
}

#[test]
fn suite_runs_against_a_node_in_another_process() {
    let h = EmuHarness::with_child_owner();
    conformance::ordering_within_qp(&h);
    conformance::faa_exact_totals(&h, 2, 2, 500);
    conformance::remote_errors(&h);
}

/// N threads × M FAA on one word from several processes at once: the total
/// is exact and every old value was handed out exactly once.
#[test]
fn faa_exact_across_processes() {
    let path = shm_path("faa");
    let node = file_node(&path, 3);
    node.register_all().unwrap();
    let (procs, threads, tasks, per_task) = (3u64, 2u64, 2u64, 1500u64);
    let children: Vec<Child> = (0..procs)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_loch-emu-child"))
                .args([
                    "faa",
                    path.to_str().unwrap(),
                    "64",
                    &threads.to_string(),
                    &tasks.to_string(),
                    &per_task.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut olds = Vec::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.pop(), Some("DONE"));
        olds.extend(lines.iter().map(|l| l.parse::<u64>().unwrap()));
    }
    let total = procs * threads * tasks * per_task;
    olds.sort_unstable();
    assert_eq!(olds.len() as u64, total);
    assert!(
        olds.iter().copied().eq(0..total),
        "an FAA result was duplicated or lost across processes"
    );
    assert_eq!(node.host().load_u64(64), total);
}

#[test]
fn attach_rejects_bad_paths_and_files() {
    match EmuEndpoint::attach("/nonexistent/loch-node") {
        Err(EmuError::Io { .. }) => {}
        other => panic!("expected an I/O error, got {other:?}"),
    }
    let junk = shm_path("junk");
    std::fs::write(&junk, vec![7u8; 8192]).unwrap();
    match EmuEndpoint::attach(&junk) {
        Err(e @ EmuError::NotALochNode { .. }) => {
            assert!(e.to_string().contains("not a Loch memory node"))
        }
        other => panic!("expected NotALochNode, got {other:?}"),
    }
    std::fs::write(&junk, b"tiny").unwrap();
    assert!(matches!(
        EmuEndpoint::attach(&junk),
        Err(EmuError::NotALochNode { .. })
    ));
    std::fs::remove_file(&junk).unwrap();

    // A node file whose owner was killed: attaching says it is dead.
    let path = shm_path("stale");
    let mut child = child_owner(&path, 5);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(matches!(
        EmuEndpoint::attach(&path),
        Err(EmuError::NodeDead { .. })
    ));
    // ... and a new owner may take the stale file over.
    let node = EmuNode::create(&EmuNodeConfig {
        id: 5,
        host_bytes: HOST,
        dm_bytes: 0,
        backing: Backing::File(path.clone()),
    })
    .unwrap();
    let ep = EmuEndpoint::attach(&path).unwrap();
    assert!(ep.is_alive());
    // A second owner of a live node is refused.
    assert!(matches!(
        EmuNode::create(&EmuNodeConfig {
            id: 5,
            host_bytes: HOST,
            dm_bytes: 0,
            backing: Backing::File(path.clone())
        }),
        Err(EmuError::InUse { .. })
    ));
    drop(node);
    assert!(!ep.is_alive(), "a closed node reads as not alive");
    assert!(!path.exists(), "the owner removes its file on close");
}

/// A new owner of a node whose file is stale does not reuse that file in
/// place: processes attached to the old owner still map it (truncating it
/// killed their next access with SIGBUS, and the new header showed them
/// the old node alive again with the new node's memory). They keep the old
/// file, dead; the new node is a file of its own, which the old owner's
/// last mapping, dropped later, leaves at its path.
#[test]
fn a_new_owner_never_reuses_a_file_others_still_map() {
    // Another process's node, attached here, then killed.
    let path = shm_path("retake");
    let mut child = child_owner(&path, 6);
    let old = EmuEndpoint::attach(&path).unwrap();
    assert!(old.is_alive());
    child.kill().unwrap();
    child.wait().unwrap();
    wait_owner_death(&old, Duration::from_secs(10), Duration::from_millis(5));
    let node = file_node(&path, 6);
    assert!(
        !old.is_alive(),
        "the old owner's attacher sees it dead still"
    );
    assert!(old.owner_died());
    let new = EmuEndpoint::attach(&path).unwrap();
    assert!(new.is_alive());
    drop((node, new, old));
    assert!(!path.exists());

    // In one process: the owner closed while an endpoint of its own still
    // maps the node; a new owner takes the path over; the old mapping's
    // last drop leaves the new owner's file where it is.
    let path = shm_path("retake-local");
    let first = file_node(&path, 7);
    let lingering = first.endpoint();
    drop(first);
    let second = file_node(&path, 7);
    assert!(!lingering.is_alive());
    drop(lingering);
    assert!(path.exists(), "the new owner's file stays at its path");
    assert!(EmuEndpoint::attach(&path).unwrap().is_alive());
    drop(second);
    assert!(!path.exists());
}

/// The owner's pid comes from the node's header, which another process
/// wrote: an attacher whose header names some other live process (here
/// this test's own parent) still learns of the owner's death, by its lock
/// (a pidfd of the wrong process never fired); so does one whose header
/// names the attacher itself, as an owner in another pid namespace may
/// (it took the node for one of its own and started no watchdog).
#[test]
fn an_owner_death_is_noticed_whatever_pid_the_header_names() {
    use std::os::unix::fs::FileExt;
    const OWNER_PID: u64 = 48;
    // SAFETY: getppid and getpid have no preconditions.
    let (parent, me) = unsafe { (libc::getppid(), libc::getpid()) };
    for (k, named) in [parent as u64, me as u64].into_iter().enumerate() {
        let path = shm_path("wrongpid");
        let mut child = child_owner(&path, 8 + k as u16);
        open_rw(&path)
            .write_all_at(&named.to_le_bytes(), OWNER_PID)
            .unwrap();
        let ep = EmuEndpoint::attach(&path).unwrap();
        assert!(ep.is_alive());
        child.kill().unwrap();
        child.wait().unwrap();
        wait_owner_death(&ep, Duration::from_secs(5), Duration::from_millis(5));
        drop(ep);
        let _ = std::fs::remove_file(&path);
    }
}

/// A queue pair dropped with completions unpolled takes them with it, and
/// its depth goes back to the CQ: the queue pair made next may fill the CQ
/// and polls only its own (the dropped one's stayed queued: the next one's
/// posts overflowed the queue, a panic mid-post). One made and never
/// connected gives its depth back too (it was lost to the CQ for good).
#[test]
fn dropped_queue_pairs_give_back_their_completions_and_depth() {
    dropped_queue_pairs_on(EmuHarness::new(), Duration::ZERO);
}

/// The same with completions not yet due when the queue pair drops (an
/// injected one-way delay): the next queue pair takes the dropped one's
/// slot on the CQ, and none of the dropped one's completions reaches it,
/// however late they fall due.
#[test]
fn a_reused_slot_gets_none_of_a_dropped_queue_pairs_late_completions() {
    let one_way = Duration::from_millis(2);
    let h = EmuHarness::with_config(EmuConfig {
        latency_ns_one_way: one_way.as_nanos() as u64,
        ..Default::default()
    });
    dropped_queue_pairs_on(h, one_way * 3);
}

/// Makes a queue pair, posts 16 signaled READs, drops it, and polls a
/// second one's 16 on the same CQ, after waiting `settle` (past the first
/// one's completions' due time, where the NIC delays them).
fn dropped_queue_pairs_on(h: EmuHarness, settle: Duration) {
    let mut cq = h.nic.create_cq(16).unwrap();
    let mr = h
        .nic
        .register(HeapMem::zeroed(8 * 16).unwrap(), Access::LOCAL_WRITE)
        .unwrap();
    drop(h.nic.create_qp(&cq, 16).unwrap());
    let post16 = |qp: &mut nicdrv::emu::EmuQp, first: u64| {
        let rkey = conformance::host_rkey(qp);
        let wrs: Vec<WorkRequest> = (0..16u64)
            .map(|i| WorkRequest {
                wr_id: first + i,
                signaled: true,
                op: WrOp::Read {
                    remote: GlobalAddr::host(0, 64 + 8 * i),
                    rkey,
                    local: Sge {
                        // SAFETY: inside the 128 registered bytes.
                        addr: unsafe { mr.as_ptr().add(8 * i as usize) },
                        len: 8,
                        lkey: mr.lkey(),
                    },
                },
            })
            .collect();
        // SAFETY: every SGE lies in `mr`, which outlives the polls below.
        unsafe { qp.post_send(&wrs) }.unwrap();
    };
    let mut first = h.nic.create_qp(&cq, 16).unwrap().connect(&h.endpoints[0]);
    post16(&mut first, 0);
    drop(first);
    let mut second = h.nic.create_qp(&cq, 16).unwrap().connect(&h.endpoints[0]);
    std::thread::sleep(settle);
    assert_eq!(second.outstanding(), 0);
    post16(&mut second, 100);
    let mut got = Vec::new();
    let t0 = Instant::now();
    while got.len() < 16 && t0.elapsed() < Duration::from_secs(10) {
        let mut out = [Completion::EMPTY; 32];
        let n = cq.poll(&mut out);
        got.extend(out[..n].iter().map(|c| (c.wr_id, c.status)));
    }
    let want: Vec<(u64, WcStatus)> = (100..116).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(got, want);
    let mut out = [Completion::EMPTY; 4];
    assert_eq!(cq.poll(&mut out), 0, "nothing of the dropped queue pair");
}

#[test]
fn bad_node_configs_are_refused() {
    for (host, dm) in [(0u64, 0u64), (12, 0), (4096, 3), (1 << 48, 0)] {
        let r = EmuNode::create(&EmuNodeConfig {
            id: 0,
            host_bytes: host,
            dm_bytes: dm,
            backing: Backing::Memfd,
        });
        assert!(
            matches!(r, Err(EmuError::BadConfig(_))),
            "host {host} dm {dm}"
        );
    }
}

#[test]
fn created_files_are_private_to_the_user() {
    use std::os::unix::fs::PermissionsExt;
    let path = shm_path("mode");
    let _node = file_node(&path, 1);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

/// With injected latency a verb completes no sooner than two one-way
/// delays after it was posted, and polling before then returns nothing.
#[test]
fn latency_injection_delays_completions() {
    let one_way = 200_000; // 200 µs
    let h = EmuHarness::with_config(EmuConfig {
        latency_ns_one_way: one_way,
        ..Default::default()
    });
    let mut rig = h.raw(0, 64);
    let rkey = rig.qp.remote_regions()[0].rkey;
    let wr = WorkRequest {
        wr_id: 1,
        signaled: true,
        op: WrOp::Faa {
            remote: GlobalAddr::host(0, 0),
            rkey,
            add: 1,
            local: Sge {
                addr: rig.mr.as_ptr(),
                len: 8,
                lkey: rig.mr.lkey(),
            },
        },
    };
    let t0 = Instant::now();
    // SAFETY: the SGE lies in rig.mr, alive until the completion is polled.
    unsafe { rig.qp.post_send(&[wr]) }.unwrap();
    let mut wc = [Completion::EMPTY; 1];
    let mut got = rig.cq.poll(&mut wc);
    // Measured after the look: a completion there is right only if this
    // thread was held up past the latency (a loaded machine preempts it).
    let first_look = t0.elapsed();
    assert!(
        got == 0 || first_look >= Duration::from_nanos(2 * one_way),
        "completion visible {first_look:?} after posting, before its latency elapsed"
    );
    while got == 0 {
        std::hint::spin_loop();
        got = rig.cq.poll(&mut wc);
    }
    let rtt = t0.elapsed();
    assert!(
        rtt >= Duration::from_nanos(2 * one_way),
        "completed after {rtt:?}"
    );
    assert_eq!(wc[0].status, WcStatus::Success);

    // Bandwidth: 50 KB at 100 MB/s takes at least 500 µs.
    let h = EmuHarness::with_config(EmuConfig {
        bandwidth_bytes_per_sec: 100_000_000,
        ..Default::default()
    });
    let t0 = Instant::now();
    conformance::run_task(&h, |ctx| async move {
        ctx.read(GlobalAddr::host(0, 0), 50_000).await.unwrap();
    });
    assert!(
        t0.elapsed() >= Duration::from_micros(500),
        "50 KB at 100 MB/s took {:?}",
        t0.elapsed()
    );
}

/// A latency past u64's nanoseconds (no front end allows one; the library
/// does) saturates to never: it once wrapped to "due already", and the
/// verb completed at once.
#[test]
fn a_latency_past_the_clock_never_completes() {
    let h = EmuHarness::with_config(EmuConfig {
        latency_ns_one_way: u64::MAX,
        ..Default::default()
    });
    let mut rig = h.raw(0, 64);
    let rkey = rig.qp.remote_regions()[0].rkey;
    let wr = WorkRequest {
        wr_id: 1,
        signaled: true,
        op: WrOp::Read {
            remote: GlobalAddr::host(0, 0),
            rkey,
            local: Sge {
                addr: rig.mr.as_ptr(),
                len: 8,
                lkey: rig.mr.lkey(),
            },
        },
    };
    // SAFETY: the SGE lies in rig.mr, which outlives the QP's use of it.
    unsafe { rig.qp.post_send(&[wr]) }.unwrap();
    let mut wc = [Completion::EMPTY; 1];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(20) {
        assert_eq!(rig.cq.poll(&mut wc), 0, "completed: {:?}", wc[0]);
    }
}

#[test]
fn owner_cpu_sees_remote_writes_and_vice_versa() {
    let h = EmuHarness::new();
    let Owner::Here(node) = &h.owners[1] else {
        unreachable!()
    };
    node.host().store_u64(0x100, 0xfeed);
    let got = conformance::run_task(&h, |ctx| async move {
        let v = ctx
            .read(GlobalAddr::host(1, 0x100), 8)
            .await
            .unwrap()
            .u64_at(0);
        ctx.write(GlobalAddr::host(1, 0x108), &[1, 2, 3])
            .await
            .unwrap();
        v
    });
    assert_eq!(got, 0xfeed);
    let mut b = [0u8; 3];
    node.host().read(0x108, &mut b);
    assert_eq!(b, [1, 2, 3]);
    // A message ring receiver polls its own memory for WRITEs (FaRM §6).
    let _ = std::io::stderr().flush();
}

/// Env var that turns `child_role_lines_writer_b` into writer B for
/// `lines_are_atomic_across_processes` (it names the node to attach to).
const LINES_CHILD_ENV: &str = "LOCH_TEST_LINES_CHILD_NODE";

/// Writer B of the line-atomicity case, run in a child process by
/// `lines_are_atomic_across_processes` (this test binary re-executed with
/// `--exact`). Without the env var it does nothing.
#[test]
fn child_role_lines_writer_b() {
    let Ok(path) = std::env::var(LINES_CHILD_ENV) else {
        return;
    };
    let ep = EmuEndpoint::attach(&path).expect("child attaches");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    // The parent closes our stdin when its reader is done.
    std::thread::spawn(move || {
        for _ in std::io::stdin().lock().lines() {}
        s.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let nic = EmuNic::new(EmuConfig::default());
    let cfg = ExecutorConfig {
        slots: 1,
        ..Default::default()
    };
    let mut ex = build_executor(&nic, &[ep], cfg);
    ex.spawn(move |ctx| async move {
        let at = GlobalAddr::host(0, conformance::LINES_AT);
        conformance::line_writer_b(&ctx, at, 8, 0xB0B, &stop).await;
    })
    .unwrap();
    ex.run();
}

/// `lines_are_atomic` with writer B in another process: the line words live
/// in the node file, so whole-line exclusion holds across processes.
#[test]
fn lines_are_atomic_across_processes() {
    let h = EmuHarness::new();
    let Owner::Here(node) = &h.owners[0] else {
        unreachable!()
    };
    let lines = 8u64;
    let at = GlobalAddr::host(0, conformance::LINES_AT);
    node.host()
        .write(at.offset(), &vec![0u8; 64 * lines as usize]);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_role_lines_writer_b", "--nocapture"])
        .env(LINES_CHILD_ENV, node.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn writer B");
    // Start racing once B's first WRITE has landed.
    let t0 = Instant::now();
    let mut region = vec![0u8; 64 * lines as usize];
    while !region.iter().any(|&b| b >= 128) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "writer B never wrote"
        );
        std::thread::sleep(Duration::from_millis(1));
        node.host().read(at.offset(), &mut region);
    }
    let stats = std::sync::Arc::new(std::sync::Mutex::new(None));
    let s = stats.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    h.parallel(
        2,
        1,
        std::sync::Arc::new(move |ctx, th, _| {
            let (s, stop) = (s.clone(), stop.clone());
            Box::pin(async move {
                if th == 0 {
                    conformance::line_writer_a(&ctx, at, lines, 0xA0A, &stop).await;
                } else {
                    let _stop = conformance::StopOnDrop(stop);
                    let st = conformance::line_reader(&ctx, at, lines, 20_000, 2_000_000).await;
                    *s.lock().unwrap() = Some(st);
                }
            })
        }),
    );
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "writer B failed");
    let st = stats.lock().unwrap().expect("reader finished");
    eprintln!("across processes: {st:?}");
    assert!(st.saw_partial_overwrites(), "{st:?}");
}

/// Where the seqlock tables start in a node file on /dev/shm (4 KiB pages):
/// after the header page, host memory and device memory (node.rs).
const TABLES_OFF: u64 = 4096 + HOST + DM;

/// Where host block `block`'s lock word (8 bytes) lies.
fn host_block_lock_offset(block: u64) -> u64 {
    TABLES_OFF + 8 * block
}

/// Where host line `line`'s sequence (4 bytes) lies: after the host lock
/// words, one per KiB.
fn host_line_seq_offset(line: u64) -> u64 {
    TABLES_OFF + 8 * HOST / 1024 + 4 * line
}

/// A block left locked, and a line left odd, by a process that has exited —
/// written into the node file as a killed writer leaves them — is taken
/// over after a few milliseconds; the WRITE that waited finishes the line
/// and the READ after it sees it whole.
#[test]
fn a_line_held_by_a_dead_process_is_taken_over() {
    use std::os::unix::fs::FileExt;
    let path = shm_path("held");
    let node = file_node(&path, 0);
    node.register_all().unwrap();
    let mut h = EmuHarness::new();
    h.endpoints[0] = EmuEndpoint::attach(&path).unwrap();
    h.owners[0] = Owner::Here(node);
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id() as u64;
    gone.wait().unwrap();
    let off = 0x7000u64;
    let file = open_rw(&path);
    let words = |f: &std::fs::File| {
        let (mut b, mut l) = ([0u8; 8], [0u8; 4]);
        f.read_exact_at(&mut b, host_block_lock_offset(off / 1024))
            .unwrap();
        f.read_exact_at(&mut l, host_line_seq_offset(off / 64))
            .unwrap();
        (u64::from_le_bytes(b), u32::from_le_bytes(l))
    };
    assert_eq!(words(&file), (0, 0), "a fresh node's words are free");
    file.write_all_at(
        &((dead_pid << 32) | 7).to_le_bytes(),
        host_block_lock_offset(off / 1024),
    )
    .unwrap();
    file.write_all_at(&5u32.to_le_bytes(), host_line_seq_offset(off / 64))
        .unwrap();
    let t0 = Instant::now();
    let got = conformance::run_task(&h, move |ctx| async move {
        let at = GlobalAddr::host(0, off);
        ctx.write(at, &[0x5a; 64]).await.unwrap();
        ctx.read(at, 64).await.unwrap().as_slice().to_vec()
    });
    let took = t0.elapsed();
    assert_eq!(got, vec![0x5a; 64]);
    assert!(
        took >= Duration::from_millis(2) && took < Duration::from_millis(900),
        "took {took:?}: the dead holder's block was taken over too early or too late"
    );
    // The block: taken over (7 → 8), locked and freed by the WRITE (10),
    // holder field cleared. The line: kept odd by the WRITE, evened (6).
    // The READ leaves both alone.
    assert_eq!(words(&file), (10, 6));
    drop(h);
    let _ = std::fs::remove_file(&path);
}

/// Attach refuses a file of the previous layout (version 1, no seqlock
/// tables), a table size that does not match the memory sizes, and a file
/// too short for its tables.
#[test]
fn attach_refuses_other_layouts_and_short_files() {
    use std::os::unix::fs::FileExt;
    let path = shm_path("layout");
    let node = file_node(&path, 2);
    let full = std::fs::metadata(&path).unwrap().len();
    let tables = (8 + 4 * 16) * (HOST + DM) / 1024;
    assert_eq!(
        full,
        TABLES_OFF + tables.next_multiple_of(4096),
        "file sized for header, memories and seqlock tables"
    );
    let mut header = vec![0u8; 4096];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact_at(&mut header, 0)
        .unwrap();
    drop(node);
    let copy = shm_path("layout-copy");
    let try_attach = |hdr: &[u8], len: u64| {
        let f = std::fs::File::create(&copy).unwrap();
        f.write_all_at(hdr, 0).unwrap();
        f.set_len(len).unwrap();
        drop(f);
        match EmuEndpoint::attach(&copy) {
            Err(EmuError::NotALochNode { why, .. }) => why,
            other => panic!("expected NotALochNode, got {other:?}"),
        }
    };
    // Header words (node.rs): layout version at byte 8, table bytes at 72.
    let mut v1 = header.clone();
    v1[8..16].copy_from_slice(&1u64.to_le_bytes());
    let why = try_attach(&v1, full);
    assert!(why.contains("layout version 1"), "{why}");
    let why = try_attach(&header, TABLES_OFF);
    assert!(why.contains("header says"), "{why}");
    let mut odd = header.clone();
    odd[72..80].copy_from_slice(&8u64.to_le_bytes());
    let why = try_attach(&odd, full);
    assert!(why.contains("seqlock tables"), "{why}");
    std::fs::remove_file(&copy).unwrap();
}

/// The region table in a node file is another process's memory, read
/// through the same words its owner writes. An entry reaching past the
/// node's memory is left out: a READ there is refused, not an access past
/// the window (it passed the responder's check and tripped the bounds
/// assertion). A table left mid-edit (its generation odd) by an owner that
/// died ends the verbs as a dead node's do (they spun on it for good); one
/// odd for good under a live owner is waited for a bounded time.
#[test]
fn a_corrupt_region_table_is_not_trusted() {
    use std::os::unix::fs::FileExt;
    const REGIONS: u64 = 256;
    const GEN: u64 = 64;
    const STATE: u64 = 56;
    const STATE_DEAD: u64 = 3;
    let path = shm_path("regions");
    let node = file_node(&path, 0);
    node.register_all().unwrap();
    let file = open_rw(&path);
    let word = |at: u64| {
        let mut b = [0u8; 8];
        file.read_exact_at(&mut b, at).unwrap();
        u64::from_le_bytes(b)
    };
    // The host region's entry (space 0) claims four times the memory.
    let host = (0..32)
        .map(|i| REGIONS + 32 * i)
        .find(|&e| word(e) != 0 && word(e + 8) == 0)
        .expect("register_all registered the host memory");
    let len_acc = word(host + 24);
    let access = len_acc & 0xff;
    file.write_all_at(&((4 * HOST) << 8 | access).to_le_bytes(), host + 24)
        .unwrap();
    let mut h = EmuHarness::new();
    h.endpoints[0] = EmuEndpoint::attach(&path).unwrap();
    h.owners[0] = Owner::Here(node);
    let past = conformance::run_task(&h, |ctx| async move {
        ctx.read(GlobalAddr::host(0, HOST + 64), 64)
            .await
            .map(|b| b.as_slice().to_vec())
    });
    assert!(past.is_err(), "a READ past the node's memory: {past:?}");
    // The entry mended, as an owner's edit would (the generation moves
    // on by two): read again, and READs there succeed.
    file.write_all_at(&len_acc.to_le_bytes(), host + 24)
        .unwrap();
    let gen = word(GEN) + 2;
    file.write_all_at(&gen.to_le_bytes(), GEN).unwrap();
    let r = conformance::run_task(&h, |ctx| async move {
        ctx.read(GlobalAddr::host(0, 64), 64).await.map(|_| ())
    });
    assert!(r.is_ok(), "a READ inside the mended table: {r:?}");
    // A generation odd for good while the owner reads alive (a corrupt
    // word, or an owner stopped mid-edit): after a bounded wait (it spun
    // on it for good) a connection goes on with the table as it last read
    // it; a new one has none, and its verbs fail as outside every region.
    file.write_all_at(&(gen | 1).to_le_bytes(), GEN).unwrap();
    let t0 = Instant::now();
    let r = conformance::run_task(&h, |ctx| async move {
        ctx.read(GlobalAddr::host(0, 64), 64).await.map(|_| ())
    });
    assert!(
        matches!(
            r,
            Err(VerbError::Failed {
                status: WcStatus::RemoteAccess,
                ..
            })
        ),
        "a READ with no table to go on: {r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    file.write_all_at(&gen.to_le_bytes(), GEN).unwrap();
    // The owner dies mid-edit of its table.
    let gen = word(GEN);
    file.write_all_at(&(gen | 1).to_le_bytes(), GEN).unwrap();
    file.write_all_at(&STATE_DEAD.to_le_bytes(), STATE).unwrap();
    let t0 = Instant::now();
    let r = conformance::run_task(&h, |ctx| async move {
        ctx.read(GlobalAddr::host(0, 64), 64).await.map(|_| ())
    });
    assert!(r.is_err(), "a READ of a dead node: {r:?}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    drop(h);
    let _ = std::fs::remove_file(&path);
}
