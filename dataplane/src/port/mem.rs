//! In-memory ports: two queues joined like the two ends of a cable.
//!
//! Used by protocol tests and the simulator, so that everything above the port runs without
//! DPDK. Buffers are heap allocations: this backend is for tests, not for the fast path.

use super::{Burst, PortInfo, PortQueue};
use crate::buf::HeapBuf;
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};

/// One end of an in-memory link.
#[derive(Debug)]
pub struct MemQueue {
    info: PortInfo,
    rx: Receiver<HeapBuf>,
    tx: Sender<HeapBuf>,
}

/// Joins two ports back to back; each direction holds up to `depth` frames (beyond that frames
/// are refused, as a full tx ring refuses them).
pub fn link(a: PortInfo, b: PortInfo, depth: usize) -> (MemQueue, MemQueue) {
    let (tx_ab, rx_ab) = bounded(depth);
    let (tx_ba, rx_ba) = bounded(depth);
    (
        MemQueue {
            info: a,
            rx: rx_ba,
            tx: tx_ab,
        },
        MemQueue {
            info: b,
            rx: rx_ab,
            tx: tx_ba,
        },
    )
}

impl MemQueue {
    /// Sends one frame (a test harness's convenience). False if the link is full.
    pub fn send_frame(&mut self, frame: &[u8]) -> bool {
        self.tx.try_send(HeapBuf::from_slice(frame)).is_ok()
    }

    /// Receives one frame if any is waiting (a test harness's convenience).
    pub fn recv_frame(&mut self) -> Option<Vec<u8>> {
        self.rx
            .try_recv()
            .ok()
            .map(|b| crate::buf::PacketBuf::data(&b).to_vec())
    }

    /// Waits up to `timeout` for a frame (a test harness's convenience).
    pub fn recv_frame_timeout(&mut self, timeout: std::time::Duration) -> Option<Vec<u8>> {
        self.rx
            .recv_timeout(timeout)
            .ok()
            .map(|b| crate::buf::PacketBuf::data(&b).to_vec())
    }
}

impl PortQueue for MemQueue {
    type Buf = HeapBuf;

    fn rx_burst(&mut self, burst: &mut Burst<HeapBuf>) -> usize {
        let mut n = 0;
        while !burst.is_full() {
            match self.rx.try_recv() {
                Ok(b) => {
                    burst.push(b);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        n
    }

    fn tx_burst(&mut self, burst: &mut Burst<HeapBuf>) -> usize {
        let mut sent = 0;
        let mut it = core::mem::take(burst).into_iter();
        for b in it.by_ref() {
            match self.tx.try_send(b) {
                Ok(()) => sent += 1,
                Err(TrySendError::Full(b)) | Err(TrySendError::Disconnected(b)) => {
                    burst.push(b);
                    break;
                }
            }
        }
        burst.extend(it);
        sent
    }

    fn alloc(&mut self) -> Option<HeapBuf> {
        Some(HeapBuf::new())
    }

    fn info(&self) -> &PortInfo {
        &self.info
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::PacketBuf;

    fn info(i: u16) -> PortInfo {
        PortInfo::virtual_port(i, 1500)
    }

    #[test]
    fn frames_cross_and_full_links_keep_the_rest() {
        let (mut a, mut b) = link(info(0), info(1), 2);
        let mut burst = Burst::new();
        for i in 0..3u8 {
            burst.push(HeapBuf::from_slice(&[i; 60]));
        }
        assert_eq!(a.tx_burst(&mut burst), 2);
        assert_eq!(burst.len(), 1);
        assert_eq!(burst[0].data()[0], 2, "unsent frames stay in order");
        let mut rx = Burst::new();
        assert_eq!(b.rx_burst(&mut rx), 2);
        assert_eq!(rx[0].data()[0], 0);
        assert_eq!(rx[1].data()[0], 1);
    }
}
