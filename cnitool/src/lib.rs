//! The runner: libcni's behaviour (config lists, chaining, the result cache, GC and STATUS) as a library, used by
//! the `cnitool` binary and by tests.
//!
//! - [`libcni`]: config lists, running the plugins with `prevResult` chaining, the result cache.
//! - [`base64`]: the encoding libcni's cache stores the network config in.

pub mod base64;
pub mod libcni;
