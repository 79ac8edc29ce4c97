//! A progress bar for the bulk load, drawn on stderr only when stderr is
//! a terminal (scripts and pipes see nothing).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Cells of the bar.
const WIDTH: usize = 30;
/// Redraws at most this often.
const EVERY: Duration = Duration::from_millis(100);

/// The bar's text for `done` of `total`: `[#####.....]  50% 5/10 label`.
pub fn bar(label: &str, done: u64, total: u64) -> String {
    let done = done.min(total);
    let frac = if total == 0 {
        1.0
    } else {
        done as f64 / total as f64
    };
    let full = ((frac * WIDTH as f64) as usize).min(WIDTH);
    format!(
        "[{}{}] {:>3.0}% {done}/{total} {label}",
        "#".repeat(full),
        ".".repeat(WIDTH - full),
        frac * 100.0
    )
}

pub struct Progress {
    label: String,
    total: u64,
    done: Arc<AtomicU64>,
    tty: bool,
    last: Option<Instant>,
}

impl Progress {
    pub fn new(label: impl Into<String>, total: u64) -> Progress {
        Progress {
            label: label.into(),
            total,
            done: Arc::new(AtomicU64::new(0)),
            tty: std::io::stderr().is_terminal(),
            last: None,
        }
    }

    /// Whether the bar is drawn at all (stderr is a terminal).
    pub fn shown(&self) -> bool {
        self.tty
    }

    /// What the loaders count into.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.done.clone()
    }

    /// Redraws the bar if it is due.
    pub fn tick(&mut self) {
        if !self.tty || self.last.is_some_and(|t| t.elapsed() < EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        self.draw("");
    }

    /// Draws the bar at its final count and ends the line.
    pub fn finish(&mut self) {
        if self.tty && self.last.is_some() {
            self.draw("\n");
        }
    }

    fn draw(&self, end: &str) {
        // Relaxed: a display figure; the loaders' own completion is what
        // the run waits for.
        let done = self.done.load(Ordering::Relaxed);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{}{end}", bar(&self.label, done, self.total));
        let _ = err.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_the_count() {
        assert_eq!(
            bar("records", 0, 10),
            format!("[{}]   0% 0/10 records", ".".repeat(WIDTH))
        );
        assert_eq!(
            bar("records", 5, 10),
            format!("[{}{}]  50% 5/10 records", "#".repeat(15), ".".repeat(15))
        );
        assert_eq!(
            bar("r", 12, 10),
            format!("[{}] 100% 10/10 r", "#".repeat(WIDTH))
        );
        assert!(bar("r", 0, 0).contains("100%"));
    }
}
