//! fabricd's log: one line per event on stderr, `fabricd <level>: <message>`, and the short forms of what a
//! line reports.

/// Logs one line on stderr: `fabricd <level>: <message>`.
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        eprintln!("fabricd {}: {}", stringify!($level), format!($($arg)*))
    };
}
pub(crate) use log;

/// The first changes (or any items), for a log line.
pub fn summary<T: std::fmt::Display>(changes: &[T]) -> String {
    const SHOWN: usize = 5;
    let mut text = changes.iter().take(SHOWN).map(|c| c.to_string()).collect::<Vec<_>>().join("; ");
    if changes.len() > SHOWN {
        text.push_str(&format!("; and {} more", changes.len() - SHOWN));
    }
    text
}
