//! Protection domains and memory regions: keys, access flags, bounds.
//!
//! A region's bytes are reached through [`MrMemory`], so tests and the simulator back regions
//! with a `Vec` while lcores back them with hugepage memory from DPDK. Keys are built as rxe
//! builds them: the table index in the upper 24 bits, an 8-bit tag in the low byte that changes
//! on every registration, so a stale key to a reused slot is refused.

/// Access rights of a memory region (ibv_access_flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    /// Local write (needed for receive buffers and READ/atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote RDMA WRITE.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Remote RDMA READ.
    pub const REMOTE_READ: Access = Access(4);
    /// Remote atomics.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);

    /// True if every right in `other` is granted.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// Rights from their bits, which are libibverbs' `IBV_ACCESS_*` values (LOCAL_WRITE 1,
    /// REMOTE_WRITE 2, REMOTE_READ 4, REMOTE_ATOMIC 8); None if another bit is set.
    pub const fn from_bits(bits: u32) -> Option<Access> {
        if bits & !0xf != 0 {
            return None;
        }
        Some(Access(bits as u8))
    }

    /// The bits.
    pub const fn bits(self) -> u8 {
        self.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

/// An 8-byte atomic operation on region memory (the RDMA atomics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Adds, wrapping.
    FetchAdd(u64),
    /// Writes `swap` if the word equals `compare`.
    CompareSwap {
        /// The expected value.
        compare: u64,
        /// The new value.
        swap: u64,
    },
}

impl AtomicOp {
    /// The new value of a word that held `orig`.
    pub fn apply(self, orig: u64) -> u64 {
        match self {
            AtomicOp::FetchAdd(add) => orig.wrapping_add(add),
            AtomicOp::CompareSwap { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
        }
    }
}

/// Bytes behind a memory region, reached by copies rather than slices: a region may be
/// shared by several lcores (and written by remote peers through any of them), as an RNIC's
/// registered memory is shared by its engines and the host, so no one may hold a `&mut [u8]`
/// to it. Offsets and lengths are checked by [`MemoryRegion`] before these are called.
pub trait MrMemory: Send {
    /// Length in bytes, fixed for as long as the memory is registered (the region reads it
    /// once, at registration).
    fn len(&self) -> usize;
    /// True for an empty region.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies the bytes at `off` into `dst`.
    fn read(&self, off: usize, dst: &mut [u8]);
    /// Copies `src` to the bytes at `off`.
    fn write(&mut self, off: usize, src: &[u8]);
    /// Applies `op` to the little-endian word at `off` (8-byte aligned in the region's
    /// address space) and returns the word's original value. Atomic with respect to the
    /// other users of shared memory.
    fn atomic(&mut self, off: usize, op: AtomicOp) -> u64;
    /// The memory as bytes frames can carry without a copy, if it is (the buffer that attaches
    /// them decides whether it can point into it).
    fn attachable(&self) -> Option<&dyn wire::buf::PayloadMem> {
        None
    }
}

impl core::fmt::Debug for dyn MrMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "MrMemory({} bytes)", self.len())
    }
}

impl MrMemory for Vec<u8> {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self[off..off + dst.len()]);
    }
    fn write(&mut self, off: usize, src: &[u8]) {
        self[off..off + src.len()].copy_from_slice(src);
    }
    fn atomic(&mut self, off: usize, op: AtomicOp) -> u64 {
        let w = &mut self[off..off + 8];
        let orig = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        w.copy_from_slice(&op.apply(orig).to_le_bytes());
        orig
    }
}

/// A protection domain handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdHandle(pub u32);

/// Why a registration or an access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MrError {
    /// No such protection domain.
    #[error("no such protection domain")]
    NoSuchPd,
    /// The key names no region (or a deregistered one).
    #[error("invalid key")]
    InvalidKey,
    /// The region belongs to another protection domain.
    #[error("protection domain mismatch")]
    PdMismatch,
    /// The range is outside the region.
    #[error("out of bounds")]
    OutOfBounds,
    /// The region does not grant the access.
    #[error("access not granted")]
    AccessDenied,
    /// Atomics need 8-byte alignment.
    #[error("misaligned atomic")]
    Misaligned,
    /// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE (the verbs rule).
    #[error("remote write or atomic access needs local write")]
    BadAccessFlags,
    /// The table is full.
    #[error("too many memory regions")]
    TooMany,
    /// The region is still in use (by a QP, for example).
    #[error("region busy")]
    Busy,
}

/// A registered region.
pub struct MemoryRegion {
    /// Owning protection domain.
    pub pd: PdHandle,
    /// Local key.
    pub lkey: u32,
    /// Remote key (same value, as rxe does).
    pub rkey: u32,
    /// The virtual address the region is registered at.
    pub va: u64,
    /// Rights.
    pub access: Access,
    /// `mem.len()`, kept here: every bounds check reads it, and through `mem` it is a call.
    len: usize,
    mem: Box<dyn MrMemory>,
}

impl core::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("pd", &self.pd)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("va", &format_args!("{:#x}", self.va))
            .field("len", &self.len())
            .field("access", &self.access)
            .finish()
    }
}

impl MemoryRegion {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Offset of `[va, va + len)` in the region, if it lies inside.
    pub fn offset(&self, va: u64, len: u64) -> Result<usize, MrError> {
        let end = va.checked_add(len).ok_or(MrError::OutOfBounds)?;
        if va < self.va || end > self.va + self.len() as u64 {
            return Err(MrError::OutOfBounds);
        }
        Ok((va - self.va) as usize)
    }

    /// The memory behind the region and the offset of `[va, va + len)` in it, for frames that
    /// carry those bytes without a copy; `None` for memory that cannot be attached or a range
    /// that does not lie inside.
    pub fn attachable_range(
        &self,
        va: u64,
        len: u64,
    ) -> Option<(&dyn wire::buf::PayloadMem, usize)> {
        let m = self.mem.attachable()?;
        Some((m, self.offset(va, len).ok()?))
    }

    /// Copies the bytes at `va` into `dst`.
    pub fn read(&self, va: u64, dst: &mut [u8]) -> Result<(), MrError> {
        let off = self.offset(va, dst.len() as u64)?;
        self.mem.read(off, dst);
        Ok(())
    }

    /// The `len` bytes at `va`, copied (the slow path: control plane and tests).
    pub fn to_vec(&self, va: u64, len: usize) -> Result<Vec<u8>, MrError> {
        let mut v = vec![0u8; len];
        self.read(va, &mut v)?;
        Ok(v)
    }

    /// Copies `src` to the bytes at `va`.
    pub fn write(&mut self, va: u64, src: &[u8]) -> Result<(), MrError> {
        let off = self.offset(va, src.len() as u64)?;
        self.mem.write(off, src);
        Ok(())
    }

    /// Copies `src` to the region at offset `off`, one the responder's checks resolved
    /// ([`MrTable::check_remote`]): no address arithmetic again, only the bound.
    #[inline]
    pub fn write_at(&mut self, off: usize, src: &[u8]) -> Result<(), MrError> {
        if off
            .checked_add(src.len())
            .is_none_or(|end| end > self.len())
        {
            return Err(MrError::OutOfBounds);
        }
        self.mem.write(off, src);
        Ok(())
    }

    /// Applies an atomic to the word at offset `off`, one the responder's checks resolved
    /// (aligned, inside); returns its original value.
    pub fn atomic_at(&mut self, off: usize, op: AtomicOp) -> Result<u64, MrError> {
        if off.checked_add(8).is_none_or(|end| end > self.len()) {
            return Err(MrError::OutOfBounds);
        }
        Ok(self.mem.atomic(off, op))
    }

    /// Applies an atomic to the word at `va` (8-byte aligned); returns its original value.
    pub fn atomic(&mut self, va: u64, op: AtomicOp) -> Result<u64, MrError> {
        if !va.is_multiple_of(8) {
            return Err(MrError::Misaligned);
        }
        let off = self.offset(va, 8)?;
        Ok(self.mem.atomic(off, op))
    }
}

/// The protection domains and memory regions of one endpoint.
#[derive(Debug, Default)]
pub struct MrTable {
    pds: Vec<bool>,
    slots: Vec<Option<MemoryRegion>>,
    tags: Vec<u8>,
    free: Vec<u32>,
    count: usize,
    /// Seeds each slot's first key variant (0: every slot starts at variant 1).
    key_seed: u64,
}

/// Most regions one table holds (24-bit index).
pub const MAX_REGIONS: usize = 1 << 20;

impl MrTable {
    /// An empty table; keys are `index << 8 | variant`, the variant starting at 1 in every
    /// slot (deterministic, for tests and the simulator).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table whose slots start their key variants at a value drawn from `seed`
    /// (1 to 255, then counting up on each reuse, never 0), as RNICs vary the key byte: a
    /// node seeds it at random, so that a peer cannot guess a region's key from the order it
    /// was registered in.
    pub fn with_key_seed(seed: u64) -> Self {
        MrTable {
            key_seed: seed,
            ..Self::default()
        }
    }

    /// The first key variant of slot `index`.
    fn first_tag(&self, index: u32) -> u8 {
        if self.key_seed == 0 {
            return 1;
        }
        // SplitMix64's finalizer over seed and index.
        let mut z = self.key_seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        1 + (z % 255) as u8
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> PdHandle {
        self.pds.push(true);
        PdHandle(self.pds.len() as u32 - 1)
    }

    /// Makes `pd` a live protection domain (the control plane numbers PDs node-wide and every
    /// lcore's table takes the same numbers); allocating it again is harmless.
    pub fn ensure_pd(&mut self, pd: PdHandle) {
        let i = pd.0 as usize;
        if self.pds.len() <= i {
            self.pds.resize(i + 1, false);
        }
        self.pds[i] = true;
    }

    /// True while `pd` is allocated.
    pub fn has_pd(&self, pd: PdHandle) -> bool {
        self.pds.get(pd.0 as usize) == Some(&true)
    }

    /// Frees a protection domain; refused while regions use it.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), MrError> {
        match self.pds.get(pd.0 as usize) {
            Some(true) => {}
            _ => return Err(MrError::NoSuchPd),
        }
        if self.slots.iter().flatten().any(|r| r.pd == pd) {
            return Err(MrError::Busy);
        }
        self.pds[pd.0 as usize] = false;
        Ok(())
    }

    /// The checks every registration passes: a live PD, remote write or atomic only with
    /// local write (the verbs rule), an address range that does not wrap.
    fn check_registration(
        &self,
        pd: PdHandle,
        va: u64,
        len: usize,
        access: Access,
    ) -> Result<(), MrError> {
        if self.pds.get(pd.0 as usize) != Some(&true) {
            return Err(MrError::NoSuchPd);
        }
        let remote_writes = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if access.bits() & remote_writes.bits() != 0 && !access.contains(Access::LOCAL_WRITE) {
            return Err(MrError::BadAccessFlags);
        }
        va.checked_add(len as u64).ok_or(MrError::OutOfBounds)?;
        Ok(())
    }

    /// Registers `mem` at virtual address `va` with `access`; returns the key (lkey = rkey).
    pub fn register(
        &mut self,
        pd: PdHandle,
        va: u64,
        mem: Box<dyn MrMemory>,
        access: Access,
    ) -> Result<u32, MrError> {
        // A free slot (or a new one), its next tag; register_at checks and installs.
        let index = match self.free.pop() {
            Some(i) => i,
            None if self.slots.len() >= MAX_REGIONS => return Err(MrError::TooMany),
            None => self.slots.len() as u32,
        };
        let tag = match self.tags.get(index as usize).copied() {
            // A slot used before: its next variant (never 0).
            Some(t) if t != 0 => t.wrapping_add(1).max(1),
            _ => self.first_tag(index),
        };
        let key = index << 8 | tag as u32;
        match self.register_at(pd, key, va, mem, access) {
            Ok(()) => Ok(key),
            Err(e) => {
                if (index as usize) < self.slots.len() {
                    self.free.push(index);
                }
                Err(e)
            }
        }
    }

    /// Registers `mem` under a key chosen elsewhere (the node-wide table that hands keys out
    /// for every lcore's table): refused if the key's slot is taken. Later registrations
    /// here continue the key's tag sequence for that slot.
    pub fn register_at(
        &mut self,
        pd: PdHandle,
        key: u32,
        va: u64,
        mem: Box<dyn MrMemory>,
        access: Access,
    ) -> Result<(), MrError> {
        self.check_registration(pd, va, mem.len(), access)?;
        let index = (key >> 8) as usize;
        if index >= MAX_REGIONS {
            return Err(MrError::TooMany);
        }
        while self.slots.len() <= index {
            // New slots below `index` become free ones.
            self.slots.push(None);
            self.tags.push(0);
            if self.slots.len() - 1 != index {
                self.free.push(self.slots.len() as u32 - 1);
            }
        }
        if self.slots[index].is_some() {
            return Err(MrError::Busy);
        }
        self.free.retain(|&f| f as usize != index);
        self.tags[index] = key as u8;
        self.slots[index] = Some(MemoryRegion {
            pd,
            lkey: key,
            rkey: key,
            va,
            access,
            len: mem.len(),
            mem,
        });
        self.count += 1;
        Ok(())
    }

    /// Deregisters a region; its key stops working at once.
    pub fn deregister(&mut self, key: u32) -> Result<Box<dyn MrMemory>, MrError> {
        self.get(key)?;
        let index = key >> 8;
        let r = self.slots[index as usize]
            .take()
            .ok_or(MrError::InvalidKey)?;
        self.count -= 1;
        self.free.push(index);
        Ok(r.mem)
    }

    /// The region a key names.
    pub fn get(&self, key: u32) -> Result<&MemoryRegion, MrError> {
        let index = (key >> 8) as usize;
        match self.slots.get(index) {
            Some(Some(r)) if r.lkey == key => Ok(r),
            _ => Err(MrError::InvalidKey),
        }
    }

    /// The region local key `key` names for a QP of protection domain `pd`: a key of another
    /// PD is refused as an unknown one is (verbs' local access checks; what keeps one attached
    /// application's work requests off another's memory).
    pub fn local(&self, key: u32, pd: PdHandle) -> Result<&MemoryRegion, MrError> {
        match self.get(key) {
            Ok(r) if r.pd == pd => Ok(r),
            _ => Err(MrError::InvalidKey),
        }
    }

    /// [`MrTable::local`], writable.
    pub fn local_mut(&mut self, key: u32, pd: PdHandle) -> Result<&mut MemoryRegion, MrError> {
        match self.get_mut(key) {
            Ok(r) if r.pd == pd => Ok(r),
            _ => Err(MrError::InvalidKey),
        }
    }

    /// The region a key names, writable.
    pub fn get_mut(&mut self, key: u32) -> Result<&mut MemoryRegion, MrError> {
        let index = (key >> 8) as usize;
        match self.slots.get_mut(index) {
            Some(Some(r)) if r.lkey == key => Ok(r),
            _ => Err(MrError::InvalidKey),
        }
    }

    /// Checks a remote access as the responder must: key, protection domain, bounds, rights,
    /// and 8-byte alignment for atomics. Returns the region's offset for `va`.
    pub fn check_remote(
        &self,
        pd: PdHandle,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<usize, MrError> {
        let r = self.get(rkey)?;
        if r.pd != pd {
            return Err(MrError::PdMismatch);
        }
        if !r.access.contains(need) {
            return Err(MrError::AccessDenied);
        }
        if need.contains(Access::REMOTE_ATOMIC) && !va.is_multiple_of(8) {
            return Err(MrError::Misaligned);
        }
        r.offset(va, len)
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when no region is registered.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (MrTable, PdHandle) {
        let mut t = MrTable::new();
        let pd = t.alloc_pd();
        (t, pd)
    }

    #[test]
    fn remote_checks_cover_key_pd_bounds_rights_alignment() {
        let (mut t, pd) = table();
        let other = t.alloc_pd();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let k = t
            .register(pd, 0x1000, Box::new(vec![0u8; 4096]), rw)
            .unwrap();
        assert_eq!(
            t.check_remote(pd, k, 0x1000, 4096, Access::REMOTE_WRITE),
            Ok(0)
        );
        assert_eq!(
            t.check_remote(pd, k, 0x1ff8, 8, Access::REMOTE_READ),
            Ok(0xff8)
        );
        assert_eq!(
            t.check_remote(pd, k, 0x1ff9, 8, Access::REMOTE_READ),
            Err(MrError::OutOfBounds)
        );
        assert_eq!(
            t.check_remote(pd, k, 0xfff, 1, Access::REMOTE_READ),
            Err(MrError::OutOfBounds)
        );
        assert_eq!(
            t.check_remote(pd, k, u64::MAX, 2, Access::REMOTE_READ),
            Err(MrError::OutOfBounds)
        );
        assert_eq!(
            t.check_remote(pd, k, 0x1000, 8, Access::REMOTE_ATOMIC),
            Err(MrError::AccessDenied)
        );
        assert_eq!(
            t.check_remote(other, k, 0x1000, 8, Access::REMOTE_READ),
            Err(MrError::PdMismatch)
        );
        assert_eq!(
            t.check_remote(pd, k ^ 1, 0x1000, 8, Access::REMOTE_READ),
            Err(MrError::InvalidKey)
        );
        let a = t
            .register(
                pd,
                0x9000,
                Box::new(vec![0u8; 64]),
                Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
            )
            .unwrap();
        assert_eq!(
            t.check_remote(pd, a, 0x9008, 8, Access::REMOTE_ATOMIC),
            Ok(8)
        );
        assert_eq!(
            t.check_remote(pd, a, 0x9004, 8, Access::REMOTE_ATOMIC),
            Err(MrError::Misaligned)
        );
    }

    #[test]
    fn writes_and_atomics_at_a_resolved_offset_stay_inside_the_region() {
        let (mut t, pd) = table();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        let k = t
            .register(pd, 0x1000, Box::new(vec![0u8; 64]), all)
            .unwrap();
        let off = t
            .check_remote(pd, k, 0x1030, 16, Access::REMOTE_WRITE)
            .unwrap();
        let r = t.get_mut(k).unwrap();
        r.write_at(off, &[7; 16]).unwrap();
        assert_eq!(r.to_vec(0x1030, 16).unwrap(), vec![7; 16]);
        assert_eq!(r.write_at(off, &[7; 17]), Err(MrError::OutOfBounds));
        assert_eq!(r.write_at(usize::MAX, &[1]), Err(MrError::OutOfBounds));
        assert_eq!(r.atomic_at(8, AtomicOp::FetchAdd(2)), Ok(0));
        assert_eq!(r.atomic_at(8, AtomicOp::FetchAdd(2)), Ok(2));
        assert_eq!(
            r.atomic_at(57, AtomicOp::FetchAdd(2)),
            Err(MrError::OutOfBounds)
        );
    }

    #[test]
    fn stale_keys_are_refused_after_reuse() {
        let (mut t, pd) = table();
        let k1 = t
            .register(pd, 0, Box::new(vec![1u8; 8]), Access::NONE)
            .unwrap();
        t.deregister(k1).unwrap();
        let k2 = t
            .register(pd, 0, Box::new(vec![2u8; 8]), Access::NONE)
            .unwrap();
        assert_eq!(k1 >> 8, k2 >> 8, "the slot is reused");
        assert_ne!(k1, k2);
        assert_eq!(t.get(k1).err(), Some(MrError::InvalidKey));
        assert_eq!(t.get(k2).unwrap().to_vec(0, 8).unwrap(), [2u8; 8]);
        assert_eq!(t.deregister(k1).err(), Some(MrError::InvalidKey));
    }

    #[test]
    fn a_seeded_table_varies_its_keys_and_never_repeats_a_slots_key_soon() {
        let keys = |seed: u64| {
            let mut t = MrTable::with_key_seed(seed);
            let pd = t.alloc_pd();
            (0..32)
                .map(|i| t.register(pd, i << 12, Box::new(vec![0u8; 8]), Access::NONE))
                .collect::<Result<Vec<_>, _>>()
                .unwrap()
        };
        let (a, b) = (keys(0x1234_5678_9abc_def0), keys(0x0fed_cba9_8765_4321));
        assert_ne!(a, b, "another seed, other keys");
        let variants: std::collections::BTreeSet<u32> = a.iter().map(|k| k & 0xff).collect();
        assert!(variants.len() > 16, "the variants spread: {variants:?}");
        assert!(!variants.contains(&0), "never variant 0");
        for (i, k) in a.iter().enumerate() {
            assert_eq!(k >> 8, i as u32, "the index is the slot");
        }
        assert_eq!(
            keys(0).iter().map(|k| k & 0xff).collect::<Vec<_>>(),
            vec![1; 32],
            "unseeded: variant 1, deterministic"
        );
        // A slot reused 300 times goes through every variant but 0 before it repeats one.
        let mut t = MrTable::with_key_seed(7);
        let pd = t.alloc_pd();
        let mut seen = Vec::new();
        for _ in 0..300 {
            let k = t
                .register(pd, 0, Box::new(vec![0u8; 8]), Access::NONE)
                .unwrap();
            seen.push(k & 0xff);
            t.deregister(k).unwrap();
        }
        assert!(!seen.contains(&0));
        assert!(seen.windows(255).all(|w| {
            let set: std::collections::BTreeSet<_> = w.iter().collect();
            set.len() == 255
        }));
    }

    #[test]
    fn a_key_chosen_elsewhere_is_installed_as_given() {
        let (mut node, npd) = table();
        let (mut lcore, lpd) = table();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let k1 = node.register(npd, 0, Box::new(vec![0u8; 8]), rw).unwrap();
        let k2 = node
            .register(npd, 0x100, Box::new(vec![0u8; 8]), rw)
            .unwrap();
        // Installed out of order on the lcore, as a node may.
        lcore
            .register_at(lpd, k2, 0x100, Box::new(vec![2u8; 8]), rw)
            .unwrap();
        lcore
            .register_at(lpd, k1, 0, Box::new(vec![1u8; 8]), rw)
            .unwrap();
        assert_eq!(lcore.get(k2).unwrap().to_vec(0x100, 1).unwrap(), [2]);
        assert_eq!(lcore.get(k1).unwrap().to_vec(0, 1).unwrap(), [1]);
        assert_eq!(
            lcore.register_at(lpd, k1, 0, Box::new(vec![0u8; 8]), rw),
            Err(MrError::Busy)
        );
        assert_eq!(
            lcore.register_at(
                lpd,
                3 << 8 | 1,
                0,
                Box::new(vec![0u8; 8]),
                Access::REMOTE_WRITE
            ),
            Err(MrError::BadAccessFlags)
        );
        lcore.deregister(k1).unwrap();
        assert_eq!(lcore.get(k1).err(), Some(MrError::InvalidKey));
        assert_eq!(lcore.len(), 1);
    }

    #[test]
    fn registration_rules() {
        let (mut t, pd) = table();
        assert_eq!(
            t.register(pd, 0, Box::new(vec![0u8; 8]), Access::REMOTE_WRITE)
                .err(),
            Some(MrError::BadAccessFlags),
            "remote write needs local write"
        );
        assert_eq!(
            t.register(PdHandle(9), 0, Box::new(vec![0u8; 8]), Access::NONE)
                .err(),
            Some(MrError::NoSuchPd)
        );
        let k = t
            .register(pd, 0, Box::new(vec![0u8; 8]), Access::NONE)
            .unwrap();
        assert_eq!(t.dealloc_pd(pd), Err(MrError::Busy));
        t.deregister(k).unwrap();
        assert_eq!(t.dealloc_pd(pd), Ok(()));
        assert!(t.is_empty());
    }
}
