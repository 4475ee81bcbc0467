//! The daemon's log: stderr in Go's `log` format, as the reference daemon writes it. A module of its own, below
//! the daemon and its lease threads, which both write to it.

/// Go's `log` format, as the reference daemon writes: `2006/01/02 15:04:05 message` (UTC).
pub fn say(msg: std::fmt::Arguments) {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rest / 3600, rest % 3600 / 60, rest % 60);
    eprintln!("{year:04}/{month:02}/{day:02} {h:02}:{m:02}:{s:02} dhcp daemon: {msg}");
}
