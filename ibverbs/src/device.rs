//! Devices and contexts: the list of roced instances to attach to, `ibv_open_device` (an
//! attachment), and the queries of the device, its port and its GID table.

use crate::sys::*;
use crate::{Fail, Res, int_call, minus_one_call, ptr_call, put_str};
use std::ffi::{c_char, c_int, c_void};
use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::sync::Mutex;
use verbs::client::Context;

/// Where sockets are looked for without `FERROCE_SOCKET`.
const SOCKET_DIR: &str = "/run/ferroce";

/// A device: a roced attach socket. Devices live as long as the process (a context keeps
/// pointing at its device after the list is freed, as libibverbs' do).
#[repr(C)]
pub(crate) struct Dev {
    pub(crate) dev: ibv_device,
    pub(crate) socket: PathBuf,
    /// The node GUID, in network order (from port 0's MAC, as rxe makes it).
    guid: u64,
}

static DEVICES: Mutex<Vec<&'static Dev>> = Mutex::new(Vec::new());

/// The interface identifier rxe makes of a MAC address (modified EUI-64), as a u64 in network
/// order.
fn guid_of(mac: [u8; 6]) -> u64 {
    u64::from_ne_bytes([
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

fn candidates() -> Vec<PathBuf> {
    if let Ok(v) = std::env::var("FERROCE_SOCKET") {
        return v
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
    }
    use std::os::unix::fs::FileTypeExt;
    let mut v: Vec<PathBuf> = std::fs::read_dir(SOCKET_DIR)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

pub(crate) fn enumerate() -> Vec<&'static Dev> {
    let mut known = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    for path in candidates() {
        // A socket nobody answers on (a roced that went) is no device.
        let Ok(c) = Context::attach(&path) else {
            continue;
        };
        let name = format!("ferroce{}", out.len());
        let d = match known.iter().find(|d| d.socket == path) {
            Some(d) => *d,
            None => {
                // SAFETY: ibv_device is plain C data; all zeroes is a valid value.
                let mut dev: ibv_device = unsafe { core::mem::zeroed() };
                dev.node_type = ibv_node_type::IBV_NODE_CA;
                dev.transport_type = ibv_transport_type::IBV_TRANSPORT_IB;
                put_str(&mut dev.name, &name);
                put_str(&mut dev.dev_name, "uverbs-ferroce");
                put_str(&mut dev.dev_path, &path.to_string_lossy());
                put_str(
                    &mut dev.ibdev_path,
                    &format!("/sys/class/infiniband/{name}"),
                );
                let d: &'static Dev = Box::leak(Box::new(Dev {
                    dev,
                    socket: path.clone(),
                    guid: guid_of(c.mac),
                }));
                known.push(d);
                d
            }
        };
        out.push(d);
    }
    out
}

/// `ibv_get_device_list`: a NULL-terminated array (malloc'd; `ibv_free_device_list` frees it).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    ptr_call("ibv_get_device_list", || {
        let devs = enumerate();
        // SAFETY: malloc of n + 1 pointers; checked for NULL.
        let a = unsafe { libc::malloc((devs.len() + 1) * size_of::<*mut ibv_device>()) }
            as *mut *mut ibv_device;
        if a.is_null() {
            return Err(Fail::new(libc::ENOMEM, "out of memory"));
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: inside the array.
            unsafe { *a.add(i) = &d.dev as *const ibv_device as *mut ibv_device };
        }
        // SAFETY: the last slot.
        unsafe { *a.add(devs.len()) = core::ptr::null_mut() };
        if !num.is_null() {
            // SAFETY: the caller's int.
            unsafe { *num = devs.len() as c_int };
        }
        Ok(a)
    })
}

/// `ibv_free_device_list`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the array ibv_get_device_list malloc'd (or NULL).
    unsafe { libc::free(list.cast()) };
}

fn dev<'a>(d: *mut ibv_device) -> Res<&'a Dev> {
    if d.is_null() {
        return Err(Fail::inval("no device"));
    }
    // SAFETY: every ibv_device handed out is the first field of a leaked Dev.
    Ok(unsafe { &*(d as *const Dev) })
}

/// `ibv_get_device_name`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_name(d: *mut ibv_device) -> *const c_char {
    match dev(d) {
        Ok(d) => d.dev.name.as_ptr(),
        Err(_) => core::ptr::null(),
    }
}

/// `ibv_get_device_guid`: the node GUID in network order.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_guid(d: *mut ibv_device) -> u64 {
    dev(d).map_or(0, |d| d.guid)
}

/// An open device: an attachment to roced. `vctx.context` is what the program holds.
#[repr(C)]
pub(crate) struct Ctx {
    pub(crate) vctx: verbs_context,
    pub(crate) conn: Mutex<Context>,
    pub(crate) gids: Vec<[u8; 16]>,
    pub(crate) mtu: u32,
    pub(crate) guid: u64,
    /// The context's QPs and CQs as asynchronous events name them (QP number, the CQ's number
    /// in the session), at the address of their `ibv_qp` / `ibv_cq`.
    pub(crate) objects: Mutex<Objects>,
}

/// What asynchronous events may name.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    pub(crate) qps: std::collections::HashMap<u32, usize>,
    pub(crate) cqs: std::collections::HashMap<u32, usize>,
    /// roced has gone and `IBV_EVENT_DEVICE_FATAL` was reported.
    lost: bool,
}

/// `__VERBS_ABI_IS_EXTENDED`: what `abi_compat` holds when the context is a `verbs_context`.
const ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// The context `c` of ours.
pub(crate) fn ctx<'a>(c: *mut ibv_context) -> Res<&'a Ctx> {
    if c.is_null() {
        return Err(Fail::inval("no context"));
    }
    let at = core::mem::offset_of!(verbs_context, context);
    // SAFETY: every ibv_context handed out is the `context` field of the `verbs_context` that
    // begins a live Ctx (until ibv_close_device).
    Ok(unsafe { &*((c as *mut u8).sub(at) as *const Ctx) })
}

impl Ctx {
    /// A control verb on the attach socket (one at a time: it is a request and a reply).
    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&Context) -> Result<T, verbs::client::ClientError>,
    ) -> Res<T> {
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        Ok(f(&c)?)
    }

    pub(crate) fn objects(&self) -> std::sync::MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn ibv(&self) -> *mut ibv_context {
        &self.vctx.context as *const ibv_context as *mut ibv_context
    }
}

/// `ibv_open_device`: attaches to the device's roced.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_open_device(d: *mut ibv_device) -> *mut ibv_context {
    ptr_call("ibv_open_device", || {
        let d = dev(d)?;
        let c = Context::attach(&d.socket).map_err(|e| {
            Fail::new(
                libc::ENODEV,
                format!("cannot attach to roced at {}: {e}", d.socket.display()),
            )
        })?;
        let gids = c
            .gids
            .iter()
            .map(|g| g.parse::<Ipv6Addr>().map_or([0; 16], |a| a.octets()))
            .collect();
        let (mtu, guid) = (c.mtu, guid_of(c.mac));
        let async_fd = c
            .async_fd()
            .map_or(-1, |f| std::os::fd::AsRawFd::as_raw_fd(&f));
        let mut x = Box::new(Ctx {
            // SAFETY: verbs_context is C data of pointers, integers and options of function
            // pointers; all zeroes is a valid value (NULL, 0, None; an unlocked mutex).
            vctx: unsafe { core::mem::zeroed() },
            conn: Mutex::new(c),
            gids,
            mtu,
            guid,
            objects: Mutex::default(),
        });
        let v = &mut x.vctx;
        v.sz = size_of::<verbs_context>();
        v.query_port = Some(query_port_ex);
        v.query_device_ex = Some(query_device_ex);
        crate::qp::fill_ops(v);
        crate::cq::fill_ops(v);
        let c = &mut v.context;
        c.device = &d.dev as *const ibv_device as *mut ibv_device;
        c.cmd_fd = -1;
        c.async_fd = async_fd;
        c.num_comp_vectors = 1;
        c.abi_compat = ABI_IS_EXTENDED;
        let x = Box::leak(x);
        Ok(x.ibv())
    })
}

/// `ibv_close_device`: detaches (roced destroys what the program left).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_close_device(c: *mut ibv_context) -> c_int {
    int_call("ibv_close_device", || {
        let x = ctx(c)? as *const Ctx as *mut Ctx;
        // SAFETY: the Ctx ibv_open_device leaked; the program gives it back once.
        drop(unsafe { Box::from_raw(x) });
        Ok(())
    })
}

fn device_attr(x: &Ctx, a: &mut ibv_device_attr) {
    // SAFETY: plain C data.
    *a = unsafe { core::mem::zeroed() };
    put_str(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
    a.node_guid = x.guid;
    a.sys_image_guid = x.guid;
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 0xffff_f000;
    a.vendor_id = 0xffffff;
    a.max_qp = 1 << 16;
    a.max_qp_wr = 1 << 15;
    a.device_cap_flags = ibv_device_cap_flags::IBV_DEVICE_RC_RNR_NAK_GEN
        | ibv_device_cap_flags::IBV_DEVICE_SHUTDOWN_PORT
        | ibv_device_cap_flags::IBV_DEVICE_SYS_IMAGE_GUID;
    a.max_sge = verbs::abi::MAX_SGE as c_int;
    a.max_sge_rd = verbs::abi::MAX_SGE as c_int;
    a.max_cq = 1 << 16;
    a.max_cqe = 1 << 15;
    a.max_mr = 1 << 16;
    a.max_pd = 1 << 16;
    a.max_qp_rd_atom = verbs::abi::MAX_RD_ATOMIC.into();
    a.max_res_rd_atom = c_int::from(verbs::abi::MAX_RD_ATOMIC) << 16;
    a.max_qp_init_rd_atom = verbs::abi::MAX_RD_ATOMIC.into();
    a.atomic_cap = ibv_atomic_cap::IBV_ATOMIC_HCA;
    a.max_ah = 1 << 16;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
}

/// `ibv_query_device`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_device(c: *mut ibv_context, a: *mut ibv_device_attr) -> c_int {
    int_call("ibv_query_device", || {
        let x = ctx(c)?;
        // SAFETY: the caller's structure.
        let a = unsafe { a.as_mut() }.ok_or_else(|| Fail::inval("no attributes"))?;
        device_attr(x, a);
        Ok(())
    })
}

/// `ibv_query_device_ex` (through the context): the classic attributes, nothing extended.
unsafe extern "C" fn query_device_ex(
    c: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    a: *mut ibv_device_attr_ex,
    size: usize,
) -> c_int {
    int_call("ibv_query_device_ex", || {
        let x = ctx(c)?;
        if a.is_null() || size < size_of::<ibv_device_attr>() {
            return Err(Fail::inval("attributes too small"));
        }
        // SAFETY: the caller's structure of `size` bytes; zeroed to what we know of it.
        unsafe {
            core::ptr::write_bytes(a.cast::<u8>(), 0, size.min(size_of::<ibv_device_attr_ex>()))
        };
        // SAFETY: as above; `orig_attr` is its first field.
        device_attr(x, unsafe { &mut (*a).orig_attr });
        Ok(())
    })
}

/// The largest IB MTU a port of `mtu` bytes carries, after the headers (as rxe reckons, 80
/// bytes for them).
pub(crate) fn active_mtu(mtu: u32) -> ibv_mtu::Type {
    match mtu.saturating_sub(80) {
        4096.. => ibv_mtu::IBV_MTU_4096,
        2048.. => ibv_mtu::IBV_MTU_2048,
        1024.. => ibv_mtu::IBV_MTU_1024,
        512.. => ibv_mtu::IBV_MTU_512,
        _ => ibv_mtu::IBV_MTU_256,
    }
}

fn port_attr(x: &Ctx, port: u8) -> Res<ibv_port_attr> {
    if port != 1 {
        return Err(Fail::inval(format!("port {port}: the device has port 1")));
    }
    // SAFETY: plain C data.
    let mut p: ibv_port_attr = unsafe { core::mem::zeroed() };
    p.state = ibv_port_state::IBV_PORT_ACTIVE;
    p.max_mtu = ibv_mtu::IBV_MTU_4096;
    p.active_mtu = active_mtu(x.mtu);
    p.gid_tbl_len = x.gids.len() as c_int;
    p.port_cap_flags = ibv_port_cap_flags::IBV_PORT_CM_SUP;
    p.max_msg_sz = 1 << 31;
    p.pkey_tbl_len = 1;
    p.max_vl_num = 1;
    p.active_width = 1;
    p.active_speed = 1;
    p.phys_state = 5;
    p.link_layer = IBV_LINK_LAYER_ETHERNET as u8;
    Ok(p)
}

/// `ibv_query_port` through the context (the inline `ibv_query_port` of the header calls it).
unsafe extern "C" fn query_port_ex(
    c: *mut ibv_context,
    port: u8,
    a: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    int_call("ibv_query_port", || {
        let p = port_attr(ctx(c)?, port)?;
        if a.is_null() {
            return Err(Fail::inval("no attributes"));
        }
        let n = len.min(size_of::<ibv_port_attr>());
        // SAFETY: the caller's structure of `len` bytes.
        unsafe {
            core::ptr::copy_nonoverlapping((&p as *const ibv_port_attr).cast::<u8>(), a.cast(), n)
        };
        Ok(())
    })
}

/// `ibv_query_port`, the exported one (for programs built before the inline): the structure
/// as it was then, the fields up to `link_layer`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_port(c: *mut ibv_context, port: u8, a: *mut ibv_port_attr) -> c_int {
    // SAFETY: as in query_port_ex, for the old structure's length.
    unsafe { query_port_ex(c, port, a, core::mem::offset_of!(ibv_port_attr, flags)) }
}

fn gid(x: &Ctx, port: u8, index: u32) -> Res<[u8; 16]> {
    if port != 1 {
        return Err(Fail::inval(format!("port {port}: the device has port 1")));
    }
    x.gids
        .get(index as usize)
        .copied()
        .ok_or_else(|| Fail::new(libc::ENODATA, format!("no GID at index {index}")))
}

/// `ibv_query_gid`: 0, or -1 with errno.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    g: *mut ibv_gid,
) -> c_int {
    minus_one_call("ibv_query_gid", || {
        let v = gid(ctx(c)?, port, index as u32)?;
        // SAFETY: the caller's 16 bytes.
        unsafe { g.as_mut() }
            .ok_or_else(|| Fail::inval("no GID"))?
            .raw = v;
        Ok(())
    })
}

/// `ibv_query_gid_ex` (the inline calls this): every GID is a RoCE v2 one.
#[unsafe(no_mangle)]
pub extern "C" fn _ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    e: *mut ibv_gid_entry,
    _flags: u32,
    size: usize,
) -> c_int {
    int_call("ibv_query_gid_ex", || {
        let x = ctx(c)?;
        let v = gid(x, port.min(255) as u8, index).map_err(|f| Fail::new(libc::ENODATA, f.msg))?;
        if e.is_null() || size < size_of::<ibv_gid_entry>() {
            return Err(Fail::inval("entry too small"));
        }
        // SAFETY: the caller's entry.
        let e = unsafe { &mut *e };
        e.gid.raw = v;
        e.gid_index = index;
        e.port_num = port;
        e.gid_type = ibv_gid_type::IBV_GID_TYPE_ROCE_V2;
        e.ndev_ifindex = 0;
        Ok(())
    })
}

/// `ibv_query_gid_type` (libibverbs' private export that `ibv_devinfo` uses): RoCE v2 (1).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: u32,
    t: *mut u32,
) -> c_int {
    int_call("ibv_query_gid_type", || {
        gid(ctx(c)?, port, index)?;
        // SAFETY: the caller's enum.
        *unsafe { t.as_mut() }.ok_or_else(|| Fail::inval("no type"))? = 1;
        Ok(())
    })
}

/// `ibv_read_sysfs_file`: there is no sysfs for ferroce's devices; -1, as for a missing file.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    -1
}

/// `ibv_get_async_event`: the next event roced sent on the context's `async_fd` (blocking
/// unless the program made it non-blocking: then -1 with EAGAIN when none waits, as
/// libibverbs does). Events of QPs and CQs destroyed since are skipped. When roced has gone,
/// `IBV_EVENT_DEVICE_FATAL` once, then -1 with EIO.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_async_event(c: *mut ibv_context, e: *mut ibv_async_event) -> c_int {
    let mut waiting = false;
    let r = minus_one_call("ibv_get_async_event", || {
        let x = ctx(c)?;
        // SAFETY: the caller's event to fill.
        let e = unsafe { e.as_mut() }.ok_or_else(|| Fail::inval("no event"))?;
        let fd = x.vctx.context.async_fd;
        if fd < 0 {
            return Err(Fail::unsupported("asynchronous events from this roced"));
        }
        loop {
            if x.objects().lost {
                return Err(Fail::new(libc::EIO, "the device is lost: roced has gone"));
            }
            // SAFETY: the context's event socket, open while the context is.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            use verbs::event::{EventKind, Read};
            let ev = match verbs::event::read(fd, None) {
                Ok(Read::Event(ev)) => ev,
                Ok(Read::Gone) => {
                    x.objects().lost = true;
                    e.element.port_num = 0;
                    e.event_type = ibv_event_type::IBV_EVENT_DEVICE_FATAL;
                    return Ok(());
                }
                Ok(Read::Nothing) => {
                    waiting = true;
                    return Ok(());
                }
                Err(err) => {
                    return Err(Fail::new(
                        err.raw_os_error().unwrap_or(libc::EIO),
                        err.to_string(),
                    ));
                }
            };
            let o = x.objects();
            let (kind, found) = match ev.kind {
                EventKind::QpFatal => (
                    ibv_event_type::IBV_EVENT_QP_FATAL,
                    o.qps
                        .get(&ev.element)
                        .map(|&q| e.element.qp = q as *mut ibv_qp),
                ),
                EventKind::CqErr => (
                    ibv_event_type::IBV_EVENT_CQ_ERR,
                    o.cqs
                        .get(&ev.element)
                        .map(|&q| e.element.cq = q as *mut ibv_cq),
                ),
                EventKind::PortActive | EventKind::PortErr => {
                    e.element.port_num = ev.element as c_int;
                    let k = if ev.kind == EventKind::PortActive {
                        ibv_event_type::IBV_EVENT_PORT_ACTIVE
                    } else {
                        ibv_event_type::IBV_EVENT_PORT_ERR
                    };
                    (k, Some(()))
                }
                // roced does not send it (the program's side makes it, above).
                EventKind::DeviceFatal => continue,
            };
            if found.is_some() {
                e.event_type = kind;
                return Ok(());
            }
        }
    });
    if waiting {
        // A non-blocking async_fd with nothing waiting: no message, as libibverbs gives none.
        crate::set_errno(libc::EAGAIN);
        return -1;
    }
    r
}

/// `ibv_ack_async_event`: nothing to release (an object destroyed after its event was read is
/// simply not named by later ones).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_ack_async_event(_e: *mut ibv_async_event) {}
