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
    values: BTreeMap<String, String>,
    switches: Vec<String>,
}

impl Args {
    /// `switches` lists the flags that take no value.
    pub fn parse(raw: &[String], switches: &[&str]) -> Result<Args, ArgError> {
        let mut values = BTreeMap::new();
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
            if switches.contains(&name) {
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
            if values.insert(name.to_string(), v).is_some() {
                return Err(ArgError(format!("--{name} given twice")));
            }
        }
        Ok(Args {
            values,
            switches: found,
        })
    }

    pub fn switch(&mut self, name: &str) -> bool {
        let had = self.switches.iter().any(|s| s == name);
        self.switches.retain(|s| s != name);
        had
    }

    pub fn string(&mut self, name: &str) -> Option<String> {
        self.values.remove(name)
    }

    pub fn get<T: FromStr>(&mut self, name: &str, default: T) -> Result<T, ArgError> {
        match self.values.remove(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| ArgError(format!("--{name}: cannot parse `{v}`"))),
        }
    }

    /// The flag's value if given, parsed.
    pub fn get_opt<T: FromStr>(&mut self, name: &str) -> Result<Option<T>, ArgError> {
        match self.values.remove(name) {
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

    #[test]
    fn parses_and_rejects() {
        let mut a = Args::parse(&v("--size 1k --json --depth=16"), &["json"]).unwrap();
        assert!(a.switch("json"));
        assert_eq!(a.get("depth", 1usize).unwrap(), 16);
        assert_eq!(a.string("size").as_deref(), Some("1k"));
        assert_eq!(a.get_opt::<u64>("depth").unwrap(), None, "consumed");
        a.finish().unwrap();
        assert!(Args::parse(&v("--size"), &[]).is_err());
        assert!(Args::parse(&v("size 3"), &[]).is_err());
        assert!(Args::parse(&v("--a 1 --a 2"), &[]).is_err());
        let mut a = Args::parse(&v("--depth x --bogus 1"), &[]).unwrap();
        assert!(a.get("depth", 1usize).is_err());
        assert!(a.finish().is_err());
        let mut a = Args::parse(&v("--ops 5 --secs x"), &[]).unwrap();
        assert_eq!(a.get_opt::<u64>("ops").unwrap(), Some(5));
        assert!(a.get_opt::<f64>("secs").unwrap_err().0.contains("--secs"));
        a.finish().unwrap();
        assert_eq!(parse_size("1KiB"), Some(1024));
        assert_eq!(parse_size("4m"), Some(4 << 20));
        assert_eq!(parse_size("x"), None);
    }
}
