//! YCSB core-workload property files: the parser, and the workloads we ship
//! (bench/workloads/, embedded here so `--workload NAME` needs no path).
//!
//! The format is YCSB's (a Java properties subset): one `key=value` (or
//! `key: value`) per line, `#` or `!` comment lines, blank lines. Keys are
//! case-sensitive, as in YCSB; a key given twice keeps its last value.
//! Defaults are YCSB's `CoreWorkload` defaults (readproportion 0.95,
//! updateproportion 0.05, requestdistribution uniform, zipfianconstant 0.99,
//! maxscanlength 1000, scanlengthdistribution uniform, fieldcount 10,
//! fieldlength 100).
//!
//! What the parser promises: a malformed value, a proportion outside [0, 1],
//! proportions not summing to 1 (within 1e-6), a zipfian constant out of
//! range and an unsupported distribution are each an error naming the file,
//! the line and the problem; unknown keys are warnings, one per key. No input
//! makes it panic.

use std::collections::BTreeMap;
use std::fmt;

/// The workloads shipped in bench/workloads/, by name. A test checks that
/// this list and the folder agree.
pub const BUILTINS: [(&str, &str); 12] = [
    ("ycsb-a", include_str!("../workloads/ycsb-a")),
    ("ycsb-b", include_str!("../workloads/ycsb-b")),
    ("ycsb-c", include_str!("../workloads/ycsb-c")),
    ("ycsb-d", include_str!("../workloads/ycsb-d")),
    ("ycsb-e", include_str!("../workloads/ycsb-e")),
    ("ycsb-f", include_str!("../workloads/ycsb-f")),
    (
        "read-intensive",
        include_str!("../workloads/read-intensive"),
    ),
    (
        "write-intensive",
        include_str!("../workloads/write-intensive"),
    ),
    ("write-only", include_str!("../workloads/write-only")),
    ("insert-only", include_str!("../workloads/insert-only")),
    ("range-100", include_str!("../workloads/range-100")),
    ("range-1000", include_str!("../workloads/range-1000")),
];

/// The text of a shipped workload.
pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

pub fn builtin_names() -> String {
    BUILTINS.map(|(n, _)| n).join(", ")
}

/// YCSB's `requestdistribution`: how records are chosen.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RequestDist {
    Uniform,
    /// Zipfian over records, hot ones spread over the key space.
    Zipfian,
    /// Zipfian over recency: the newest records are the hottest (YCSB-D).
    Latest,
}

impl RequestDist {
    pub fn name(self) -> &'static str {
        match self {
            RequestDist::Uniform => "uniform",
            RequestDist::Zipfian => "zipfian",
            RequestDist::Latest => "latest",
        }
    }
}

/// YCSB's `scanlengthdistribution`, over `1..=maxscanlength`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ScanLengthDist {
    Uniform,
    /// Unscrambled zipfian (constant 0.99, as YCSB): short scans dominate.
    Zipfian,
    /// Every scan reads `maxscanlength` records (not YCSB's: for fixed
    /// range sizes such as Sherman §5.3's 100 and 1000).
    Constant,
}

/// Proportion keys, in the order of `run::KINDS`.
pub const PROPORTION_KEYS: [&str; 5] = [
    "readproportion",
    "updateproportion",
    "insertproportion",
    "scanproportion",
    "readmodifywriteproportion",
];

/// YCSB's defaults for the proportions above.
const PROPORTION_DEFAULTS: [f64; 5] = [0.95, 0.05, 0.0, 0.0, 0.0];

/// The longest scan a workload file may ask for: YCSB's own workloads ask
/// for 100, the paper's range experiment for 1000.
pub const MAX_SCAN_LENGTH: u64 = 100_000;

/// A parsed workload file. `None` means the file left it to the command
/// line (loch-bench's defaults then apply, not YCSB's toy-sized ones).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadFile {
    pub record_count: Option<u64>,
    /// Operations in all, over every client.
    pub operation_count: Option<u64>,
    /// read, update, insert, scan, read-modify-write; they sum to 1.
    pub proportions: [f64; 5],
    pub request_dist: RequestDist,
    pub zipfian_constant: f64,
    pub max_scan_length: u64,
    pub scan_length_dist: ScanLengthDist,
    /// Recorded for the report only: Loch's values are one 8-byte word.
    pub field_count: u64,
    pub field_length: u64,
}

impl WorkloadFile {
    /// The zipf constant the file asks for, 0 meaning uniform requests.
    pub fn zipf(&self) -> f64 {
        match self.request_dist {
            RequestDist::Uniform => 0.0,
            RequestDist::Zipfian | RequestDist::Latest => self.zipfian_constant,
        }
    }
}

/// A problem with a workload file: `FILE:LINE: what`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YcsbError {
    pub file: String,
    pub line: Option<usize>,
    pub msg: String,
    /// The warnings found before the error (a typo'd key often explains
    /// it), carried with it.
    pub warnings: Vec<String>,
}

impl fmt::Display for YcsbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}", self.file, l, self.msg)?,
            None => write!(f, "{}: {}", self.file, self.msg)?,
        }
        for w in &self.warnings {
            write!(f, "; also {w}")?;
        }
        Ok(())
    }
}

/// Whether `theta` is a zipf constant our generator takes: (0, 1) or (1, 5].
/// (Gray et al.'s formula divides by 1 - theta; beyond 5 nearly every draw
/// is the first item.)
pub fn zipf_constant_ok(theta: f64) -> bool {
    (theta > 0.0 && theta < 1.0) || (theta > 1.0 && theta <= 5.0)
}

const KNOWN_KEYS: [&str; 14] = [
    "recordcount",
    "operationcount",
    "readproportion",
    "updateproportion",
    "insertproportion",
    "scanproportion",
    "readmodifywriteproportion",
    "requestdistribution",
    "zipfianconstant",
    "maxscanlength",
    "scanlengthdistribution",
    "fieldlength",
    "fieldcount",
    "workload",
];

/// Parses `text`, read from `file` (named in messages). Returns the
/// workload and the warnings (unknown keys, keys given twice) for the
/// caller to print.
pub fn parse(file: &str, text: &str) -> Result<(WorkloadFile, Vec<String>), YcsbError> {
    let mut warnings = Vec::new();
    match parse_into(file, text, &mut warnings) {
        Ok(w) => Ok((w, warnings)),
        Err(mut e) => {
            e.warnings = warnings;
            Err(e)
        }
    }
}

/// The nearest known key to a misspelt one, if it is close.
fn nearest_key(key: &str) -> Option<&'static str> {
    KNOWN_KEYS
        .iter()
        .map(|k| (crate::args::edit_distance(&key.to_ascii_lowercase(), k), *k))
        .filter(|&(d, k)| d <= 2.max(k.len() / 6))
        .min()
        .map(|(_, k)| k)
}

/// A property file's `key=value` lines (the last of a key wins), with
/// typed reads that name the file and line of a bad value.
struct Props<'a> {
    file: &'a str,
    /// key -> (value, line).
    map: BTreeMap<&'a str, (&'a str, usize)>,
}

impl<'a> Props<'a> {
    /// Reads the lines of `text`; unknown keys and keys set twice are
    /// warnings, a line that is not `key=value` an error.
    fn read(
        file: &'a str,
        text: &'a str,
        warnings: &mut Vec<String>,
    ) -> Result<Props<'a>, YcsbError> {
        let mut props = Props {
            file,
            map: BTreeMap::new(),
        };
        let mut unknown_seen: Vec<&str> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let ln = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let Some(sep) = line.find(['=', ':']) else {
                return Err(props.err(
                    Some(ln),
                    format!("expected `key=value`, got `{}`", clip(line)),
                ));
            };
            let (key, value) = (line[..sep].trim(), line[sep + 1..].trim());
            if key.is_empty() {
                return Err(props.err(Some(ln), format!("no key before `=` in `{}`", clip(line))));
            }
            if !KNOWN_KEYS.contains(&key) {
                if !unknown_seen.contains(&key) {
                    unknown_seen.push(key);
                    let hint = match KNOWN_KEYS.iter().find(|k| k.eq_ignore_ascii_case(key)) {
                        Some(k) => format!(" (did you mean `{k}`? keys are case-sensitive)"),
                        None => nearest_key(key)
                            .map(|k| format!(": did you mean `{k}`?"))
                            .unwrap_or_default(),
                    };
                    warnings.push(format!(
                        "{file}:{ln}: unknown key `{}` ignored{hint}",
                        clip(key)
                    ));
                }
                continue;
            }
            if let Some((_, prev)) = props.map.insert(key, (value, ln)) {
                warnings.push(format!(
                    "{file}:{ln}: `{key}` set again (first on line {prev}); this value wins"
                ));
            }
        }
        Ok(props)
    }

    fn err(&self, line: Option<usize>, msg: String) -> YcsbError {
        YcsbError {
            file: self.file.to_string(),
            line,
            msg,
            warnings: Vec::new(),
        }
    }

    fn uint(&self, key: &str) -> Result<Option<(u64, usize)>, YcsbError> {
        let Some(&(v, ln)) = self.map.get(key) else {
            return Ok(None);
        };
        if v.is_empty() {
            return Err(self.err(Some(ln), format!("{key} has no value")));
        }
        if let Some(rest) = v.strip_prefix('-') {
            if rest.parse::<f64>().is_ok() {
                return Err(self.err(
                    Some(ln),
                    format!("{key}={v} is negative; it must be a whole number >= 0"),
                ));
            }
        }
        match v.parse::<u64>() {
            Ok(n) => Ok(Some((n, ln))),
            Err(_) => Err(self.err(
                Some(ln),
                format!("{key}=`{}` is not a whole number", clip(v)),
            )),
        }
    }

    fn float(&self, key: &str) -> Result<Option<(f64, usize)>, YcsbError> {
        let Some(&(v, ln)) = self.map.get(key) else {
            return Ok(None);
        };
        if v.is_empty() {
            return Err(self.err(Some(ln), format!("{key} has no value")));
        }
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(Some((x, ln))),
            _ => Err(self.err(Some(ln), format!("{key}=`{}` is not a number", clip(v)))),
        }
    }

    fn at_least_one(&self, key: &str) -> Result<Option<u64>, YcsbError> {
        match self.uint(key)? {
            Some((0, ln)) => Err(self.err(Some(ln), format!("{key}=0: it must be at least 1"))),
            other => Ok(other.map(|(n, _)| n)),
        }
    }

    /// `key`'s value among `choices` (name, value); `default` when unset.
    fn choice<T: Copy>(
        &self,
        key: &str,
        choices: &[(&str, T)],
        default: T,
    ) -> Result<T, YcsbError> {
        let Some(&(v, ln)) = self.map.get(key) else {
            return Ok(default);
        };
        match choices.iter().find(|(name, _)| *name == v) {
            Some(&(_, t)) => Ok(t),
            None => {
                let names: Vec<&str> = choices.iter().map(|c| c.0).collect();
                Err(self.err(
                    Some(ln),
                    format!(
                        "{key}=`{}` is not supported ({})",
                        clip(v),
                        names.join(", ")
                    ),
                ))
            }
        }
    }

    /// The operation proportions: YCSB's defaults, overridden by the file;
    /// each in [0, 1] and summing to 1.
    fn proportions(&self) -> Result<[f64; 5], YcsbError> {
        let mut proportions = PROPORTION_DEFAULTS;
        let mut given: [Option<usize>; 5] = [None; 5];
        for (i, key) in PROPORTION_KEYS.iter().enumerate() {
            if let Some((p, ln)) = self.float(key)? {
                if !(0.0..=1.0).contains(&p) {
                    return Err(self.err(Some(ln), format!("{key}={p} is outside [0, 1]")));
                }
                proportions[i] = p;
                given[i] = Some(ln);
            }
        }
        let sum: f64 = proportions.iter().sum();
        if (sum - 1.0).abs() <= 1e-6 {
            return Ok(proportions);
        }
        let terms: Vec<String> = PROPORTION_KEYS
            .iter()
            .zip(proportions)
            .zip(given)
            .filter(|((_, p), g)| *p != 0.0 || g.is_some())
            .map(|((k, p), g)| match g {
                Some(ln) => format!("{k}={p} (line {ln})"),
                None => format!("{k}={p} (YCSB's default; set it to change it)"),
            })
            .collect();
        Err(self.err(
            given.iter().flatten().max().copied(),
            format!(
                "proportions sum to {}, not 1: {}",
                // Nine decimals: 0.7 + 0.2 reads 0.9, not 0.8999999999999999.
                (sum * 1e9).round() / 1e9,
                if terms.is_empty() {
                    "all are 0".to_string()
                } else {
                    terms.join(" + ")
                }
            ),
        ))
    }
}

fn parse_into(
    file: &str,
    text: &str,
    warnings: &mut Vec<String>,
) -> Result<WorkloadFile, YcsbError> {
    let props = Props::read(file, text, warnings)?;
    let record_count = props.at_least_one("recordcount")?;
    let operation_count = match props.uint("operationcount")? {
        // YCSB reads 0 as "run until maxexecutiontime"; loch-bench has
        // --seconds for that.
        Some((0, ln)) => {
            return Err(props.err(
                Some(ln),
                "operationcount=0: it must be at least 1 (for a timed run use --seconds)".into(),
            ))
        }
        other => other.map(|(n, _)| n),
    };
    let proportions = props.proportions()?;
    let request_dist = props.choice(
        "requestdistribution",
        &[
            ("uniform", RequestDist::Uniform),
            ("zipfian", RequestDist::Zipfian),
            ("latest", RequestDist::Latest),
        ],
        RequestDist::Uniform,
    )?;
    let zipfian_constant = match props.float("zipfianconstant")? {
        None => 0.99,
        Some((t, _)) if zipf_constant_ok(t) => t,
        Some((t, ln)) => {
            return Err(props.err(
                Some(ln),
                format!("zipfianconstant={t} is out of range: it must be in (0, 1) or (1, 5]"),
            ))
        }
    };
    let max_scan_length = match props.uint("maxscanlength")? {
        None => 1000,
        Some((n, _)) if (1..=MAX_SCAN_LENGTH).contains(&n) => n,
        Some((n, ln)) => {
            return Err(props.err(
                Some(ln),
                format!("maxscanlength={n}: it must be 1 to {MAX_SCAN_LENGTH} (a scan's keys are held in memory, and a history keeps every one)"),
            ))
        }
    };
    let scan_length_dist = props.choice(
        "scanlengthdistribution",
        &[
            ("uniform", ScanLengthDist::Uniform),
            ("zipfian", ScanLengthDist::Zipfian),
            ("constant", ScanLengthDist::Constant),
        ],
        ScanLengthDist::Uniform,
    )?;
    Ok(WorkloadFile {
        record_count,
        operation_count,
        proportions,
        request_dist,
        zipfian_constant,
        max_scan_length,
        scan_length_dist,
        field_count: props.uint("fieldcount")?.map_or(10, |(n, _)| n),
        field_length: props.uint("fieldlength")?.map_or(100, |(n, _)| n),
    })
}

/// Long garbage stays out of the one-line error.
fn clip(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(MAX).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> WorkloadFile {
        let (w, warnings) = parse("t", text).unwrap_or_else(|e| panic!("{e}"));
        assert!(warnings.is_empty(), "{warnings:?}");
        w
    }

    fn bad(text: &str) -> String {
        match parse("wl.properties", text) {
            Ok(w) => panic!("accepted {text:?} as {w:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// The standard YCSB core workloads and the Sherman paper's mixes:
    /// (name, read, update, insert, scan, rmw, request distribution).
    const EXPECTED: [(&str, [f64; 5], RequestDist); 12] = [
        ("ycsb-a", [0.5, 0.5, 0.0, 0.0, 0.0], RequestDist::Zipfian),
        ("ycsb-b", [0.95, 0.05, 0.0, 0.0, 0.0], RequestDist::Zipfian),
        ("ycsb-c", [1.0, 0.0, 0.0, 0.0, 0.0], RequestDist::Zipfian),
        ("ycsb-d", [0.95, 0.0, 0.05, 0.0, 0.0], RequestDist::Latest),
        ("ycsb-e", [0.0, 0.0, 0.05, 0.95, 0.0], RequestDist::Zipfian),
        ("ycsb-f", [0.5, 0.0, 0.0, 0.0, 0.5], RequestDist::Zipfian),
        (
            "read-intensive",
            [0.95, 0.05, 0.0, 0.0, 0.0],
            RequestDist::Zipfian,
        ),
        (
            "write-intensive",
            [0.5, 0.5, 0.0, 0.0, 0.0],
            RequestDist::Zipfian,
        ),
        (
            "write-only",
            [0.0, 1.0, 0.0, 0.0, 0.0],
            RequestDist::Zipfian,
        ),
        (
            "insert-only",
            [0.0, 0.0, 1.0, 0.0, 0.0],
            RequestDist::Zipfian,
        ),
        ("range-100", [0.0, 0.0, 0.0, 1.0, 0.0], RequestDist::Uniform),
        (
            "range-1000",
            [0.0, 0.0, 0.0, 1.0, 0.0],
            RequestDist::Uniform,
        ),
    ];

    #[test]
    fn shipped_files_parse_to_the_standard_mixes() {
        for (name, props, dist) in EXPECTED {
            let text = builtin(name).unwrap_or_else(|| panic!("{name} not shipped"));
            let w = ok(text);
            assert_eq!(w.proportions, props, "{name}");
            assert_eq!(w.request_dist, dist, "{name}");
            assert_eq!(w.zipfian_constant, 0.99, "{name}");
            let uniform = dist == RequestDist::Uniform;
            assert_eq!(w.zipf(), if uniform { 0.0 } else { 0.99 }, "{name}");
            // Sizes are left to the command line.
            assert_eq!((w.record_count, w.operation_count), (None, None), "{name}");
        }
        let e = ok(builtin("ycsb-e").unwrap());
        assert_eq!(e.max_scan_length, 100);
        assert_eq!(e.scan_length_dist, ScanLengthDist::Uniform);
        for (name, len) in [("range-100", 100), ("range-1000", 1000)] {
            let r = ok(builtin(name).unwrap());
            assert_eq!(r.max_scan_length, len, "{name}");
            assert_eq!(r.scan_length_dist, ScanLengthDist::Constant, "{name}");
        }
        assert_eq!(EXPECTED.len(), BUILTINS.len());
    }

    #[test]
    fn the_builtin_table_is_the_workloads_folder() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        on_disk.sort();
        let mut table: Vec<String> = BUILTINS.iter().map(|(n, _)| n.to_string()).collect();
        table.sort();
        assert_eq!(on_disk, table);
        for (name, text) in BUILTINS {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), text);
        }
    }

    #[test]
    fn reads_every_key_and_ycsb_defaults() {
        let w = ok(
            "# c\n! also a comment\n\n  recordcount = 5000\noperationcount: 300\n\
                    readproportion=0.2\nupdateproportion=0.2\ninsertproportion=0.2\n\
                    scanproportion=0.2\nreadmodifywriteproportion=0.2\n\
                    requestdistribution=latest\nzipfianconstant=1.2\nmaxscanlength=7\n\
                    scanlengthdistribution=zipfian\nfieldlength=8\nfieldcount=1\n\
                    workload=site.ycsb.workloads.CoreWorkload\n",
        );
        assert_eq!(w.record_count, Some(5000));
        assert_eq!(w.operation_count, Some(300));
        assert_eq!(w.proportions, [0.2; 5]);
        assert_eq!(w.request_dist, RequestDist::Latest);
        assert_eq!(w.zipf(), 1.2);
        assert_eq!(w.max_scan_length, 7);
        assert_eq!(w.scan_length_dist, ScanLengthDist::Zipfian);
        assert_eq!((w.field_length, w.field_count), (8, 1));
        let d = ok("");
        assert_eq!(d.proportions, [0.95, 0.05, 0.0, 0.0, 0.0]);
        assert_eq!(d.request_dist, RequestDist::Uniform);
        assert_eq!(d.zipf(), 0.0);
        assert_eq!(
            (d.max_scan_length, d.field_count, d.field_length),
            (1000, 10, 100)
        );
    }

    #[test]
    fn rejects_malformed_values_naming_file_line_and_problem() {
        // YCSB's default proportions sum to 1, so each case has one fault.
        for (text, want) in [
            ("recordcount=lots\n", "wl.properties:1: recordcount=`lots` is not a whole number"),
            ("\nrecordcount=-5\n", "wl.properties:2: recordcount=-5 is negative"),
            ("recordcount=1.5\n", "wl.properties:1: recordcount=`1.5` is not a whole number"),
            ("recordcount=0\n", "wl.properties:1: recordcount=0: it must be at least 1"),
            ("operationcount=\n", "wl.properties:1: operationcount has no value"),
            ("operationcount=0\n", "wl.properties:1: operationcount=0: it must be at least 1"),
            ("maxscanlength=0\n", "wl.properties:1: maxscanlength=0"),
            (
                "maxscanlength=1000000000\n",
                "wl.properties:1: maxscanlength=1000000000: it must be 1 to 100000",
            ),
            ("fieldlength=-1\n", "wl.properties:1: fieldlength=-1 is negative"),
            ("readproportion=x\n", "wl.properties:1: readproportion=`x` is not a number"),
            ("readproportion=NaN\n", "wl.properties:1: readproportion=`NaN` is not a number"),
            ("readproportion=1.5\n", "wl.properties:1: readproportion=1.5 is outside [0, 1]"),
            ("updateproportion=-0.05\n", "wl.properties:1: updateproportion=-0.05 is outside [0, 1]"),
            (
                "readproportion=0.6\nupdateproportion=0.5\n",
                "wl.properties:2: proportions sum to 1.1, not 1: readproportion=0.6 (line 1) + updateproportion=0.5 (line 2)",
            ),
            (
                "readproportion=1\n",
                "wl.properties:1: proportions sum to 1.05, not 1: readproportion=1 (line 1) + updateproportion=0.05 (YCSB's default",
            ),
            (
                "readproportion=0\nupdateproportion=0\n",
                "wl.properties:2: proportions sum to 0, not 1",
            ),
            ("requestdistribution=hotspot\n", "wl.properties:1: requestdistribution=`hotspot` is not supported (uniform, zipfian, latest)"),
            ("requestdistribution=Zipfian\n", "requestdistribution=`Zipfian` is not supported"),
            ("scanlengthdistribution=latest\n", "wl.properties:1: scanlengthdistribution=`latest` is not supported (uniform, zipfian, constant)"),
            ("zipfianconstant=1\n", "wl.properties:1: zipfianconstant=1 is out of range: it must be in (0, 1) or (1, 5]"),
            ("zipfianconstant=0\n", "zipfianconstant=0 is out of range"),
            ("zipfianconstant=7.5\n", "zipfianconstant=7.5 is out of range"),
            ("zipfianconstant=-0.5\n", "zipfianconstant=-0.5 is out of range"),
            ("just some words\n", "wl.properties:1: expected `key=value`, got `just some words`"),
            ("=5\n", "wl.properties:1: no key before `=`"),
        ] {
            let got = bad(text);
            assert!(got.contains(want), "{text:?}:\n got  {got}\n want {want}");
        }
    }

    #[test]
    fn warns_once_per_unknown_key_and_on_repeats() {
        let (w, warnings) = parse(
            "f",
            "readproportion=1\nupdateproportion=0\ninsertorder=hashed\nhotspotdatafraction=0.2\n\
             insertorder=ordered\nReadProportion=0.5\nupdateproportion=0\n",
        )
        .unwrap();
        assert_eq!(w.proportions[0], 1.0);
        assert_eq!(
            warnings,
            vec![
                "f:3: unknown key `insertorder` ignored".to_string(),
                "f:4: unknown key `hotspotdatafraction` ignored".to_string(),
                "f:6: unknown key `ReadProportion` ignored (did you mean `readproportion`? keys are case-sensitive)".to_string(),
                "f:7: `updateproportion` set again (first on line 2); this value wins".to_string(),
            ]
        );
    }

    #[test]
    fn an_error_keeps_the_warnings_that_explain_it() {
        let e = parse("wl", "readproportion=0.5\nupdateproprotion=0.45\n").unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("wl:1: proportions sum to 0.55, not 1"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "; also wl:2: unknown key `updateproprotion` ignored: did you mean `updateproportion`?"
            ),
            "{text}"
        );
        assert_eq!(e.warnings.len(), 1);
        // Far from every key: no suggestion.
        let (_, w) = parse("wl", "readproportion=1\nupdateproportion=0\nbananas=3\n").unwrap();
        assert_eq!(w, ["wl:3: unknown key `bananas` ignored"]);
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = nicdrv::rng::Rng::new(7);
        let alphabet: Vec<char> = "=:#!-.e0123456789 \n\tabcdefghijklmnopqrstuvwxyzé\u{0}"
            .chars()
            .collect();
        for _ in 0..2000 {
            let len = rng.below(80) as usize;
            let s: String = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect();
            let _ = parse("g", &s);
            let keyed = format!(
                "{}={s}",
                KNOWN_KEYS[rng.below(KNOWN_KEYS.len() as u64) as usize]
            );
            let _ = parse("g", &keyed);
        }
    }
}
