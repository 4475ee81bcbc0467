//! The runner: libcni's behaviour (config lists, chaining, the result cache, GC and STATUS) as a library, used by
//! the `cnitool` binary and by tests.

pub mod base64;
pub mod libcni;
