//! The token bucket filter (`tbf`) qdisc: its netlink options (netlink-packet-route has no typed tbf),
//! the psched clock, and the reference bandwidth plugin's rate/burst → buffer/limit arithmetic.

use std::sync::OnceLock;

use crate::netlink::wire::attributes;

/// `TCA_TBF_*` attribute numbers (linux/pkt_sched.h).
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;

/// `TC_LINKLAYER_ETHERNET`: what `tc` puts in a rate spec; the kernel only treats ATM specially.
const TC_LINKLAYER_ETHERNET: u8 = 1;

/// `struct tc_ratespec` is 12 bytes; `struct tc_tbf_qopt` is two of them plus limit, buffer, mtu.
const RATESPEC_LEN: usize = 12;
const TBF_QOPT_LEN: usize = 2 * RATESPEC_LEN + 12;

/// Microseconds per second: psched's "time units" (`TIME_UNITS_PER_SEC` in iproute2 and vishvananda/netlink).
pub const TIME_UNITS_PER_SEC: f64 = 1_000_000.0;

/// The queueing latency the reference bandwidth plugin sizes the tbf limit for.
pub const REFERENCE_LATENCY_MS: f64 = 25.0;

/// The kernel keeps the tbf buffer as nanoseconds in a u32 (`min(ticks << 6, ~0U)`), so it never reports
/// more ticks than this; anything larger behaves, and reads back, as this.
pub const MAX_BUFFER_TICKS: u32 = u32::MAX >> 6;

/// Options of a tbf qdisc, in the units the kernel uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// Bytes per second.
    pub rate: u64,
    /// Bucket size as time: psched ticks needed to send it at `rate`.
    pub buffer: u32,
    /// Bytes that may wait in the queue.
    pub limit: u32,
    /// `TCA_TBF_BURST`: bucket size in bytes; when given the kernel derives the buffer from it. The
    /// reference plugin does not send it (it sends `buffer`), and neither do we by default.
    pub burst: Option<u32>,
}

/// Why a rate/burst pair cannot become a tbf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TbfError {
    /// The rate is below one byte per second (the kernel counts bytes).
    RateTooLow,
    /// The burst is below one byte.
    BurstTooLow,
    /// The burst does not fit the kernel's 32-bit byte counters ("burst cannot be more than 4GB").
    BurstTooLarge,
    /// rate × latency + burst overflows the 32-bit queue limit.
    LimitOverflow,
}

impl std::fmt::Display for TbfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TbfError::RateTooLow => "rate must be at least 8 bits per second",
            TbfError::BurstTooLow => "burst must be at least 8 bits",
            TbfError::BurstTooLarge => "burst cannot be more than 4GB",
            TbfError::LimitOverflow => {
                "rate and burst are too large: the queue limit (25 ms at the rate plus the burst) exceeds 4GB"
            }
        })
    }
}

impl std::error::Error for TbfError {}

impl Tbf {
    /// The tbf the reference bandwidth plugin (containernetworking/plugins v1.1.1, `createTBF`) installs for
    /// `rate_bits` bit/s and `burst_bits` bits: rate = rate/8 bytes, buffer = time2tick(burst·10⁶/rate),
    /// limit = rate·25 ms + burst, with the same float arithmetic so that the values are identical.
    /// Where the reference silently wraps 32-bit values, this errs (burst, limit) or saturates the buffer at
    /// the kernel's own maximum (`MAX_BUFFER_TICKS`, ~4.29 s), which is what the kernel applies anyway.
    pub fn like_reference(rate_bits: u64, burst_bits: u64) -> Result<Tbf, TbfError> {
        let rate = rate_bits / 8;
        let burst = burst_bits / 8;
        if rate == 0 {
            return Err(TbfError::RateTooLow);
        }
        if burst == 0 {
            return Err(TbfError::BurstTooLow);
        }
        if burst >= u64::from(u32::MAX) {
            return Err(TbfError::BurstTooLarge);
        }
        let burst = burst as u32;
        let buffer = reference_buffer(rate, burst);
        let latency = TIME_UNITS_PER_SEC * (REFERENCE_LATENCY_MS / 1000.0);
        let queued = rate as f64 * latency / TIME_UNITS_PER_SEC;
        if queued >= u32::MAX as f64 {
            return Err(TbfError::LimitOverflow);
        }
        let limit = (queued as u32).checked_add(burst).ok_or(TbfError::LimitOverflow)?;
        Ok(Tbf { rate, buffer, limit, burst: None })
    }

    /// The value of `TCA_OPTIONS`: the nested `TCA_TBF_*` attributes as (type, payload) pairs.
    pub fn to_attributes(&self) -> Vec<(u16, Vec<u8>)> {
        let mut qopt = Vec::with_capacity(TBF_QOPT_LEN);
        // rate: the 32-bit field saturates, TCA_TBF_RATE64 carries larger rates (as tc does).
        qopt.extend_from_slice(&ratespec(u32::try_from(self.rate).unwrap_or(u32::MAX)));
        qopt.extend_from_slice(&[0; RATESPEC_LEN]); // no peak rate
        qopt.extend_from_slice(&self.limit.to_ne_bytes());
        qopt.extend_from_slice(&self.buffer.to_ne_bytes());
        qopt.extend_from_slice(&0u32.to_ne_bytes()); // mtu: only used with a peak rate
        let mut attributes = vec![(TCA_TBF_PARMS, qopt)];
        if self.rate > u64::from(u32::MAX) {
            attributes.push((TCA_TBF_RATE64, self.rate.to_ne_bytes().to_vec()));
        }
        if let Some(burst) = self.burst {
            attributes.push((TCA_TBF_BURST, burst.to_ne_bytes().to_vec()));
        }
        attributes
    }

    /// Reads the tbf back from the payload of a dumped `TCA_OPTIONS` (nested attributes).
    pub fn from_options(payload: &[u8]) -> Option<Tbf> {
        let mut tbf: Option<Tbf> = None;
        let mut rate64 = None;
        for (kind, value) in attributes(payload) {
            match kind {
                TCA_TBF_PARMS if value.len() >= TBF_QOPT_LEN => {
                    let word = |at: usize| u32::from_ne_bytes([value[at], value[at + 1], value[at + 2], value[at + 3]]);
                    tbf = Some(Tbf {
                        rate: u64::from(word(8)),
                        limit: word(2 * RATESPEC_LEN),
                        buffer: word(2 * RATESPEC_LEN + 4),
                        burst: None,
                    });
                }
                TCA_TBF_RATE64 if value.len() >= 8 => {
                    let mut bytes = [0; 8];
                    bytes.copy_from_slice(&value[..8]);
                    rate64 = Some(u64::from_ne_bytes(bytes));
                }
                _ => {}
            }
        }
        let mut tbf = tbf?;
        if let Some(rate) = rate64 {
            tbf.rate = rate;
        }
        Some(tbf)
    }

    /// What the kernel will report for this tbf: the buffer saturates at [`MAX_BUFFER_TICKS`].
    pub fn as_kernel_reports(&self) -> Tbf {
        Tbf { buffer: self.buffer.min(MAX_BUFFER_TICKS), burst: None, ..*self }
    }
}

/// `struct tc_ratespec` {cell_log, linklayer, overhead, cell_align, mpu, rate}.
fn ratespec(rate: u32) -> [u8; RATESPEC_LEN] {
    let mut spec = [0; RATESPEC_LEN];
    spec[1] = TC_LINKLAYER_ETHERNET;
    spec[8..].copy_from_slice(&rate.to_ne_bytes());
    spec
}

/// The reference's `buffer(rate, burst) = time2Tick(uint32(burst * 1e6 / rate))` in bytes and bytes/s,
/// saturated at the kernel's maximum.
fn reference_buffer(rate: u64, burst: u32) -> u32 {
    let usec = f64::from(burst) * TIME_UNITS_PER_SEC / rate as f64;
    if usec >= u32::MAX as f64 {
        return MAX_BUFFER_TICKS;
    }
    // Truncation toward zero, as Go's float → uint32 conversion.
    let ticks = f64::from(usec as u32) * tick_in_usec();
    if ticks >= f64::from(MAX_BUFFER_TICKS) {
        return MAX_BUFFER_TICKS;
    }
    ticks as u32
}

/// psched ticks per microsecond, from `/proc/net/psched` as iproute2 and vishvananda/netlink read it
/// (15.625 on every kernel since 2.6.31; that value is used when the file cannot be read).
pub fn tick_in_usec() -> f64 {
    static TICK: OnceLock<f64> = OnceLock::new();
    *TICK.get_or_init(|| {
        std::fs::read_to_string("/proc/net/psched").ok().and_then(|text| parse_psched(&text)).unwrap_or(15.625)
    })
}

/// Parses the four hex words of `/proc/net/psched` into ticks per microsecond.
fn parse_psched(text: &str) -> Option<f64> {
    let words: Vec<u64> = text.split_whitespace().map(|w| u64::from_str_radix(w, 16).ok()).collect::<Option<_>>()?;
    let [mut t2us, us2t, clock_res, ..] = words[..] else { return None };
    if us2t == 0 {
        return None;
    }
    // Compatibility rule of iproute2: a nanosecond clock resolution means the first word is stale.
    if clock_res == 1_000_000_000 {
        t2us = us2t;
    }
    let clock_factor = clock_res as f64 / TIME_UNITS_PER_SEC;
    Some(t2us as f64 / us2t as f64 * clock_factor)
}

/// Microseconds → psched ticks (`time2tick`).
pub fn time_to_ticks(usec: u32) -> u32 {
    (f64::from(usec) * tick_in_usec()) as u32
}

/// psched ticks → microseconds (`tick2time`).
pub fn ticks_to_time(ticks: u32) -> u32 {
    (f64::from(ticks) / tick_in_usec()) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psched_of_modern_kernels() {
        assert_eq!(parse_psched("000003e8 00000040 000f4240 3b9aca00\n"), Some(15.625));
        assert_eq!(parse_psched("garbage"), None);
        assert_eq!(parse_psched("1 0 1 1"), None);
    }

    #[test]
    fn reference_values() {
        // 1 Mbit/s with a 1 Mbit burst: 125000 B/s, 1 s of buffer, 25 ms of queue plus the burst.
        let tbf = Tbf::like_reference(1_000_000, 1_000_000).unwrap();
        assert_eq!(tbf.rate, 125_000);
        assert_eq!(tbf.buffer, (1_000_000.0 * tick_in_usec()) as u32);
        assert_eq!(tbf.limit, 3125 + 125_000);
        // The reference's own test values: rate 8 bit/s (1 B/s), burst 80 bits (10 B).
        let tbf = Tbf::like_reference(8, 80).unwrap();
        assert_eq!((tbf.rate, tbf.limit), (1, 10));
        assert_eq!(tbf.buffer, time_to_ticks(10_000_000).min(MAX_BUFFER_TICKS));
    }

    #[test]
    fn bad_values() {
        assert_eq!(Tbf::like_reference(7, 800), Err(TbfError::RateTooLow));
        assert_eq!(Tbf::like_reference(800, 7), Err(TbfError::BurstTooLow));
        assert_eq!(Tbf::like_reference(800, u64::from(u32::MAX) * 8), Err(TbfError::BurstTooLarge));
        assert_eq!(Tbf::like_reference(u64::MAX, 800), Err(TbfError::LimitOverflow));
        // containerd's "no limit" burst (MaxUint32 bits) is accepted; the buffer saturates as in the kernel.
        let tbf = Tbf::like_reference(1_000_000, u64::from(u32::MAX)).unwrap();
        assert_eq!(tbf.buffer, MAX_BUFFER_TICKS);
    }

    #[test]
    fn options_round_trip() {
        for rate in [125_000u64, 1 << 33] {
            let tbf = Tbf { rate, buffer: 1234, limit: 5678, burst: Some(99) };
            let mut payload = Vec::new();
            for (kind, value) in tbf.to_attributes() {
                let len = 4 + value.len();
                payload.extend_from_slice(&(len as u16).to_ne_bytes());
                payload.extend_from_slice(&kind.to_ne_bytes());
                payload.extend_from_slice(&value);
                payload.resize(payload.len().next_multiple_of(4), 0);
            }
            assert_eq!(Tbf::from_options(&payload), Some(Tbf { burst: None, ..tbf }));
        }
    }
}
