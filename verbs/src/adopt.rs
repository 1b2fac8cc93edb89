//! A process's own memory made shareable with roced in place, for `ibv_reg_mr` on whatever the
//! program allocated (malloc, memalign, its stack, its data).
//!
//! roced's lcores read and write registered memory directly, so it must be a mapping both
//! processes share. Ordinary memory is private to its process; [`adopt`] replaces the pages
//! under a range with shared ones holding the same bytes, as FreeFlow does: it makes a sealed
//! memfd as long as the range's whole pages, copies the pages' contents into it, and maps it over
//! them (`MAP_FIXED | MAP_SHARED`). The program sees the same bytes at the same addresses;
//! roced maps the same memfd. The pages stay shared after deregistration (the program may
//! still be using them; putting private pages back would need the same copy), so a later
//! registration of memory on them reuses them.
//!
//! What that costs the program, as with other software RDMA devices that remap:
//! - Regions may share pages (two malloc'd buffers, one page between them): pages adopted for
//!   an earlier region are taken as they are, and a range over pages of several adoptions is
//!   several runs of pages ([`Piece`]), which roced maps one after the other as one range.
//! - Bytes written by another thread of the program between the copy and the remap are lost
//!   (register memory before other threads use it, as verbs programs do).
//! - After `fork()`, parent and child share the pages instead of copying them on write
//!   (libibverbs' `ibv_fork_init` instead keeps them out of the child).
//! - Hugetlb memory (`MAP_HUGETLB`, a private mapping of a hugetlbfs file) is adopted whole huge
//!   pages at a time onto a hugetlb memfd, so it stays huge pages in the program and in roced
//!   ([`SharedMem::map_pieces`] places huge pieces on huge page boundaries); where the pool has
//!   no free huge pages for the copy, onto ordinary pages (same bytes and addresses).
//! - Memory that is not plain readable memory (unmapped, `PROT_NONE`, shared or device
//!   mappings) is refused with the reason.
//!
//! Which pages are shared is looked up in `/proc/self/smaps` on every call, not remembered: the
//! program may have unmapped adopted pages and mapped something else there since.

use crate::shm::{SharedMem, ShmError};
use rustix::fd::{AsFd, OwnedFd};
use rustix::mm::{MapFlags, ProtFlags};
use std::sync::Mutex;

/// Why memory could not be adopted.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// Shared memory could not be made.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// A system call failed.
    #[error("{call}: {source}")]
    Os {
        /// Which.
        call: &'static str,
        /// Its error.
        source: rustix::io::Errno,
    },
    /// Empty, or past the end of the address space.
    #[error("{len} bytes at {addr:#x} are not a range of memory")]
    BadRange {
        /// Start.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// Part of the range is not mapped, or not readable.
    #[error("{addr:#x}: not readable memory of this process")]
    NotMapped {
        /// The first byte that is not.
        addr: usize,
    },
    /// Part of the range is memory that cannot be remapped (hugetlb, a device, a shared file).
    #[error("{addr:#x}: {what} memory cannot be shared with roced (register ordinary memory)")]
    Unsupported {
        /// Where.
        addr: usize,
        /// What it is.
        what: String,
    },
}

fn os(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> AdoptError {
    move |source| AdoptError::Os { call, source }
}

/// One run of pages of an adopted range, in one memfd.
#[derive(Debug)]
pub struct Piece {
    /// The memfd (a duplicate: pass it to roced).
    pub fd: OwnedFd,
    /// Where the run starts in it (whole pages).
    pub offset: u64,
    /// Its bytes (whole pages).
    pub len: usize,
}

/// Adopted memory: the pages under the range, as runs in memfds that the process maps there,
/// in address order (more than one where the range spans pages adopted at different times);
/// mapped one after the other they are the range's pages, its first byte `offset` into them.
#[derive(Debug)]
pub struct Adopted {
    /// The runs.
    pub pieces: Vec<Piece>,
    /// Offset of the range's first byte in the first run.
    pub offset: usize,
    /// The range's length.
    pub len: usize,
}

/// Memory adopted so far: where its pages were put, and the memfd now under them.
#[derive(Debug)]
struct Backing {
    start: usize,
    fd: OwnedFd,
    ino: u64,
}

static ADOPTED: Mutex<Vec<Backing>> = Mutex::new(Vec::new());

/// One mapping of /proc/self/smaps: its maps line, and the size of its pages.
#[derive(Debug)]
struct Map {
    start: usize,
    end: usize,
    perms: [u8; 4],
    offset: usize,
    ino: u64,
    path: String,
    /// Bytes of its pages as the kernel maps them (KernelPageSize: a huge page size for
    /// hugetlb memory).
    page: usize,
}

fn maps() -> Result<Vec<Map>, AdoptError> {
    let text = std::fs::read_to_string("/proc/self/smaps").map_err(|e| AdoptError::Os {
        call: "read /proc/self/smaps",
        source: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
    })?;
    let mut v: Vec<Map> = Vec::new();
    for line in text.lines() {
        if let Some(kb) = line.strip_prefix("KernelPageSize:") {
            if let (Some(m), Some(Ok(n))) = (
                v.last_mut(),
                kb.split_ascii_whitespace().next().map(str::parse::<usize>),
            ) {
                m.page = n * 1024;
            }
            continue;
        }
        let mut f = line.split_ascii_whitespace();
        let (Some(range), Some(perms), Some(off), Some(_dev), Some(ino)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = f.collect::<Vec<_>>().join(" ");
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset), Ok(ino)) = (
            usize::from_str_radix(a, 16),
            usize::from_str_radix(b, 16),
            usize::from_str_radix(off, 16),
            ino.parse::<u64>(),
        ) else {
            continue;
        };
        let mut p = [b'-'; 4];
        for (d, s) in p.iter_mut().zip(perms.bytes()) {
            *d = s;
        }
        v.push(Map {
            start,
            end,
            perms: p,
            offset,
            ino,
            path,
            page: page_size(),
        });
    }
    Ok(v)
}

/// The adopted memory a mapping is, if it is.
fn backing_of<'a>(adopted: &'a [Backing], m: &Map) -> Option<&'a Backing> {
    adopted
        .iter()
        .find(|b| m.ino == b.ino && m.perms[3] == b's' && b.start + m.offset == m.start)
}

fn page_size() -> usize {
    rustix::param::page_size()
}

/// Makes the `len` bytes at `addr` shareable with roced in place (see the module doc): pages
/// adopted before are taken as they are, the others are adopted now.
///
/// # Safety
/// The range must be memory of this process that nothing else remaps while this runs; the
/// contents of its pages not adopted before are copied and the pages replaced, so no other
/// thread may write them meanwhile.
pub unsafe fn adopt(addr: usize, len: usize) -> Result<Adopted, AdoptError> {
    let page = page_size();
    let bad = || AdoptError::BadRange { addr, len };
    if len == 0 {
        return Err(bad());
    }
    let last = addr.checked_add(len).ok_or_else(bad)?;
    let start = addr & !(page - 1);
    let end = last.checked_next_multiple_of(page).ok_or_else(bad)?;
    let mut adopted = ADOPTED.lock().unwrap_or_else(|p| p.into_inner());
    let maps = maps()?;
    // Forget memory the process has unmapped (or replaced) since.
    adopted.retain(|b| {
        maps.iter()
            .any(|m| backing_of(core::slice::from_ref(b), m).is_some())
    });
    let mut pieces = Vec::new();
    // Where the first piece starts (below `start` when it is whole huge pages).
    let mut first = None;
    let mut at = start;
    while at < end {
        let m = maps
            .iter()
            .find(|m| m.start <= at && at < m.end)
            .ok_or(AdoptError::NotMapped { addr: at })?;
        if let Some(b) = backing_of(&adopted, m) {
            // Huge pages adopted as huge pages are taken whole (roced maps them as such).
            let from = at & !(m.page - 1);
            let to = end.next_multiple_of(m.page).min(m.end);
            first.get_or_insert(from);
            pieces.push(Piece {
                fd: dup(&b.fd)?,
                offset: (from - b.start) as u64,
                len: to - from,
            });
            at = to;
            continue;
        }
        // Pages not adopted yet, replaced now: the whole huge pages the range touches in a
        // hugetlb mapping, alone; other pages up to the next adopted or hugetlb ones (or the
        // range's end).
        let (from, to, writable, huge) = if m.page > page {
            check_plain(m, at)?;
            let from = (at & !(m.page - 1)).max(m.start);
            let to = end.next_multiple_of(m.page).min(m.end);
            (from, to, m.perms[1] == b'w', m.page)
        } else {
            let mut to = at;
            for m in maps.iter().filter(|m| m.end > at && m.start < end) {
                if m.start > to {
                    return Err(AdoptError::NotMapped { addr: to });
                }
                if backing_of(&adopted, m).is_some() || m.page > page {
                    break;
                }
                check_plain(m, m.start.max(at))?;
                to = m.end.min(end);
            }
            if to < end && !maps.iter().any(|m| m.start <= to && to < m.end) {
                return Err(AdoptError::NotMapped { addr: to });
            }
            let writable = maps
                .iter()
                .filter(|m| m.end > at && m.start < to)
                .all(|m| m.perms[1] == b'w');
            (at, to, writable, page)
        };
        let b = replace(from, to - from, writable, huge)?;
        first.get_or_insert(from);
        pieces.push(Piece {
            fd: dup(&b.fd)?,
            offset: 0,
            len: to - from,
        });
        adopted.push(b);
        at = to;
    }
    Ok(Adopted {
        pieces,
        offset: addr - first.unwrap_or(start),
        len,
    })
}

/// Private anonymous memory, the heap, the stack, and private file mappings (a program's data)
/// can be copied and replaced; shared mappings, unreadable ones and special ones cannot.
fn check_plain(m: &Map, at: usize) -> Result<(), AdoptError> {
    if m.perms[0] != b'r' {
        return Err(AdoptError::NotMapped { addr: at });
    }
    let plain = m.perms[3] == b'p'
        && (m.path.is_empty()
            || m.path == "[heap]"
            || m.path.starts_with("[stack")
            || m.path.starts_with('/'));
    if plain {
        return Ok(());
    }
    let what = if m.path.is_empty() {
        "shared anonymous".to_string()
    } else {
        format!("{} ({})", m.path, String::from_utf8_lossy(&m.perms))
    };
    Err(AdoptError::Unsupported { addr: at, what })
}

/// Replaces the `n` bytes of pages at `start` (pages of `page` bytes) with a new memfd holding
/// their bytes: of huge pages for huge pages, where the pool has them (else ordinary pages:
/// the same bytes at the same addresses, without the huge pages' reach in the TLB).
fn replace(start: usize, n: usize, writable: bool, page: usize) -> Result<Backing, AdoptError> {
    let huge = (page > page_size() && n.is_multiple_of(page) && start.is_multiple_of(page))
        .then(|| SharedMem::create_huge("ferroce-mr", n, page).ok())
        .flatten();
    let mem = match huge {
        Some(m) => m,
        None => SharedMem::create("ferroce-mr", n)?,
    };
    let prot = if writable {
        ProtFlags::READ | ProtFlags::WRITE
    } else {
        ProtFlags::READ
    };
    // The copy and the remap run on a thread of their own: the range may hold this thread's
    // stack (a buffer on it, or just the same pages), which this thread must not write between
    // the two; it waits in `join`, writing nothing.
    let (mem_ptr, fd_of) = (mem.as_ptr() as usize, mem.fd());
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: [start, start + n) is mapped and readable (checked by the caller) and
            // `mem` is a fresh mapping of `n` bytes elsewhere: the copy reads the program's
            // pages and writes only `mem`.
            unsafe { core::ptr::copy_nonoverlapping(start as *const u8, mem_ptr as *mut u8, n) };
            // SAFETY: replaces exactly those pages, which `adopt`'s caller gives us, with the
            // memfd that now holds their bytes.
            unsafe {
                rustix::mm::mmap(
                    start as *mut core::ffi::c_void,
                    n,
                    prot,
                    MapFlags::SHARED | MapFlags::FIXED,
                    fd_of,
                    0,
                )
            }
            .map(|_| ())
        })
        .join()
        .unwrap_or(Err(rustix::io::Errno::FAULT))
    })
    .map_err(os("mmap(MAP_FIXED)"))?;
    let fd = dup(mem.fd())?;
    let ino = rustix::fs::fstat(&fd).map_err(os("fstat"))?.st_ino;
    // `mem`'s own mapping (the copy's destination) goes; the one at `start` stays.
    drop(mem);
    Ok(Backing { start, fd, ino })
}

fn dup(fd: impl AsFd) -> Result<OwnedFd, AdoptError> {
    rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(os("dup"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(len: usize) -> *mut u8 {
        let l = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a non-zero layout.
        unsafe { std::alloc::alloc(l) }
    }

    /// What roced maps for an adopted range: its pieces one after the other.
    fn roced_view(a: &Adopted) -> SharedMem {
        let p: Vec<_> = a
            .pieces
            .iter()
            .map(|p| (p.fd.as_fd(), p.offset, p.len))
            .collect();
        SharedMem::map_pieces(&p).unwrap()
    }

    #[test]
    fn heap_memory_keeps_its_bytes_and_is_shared_with_another_mapping() {
        let len = 3 * 4096 + 100;
        // A page more than the buffer: every page the adopts below replace is this test's
        // alone. A page shared with another test thread's heap chunk could take that thread's
        // write between adopt's copy and its remap, and lose it.
        let p = alloc(len + 2 * 4096);
        // SAFETY: `p` has len + 4096 bytes.
        let buf = unsafe { core::slice::from_raw_parts_mut(p, len + 4096) };
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        // An unaligned range in the middle of a page.
        // SAFETY: our own buffer, no other thread.
        let a = unsafe { adopt(p as usize + 10, len) }.unwrap();
        assert_eq!((a.offset, a.pieces.len()), (10, 1));
        assert!(
            buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
            "bytes kept"
        );
        let other = roced_view(&a);
        assert_eq!(other.len(), 4 * 4096);
        // SAFETY: inside both mappings.
        unsafe {
            assert_eq!(*other.as_ptr().add(500), buf[500]);
            buf[600] = 0xee;
            assert_eq!(
                *other.as_ptr().add(600),
                0xee,
                "the process's write is seen"
            );
            *other.as_ptr().add(700) = 0xdd;
        }
        assert_eq!(buf[700], 0xdd, "roced's write is seen");
        // A range inside is the same memory, at its offset.
        // SAFETY: as above.
        let b = unsafe { adopt(p as usize + 5000, 100) }.unwrap();
        assert_eq!((b.offset, b.pieces.len()), (5000 - 4096, 1));
        assert_eq!(b.pieces[0].offset, 4096);
        // One sharing pages but reaching past them: those pages as they are, the rest new;
        // roced sees the whole range, and so does the earlier region's view.
        // SAFETY: as above.
        let c = unsafe { adopt(p as usize + 4096, len + 4096 - 4096) }.unwrap();
        assert_eq!(c.pieces.len(), 2, "{c:?}");
        assert_eq!((c.pieces[0].offset, c.pieces[0].len), (4096, 3 * 4096));
        let view = roced_view(&c);
        for i in [0usize, 5000, 3 * 4096 + 5, len - 1] {
            buf[4096 + i] = (i % 13) as u8 + 1;
            // SAFETY: inside the view.
            let seen = unsafe { *view.as_ptr().add(i) };
            assert_eq!(seen, (i % 13) as u8 + 1, "byte {i}");
        }
        // SAFETY: inside `other`, which shares the first three pages with `view`.
        let seen = unsafe { *other.as_ptr().add(4096 + 5000) };
        assert_eq!(seen, buf[4096 + 5000]);
    }

    #[test]
    fn hugetlb_memory_is_adopted_whole_huge_pages_at_a_time() {
        const HUGE: usize = 2 << 20;
        // SAFETY: a fresh private hugetlb mapping of ours (the pool is set up by
        // scripts/setup.sh, as DPDK needs it).
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                core::ptr::null_mut(),
                2 * HUGE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::HUGETLB,
            )
        }
        .expect("2 huge pages (scripts/setup.sh reserves the pool)") as *mut u8;
        // SAFETY: the mapping's 2 * HUGE bytes, ours alone.
        let buf = unsafe { core::slice::from_raw_parts_mut(p, 2 * HUGE) };
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i % 253) as u8;
        }
        // A range across the two huge pages, not aligned to anything: both are taken whole.
        let (at, len) = (HUGE - 5000, 9000);
        // SAFETY: our own mapping, no other thread.
        let a = unsafe { adopt(p as usize + at, len) }.unwrap();
        assert_eq!(a.offset, at, "{a:?}");
        assert_eq!(a.pieces.iter().map(|x| x.len).sum::<usize>(), 2 * HUGE);
        assert!(
            buf.iter().enumerate().all(|(i, &b)| b == (i % 253) as u8),
            "bytes kept"
        );
        // Still huge pages, in the program and in roced's view (placed on a huge boundary).
        let huge_at = |addr: usize| {
            maps()
                .unwrap()
                .iter()
                .find(|m| m.start <= addr && addr < m.end)
                .map(|m| m.page)
        };
        assert_eq!(huge_at(p as usize), Some(HUGE));
        assert_eq!(huge_at(p as usize + HUGE), Some(HUGE));
        let view = roced_view(&a);
        assert_eq!(view.as_ptr() as usize % HUGE, 0);
        assert_eq!(huge_at(view.as_ptr() as usize), Some(HUGE));
        // SAFETY: inside both mappings.
        unsafe {
            assert_eq!(*view.as_ptr().add(at + 100), buf[at + 100]);
            buf[at + 200] = 0xee;
            assert_eq!(
                *view.as_ptr().add(at + 200),
                0xee,
                "the process's write is seen"
            );
            *view.as_ptr().add(at + 8000) = 0xdd;
        }
        assert_eq!(buf[at + 8000], 0xdd, "roced's write is seen");
        // The pages are adopted now: a region inside them takes them as they are, whole huge
        // pages.
        // SAFETY: as above.
        let b = unsafe { adopt(p as usize + HUGE + 4096 + 3, 100) }.unwrap();
        assert_eq!((b.offset, b.pieces.len()), (4096 + 3, 1), "{b:?}");
        assert_eq!((b.pieces[0].offset, b.pieces[0].len), (HUGE as u64, HUGE));
        let v2 = roced_view(&b);
        // SAFETY: inside both mappings.
        unsafe { assert_eq!(*v2.as_ptr().add(4096 + 3), buf[HUGE + 4096 + 3]) };
        drop((view, v2, a, b));
        // SAFETY: our mapping, unmapped once; nothing points into it any more.
        unsafe { rustix::mm::munmap(p.cast(), 2 * HUGE) }.unwrap();
    }

    #[test]
    fn unmapped_and_empty_ranges_are_refused_and_remapped_memory_is_adopted_afresh() {
        // SAFETY: a fresh private anonymous mapping of ours.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                core::ptr::null_mut(),
                8192,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .unwrap() as usize;
        // SAFETY: as above.
        assert!(unsafe { adopt(p, 8192) }.is_ok());
        // The program maps something else there: adopted again, not reused. MAP_FIXED
        // replaces the old mapping in one step: a munmap first would leave a hole that another
        // test thread's mmap (a thread stack, a malloc arena) can take, which MAP_FIXED would
        // then clobber under it (a SIGSEGV in CI once).
        // SAFETY: our mapping, replaced by a fresh one at the same place.
        unsafe {
            rustix::mm::mmap_anonymous(
                p as *mut _,
                8192,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::FIXED,
            )
            .unwrap();
            *(p as *mut u8) = 42;
        }
        // SAFETY: as above.
        let a = unsafe { adopt(p, 8192) }.unwrap();
        let m = roced_view(&a);
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { *m.as_ptr() }, 42, "the new memory's bytes");
        // SAFETY: unmapped memory is read by nothing: adopt checks first. (The page checked is
        // below mmap_min_addr, never mapped: the range just unmapped could be taken at once by
        // another test's mapping, as it once was.)
        unsafe {
            rustix::mm::munmap(p as *mut _, 8192).unwrap();
            assert!(matches!(
                adopt(0x1000, 10),
                Err(AdoptError::NotMapped { .. })
            ));
            assert!(matches!(adopt(p, 0), Err(AdoptError::BadRange { .. })));
            assert!(matches!(
                adopt(usize::MAX - 5, 10),
                Err(AdoptError::BadRange { .. })
            ));
        }
    }

    #[test]
    fn stack_memory_is_adopted() {
        let mut on_stack = [7u8; 256];
        // SAFETY: our own stack, no other thread touches it.
        let a = unsafe { adopt(on_stack.as_mut_ptr() as usize, 256) }.unwrap();
        assert_eq!(on_stack, [7; 256]);
        // SAFETY: our own array; a volatile store so that it is not optimised away.
        unsafe { core::ptr::write_volatile(&mut on_stack[3], 9) };
        let m = roced_view(&a);
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { *m.as_ptr().add(a.offset + 3) }, 9);
    }
}
