//! The firewalld backend: each container address goes into a firewalld zone (`firewalldZone`, default
//! `trusted`) as a source, over D-Bus, as the reference does (`org.fedoraproject.FirewallD1.zone.addSource`,
//! `removeSource`, `querySource`). firewalld's runtime configuration holds them; nothing is made permanent.

use cnicore::firewall::Backend as Kernel;
use cnicore::spec::{codes, report_rollback, Error, Errors, Result};
use ipnet::IpNet;

use crate::config::{Backend, Config, Isolation};
use crate::dbus::{self, CallError, Connection, Value};
use crate::driver::Driver;
use crate::kernel;

const BUS_NAME: &str = "org.freedesktop.DBus";
const BUS_PATH: &str = "/org/freedesktop/DBus";
const FIREWALLD_NAME: &str = "org.fedoraproject.FirewallD1";
const FIREWALLD_PATH: &str = "/org/fedoraproject/FirewallD1";
const ZONE_INTERFACE: &str = "org.fedoraproject.FirewallD1.zone";

/// A connection to the system bus on which firewalld runs.
pub struct Firewalld {
    connection: Connection,
}

impl Firewalld {
    /// Connects to the system bus; `None` when the bus cannot be reached or firewalld does not own its name
    /// there (what the reference checks before choosing firewalld).
    pub fn if_running() -> Option<Firewalld> {
        let mut connection = Connection::open(&dbus::system_bus_address()).ok()?;
        let answer = connection.call(BUS_NAME, BUS_PATH, BUS_NAME, "NameHasOwner", &[FIREWALLD_NAME]).ok()?;
        (answer.first() == Some(&Value::Bool(true))).then_some(Firewalld { connection })
    }

    /// Like [`Firewalld::if_running`], but an error saying why when the config asks for firewalld.
    pub fn require() -> Result<Firewalld> {
        Firewalld::if_running().ok_or_else(|| {
            Error::new(
                codes::NOT_AVAILABLE,
                format!(
                    "backend \"firewalld\": firewalld is not running on the system bus ({}); start firewalld or use backend \"iptables\" or \"nftables\"",
                    dbus::system_bus_address()
                ),
            )
        })
    }

    fn zone_call(&mut self, method: &str, zone: &str, ip: &IpNet) -> std::result::Result<Vec<Value>, CallError> {
        self.connection.call(FIREWALLD_NAME, FIREWALLD_PATH, ZONE_INTERFACE, method, &[zone, &ip.to_string()])
    }

    /// Binds each address to `zone`; an address already there is fine (`ZONE_ALREADY_SET`), one bound to
    /// another zone is an error (`ZONE_CONFLICT`), as in the reference.
    /// On failure, the addresses this call bound are unbound again.
    fn add_sources(&mut self, zone: &str, ips: &[IpNet]) -> Result<()> {
        let mut added = Vec::new();
        for ip in ips {
            match self.zone_call("addSource", zone, ip) {
                Ok(_) => added.push(*ip),
                Err(CallError::Remote { message, .. }) if message.starts_with("ZONE_ALREADY_SET") => {}
                Err(e) => {
                    report_rollback(
                        "removing the addresses just added to firewalld",
                        self.remove_sources(zone, &added),
                    );
                    return Err(Error::internal(format!(
                        "failed to add the address {ip} to the {zone} zone of firewalld: {e}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Unbinds each address from `zone`; addresses not bound (`UNKNOWN_SOURCE`) are fine.
    pub fn remove_sources(&mut self, zone: &str, ips: &[IpNet]) -> Result<()> {
        for ip in ips {
            match self.zone_call("removeSource", zone, ip) {
                Ok(_) => {}
                Err(CallError::Remote { message, .. }) if message.starts_with("UNKNOWN_SOURCE") => {}
                Err(e) => {
                    return Err(Error::internal(format!(
                        "failed to remove the address {ip} from the {zone} zone of firewalld: {e}"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Every address is bound to `zone` (the reference only checks that the query answers).
    fn query_sources(&mut self, zone: &str, ips: &[IpNet]) -> Result<()> {
        for ip in ips {
            match self.zone_call("querySource", zone, ip) {
                Ok(answer) if answer.first() == Some(&Value::Bool(true)) => {}
                Ok(_) => {
                    return Err(Error::internal(format!("the address {ip} is not in the {zone} zone of firewalld")))
                }
                Err(e) => {
                    return Err(Error::internal(format!(
                        "failed to find the address {ip} in the {zone} zone of firewalld: {e}"
                    )))
                }
            }
        }
        Ok(())
    }
}

/// The kernel backend of the isolation rules, which firewalld does not make (the reference runs iptables).
fn isolation_kernel() -> Result<Kernel> {
    Backend::Firewalld.isolation_kernel()
}

impl Driver for Firewalld {
    fn backend(&self) -> Backend {
        Backend::Firewalld
    }

    fn open(&mut self, config: &Config, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
        self.add_sources(&config.zone, ips)?;
        let Some(isolation) = isolation else { return Ok(()) };
        if let Err(e) = isolation_kernel().and_then(|kernel| kernel::driver(kernel).isolate(config, ips, isolation)) {
            report_rollback("removing the addresses from firewalld", self.remove_sources(&config.zone, ips));
            return Err(e);
        }
        Ok(())
    }

    fn close(&mut self, config: &Config, ips: &[IpNet], drop_of: Option<&str>) -> Result<()> {
        let mut errors = Errors::new();
        errors.record(self.remove_sources(&config.zone, ips));
        if let Some(bridge) = drop_of {
            errors.record(remove_drop(bridge, ips));
        }
        errors.into_result()
    }

    fn check(&mut self, config: &Config, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
        self.query_sources(&config.zone, ips)?;
        let Some(isolation) = isolation else { return Ok(()) };
        kernel::driver(isolation_kernel()?).check_isolation(config, ips, isolation)
    }
}

/// Removes a bridge's `isolated` drop from the kernel, where the firewalld backend keeps it (also when
/// firewalld is gone: its sources went with it, the kernel's drop did not).
pub fn remove_drop(bridge: &str, ips: &[IpNet]) -> Result<()> {
    kernel::driver(isolation_kernel()?).remove_drop(bridge, ips)
}
