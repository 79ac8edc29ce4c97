//! Mutual authentication of two control-channel ends by HMAC-SHA256 over the
//! pre-shared cluster secret.
//!
//! Owns the cluster secret in memory and the MACs of the handshake. Promises:
//! each side proves knowledge of the secret over a transcript holding both
//! fresh nonces, both node ids and a direction label, so a recorded proof is
//! worthless on a new connection (the other side's nonce differs: no replay)
//! and a proof cannot be bounced back to its sender (the label differs: no
//! reflection). MACs are compared in constant time.
//!
//! The exchange (initiator I dials responder R):
//! ```text
//! I → R  Hello{id_I, n_I, v_I}
//! R → I  Hello{id_R, n_R, v_R}     (v: the control protocol, wire::PROTOCOL;
//!                                  each end refuses another, R after its Hello)
//! I → R  Auth{HMAC(K, "loch-ctl-v1 initiator" ‖ id_I ‖ id_R ‖ n_I ‖ n_R)}
//!        R checks it; on failure R closes and I learned only n_R.
//! R → I  Auth{HMAC(K, "loch-ctl-v1 responder" ‖ id_I ‖ id_R ‖ n_I ‖ n_R)}
//! ```
//! R proves itself only after I has, so a client without the secret learns
//! nothing but a nonce (and which protocol R speaks, as any build's source
//! says); I sends nothing but its proof until R has proven
//! itself, so a fake responder learns nothing either.
//!
//! After the handshake every frame carries a [`SessionMac`] trailer keyed by
//! HMAC(K, "loch-ctl-v1 session" ‖ transcript), over the sender's direction,
//! a per-direction sequence number and the body: whoever sits on the path
//! cannot inject, alter, reorder or replay control messages.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Bytes of a nonce, and of a MAC.
pub const NONCE_BYTES: usize = 32;
pub const MAC_BYTES: usize = 32;
/// The shortest secret we accept: the HMAC-SHA256 key strength.
pub const SECRET_BYTES_MIN: usize = 32;
/// The longest: a key, not a file's worth of data.
pub const SECRET_BYTES_MAX: usize = 4096;

const LABEL_INITIATOR: &[u8] = b"loch-ctl-v1 initiator";
const LABEL_RESPONDER: &[u8] = b"loch-ctl-v1 responder";

/// Which end of the handshake a proof (or frame) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Initiator = 0,
    Responder = 1,
}

/// The pre-shared cluster secret. Its bytes never appear in `Debug` output
/// and are overwritten on drop.
pub struct ClusterSecret(Vec<u8>);

impl ClusterSecret {
    /// Callers check the length (config does); shorter keys still work but
    /// are weaker, so this asserts in debug builds.
    pub fn new(bytes: Vec<u8>) -> ClusterSecret {
        debug_assert!(bytes.len() >= SECRET_BYTES_MIN);
        ClusterSecret(bytes)
    }
}

impl Clone for ClusterSecret {
    fn clone(&self) -> Self {
        ClusterSecret(self.0.clone())
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret(<{} bytes>)", self.0.len())
    }
}

impl Drop for ClusterSecret {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // Volatile so the wipe is not optimised away as a dead store.
            // SAFETY: `b` is a valid, aligned, exclusive reference.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// Everything both sides bind their proofs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript {
    /// The control protocol both Hellos named ([`crate::wire::PROTOCOL`]):
    /// bound into the proofs, so that a version rewritten on the path
    /// fails them.
    pub protocol: u16,
    pub initiator_id: u32,
    pub responder_id: u32,
    pub initiator_nonce: [u8; NONCE_BYTES],
    pub responder_nonce: [u8; NONCE_BYTES],
}

impl Transcript {
    fn mac(&self, secret: &ClusterSecret, dir: Direction) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&secret.0)
            .expect("HMAC takes keys of any length");
        m.update(match dir {
            Direction::Initiator => LABEL_INITIATOR,
            Direction::Responder => LABEL_RESPONDER,
        });
        // Fixed-width fields: no two transcripts encode alike.
        m.update(&self.protocol.to_be_bytes());
        m.update(&self.initiator_id.to_be_bytes());
        m.update(&self.responder_id.to_be_bytes());
        m.update(&self.initiator_nonce);
        m.update(&self.responder_nonce);
        m
    }

    /// The proof `dir`'s side sends.
    pub fn prove(&self, secret: &ClusterSecret, dir: Direction) -> [u8; MAC_BYTES] {
        let out = self.mac(secret, dir).finalize().into_bytes();
        let mut mac = [0u8; MAC_BYTES];
        mac.copy_from_slice(&out);
        mac
    }

    /// Whether `mac` is `dir`'s proof; constant-time in the MAC's contents.
    #[must_use]
    pub fn verify(&self, secret: &ClusterSecret, dir: Direction, mac: &[u8; MAC_BYTES]) -> bool {
        self.mac(secret, dir).verify_slice(mac).is_ok()
    }
}

impl Transcript {
    /// The per-connection MAC state for frames after the handshake, seen
    /// from `local`'s end. Its key is derived from the secret and the whole
    /// transcript, so it is fresh per connection.
    pub fn session(&self, secret: &ClusterSecret, local: Direction) -> SessionMac {
        // Both ends derive the same key; frames differ by the direction
        // byte each MAC covers.
        let mut k = <Hmac<Sha256> as KeyInit>::new_from_slice(&secret.0)
            .expect("HMAC takes keys of any length");
        k.update(LABEL_SESSION);
        k.update(&self.initiator_id.to_be_bytes());
        k.update(&self.responder_id.to_be_bytes());
        k.update(&self.initiator_nonce);
        k.update(&self.responder_nonce);
        let mut key = [0u8; MAC_BYTES];
        key.copy_from_slice(&k.finalize().into_bytes());
        SessionMac {
            key,
            local,
            sent: 0,
            received: 0,
        }
    }
}

const LABEL_SESSION: &[u8] = b"loch-ctl-v1 session";

/// Integrity for the frames that follow the handshake: each carries
/// HMAC(session key, sender's direction ‖ sequence number ‖ body), so a
/// frame altered, injected, dropped, reordered or replayed by anyone on the
/// path fails the next check. (Integrity only: bodies travel in clear.)
pub struct SessionMac {
    key: [u8; MAC_BYTES],
    local: Direction,
    sent: u64,
    received: u64,
}

impl std::fmt::Debug for SessionMac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionMac")
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish()
    }
}

impl Drop for SessionMac {
    fn drop(&mut self) {
        for b in self.key.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl SessionMac {
    fn mac(&self, from: Direction, seq: u64, body: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .expect("HMAC takes keys of any length");
        m.update(&[from as u8]);
        m.update(&seq.to_be_bytes());
        m.update(body);
        m
    }

    /// The trailer for the next frame we send.
    pub fn seal(&mut self, body: &[u8]) -> [u8; MAC_BYTES] {
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(
            &self
                .mac(self.local, self.sent, body)
                .finalize()
                .into_bytes(),
        );
        self.sent += 1;
        out
    }

    /// Whether `mac` is the peer's trailer for its next frame `body`;
    /// constant-time in the MAC. Only an accepted frame advances the count.
    #[must_use]
    pub fn open(&mut self, body: &[u8], mac: &[u8]) -> bool {
        let from = match self.local {
            Direction::Initiator => Direction::Responder,
            Direction::Responder => Direction::Initiator,
        };
        let ok = self
            .mac(from, self.received, body)
            .verify_slice(mac)
            .is_ok();
        if ok {
            self.received += 1;
        }
        ok
    }
}

/// A fresh nonce from the operating system's generator.
pub fn fresh_nonce() -> std::io::Result<[u8; NONCE_BYTES]> {
    let mut n = [0u8; NONCE_BYTES];
    getrandom::fill(&mut n)
        .map_err(|e| std::io::Error::other(format!("no randomness for a nonce: {e}")))?;
    Ok(n)
}
