//! The kernel backends (iptables, nftables) by name: what the plugin's verbs and the firewalld backend (which
//! leaves a bridge's isolation rules to the machine's kernel backend) hand work to. Below both, above the
//! backends, so that [`crate::driver`] only describes what a backend does.

use cnicore::firewall::Backend as Kernel;

use crate::driver::KernelDriver;
use crate::iptables::Iptables;
use crate::nftables::Nftables;

/// The driver of a kernel backend.
pub fn driver(kernel: Kernel) -> Box<dyn KernelDriver> {
    match kernel {
        Kernel::Iptables => Box::new(Iptables),
        Kernel::Nftables => Box::new(Nftables),
    }
}
