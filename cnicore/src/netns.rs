//! Network namespaces: open one by path and run code inside it on the calling thread.
//!
//! Entering a namespace is per thread (`setns(2)` with `CLONE_NEWNET`), so other threads of the process are
//! never affected, and [`NetNs::run`] always switches the thread back, also when the closure fails or panics.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};
use nix::sys::statfs::{fstatfs, NSFS_MAGIC};

/// The network namespace of the calling thread.
const CURRENT_THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// An open network namespace file (e.g. `/var/run/netns/<name>` or `/proc/<pid>/ns/net`).
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

impl NetNs {
    /// Opens the namespace file at `path` and checks that it is a namespace (an nsfs file), so that a
    /// wrong CNI_NETNS (a plain file, a directory) is reported instead of failing later in `setns`.
    pub fn open(path: impl AsRef<Path>) -> io::Result<NetNs> {
        let path = path.as_ref();
        let file = File::open(path)?;
        let fs_type = fstatfs(&file).map_err(io::Error::from)?.filesystem_type();
        // Namespace files (bind mounts under /var/run/netns and /proc/<pid>/ns/net alike) are on nsfs.
        if fs_type != NSFS_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a network namespace", path.display()),
            ));
        }
        Ok(NetNs { file, path: path.to_path_buf() })
    }

    /// The network namespace of the calling thread.
    pub fn current() -> io::Result<NetNs> {
        NetNs::open(CURRENT_THREAD_NETNS)
    }

    /// The path the namespace was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open namespace file, e.g. for `IFLA_NET_NS_FD`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// True when both handles are the same namespace (same nsfs inode).
    pub fn is_same(&self, other: &NetNs) -> io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (self.file.metadata()?, other.file.metadata()?);
        Ok(a.dev() == b.dev() && a.ino() == b.ino())
    }

    /// A second handle on the same namespace.
    pub fn try_clone(&self) -> io::Result<NetNs> {
        Ok(NetNs { file: self.file.try_clone()?, path: self.path.clone() })
    }

    /// Runs `f` with the calling thread inside this namespace and switches the thread back afterwards,
    /// whatever `f` returns (and when it panics). Errors only if entering fails; `f`'s own result is
    /// returned as is.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> io::Result<T> {
        let original = NetNs::current()?;
        // Already there (a socket of the thread's own namespace): no setns, which needs CAP_SYS_ADMIN even to
        // re-enter one's own namespace; fabricd in a pod has only NET_ADMIN and NET_RAW.
        if original.is_same(self)? {
            return Ok(f());
        }
        setns(self.fd(), CloneFlags::CLONE_NEWNET).map_err(|errno| {
            io::Error::new(
                io::Error::from(errno).kind(),
                format!("failed to enter network namespace {}: {errno}", self.path.display()),
            )
        })?;
        let _back = SwitchBack(original);
        Ok(f())
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Returns the thread to its original namespace when dropped.
struct SwitchBack(NetNs);

impl Drop for SwitchBack {
    fn drop(&mut self) {
        // A thread left in the wrong namespace would silently configure the wrong network: stop instead.
        if let Err(errno) = setns(self.0.fd(), CloneFlags::CLONE_NEWNET) {
            panic!("failed to switch back to network namespace {}: {errno}", self.0.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_in_the_threads_own_namespace_needs_no_setns() {
        let (a, b) = (NetNs::current().unwrap(), NetNs::current().unwrap());
        assert!(a.is_same(&b).unwrap());
        // No setns happens, so this works without CAP_SYS_ADMIN too.
        assert_eq!(a.run(|| 7).unwrap(), 7);
    }
}
