//! EAL initialisation and clean-up, lcore launch, and the TSC clock.

use super::{Error, last_error, strerror};
use crate::lcore::Clock;
use crate::time::{Instant, TscClock};
use dpdk_sys as sys;
use std::ffi::{CString, c_int, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

static EAL_UP: AtomicBool = AtomicBool::new(false);

/// What the EAL is started with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EalArgs {
    /// Virtual devices, as `--vdev` strings (`net_memif0,role=server,socket=/run/x.sock`).
    pub vdevs: Vec<String>,
    /// PCI devices to use (`0000:03:00.0`); when empty, `--no-pci` keeps EAL off the PCI bus.
    pub pci: Vec<String>,
    /// `--file-prefix`: a distinct one per process; `None` means `ferroce-<pid>`.
    pub file_prefix: Option<String>,
    /// `--in-memory`: no runtime files at all (not possible with memif, which needs the
    /// multi-process channel).
    pub in_memory: bool,
    /// Use hugepages; without them EAL runs on `-m memory_mb` of ordinary memory (slower).
    pub hugepages: bool,
    /// Memory for `--no-huge`, in MiB.
    pub memory_mb: u32,
    /// CPUs of the worker lcores, one lcore per entry; worker `i` is EAL lcore `i + 1`.
    pub worker_cpus: Vec<usize>,
    /// CPUs the main (control) lcore may run on; empty means every CPU.
    pub main_cpus: Vec<usize>,
    /// EAL log level (`--log-level`), for example `warning` or `info`.
    pub log_level: String,
}

impl EalArgs {
    /// The file prefix this process will use.
    pub fn prefix(&self) -> String {
        self.file_prefix
            .clone()
            .unwrap_or_else(|| format!("ferroce-{}", std::process::id()))
    }

    /// The argument vector for `rte_eal_init` (program name first).
    pub fn argv(&self) -> Vec<String> {
        let mut a = vec!["roced".to_string()];
        let cpuset = |cpus: &[usize]| {
            let s: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
            format!("({})", s.join(","))
        };
        let all = allowed_cpus();
        let main = if self.main_cpus.is_empty() {
            &all
        } else {
            &self.main_cpus
        };
        let mut lcores = vec![format!("0@{}", cpuset(main))];
        for (i, c) in self.worker_cpus.iter().enumerate() {
            lcores.push(format!("{}@{}", i + 1, c));
        }
        a.push(format!("--lcores={}", lcores.join(",")));
        a.push("--main-lcore=0".into());
        if self.pci.is_empty() {
            a.push("--no-pci".into());
        }
        for p in &self.pci {
            a.push(format!("--allow={p}"));
        }
        for v in &self.vdevs {
            a.push(format!("--vdev={v}"));
        }
        if self.in_memory {
            a.push("--in-memory".into());
        } else {
            a.push(format!("--file-prefix={}", self.prefix()));
        }
        if self.hugepages {
            if !self.in_memory {
                a.push("--huge-unlink".into());
            }
        } else {
            a.push("--no-huge".into());
            a.push(format!("-m{}", self.memory_mb.max(256)));
        }
        let level = if self.log_level.is_empty() {
            "warning"
        } else {
            &self.log_level
        };
        a.push(format!("--log-level={level}"));
        a
    }
}

/// The CPUs this process may run on, in order: its affinity mask (what a container's cpuset,
/// taskset or systemd's CPUAffinity leave it), not just how many the machine has. A container
/// pinned to CPU 1 has `[1]`.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the calling thread's mask into `set`, at most its size.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        return (0..n).collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: c < CPU_SETSIZE, within the set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// The initialised EAL. Dropping it runs `rte_eal_cleanup` and removes the runtime directory,
/// so a clean stop leaves nothing in /var/run/dpdk or /dev/hugepages.
#[derive(Debug)]
pub struct Eal {
    runtime_dir: Option<PathBuf>,
}

impl Eal {
    /// Starts the EAL; at most once per process.
    pub fn init(args: &EalArgs) -> Result<Eal, Error> {
        if EAL_UP.swap(true, Ordering::SeqCst) {
            return Err(Error::EalTwice);
        }
        let argv = args.argv();
        let cargs: Vec<CString> = argv
            .iter()
            .map(|s| CString::new(s.as_str()).expect("no NUL in EAL args"))
            .collect();
        // rte_eal_init may permute argv; it keeps pointers into it, so the strings are leaked
        // for the life of the process (a few hundred bytes, once).
        let mut ptrs: Vec<*mut i8> = cargs.into_iter().map(|c| c.into_raw()).collect();
        // SAFETY: argv is a valid array of NUL-terminated strings that lives forever.
        let rc = unsafe { sys::rte_eal_init(ptrs.len() as c_int, ptrs.as_mut_ptr()) };
        std::mem::forget(ptrs);
        if rc < 0 {
            EAL_UP.store(false, Ordering::SeqCst);
            return Err(Error::Eal {
                reason: last_error(),
                args: argv[1..].join(" "),
            });
        }
        let runtime_dir =
            (!args.in_memory).then(|| PathBuf::from("/var/run/dpdk").join(args.prefix()));
        Ok(Eal { runtime_dir })
    }

    /// The TSC frequency.
    pub fn tsc_hz(&self) -> u64 {
        // SAFETY: EAL is initialised.
        unsafe { sys::rte_get_tsc_hz() }
    }
}

impl Drop for Eal {
    fn drop(&mut self) {
        // SAFETY: EAL was initialised by us and every lcore has returned (callers wait first).
        let rc = unsafe { sys::rte_eal_cleanup() };
        if rc != 0 {
            tracing::warn!("rte_eal_cleanup: {}", strerror(rc));
        }
        if let Some(dir) = &self.runtime_dir
            && let Err(e) = std::fs::remove_dir_all(dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("removing {}: {e}", dir.display());
        }
    }
}

type Job = Box<dyn FnOnce() + Send + 'static>;

unsafe extern "C" fn trampoline(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the Box<Job> leaked by `launch`, passed to exactly one trampoline.
    let job: Box<Job> = unsafe { Box::from_raw(arg as *mut Job) };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}

/// Runs `f` on EAL worker lcore `lcore` (1-based: lcore 0 is the main one).
pub fn launch(lcore: u32, f: impl FnOnce() + Send + 'static) -> Result<(), Error> {
    let job: Box<Job> = Box::new(Box::new(f));
    let arg = Box::into_raw(job) as *mut c_void;
    // SAFETY: trampoline takes ownership of `arg` exactly once; on failure we take it back.
    let rc = unsafe { sys::rte_eal_remote_launch(Some(trampoline), arg, lcore) };
    if rc != 0 {
        // SAFETY: the launch failed, so no trampoline owns `arg`.
        drop(unsafe { Box::from_raw(arg as *mut Job) });
        return Err(Error::Launch {
            lcore,
            reason: strerror(rc),
        });
    }
    Ok(())
}

/// Waits for every worker lcore to return.
pub fn wait_all() {
    // SAFETY: called from the main lcore after launching.
    unsafe { sys::rte_eal_mp_wait_lcore() }
}

/// The time-stamp counter, read inline (DPDK's `rte_rdtsc` is a static inline function that
/// reaches Rust as an out-of-line wrapper call: it showed as 6-9 % of a busy lcore's profile).
#[inline(always)]
fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: reading the TSC has no preconditions.
        unsafe { sys::rte_rdtsc() }
    }
}

/// The TSC as a [`Clock`].
#[derive(Debug, Clone, Copy)]
pub struct TscSource(TscClock);

impl TscSource {
    /// A clock whose origin is now.
    pub fn new(eal: &Eal) -> Self {
        TscSource(TscClock::new(eal.tsc_hz(), rdtsc()))
    }
}

impl Clock for TscSource {
    #[inline]
    fn now(&self) -> Instant {
        self.0.instant(rdtsc())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_has_no_pci_prefix_and_lcore_map() {
        let a = EalArgs {
            vdevs: vec!["net_null0".into()],
            file_prefix: Some("t".into()),
            hugepages: true,
            worker_cpus: vec![1, 0],
            main_cpus: vec![0],
            ..Default::default()
        };
        let v = a.argv();
        assert!(v.contains(&"--no-pci".to_string()));
        assert!(v.contains(&"--lcores=0@(0),1@1,2@0".to_string()));
        assert!(v.contains(&"--file-prefix=t".to_string()));
        assert!(v.contains(&"--huge-unlink".to_string()));
        assert!(v.contains(&"--vdev=net_null0".to_string()));
        let b = EalArgs {
            pci: vec!["0000:03:00.0".into()],
            in_memory: true,
            memory_mb: 512,
            ..Default::default()
        };
        let v = b.argv();
        assert!(!v.contains(&"--no-pci".to_string()));
        assert!(v.contains(&"--no-huge".to_string()) && v.contains(&"-m512".to_string()));
        assert!(v.contains(&"--in-memory".to_string()));
    }
}
