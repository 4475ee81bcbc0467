//! The host-device configuration and how it names the device (the reference v1.9's `loadConf` and `getLink`):
//! `device` (a link name), `hwaddr` (a MAC), `kernelpath` (a `/sys/devices/...` directory whose `net/` holds
//! the link), `pciBusID` (`/sys/bus/pci/devices/<id>/net/`, or a virtio function's `net/` under it), or the
//! runtime's `runtimeConfig.deviceID` (a PCI or auxiliary-bus device, overriding `pciBusID`). A PCI device bound
//! to a userspace driver (vfio-pci, uio_pci_generic, igb_uio) is in DPDK mode: it has no link to move.

use cnicore::netlink::{Link, Netlink};
use cnicore::spec::{truncate_for_msg as truncate, validate_ifname, Context, Dns, Error, ErrorContext, Result};
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};

const SYS_BUS_PCI: &str = "/sys/bus/pci/devices";
const SYS_BUS_AUXILIARY: &str = "/sys/bus/auxiliary/devices";
const USERSPACE_DRIVERS: &[&str] = &["vfio-pci", "uio_pci_generic", "igb_uio"];

/// How the device is named, in the reference's order of precedence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Name(String),
    Mac([u8; 6]),
    KernelPath(PathBuf),
    Pci(String),
    Auxiliary(String),
}

#[derive(Debug)]
pub struct Config {
    pub selector: Selector,
    /// A PCI device bound to a userspace driver: nothing to move.
    pub dpdk: bool,
    pub ipam_type: Option<String>,
    pub dns: Option<Dns>,
    /// Where the records of what the devices had go (ours: the reference keeps none).
    pub data_dir: PathBuf,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfIn {
    #[serde(default)]
    device: String,
    #[serde(default)]
    hwaddr: String,
    #[serde(default)]
    kernelpath: String,
    #[serde(default, rename = "pciBusID")]
    pci_bus_id: String,
    #[serde(default)]
    runtime_config: Option<RuntimeIn>,
    #[serde(default)]
    data_dir: String,
}

#[derive(Deserialize)]
struct RuntimeIn {
    #[serde(default, rename = "deviceID")]
    device_id: String,
}

/// A bus address names one directory under `/sys/bus/*/devices`: no separators, no `..`.
fn validate_bus_id(what: &str, id: &str) -> Result<()> {
    let ok = !id.is_empty() && id.len() <= 64 && id != "." && id != ".." && !id.contains(['/', '\0']);
    if !ok {
        return Err(Error::config(format!("{what} {:?} is not a bus address", truncate(id))));
    }
    Ok(())
}

impl Config {
    /// The config; `lenient_sysfs` (DEL) takes a PCI device whose driver cannot be read as not in DPDK mode,
    /// so that a DEL after the device went away still succeeds.
    pub fn load(ctx: &Context, lenient_sysfs: bool) -> Result<Config> {
        let conf: ConfIn = ctx.parse_conf()?;
        let ipam_type = ctx.conf.ipam_type_if_any()?.map(str::to_string);
        let mut pci = conf.pci_bus_id;
        let mut auxiliary = None;
        let device_id = conf.runtime_config.map(|r| r.device_id).unwrap_or_default();
        if !device_id.is_empty() {
            validate_bus_id("runtimeConfig.deviceID", &device_id)?;
            if Path::new(SYS_BUS_PCI).join(&device_id).exists() {
                pci = device_id;
            } else if Path::new(SYS_BUS_AUXILIARY).join(&device_id).exists() {
                pci.clear();
                auxiliary = Some(device_id);
            } else {
                return Err(Error::config(format!(
                    "runtime config DeviceID {} not found or unsupported",
                    truncate(&device_id)
                )));
            }
        }
        let selector = if !conf.device.is_empty() {
            validate_ifname(&conf.device).map_err(|e| Error::config(format!("device: {}", e.msg)))?;
            Selector::Name(conf.device)
        } else if !conf.hwaddr.is_empty() {
            Selector::Mac(parse_mac(&conf.hwaddr)?)
        } else if !conf.kernelpath.is_empty() {
            let path = Path::new(&conf.kernelpath);
            // The reference checks the prefix of the path as written; `..` would then leave /sys/devices.
            let clean = path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
            if !path.starts_with("/sys/devices/") || !clean || conf.kernelpath.contains('\0') {
                return Err(Error::config(format!(
                    "kernel device path {:?} must be absolute and begin with /sys/devices/",
                    truncate(&conf.kernelpath)
                )));
            }
            Selector::KernelPath(path.to_path_buf())
        } else if !pci.is_empty() {
            validate_bus_id("pciBusID", &pci)?;
            Selector::Pci(pci.clone())
        } else if let Some(aux) = auxiliary {
            Selector::Auxiliary(aux)
        } else {
            return Err(Error::config(r#"specify either "device", "hwaddr", "kernelpath" or "pciBusID""#));
        };
        // As the reference: the driver of the PCI device of `pciBusID` or `deviceID` decides DPDK mode, also when
        // `device`, `hwaddr` or `kernelpath` selects the link.
        let dpdk = match pci.is_empty() {
            true => false,
            false => {
                validate_bus_id("pciBusID", &pci)?;
                match has_userspace_driver(&pci) {
                    Ok(dpdk) => dpdk,
                    Err(_) if lenient_sysfs => false,
                    Err(e) => return Err(e),
                }
            }
        };
        let data_dir = match conf.data_dir.as_str() {
            "" => PathBuf::from(crate::saved::DEFAULT_DATA_DIR),
            d if d.starts_with('/') && !d.contains('\0') => PathBuf::from(d),
            d => return Err(Error::config(format!("dataDir must be an absolute path, got {:?}", truncate(d)))),
        };
        Ok(Config { selector, dpdk, ipam_type, dns: ctx.conf.dns.clone(), data_dir })
    }
}

/// Go's `net.ParseMAC` for an Ethernet address; any such address may name a device (no unicast check).
fn parse_mac(text: &str) -> Result<[u8; 6]> {
    // cnicore::mac refuses multicast addresses, which no device has anyway.
    cnicore::mac::parse(text).map_err(|e| Error::config(format!("failed to parse MAC address: {}", e.msg)))
}

fn has_userspace_driver(pci: &str) -> Result<bool> {
    let link = Path::new(SYS_BUS_PCI).join(pci).join("driver");
    let driver = std::fs::canonicalize(&link)
        .map_err(|e| Error::internal(format!("error with host device: PCI device {pci}: {}: {e}", link.display())))?;
    let name = driver.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    Ok(USERSPACE_DRIVERS.contains(&name))
}

/// The first entry (by name, as Go's `os.ReadDir` sorts) of a sysfs `net/` directory.
fn first_net_device(dir: &Path) -> Result<String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::internal(format!("failed to read directory {}: {e}", dir.display())))?;
    let mut names: Vec<String> = entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort();
    names
        .into_iter()
        .next()
        .ok_or_else(|| Error::internal(format!("failed to find network device in path {}", dir.display())))
}

/// The `net/` directory of a PCI device, or of its virtio function.
fn pci_net_dir(pci: &str) -> Result<PathBuf> {
    let device = Path::new(SYS_BUS_PCI).join(pci);
    let net = device.join("net");
    if net.symlink_metadata().is_ok() {
        return Ok(net);
    }
    let mut virtio: Vec<PathBuf> = std::fs::read_dir(&device)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("virtio"))
        .map(|e| e.path().join("net"))
        .filter(|p| p.exists())
        .collect();
    virtio.sort();
    virtio.into_iter().next().ok_or_else(|| Error::internal(format!("no net directory under pci device {pci}")))
}

/// The link the selector names, in the node namespace.
pub fn find_link(nl: &mut Netlink, selector: &Selector) -> Result<Link> {
    let by_name = |nl: &mut Netlink, name: &str| -> Result<Link> {
        nl.link_by_name(name)
            .context("failed to look up the host device")?
            .ok_or_else(|| Error::internal(format!("Link not found: {name:?}")))
    };
    match selector {
        Selector::Name(name) => by_name(nl, name),
        Selector::Mac(mac) => nl
            .links()
            .context("failed to list node links")?
            .into_iter()
            .find(|l| l.mac.as_ref() == Some(mac))
            .ok_or_else(|| Error::internal(format!("no link with hardware address {}", cnicore::mac::format(mac)))),
        Selector::KernelPath(path) => by_name(nl, &first_net_device(&path.join("net"))?),
        Selector::Pci(pci) => by_name(nl, &first_net_device(&pci_net_dir(pci)?)?),
        Selector::Auxiliary(aux) => {
            by_name(nl, &first_net_device(&Path::new(SYS_BUS_AUXILIARY).join(aux).join("net"))?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::{codes, Command};
    use serde_json::{json, Value};

    fn load(extra: Value) -> Result<Config> {
        let mut conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "host-device"});
        conf.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        Config::load(&Context::for_test(Command::Add, conf.to_string(), ""), false)
    }

    #[test]
    fn selectors_in_the_reference_order() {
        let c = load(json!({"device": "eth1", "hwaddr": "02:00:00:00:00:01"})).unwrap();
        assert_eq!(c.selector, Selector::Name("eth1".into()));
        let c = load(json!({"hwaddr": "02:00:00:00:00:01", "kernelpath": "/sys/devices/x"})).unwrap();
        assert_eq!(c.selector, Selector::Mac([2, 0, 0, 0, 0, 1]));
        let c = load(json!({"kernelpath": "/sys/devices/pci0000:00/x"})).unwrap();
        assert_eq!(c.selector, Selector::KernelPath("/sys/devices/pci0000:00/x".into()));
        assert!(c.ipam_type.is_none() && !c.dpdk);
    }

    #[test]
    fn refusals() {
        let e = load(json!({})).unwrap_err();
        assert_eq!(e.code, codes::INVALID_CONFIG);
        assert!(e.msg.contains("specify either"), "{}", e.msg);
        for path in ["/etc", "sys/devices/x", "/sys/devices/../../etc", "/sys/devicesx/a"] {
            let e = load(json!({"kernelpath": path})).unwrap_err();
            assert!(e.msg.contains("must be absolute and begin with /sys/devices/"), "{path}: {}", e.msg);
        }
        assert!(load(json!({"hwaddr": "zz"})).unwrap_err().msg.contains("failed to parse MAC"));
        assert_eq!(load(json!({"device": "a/b"})).unwrap_err().code, codes::INVALID_CONFIG);
        assert_eq!(load(json!({"device": "x".repeat(16)})).unwrap_err().code, codes::INVALID_CONFIG);
        for id in ["..", "a/b", ""] {
            assert!(validate_bus_id("pciBusID", id).is_err(), "{id}");
        }
        let e = load(json!({"pciBusID": "0000:ff:1f.7"})).unwrap_err();
        assert!(e.msg.contains("error with host device"), "{}", e.msg);
        let e = load(json!({"device": "eth1", "runtimeConfig": {"deviceID": "0000:ff:1f.7"}})).unwrap_err();
        assert!(e.msg.contains("not found or unsupported"), "{}", e.msg);
        assert!(load(json!({"device": "eth1", "ipam": {"type": "../x"}})).is_err());
    }

    #[test]
    fn ipam_is_optional() {
        assert!(load(json!({"device": "eth1", "ipam": {}})).unwrap().ipam_type.is_none());
        let c = load(json!({"device": "eth1", "ipam": {"type": "static"}})).unwrap();
        assert_eq!(c.ipam_type.as_deref(), Some("static"));
    }
}
