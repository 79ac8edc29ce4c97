//! What `loch-bench`'s command lines share: the error of bad input, the
//! backend choice, sizes with units and suggestions.
//! Malformed input is an error value (exit code 2 in `main`), never a
//! panic.

use std::fmt;

#[derive(Debug)]
pub struct ArgError(pub String);

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which backend a benchmark runs on (case-insensitive on the command
/// line).
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    // This host: memory nodes as shared mappings, pinned threads, the wall
    // clock.
    Emu,
    // The deterministic cluster simulator, in virtual time.
    Sim,
}

impl Backend {
    /// The cluster backend this choice boots: emu threads (pinned with
    /// `pin`), or a simulated world of `compute_nodes` compute nodes with
    /// `seed`, the default model and no faults.
    pub fn cluster(self, pin: bool, seed: u64, compute_nodes: usize) -> cluster::Backend {
        match self {
            Backend::Emu => cluster::Backend::Emu { pin },
            Backend::Sim => cluster::Backend::Sim {
                seed,
                compute_nodes,
                model: nicdrv::sim::SimModel::default(),
                faults: Vec::new(),
            },
        }
    }
}

/// Parses sizes like `8`, `1k`, `1KiB`, `4m`, `8MiB`.
pub fn parse_size(s: &str) -> Option<usize> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = t.strip_suffix("kib").or_else(|| t.strip_suffix('k')) {
        (n, 1usize << 10)
    } else if let Some(n) = t.strip_suffix("mib").or_else(|| t.strip_suffix('m')) {
        (n, 1 << 20)
    } else {
        (t.as_str(), 1)
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mult)
}

/// A size flag's value parser: bytes, with an optional k/KiB or m/MiB.
pub fn size_value(s: &str) -> Result<usize, String> {
    parse_size(s).ok_or_else(|| format!("cannot parse `{s}` as a size (such as 64, 4k, 1MiB)"))
}

/// Levenshtein distance, for suggestions.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("1KiB"), Some(1024));
        assert_eq!(parse_size("4m"), Some(4 << 20));
        assert_eq!(parse_size(" 8 "), Some(8));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999999999999m"), None);
        assert!(size_value("lots").unwrap_err().contains("`lots`"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
