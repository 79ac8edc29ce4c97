//! The control channel: an authenticated TCP connection between two nodes,
//! and the cluster rendezvous built on it.
//!
//! Owns connection set-up (dial/accept plus the [`crate::auth`] handshake),
//! message send/receive under deadlines, and the coordinator protocol that
//! exchanges endpoints and regions and runs barriers.
//!
//! Promises:
//! - A [`ControlChannel`] exists only after both ends proved the secret; no
//!   Endpoint or Region is ever written to an unauthenticated socket, and
//!   every later frame carries a session MAC ([`crate::auth::SessionMac`]).
//! - Every read and write has a deadline: a silent or trickling peer costs at
//!   most the configured timeout, then an error (never a hang). A meeting
//!   (exchange, barrier, agreement) has one deadline for all the coordinator
//!   waits for, so members arriving one after another, or a member sending
//!   its records one at a time, cannot stretch it past the barrier timeout.
//! - With [`ChannelOptions::cancel`] set, every wait (accept, dial, read)
//!   looks at it at least every [`CANCEL_POLL`] and ends with
//!   [`ChannelError::Cancelled`] once it says stop.
//! - Frames are bounded ([`crate::wire::FRAME_BYTES_MAX`]) and the number of
//!   records one node may publish is bounded ([`RECORDS_PER_NODE_MAX`]).
//! - A node may publish records only under its own authenticated id.
//!
//! Rendezvous (the coordinator is the lowest node id):
//! members dial the coordinator; each sends its records then
//! `Barrier{"exchange", e}`; once all have, the coordinator sends every
//! record to every member followed by `BarrierRelease{"exchange", e}`.
//! A named barrier is the same without records: nobody is released before
//! every node has arrived. A node that will not take part sends
//! `Withdraw{id, why}` instead ([`Rendezvous::withdraw`]); the coordinator
//! passes it on to every other member, and each fails that meeting with
//! [`ChannelError::Withdrew`], naming the node and why.

use std::collections::BTreeSet;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::{
    fresh_nonce, ClusterSecret, Direction, SessionMac, Transcript, MAC_BYTES, NONCE_BYTES,
};
use crate::wire::{self, Endpoint, Message, Region, WireError, NAME_BYTES_MAX, PROTOCOL};

/// The most Endpoint plus Region records one node may publish.
pub const RECORDS_PER_NODE_MAX: usize = 4096;
/// The most nodes one rendezvous admits.
pub const NODES_MAX: usize = 1024;

/// Longest a node that withdrew ([`Rendezvous::withdraw`]) waits for its
/// peer to close after it, so that its last message is read.
pub const LINGER: Duration = Duration::from_secs(2);

/// Longest a member whose send to the coordinator failed reads for a
/// withdrawal the coordinator passed on before it went
/// (`ControlChannel::send_hearing`).
const HEARD_WAIT: Duration = Duration::from_millis(500);

/// Longest a wait sleeps before looking at [`Cancel`] again.
pub const CANCEL_POLL: Duration = Duration::from_millis(100);

/// Says whether a wait should end early (a node told to stop by SIGTERM
/// while its peers are missing). Every wait of the channel — accepting,
/// dialing, reading — sleeps at most [`CANCEL_POLL`] before asking again
/// and then fails with [`ChannelError::Cancelled`].
#[derive(Clone)]
pub struct Cancel(Arc<dyn Fn() -> bool + Send + Sync>);

impl Cancel {
    pub fn new(requested: impl Fn() -> bool + Send + Sync + 'static) -> Cancel {
        Cancel(Arc::new(requested))
    }

    pub fn requested(&self) -> bool {
        (self.0)()
    }
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cancel(requested: {})", self.requested())
    }
}

fn cancelled(cancel: &Option<Cancel>) -> bool {
    cancel.as_ref().is_some_and(Cancel::requested)
}

/// Hears, about once a second while a rendezvous waits, the ids of the
/// nodes it still waits for (the coordinator: members not yet joined; a
/// member: the coordinator), so that a node can say whom it waits for;
/// and, at the coordinator, the last handshake it refused since the last
/// report (a node of another build or secret knocking), so that it can
/// say why a node it waits for has not joined.
#[derive(Clone)]
pub struct WaitReport(Arc<WaitFn>);

/// What a [`WaitReport`] calls: the ids still awaited, and the last
/// refusal since the last call.
type WaitFn = dyn Fn(&[u32], Option<&ChannelError>) + Send + Sync;

impl WaitReport {
    pub fn new(
        report: impl Fn(&[u32], Option<&ChannelError>) + Send + Sync + 'static,
    ) -> WaitReport {
        WaitReport(Arc::new(report))
    }
}

impl fmt::Debug for WaitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WaitReport")
    }
}

/// How often a waiting rendezvous reports.
pub const WAIT_REPORT_EVERY: Duration = Duration::from_secs(1);

/// Calls `report` with `waiting` and `refused` when `next` has passed,
/// and moves `next` on by [`WAIT_REPORT_EVERY`]; whether it called.
fn report_wait(
    report: &Option<WaitReport>,
    next: &mut Instant,
    waiting: &[u32],
    refused: Option<&ChannelError>,
) -> bool {
    match report {
        Some(r) if Instant::now() >= *next => {
            (r.0)(waiting, refused);
            *next = Instant::now() + WAIT_REPORT_EVERY;
            true
        }
        _ => false,
    }
}

/// Who we are and how long we wait.
#[derive(Debug, Clone)]
pub struct ChannelOptions {
    pub node_id: u32,
    pub secret: ClusterSecret,
    /// Bound on the whole handshake of one connection.
    pub handshake_timeout: Duration,
    /// Bound on sending or receiving one ordinary message (the whole
    /// message, however the peer trickles it).
    pub io_timeout: Duration,
    /// Bound on one barrier, exchange or agreement as a whole: from its
    /// start until the slowest node has arrived (at the coordinator) or
    /// the release has come (at a member; in an exchange, a member bounds
    /// instead each record it is sent, which the coordinator sends every
    /// member in turn).
    pub barrier_timeout: Duration,
    /// Ends any wait early with [`ChannelError::Cancelled`]; `None` waits
    /// out the timeouts.
    pub cancel: Option<Cancel>,
    /// Told once a second whom a rendezvous still waits for; `None` waits
    /// quietly.
    pub on_wait: Option<WaitReport>,
}

impl ChannelOptions {
    pub fn new(node_id: u32, secret: ClusterSecret) -> ChannelOptions {
        ChannelOptions {
            node_id,
            secret,
            handshake_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(5),
            barrier_timeout: Duration::from_secs(60),
            cancel: None,
            on_wait: None,
        }
    }
}

#[derive(Debug)]
pub enum ChannelError {
    /// Framing, decoding, I/O or a timeout on the wire.
    Wire(WireError),
    /// The handshake failed: the peer does not hold the secret, or is not
    /// who we expected.
    Refused(String),
    /// The peer closed (or reset) the connection before its Hello, which
    /// is how a responder refuses node `node` without a word: it does not
    /// admit that id there, or it runs a build older than this control
    /// protocol (which cannot read this build's Hello). A coordinator also
    /// sheds handshakes that have not finished within 100 ms when a flood
    /// of connections fills its slots, so [`Rendezvous::join`] tries again
    /// a few times before it gives up.
    ShutOut {
        node: u32,
    },
    /// Node `peer` closed (or reset) the connection after our proof,
    /// which is how a responder refuses a wrong one: the two nodes hold
    /// different secrets. Or it shed the handshake under a flood of
    /// connections, as for [`ChannelError::ShutOut`], which
    /// [`Rendezvous::join`] tries again likewise.
    ProofRejected {
        peer: u32,
    },
    /// An authenticated peer broke the protocol.
    Protocol {
        peer: u32,
        why: String,
    },
    /// A frame from `peer` failed its session MAC: someone on the path
    /// altered, injected, replayed or reordered it.
    Tampered {
        peer: u32,
    },
    /// The rendezvous did not complete in time.
    Timeout(String),
    /// The wait was cancelled ([`ChannelOptions::cancel`]) before it ended.
    Cancelled,
    /// The nodes at an [`Rendezvous::agree`] barrier held different values:
    /// which node held what.
    Disagreed(String),
    /// This node was given more than the control channel carries: a value
    /// that does not fit a frame ([`agreement_fits`]), or more nodes than
    /// [`NODES_MAX`]; nothing was sent.
    Limit(String),
    /// Node `node` will not take part in the run, for `why`: it said so
    /// ([`Rendezvous::withdraw`]), itself or through the coordinator.
    Withdrew {
        node: u32,
        why: String,
    },
    Io(io::Error),
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelError::Wire(e) => write!(f, "{e}"),
            ChannelError::Refused(why) => write!(f, "handshake refused: {why}"),
            ChannelError::ShutOut { node } => write!(
                f,
                "handshake refused: the peer closed the connection before its Hello: it does not \
                 admit node {node} there, or it runs a Loch build older than control protocol \
                 {PROTOCOL}, which cannot read this build's Hello (or, if it was busy, it shed \
                 the handshake under a flood of connections)"
            ),
            ChannelError::ProofRejected { peer } => write!(
                f,
                "handshake refused: node {peer} closed the connection: it rejected our proof (do \
                 both nodes hold the same secret?), or it shed the handshake under a flood of \
                 connections"
            ),
            ChannelError::Protocol { peer, why } => {
                write!(f, "node {peer} broke the control protocol: {why}")
            }
            ChannelError::Tampered { peer } => write!(
                f,
                "a frame from node {peer} failed its MAC: the connection was tampered with"
            ),
            ChannelError::Timeout(what) => write!(f, "timed out: {what}"),
            ChannelError::Cancelled => {
                write!(f, "cancelled (stop requested) while waiting for peers")
            }
            ChannelError::Disagreed(what) => {
                write!(f, "the nodes disagree: {}", Printable(what))
            }
            ChannelError::Limit(what) => write!(f, "{what}"),
            ChannelError::Withdrew { node, why } => {
                write!(f, "node {node} withdrew from the run: {}", Printable(why))
            }
            ChannelError::Io(e) => write!(f, "control channel: {e}"),
        }
    }
}

impl std::error::Error for ChannelError {}

impl From<WireError> for ChannelError {
    fn from(e: WireError) -> Self {
        ChannelError::Wire(e)
    }
}

impl From<io::Error> for ChannelError {
    fn from(e: io::Error) -> Self {
        ChannelError::Io(e)
    }
}

/// Reads from a stream so that the whole read ends by `deadline`, however
/// the peer trickles its bytes, or soon after `cancel` says so (it waits
/// in slices of at most [`CANCEL_POLL`]).
struct DeadlineReader<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
    cancel: &'a Option<Cancel>,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if cancelled(self.cancel) {
                // The caller maps a cancelled wait to `Cancelled`.
                return Err(io::ErrorKind::TimedOut.into());
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Past the deadline, what has already arrived is still
                // taken (a coordinator that reads its members in turn
                // comes to the last ones late): one look, no wait.
                let mut fd = [poll_in(self.stream.as_raw_fd())];
                return match poll(&mut fd, Duration::ZERO)? {
                    0 => Err(io::ErrorKind::TimedOut.into()),
                    _ => (&*self.stream).read(buf),
                };
            }
            let slice = if self.cancel.is_some() {
                left.min(CANCEL_POLL)
            } else {
                left
            };
            self.stream.set_read_timeout(Some(slice))?;
            match (&*self.stream).read(buf) {
                // A timed-out read consumed nothing: wait on.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                r => return r,
            }
        }
    }
}

/// `e`, or [`ChannelError::Cancelled`] when the wait that failed was
/// cancelled (a cancelled read surfaces as a timeout from the wire layer).
fn or_cancelled(e: impl Into<ChannelError>, cancel: &Option<Cancel>) -> ChannelError {
    if cancelled(cancel) {
        ChannelError::Cancelled
    } else {
        e.into()
    }
}

fn recv_by(
    stream: &TcpStream,
    deadline: Instant,
    cancel: &Option<Cancel>,
) -> Result<Message, ChannelError> {
    wire::read_message(&mut DeadlineReader {
        stream,
        deadline,
        cancel,
    })
    .map_err(|e| or_cancelled(e, cancel))
}

/// Writes to a stream so that the whole write ends by `deadline`, however
/// slowly the peer drains it: each write(2) waits only for what is left
/// of the time (a socket's write timeout alone restarts with every
/// partial write, so a peer reading a trickle would hold a send for as
/// long as it likes).
struct DeadlineWriter<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Write for DeadlineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_write_timeout(Some(left))?;
        (&*self.stream).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self.stream).flush()
    }
}

/// Whether `e` is the peer's end of the connection: a close, or the
/// reset of a close with our bytes unread.
fn closed(e: &WireError) -> bool {
    match e {
        WireError::Closed => true,
        WireError::Io(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        ),
        _ => false,
    }
}

fn send_by(stream: &TcpStream, m: &Message, deadline: Instant) -> Result<(), WireError> {
    wire::write_message(&mut DeadlineWriter { stream, deadline }, m)
}

/// An authenticated connection to one peer.
#[derive(Debug)]
pub struct ControlChannel {
    stream: TcpStream,
    mac: SessionMac,
    local_id: u32,
    peer_id: u32,
    io_timeout: Duration,
    cancel: Option<Cancel>,
}

impl ControlChannel {
    /// Dials `addr` and authenticates; `expect_peer`, when given, must be
    /// the responder's id.
    pub fn connect(
        addr: SocketAddr,
        expect_peer: Option<u32>,
        opts: &ChannelOptions,
    ) -> Result<Self, ChannelError> {
        let stream = TcpStream::connect_timeout(&addr, opts.handshake_timeout)?;
        Self::initiate(stream, expect_peer, opts, fresh_nonce()?)
    }

    /// The initiator's half of the handshake on a connected stream, with
    /// an explicit nonce (tests inject one; `connect` draws a fresh one).
    pub fn initiate(
        stream: TcpStream,
        expect_peer: Option<u32>,
        opts: &ChannelOptions,
        nonce: [u8; NONCE_BYTES],
    ) -> Result<Self, ChannelError> {
        let deadline = Instant::now() + opts.handshake_timeout;
        stream.set_nodelay(true)?;
        let hello = Message::Hello {
            node_id: opts.node_id,
            nonce,
            protocol: PROTOCOL,
        };
        let shut_out = ChannelError::ShutOut { node: opts.node_id };
        match send_by(&stream, &hello, deadline) {
            Err(e) if closed(&e) => return Err(shut_out),
            r => r?,
        }
        let (peer_id, peer_nonce) = match recv_by(&stream, deadline, &opts.cancel) {
            Ok(Message::Hello {
                node_id,
                nonce,
                protocol: PROTOCOL,
            }) => (node_id, nonce),
            Ok(Message::Hello {
                node_id, protocol, ..
            }) => return Err(protocol_mismatch(node_id, protocol)),
            Ok(m) => {
                return Err(ChannelError::Refused(format!(
                    "expected Hello, got {}",
                    m.kind()
                )))
            }
            // A responder says nothing to a node it refuses. Where it
            // closed with our Hello unread, the close is a reset.
            Err(ChannelError::Wire(e)) if closed(&e) => return Err(shut_out),
            Err(e) => return Err(e),
        };
        if let Some(want) = expect_peer {
            if peer_id != want {
                return Err(ChannelError::Refused(format!(
                    "expected node {want}, the peer says it is {peer_id}"
                )));
            }
        }
        if peer_nonce == nonce {
            return Err(ChannelError::Refused("the peer echoed our nonce".into()));
        }
        let t = Transcript {
            protocol: PROTOCOL,
            initiator_id: opts.node_id,
            responder_id: peer_id,
            initiator_nonce: nonce,
            responder_nonce: peer_nonce,
        };
        let proof = Message::Auth {
            mac: t.prove(&opts.secret, Direction::Initiator),
        };
        match send_by(&stream, &proof, deadline) {
            // Shed while it waited for our proof.
            Err(e) if closed(&e) => return Err(ChannelError::ProofRejected { peer: peer_id }),
            r => r?,
        }
        match recv_by(&stream, deadline, &opts.cancel) {
            Ok(Message::Auth { mac }) if t.verify(&opts.secret, Direction::Responder, &mac) => {}
            Ok(Message::Auth { .. }) => {
                return Err(ChannelError::Refused(format!(
                    "node {peer_id} sent a wrong proof"
                )))
            }
            Ok(m) => {
                return Err(ChannelError::Refused(format!(
                    "expected Auth, got {}",
                    m.kind()
                )))
            }
            Err(ChannelError::Wire(e)) if closed(&e) => {
                return Err(ChannelError::ProofRejected { peer: peer_id })
            }
            Err(e) => return Err(e),
        }
        Ok(ControlChannel {
            stream,
            mac: t.session(&opts.secret, Direction::Initiator),
            local_id: opts.node_id,
            peer_id,
            io_timeout: opts.io_timeout,
            cancel: opts.cancel.clone(),
        })
    }

    /// Waits (up to the handshake timeout) for one connection on `listener`
    /// and authenticates it; `admit` says which claimed ids may proceed.
    pub fn accept(
        listener: &TcpListener,
        opts: &ChannelOptions,
        admit: &dyn Fn(u32) -> bool,
    ) -> Result<Self, ChannelError> {
        let stream = accept_by(
            listener,
            Instant::now() + opts.handshake_timeout,
            &opts.cancel,
        )?;
        Self::respond(stream, opts, admit, fresh_nonce()?)
    }

    /// The responder's half of the handshake on an accepted stream.
    pub fn respond(
        stream: TcpStream,
        opts: &ChannelOptions,
        admit: &dyn Fn(u32) -> bool,
        nonce: [u8; NONCE_BYTES],
    ) -> Result<Self, ChannelError> {
        Self::respond_telling(stream, opts, admit, nonce, &|| {})
    }

    /// [`respond`](Self::respond), calling `authenticated` once the
    /// initiator's proof checked out (what follows is one write).
    fn respond_telling(
        stream: TcpStream,
        opts: &ChannelOptions,
        admit: &dyn Fn(u32) -> bool,
        nonce: [u8; NONCE_BYTES],
        authenticated: &dyn Fn(),
    ) -> Result<Self, ChannelError> {
        let deadline = Instant::now() + opts.handshake_timeout;
        stream.set_nodelay(true)?;
        let (peer_id, peer_nonce, peer_protocol) = match recv_by(&stream, deadline, &opts.cancel)? {
            Message::Hello {
                node_id,
                nonce,
                protocol,
            } => (node_id, nonce, protocol),
            m => {
                return Err(ChannelError::Refused(format!(
                    "expected Hello, got {}",
                    m.kind()
                )))
            }
        };
        if peer_id == opts.node_id || !admit(peer_id) {
            return Err(ChannelError::Refused(format!(
                "node id {peer_id} is not admitted here"
            )));
        }
        send_by(
            &stream,
            &Message::Hello {
                node_id: opts.node_id,
                nonce,
                protocol: PROTOCOL,
            },
            deadline,
        )?;
        // Refused after our Hello, which tells the initiator our version:
        // both ends name the mismatch.
        if peer_protocol != PROTOCOL {
            return Err(protocol_mismatch(peer_id, peer_protocol));
        }
        let t = Transcript {
            protocol: PROTOCOL,
            initiator_id: peer_id,
            responder_id: opts.node_id,
            initiator_nonce: peer_nonce,
            responder_nonce: nonce,
        };
        match recv_by(&stream, deadline, &opts.cancel)? {
            Message::Auth { mac } if t.verify(&opts.secret, Direction::Initiator, &mac) => {}
            // Close without a word: the peer learns only our nonce (and
            // protocol).
            Message::Auth { .. } => {
                return Err(ChannelError::Refused(format!(
                    "node {peer_id} sent a wrong proof"
                )))
            }
            m => {
                return Err(ChannelError::Refused(format!(
                    "expected Auth, got {}",
                    m.kind()
                )))
            }
        }
        authenticated();
        send_by(
            &stream,
            &Message::Auth {
                mac: t.prove(&opts.secret, Direction::Responder),
            },
            deadline,
        )?;
        Ok(ControlChannel {
            stream,
            mac: t.session(&opts.secret, Direction::Responder),
            local_id: opts.node_id,
            peer_id,
            io_timeout: opts.io_timeout,
            cancel: opts.cancel.clone(),
        })
    }

    pub fn peer_id(&self) -> u32 {
        self.peer_id
    }

    pub fn local_id(&self) -> u32 {
        self.local_id
    }

    /// Sends one message, sealed with the session MAC.
    pub fn send(&mut self, m: &Message) -> Result<(), ChannelError> {
        let mut body = Vec::with_capacity(64);
        m.encode_body(&mut body);
        let trailer = self.mac.seal(&body);
        let mut w = DeadlineWriter {
            stream: &self.stream,
            deadline: Instant::now() + self.io_timeout,
        };
        Ok(wire::write_frame(&mut w, &[&body, &trailer])?)
    }

    /// Receives one message within the I/O timeout.
    /// Sends every record of `d`: its endpoints, then its regions.
    fn send_records(&mut self, d: &Directory) -> Result<(), ChannelError> {
        for e in &d.endpoints {
            self.send(&Message::Endpoint(*e))?;
        }
        for r in &d.regions {
            self.send(&Message::Region(*r))?;
        }
        Ok(())
    }

    pub fn recv(&mut self) -> Result<Message, ChannelError> {
        self.recv_within(self.io_timeout)
    }

    /// Receives one message within `timeout`; a frame whose MAC does not
    /// check (altered, injected, replayed, reordered) is
    /// [`ChannelError::Tampered`].
    pub fn recv_within(&mut self, timeout: Duration) -> Result<Message, ChannelError> {
        self.recv_by(Instant::now() + timeout)
    }

    /// Receives one message by `deadline`, as
    /// [`recv_within`](Self::recv_within).
    fn recv_by(&mut self, deadline: Instant) -> Result<Message, ChannelError> {
        let frame = wire::read_frame(&mut DeadlineReader {
            stream: &self.stream,
            deadline,
            cancel: &self.cancel,
        })
        .map_err(|e| or_cancelled(e, &self.cancel))?;
        let Some(split) = frame.len().checked_sub(MAC_BYTES) else {
            return Err(WireError::Truncated { field: "mac" }.into());
        };
        let (body, trailer) = frame.split_at(split);
        if !self.mac.open(body, trailer) {
            return Err(ChannelError::Tampered { peer: self.peer_id });
        }
        Ok(Message::decode_body(body)?)
    }

    /// Closes after a last message, so that it arrives: shuts the sending
    /// side, then reads (and drops) what the peer still sends until it
    /// closes too, for at most [`LINGER`]. Closing a socket with unread
    /// bytes in it resets the connection, and a reset can discard the
    /// last message before the peer reads it.
    fn linger_closed(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        let deadline = Instant::now() + LINGER;
        let mut sink = [0u8; 512];
        let mut r = DeadlineReader {
            stream: &self.stream,
            deadline,
            cancel: &self.cancel,
        };
        while matches!(r.read(&mut sink), Ok(n) if n > 0) {}
    }

    /// A member's sends to its coordinator (`send`): where they fail, a
    /// withdrawal the coordinator passed on before it went, still unread
    /// here, is the error rather than the send's. A coordinator that
    /// passed one on closes, and a member still sending then meets a
    /// broken pipe with the reason waiting in its socket.
    fn send_hearing(
        &mut self,
        send: impl FnOnce(&mut Self) -> Result<(), ChannelError>,
    ) -> Result<(), ChannelError> {
        let Err(e) = send(self) else {
            return Ok(());
        };
        match self.recv_meeting(Instant::now() + HEARD_WAIT, false) {
            Err(w @ ChannelError::Withdrew { .. }) => Err(w),
            _ => Err(e),
        }
    }

    /// The next message of a meeting (an exchange or a barrier) by
    /// `deadline`, a withdrawal being [`ChannelError::Withdrew`]. A member
    /// (`from_member`: this end coordinates) withdraws only itself; the
    /// coordinator passes on anyone's.
    fn recv_meeting(
        &mut self,
        deadline: Instant,
        from_member: bool,
    ) -> Result<Message, ChannelError> {
        match self.recv_by(deadline)? {
            Message::Withdraw { node_id, .. } if from_member && node_id != self.peer_id => {
                Err(self.protocol(format!("withdrew node {node_id}, not itself")))
            }
            Message::Withdraw { node_id, why } => {
                Err(ChannelError::Withdrew { node: node_id, why })
            }
            m => Ok(m),
        }
    }

    fn protocol(&self, why: String) -> ChannelError {
        ChannelError::Protocol {
            peer: self.peer_id,
            why,
        }
    }
}

/// The refusal of a peer speaking another control protocol
/// ([`wire::PROTOCOL`]).
fn protocol_mismatch(peer: u32, theirs: u16) -> ChannelError {
    ChannelError::Refused(format!(
        "node {peer} (unauthenticated) speaks control protocol {theirs}, this node {PROTOCOL}: \
         run the same Loch build on every node"
    ))
}

/// Accepts one connection by `deadline` (std's `accept` has no timeout, so
/// `poll(2)` a non-blocking listener), or until `cancel` says so.
fn accept_by(
    listener: &TcpListener,
    deadline: Instant,
    cancel: &Option<Cancel>,
) -> Result<TcpStream, ChannelError> {
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if cancelled(cancel) {
                    return Err(ChannelError::Cancelled);
                }
                let mut left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ChannelError::Timeout("no peer connected".into()));
                }
                if cancel.is_some() {
                    left = left.min(CANCEL_POLL);
                }
                // Sleep until a connection is pending or the deadline; a
                // spurious wake-up just loops.
                connection_pending_within(listener, left.max(Duration::from_millis(1)));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether a connection waits in `listener`'s queue to be accepted, or
/// comes within `wait` (0: only look).
fn connection_pending_within(listener: &TcpListener, wait: Duration) -> bool {
    let mut fd = [poll_in(listener.as_raw_fd())];
    matches!(poll(&mut fd, wait), Ok(1)) && fd[0].revents & libc::POLLIN != 0
}

/// A pollfd asking whether `fd` has something to read (or has ended).
fn poll_in(fd: std::os::fd::RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// poll(2) over `fds`, waiting at most `wait` (0: a look, no wait); how
/// many have an event. A signal ends the wait with none.
fn poll(fds: &mut [libc::pollfd], wait: Duration) -> io::Result<usize> {
    let ms = wait.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a valid array of `fds.len()` pollfds, each naming
    // a descriptor the caller holds open for the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(0),
            _ => Err(e),
        };
    }
    Ok(n as usize)
}

/// What the cluster has published: every node's endpoints and regions,
/// sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directory {
    pub endpoints: Vec<Endpoint>,
    pub regions: Vec<Region>,
}

impl Directory {
    fn sort(&mut self) {
        self.endpoints.sort();
        self.regions.sort();
    }
}

/// What member `ch` said at barrier `name` (`got`): `Ok(false)` for its
/// arrival, `Ok(true)` where it left instead (a goodbye or a closed
/// connection) and `leaving_arrives`, else the error.
fn arrival(
    ch: &ControlChannel,
    got: Result<Message, ChannelError>,
    name: &str,
    epoch: u64,
    leaving_arrives: bool,
) -> Result<bool, ChannelError> {
    match got {
        Ok(Message::Barrier { name: n, epoch: e }) if n == name && e == epoch => Ok(false),
        Ok(Message::Bye) | Err(ChannelError::Wire(WireError::Closed | WireError::Io(_)))
            if leaving_arrives =>
        {
            Ok(true)
        }
        Ok(m) => Err(ch.protocol(format!(
            "expected barrier `{name}` (epoch {epoch}), got {m:?}"
        ))),
        Err(e) => Err(e),
    }
}

/// Releases every member of barrier `name` but those that `left`; with
/// `leaving_arrives`, one that cannot be sent its release left too.
/// Returns who left.
fn release(
    members: &mut [ControlChannel],
    mut left: Vec<u32>,
    name: &str,
    epoch: u64,
    leaving_arrives: bool,
) -> Result<Vec<u32>, ChannelError> {
    for ch in members.iter_mut() {
        if left.contains(&ch.peer_id) {
            continue;
        }
        let sent = ch.send(&Message::BarrierRelease {
            name: name.into(),
            epoch,
        });
        match sent {
            // One that arrived and left since has its release coming to
            // nobody; the others still get theirs.
            Err(_) if leaving_arrives => left.push(ch.peer_id),
            r => r?,
        }
    }
    Ok(left)
}

/// Which of `members[pending]` have something to read (a message, or
/// their connection's end), waiting at most `wait` for one.
fn readable(
    members: &[ControlChannel],
    pending: &[usize],
    wait: Duration,
) -> Result<Vec<usize>, ChannelError> {
    let mut fds: Vec<libc::pollfd> = pending
        .iter()
        .map(|&i| poll_in(members[i].stream.as_raw_fd()))
        .collect();
    // A signal reads as nobody: the caller looks at its stop request and
    // polls again.
    poll(&mut fds, wait)?;
    Ok(pending
        .iter()
        .zip(&fds)
        .filter(|(_, f)| f.revents != 0)
        .map(|(&i, _)| i)
        .collect())
}

enum Role {
    Coordinator { members: Vec<ControlChannel> },
    Member { coordinator: ControlChannel },
}

/// This node's place in the cluster rendezvous.
pub struct Rendezvous {
    node_id: u32,
    role: Role,
    epoch: u64,
    barrier_timeout: Duration,
    refused: Refusals,
}

/// How many refused handshakes a rendezvous keeps to say why (the most
/// recent; the rest are counted).
pub const REFUSALS_KEPT: usize = 16;

/// The handshakes a coordinator refused: how many, and the last
/// [`REFUSALS_KEPT`] of them. Kept whole, the list grew with every
/// connection a peer opened and closed, unauthenticated, for as long as
/// the admission ran.
#[derive(Debug, Default)]
struct Refusals {
    count: u64,
    recent: Vec<ChannelError>,
}

impl Refusals {
    fn push(&mut self, e: ChannelError) {
        self.count += 1;
        if self.recent.len() == REFUSALS_KEPT {
            self.recent.remove(0);
        }
        self.recent.push(e);
    }

    fn last(&self) -> Option<&ChannelError> {
        self.recent.last()
    }
}

const EXCHANGE: &str = "exchange";

/// Text that came from a peer (why it withdrew, the values nodes held at a
/// barrier), as it may be printed: control characters escaped, so that an
/// authenticated but wayward peer can neither forge a line of another
/// node's log with a newline nor drive its terminal with escapes.
struct Printable<'a>(&'a str);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

/// The wait of [`Rendezvous::final_barrier`]: ten years, a deadline
/// that an `Instant` and a socket timeout both hold without overflow.
const UNBOUNDED: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// What an [`Rendezvous::agree`] barrier carries in its wire name: a value
/// held (`name=value`; `name?` for none), or, in a release only, the
/// disagreement (`name!why`).
enum Agreed {
    Held(Option<String>),
    Refused(String),
}

impl Agreed {
    fn tag(&self, name: &str) -> String {
        match self {
            Agreed::Held(Some(v)) => format!("{name}={v}"),
            Agreed::Held(None) => format!("{name}?"),
            Agreed::Refused(why) => format!("{name}!{why}"),
        }
    }

    /// `s` read as a tag of `name`; `None` if it is not one.
    fn untag(name: &str, s: &str) -> Option<Agreed> {
        let rest = s.strip_prefix(name)?;
        if rest == "?" {
            return Some(Agreed::Held(None));
        }
        if let Some(v) = rest.strip_prefix('=') {
            return Some(Agreed::Held(Some(v.to_string())));
        }
        rest.strip_prefix('!')
            .map(|why| Agreed::Refused(why.to_string()))
    }
}

/// Whether `value` can be agreed on at the barrier `name`
/// ([`Rendezvous::agree`]): the two travel in one frame's name, at most
/// [`NAME_BYTES_MAX`] bytes together; the error says how long it is and
/// how long it may be. For callers to check a value from their input
/// before any node starts.
pub fn agreement_fits(name: &str, value: &str) -> Result<(), String> {
    let len = Agreed::Held(Some(value.to_string())).tag(name).len();
    if len > NAME_BYTES_MAX {
        return Err(format!(
            "`{name}` would carry {} bytes of agreement; the control channel carries at most {}",
            value.len(),
            NAME_BYTES_MAX - (len - value.len())
        ));
    }
    Ok(())
}

/// Handshakes the coordinator runs at once, each on a thread of its own:
/// a connection that sends nothing holds its thread to the handshake
/// bound, not the admission of the nodes behind it.
const HANDSHAKES_AT_ONCE: usize = 64;

/// How often the coordinator looks for finished handshakes while some
/// run.
const HANDSHAKE_POLL: Duration = Duration::from_millis(5);

/// How old an unauthenticated handshake must be before a new connection
/// may push it out when [`HANDSHAKES_AT_ONCE`] run (a node's handshake
/// takes a few round trips; a connection that sends nothing, the whole
/// handshake bound).
const EVICT_AFTER: Duration = Duration::from_millis(100);

/// How many times [`Rendezvous::join`] dials again after the coordinator
/// closed a connection unauthenticated ([`ChannelError::ShutOut`],
/// [`ChannelError::ProofRejected`]).
pub const SHUT_OUT_RETRIES: u32 = 3;

/// A running handshake as [`admit`] sees it: when it started, and a
/// second handle on its connection while the peer is unauthenticated,
/// which the handshake's thread takes away once the peer proved itself
/// or the handshake ended. Under the lock, so that a handshake is either
/// pushed out before its peer proved itself or not at all.
type Shaking = (Instant, Arc<std::sync::Mutex<Option<TcpStream>>>);

/// Ends the oldest unauthenticated handshake of `shaking` older than
/// [`EVICT_AFTER`], if any, by shutting its connection (its thread then
/// fails and ends). Forgets the handshakes that ended on their own or
/// authenticated.
fn evict_oldest(shaking: &mut std::collections::VecDeque<Shaking>) {
    while let Some((at, handle)) = shaking.front() {
        if at.elapsed() < EVICT_AFTER {
            return;
        }
        let taken = locked(handle).take();
        shaking.pop_front();
        if let Some(stream) = taken {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

/// What `m` holds, shared between [`admit`] and its handshakes' threads,
/// each of whose changes is one step (a remove, a take), so a panic while
/// holding the lock left it whole.
fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The coordinator's wait for a run's nodes: accepts and authenticates
/// until every node in `members` but this one has joined, handing each
/// channel to `take`, or until `timeout` passes. Connections that fail the
/// handshake are dropped and counted, the last few kept; the wait goes
/// on. Handshakes run side by side (up to [`HANDSHAKES_AT_ONCE`]): before,
/// one at a time, each connection that sent nothing (an unauthenticated
/// peer, a port scan) held every node behind it for the whole handshake
/// bound, and a few could push the rendezvous past its timeout.
fn admit(
    listener: &TcpListener,
    members: &[u32],
    opts: &ChannelOptions,
    timeout: Duration,
    take: &mut dyn FnMut(ControlChannel),
) -> Result<Refusals, ChannelError> {
    let deadline = Instant::now() + timeout;
    let waiting: BTreeSet<u32> = members
        .iter()
        .copied()
        .filter(|&m| m != opts.node_id)
        .collect();
    if waiting.len() >= NODES_MAX {
        return Err(ChannelError::Limit(format!(
            "{} nodes to meet; a rendezvous holds at most {NODES_MAX}",
            waiting.len() + 1
        )));
    }
    // The ids still awaited, shared with the handshakes, which only look
    // (they refuse an id not awaited); a second channel for an id is
    // dropped here.
    let waiting = Arc::new(std::sync::Mutex::new(waiting));
    let (done_tx, done) = std::sync::mpsc::channel::<Result<ControlChannel, ChannelError>>();
    let mut running = 0usize;
    let mut shaking = std::collections::VecDeque::<Shaking>::new();
    let mut refused = Refusals::default();
    // This many refusals were reported already.
    let mut told = 0;
    let mut next_report = Instant::now() + WAIT_REPORT_EVERY;
    let mut finish = |r: Result<ControlChannel, ChannelError>, refused: &mut Refusals| match r {
        Ok(ch) => {
            let fresh = locked(&waiting).remove(&ch.peer_id);
            if fresh {
                take(ch);
            } else {
                refused.push(ChannelError::Refused(format!(
                    "node {} joined already",
                    ch.peer_id
                )));
            }
        }
        Err(e) => refused.push(e),
    };
    loop {
        while let Ok(r) = done.try_recv() {
            running -= 1;
            finish(r, &mut refused);
        }
        let ids: Vec<u32> = locked(&waiting).iter().copied().collect();
        if ids.is_empty() {
            return Ok(refused);
        }
        if Instant::now() >= deadline {
            let last = match refused.last() {
                Some(e) => format!("; the last: {e}"),
                None => String::new(),
            };
            return Err(ChannelError::Timeout(format!(
                "nodes {ids:?} did not join within {timeout:?} ({} connections refused{last})",
                refused.count
            )));
        }
        let fresh = refused.last().filter(|_| refused.count > told);
        if report_wait(&opts.on_wait, &mut next_report, &ids, fresh) {
            told = refused.count;
        }
        if running >= HANDSHAKES_AT_ONCE {
            // Room for no more. Where a connection waits behind them,
            // push out the oldest peer that has not proved itself (else
            // connections that send nothing, opened as fast as the
            // handshake bound lets them go, held every node queued behind
            // them); then wait for one to end (each is bounded).
            if connection_pending_within(listener, Duration::ZERO) {
                evict_oldest(&mut shaking);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(r) = done.recv_timeout(left.min(HANDSHAKE_POLL)) {
                running -= 1;
                finish(r, &mut refused);
            }
            continue;
        }
        // Accept in steps: of at most a second, to report between them,
        // and of HANDSHAKE_POLL while handshakes run.
        let mut step = match opts.on_wait {
            Some(_) => deadline.min(next_report),
            None => deadline,
        };
        if running > 0 {
            step = step.min(Instant::now() + HANDSHAKE_POLL);
        }
        let stream = match accept_by(listener, step, &opts.cancel) {
            Ok(s) => s,
            Err(ChannelError::Timeout(_)) => continue,
            Err(e) => return Err(e),
        };
        let nonce = fresh_nonce()?;
        let (o, w, tx) = (opts.clone(), waiting.clone(), done_tx.clone());
        let handle = Arc::new(std::sync::Mutex::new(stream.try_clone().ok()));
        shaking.push_back((Instant::now(), handle.clone()));
        if shaking.len() > 2 * HANDSHAKES_AT_ONCE {
            // Those that ended hold nothing any more.
            shaking.retain(|(_, h)| locked(h).is_some());
        }
        let shake = move || {
            let admit = |id: u32| locked(&w).contains(&id);
            // Taken under the lock: from here the handshake cannot be
            // pushed out, and its connection is no longer held open by
            // the second handle once it ends.
            let settle = || {
                locked(&handle).take();
            };
            let r = ControlChannel::respond_telling(stream, &o, &admit, nonce, &settle);
            settle();
            // The admission may have ended (its receiver dropped): the
            // channel is then dropped with the result.
            let _ = tx.send(r);
        };
        match std::thread::Builder::new()
            .name("loch-handshake".into())
            .spawn(shake)
        {
            Ok(_) => running += 1,
            Err(e) => refused.push(ChannelError::Io(e)),
        }
    }
}

impl Rendezvous {
    /// As coordinator: accepts and authenticates until every node in
    /// `members` has joined, or `timeout` passes. Connections that fail the
    /// handshake are dropped and counted in [`Rendezvous::refused`]; the
    /// wait goes on.
    pub fn coordinate(
        listener: &TcpListener,
        members: &[u32],
        opts: &ChannelOptions,
        timeout: Duration,
    ) -> Result<Rendezvous, ChannelError> {
        let mut joined = Vec::with_capacity(members.len());
        let refused = admit(listener, members, opts, timeout, &mut |ch| joined.push(ch))?;
        joined.sort_by_key(|c| c.peer_id);
        Ok(Rendezvous {
            node_id: opts.node_id,
            role: Role::Coordinator { members: joined },
            epoch: 0,
            barrier_timeout: opts.barrier_timeout,
            refused,
        })
    }

    /// As the coordinator of a run this node will not take part in:
    /// accepts and authenticates the `members` as [`Rendezvous::coordinate`]
    /// does, and tells each at once that it withdrew, for `why`
    /// ([`ChannelError::Withdrew`] at the member's first meeting), until
    /// every member was told or `timeout` passes (then the error names
    /// those not told).
    pub fn turn_away(
        listener: &TcpListener,
        members: &[u32],
        opts: &ChannelOptions,
        timeout: Duration,
        why: &str,
    ) -> Result<(), ChannelError> {
        let me = opts.node_id;
        admit(listener, members, opts, timeout, &mut |mut ch| {
            // Best effort: one that cannot be told times out on its own.
            let _ = ch.send(&Message::Withdraw {
                node_id: me,
                why: why.to_string(),
            });
            ch.linger_closed();
        })
        .map(drop)
    }

    /// As member: dials the coordinator at `addr`, which must be node
    /// `coordinator_id`, retrying refused connections until `timeout` (the
    /// coordinator may not be listening yet), and a connection the
    /// coordinator closes unauthenticated ([`ChannelError::ShutOut`],
    /// [`ChannelError::ProofRejected`]) up to [`SHUT_OUT_RETRIES`] times
    /// within it (a coordinator under a flood of connections sheds
    /// handshakes; one that does not admit this node, or holds another
    /// secret, says the same each time, and the last is the error; each
    /// try counts as one more refused handshake at the coordinator).
    pub fn join(
        addr: SocketAddr,
        coordinator_id: u32,
        opts: &ChannelOptions,
        timeout: Duration,
    ) -> Result<Rendezvous, ChannelError> {
        let deadline = Instant::now() + timeout;
        let mut next_report = Instant::now() + WAIT_REPORT_EVERY;
        let mut shut_out = 0;
        let ch = loop {
            if cancelled(&opts.cancel) {
                return Err(ChannelError::Cancelled);
            }
            match ControlChannel::connect(addr, Some(coordinator_id), opts) {
                Ok(ch) => break ch,
                Err(ChannelError::Io(e))
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && Instant::now() < deadline =>
                {
                    report_wait(&opts.on_wait, &mut next_report, &[coordinator_id], None);
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(ChannelError::ShutOut { .. } | ChannelError::ProofRejected { .. })
                    if shut_out < SHUT_OUT_RETRIES && Instant::now() < deadline =>
                {
                    shut_out += 1;
                    // Past the shedding of a burst (50, then 100 ms; no
                    // longer than a stop request may wait).
                    let pause = Duration::from_millis(50 * u64::from(shut_out)).min(CANCEL_POLL);
                    std::thread::sleep(
                        pause.min(deadline.saturating_duration_since(Instant::now())),
                    );
                }
                Err(e) => return Err(or_cancelled(e, &opts.cancel)),
            }
        };
        Ok(Rendezvous {
            node_id: opts.node_id,
            role: Role::Member { coordinator: ch },
            epoch: 0,
            barrier_timeout: opts.barrier_timeout,
            refused: Refusals::default(),
        })
    }

    pub fn node_id(&self) -> u32 {
        self.node_id
    }

    /// The last handshakes (at most [`REFUSALS_KEPT`]) the coordinator
    /// refused while waiting for members, oldest first.
    pub fn refused(&self) -> &[ChannelError] {
        &self.refused.recent
    }

    /// How many handshakes the coordinator refused while waiting for
    /// members.
    pub fn refused_count(&self) -> u64 {
        self.refused.count
    }

    /// Publishes `mine` and returns every node's records (including ours).
    /// Records must carry this node's id.
    pub fn exchange(&mut self, mine: &Directory) -> Result<Directory, ChannelError> {
        let r = self.exchange_with(mine, &Directory::default());
        self.pass_on(r)
    }

    /// As [`Rendezvous::exchange`], for a coordinator that also hands out
    /// `relayed`: records of nodes not in this rendezvous that an earlier,
    /// authenticated exchange gave it (a memory node serving a later
    /// compute run passes on the other memory nodes' regions). A member
    /// cannot relay.
    pub fn exchange_relaying(
        &mut self,
        mine: &Directory,
        relayed: &Directory,
    ) -> Result<Directory, ChannelError> {
        assert!(
            matches!(self.role, Role::Coordinator { .. }),
            "only the coordinator relays records"
        );
        let r = self.exchange_with(mine, relayed);
        self.pass_on(r)
    }

    fn exchange_with(
        &mut self,
        mine: &Directory,
        relayed: &Directory,
    ) -> Result<Directory, ChannelError> {
        let (me, epoch) = (self.node_id, self.next_epoch());
        assert!(
            mine.endpoints.iter().all(|e| e.node_id == me)
                && mine.regions.iter().all(|r| r.node_id == me),
            "a node publishes only its own records"
        );
        // The coordinator's wait for every member's records has one
        // deadline, not one per message: a member that sends its records
        // one at a time is not given a timeout each.
        let barrier_timeout = self.barrier_timeout;
        let deadline = Instant::now() + barrier_timeout;
        match &mut self.role {
            Role::Member { coordinator } => {
                coordinator.send_hearing(|c| {
                    c.send_records(mine)?;
                    c.send(&Message::Barrier {
                        name: EXCHANGE.into(),
                        epoch,
                    })
                })?;
                let mut all = Directory::default();
                let limit = RECORDS_PER_NODE_MAX * NODES_MAX;
                loop {
                    // A member's wait bounds each message instead: the
                    // coordinator sends every record to every member in
                    // turn, so the last member's share of a large cluster
                    // comes long after the first's.
                    match coordinator.recv_meeting(Instant::now() + barrier_timeout, false)? {
                        Message::Endpoint(e) => all.endpoints.push(e),
                        Message::Region(r) => all.regions.push(r),
                        Message::BarrierRelease { name, epoch: e }
                            if name == EXCHANGE && e == epoch =>
                        {
                            break
                        }
                        m => {
                            return Err(coordinator
                                .protocol(format!("unexpected {} during the exchange", m.kind())))
                        }
                    }
                    if all.endpoints.len() + all.regions.len() > limit {
                        return Err(coordinator.protocol("sent too many records".into()));
                    }
                }
                all.sort();
                Ok(all)
            }
            Role::Coordinator { members } => {
                let mut all = mine.clone();
                all.endpoints.extend(relayed.endpoints.iter().cloned());
                all.regions.extend(relayed.regions.iter().cloned());
                for ch in members.iter_mut() {
                    let mut count = 0usize;
                    loop {
                        match ch.recv_meeting(deadline, true)? {
                            Message::Endpoint(e) if e.node_id == ch.peer_id => {
                                all.endpoints.push(e)
                            }
                            Message::Region(r) if r.node_id == ch.peer_id => all.regions.push(r),
                            Message::Endpoint(_) | Message::Region(_) => {
                                return Err(ch
                                    .protocol("published a record under another node's id".into()))
                            }
                            Message::Barrier { name, epoch: e }
                                if name == EXCHANGE && e == epoch =>
                            {
                                break
                            }
                            m => {
                                return Err(ch.protocol(format!(
                                    "unexpected {} during the exchange",
                                    m.kind()
                                )))
                            }
                        }
                        count += 1;
                        if count > RECORDS_PER_NODE_MAX {
                            return Err(ch.protocol(format!(
                                "published more than {RECORDS_PER_NODE_MAX} records"
                            )));
                        }
                    }
                }
                all.sort();
                for ch in members.iter_mut() {
                    ch.send_records(&all)?;
                    ch.send(&Message::BarrierRelease {
                        name: EXCHANGE.into(),
                        epoch,
                    })?;
                }
                Ok(all)
            }
        }
    }

    /// As [`barrier`](Self::barrier), but a stop request
    /// ([`ChannelOptions::cancel`]) does not end its waits; the barrier
    /// timeout still does. For the meetings a run that was stopped still
    /// needs (its nodes check together what it left); the channels'
    /// cancel hooks hold again afterwards.
    pub fn barrier_past_stop(&mut self, name: &str) -> Result<(), ChannelError> {
        let held: Vec<Option<Cancel>> = self.channels().map(|ch| ch.cancel.take()).collect();
        let r = self.barrier(name);
        for (ch, cancel) in self.channels().zip(held) {
            ch.cancel = cancel;
        }
        r
    }

    /// The channels this node waits on: the coordinator's to each member,
    /// or a member's to the coordinator.
    fn channels(&mut self) -> Box<dyn Iterator<Item = &mut ControlChannel> + '_> {
        match &mut self.role {
            Role::Coordinator { members } => Box::new(members.iter_mut()),
            Role::Member { coordinator } => Box::new(std::iter::once(coordinator)),
        }
    }

    /// Returns once every node has called `barrier` with the same name (and
    /// the same number of earlier barriers/exchanges); errors if a node
    /// arrives at a different barrier, leaves, or is later than the barrier
    /// timeout.
    pub fn barrier(&mut self, name: &str) -> Result<(), ChannelError> {
        self.barrier_within(name, self.barrier_timeout, false)
            .map(drop)
    }

    /// The last meeting of a run, with no bound on the wait: for the end
    /// of something whose length nobody knows beforehand (compute runs
    /// end when their clients do, after minutes or hours). Returns once
    /// every node has arrived at `name` or left: a member that leaves
    /// first (says goodbye, or its connection closes) counts as arrived,
    /// its part being over either way, and the coordinator returns the
    /// ids of those that left (a member returns none). A member fails
    /// when the coordinator leaves; any node, on a message that is not
    /// the barrier's, and on a stop request
    /// ([`ChannelOptions::cancel`]) within its poll. A node that hangs
    /// without leaving holds it until then.
    pub fn final_barrier(&mut self, name: &str) -> Result<Vec<u32>, ChannelError> {
        self.barrier_within(name, UNBOUNDED, true)
    }

    /// [`Rendezvous::final_barrier`], saying at the coordinator whom it
    /// still waits for: `waiting` is given their ids and how long this
    /// barrier has waited, once the arrivals already in are read, then
    /// whenever one more arrives or leaves while others are still awaited,
    /// and every `every` while the same ones are. So that a node that
    /// hangs is named rather than waited for in silence. A member tells
    /// nothing: it waits for the coordinator alone.
    pub fn final_barrier_telling(
        &mut self,
        name: &str,
        every: Duration,
        waiting: impl FnMut(&[u32], Duration),
    ) -> Result<Vec<u32>, ChannelError> {
        if !self.is_coordinator() {
            return self.final_barrier(name);
        }
        let r = self.final_meeting(name, every, waiting);
        self.pass_on(r)
    }

    /// The coordinator's part in [`Rendezvous::final_barrier_telling`]:
    /// it reads whichever member has something to say (poll(2) over their
    /// connections) rather than each in turn, so that it knows who is
    /// still out.
    fn final_meeting(
        &mut self,
        name: &str,
        every: Duration,
        mut waiting: impl FnMut(&[u32], Duration),
    ) -> Result<Vec<u32>, ChannelError> {
        assert!(
            name.len() <= NAME_BYTES_MAX,
            "barrier names are at most {NAME_BYTES_MAX} bytes"
        );
        let epoch = self.next_epoch();
        let frame_timeout = self.barrier_timeout;
        let Role::Coordinator { members } = &mut self.role else {
            unreachable!("only a coordinator meets the members itself");
        };
        let t0 = Instant::now();
        let mut pending: Vec<usize> = (0..members.len()).collect();
        let mut left = Vec::new();
        // Due at once: the first pass only reads what is in, then tells.
        let mut next_tell = t0;
        while !pending.is_empty() {
            if members.iter().any(|ch| cancelled(&ch.cancel)) {
                return Err(ChannelError::Cancelled);
            }
            let wait = CANCEL_POLL.min(next_tell.saturating_duration_since(Instant::now()));
            let ready = readable(members, &pending, wait)?;
            for &i in &ready {
                let ch = &mut members[i];
                // The member is readable: a bound for its frame alone.
                let got = ch.recv_meeting(Instant::now() + frame_timeout, true);
                if arrival(ch, got, name, epoch, true)? {
                    left.push(ch.peer_id);
                }
            }
            pending.retain(|i| !ready.contains(i));
            let now = Instant::now();
            if !pending.is_empty() && (!ready.is_empty() || now >= next_tell) {
                let ids: Vec<u32> = pending.iter().map(|&i| members[i].peer_id).collect();
                waiting(&ids, now - t0);
                next_tell = now + every;
            }
        }
        release(members, left, name, epoch, true)
    }

    /// Whether this node coordinates the rendezvous.
    pub fn is_coordinator(&self) -> bool {
        matches!(self.role, Role::Coordinator { .. })
    }

    /// A barrier that fails where the nodes have not all arrived within
    /// `barrier_timeout` of this call (the coordinator), or it is not
    /// released by then (a member); with
    /// `leaving_arrives`, a member that leaves counts as arrived (the
    /// coordinator returns their ids) rather than failing it.
    fn barrier_within(
        &mut self,
        name: &str,
        barrier_timeout: Duration,
        leaving_arrives: bool,
    ) -> Result<Vec<u32>, ChannelError> {
        let r = self.barrier_meeting(name, barrier_timeout, leaving_arrives);
        self.pass_on(r)
    }

    fn barrier_meeting(
        &mut self,
        name: &str,
        barrier_timeout: Duration,
        leaving_arrives: bool,
    ) -> Result<Vec<u32>, ChannelError> {
        assert!(
            name.len() <= NAME_BYTES_MAX,
            "barrier names are at most {NAME_BYTES_MAX} bytes"
        );
        let epoch = self.next_epoch();
        let deadline = Instant::now() + barrier_timeout;
        match &mut self.role {
            Role::Member { coordinator } => {
                coordinator.send_hearing(|c| {
                    c.send(&Message::Barrier {
                        name: name.into(),
                        epoch,
                    })
                })?;
                match coordinator.recv_meeting(deadline, false)? {
                    Message::BarrierRelease { name: n, epoch: e } if n == name && e == epoch => {
                        Ok(Vec::new())
                    }
                    m => Err(coordinator.protocol(format!(
                        "expected the release of barrier `{name}`, got {m:?}"
                    ))),
                }
            }
            Role::Coordinator { members } => {
                let mut left = Vec::new();
                for ch in members.iter_mut() {
                    let got = ch.recv_meeting(deadline, true);
                    if arrival(ch, got, name, epoch, leaving_arrives)? {
                        left.push(ch.peer_id);
                    }
                }
                release(members, left, name, epoch, leaving_arrives)
            }
        }
    }

    /// A barrier at which the nodes also agree on a value (such as the
    /// workload every compute node must run): a node passes `Some(value)`
    /// to require it, or `None` to accept whatever the others hold. Every
    /// node returns the agreed value (`None` if nobody held one), or every
    /// node fails with [`ChannelError::Disagreed`] naming which node held
    /// what — before any of them goes on.
    pub fn agree(
        &mut self,
        name: &str,
        mine: Option<&str>,
    ) -> Result<Option<String>, ChannelError> {
        let r = self.agree_meeting(name, mine);
        self.pass_on(r)
    }

    fn agree_meeting(
        &mut self,
        name: &str,
        mine: Option<&str>,
    ) -> Result<Option<String>, ChannelError> {
        assert!(
            name.len() < NAME_BYTES_MAX && !name.contains(['=', '?', '!']),
            "agree: a plain name within {NAME_BYTES_MAX} bytes"
        );
        // A value from the caller's input that does not fit fails here,
        // on every node given it, before anything is sent.
        if let Some(v) = mine {
            agreement_fits(name, v).map_err(ChannelError::Limit)?;
        }
        let own = Agreed::Held(mine.map(str::to_string)).tag(name);
        let epoch = self.next_epoch();
        let deadline = Instant::now() + self.barrier_timeout;
        let me = self.node_id;
        let (release, from) = match &mut self.role {
            Role::Member { coordinator } => {
                coordinator.send_hearing(|c| c.send(&Message::Barrier { name: own, epoch }))?;
                match coordinator.recv_meeting(deadline, false)? {
                    Message::BarrierRelease { name: n, epoch: e } if e == epoch => {
                        (n, coordinator.peer_id)
                    }
                    m => {
                        return Err(coordinator
                            .protocol(format!("expected the release of `{name}`, got {m:?}")))
                    }
                }
            }
            Role::Coordinator { members } => {
                let mut held: Vec<(u32, Option<String>)> = vec![(me, mine.map(str::to_string))];
                for ch in members.iter_mut() {
                    let got = match ch.recv_meeting(deadline, true)? {
                        Message::Barrier { name: n, epoch: e } if e == epoch => n,
                        m => {
                            return Err(ch.protocol(format!(
                                "expected barrier `{name}` (epoch {epoch}), got {m:?}"
                            )))
                        }
                    };
                    let Some(Agreed::Held(value)) = Agreed::untag(name, &got) else {
                        return Err(ch.protocol(format!("expected barrier `{name}`, got `{got}`")));
                    };
                    held.push((ch.peer_id, value));
                }
                let mut values: Vec<&String> =
                    held.iter().filter_map(|(_, v)| v.as_ref()).collect();
                values.sort();
                values.dedup();
                let release = match values.as_slice() {
                    [] => Agreed::Held(None).tag(name),
                    [one] => Agreed::Held(Some(one.to_string())).tag(name),
                    _ => {
                        let who: Vec<String> = held
                            .iter()
                            .filter_map(|(id, v)| v.as_ref().map(|v| format!("node {id}: {v}")))
                            .collect();
                        let mut why = who.join("; ");
                        // Within a frame's name, on a character boundary.
                        let room = NAME_BYTES_MAX - name.len() - 1;
                        if why.len() > room {
                            let mut cut = room.saturating_sub(3);
                            while !why.is_char_boundary(cut) {
                                cut -= 1;
                            }
                            why.truncate(cut);
                            why.push_str("...");
                        }
                        Agreed::Refused(why).tag(name)
                    }
                };
                for ch in members.iter_mut() {
                    ch.send(&Message::BarrierRelease {
                        name: release.clone(),
                        epoch,
                    })?;
                }
                (release, me)
            }
        };
        match Agreed::untag(name, &release) {
            Some(Agreed::Held(v)) => Ok(v),
            Some(Agreed::Refused(why)) => {
                Err(ChannelError::Disagreed(format!("at `{name}`: {why}")))
            }
            None => Err(ChannelError::Protocol {
                peer: from,
                why: format!("the release of `{name}` was `{release}`"),
            }),
        }
    }

    /// Leaves the run before taking part in it, for `why` (cut to
    /// [`wire::WHY_BYTES_MAX`] bytes): a member tells the coordinator, which
    /// tells every other member at its next meeting; a coordinator tells
    /// every member. Each of them then fails that meeting with
    /// [`ChannelError::Withdrew`] naming this node and `why`, rather than
    /// waiting for it until a timeout. Errs when a member could not tell
    /// the coordinator; a coordinator's sends are best effort.
    pub fn withdraw(self, why: &str) -> Result<(), ChannelError> {
        let m = Message::Withdraw {
            node_id: self.node_id,
            why: why.to_string(),
        };
        match self.role {
            Role::Member {
                coordinator: mut ch,
            } => {
                ch.send(&m)?;
                ch.linger_closed();
            }
            Role::Coordinator { mut members } => {
                for ch in &mut members {
                    let _ = ch.send(&m);
                }
                for ch in members {
                    ch.linger_closed();
                }
            }
        }
        Ok(())
    }

    /// As coordinator, passes on the withdrawal `r` holds, if it does, to
    /// every member but the one that withdrew (best effort: one that
    /// cannot be told fails on its own), so each fails at its next
    /// meeting naming the node and why, not at its timeout.
    fn pass_on<T>(&mut self, r: Result<T, ChannelError>) -> Result<T, ChannelError> {
        if let (Err(ChannelError::Withdrew { node, why }), Role::Coordinator { members }) =
            (&r, &mut self.role)
        {
            for ch in members.iter_mut().filter(|ch| ch.peer_id != *node) {
                let _ = ch.send(&Message::Withdraw {
                    node_id: *node,
                    why: why.clone(),
                });
            }
        }
        r
    }

    /// Says goodbye to every connected node and closes the connections.
    pub fn close(mut self) {
        let chans: Vec<&mut ControlChannel> = match &mut self.role {
            Role::Member { coordinator } => vec![coordinator],
            Role::Coordinator { members } => members.iter_mut().collect(),
        };
        for ch in chans {
            // Best effort: the peer may be gone already.
            let _ = ch.send(&Message::Bye);
        }
    }

    fn next_epoch(&mut self) -> u64 {
        let e = self.epoch;
        self.epoch += 1;
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Two ends of one loopback TCP connection: the dialler's, then the
    /// acceptor's.
    fn loopback() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dialled = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (dialled, l.accept().unwrap().0)
    }

    /// A peer that reads a trickle lets each write(2) make progress within
    /// any per-call timeout, yet the write as a whole ends at its deadline.
    #[test]
    fn a_trickling_reader_cannot_stretch_a_write_past_its_deadline() {
        let (tx, rx) = loopback();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 16384];
                // Relaxed: a flag polled between reads, ordering nothing.
                while !stop.load(Ordering::Relaxed) {
                    match (&rx).read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        // At most 1.6 MB/s: 256 MiB (more than any
                        // socket buffers hold) take minutes.
                        Ok(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        let t0 = Instant::now();
        let r = DeadlineWriter {
            stream: &tx,
            deadline: t0 + Duration::from_millis(300),
        }
        .write_all(&vec![0u8; 256 << 20]);
        let took = t0.elapsed();
        let e = r.unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{e:?}"
        );
        assert!(took < Duration::from_secs(3), "took {took:?}");
        stop.store(true, Ordering::Relaxed);
        drop(tx);
        reader.join().unwrap();
    }

    /// Past its deadline a read still takes what has already arrived, and
    /// fails at once where nothing has.
    #[test]
    fn a_read_past_its_deadline_takes_what_has_arrived() {
        let (mut tx, rx) = loopback();
        let mut r = DeadlineReader {
            stream: &rx,
            deadline: Instant::now(),
            cancel: &None,
        };
        let mut buf = [0u8; 8];
        let t0 = Instant::now();
        let e = r.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(1));
        tx.write_all(b"arrived").unwrap();
        // Loopback delivers at once, but give it a moment on a busy host.
        let until = Instant::now() + Duration::from_secs(5);
        let n = loop {
            match r.read(&mut buf) {
                Ok(n) => break n,
                Err(e) if Instant::now() < until => {
                    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("{e:?}"),
            }
        };
        assert_eq!(&buf[..n], b"arrived");
    }
}
