//! The drop log: each packet the agent's drop rules logged (NFLOG, [`crate::nflog`]) becomes one JSON line
//! naming the flow's pods and the policies that isolate the pod, appended to `drops.jsonl` in the agent's
//! run directory; `cni-netpol drops [--follow]` prints the file.
//!
//! One line per dropped flow: a packet of the same flow (addresses, protocol, ports, isolation) logged again
//! within [`SAME_FLOW`] (a TCP SYN retransmitted, say) is not written again. The file is bounded: past
//! [`MAX_BYTES`] it becomes `drops.jsonl.1` (the previous one removed) and a new file starts, so at most twice
//! that is kept. Each line is one `write` on a file opened with `O_APPEND`: a reader never sees half a line
//! written by another writer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::explain::proto_name;
use crate::model::Cluster;
use crate::nflog::Headers;
use crate::plan::{Chain, Isolation, Plan};

/// The log's name in the run directory; the previous one is `drops.jsonl.1`.
pub const FILE: &str = "drops.jsonl";
/// The size past which the log is rotated.
pub const MAX_BYTES: u64 = 4 * 1024 * 1024;
/// A flow logged again within this time is not written again.
pub const SAME_FLOW: Duration = Duration::from_secs(10);
/// The flows remembered for [`SAME_FLOW`] (the oldest forgotten past it).
const FLOWS_REMEMBERED: usize = 4096;

/// One end of a dropped flow: its pod when the agent knows one with that address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    pub ip: IpAddr,
}

/// One line of the drop log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropRecord {
    /// RFC 3339, UTC, when the agent read it.
    pub time: String,
    /// `ingress`, `egress`, `unknown-destination` or `unknown-source` ([`Isolation::direction`]).
    pub direction: String,
    pub src: End,
    pub dst: End,
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The policies isolating the pod in that direction (none for an unknown pod).
    pub policies: Vec<String>,
}

/// What the drop log needs of the view in force: pods by address, and who isolates them.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    pods: HashMap<IpAddr, String>,
    isolating: BTreeMap<(Chain, IpAddr), BTreeSet<String>>,
}

impl Directory {
    pub fn new(cluster: &Cluster, plan: &Plan) -> Directory {
        let mut pods = HashMap::new();
        for pod in cluster.pods.iter().filter(|p| p.is_policy_pod()) {
            for ip in pod.status.pod_ips.iter().filter_map(|i| i.ip.parse().ok()) {
                pods.insert(ip, format!("{}/{}", pod.metadata.namespace, pod.metadata.name));
            }
        }
        Directory { pods, isolating: plan.provenance.isolating.clone() }
    }

    /// The line for a packet that `isolation`'s drop logged.
    pub fn record(&self, isolation: Isolation, headers: &Headers, time: String) -> DropRecord {
        let end = |ip: IpAddr| End { pod: self.pods.get(&ip).cloned(), ip };
        let isolated = match isolation {
            Isolation::Ingress => Some((Chain::Ingress, headers.dst)),
            Isolation::Egress => Some((Chain::Egress, headers.src)),
            Isolation::UnknownDestination | Isolation::UnknownSource => None,
        };
        let policies =
            isolated.and_then(|key| self.isolating.get(&key)).map(|p| p.iter().cloned().collect()).unwrap_or_default();
        DropRecord {
            time,
            direction: isolation.direction().to_string(),
            src: end(headers.src),
            dst: end(headers.dst),
            protocol: proto_name(headers.proto),
            port: headers.ports.map(|(_, dport)| dport),
            policies,
        }
    }
}

/// The flows written lately, so that one flow is one line.
#[derive(Default)]
pub struct RecentFlows {
    seen: HashMap<(Isolation, Headers), Instant>,
}

impl RecentFlows {
    /// True when this flow was not written within [`SAME_FLOW`] of `now` (and it is remembered as written).
    pub fn is_new(&mut self, isolation: Isolation, headers: &Headers, now: Instant) -> bool {
        if self.seen.len() >= FLOWS_REMEMBERED {
            self.seen.retain(|_, at| now.duration_since(*at) < SAME_FLOW);
            if self.seen.len() >= FLOWS_REMEMBERED {
                self.seen.clear();
            }
        }
        match self.seen.get(&(isolation, *headers)) {
            Some(at) if now.duration_since(*at) < SAME_FLOW => false,
            _ => {
                self.seen.insert((isolation, *headers), now);
                true
            }
        }
    }
}

/// The drop log of a run directory, appended to.
pub struct DropFile {
    path: PathBuf,
}

impl DropFile {
    pub fn new(run_dir: &Path) -> DropFile {
        DropFile { path: run_dir.join(FILE) }
    }

    /// Appends one line, rotating the file first when it has grown past [`MAX_BYTES`].
    pub fn append(&self, record: &DropRecord) -> io::Result<()> {
        if fs::metadata(&self.path).is_ok_and(|m| m.len() >= MAX_BYTES) {
            fs::rename(&self.path, rotated(&self.path))?;
        }
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut file = OpenOptions::new().create(true).append(true).mode(0o640).open(&self.path)?;
        file.write_all(&line)
    }
}

fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// `cni-netpol drops`: the log's lines (the rotated file's first), then with `follow` each new line as it
/// is written, across rotations, until killed.
pub fn print(run_dir: &Path, follow: bool, out: &mut dyn Write) -> io::Result<()> {
    let path = run_dir.join(FILE);
    if let Ok(old) = File::open(rotated(&path)) {
        io::copy(&mut BufReader::new(old), out)?;
    }
    let mut current = match File::open(&path) {
        Ok(file) => Some(file),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    if let Some(file) = current.as_mut() {
        io::copy(file, out)?;
    }
    out.flush()?;
    if !follow {
        return Ok(());
    }
    loop {
        std::thread::sleep(Duration::from_millis(200));
        follow_once(&path, &mut current, out)?;
    }
}

/// Prints what was appended since the last call; a file replaced (rotated) is read from its start.
fn follow_once(path: &Path, current: &mut Option<File>, out: &mut dyn Write) -> io::Result<()> {
    let on_disk = fs::metadata(path).ok().map(|m| m.ino());
    let open = current.as_ref().and_then(|f| f.metadata().ok()).map(|m| m.ino());
    if on_disk.is_some() && on_disk != open {
        if let Some(old) = current.as_mut() {
            io::copy(old, out)?; // the end of the rotated file
        }
        *current = File::open(path).ok();
    }
    if let Some(file) = current.as_mut() {
        let position = file.stream_position()?;
        if file.metadata()?.len() < position {
            file.seek(SeekFrom::Start(0))?;
        }
        let mut appended = Vec::new();
        file.read_to_end(&mut appended)?;
        // A line being written is printed once whole.
        let whole = appended.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        file.seek(SeekFrom::Current(-((appended.len() - whole) as i64)))?;
        out.write_all(&appended[..whole])?;
        out.flush()?;
    }
    Ok(())
}

/// Every record of the log (the rotated file's first); lines that do not parse are skipped.
pub fn read(run_dir: &Path) -> io::Result<Vec<DropRecord>> {
    let path = run_dir.join(FILE);
    let mut out = Vec::new();
    for file in [rotated(&path), path] {
        let Ok(file) = File::open(&file) else { continue };
        for line in BufReader::new(file).lines() {
            if let Ok(record) = serde_json::from_str(&line?) {
                out.push(record);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::tests::{policy, suite_cluster};
    use crate::compile::{compile, NodeOptions};
    use crate::plan::{PROTO_TCP, PROTO_UDP};

    fn headers(src: &str, dst: &str, proto: u8, sport: u16, dport: u16) -> Headers {
        Headers { src: src.parse().unwrap(), dst: dst.parse().unwrap(), proto, ports: Some((sport, dport)) }
    }

    #[test]
    fn a_record_names_the_pods_and_the_isolating_policies() {
        let mut cluster = suite_cluster();
        cluster.policies.push(policy("x", "deny-in", serde_json::json!({"podSelector": {}})));
        let plan = compile(&cluster, &NodeOptions::default());
        let directory = Directory::new(&cluster, &plan);
        // y/b (10.244.1.22) to x/a (10.244.1.11): x's ingress isolated by x/deny-in.
        let h = headers("10.244.1.22", "10.244.1.11", PROTO_TCP, 40000, 80);
        let record = directory.record(Isolation::Ingress, &h, "t".into());
        let line = serde_json::to_string(&record).unwrap();
        assert_eq!(
            line,
            r#"{"time":"t","direction":"ingress","src":{"pod":"y/b","ip":"10.244.1.22"},"dst":{"pod":"x/a","ip":"10.244.1.11"},"protocol":"tcp","port":80,"policies":["x/deny-in"]}"#
        );
        let outside = headers("10.244.1.22", "192.0.2.1", PROTO_UDP, 1, 53);
        let record = directory.record(Isolation::UnknownDestination, &outside, "t".into());
        assert_eq!((record.dst.pod, record.policies), (None, vec![]));
    }

    #[test]
    fn one_line_per_flow() {
        let mut recent = RecentFlows::default();
        let start = Instant::now();
        let flow = headers("10.0.0.1", "10.0.0.2", PROTO_TCP, 40000, 80);
        assert!(recent.is_new(Isolation::Ingress, &flow, start));
        assert!(!recent.is_new(Isolation::Ingress, &flow, start + Duration::from_secs(1)), "a retransmission");
        let other = headers("10.0.0.1", "10.0.0.2", PROTO_TCP, 40001, 80);
        assert!(recent.is_new(Isolation::Ingress, &other, start), "a new connection");
        assert!(recent.is_new(Isolation::Ingress, &flow, start + SAME_FLOW), "again after a while");
    }

    #[test]
    fn appends_rotates_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("netpol-drops-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = DropFile::new(&dir);
        let h = headers("10.0.0.1", "10.0.0.2", PROTO_TCP, 40000, 80);
        let record = Directory::default().record(Isolation::Egress, &h, "t".into());
        file.append(&record).unwrap();
        file.append(&record).unwrap();
        assert_eq!(read(&dir).unwrap(), vec![record.clone(), record.clone()]);
        // Past the bound the file becomes drops.jsonl.1 and a new one starts; both are read, in order.
        let big = File::options().append(true).open(dir.join(FILE)).unwrap();
        big.set_len(MAX_BYTES).unwrap();
        file.append(&record).unwrap();
        assert_eq!(
            fs::metadata(dir.join(FILE)).unwrap().len() as usize,
            serde_json::to_vec(&record).unwrap().len() + 1
        );
        assert!(fs::metadata(dir.join("drops.jsonl.1")).unwrap().len() >= MAX_BYTES);
        let mut printed = Vec::new();
        print(&dir, false, &mut printed).unwrap();
        assert!(printed.ends_with(&[serde_json::to_vec(&record).unwrap(), b"\n".to_vec()].concat()));
        fs::remove_dir_all(&dir).unwrap();
    }
}
