//! Transaction histories in Elle's list-append format, one JSON object a
//! line, so that an outside checker (Elle, or the `adya` crate our tests
//! use) can check them for strict serializability from the file alone:
//!
//! ```text
//! {"type":"invoke","f":"txn","process":3,"time":1200,"value":[["r",7,null],["append",9,41]]}
//! {"type":"ok","f":"txn","process":3,"time":5400,"value":[["r",7,[2,5]],["append",9,41]]}
//! ```
//!
//! A transaction is `invoke`d with its micro-operations (reads with a null
//! value), then completes `ok` with what its reads saw, `fail` when it
//! certainly did not commit (an abort), or `info` when it may or may not
//! have (a crash mid-commit: the checker must consider both). Written
//! values must be unique per key; the initial state is every list empty,
//! or what an initial transaction appended.

use std::fmt;

/// One micro-operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mop {
    /// A read of key `key`: `None` at invoke, the list seen at `ok`.
    Read { key: u64, seen: Option<Vec<u64>> },
    /// An append of `value` (unique for the key) to key `key`'s list.
    Append { key: u64, value: u64 },
}

/// How an event of a transaction stands.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Invoke,
    Ok,
    Fail,
    Info,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Invoke => "invoke",
            Kind::Ok => "ok",
            Kind::Fail => "fail",
            Kind::Info => "info",
        }
    }
}

/// One line of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    /// The client (a core's task) that ran it; one transaction at a time.
    pub process: u64,
    /// When, in ns of the run's clock (virtual on sim).
    pub time_ns: u64,
    pub mops: Vec<Mop>,
}

impl fmt::Display for Event {
    /// The event as one line of JSON (no newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            r#"{{"type":"{}","f":"txn","process":{},"time":{},"value":["#,
            self.kind.name(),
            self.process,
            self.time_ns
        )?;
        for (i, m) in self.mops.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match m {
                Mop::Append { key, value } => write!(f, r#"["append",{key},{value}]"#)?,
                Mop::Read { key, seen: None } => write!(f, r#"["r",{key},null]"#)?,
                Mop::Read { key, seen: Some(v) } => {
                    write!(f, r#"["r",{key},["#)?;
                    for (j, x) in v.iter().enumerate() {
                        if j > 0 {
                            f.write_str(",")?;
                        }
                        write!(f, "{x}")?;
                    }
                    f.write_str("]]")?;
                }
            }
        }
        f.write_str("]}")
    }
}

/// Events in the order they happened, for a run to write out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub events: Vec<Event>,
}

impl History {
    pub fn push(&mut self, kind: Kind, process: u64, time_ns: u64, mops: Vec<Mop>) {
        self.events.push(Event {
            kind,
            process,
            time_ns,
            mops,
        });
    }

    /// The history as JSON lines.
    pub fn to_json_lines(&self) -> String {
        let mut s = String::new();
        for e in &self.events {
            s.push_str(&e.to_string());
            s.push('\n');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_elle_list_append_json() {
        let e = Event {
            kind: Kind::Ok,
            process: 3,
            time_ns: 5400,
            mops: vec![
                Mop::Read {
                    key: 7,
                    seen: Some(vec![2, 5]),
                },
                Mop::Read { key: 8, seen: None },
                Mop::Append { key: 9, value: 41 },
            ],
        };
        assert_eq!(
            e.to_string(),
            r#"{"type":"ok","f":"txn","process":3,"time":5400,"value":[["r",7,[2,5]],["r",8,null],["append",9,41]]}"#
        );
        let empty = Event {
            kind: Kind::Info,
            process: 0,
            time_ns: 0,
            mops: vec![Mop::Read {
                key: 1,
                seen: Some(vec![]),
            }],
        };
        assert_eq!(
            empty.to_string(),
            r#"{"type":"info","f":"txn","process":0,"time":0,"value":[["r",1,[]]]}"#
        );
    }
}
