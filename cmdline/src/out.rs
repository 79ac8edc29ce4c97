//! Standard output that ends quietly when its reader goes away:
//! `loch-bench … | head -1` must not panic (Rust's `println!` does on a
//! closed pipe, and SIGPIPE is ignored in Rust programs, so every write
//! sees EPIPE). The first failed write marks stdout closed and runs the
//! program's hook once (e.g. ask the run to stop); every later write is
//! dropped. Use the [`outln!`](crate::outln!) and [`out!`](crate::out!)
//! macros as `println!` and `print!`.
//!
//! Standard error likewise: `eprintln!` panics when stderr is a closed
//! pipe (`loch demo --processes 2>&1 | head -2`), so progress, warnings
//! and errors go through [`errln!`](crate::errln!) and
//! [`err!`](crate::err!), which drop what a closed stderr cannot take.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static CLOSED: AtomicBool = AtomicBool::new(false);
static ON_CLOSE: OnceLock<fn()> = OnceLock::new();

/// Runs `hook` once, on the first write that finds stdout closed (the
/// first hook set stays).
pub fn on_close(hook: fn()) {
    let _ = ON_CLOSE.set(hook);
}

/// Whether a write found stdout closed.
pub fn closed() -> bool {
    // Relaxed: a flag with no data behind it.
    CLOSED.load(Ordering::Relaxed)
}

/// Writes to stdout (flushed: lines reach a pipe as they are printed);
/// after the reader has gone, does nothing.
pub fn print(args: std::fmt::Arguments<'_>) {
    if closed() {
        return;
    }
    let mut o = std::io::stdout().lock();
    // Relaxed: the swap only picks the one writer that runs the hook.
    if o.write_fmt(args).and_then(|_| o.flush()).is_err() && !CLOSED.swap(true, Ordering::Relaxed) {
        if let Some(hook) = ON_CLOSE.get() {
            hook();
        }
    }
}

/// `println!` to stdout through [`print()`](crate::out::print).
#[macro_export]
macro_rules! outln {
    () => { $crate::out::print(format_args!("\n")) };
    ($($t:tt)*) => { $crate::out::print(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` to stdout through [`print()`](crate::out::print).
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::print(format_args!($($t)*)) };
}

/// Writes to stderr (unbuffered, as `eprint!`); a write that fails (a
/// closed pipe) is dropped: there is nowhere left to say it.
pub fn eprint(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `eprintln!` to stderr through [`eprint()`](crate::out::eprint).
#[macro_export]
macro_rules! errln {
    () => { $crate::out::eprint(format_args!("\n")) };
    ($($t:tt)*) => { $crate::out::eprint(format_args!("{}\n", format_args!($($t)*))) };
}

/// `eprint!` to stderr through [`eprint()`](crate::out::eprint).
#[macro_export]
macro_rules! err {
    ($($t:tt)*) => { $crate::out::eprint(format_args!($($t)*)) };
}
