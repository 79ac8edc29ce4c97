//! A short, deterministic fuzz run on the stable toolchain: the entry
//! points of the cargo-fuzz targets (`bootstrap/fuzz`: `wire_decode`,
//! `config_parse`) fed with seeded mutations of their corpus files and of
//! valid encodings. CI runs this; the open-ended libFuzzer run needs
//! nightly (`cd bootstrap/fuzz && cargo +nightly fuzz run wire_decode`).
//!
//! Checks: nothing panics (errors are fine, and their messages render);
//! whatever decodes re-encodes to the same bytes and decodes equal again.

mod common;

use std::io::Cursor;
use std::path::{Path, PathBuf};

use bootstrap::config::ClusterConfig;
use bootstrap::wire::{read_frame, read_message, Message};

/// Mutations per seed input.
const MUTATIONS: usize = 20_000;
/// The RNG seed; a failure message names the input and mutation index, so
/// a failing case reproduces exactly.
const SEED: u64 = 0x10c4_f022_5eed_0001;

/// splitmix64: small, fast, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Length values that sit on the edges of the frame bound and of `u32`.
const INTERESTING_LENGTHS: [u32; 8] = [0, 1, 4, 37, 65_535, 65_536, 65_537, u32::MAX];

/// One to four stacked mutations of `input`; `others` are splice partners.
/// `len_at` is where a 4-byte big-endian length field sits, if any.
fn mutate(rng: &mut Rng, input: &[u8], others: &[Vec<u8>], len_at: Option<usize>) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(8) {
            // Bit flip.
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            // Random byte.
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            // Truncation.
            2 => {
                let n = rng.below(v.len() + 1);
                v.truncate(n);
            }
            // Byte insert.
            3 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
            // Byte delete.
            4 if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            // Length-field corruption: an edge value, or off by a little.
            5 => {
                if let Some(at) = len_at.filter(|&a| a + 4 <= v.len()) {
                    let old = u32::from_be_bytes(v[at..at + 4].try_into().unwrap());
                    let new = if rng.below(2) == 0 {
                        INTERESTING_LENGTHS[rng.below(INTERESTING_LENGTHS.len())]
                    } else {
                        old.wrapping_add(rng.below(9) as u32).wrapping_sub(4)
                    };
                    v[at..at + 4].copy_from_slice(&new.to_be_bytes());
                } else if !v.is_empty() {
                    // No length field: corrupt a 4-byte window anywhere.
                    let i = rng.below(v.len());
                    for b in v.iter_mut().skip(i).take(4) {
                        *b = 0xff;
                    }
                }
            }
            // Splice: our prefix, another input's suffix.
            6 if !others.is_empty() => {
                let o = &others[rng.below(others.len())];
                let cut = rng.below(v.len() + 1);
                let from = rng.below(o.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&o[from..]);
            }
            // Duplicate a chunk in place.
            _ if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = a + rng.below((v.len() - a).min(16) + 1);
                let chunk = v[a..b].to_vec();
                let at = rng.below(v.len() + 1);
                v.splice(at..at, chunk);
            }
            _ => v.push(rng.next() as u8),
        }
    }
    v
}

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
        .collect();
    files.sort();
    files
}

/// What the `wire_decode` target does with one input, plus the round trip
/// of a body through `encode_body`.
fn wire_decode(data: &[u8], what: &str) -> usize {
    let mut decoded = 0;
    let mut stream = Cursor::new(data);
    while let Ok(m) = read_message(&mut stream) {
        decoded += 1;
        let again = Message::decode_body(&m.encode_frame()[4..])
            .unwrap_or_else(|e| panic!("{what}: {m:?} re-encodes to an undecodable body: {e}"));
        assert_eq!(again, m, "{what}");
    }
    let mut stream = Cursor::new(data);
    if let Err(e) = read_frame(&mut stream) {
        let _ = e.to_string();
    }
    match Message::decode_body(data) {
        Ok(m) => {
            decoded += 1;
            let frame = m.encode_frame();
            assert_eq!(&frame[4..], data, "{what}: {m:?} re-encodes differently");
            let mut body = Vec::new();
            m.encode_body(&mut body);
            assert_eq!(body, data, "{what}");
            assert_eq!(Message::decode_body(&body).unwrap(), m, "{what}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    decoded
}

#[test]
fn wire_decode_survives_mutated_frames_and_bodies() {
    let mut seeds: Vec<(String, Vec<u8>)> = corpus("wire_decode")
        .into_iter()
        .map(|(p, b)| (p.display().to_string(), b))
        .collect();
    let mut stream = Vec::new();
    for (i, m) in common::sample_messages().into_iter().enumerate() {
        let frame = m.encode_frame();
        seeds.push((
            format!("body of message {i} ({})", m.kind()),
            frame[4..].to_vec(),
        ));
        seeds.push((
            format!("frame of message {i} ({})", m.kind()),
            frame.clone(),
        ));
        stream.extend_from_slice(&frame);
    }
    seeds.push(("a stream of every message".into(), stream));
    let partners: Vec<Vec<u8>> = seeds.iter().map(|(_, b)| b.clone()).collect();
    let (mut rng, mut decoded) = (Rng(SEED), 0usize);
    for (name, input) in &seeds {
        // Frames and streams have their length at 0; bodies have none.
        let len_at = (!name.starts_with("body")).then_some(0);
        assert!(wire_decode(input, name) > 0, "{name}: a seed must decode");
        for k in 0..MUTATIONS {
            let m = mutate(&mut rng, input, &partners, len_at);
            decoded += wire_decode(&m, &format!("{name}, mutation {k} (seed {SEED:#x})"));
        }
    }
    // The mutations reached past the first check: some still decode.
    assert!(decoded > 1000, "only {decoded} mutated inputs decoded");
}

/// What the `config_parse` target does with one input.
fn config_parse(data: &[u8]) -> bool {
    let text = match std::str::from_utf8(data) {
        Ok(t) => t.to_string(),
        // The target skips non-UTF-8; here it is still worth a parse.
        Err(_) => String::from_utf8_lossy(data).into_owned(),
    };
    match ClusterConfig::parse(Path::new("fuzz.toml"), &text) {
        Ok(_) => true,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    }
}

#[test]
fn config_parse_survives_mutated_cluster_files() {
    let mut seeds: Vec<(String, Vec<u8>)> = corpus("config_parse")
        .into_iter()
        .map(|(p, b)| (p.display().to_string(), b))
        .collect();
    assert!(!seeds.is_empty(), "the config_parse corpus is missing");
    seeds.push((
        "generated emu cluster".into(),
        b"secret_file = \"s\"\nlock_table_words = 1024\nhuge_pages = false\n\n[backend]\nkind = \"emu\"\n\n[[nodes]]\nid = 0\nroles = [\"memory\"]\naddress = \"127.0.0.1:7000\"\nmemory = \"64MiB\"\n\n[[nodes]]\nid = 1\nroles = [\"compute\"]\naddress = \"127.0.0.1:7001\"\ncores = [0, 1]\n"
            .to_vec(),
    ));
    let partners: Vec<Vec<u8>> = seeds.iter().map(|(_, b)| b.clone()).collect();
    let (mut rng, mut parsed) = (Rng(SEED ^ 1), 0usize);
    for (name, input) in &seeds {
        assert!(config_parse(input), "{name}: a seed must parse");
        for _ in 0..MUTATIONS {
            let m = mutate(&mut rng, input, &partners, None);
            parsed += usize::from(config_parse(&m));
        }
    }
    // Some mutations (a changed comment, port or core) still parse.
    assert!(parsed > 100, "only {parsed} mutated files parsed");
}
