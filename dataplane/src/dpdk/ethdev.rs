//! Ethernet ports: configuration with offload negotiation, queues, link, stats and xstats.

use super::{Error, Mbuf, Mempool, strerror};
use crate::port::{BURST_SIZE, Burst, MacAddr, PortCaps, PortId, PortInfo, PortQueue, QueueId};
use dpdk_sys as sys;
use std::ffi::{CStr, CString};
use std::sync::Arc;

/// How to bring up one port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSetup {
    /// The device's DPDK name: the vdev's name (`net_memif0`) or the PCI address.
    pub device: String,
    /// The appliance's index for this port.
    pub index: PortId,
    /// Rx and tx queues: one per worker lcore.
    pub queues: u16,
    /// IP MTU.
    pub mtu: u16,
    /// Descriptors per rx queue.
    pub rx_desc: u16,
    /// Descriptors per tx queue.
    pub tx_desc: u16,
}

/// Link state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkStatus {
    /// Link is up.
    pub up: bool,
    /// Speed in Mb/s (0 if unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

/// Basic port statistics (DPDK's `rte_eth_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received.
    pub ipackets: u64,
    /// Frames sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Frames the NIC dropped for lack of rx descriptors.
    pub imissed: u64,
    /// Receive errors.
    pub ierrors: u64,
    /// Transmit errors.
    pub oerrors: u64,
    /// Receive failures for lack of mbufs.
    pub rx_nombuf: u64,
}

/// A started DPDK port. Stopped and closed on drop.
#[derive(Debug)]
pub struct DpdkPort {
    id: u16,
    name: String,
    info: PortInfo,
    queues: u16,
    driver: String,
    pool: Arc<Mempool>,
    /// The highest count of each statistic read so far (see [`DpdkPort::stats`]).
    seen: std::sync::Mutex<PortStats>,
}

fn check(rc: i32, port: &str, op: &'static str) -> Result<(), Error> {
    if rc < 0 {
        Err(Error::Port {
            port: port.into(),
            op,
            reason: strerror(rc),
        })
    } else {
        Ok(())
    }
}

/// Fills the port's redirection table with entry `j` -> queue `j % queues` (what
/// `port::rss::steer_sport` assumes); false if the port has no table or refused it.
fn set_reta(id: u16, reta_size: u16, queues: u16) -> bool {
    let group = sys::RTE_ETH_RETA_GROUP_SIZE as usize;
    let size = reta_size as usize;
    if size == 0 || !size.is_multiple_of(group) || size > 512 {
        return false;
    }
    let mut conf = [sys::rte_eth_rss_reta_entry64::default(); 512 / 64];
    for (g, e) in conf.iter_mut().take(size / group).enumerate() {
        e.mask = u64::MAX;
        for (k, r) in e.reta.iter_mut().enumerate() {
            *r = ((g * group + k) % queues as usize) as u16;
        }
    }
    // SAFETY: `conf` holds size / 64 initialised groups, as the call reads.
    unsafe { sys::rte_eth_dev_rss_reta_update(id, conf.as_mut_ptr(), reta_size) == 0 }
}

/// The MTU of the kernel network interface with index `if_index`, if there is one.
fn kernel_mtu(if_index: u32) -> Option<u16> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer holds IF_NAMESIZE bytes, as if_indextoname writes at most.
    let p = unsafe { libc::if_indextoname(if_index, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    let ifname = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl DpdkPort {
    /// Configures and starts a port: queues, MTU, checksum offloads where the device has them,
    /// RSS where it has it and more than one queue is used.
    pub fn start(setup: &PortSetup, pool: Arc<Mempool>) -> Result<DpdkPort, Error> {
        let (port, started) = Self::open(setup, pool)?;
        started.map(|()| port)
    }

    /// As [`DpdkPort::start`], but a port that is configured and does not start yet (a memif
    /// client whose server is not there) is returned stopped, with why: its owner starts it
    /// later with [`DpdkPort::restart`], and no lcore may poll it until then.
    pub fn start_or_stopped(
        setup: &PortSetup,
        pool: Arc<Mempool>,
    ) -> Result<(DpdkPort, Result<(), Error>), Error> {
        Self::open(setup, pool)
    }

    /// Configures a port and tries to start it.
    fn open(setup: &PortSetup, pool: Arc<Mempool>) -> Result<(DpdkPort, Result<(), Error>), Error> {
        let name = setup.device.clone();
        let cname = CString::new(name.as_str()).map_err(|_| Error::NoSuchPort(name.clone()))?;
        let mut id = 0u16;
        // SAFETY: valid C string and out pointer.
        if unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut id) } != 0 {
            return Err(Error::NoSuchPort(name));
        }
        let mut di = sys::rte_eth_dev_info::default();
        // SAFETY: valid port id and out pointer.
        let rc = unsafe { sys::rte_eth_dev_info_get(id, &mut di) };
        check(rc, &name, "rte_eth_dev_info_get")?;
        if di.max_rx_queues < setup.queues || di.max_tx_queues < setup.queues {
            return Err(Error::TooFewQueues {
                port: name,
                max: di.max_rx_queues.min(di.max_tx_queues),
                want: setup.queues,
            });
        }
        // SAFETY: driver_name is a static C string owned by the driver.
        let driver = unsafe { CStr::from_ptr(di.driver_name) }
            .to_string_lossy()
            .into_owned();

        let mut conf = sys::rte_eth_conf::default();
        let mut caps = PortCaps::default();
        let tx_cksum = sys::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | sys::RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
        if di.tx_offload_capa & sys::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM != 0 {
            conf.txmode.offloads |= sys::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM;
            caps.tx_ipv4_cksum = true;
        }
        if di.tx_offload_capa & tx_cksum == tx_cksum {
            conf.txmode.offloads |= sys::RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
            caps.tx_udp_cksum = true;
        }
        if di.tx_offload_capa & sys::RTE_ETH_TX_OFFLOAD_MULTI_SEGS != 0 {
            conf.txmode.offloads |= sys::RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
            caps.tx_multi_seg = true;
        }
        if di.rx_offload_capa & sys::RTE_ETH_RX_OFFLOAD_IPV4_CKSUM != 0 {
            conf.rxmode.offloads |= sys::RTE_ETH_RX_OFFLOAD_IPV4_CKSUM;
            caps.rx_ipv4_cksum = true;
        }
        let rss_hf = di.flow_type_rss_offloads
            & (sys::RTE_ETH_RSS_IPV4
                | sys::RTE_ETH_RSS_NONFRAG_IPV4_UDP
                | sys::RTE_ETH_RSS_IPV6
                | sys::RTE_ETH_RSS_NONFRAG_IPV6_UDP);
        // ferroce's RSS key (see port::rss), where the port takes a key of its length; the
        // array outlives the configure call that copies it.
        let mut key = crate::port::rss::KEY;
        if setup.queues > 1 && rss_hf != 0 {
            conf.rxmode.mq_mode = sys::RTE_ETH_MQ_RX_RSS;
            conf.rx_adv_conf.rss_conf.rss_hf = rss_hf;
            if di.hash_key_size as usize == key.len() {
                conf.rx_adv_conf.rss_conf.rss_key = key.as_mut_ptr();
                conf.rx_adv_conf.rss_conf.rss_key_len = key.len() as u8;
            }
            caps.rss = true;
        }
        // SAFETY: valid port and configuration; the key pointer, if set, is live.
        let rc = unsafe { sys::rte_eth_dev_configure(id, setup.queues, setup.queues, &conf) };
        check(rc, &name, "rte_eth_dev_configure")?;
        if caps.rss {
            caps.rss_steering = !conf.rx_adv_conf.rss_conf.rss_key.is_null()
                && set_reta(id, di.reta_size, setup.queues);
        }
        // SAFETY: valid port; MTU change before start.
        let rc = unsafe { sys::rte_eth_dev_set_mtu(id, setup.mtu) };
        // net_af_packet tells ethdev it takes 1518-byte frames at most, so ethdev refuses a
        // larger MTU before the driver sees it; the frames it really carries are the kernel
        // interface's (and the PACKET_MMAP frame size, `framesz`). There the kernel's MTU
        // decides.
        let kernel_mtu = (rc == -(libc::EINVAL) && driver == "net_af_packet")
            .then(|| kernel_mtu(di.if_index))
            .flatten();
        if let Some(k) = kernel_mtu
            && k < setup.mtu
        {
            return Err(Error::Port {
                port: name,
                op: "rte_eth_dev_set_mtu",
                reason: format!(
                    "the kernel interface's MTU is {k}: raise it to {} (ip link set IFACE mtu {}) \
                     and give the vdev framesz={} or more",
                    setup.mtu,
                    setup.mtu,
                    (setup.mtu as usize + 14 + 32).next_multiple_of(16)
                ),
            });
        }
        let mtu_unsupported = rc == -(libc::ENOTSUP) || kernel_mtu.is_some();
        if rc < 0 && !mtu_unsupported {
            return Err(Error::Port {
                port: name,
                op: "rte_eth_dev_set_mtu",
                reason: strerror(rc),
            });
        }
        let (mut nrx, mut ntx) = (setup.rx_desc, setup.tx_desc);
        // SAFETY: valid port and out pointers.
        let rc = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut nrx, &mut ntx) };
        check(rc, &name, "rte_eth_dev_adjust_nb_rx_tx_desc")?;
        // SAFETY: valid port id.
        let socket = unsafe { sys::rte_eth_dev_socket_id(id) };
        let socket = if socket < 0 {
            sys::SOCKET_ID_ANY
        } else {
            socket
        } as u32;
        for q in 0..setup.queues {
            // SAFETY: valid port, queue index and mempool; null confs take the driver defaults.
            let rc = unsafe {
                sys::rte_eth_rx_queue_setup(id, q, nrx, socket, core::ptr::null(), pool.as_ptr())
            };
            check(rc, &name, "rte_eth_rx_queue_setup")?;
            let mut txconf = di.default_txconf;
            txconf.offloads = conf.txmode.offloads;
            // SAFETY: valid port, queue index and tx configuration.
            let rc = unsafe { sys::rte_eth_tx_queue_setup(id, q, ntx, socket, &txconf) };
            check(rc, &name, "rte_eth_tx_queue_setup")?;
        }
        // SAFETY: configured port.
        let rc = unsafe { sys::rte_eth_dev_start(id) };
        let started = check(rc, &name, "rte_eth_dev_start");
        // All-multicast so IPv6 neighbour discovery (solicited-node groups) reaches us. No
        // promiscuous mode: the appliance only wants frames for its own MAC, broadcast and
        // multicast. Drivers that cannot filter (memif, af_packet on veth) refuse harmlessly.
        // SAFETY: a configured port (started or not).
        unsafe {
            sys::rte_eth_allmulticast_enable(id);
        }
        let mut mac = sys::rte_ether_addr::default();
        // SAFETY: valid port and out pointer.
        let rc = unsafe { sys::rte_eth_macaddr_get(id, &mut mac) };
        check(rc, &name, "rte_eth_macaddr_get")?;
        // A PMD that manages no MTU (memif: its buffers are sized to the configured MTU
        // instead) carries what it is configured for; otherwise the port says what it took.
        let mut mtu = setup.mtu;
        if !mtu_unsupported {
            // SAFETY: valid port and out pointer.
            unsafe { sys::rte_eth_dev_get_mtu(id, &mut mtu) };
        }
        let info = PortInfo {
            id: setup.index,
            mac: MacAddr(mac.addr_bytes),
            mtu,
            caps,
        };
        super::extmem::port_opened(id, di.device);
        let port = DpdkPort {
            id,
            name,
            info,
            queues: setup.queues,
            driver,
            pool,
            seen: Default::default(),
        };
        Ok((port, started))
    }

    /// DPDK's port id.
    pub fn dpdk_id(&self) -> u16 {
        self.id
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The driver's name (`net_memif`, `net_af_packet`, ...).
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// What the loop needs to know.
    pub fn info(&self) -> PortInfo {
        self.info
    }

    /// Number of rx/tx queue pairs (one per worker lcore).
    pub fn queue_count(&self) -> u16 {
        self.queues
    }

    /// The handle for queue `q`, for the lcore that owns it.
    pub fn queue(&self, q: QueueId) -> DpdkQueue {
        let q = q.0;
        assert!(q < self.queues, "queue {q} of {}", self.queues);
        DpdkQueue {
            port: self.id,
            queue: q,
            pool: self.pool.clone(),
            info: self.info,
        }
    }

    /// Current link state.
    pub fn link(&self) -> LinkStatus {
        let mut l = sys::rte_eth_link::default();
        // SAFETY: valid port and out pointer.
        unsafe { sys::rte_eth_link_get_nowait(self.id, &mut l) };
        LinkStatus {
            up: l.link_status() != 0,
            speed_mbps: l.link_speed,
            full_duplex: l.link_duplex() != 0,
        }
    }

    /// Stops the port and starts it again, as a memif client must to connect anew: DPDK
    /// 22.11's memif client connects to its server only in `rte_eth_dev_start`, and never again
    /// by itself once the server has gone. An error leaves the port stopped (a memif server
    /// not there yet); try again later.
    ///
    /// No lcore may make a burst call on the port meanwhile, nor until this returns `Ok`:
    /// stopping swaps DPDK's fast-path functions for ones that must not be called (the caller
    /// detaches the port from its workers first, see `Command::DetachPort`).
    pub fn restart(&self) -> Result<(), Error> {
        // SAFETY: a started or stopped port of ours; no burst calls on it (see above).
        let rc = unsafe { sys::rte_eth_dev_stop(self.id) };
        check(rc, &self.name, "rte_eth_dev_stop")?;
        // SAFETY: a configured, stopped port.
        let rc = unsafe { sys::rte_eth_dev_start(self.id) };
        check(rc, &self.name, "rte_eth_dev_start")?;
        // SAFETY: started port (as at the first start).
        unsafe {
            sys::rte_eth_allmulticast_enable(self.id);
        }
        Ok(())
    }

    /// The mempool its receive queues take mbufs from.
    pub fn pool(&self) -> &Mempool {
        &self.pool
    }

    /// Basic statistics, each never lower than it was last read: DPDK 22.11's memif sums
    /// only the rings of the live connection, so while its link is down it reports 0 and
    /// its counts come back once it is connected again, which a scraper would take for two
    /// counter resets.
    pub fn stats(&self) -> PortStats {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: valid port and out pointer.
        unsafe { sys::rte_eth_stats_get(self.id, &mut s) };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let m = |a: &mut u64, b: u64| {
            *a = (*a).max(b);
            *a
        };
        *seen = PortStats {
            ipackets: m(&mut seen.ipackets, s.ipackets),
            opackets: m(&mut seen.opackets, s.opackets),
            ibytes: m(&mut seen.ibytes, s.ibytes),
            obytes: m(&mut seen.obytes, s.obytes),
            imissed: m(&mut seen.imissed, s.imissed),
            ierrors: m(&mut seen.ierrors, s.ierrors),
            oerrors: m(&mut seen.oerrors, s.oerrors),
            rx_nombuf: m(&mut seen.rx_nombuf, s.rx_nombuf),
        };
        *seen
    }

    /// Extended statistics, by the driver's names.
    pub fn xstats(&self) -> Vec<(String, u64)> {
        // SAFETY: a null array asks for the count.
        let n = unsafe { sys::rte_eth_xstats_get_names(self.id, core::ptr::null_mut(), 0) };
        if n <= 0 {
            return Vec::new();
        }
        let mut names = vec![sys::rte_eth_xstat_name::default(); n as usize];
        let mut vals = vec![sys::rte_eth_xstat::default(); n as usize];
        // SAFETY: arrays of the size we pass.
        let n1 = unsafe { sys::rte_eth_xstats_get_names(self.id, names.as_mut_ptr(), n as u32) };
        // SAFETY: as above.
        let n2 = unsafe { sys::rte_eth_xstats_get(self.id, vals.as_mut_ptr(), n as u32) };
        if n1 != n || n2 != n {
            return Vec::new();
        }
        vals.iter()
            .filter_map(|v| {
                let name = names.get(v.id as usize)?;
                // SAFETY: DPDK NUL-terminates the fixed-size name.
                let s = unsafe { CStr::from_ptr(name.name.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
                Some((s, v.value))
            })
            .collect()
    }
}

impl Drop for DpdkPort {
    fn drop(&mut self) {
        super::extmem::port_closed(self.id);
        // SAFETY: we started the port; workers using its queues have returned.
        unsafe {
            sys::rte_eth_dev_stop(self.id);
            sys::rte_eth_dev_close(self.id);
        }
    }
}

/// One rx/tx queue pair of a DPDK port, owned by one lcore.
#[derive(Debug)]
pub struct DpdkQueue {
    port: u16,
    queue: u16,
    pool: Arc<Mempool>,
    info: PortInfo,
}

impl PortQueue for DpdkQueue {
    type Buf = Mbuf;

    #[inline]
    fn rx_burst(&mut self, burst: &mut Burst<Mbuf>) -> usize {
        let len = burst.len();
        let free = (BURST_SIZE - len) as u16;
        // SAFETY: Mbuf is repr(transparent) over a non-null rte_mbuf pointer, so the spare
        // capacity of the burst is an array of `free` mbuf pointers for DPDK to fill; the ones
        // it fills become owned Mbufs when we extend the length.
        unsafe {
            let p = burst.as_mut_ptr().add(len) as *mut *mut sys::rte_mbuf;
            let n = sys::rte_eth_rx_burst(self.port, self.queue, p, free) as usize;
            burst.set_len(len + n);
            n
        }
    }

    #[inline]
    fn tx_burst(&mut self, burst: &mut Burst<Mbuf>) -> usize {
        let len = burst.len();
        if len == 0 {
            return 0;
        }
        // SAFETY: the burst is an array of `len` owned mbuf pointers (repr(transparent)). DPDK
        // takes ownership of the first `n`; we move the rest to the front without dropping them.
        unsafe {
            let p = burst.as_mut_ptr();
            let n = sys::rte_eth_tx_burst(
                self.port,
                self.queue,
                p as *mut *mut sys::rte_mbuf,
                len as u16,
            ) as usize;
            burst.set_len(0);
            core::ptr::copy(p.add(n), p, len - n);
            burst.set_len(len - n);
            n
        }
    }

    #[inline]
    fn alloc(&mut self) -> Option<Mbuf> {
        self.pool.alloc()
    }

    fn info(&self) -> &PortInfo {
        &self.info
    }
}
