//! Per-lcore counters: written only by the lcore that owns them, read by anyone.
//!
//! A single writer needs no atomic read-modify-write: [`Counter::add`] is a relaxed load and a
//! relaxed store, as cheap as a plain increment, and readers on other threads see a value that is
//! at most a few increments old.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A counter with one writer (its lcore) and any number of readers.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning lcore may call this.
    #[inline(always)]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    /// Adds one. Only the owning lcore may call this.
    #[inline(always)]
    pub fn inc(&self) {
        self.add(1);
    }
    /// Current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
    /// Sets a gauge. Only the owning lcore may call this.
    #[inline(always)]
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }
}

macro_rules! drop_reasons {
    ($($(#[$doc:meta])* $name:ident => $label:literal,)*) => {
        /// Why the data plane dropped a frame.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum DropReason { $($(#[$doc])* $name,)* }

        impl DropReason {
            /// Every reason, in counter order.
            pub const ALL: &'static [DropReason] = &[$(DropReason::$name,)*];
            /// Number of reasons.
            pub const COUNT: usize = Self::ALL.len();
            /// The reason's name in metrics and logs.
            pub const fn label(self) -> &'static str {
                match self { $(DropReason::$name => $label,)* }
            }
        }
    };
}

drop_reasons! {
    /// The port's tx ring was full.
    TxFull => "tx_full",
    /// No mbuf was free to build a frame.
    NoBuffer => "no_buffer",
    /// Truncated or malformed headers.
    Malformed => "malformed",
    /// Addressed to another MAC or IP address.
    NotForUs => "not_for_us",
    /// A checksum was wrong.
    BadChecksum => "bad_checksum",
    /// 802.1Q tag missing, unexpected, or for another VLAN.
    VlanMismatch => "vlan_mismatch",
    /// A protocol the appliance does not serve.
    UnsupportedProtocol => "unsupported_protocol",
    /// No route to the destination.
    NoRoute => "no_route",
    /// Too many frames already waiting for the same neighbour to resolve.
    HoldQueueFull => "hold_queue_full",
    /// The neighbour never answered.
    NeighborUnreachable => "neighbor_unreachable",
    /// IP fragments (RoCEv2 never fragments).
    Fragment => "fragment",
    /// Dropped while stopping.
    Shutdown => "shutdown",
    /// Sent to a port its lcore has left alone for a while (a memif client connecting again).
    PortDetached => "port_detached",
}

/// Counters of one lcore.
#[derive(Debug, Default)]
pub struct LcoreCounters {
    /// Frames received.
    pub rx_packets: Counter,
    /// Bytes received (frame lengths).
    pub rx_bytes: Counter,
    /// Frames the ports took for transmission.
    pub tx_packets: Counter,
    /// Bytes transmitted.
    pub tx_bytes: Counter,
    /// Loop iterations that received or sent something.
    pub busy_loops: Counter,
    /// Loop iterations that found nothing to do.
    pub idle_loops: Counter,
    /// ARP requests answered.
    pub arp_replies_sent: Counter,
    /// ARP requests sent to resolve a neighbour.
    pub arp_requests_sent: Counter,
    /// Neighbour solicitations answered.
    pub nd_adverts_sent: Counter,
    /// Neighbour solicitations sent to resolve a neighbour.
    pub nd_solicits_sent: Counter,
    /// ICMP and ICMPv6 echo requests answered.
    pub echo_replies_sent: Counter,
    /// Echo requests the appliance originated (ping).
    pub echo_requests_sent: Counter,
    /// Echo replies received for them.
    pub echo_replies_received: Counter,
    /// RoCEv2 (UDP 4791) frames received.
    pub roce_rx_packets: Counter,
    /// Commands taken from the control thread.
    pub commands: Counter,
    drops: [Counter; DropReason::COUNT],
}

impl LcoreCounters {
    /// Counts a drop.
    #[inline]
    pub fn count_drop(&self, reason: DropReason, n: u64) {
        self.drops[reason as usize].add(n);
    }

    /// Drops for one reason.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize].get()
    }

    /// A point-in-time copy with names, for metrics, logs and tests.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let mut v = vec![
            ("rx_packets", self.rx_packets.get()),
            ("rx_bytes", self.rx_bytes.get()),
            ("tx_packets", self.tx_packets.get()),
            ("tx_bytes", self.tx_bytes.get()),
            ("busy_loops", self.busy_loops.get()),
            ("idle_loops", self.idle_loops.get()),
            ("arp_replies_sent", self.arp_replies_sent.get()),
            ("arp_requests_sent", self.arp_requests_sent.get()),
            ("nd_adverts_sent", self.nd_adverts_sent.get()),
            ("nd_solicits_sent", self.nd_solicits_sent.get()),
            ("echo_replies_sent", self.echo_replies_sent.get()),
            ("echo_requests_sent", self.echo_requests_sent.get()),
            ("echo_replies_received", self.echo_replies_received.get()),
            ("roce_rx_packets", self.roce_rx_packets.get()),
            ("commands", self.commands.get()),
        ];
        for r in DropReason::ALL {
            v.push((r.label(), self.drops(*r)));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_and_snapshot_names_drops() {
        let c = LcoreCounters::default();
        c.rx_packets.add(3);
        c.count_drop(DropReason::NoRoute, 2);
        let s = c.snapshot();
        assert!(s.contains(&("rx_packets", 3)));
        assert!(s.contains(&("no_route", 2)));
        assert_eq!(c.drops(DropReason::TxFull), 0);
    }
}
