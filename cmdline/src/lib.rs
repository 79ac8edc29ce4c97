//! # cmdline — what Loch's command lines share
//!
//! `loch` and `loch-bench` are driven from scripts; they behave as one
//! family of Unix tools: the same `--version` line ([`version`]), bad input
//! reported in one line with clap's suggestion ([`one_line`]) and exit code
//! [`EXIT_BAD_INPUT`], output that ends quietly when its reader goes away
//! ([`mod@out`]), files written whole ([`write_atomic`]), and SIGINT/SIGTERM
//! as a flag their loops poll ([`signals`]).

pub mod out;
pub mod signals;

/// Exit code of a run that finished and whose checks passed.
pub const EXIT_DONE: u8 = 0;
/// Exit code when the system under test failed: a check, a verb, a node.
pub const EXIT_FAILED: u8 = 1;
/// Exit code of bad input: one line on stderr names it; nothing ran.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code of a run stopped by SIGINT or SIGTERM (128 + SIGINT, as
/// shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// The exit codes, for the end of every `--help` (a macro, so that a
/// command's own text can be `concat!`ed before it).
#[macro_export]
macro_rules! exit_codes_help {
    () => {
        "Exit codes: 0 done, every check passed; 1 the system failed (a check, a verb, a node; \
the message on stderr); 2 bad input (one line naming it; nothing ran); 130 stopped by \
SIGINT or SIGTERM (the summary of what ran is still printed)."
    };
}

/// [`exit_codes_help!`] as a constant.
pub const EXIT_CODES_HELP: &str = exit_codes_help!();

/// The `--version` line: the package version, the git commit built from
/// and the backends compiled in, e.g. `0.1.0 (commit 5ca5964a1b2c;
/// backends: emu, sim, mlx5)`.
pub fn version(backends: &[&str]) -> String {
    format!(
        "{} (commit {}; backends: {})",
        env!("CARGO_PKG_VERSION"),
        env!("LOCH_GIT_COMMIT"),
        backends.join(", ")
    )
}

/// Writes `contents` to `path` whole: a temporary file beside it, synced,
/// then renamed over `path`, so a reader sees the old file or the new one,
/// never half of it. On failure the temporary file is removed.
pub fn write_atomic(path: &std::path::Path, contents: &[u8]) -> Result<(), String> {
    write_atomic_with(path, |f| f.write_all(contents))
}

/// As [`write_atomic`], the contents written by `write` as it makes them
/// (buffered), never held whole in memory.
pub fn write_atomic_with(
    path: &std::path::Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<(), String> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let r = (|| {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        write(&mut f)?;
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    r.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write `{}`: {e}", path.display())
    })
}

/// The folder a new file `path` would go in ("" means the current one).
pub fn parent_dir(path: &std::path::Path) -> &std::path::Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    }
}

/// Checks, before a run, that `path` can become a file: its folder exists
/// and takes new files, and it is not a folder itself, nor anything but a
/// regular file where it exists (so a bad path fails at once, not after
/// the run). [`write_atomic_with`] renames a new file over the target: a
/// device, a pipe or a link there would be replaced, not written through
/// (`/dev/stdout` is a link). `flag` names the option in the message.
pub fn check_file_target(flag: &str, path: &std::path::Path) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err(format!("{flag}: empty path"));
    }
    if path.is_dir() {
        return Err(format!("{flag}: `{}` is a folder", path.display()));
    }
    let parent = parent_dir(path);
    if !parent.is_dir() {
        return Err(format!(
            "{flag}: folder `{}` does not exist",
            parent.display()
        ));
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_file() {
            return Err(format!(
                "{flag}: `{}` exists and is not a regular file (the output is written beside it \
                 and renamed over it)",
                path.display()
            ));
        }
    }
    check_folder_takes_files(flag, parent)
}

/// Checks that folder `dir` takes new files, by making and removing one
/// there (permissions, a read-only file system, a full one: what would
/// otherwise fail the write after the run). `flag` names the option.
pub fn check_folder_takes_files(flag: &str, dir: &std::path::Path) -> Result<(), String> {
    let probe = dir.join(format!(".loch-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        // Left by an earlier process of the same pid: the folder took it.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!(
            "{flag}: cannot write in folder `{}`: {e}",
            dir.display()
        )),
    }
}

/// CPUs online on this machine (at least 1).
pub fn cpus_online() -> usize {
    // SAFETY: sysconf takes no pointers and only reads system state.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Raises this process's soft limit on open files to its hard limit. Every
/// emu memory node holds a descriptor, so a cluster of about a thousand
/// nodes passed the usual soft limit of 1,024 and failed to boot though
/// the hard limit allowed far more; the soft limit is a default for
/// programs that may use `select`, which nothing here does. Children
/// (`loch demo --processes`' nodes) inherit the raised limit.
pub fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct it is given, which lives on
    // this stack frame; the result is checked.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && lim.rlim_cur < lim.rlim_max
    {
        // At most 2^20 (Linux's default `nr_open`): a hard limit of 2^30,
        // as some containers set, would slow programs that walk every
        // descriptor, children included, and no run needs that many.
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max.min(1 << 20).max(lim.rlim_cur),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads only the struct it is given; raising the
        // soft limit up to the hard one needs no privilege. Were it refused,
        // the soft limit stays as it was.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    }
}

/// Warns on stderr (as `command: warning: ...`) when a run asks for more
/// busy threads than the machine has CPUs online: pinned, polling cores
/// then share CPUs, and what is measured is the sharing. Whether it
/// warned.
pub fn warn_if_oversubscribed(command: &str, what: &str, threads: usize) -> bool {
    let online = cpus_online();
    let over = threads > online;
    if over {
        crate::errln!(
            "{command}: warning: {threads} {what} asked for, but this machine has {online} CPUs online: \
             polling threads will share CPUs, and the figures measure the sharing"
        );
    }
    over
}

/// clap's error for bad input as one line: what is wrong, clap's
/// suggestion when it has one ("a similar argument exists: '--json'"), the
/// values a flag takes, then where the help is. Scripts read one line;
/// people get the fix.
pub fn one_line(e: &clap::Error, command: &str) -> String {
    let text = e.render().to_string();
    let mut parts: Vec<String> = Vec::new();
    // The lines after "error: ...:" up to a blank one continue it (the
    // required arguments not given, one per line).
    let mut continuing = false;
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continuing = false;
        } else if let Some(what) = line.strip_prefix("error: ") {
            parts.push(what.trim_end_matches(':').to_string());
            continuing = what.ends_with(':');
        } else if continuing {
            let last = parts.last_mut().expect("an error line came first");
            last.push_str(if last.ends_with(',') { " " } else { ": " });
            last.push_str(line);
            last.push(',');
        } else if let Some(tip) = line.strip_prefix("tip: ") {
            parts.push(tip.to_string());
        } else if line.starts_with("[possible values") && line.ends_with(']') {
            parts.push(line.trim_matches(['[', ']']).to_string());
        }
    }
    for p in &mut parts {
        if p.ends_with(',') {
            p.pop();
        }
    }
    if parts.is_empty() {
        parts.push(
            text.lines()
                .next()
                .unwrap_or("bad input")
                .trim()
                .to_string(),
        );
    }
    format!("{}; see `{command} --help`", parts.join("; "))
}

/// Parses the command line with clap: help and version go to stdout and
/// exit 0, bad input is one line on stderr (prefixed with the command,
/// `loch node: `) and exit 2.
pub fn parse<T: clap::Parser>(name: &str) -> Result<T, std::process::ExitCode> {
    parse_from(name, std::env::args_os())
}

/// [`parse`] over the given arguments (the first is the program name).
pub fn parse_from<T: clap::Parser>(
    name: &str,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<T, std::process::ExitCode> {
    parse_telling(name, args, |_, _| {})
}

/// [`parse_from`], and where the command line is bad input that clap
/// names (not a bare command asking for its help), `refused` is called
/// after the line is said, with the arguments and that line (without the
/// command's prefix): a node that will not start tells its peers why.
pub fn parse_telling<T: clap::Parser>(
    name: &str,
    args: impl IntoIterator<Item = std::ffi::OsString>,
    refused: impl FnOnce(&[std::ffi::OsString], &str),
) -> Result<T, std::process::ExitCode> {
    use clap::error::ErrorKind;
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    match T::try_parse_from(&args) {
        Ok(t) => Ok(t),
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                out::print(format_args!("{}", e.render()));
                Err(std::process::ExitCode::from(EXIT_DONE))
            }
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                crate::err!("{}", e.render());
                Err(std::process::ExitCode::from(EXIT_BAD_INPUT))
            }
            _ => {
                let cmd = command_of(&T::command(), name, &args);
                let line = one_line(&e, &cmd);
                crate::errln!("{cmd}: {line}");
                refused(&args, &line);
                Err(std::process::ExitCode::from(EXIT_BAD_INPUT))
            }
        },
    }
}

/// The command an error is about: the program and the subcommand named on
/// the command line (`loch-bench run`), for the pointer to its help.
fn command_of(cmd: &clap::Command, name: &str, args: &[std::ffi::OsString]) -> String {
    let sub = args.iter().skip(1).find_map(|a| {
        let a = a.to_str()?;
        cmd.get_subcommands()
            .any(|s| s.get_name() == a)
            .then_some(a)
    });
    match sub {
        Some(s) => format!("{name} {s}"),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Parser, Subcommand};

    #[derive(Parser, Debug)]
    #[command(name = "t")]
    struct T {
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(Subcommand, Debug)]
    enum Cmd {
        Go {
            #[arg(long)]
            json: bool,
            #[arg(long, value_parser = ["emu", "sim"])]
            backend: Option<String>,
            #[arg(long)]
            size: Option<u32>,
        },
        Need {
            #[arg(long)]
            a: u32,
            #[arg(long)]
            b: u32,
        },
    }

    fn err(args: &[&str]) -> String {
        let argv: Vec<std::ffi::OsString> = std::iter::once("t")
            .chain(args.iter().copied())
            .map(Into::into)
            .collect();
        let e = T::try_parse_from(&argv).unwrap_err();
        one_line(
            &e,
            &command_of(&<T as clap::CommandFactory>::command(), "t", &argv),
        )
    }

    #[test]
    fn clap_errors_are_one_line_with_the_fix() {
        let e = err(&["go", "--jsn"]);
        assert!(!e.contains('\n'), "{e}");
        assert!(e.contains("'--jsn'") && e.contains("'--json'"), "{e}");
        assert!(e.ends_with("see `t go --help`"), "{e}");
        let e = err(&["go", "--backend", "pigeon"]);
        assert!(e.contains("--backend") && e.contains("emu, sim"), "{e}");
        assert!(e.ends_with("see `t go --help`"), "{e}");
        let e = err(&["go", "--size", "lots"]);
        assert!(e.contains("--size") && e.contains("lots"), "{e}");
        let e = err(&["stop"]);
        assert!(e.contains("'stop'"), "{e}");
        let e = err(&["need"]);
        assert!(
            e.starts_with("the following required arguments were not provided: --a <A>, --b <B>;"),
            "{e}"
        );
    }

    #[test]
    fn bad_input_is_passed_on_and_help_is_not() {
        let argv = |args: &[&str]| -> Vec<std::ffi::OsString> {
            std::iter::once("t")
                .chain(args.iter().copied())
                .map(Into::into)
                .collect()
        };
        let mut told = None;
        let r = parse_telling::<T>("t", argv(&["go", "--size", "lots"]), |a, why| {
            told = Some((a.len(), why.to_string()))
        });
        assert!(r.is_err());
        let (n, why) = told.expect("bad input is passed on");
        assert_eq!(n, 4, "every argument, the program's name first");
        assert_eq!(why, err(&["go", "--size", "lots"]), "the line said");
        for quiet in [&["go", "--help"][..], &["--help"]] {
            let mut called = false;
            let r = parse_telling::<T>("t", argv(quiet), |_, _| called = true);
            assert!(r.is_err() && !called, "{quiet:?}");
        }
        let mut called = false;
        let t = parse_telling::<T>("t", argv(&["go", "--json"]), |_, _| called = true);
        assert!(
            matches!(
                t,
                Ok(T {
                    cmd: Cmd::Go { json: true, .. }
                })
            ) && !called
        );
    }

    #[test]
    fn oversubscription_is_warned_about_only_past_the_cpus_online() {
        let online = cpus_online();
        assert!(online >= 1);
        assert!(!warn_if_oversubscribed("t", "cores", online));
        assert!(warn_if_oversubscribed("t", "cores", online + 1));
    }

    #[test]
    fn a_file_is_written_whole_and_no_temporary_is_left() {
        let dir = std::env::temp_dir().join(format!("loch-cmdline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("out.json");
        write_atomic(&f, b"old").unwrap();
        write_atomic(&f, b"new").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left"
        );
        let e = write_atomic(&dir.join("no/such/dir/x"), b"x").unwrap_err();
        assert!(e.contains("cannot write"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_version_names_the_commit_and_backends() {
        let v = version(&["emu", "sim"]);
        assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
        assert!(
            v.contains("commit ") && v.ends_with("backends: emu, sim)"),
            "{v}"
        );
    }
}
