//! Shared memory between an application and roced: a memfd, sized once and sealed so that it
//! can never shrink, mapped read-write and shared by each process that holds its descriptor.
//!
//! The seal is what makes mapping another process's memory safe for roced: pages past the end of
//! a file that shrank would fault (SIGBUS) on the lcore's next access. [`SharedMem::create`]
//! seals what it makes; [`SharedMem::map`] maps only a memfd sealed against shrinking and at
//! least as long as asked.

use core::ffi::c_void;
use core::ptr::NonNull;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Why shared memory could not be made or mapped.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A system call failed.
    #[error("{call}: {source}")]
    Os {
        /// Which.
        call: &'static str,
        /// Its error.
        source: rustix::io::Errno,
    },
    /// A zero length.
    #[error("shared memory cannot be empty")]
    Empty,
    /// The descriptor's file is not sealed against shrinking (or is not a memfd).
    #[error("the memory is not sealed against shrinking (F_SEAL_SHRINK): refused")]
    NotSealed,
    /// A piece that is not whole pages.
    #[error("pieces of shared memory must be whole pages")]
    Misaligned,
    /// The file is shorter than asked.
    #[error("the memory holds {have} bytes, {want} asked")]
    TooShort {
        /// Its length.
        have: u64,
        /// The length asked for.
        want: usize,
    },
}

fn os(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |source| ShmError::Os { call, source }
}

/// The system's page size: mappings are whole pages of it.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

/// A mapping of a sealed memfd, unmapped on drop.
#[derive(Debug)]
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain memory owned by this value until drop; every access to its
// bytes goes through raw pointers whose users (the rings) define their own synchronisation.
unsafe impl Send for SharedMem {}
// SAFETY: as above; `&SharedMem` hands out only the pointer and the length.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    /// Makes `len` zeroed bytes of shared memory named `name` (the name shows in
    /// /proc/PID/maps), sealed against shrinking, growing and further sealing, and maps them.
    pub fn create(name: &str, len: usize) -> Result<SharedMem, ShmError> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(os("fcntl(F_ADD_SEALS)"))?;
        Self::map(fd, len)
    }

    /// As [`SharedMem::create`], of huge pages (a hugetlb memfd of the system's default huge
    /// page size, `huge` bytes: `len` must be whole huge pages). Fails where the huge page pool
    /// has too few free pages.
    pub fn create_huge(name: &str, len: usize, huge: usize) -> Result<SharedMem, ShmError> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        if huge == 0 || !len.is_multiple_of(huge) {
            return Err(ShmError::Misaligned);
        }
        let fd = rustix::fs::memfd_create(
            name,
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING | MemfdFlags::HUGETLB,
        )
        .map_err(os("memfd_create(MFD_HUGETLB)"))?;
        if rustix::fs::fstat(&fd).map_err(os("fstat"))?.st_blksize as usize != huge {
            return Err(ShmError::Misaligned);
        }
        rustix::fs::ftruncate(&fd, len as u64).map_err(os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(os("fcntl(F_ADD_SEALS)"))?;
        Self::map(fd, len)
    }

    /// Maps the first `len` bytes of the memfd `fd` (received from another process): refused
    /// unless it is sealed against shrinking and at least `len` long.
    pub fn map(fd: OwnedFd, len: usize) -> Result<SharedMem, ShmError> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|_| ShmError::NotSealed)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(ShmError::NotSealed);
        }
        let have = rustix::fs::fstat(&fd).map_err(os("fstat"))?.st_size as u64;
        if have < len as u64 {
            return Err(ShmError::TooShort { have, want: len });
        }
        // SAFETY: a fresh shared mapping chosen by the kernel (no address given, so nothing of
        // ours is replaced), of a file that cannot shrink below `len` (checked above).
        let p = unsafe {
            rustix::mm::mmap(
                core::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(os("mmap"))?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(ShmError::Os {
            call: "mmap",
            source: rustix::io::Errno::FAULT,
        })?;
        Ok(SharedMem { ptr, len, fd })
    }

    /// Maps several memfds' pages one after the other as one range: `pieces` are (descriptor,
    /// offset in its file, bytes), offsets and lengths whole pages. This is how a region of an
    /// application's memory that spans pages adopted at different times ([`crate::adopt`]) is
    /// seen whole. Each file must be sealed against shrinking and long enough for its piece.
    ///
    /// Pieces of huge pages (hugetlb memfds: their block size is the huge page size) stay huge:
    /// their offsets and lengths must be whole huge pages, and the range is placed so that
    /// each lands on a huge page boundary, as it does in the application (where the pieces are
    /// contiguous too, so their positions agree modulo the huge page size).
    pub fn map_pieces(pieces: &[(BorrowedFd<'_>, u64, usize)]) -> Result<SharedMem, ShmError> {
        let page = rustix::param::page_size();
        let mut total = 0usize;
        // The huge page size of the huge pieces, and where the first one starts in the range.
        let mut huge: Option<(usize, usize)> = None;
        for &(fd, off, len) in pieces {
            let unit = (rustix::fs::fstat(fd).map_err(os("fstat"))?.st_blksize as usize).max(page);
            if len == 0 || !len.is_multiple_of(unit) || !(off as usize).is_multiple_of(unit) {
                return Err(ShmError::Misaligned);
            }
            if unit > page {
                match huge {
                    None => huge = Some((unit, total)),
                    Some((h, at)) if h == unit && (total - at).is_multiple_of(h) => {}
                    Some(_) => return Err(ShmError::Misaligned),
                }
            }
            let seals = rustix::fs::fcntl_get_seals(fd).map_err(|_| ShmError::NotSealed)?;
            if !seals.contains(SealFlags::SHRINK) {
                return Err(ShmError::NotSealed);
            }
            let have = rustix::fs::fstat(fd).map_err(os("fstat"))?.st_size as u64;
            let want = off.checked_add(len as u64).ok_or(ShmError::Misaligned)?;
            if have < want {
                return Err(ShmError::TooShort {
                    have,
                    want: want as usize,
                });
            }
            total = total.checked_add(len).ok_or(ShmError::Misaligned)?;
        }
        let Some(&(first, ..)) = pieces.first() else {
            return Err(ShmError::Empty);
        };
        let slack = huge.map_or(0, |(h, _)| h);
        // SAFETY: a fresh reservation chosen by the kernel, replaced piece by piece below.
        let raw = unsafe {
            rustix::mm::mmap_anonymous(
                core::ptr::null_mut(),
                total + slack,
                ProtFlags::empty(),
                MapFlags::PRIVATE,
            )
        }
        .map_err(os("mmap"))? as *mut u8;
        // Where the range starts in the reservation: so that the huge pieces land on huge page
        // boundaries. The slack around it goes back.
        let skip = huge.map_or(0, |(h, at)| {
            let want = (h - at % h) % h; // the range's start modulo h
            (want + h - raw as usize % h) % h
        });
        // `skip < slack` (or both 0): the range stays inside the reservation.
        let base = raw.wrapping_add(skip);
        for (from, n) in [(raw, skip), (base.wrapping_add(total), slack - skip)] {
            if n > 0 {
                // SAFETY: the reservation's slack before and after the range, ours, unused.
                let _ = unsafe { rustix::mm::munmap(from.cast(), n) };
            }
        }
        let mem = SharedMem {
            // SAFETY: mmap does not return NULL on success.
            ptr: unsafe { NonNull::new_unchecked(base) },
            len: total,
            fd: rustix::io::fcntl_dupfd_cloexec(first, 0).map_err(os("dup"))?,
        };
        let mut at = 0;
        for &(fd, off, len) in pieces {
            // SAFETY: replaces `len` bytes of our own reservation (inside it: the lengths sum to
            // `total`) with a shared mapping of a file that cannot shrink below `off + len`.
            unsafe {
                rustix::mm::mmap(
                    base.add(at).cast(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED | MapFlags::FIXED,
                    fd,
                    off,
                )
            }
            .map_err(os("mmap"))?;
            at += len;
        }
        Ok(mem)
    }

    /// The first byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: shared memory is never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The memfd, to pass to another process (or to duplicate).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map` or `map_pieces`, of this length, unmapped once; the rings that
        // point into it hold an `Arc` of this value, so none is left.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast::<c_void>(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mappings_of_one_memfd_see_each_others_writes() {
        let a = SharedMem::create("ferroce-test", 4096).unwrap();
        let b = SharedMem::map(a.fd().try_clone_to_owned().unwrap(), 4096).unwrap();
        assert_ne!(a.as_ptr(), b.as_ptr());
        // SAFETY: both pointers are into live 4096-byte mappings; one writer, then one reader.
        unsafe {
            a.as_ptr().add(100).write_volatile(0xa5);
            assert_eq!(b.as_ptr().add(100).read_volatile(), 0xa5);
        }
    }

    #[test]
    fn huge_pieces_stay_huge_and_land_on_huge_boundaries() {
        const HUGE: usize = 2 << 20;
        let small = SharedMem::create("ferroce-test", 8192).unwrap();
        let huge = SharedMem::create_huge("ferroce-test-huge", HUGE, HUGE)
            .expect("a free huge page (scripts/setup.sh reserves the pool)");
        // SAFETY: inside the huge mapping.
        unsafe { huge.as_ptr().add(77).write_volatile(0x5a) };
        // Two ordinary pages, then the huge page: the range starts 8 KiB below a huge boundary.
        let v = SharedMem::map_pieces(&[(small.fd(), 0, 8192), (huge.fd(), 0, HUGE)]).unwrap();
        assert_eq!(v.len(), 8192 + HUGE);
        assert_eq!((v.as_ptr() as usize + 8192) % HUGE, 0);
        // SAFETY: inside the view.
        assert_eq!(unsafe { v.as_ptr().add(8192 + 77).read_volatile() }, 0x5a);
        // A huge piece that is not whole huge pages, or that would not land on a boundary
        // beside another, is refused.
        for bad in [
            vec![(huge.fd(), 4096, HUGE - 4096)],
            vec![(huge.fd(), 0, 4096)],
        ] {
            assert!(matches!(
                SharedMem::map_pieces(&bad),
                Err(ShmError::Misaligned)
            ));
        }
        let two = SharedMem::create_huge("ferroce-test-huge", 2 * HUGE, HUGE).unwrap();
        let crooked = [
            (two.fd(), 0, HUGE),
            (small.fd(), 0, 4096),
            (two.fd(), HUGE as u64, HUGE),
        ];
        assert!(matches!(
            SharedMem::map_pieces(&crooked),
            Err(ShmError::Misaligned)
        ));
        assert!(matches!(
            SharedMem::create_huge("ferroce-test-huge", 4096, HUGE),
            Err(ShmError::Misaligned)
        ));
    }

    #[test]
    fn memory_that_could_shrink_or_is_short_is_refused() {
        // An unsealed memfd, as a careless (or hostile) application would send.
        let fd = rustix::fs::memfd_create("ferroce-unsealed", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        assert!(matches!(SharedMem::map(fd, 4096), Err(ShmError::NotSealed)));
        // Sealed memory cannot be shrunk under a mapping.
        let a = SharedMem::create("ferroce-test", 4096).unwrap();
        assert!(rustix::fs::ftruncate(a.fd(), 0).is_err());
        let short = a.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            SharedMem::map(short, 8192),
            Err(ShmError::TooShort {
                have: 4096,
                want: 8192
            })
        ));
        assert!(matches!(SharedMem::create("x", 0), Err(ShmError::Empty)));
        // A descriptor that is not a memfd at all.
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(matches!(
            SharedMem::map(f.into(), 16),
            Err(ShmError::NotSealed)
        ));
    }
}
