//! An owner → addresses index, so that ADD (duplicate check) and DEL find the leases of one attachment
//! without reading every lease file.
//!
//! The lease files stay the only truth; the index is a cache that is trusted only while it provably
//! describes them:
//! - It lives in `<network dir>/.host-local-index/`: 1024 bucket files (`b-XXX`, by a stable hash of the
//!   owner) with lines `<ip> <containerID> [<ifname>]`, and a `stamp`.
//! - Every change we make to the network directory ends with a commit: dirty buckets are written, then a
//!   fresh stamp S (the current second, a random nanosecond) is written to `stamp` and set as the
//!   modification time of both the network directory and the index directory.
//! - Anyone else creating, removing or renaming an entry in the network directory (the reference plugin
//!   reserving or releasing a lease, an operator) makes the kernel set the directory's mtime to the current
//!   time, which is not S. The index is then rebuilt from a scan of the lease files before it is used.
//! - If the file system cannot store the nanoseconds we set (coarse timestamps), no stamp is kept and every
//!   invocation scans: slower, still correct.
//!
//! Bucket files never contain a bare `<containerID>` or `<containerID>\r\n<ifname>`, so the reference's DEL
//! (which walks subdirectories too and removes files with exactly that content) leaves them alone.

use crate::lease::Owner;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, FileTimes};
use std::hash::{BuildHasher, RandomState};
use std::io::{self, ErrorKind};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const INDEX_DIR: &str = ".host-local-index";
const STAMP_FILE: &str = "stamp";
const BUCKETS: u64 = 1024;

/// A directory's modification time, to the nanosecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    sec: i64,
    nsec: i64,
}

impl Stamp {
    fn of(path: &Path) -> io::Result<Stamp> {
        let m = fs::symlink_metadata(path)?;
        Ok(Stamp { sec: m.mtime(), nsec: m.mtime_nsec() })
    }

    /// The second before now, with a random nanosecond part: a time the kernel's (coarse) clock will not
    /// produce, and never in the future (which would confuse tools comparing times).
    fn fresh() -> Stamp {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let random = RandomState::new().hash_one((now.as_nanos(), std::process::id()));
        Stamp { sec: now.as_secs().saturating_sub(1) as i64, nsec: (random % 1_000_000_000) as i64 }
    }

    fn system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::new(self.sec.max(0) as u64, self.nsec as u32)
    }

    fn encode(self) -> String {
        format!("v1 {} {}\n", self.sec, self.nsec)
    }

    fn decode(text: &str) -> Option<Stamp> {
        let mut parts = text.split_whitespace();
        if parts.next()? != "v1" {
            return None;
        }
        let sec = parts.next()?.parse().ok()?;
        let nsec = parts.next()?.parse().ok()?;
        Some(Stamp { sec, nsec })
    }
}

/// FNV-1a: stable across builds and versions (the standard hasher is not).
fn bucket_of(owner: &Owner) -> u16 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in owner.file_content().bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    (h % BUCKETS) as u16
}

fn bucket_name(bucket: u16) -> String {
    format!("b-{bucket:03x}")
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, msg)
}

fn parse_bucket(text: &str) -> io::Result<Vec<(IpAddr, Owner)>> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let mut f = line.split(' ');
            let ip = f.next().and_then(|s| s.parse().ok());
            let id = f.next().filter(|s| !s.is_empty());
            let owner = match (id, f.next(), f.next()) {
                (Some(id), None, None) => Some(Owner::Legacy { id: id.to_string() }),
                (Some(id), Some(ifname), None) if !ifname.is_empty() => Some(Owner::attachment(id, ifname)),
                _ => None,
            };
            match (ip, owner) {
                (Some(ip), Some(owner)) => Ok((ip, owner)),
                _ => Err(invalid(format!("bad index line {line:?}"))),
            }
        })
        .collect()
}

fn format_bucket(entries: &[(IpAddr, Owner)]) -> String {
    let mut out = String::new();
    for (ip, owner) in entries {
        match owner {
            Owner::Attachment { id, ifname } => out.push_str(&format!("{ip} {id} {ifname}\n")),
            Owner::Legacy { id } => out.push_str(&format!("{ip} {id}\n")),
        }
    }
    out
}

/// Writes `data` to `path` in place (created if missing), without rename or fsync: the index files and
/// `last_reserved_ip.*` are hints. They are written after the network directory was changed and before
/// the commit stamps it, so a crash that leaves one torn also leaves the stamp invalid, and the index is
/// rebuilt before it is trusted again (a torn `last_reserved_ip` only moves the round-robin start).
///
/// Not `O_TRUNC`: on ext4, truncating a file to zero makes its close start writeback (auto_da_alloc),
/// 0.1–0.4 ms per file. Overwriting and then cutting the tail costs nothing of the sort.
pub fn overwrite_file(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(data)?;
    if f.metadata()?.len() > data.len() as u64 {
        f.set_len(data.len() as u64)?;
    }
    Ok(())
}

pub struct Index {
    net_dir: PathBuf,
    dir: PathBuf,
    /// Buckets read (or rebuilt) in this invocation.
    loaded: HashMap<u16, Vec<(IpAddr, Owner)>>,
    dirty: HashSet<u16>,
    /// Set by a rebuild: every bucket is in `loaded`, and files of other buckets must go.
    rebuilt: bool,
}

impl Index {
    pub fn new(net_dir: &Path) -> Index {
        Index {
            net_dir: net_dir.to_path_buf(),
            dir: net_dir.join(INDEX_DIR),
            loaded: HashMap::new(),
            dirty: HashSet::new(),
            rebuilt: false,
        }
    }

    /// Whether the index describes exactly the lease files: nobody changed either directory since our
    /// last commit. Any doubt (no stamp, unreadable stamp) is "no".
    pub fn is_current(&self) -> bool {
        let Ok(text) = fs::read_to_string(self.dir.join(STAMP_FILE)) else { return false };
        let Some(stamp) = Stamp::decode(&text) else { return false };
        matches!((Stamp::of(&self.net_dir), Stamp::of(&self.dir)), (Ok(a), Ok(b)) if a == stamp && b == stamp)
    }

    fn bucket(&mut self, b: u16) -> io::Result<&mut Vec<(IpAddr, Owner)>> {
        // After a rebuild every bucket is in memory: the files are stale until the commit.
        if !self.loaded.contains_key(&b) && !self.rebuilt {
            let entries = match fs::read_to_string(self.dir.join(bucket_name(b))) {
                Ok(text) => parse_bucket(&text)?,
                Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(e),
            };
            self.loaded.insert(b, entries);
        }
        Ok(self.loaded.entry(b).or_default())
    }

    /// The addresses the index holds for exactly `owner`.
    pub fn lookup(&mut self, owner: &Owner) -> io::Result<Vec<IpAddr>> {
        Ok(self.bucket(bucket_of(owner))?.iter().filter(|(_, o)| o == owner).map(|(ip, _)| *ip).collect())
    }

    pub fn insert(&mut self, ip: IpAddr, owner: &Owner) -> io::Result<()> {
        let b = bucket_of(owner);
        let bucket = self.bucket(b)?;
        if !bucket.iter().any(|(i, o)| *i == ip && o == owner) {
            bucket.push((ip, owner.clone()));
            self.dirty.insert(b);
        }
        Ok(())
    }

    pub fn remove(&mut self, ip: IpAddr, owner: &Owner) -> io::Result<()> {
        let b = bucket_of(owner);
        let bucket = self.bucket(b)?;
        let before = bucket.len();
        bucket.retain(|(i, o)| !(*i == ip && o == owner));
        if bucket.len() != before {
            self.dirty.insert(b);
        }
        Ok(())
    }

    /// Replaces the whole index with `leases` (from a scan of the lease files). Written by [`Index::commit`].
    pub fn rebuild(&mut self, leases: impl IntoIterator<Item = (IpAddr, Owner)>) {
        self.loaded.clear();
        for (ip, owner) in leases {
            self.loaded.entry(bucket_of(&owner)).or_default().push((ip, owner));
        }
        self.dirty = self.loaded.keys().copied().collect();
        self.rebuilt = true;
    }

    /// Writes what changed and stamps both directories: the index is current again. Called under the
    /// network lock after every change to the network directory.
    pub fn commit(&mut self) -> io::Result<()> {
        match fs::create_dir(&self.dir) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        if self.rebuilt {
            // Bucket files of owners that no longer exist.
            for entry in fs::read_dir(&self.dir)? {
                let name = entry?.file_name();
                let name = name.to_string_lossy();
                let keep = name
                    .strip_prefix("b-")
                    .and_then(|h| u16::from_str_radix(h, 16).ok())
                    .is_some_and(|b| self.loaded.get(&b).is_some_and(|e| !e.is_empty()));
                if !keep && name != STAMP_FILE {
                    let _ = fs::remove_file(self.dir.join(&*name));
                }
            }
            self.rebuilt = false;
        }
        let mut dirty: Vec<u16> = self.dirty.drain().collect();
        dirty.sort_unstable();
        for b in dirty {
            let path = self.dir.join(bucket_name(b));
            match self.loaded.get(&b).filter(|e| !e.is_empty()) {
                Some(entries) => overwrite_file(&path, format_bucket(entries).as_bytes(), 0o600)?,
                None => match fs::remove_file(&path) {
                    Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
                    _ => {}
                },
            }
        }
        let stamp = Stamp::fresh();
        let stamp_path = self.dir.join(STAMP_FILE);
        overwrite_file(&stamp_path, stamp.encode().as_bytes(), 0o600)?;
        let times = FileTimes::new().set_modified(stamp.system_time());
        for dir in [&self.net_dir, &self.dir] {
            File::open(dir)?.set_times(times)?;
        }
        // A file system that rounds timestamps cannot tell our stamp from someone else's change.
        if Stamp::of(&self.net_dir)? != stamp || Stamp::of(&self.dir)? != stamp {
            let _ = fs::remove_file(&stamp_path);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_lines_round_trip() {
        let entries = vec![
            ("10.0.0.2".parse().unwrap(), Owner::attachment("c1", "eth0")),
            ("fd00::2".parse().unwrap(), Owner::Legacy { id: "c2".into() }),
        ];
        assert_eq!(parse_bucket(&format_bucket(&entries)).unwrap(), entries);
        assert!(parse_bucket("10.0.0.2\n").is_err());
        assert!(parse_bucket("x c1 eth0\n").is_err());
        assert!(parse_bucket("10.0.0.2 c1 eth0 extra\n").is_err());
    }

    #[test]
    fn stable_buckets() {
        // Fixed forever: other versions of this plugin must find the same buckets.
        assert_eq!(bucket_of(&Owner::attachment("c1", "eth0")), bucket_of(&Owner::attachment("c1", "eth0")));
        assert_ne!(bucket_of(&Owner::attachment("c1", "eth0")), bucket_of(&Owner::attachment("c1", "eth1")));
        assert_eq!(Stamp::decode(&Stamp { sec: 5, nsec: 7 }.encode()), Some(Stamp { sec: 5, nsec: 7 }));
    }

    #[test]
    fn stamp_detects_foreign_changes() {
        let dir = std::env::temp_dir().join(format!("hl-index-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let mut index = Index::new(&dir);
        assert!(!index.is_current());
        index.rebuild(vec![("10.0.0.2".parse().unwrap(), Owner::attachment("c1", "eth0"))]);
        index.commit().unwrap();
        assert!(index.is_current());
        let mut again = Index::new(&dir);
        assert_eq!(again.lookup(&Owner::attachment("c1", "eth0")).unwrap(), ["10.0.0.2".parse::<IpAddr>().unwrap()]);
        fs::write(dir.join("10.0.0.3"), "c2\r\neth0").unwrap();
        assert!(!again.is_current());
        fs::remove_dir_all(&dir).unwrap();
    }
}
