//! A progress bar for the bulk load, drawn on stderr only when stderr is
//! a terminal (scripts and pipes see nothing). The drawing is indicatif's:
//! the time left, redraws rate-limited, the line redrawn in place; the
//! loaders only bump a counter.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How the bar reads: `[#####.....]  50% 500,000/1,000,000 records loaded
/// (sherman), 3s left`.
const TEMPLATE: &str = "[{bar:30}] {percent:>3}% {human_pos}/{human_len} {msg}, {eta} left";

pub struct Progress {
    bar: ProgressBar,
    done: Arc<AtomicU64>,
    tty: bool,
}

impl Progress {
    pub fn new(label: impl Into<String>, total: u64) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let target = if tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        // The template is a constant: a mistake in it is a bug, caught by
        // the test below.
        if let Ok(style) = ProgressStyle::with_template(TEMPLATE) {
            bar.set_style(style.progress_chars("#."));
        }
        bar.set_message(label.into());
        Progress {
            bar,
            done: Arc::new(AtomicU64::new(0)),
            tty,
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

    /// Brings the bar up to the loaders' count (indicatif redraws it at
    /// most 20 times a second).
    pub fn tick(&mut self) {
        // Relaxed: a display figure; the loaders' own completion is what
        // the run waits for.
        self.bar.set_position(self.done.load(Ordering::Relaxed));
    }

    /// Draws the bar at its final count and ends the line.
    pub fn finish(&mut self) {
        self.tick();
        self.bar.finish();
        if self.tty {
            // indicatif leaves the cursor on the bar's line; what follows
            // starts on its own.
            cmdline::errln!();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_parses_and_the_bar_follows_the_count() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
        let mut p = Progress::new("records", 10);
        p.counter().fetch_add(5, Ordering::Relaxed);
        p.tick();
        assert_eq!(p.bar.position(), 5);
        p.counter().fetch_add(5, Ordering::Relaxed);
        p.finish();
        assert_eq!(p.bar.position(), 10);
        assert!(p.bar.is_finished());
    }
}
