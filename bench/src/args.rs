//! A small command-line parser: `--flag value` and `--switch`, with errors
//! that name the flag. Malformed input is an error value (exit code 2 in
//! `main`), never a panic.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

#[derive(Debug)]
pub struct ArgError(pub String);

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parsed flags; each must be consumed, and leftovers are an error.
pub struct Args {
    values: BTreeMap<String, Vec<String>>,
    switches: Vec<String>,
}

/// The flags a command knows: those without a value, those with one, and
/// those of the latter that may be given more than once.
pub struct Flags<'a> {
    pub switches: &'a [&'a str],
    pub valued: &'a [&'a str],
    pub repeatable: &'a [&'a str],
}

impl Flags<'_> {
    fn knows(&self, name: &str) -> bool {
        self.switches.contains(&name) || self.valued.contains(&name)
    }

    /// `unknown flag `--x``, with the nearest known flag when one is close.
    fn unknown(&self, name: &str) -> ArgError {
        let near = self
            .switches
            .iter()
            .chain(self.valued)
            .map(|k| (edit_distance(name, k), *k))
            .filter(|&(d, k)| d <= 2.max(k.len() / 4))
            .min();
        ArgError(match near {
            Some((_, k)) => format!("unknown flag `--{name}`: did you mean `--{k}`?"),
            None => format!("unknown flag `--{name}`"),
        })
    }
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

impl Args {
    /// Parses `raw` against the command's `flags`: an unknown flag is named
    /// as such (before any question of its value).
    pub fn parse(raw: &[String], flags: &Flags<'_>) -> Result<Args, ArgError> {
        let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut found = Vec::new();
        let mut it = raw.iter();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else {
                return Err(ArgError(format!(
                    "unexpected argument `{a}` (flags start with --)"
                )));
            };
            let (name, inline) = match name.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (name, None),
            };
            if !flags.knows(name) {
                return Err(flags.unknown(name));
            }
            if flags.switches.contains(&name) {
                if inline.is_some() {
                    return Err(ArgError(format!("--{name} takes no value")));
                }
                found.push(name.to_string());
                continue;
            }
            let v = match inline {
                Some(v) => v,
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| ArgError(format!("--{name} needs a value")))?,
            };
            let slot = values.entry(name.to_string()).or_default();
            if !slot.is_empty() && !flags.repeatable.contains(&name) {
                return Err(ArgError(format!("--{name} given twice")));
            }
            slot.push(v);
        }
        Ok(Args {
            values,
            switches: found,
        })
    }

    /// Every value of a repeatable flag, in order.
    pub fn strings(&mut self, name: &str) -> Vec<String> {
        self.values.remove(name).unwrap_or_default()
    }

    pub fn switch(&mut self, name: &str) -> bool {
        let had = self.switches.iter().any(|s| s == name);
        self.switches.retain(|s| s != name);
        had
    }

    pub fn string(&mut self, name: &str) -> Option<String> {
        self.values.remove(name).and_then(|mut v| v.pop())
    }

    pub fn get<T: FromStr>(&mut self, name: &str, default: T) -> Result<T, ArgError> {
        match self.string(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| ArgError(format!("--{name}: cannot parse `{v}`"))),
        }
    }

    /// The flag's value if given, parsed.
    pub fn get_opt<T: FromStr>(&mut self, name: &str) -> Result<Option<T>, ArgError> {
        match self.string(name) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| ArgError(format!("--{name}: cannot parse `{v}`"))),
        }
    }

    /// Errors if any flag was not consumed.
    pub fn finish(self) -> Result<(), ArgError> {
        if let Some(k) = self.values.keys().next() {
            return Err(ArgError(format!("unknown flag --{k}")));
        }
        if let Some(s) = self.switches.first() {
            return Err(ArgError(format!("unknown flag --{s}")));
        }
        Ok(())
    }
}

/// Parses sizes like `8`, `1k`, `1KiB`, `4m`.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    const FLAGS: Flags = Flags {
        switches: &["json"],
        valued: &["size", "depth", "a", "ops", "secs", "fault"],
        repeatable: &["fault"],
    };

    #[test]
    fn parses_and_rejects() {
        let mut a = Args::parse(&v("--size 1k --json --depth=16"), &FLAGS).unwrap();
        assert!(a.switch("json"));
        assert_eq!(a.get("depth", 1usize).unwrap(), 16);
        assert_eq!(a.string("size").as_deref(), Some("1k"));
        assert_eq!(a.get_opt::<u64>("depth").unwrap(), None, "consumed");
        a.finish().unwrap();
        assert!(Args::parse(&v("--size"), &FLAGS).is_err());
        assert!(Args::parse(&v("size 3"), &FLAGS).is_err());
        assert!(Args::parse(&v("--a 1 --a 2"), &FLAGS).is_err());
        let mut a = Args::parse(&v("--depth x --ops 1"), &FLAGS).unwrap();
        assert!(a.get("depth", 1usize).is_err());
        assert!(a.finish().is_err(), "--ops left unconsumed");
        let mut a = Args::parse(&v("--ops 5 --secs x"), &FLAGS).unwrap();
        assert_eq!(a.get_opt::<u64>("ops").unwrap(), Some(5));
        assert!(a.get_opt::<f64>("secs").unwrap_err().0.contains("--secs"));
        a.finish().unwrap();
        assert_eq!(parse_size("1KiB"), Some(1024));
        assert_eq!(parse_size("4m"), Some(4 << 20));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn unknown_flags_are_named_before_their_values() {
        let e = Args::parse(&v("--jsn"), &FLAGS).err().unwrap().0;
        assert_eq!(e, "unknown flag `--jsn`: did you mean `--json`?");
        let e = Args::parse(&v("--bogus 1"), &FLAGS).err().unwrap().0;
        assert_eq!(e, "unknown flag `--bogus`");
    }

    #[test]
    fn repeatable_flags_keep_every_value() {
        let mut a = Args::parse(&v("--fault x --fault=y"), &FLAGS).unwrap();
        assert_eq!(a.strings("fault"), ["x", "y"]);
        a.finish().unwrap();
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
