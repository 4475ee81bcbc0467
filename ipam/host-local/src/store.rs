//! The on-disk store, laid out as the reference's (the compatibility contract):
//! `<dataDir>/<network>/<ip>` holding `<containerID>\r\n<ifname>`, `last_reserved_ip.<range set index>`,
//! and `lock`, flock'ed around every change. Plus our index (see [`crate::index`]).
//!
//! Lease files are created atomically: the content goes to a temporary file that is then hard-linked to
//! `<ip>`, so a lease is never seen partial by any process, also when ours is killed at any point, and
//! taking it is exclusive (`link` fails when the name exists).
//!
//! No fsync: it costs 0.2–1 ms per ADD here (far more on a busy disk) and buys nothing. Only a power loss
//! can leave a lease without its content, and then (a) every container is gone anyway and (b) an empty
//! lease file is garbage to us: ADD reclaims one older than [`GARBAGE_AGE`], and so does GC.

use crate::index::{overwrite_file, Index, INDEX_DIR};
use crate::lease::{Content, Owner};
use cnicore::spec::{io_error, Error, Result};
use cnicore::state::FileLock;
use std::fs;
use std::io::{self, ErrorKind, Write};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

pub const LOCK_FILE: &str = "lock";
pub const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
pub const TMP_PREFIX: &str = ".tmp-";
/// The file a new lease's content is prepared in before it is linked to `<ip>`. One name for every writer
/// (they all hold the lock), so that the file of a writer killed in between is removed by the next ADD or
/// DEL of the network rather than lingering until a GC finds it old.
pub const TEMP_LEASE: &str = ".tmp-lease";
/// An empty lease file (or one of our temporary files) older than this is left over by a crash: every
/// writer fills its files while holding the lock, so it can only be garbage; the age is a margin for
/// writers that do not lock.
pub const GARBAGE_AGE: Duration = Duration::from_secs(5);

/// When this boot began (`btime` of /proc/stat), if the kernel says.
pub fn boot_time() -> Option<SystemTime> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let seconds: u64 = stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
}

/// Whether a directory entry is a lease: a file named by an address in its canonical form.
pub fn lease_name(name: &str) -> Option<IpAddr> {
    name.parse::<IpAddr>().ok().filter(|ip| ip.to_string() == name)
}

/// Whether the file at `path` is an empty leftover old enough to be garbage.
fn is_stale_empty(meta: &fs::Metadata) -> bool {
    meta.is_file() && meta.len() == 0 && is_old(meta)
}

fn is_old(meta: &fs::Metadata) -> bool {
    meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()).is_some_and(|age| age >= GARBAGE_AGE)
}

/// Reads a small file with one read when it fits (a scan reads every lease: 3 syscalls instead of 5).
fn read_small(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = fs::File::open(path)?;
    let mut buf = [0u8; 512];
    let n = f.read(&mut buf)?;
    let mut out = buf[..n].to_vec();
    if n == buf.len() {
        f.read_to_end(&mut out)?;
    }
    Ok(out)
}

/// One entry found by a full scan.
pub struct Scanned {
    pub name: String,
    pub lease: Option<(IpAddr, Content)>,
    pub meta: Option<fs::Metadata>,
}

/// A network's directory, locked for the lifetime of this value.
pub struct Store {
    dir: PathBuf,
    _lock: FileLock,
    pub index: Index,
    /// The directory changed since the last commit.
    changed: bool,
}

impl Store {
    /// Locks `<data_dir>/<network>`, creating it when `create` (ADD, GC, STATUS). `None` when it does not
    /// exist and `create` is false (DEL/CHECK of a network that never had a lease).
    pub fn open(dir: &Path, create: bool) -> Result<Option<Store>> {
        if create {
            cnicore::state::ensure_dir(dir, 0o755)
                .map_err(io_error(format!("creating data directory {}", dir.display())))?;
        } else if !dir.is_dir() {
            return Ok(None);
        }
        let lock_path = dir.join(LOCK_FILE);
        let lock = FileLock::exclusive(&lock_path).map_err(io_error(format!("locking {}", lock_path.display())))?;
        Ok(Some(Store { dir: dir.to_path_buf(), _lock: lock, index: Index::new(dir), changed: false }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lease_path(&self, ip: IpAddr) -> PathBuf {
        self.dir.join(ip.to_string())
    }

    /// The content of the lease of `ip`, `None` if there is none.
    pub fn read_lease(&self, ip: IpAddr) -> Result<Option<Content>> {
        match fs::read(self.lease_path(ip)) {
            Ok(bytes) => Ok(Some(Owner::parse(&bytes))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading lease {ip}: {e}"))),
        }
    }

    /// Makes sure the index describes the lease files, rebuilding it from a scan when anybody else changed
    /// the directory since our last commit.
    pub fn ensure_index(&mut self) -> Result<()> {
        if !self.index.is_current() {
            self.rebuild_index()?;
        }
        Ok(())
    }

    /// Scans every lease file and rebuilds the index from it.
    pub fn rebuild_index(&mut self) -> Result<()> {
        let leases: Vec<(IpAddr, Owner)> = self
            .scan()?
            .into_iter()
            .filter_map(|s| match s.lease {
                Some((ip, Content::Owner(o))) => Some((ip, o)),
                _ => None,
            })
            .collect();
        self.index.rebuild(leases);
        self.changed = true;
        Ok(())
    }

    /// Every entry of the directory, with the content of lease files (the slow path: one read per lease).
    pub fn scan(&self) -> Result<Vec<Scanned>> {
        let what = format!("reading {}", self.dir.display());
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_error(&what))? {
            let entry = entry.map_err(io_error(&what))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let mut scanned = Scanned { name, lease: None, meta: None };
            if let Some(ip) = lease_name(&scanned.name) {
                match read_small(&entry.path()) {
                    Ok(bytes) => {
                        let content = Owner::parse(&bytes);
                        if content == Content::Empty {
                            scanned.meta = fs::symlink_metadata(entry.path()).ok();
                        }
                        scanned.lease = Some((ip, content));
                    }
                    // Gone meanwhile (we hold the lock, so only by a non-locking hand), or a directory.
                    Err(_) => continue,
                }
            } else if scanned.name.starts_with(TMP_PREFIX) {
                scanned.meta = fs::symlink_metadata(entry.path()).ok();
            }
            out.push(scanned);
        }
        Ok(out)
    }

    /// The leases of exactly `owner`, checked against the lease files. When the index disagrees with them
    /// (it should not), it is rebuilt from a scan and asked again.
    pub fn leases_of(&mut self, owner: &Owner) -> Result<Vec<IpAddr>> {
        let index_err = io_error("reading the lease index");
        let ips = match self.index.lookup(owner) {
            Ok(ips) => ips,
            Err(_) => {
                self.rebuild_index()?;
                return self.index.lookup(owner).map_err(index_err);
            }
        };
        for ip in &ips {
            if self.read_lease(*ip)? != Some(Content::Owner(owner.clone())) {
                self.rebuild_index()?;
                return self.index.lookup(owner).map_err(index_err);
            }
        }
        Ok(ips)
    }

    /// The leases DEL and CHECK act on, as the reference: those of `<id>\r\n<ifname>`, or else those of a
    /// bare `<id>` (leases of old versions).
    pub fn leases_for_release(&mut self, id: &str, ifname: &str) -> Result<(Owner, Vec<IpAddr>)> {
        let current = Owner::attachment(id, ifname);
        let ips = self.leases_of(&current)?;
        if !ips.is_empty() {
            return Ok((current, ips));
        }
        let legacy = Owner::Legacy { id: id.trim().to_string() };
        let ips = self.leases_of(&legacy)?;
        Ok((legacy, ips))
    }

    /// Removes the lease of `ip` held by `owner`.
    pub fn release(&mut self, ip: IpAddr, owner: &Owner) -> Result<()> {
        match fs::remove_file(self.lease_path(ip)) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(Error::io(format!("removing lease {ip}: {e}"))),
            _ => {}
        }
        self.changed = true;
        self.index.remove(ip, owner).map_err(io_error("updating the lease index"))
    }

    /// Removes the leases among `ips` whose file was written before `boot`: their containers died with the
    /// previous boot (containerd never sends GC, and an unclean shutdown sends no DEL). Returns the addresses
    /// freed, with who held them.
    pub fn reclaim_written_before(
        &mut self,
        ips: impl Iterator<Item = IpAddr>,
        boot: SystemTime,
    ) -> Result<Vec<(IpAddr, Content)>> {
        let mut freed = Vec::new();
        for ip in ips {
            let before_boot = fs::symlink_metadata(self.lease_path(ip))
                .ok()
                .filter(fs::Metadata::is_file)
                .and_then(|m| m.modified().ok())
                .is_some_and(|written| written < boot);
            if !before_boot {
                continue;
            }
            let Some(content) = self.read_lease(ip)? else { continue };
            match &content {
                Content::Owner(owner) => self.release(ip, owner)?,
                Content::Empty | Content::Unreadable => self.remove_entry(&ip.to_string())?,
            }
            freed.push((ip, content));
        }
        Ok(freed)
    }

    /// Removes a directory entry by name (garbage collection).
    pub fn remove_entry(&mut self, name: &str) -> Result<()> {
        match fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(Error::io(format!("removing {name}: {e}"))),
            _ => {
                self.changed = true;
                Ok(())
            }
        }
    }

    /// Removes the prepared lease file a killed ADD left behind, if any.
    pub fn remove_temp_lease(&mut self) -> Result<()> {
        match fs::remove_file(self.dir.join(TEMP_LEASE)) {
            Ok(()) => {
                self.changed = true;
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {TEMP_LEASE}: {e}"))),
        }
    }

    /// Prepares the content of new leases of `owner`; see [`Reserver::try_reserve`].
    pub fn reserver(&mut self, owner: &Owner) -> Result<Reserver<'_>> {
        let tmp = self.dir.join(TEMP_LEASE);
        let _ = fs::remove_file(&tmp);
        let write = || -> io::Result<()> {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            f.write_all(owner.file_content().as_bytes())
        };
        self.changed = true;
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(Error::io(format!("writing lease file {}: {e}", tmp.display())));
        }
        Ok(Reserver { store: self, tmp, owner: owner.clone() })
    }

    /// The last address reserved in range set `idx`, the round-robin position.
    pub fn last_reserved(&self, idx: usize) -> Option<IpAddr> {
        let text = fs::read_to_string(self.dir.join(format!("{LAST_RESERVED_PREFIX}{idx}"))).ok()?;
        text.trim().parse().ok()
    }

    pub fn set_last_reserved(&mut self, idx: usize, ip: IpAddr) -> Result<()> {
        self.changed = true;
        let path = self.dir.join(format!("{LAST_RESERVED_PREFIX}{idx}"));
        overwrite_file(&path, ip.to_string().as_bytes(), 0o644).map_err(io_error(format!("writing {}", path.display())))
    }

    /// Whether `ip` could be reserved now (no lease, or only a stale empty file), without taking it.
    pub fn is_free(&self, ip: IpAddr) -> bool {
        match fs::symlink_metadata(self.lease_path(ip)) {
            Err(e) => e.kind() == ErrorKind::NotFound,
            Ok(meta) => is_stale_empty(&meta),
        }
    }

    /// Records in the index that the directory was changed by us (see [`Index::commit`]).
    pub fn commit(&mut self) -> Result<()> {
        if self.changed {
            self.index
                .commit()
                .map_err(io_error(format!("writing the lease index in {}", self.dir.join(INDEX_DIR).display())))?;
            self.changed = false;
        }
        Ok(())
    }

    /// Marks the directory as changed, e.g. after a write probe.
    pub fn touch(&mut self) {
        self.changed = true;
    }
}

/// Whether a scanned entry is garbage a GC may remove regardless of owners: an old empty lease or an old
/// temporary file of ours.
pub fn is_garbage(s: &Scanned) -> bool {
    let old = s.meta.as_ref().is_some_and(is_old);
    match &s.lease {
        Some((_, Content::Empty)) => old,
        Some(_) => false,
        None => s.name.starts_with(TMP_PREFIX) && old,
    }
}

/// Takes addresses for one owner by hard-linking its prepared lease file to `<ip>`.
pub struct Reserver<'a> {
    store: &'a mut Store,
    tmp: PathBuf,
    owner: Owner,
}

impl Reserver<'_> {
    /// Takes `ip` if it is free. An empty lease file left by a crash is reclaimed.
    pub fn try_reserve(&mut self, ip: IpAddr) -> Result<bool> {
        let path = self.store.lease_path(ip);
        for attempt in 0..2 {
            match fs::hard_link(&self.tmp, &path) {
                Ok(()) => {
                    cnicore::failpoint::hit("host-local/after-lease");
                    self.store.index.insert(ip, &self.owner).map_err(io_error("updating the lease index"))?;
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let stale = attempt == 0 && fs::symlink_metadata(&path).is_ok_and(|m| is_stale_empty(&m));
                    if !stale {
                        return Ok(false);
                    }
                    let _ = fs::remove_file(&path);
                }
                Err(e) => return Err(Error::io(format!("creating lease {}: {e}", path.display()))),
            }
        }
        Ok(false)
    }

    /// Gives back a lease taken by this reserver (rollback of a failed ADD).
    pub fn undo(&mut self, ip: IpAddr) -> Result<()> {
        let owner = self.owner.clone();
        self.store.release(ip, &owner)
    }

    pub fn store(&mut self) -> &mut Store {
        self.store
    }
}

impl Drop for Reserver<'_> {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.tmp);
    }
}
