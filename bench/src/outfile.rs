//! Output files of a run (`--history`, `--plot`): checked before the run so
//! that a bad path fails fast, and written only after it, each to a
//! temporary name first and then renamed, so a file either appears whole or
//! not at all.

use std::path::{Path, PathBuf};

/// Checks that `dir` is a folder, or can be made one in an existing folder.
pub fn check_dir_target(flag: &str, dir: &Path) -> Result<(), String> {
    if dir.as_os_str().is_empty() {
        return Err(format!("{flag}: empty path"));
    }
    if dir.is_dir() {
        return cmdline::check_folder_takes_files(flag, dir);
    }
    if dir.exists() {
        return Err(format!(
            "{flag}: `{}` exists and is not a folder",
            dir.display()
        ));
    }
    let parent = cmdline::parent_dir(dir);
    if !parent.is_dir() {
        return Err(format!(
            "{flag}: folder `{}` does not exist",
            parent.display()
        ));
    }
    cmdline::check_folder_takes_files(flag, parent)
}

/// `path` with `tag` before its extension: `h.jsonl` + `fg` → `h.fg.jsonl`.
pub fn tagged(path: &Path, tag: &str) -> PathBuf {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    let ext = path.extension().map(|s| s.to_string_lossy().into_owned());
    let name = match (stem, ext) {
        (Some(s), Some(e)) => format!("{s}.{tag}.{e}"),
        (Some(s), None) => format!("{s}.{tag}"),
        _ => tag.to_string(),
    };
    path.with_file_name(name)
}

pub use cmdline::{check_file_target, write_atomic, write_atomic_with};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_tags() {
        let dir = std::env::temp_dir().join(format!("loch-outfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(check_file_target("--history", &dir).is_err());
        assert!(check_file_target("--history", &dir.join("h.jsonl")).is_ok());
        assert!(check_file_target("--history", &dir.join("no/h.jsonl"))
            .unwrap_err()
            .contains("does not exist"));
        assert!(check_file_target("--history", Path::new("h.jsonl")).is_ok());
        // Replaced, not written through, by the rename: refused.
        assert!(check_file_target("--history", Path::new("/dev/stdout"))
            .unwrap_err()
            .contains("not a regular file"));
        assert!(check_file_target("--history", Path::new("/dev/null"))
            .unwrap_err()
            .contains("not a regular file"));
        // A folder that takes no new files (/proc's files are not made).
        assert!(check_file_target("--plot", Path::new("/proc/x.svg"))
            .unwrap_err()
            .contains("cannot write in folder"));
        assert!(check_dir_target("--plot", Path::new("/proc"))
            .unwrap_err()
            .contains("cannot write in folder"));
        assert!(check_dir_target("--plot", &dir).is_ok());
        assert!(check_dir_target("--plot", &dir.join("new")).is_ok());
        assert!(check_dir_target("--plot", &dir.join("a/b")).is_err());
        write_atomic(&dir.join("f"), b"x").unwrap();
        assert!(check_dir_target("--plot", &dir.join("f"))
            .unwrap_err()
            .contains("not a folder"));
        assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"x");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left"
        );
        assert_eq!(
            tagged(Path::new("out/h.jsonl"), "fg+comb.t8"),
            Path::new("out/h.fg+comb.t8.jsonl")
        );
        assert_eq!(tagged(Path::new("h"), "fg"), Path::new("h.fg"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
