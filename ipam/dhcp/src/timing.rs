//! When a held lease is renewed, rebound or given up (RFC 2131 §4.4.5), as pure functions of the time since
//! it was bound.

use crate::packet::ServerMessage;
use std::time::Duration;

/// The reference's default when the server names no lease time.
const DEFAULT_LEASE: u32 = 3600;
/// RFC 2131 §4.4.5: a retransmission waits half the time left, down to 60 s.
const MIN_RETRY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    pub renew: Duration,
    pub rebind: Duration,
    pub expire: Duration,
}

impl Times {
    /// T1 and T2 from the ACK, else 1/2 and 7/8 of the lease (RFC 2131 §4.4.5); kept in order.
    pub fn of(ack: &ServerMessage) -> Times {
        let lease = ack.lease_time.unwrap_or(DEFAULT_LEASE);
        let expire = Duration::from_secs(lease.into());
        let rebind = ack.rebinding_time.map_or(expire * 7 / 8, |s| Duration::from_secs(s.into())).min(expire);
        let renew = ack.renewal_time.map_or(expire / 2, |s| Duration::from_secs(s.into())).min(rebind);
        Times { renew, rebind, expire }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do for this long.
    Wait(Duration),
    /// RENEWING: a REQUEST unicast to the server that granted the lease.
    Renew,
    /// REBINDING: a REQUEST broadcast to any server.
    Rebind,
    /// The lease is gone.
    Expired,
}

pub fn next_action(elapsed: Duration, t: &Times) -> Action {
    if elapsed >= t.expire {
        Action::Expired
    } else if elapsed >= t.rebind {
        Action::Rebind
    } else if elapsed >= t.renew {
        Action::Renew
    } else {
        Action::Wait(t.renew - elapsed)
    }
}

/// After a renewal or rebinding got no answer: half the time left until `deadline` (T2, or the expiry), at
/// least 60 s, and never past the deadline itself.
pub fn retry_after(elapsed: Duration, deadline: Duration) -> Duration {
    let left = deadline.saturating_sub(elapsed);
    (left / 2).max(MIN_RETRY.min(left))
}

/// The time left until the state after `action` begins, for the retry of a failed exchange.
pub fn deadline_of(action: Action, t: &Times) -> Duration {
    match action {
        Action::Renew => t.rebind,
        _ => t.expire,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(lease: Option<u32>, t1: Option<u32>, t2: Option<u32>) -> ServerMessage {
        ServerMessage { lease_time: lease, renewal_time: t1, rebinding_time: t2, ..ServerMessage::empty_ack() }
    }

    const fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn times_from_the_ack_or_the_rfc_defaults() {
        assert_eq!(
            Times::of(&ack(Some(120), Some(40), Some(90))),
            Times { renew: s(40), rebind: s(90), expire: s(120) }
        );
        assert_eq!(Times::of(&ack(Some(800), None, None)), Times { renew: s(400), rebind: s(700), expire: s(800) });
        assert_eq!(Times::of(&ack(None, None, None)).expire, s(3600));
        // A T2 past the lease, a T1 past T2: clamped.
        assert_eq!(
            Times::of(&ack(Some(100), Some(200), Some(300))),
            Times { renew: s(100), rebind: s(100), expire: s(100) }
        );
    }

    #[test]
    fn actions_in_each_state() {
        let t = Times { renew: s(50), rebind: s(87), expire: s(100) };
        assert_eq!(next_action(s(0), &t), Action::Wait(s(50)));
        assert_eq!(next_action(s(49), &t), Action::Wait(s(1)));
        assert_eq!(next_action(s(50), &t), Action::Renew);
        assert_eq!(next_action(s(86), &t), Action::Renew);
        assert_eq!(next_action(s(87), &t), Action::Rebind);
        assert_eq!(next_action(s(100), &t), Action::Expired);
        assert_eq!(next_action(s(5000), &t), Action::Expired);
    }

    #[test]
    fn retries_wait_half_the_time_left_but_at_least_a_minute() {
        // A day's lease: renewing from T1 = 12 h, T2 = 21 h: half of 9 h.
        assert_eq!(retry_after(s(12 * 3600), s(21 * 3600)), s(9 * 1800));
        // Less than two minutes left: 60 s.
        assert_eq!(retry_after(s(1000), s(1100)), s(60));
        // Less than a minute left: until the deadline, not past it.
        assert_eq!(retry_after(s(1000), s(1030)), s(30));
        assert_eq!(retry_after(s(1000), s(900)), s(0));
        let t = Times { renew: s(50), rebind: s(87), expire: s(100) };
        assert_eq!(deadline_of(Action::Renew, &t), s(87));
        assert_eq!(deadline_of(Action::Rebind, &t), s(100));
    }
}
