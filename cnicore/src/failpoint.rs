//! Named fail points for crash-consistency tests.
//!
//! A plugin calls `failpoint::hit("bridge/after-veth")` after each step that changes the node. In a build with
//! the `failpoints` feature, a process whose `CNI_FAILPOINT` names that point kills itself with SIGKILL there,
//! exactly as an OOM kill or a node crash would stop it. Without the feature the call compiles to nothing, so
//! release binaries carry neither the check nor the environment lookup.

/// Stops the process with SIGKILL when this is the fail point named by `CNI_FAILPOINT` (test builds only).
#[inline(always)]
pub fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    if std::env::var_os("CNI_FAILPOINT").is_some_and(|v| v == name) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

/// The rest of `CNI_FAILPOINT` after `prefix`, when it starts with it (test builds only; `None` in others): a
/// point a test makes fail in another way than a kill, e.g. `netpol/kernel-refuses:NAMESPACE/NAME`.
#[inline(always)]
pub fn argument(prefix: &str) -> Option<String> {
    #[cfg(feature = "failpoints")]
    return std::env::var("CNI_FAILPOINT").ok().and_then(|v| v.strip_prefix(prefix).map(str::to_string));
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = prefix;
        None
    }
}
