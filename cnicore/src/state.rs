//! On-disk state: atomic writes, exclusive creation, flock-based locks, and names that become paths.

use crate::spec::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A name that becomes one path component: no separators, no `.`/`..`, no control characters.
pub fn validate_path_component(what: &str, name: &str) -> Result<()> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.chars().any(char::is_control)
        || name.len() > 255
    {
        return Err(Error::config(format!(
            "invalid {what} {:?}: not usable as a file name",
            crate::spec::truncate_for_msg(name)
        )));
    }
    Ok(())
}

/// Creates a directory (and parents) with the given mode if missing.
pub fn ensure_dir(dir: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(mode).create(dir)
}

/// Writes `data` to `path` atomically: a temporary file in the same directory, fsync, rename. Readers see the old
/// content or the new, never a torn file; a crash leaves at most a `.tmp-*` file, never a half-written target.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".tmp-{}-{}", name, std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        // Closed before it takes the name: an executable still open for writing cannot be exec'd (ETXTBSY), and
        // the installer renames plugins that runtimes exec at any moment.
        drop(f);
        crate::failpoint::hit("state/before-rename");
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `path` with `data` only if it does not exist (`AlreadyExists` otherwise), atomically: the content is
/// written to a temporary file first and linked into place, so the target is never seen empty or partial.
pub fn create_exclusive(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".tmp-{}-{}", name, std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut f =
        OpenOptions::new().write(true).create_new(true).mode(mode).custom_flags(nix::libc::O_NOFOLLOW).open(&tmp)?;
    let result = f.write_all(data).and_then(|_| f.sync_all()).and_then(|_| fs::hard_link(&tmp, path));
    let _ = fs::remove_file(&tmp);
    result
}

/// An exclusive `flock` held until dropped.
pub struct FileLock {
    file: File,
    pub path: PathBuf,
}

impl FileLock {
    /// Opens (creating if needed, mode 0600) and locks `path`, blocking until it is free.
    pub fn exclusive(path: &Path) -> io::Result<FileLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)?;
        file.lock()?;
        Ok(FileLock { file, path: path.to_path_buf() })
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cnicore-state-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        ensure_dir(&d, 0o755).unwrap();
        d
    }

    #[test]
    fn atomic_and_exclusive() {
        let d = tmpdir("a");
        let p = d.join("f");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let q = d.join("lease");
        create_exclusive(&q, b"x", 0o600).unwrap();
        assert_eq!(create_exclusive(&q, b"y", 0o600).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&q).unwrap(), b"x");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&q).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(&d).unwrap().count(), 2, "no temp files left");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn symlinks_not_followed_for_lock() {
        let d = tmpdir("b");
        std::os::unix::fs::symlink("/etc/passwd", d.join("lock")).unwrap();
        assert!(FileLock::exclusive(&d.join("lock")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn path_components() {
        for bad in ["", ".", "..", "a/b", "a\nb", "\0"] {
            assert!(validate_path_component("name", bad).is_err(), "{bad:?}");
        }
        validate_path_component("name", "10.0.0.1").unwrap();
    }
}
