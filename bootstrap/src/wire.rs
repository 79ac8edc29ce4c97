//! Control-channel messages and their bytes on the wire.
//!
//! Owns the frame format and the message encoding. A frame is a big-endian
//! `u32` body length (at most [`FRAME_BYTES_MAX`]) followed by the body: one
//! tag byte and the message's fields, fixed-width big-endian integers, and
//! strings as a `u16` length plus UTF-8 bytes; a Hello's last field, the
//! protocol version, is absent for version 1 (whose builds had no such
//! field). Hand-rolled, so the format is
//! exactly what this file says and nothing a serializer might change.
//!
//! After the handshake the channel appends a 32-byte MAC to each body
//! (see [`crate::auth::SessionMac`]); the frame length covers it.
//!
//! Promises: decoding never panics and never allocates more than the frame
//! bound, whatever the bytes; truncated bodies, unknown tags, trailing bytes,
//! out-of-range fields and oversized frames are each a [`WireError`].

use std::fmt;
use std::io::{self, Read, Write};

use crate::auth::{MAC_BYTES, NONCE_BYTES};

/// The largest body a frame may carry. Control messages are tiny; the bound
/// only stops a peer from making us allocate.
pub const FRAME_BYTES_MAX: usize = 64 * 1024;
/// The longest barrier name.
pub const NAME_BYTES_MAX: usize = 256;
/// The longest reason a [`Message::Withdraw`] carries: a line or a few.
pub const WHY_BYTES_MAX: usize = 1024;
/// The control protocol this build speaks, sent in its [`Message::Hello`]:
/// raised whenever a message's bytes or meaning change, so that nodes of
/// different builds are refused at the handshake, naming both versions,
/// rather than failing later on a record one of them cannot read. 1:
/// builds whose Hello ended at the nonce (the last of them sent Endpoint
/// records with `rd_atom`, the earlier ones without); 2: the Hello carries
/// the version; 3: a node that will not take part in a run says why
/// ([`Message::Withdraw`]); 4: the version is in the authenticated
/// transcript ([`crate::auth::Transcript::protocol`]), so that a version
/// rewritten on the path fails the proofs (both ends also require an
/// exact match, and a build that accepts more than one version relies on
/// the binding).
pub const PROTOCOL: u16 = 4;

/// A reliable-connection queue pair's address, as the peer needs it to move
/// its own QP to RTR (IB spec vol. 1 §11.2.4.2, `ibv_modify_qp` attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QpInfo {
    /// 24-bit QP number.
    pub qpn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// 24-bit initial packet sequence number.
    pub psn: u32,
    /// `ibv_mtu` code: 1 (256 B) ..= 5 (4096 B).
    pub mtu: u8,
    /// READs and atomics the QP serves at once as a responder (its
    /// `max_dest_rd_atomic`, at least 1): the peer issues no more.
    pub rd_atom: u8,
}

/// Which memory a region lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Space {
    Host = 0,
    /// NIC device memory (the lock table of the tree's on-chip locks).
    Device = 1,
}

/// `node_id`'s queue pair meant to connect to node `peer_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub node_id: u32,
    pub peer_id: u32,
    pub qp: QpInfo,
}

/// Memory `node_id` exports: `len` bytes at `base` in `space`, reachable
/// with `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Region {
    pub node_id: u32,
    pub space: Space,
    pub base: u64,
    pub len: u64,
    pub rkey: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Hello {
        node_id: u32,
        nonce: [u8; NONCE_BYTES],
        /// The sender's [`PROTOCOL`]. A Hello that ends at the nonce is
        /// 1, as its builds sent it (and as 1 encodes); 0 is refused.
        protocol: u16,
    },
    Auth {
        mac: [u8; MAC_BYTES],
    },
    Endpoint(Endpoint),
    Region(Region),
    Barrier {
        name: String,
        epoch: u64,
    },
    BarrierRelease {
        name: String,
        epoch: u64,
    },
    Bye,
    /// Node `node_id` will not take part in this run, for `why` (at most
    /// [`WHY_BYTES_MAX`] bytes): sent by that node, or by the coordinator
    /// passing it on to the others.
    Withdraw {
        node_id: u32,
        why: String,
    },
}

const TAG_HELLO: u8 = 1;
const TAG_AUTH: u8 = 2;
const TAG_ENDPOINT: u8 = 3;
const TAG_REGION: u8 = 4;
const TAG_BARRIER: u8 = 5;
const TAG_BARRIER_RELEASE: u8 = 6;
const TAG_BYE: u8 = 7;
const TAG_WITHDRAW: u8 = 8;

#[derive(Debug)]
pub enum WireError {
    /// The peer closed the connection between frames.
    Closed,
    /// No byte arrived (or could be sent) within the timeout.
    Timeout,
    Io(io::Error),
    /// A frame length over the bound.
    Oversized {
        len: u64,
        max: usize,
    },
    /// A frame with no tag byte.
    Empty,
    UnknownTag(u8),
    /// The body ended inside `field`.
    Truncated {
        field: &'static str,
    },
    /// Bytes left after the message's last field.
    Trailing {
        extra: usize,
    },
    /// A field out of its range.
    Invalid {
        field: &'static str,
        why: &'static str,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Closed => write!(f, "the peer closed the connection"),
            WireError::Timeout => write!(f, "timed out waiting for the peer"),
            WireError::Io(e) => write!(f, "control channel I/O: {e}"),
            WireError::Oversized { len, max } => {
                write!(f, "frame of {len} bytes exceeds the {max}-byte bound")
            }
            WireError::Empty => write!(f, "empty frame (no message tag)"),
            WireError::UnknownTag(t) => write!(f, "unknown message tag {t}"),
            WireError::Truncated { field } => write!(f, "message truncated in field `{field}`"),
            WireError::Trailing { extra } => write!(f, "{extra} trailing bytes after the message"),
            WireError::Invalid { field, why } => write!(f, "field `{field}` is invalid: {why}"),
        }
    }
}

impl std::error::Error for WireError {}

fn io_error(e: io::Error) -> WireError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => WireError::Timeout,
        io::ErrorKind::UnexpectedEof => WireError::Closed,
        _ => WireError::Io(e),
    }
}

impl Message {
    /// Appends this message's body (tag and fields, no length) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Message::Hello {
                node_id,
                nonce,
                protocol,
            } => {
                out.push(TAG_HELLO);
                out.extend_from_slice(&node_id.to_be_bytes());
                out.extend_from_slice(nonce);
                // Protocol 1's Hello ended at the nonce (one encoding a
                // message: what decodes re-encodes to the same bytes).
                if *protocol != 1 {
                    out.extend_from_slice(&protocol.to_be_bytes());
                }
            }
            Message::Auth { mac } => {
                out.push(TAG_AUTH);
                out.extend_from_slice(mac);
            }
            Message::Endpoint(Endpoint {
                node_id,
                peer_id,
                qp,
            }) => {
                out.push(TAG_ENDPOINT);
                out.extend_from_slice(&node_id.to_be_bytes());
                out.extend_from_slice(&peer_id.to_be_bytes());
                out.extend_from_slice(&qp.qpn.to_be_bytes());
                out.extend_from_slice(&qp.lid.to_be_bytes());
                out.extend_from_slice(&qp.gid);
                out.extend_from_slice(&qp.psn.to_be_bytes());
                out.push(qp.mtu);
                out.push(qp.rd_atom);
            }
            Message::Region(Region {
                node_id,
                space,
                base,
                len,
                rkey,
            }) => {
                out.push(TAG_REGION);
                out.extend_from_slice(&node_id.to_be_bytes());
                out.push(*space as u8);
                out.extend_from_slice(&base.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(&rkey.to_be_bytes());
            }
            Message::Barrier { name, epoch } | Message::BarrierRelease { name, epoch } => {
                out.push(if matches!(self, Message::Barrier { .. }) {
                    TAG_BARRIER
                } else {
                    TAG_BARRIER_RELEASE
                });
                // Names are bounded on construction by the channel; encode
                // stays total by clipping.
                put_string(out, name, NAME_BYTES_MAX);
                out.extend_from_slice(&epoch.to_be_bytes());
            }
            Message::Bye => out.push(TAG_BYE),
            Message::Withdraw { node_id, why } => {
                out.push(TAG_WITHDRAW);
                out.extend_from_slice(&node_id.to_be_bytes());
                put_string(out, why, WHY_BYTES_MAX);
            }
        }
    }

    /// The whole frame: length prefix and body.
    pub fn encode_frame(&self) -> Vec<u8> {
        let mut out = vec![0u8; 4];
        self.encode_body(&mut out);
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        out
    }

    /// Decodes one body (without its length prefix).
    pub fn decode_body(body: &[u8]) -> Result<Message, WireError> {
        if body.len() > FRAME_BYTES_MAX {
            return Err(WireError::Oversized {
                len: body.len() as u64,
                max: FRAME_BYTES_MAX,
            });
        }
        let (&tag, rest) = body.split_first().ok_or(WireError::Empty)?;
        let mut r = Reader { buf: rest };
        let msg = match tag {
            TAG_HELLO => Message::Hello {
                node_id: r.u32("node_id")?,
                nonce: r.array("nonce")?,
                protocol: if r.buf.is_empty() {
                    1
                } else {
                    match r.u16("protocol")? {
                        0 | 1 => {
                            return Err(WireError::Invalid {
                                field: "protocol",
                                why: "1 is sent as no field, and 0 is none",
                            })
                        }
                        p => p,
                    }
                },
            },
            TAG_AUTH => Message::Auth {
                mac: r.array("mac")?,
            },
            TAG_ENDPOINT => read_endpoint(&mut r)?,
            TAG_REGION => read_region(&mut r)?,
            TAG_BARRIER | TAG_BARRIER_RELEASE => read_barrier(&mut r, tag)?,
            TAG_BYE => Message::Bye,
            TAG_WITHDRAW => Message::Withdraw {
                node_id: r.u32("node_id")?,
                why: r.string("why", WHY_BYTES_MAX, "longer than 1024 bytes")?,
            },
            t => return Err(WireError::UnknownTag(t)),
        };
        if !r.buf.is_empty() {
            return Err(WireError::Trailing { extra: r.buf.len() });
        }
        Ok(msg)
    }

    /// A short name for errors ("expected Auth, got Region").
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "Hello",
            Message::Auth { .. } => "Auth",
            Message::Endpoint(_) => "Endpoint",
            Message::Region(_) => "Region",
            Message::Barrier { .. } => "Barrier",
            Message::BarrierRelease { .. } => "BarrierRelease",
            Message::Bye => "Bye",
            Message::Withdraw { .. } => "Withdraw",
        }
    }
}

/// An endpoint record: ids, then the queue pair (24-bit QPN and PSN, an
/// ibv_mtu code, a READ/atomic depth of at least 1).
fn read_endpoint(r: &mut Reader<'_>) -> Result<Message, WireError> {
    let node_id = r.u32("node_id")?;
    let peer_id = r.u32("peer_id")?;
    let qp = QpInfo {
        qpn: r.u32("qpn")?,
        lid: r.u16("lid")?,
        gid: r.array("gid")?,
        psn: r.u32("psn")?,
        mtu: r.u8("mtu")?,
        rd_atom: r.u8("rd_atom")?,
    };
    if qp.qpn > 0x00ff_ffff {
        return Err(WireError::Invalid {
            field: "qpn",
            why: "wider than 24 bits",
        });
    }
    if qp.psn > 0x00ff_ffff {
        return Err(WireError::Invalid {
            field: "psn",
            why: "wider than 24 bits",
        });
    }
    if !(1..=5).contains(&qp.mtu) {
        return Err(WireError::Invalid {
            field: "mtu",
            why: "not an ibv_mtu code 1..=5",
        });
    }
    if qp.rd_atom == 0 {
        return Err(WireError::Invalid {
            field: "rd_atom",
            why: "a queue pair serves at least one READ or atomic at once",
        });
    }
    Ok(Message::Endpoint(Endpoint {
        node_id,
        peer_id,
        qp,
    }))
}

/// A region record: a space, and a base and length that do not overflow.
fn read_region(r: &mut Reader<'_>) -> Result<Message, WireError> {
    let node_id = r.u32("node_id")?;
    let space = match r.u8("space")? {
        0 => Space::Host,
        1 => Space::Device,
        _ => {
            return Err(WireError::Invalid {
                field: "space",
                why: "not 0 (host) or 1 (device)",
            })
        }
    };
    let base = r.u64("base")?;
    let len = r.u64("len")?;
    let rkey = r.u32("rkey")?;
    if base.checked_add(len).is_none() {
        return Err(WireError::Invalid {
            field: "len",
            why: "base + len overflows",
        });
    }
    Ok(Message::Region(Region {
        node_id,
        space,
        base,
        len,
        rkey,
    }))
}

/// A barrier (or its release): a UTF-8 name of at most 256 bytes and an
/// epoch.
fn read_barrier(r: &mut Reader<'_>, tag: u8) -> Result<Message, WireError> {
    let name = r.string("name", NAME_BYTES_MAX, "longer than 256 bytes")?;
    let epoch = r.u64("epoch")?;
    Ok(if tag == TAG_BARRIER {
        Message::Barrier { name, epoch }
    } else {
        Message::BarrierRelease { name, epoch }
    })
}

/// Appends `s` as a string field: a `u16` length and UTF-8 bytes, clipped
/// to `max` bytes at a character boundary.
fn put_string(out: &mut Vec<u8>, s: &str, max: usize) {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_be_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated { field });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, field)?);
        Ok(a)
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(field)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }
    /// A string field of at most `max` bytes; `too_long` says the bound.
    fn string(
        &mut self,
        field: &'static str,
        max: usize,
        too_long: &'static str,
    ) -> Result<String, WireError> {
        let n = self.u16(field)? as usize;
        if n > max {
            return Err(WireError::Invalid {
                field,
                why: too_long,
            });
        }
        let bytes = self.take(n, field)?;
        Ok(std::str::from_utf8(bytes)
            .map_err(|_| WireError::Invalid {
                field,
                why: "not UTF-8",
            })?
            .to_string())
    }
}

/// Reads one frame's body. The length is checked against the bound before
/// anything is allocated. Timeouts are the stream's (`set_read_timeout`).
pub fn read_frame(r: &mut impl Read) -> Result<Vec<u8>, WireError> {
    let mut len = [0u8; 4];
    // A clean close before the first length byte is `Closed`; one inside a
    // frame is a truncated frame.
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(WireError::Closed),
            Ok(0) => {
                return Err(WireError::Truncated {
                    field: "frame length",
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(e)),
        }
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(WireError::Oversized {
            len: len as u64,
            max: FRAME_BYTES_MAX,
        });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => WireError::Truncated {
            field: "frame body",
        },
        _ => io_error(e),
    })?;
    Ok(body)
}

/// Reads and decodes one message.
pub fn read_message(r: &mut impl Read) -> Result<Message, WireError> {
    Message::decode_body(&read_frame(r)?)
}

/// Writes one frame whose body is `parts` concatenated (a message body and
/// the channel's MAC trailer).
pub fn write_frame(w: &mut impl Write, parts: &[&[u8]]) -> Result<(), WireError> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    debug_assert!(
        len <= FRAME_BYTES_MAX,
        "control frames are small by construction"
    );
    let mut frame = Vec::with_capacity(4 + len);
    frame.extend_from_slice(&(len as u32).to_be_bytes());
    for p in parts {
        frame.extend_from_slice(p);
    }
    w.write_all(&frame).map_err(io_error)?;
    w.flush().map_err(io_error)
}

/// Writes one message as a single frame. Timeouts are the stream's
/// (`set_write_timeout`).
pub fn write_message(w: &mut impl Write, m: &Message) -> Result<(), WireError> {
    let frame = m.encode_frame();
    debug_assert!(frame.len() - 4 <= FRAME_BYTES_MAX);
    w.write_all(&frame).map_err(io_error)?;
    w.flush().map_err(io_error)
}
