//! What a peer must know to connect a queue pair and name memory: the
//! queue pair's number, LID, GID, initial PSN, MTU and how many READs and
//! atomics it serves at once, and the regions it exposes (space, offset
//! range, remote base address, rkey, rights). Bootstrap carries the
//! encoded bytes over its authenticated channel.
//!
//! Wire format (little-endian): magic `LCEP`, version u16 = 2, node u16,
//! qpn u32, psn u32, lid u16, mtu u8, rd_atom u8, region count u8,
//! gid [16], then per region: space u8, access u8, rkey u32, offset u64,
//! len u64, base u64.
//! Decoding rejects bad magic, versions, truncation, trailing bytes and
//! out-of-range fields with an [`EndpointError`], never a panic.

use crate::addr::{GlobalAddr, NodeId, Space};
use crate::nic::RemoteRegion;
use crate::verbs::{Access, RKey};
use std::fmt;

const MAGIC: &[u8; 4] = b"LCEP";
const VERSION: u16 = 2;
const HEADER_BYTES: usize = 4 + 2 + 2 + 4 + 4 + 2 + 1 + 1 + 1 + 16;
const REGION_BYTES: usize = 1 + 1 + 4 + 8 + 8 + 8;
/// Most regions one endpoint may carry.
pub const MAX_ENDPOINT_REGIONS: usize = 8;
/// QP numbers and PSNs are 24-bit on the wire (IBA 9.2).
const MAX_24: u32 = (1 << 24) - 1;

/// The queue-pair half of an endpoint: what `rtr_attr` needs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    pub qpn: u32,
    /// The first PSN this QP sends with (the peer's `rq_psn`).
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// `ibv_mtu` value: 1 (256 B) … 5 (4096 B).
    pub mtu: u8,
    /// READs and atomics this QP serves at once as a responder (its
    /// `max_dest_rd_atomic`, at least 1): the peer issues at most that
    /// many (its `max_rd_atomic`), or the responder may refuse the excess.
    pub rd_atom: u8,
}

/// A region a memory node exposes, with the address the NIC names its
/// first byte by (`base`: a virtual address, or 0 for zero-based device
/// memory).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    pub region: RemoteRegion,
    pub base: u64,
}

/// A node's endpoint for one queue pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub node: NodeId,
    pub qp: QpEndpoint,
    pub regions: Vec<RegionInfo>,
}

/// Why bytes are not an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointError {
    Truncated { need: usize, have: usize },
    TrailingBytes { extra: usize },
    BadMagic,
    BadVersion(u16),
    BadField { field: &'static str, value: u64 },
    TooManyRegions(usize),
}

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointError::Truncated { need, have } => {
                write!(f, "endpoint truncated: need {need} bytes, have {have}")
            }
            EndpointError::TrailingBytes { extra } => {
                write!(f, "endpoint followed by {extra} unexpected bytes")
            }
            EndpointError::BadMagic => write!(f, "not a Loch endpoint (bad magic)"),
            EndpointError::BadVersion(v) => write!(
                f,
                "endpoint version {v} is not {VERSION} (every node must run the same Loch)"
            ),
            EndpointError::BadField { field, value } => {
                write!(f, "endpoint field {field} has invalid value {value}")
            }
            EndpointError::TooManyRegions(n) => {
                write!(
                    f,
                    "endpoint has {n} regions, at most {MAX_ENDPOINT_REGIONS}"
                )
            }
        }
    }
}

impl std::error::Error for EndpointError {}

impl Endpoint {
    /// Encodes; refuses what `decode` would refuse, so a round trip holds.
    pub fn encode(&self) -> Result<Vec<u8>, EndpointError> {
        self.validate()?;
        let mut b = Vec::with_capacity(HEADER_BYTES + REGION_BYTES * self.regions.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.node.to_le_bytes());
        b.extend_from_slice(&self.qp.qpn.to_le_bytes());
        b.extend_from_slice(&self.qp.psn.to_le_bytes());
        b.extend_from_slice(&self.qp.lid.to_le_bytes());
        b.push(self.qp.mtu);
        b.push(self.qp.rd_atom);
        b.push(self.regions.len() as u8);
        b.extend_from_slice(&self.qp.gid);
        for r in &self.regions {
            b.push(r.region.space as u8);
            b.push(r.region.access.bits());
            b.extend_from_slice(&r.region.rkey.0.to_le_bytes());
            b.extend_from_slice(&r.region.offset.to_le_bytes());
            b.extend_from_slice(&r.region.len.to_le_bytes());
            b.extend_from_slice(&r.base.to_le_bytes());
        }
        Ok(b)
    }

    /// Decodes bytes from a peer, checking every field.
    pub fn decode(bytes: &[u8]) -> Result<Endpoint, EndpointError> {
        if bytes.len() < HEADER_BYTES {
            return Err(EndpointError::Truncated {
                need: HEADER_BYTES,
                have: bytes.len(),
            });
        }
        if &bytes[0..4] != MAGIC {
            return Err(EndpointError::BadMagic);
        }
        let mut r = Reader { b: bytes, at: 4 };
        let version = r.u16();
        if version != VERSION {
            return Err(EndpointError::BadVersion(version));
        }
        let node = r.u16();
        let qpn = r.u32();
        let psn = r.u32();
        let lid = r.u16();
        let mtu = r.u8();
        let rd_atom = r.u8();
        let n = r.u8() as usize;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(r.take(16));
        let need = HEADER_BYTES + n * REGION_BYTES;
        if bytes.len() < need {
            return Err(EndpointError::Truncated {
                need,
                have: bytes.len(),
            });
        }
        if bytes.len() > need {
            return Err(EndpointError::TrailingBytes {
                extra: bytes.len() - need,
            });
        }
        let mut regions = Vec::with_capacity(n);
        for _ in 0..n {
            let space = match r.u8() {
                0 => Space::Host,
                1 => Space::Device,
                v => {
                    return Err(EndpointError::BadField {
                        field: "region space",
                        value: v as u64,
                    })
                }
            };
            let access_bits = r.u8();
            let access = Access::from_bits(access_bits).ok_or(EndpointError::BadField {
                field: "region access",
                value: access_bits as u64,
            })?;
            let rkey = RKey(r.u32());
            let offset = r.u64();
            let len = r.u64();
            let base = r.u64();
            regions.push(RegionInfo {
                region: RemoteRegion {
                    space,
                    offset,
                    len,
                    rkey,
                    access,
                },
                base,
            });
        }
        let ep = Endpoint {
            node,
            qp: QpEndpoint {
                qpn,
                psn,
                lid,
                gid,
                mtu,
                rd_atom,
            },
            regions,
        };
        ep.validate()?;
        Ok(ep)
    }

    fn validate(&self) -> Result<(), EndpointError> {
        let bad = |field, value: u64| Err(EndpointError::BadField { field, value });
        if self.regions.len() > MAX_ENDPOINT_REGIONS {
            return Err(EndpointError::TooManyRegions(self.regions.len()));
        }
        if self.qp.qpn > MAX_24 {
            return bad("qpn", self.qp.qpn as u64);
        }
        if self.qp.psn > MAX_24 {
            return bad("psn", self.qp.psn as u64);
        }
        if !(1..=5).contains(&self.qp.mtu) {
            return bad("mtu", self.qp.mtu as u64);
        }
        if self.qp.rd_atom == 0 {
            return bad("rd_atom", 0);
        }
        for r in &self.regions {
            let reg = &r.region;
            if reg.len == 0 {
                return bad("region len", 0);
            }
            match reg.offset.checked_add(reg.len) {
                Some(end) if end <= GlobalAddr::MAX_OFFSET + 1 => {}
                _ => return bad("region offset+len", reg.offset),
            }
            if r.base.checked_add(reg.len).is_none() {
                return bad("region base", r.base);
            }
        }
        Ok(())
    }

    /// The regions as the contract sees them.
    pub fn remote_regions(&self) -> Vec<RemoteRegion> {
        self.regions.iter().map(|r| r.region).collect()
    }
}

/// Reads fixed-width fields; the caller checked the length first.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().expect("2 bytes"))
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
}
