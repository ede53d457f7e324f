//! The SSRF guard: which addresses a webhook may be sent to. Checked on the address a name
//! resolves to, at connect time, so a DNS answer cannot smuggle a request to the metadata
//! service or the private network; an operator may allow CIDRs (local dev allows loopback).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Refuses loopback, private, link-local, unique-local, CGNAT, unspecified, multicast,
/// broadcast and other special-purpose addresses unless an allowed CIDR contains them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SsrfGuard {
    allow: Vec<IpNet>,
}

/// Why an address was refused; found again in reqwest's error chain to report `Blocked`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{addr} is a {reason} address and no allowed CIDR contains it")]
pub struct BlockedAddress {
    pub addr: IpAddr,
    pub reason: &'static str,
}

impl SsrfGuard {
    pub fn new(allow: Vec<IpNet>) -> Self {
        Self { allow }
    }

    pub fn allowed_cidrs(&self) -> &[IpNet] {
        &self.allow
    }

    /// `Ok` when a webhook may go to `addr`.
    pub fn check(&self, addr: IpAddr) -> Result<(), BlockedAddress> {
        // An IPv4 address written as IPv6 (::ffff:10.0.0.1) reaches the IPv4 host.
        let embedded = match addr {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let allowed = |a: IpAddr| self.allow.iter().any(|net| net.contains(&a));
        if allowed(addr) || embedded.is_some_and(allowed) {
            return Ok(());
        }
        let reason = match (addr, embedded) {
            (_, Some(IpAddr::V4(v4))) => v4_reason(v4),
            (IpAddr::V4(v4), _) => v4_reason(v4),
            (IpAddr::V6(v6), _) => v6_reason(v6),
        };
        match reason {
            Some(reason) => Err(BlockedAddress { addr, reason }),
            None => Ok(()),
        }
    }

    pub fn is_allowed(&self, addr: IpAddr) -> bool {
        self.check(addr).is_ok()
    }
}

/// The IPv4 address inside an IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d) or
/// NAT64 (64:ff9b::a.b.c.d) IPv6 address.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let compatible = s[..6] == [0; 6] && !v6.is_unspecified() && !v6.is_loopback();
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (compatible || nat64).then_some(tail)
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip.is_unspecified() || a == 0 => "unspecified (0.0.0.0/8)",
        _ if ip.is_loopback() => "loopback",
        (10, ..) | (192, 168, _) => "private",
        (172, b, _) if (16..32).contains(&b) => "private",
        _ if ip.is_link_local() => "link-local",
        (100, b, _) if (64..128).contains(&b) => "shared (CGNAT 100.64.0.0/10)",
        _ if ip.is_broadcast() => "broadcast",
        _ if ip.is_multicast() => "multicast",
        _ if a >= 240 => "reserved",
        (192, 0, 0) => "IETF protocol (192.0.0.0/24)",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, b, _) if b == 18 || b == 19 => "benchmarking",
        _ => return None,
    })
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    Some(match s[0] {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        x if x & 0xffc0 == 0xfe80 => "link-local",
        x if x & 0xffc0 == 0xfec0 => "site-local",
        x if x & 0xfe00 == 0xfc00 => "unique-local",
        x if x & 0xff00 == 0xff00 => "multicast",
        0x2001 if s[1] == 0x0db8 => "documentation",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn given_no_allow_list_when_checking_special_addresses_then_every_one_is_blocked() {
        let guard = SsrfGuard::default();
        for a in [
            "127.0.0.1",
            "127.8.9.10",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2001:db8::1",
        ] {
            assert!(guard.check(ip(a)).is_err(), "{a} should be blocked");
        }
    }

    #[test]
    fn given_no_allow_list_when_checking_public_addresses_then_they_pass() {
        let guard = SsrfGuard::default();
        for a in [
            "93.184.216.34",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(guard.check(ip(a)).is_ok(), "{a} should be allowed");
        }
    }

    #[test]
    fn given_a_blocked_address_then_the_error_names_the_address_and_why() {
        let err = SsrfGuard::default().check(ip("169.254.169.254")).unwrap_err();
        assert_eq!(err.reason, "link-local");
        assert!(err.to_string().contains("169.254.169.254"), "{err}");
        assert_eq!(
            SsrfGuard::default().check(ip("10.0.0.1")).unwrap_err().reason,
            "private"
        );
    }

    #[test]
    fn given_an_allowed_cidr_then_addresses_inside_it_pass_and_others_stay_blocked() {
        let guard = SsrfGuard::new(vec![net("10.0.0.0/24"), net("127.0.0.1/32")]);
        assert!(guard.check(ip("10.0.0.1")).is_ok());
        assert!(
            guard.check(ip("::ffff:10.0.0.1")).is_ok(),
            "the mapped form of an allowed address"
        );
        assert!(guard.check(ip("127.0.0.1")).is_ok());
        assert!(guard.check(ip("10.0.1.1")).is_err());
        assert!(guard.check(ip("127.0.0.2")).is_err());
        assert!(guard.check(ip("169.254.169.254")).is_err());
    }
}
