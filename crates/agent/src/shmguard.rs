//! A SIGBUS guard for mappings of files that the traced process controls.
//!
//! The agent maps the target's `/dev/shm/tailscope.<pid>` region shared. A
//! target that shrinks that file (ftruncate) makes the agent's next read of
//! the lost pages fault with SIGBUS, which would kill the agent, and with it
//! the recording. The guard turns that into a counted event: its handler
//! replaces the whole faulting mapping with private zero pages (MAP_FIXED
//! anonymous memory, the technique Wayland compositors use for client shm
//! buffers) and returns, so the read is retried and sees zeros. Zeros parse
//! as free slots and empty rings: nothing more is read from that region, and
//! what was recorded before is kept. A SIGBUS at any other address gets the
//! default action.
//!
//! Registration is lock-free (a fixed table of atomics) because the handler
//! may run at any point on any thread.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

const MAX_GUARDED: usize = 64;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicUsize = AtomicUsize::new(0);
static STARTS: [AtomicUsize; MAX_GUARDED] = [ZERO; MAX_GUARDED];
static LENS: [AtomicUsize; MAX_GUARDED] = [ZERO; MAX_GUARDED];
static FAULTS: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

/// A registered mapping; unregisters on drop (before the owner unmaps).
#[derive(Debug)]
pub struct Guard(usize);

/// Guards `len` bytes at `ptr` (a mapping the caller owns and unmaps after
/// dropping the guard). `None` when the table is full: the mapping is then
/// unguarded, as it was before this module existed.
pub fn register(ptr: *const u8, len: usize) -> Option<Guard> {
    INSTALL.call_once(install);
    for i in 0..MAX_GUARDED {
        if LENS[i]
            .compare_exchange(0, len, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            STARTS[i].store(ptr as usize, Ordering::Release);
            return Some(Guard(i));
        }
    }
    None
}

impl Drop for Guard {
    fn drop(&mut self) {
        STARTS[self.0].store(0, Ordering::Release);
        LENS[self.0].store(0, Ordering::Release);
    }
}

/// How many times a guarded mapping faulted and was replaced by zeros.
pub fn faults() -> u64 {
    FAULTS.load(Ordering::Relaxed)
}

fn install() {
    // SAFETY: a plain sigaction with an async-signal-safe handler.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for i in 0..MAX_GUARDED {
        let start = STARTS[i].load(Ordering::Acquire);
        let len = LENS[i].load(Ordering::Acquire);
        if start != 0 && addr >= start && addr - start < len {
            // SAFETY: replaces exactly the registered mapping, which the
            // owner still holds (it unregisters before unmapping).
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                FAULTS.fetch_add(1, Ordering::Relaxed);
                return; // the faulting read is retried and sees zeros
            }
        }
    }
    // Not ours (or the remap failed): die as if unguarded.
    // SAFETY: async-signal-safe calls.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_shrunk_file_reads_as_zeros_not_sigbus() {
        let path = std::env::temp_dir().join(format!("shmguard-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let len = 4 * 4096;
        f.write_all(&vec![0xabu8; len]).unwrap();
        // SAFETY: a fresh shared mapping of the file we just wrote.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        let g = register(p, len).expect("a free guard slot");
        let before = faults();
        // SAFETY: in bounds of the mapping.
        assert_eq!(unsafe { std::ptr::read_volatile(p.add(3 * 4096)) }, 0xab);
        f.set_len(4096).unwrap(); // the "target" shrinks its file
                                  // SAFETY: in bounds of the mapping; past the file's new end.
        let v = unsafe { std::ptr::read_volatile(p.add(3 * 4096)) };
        assert_eq!(v, 0, "the lost page reads as zero");
        assert_eq!(faults(), before + 1, "the fault is counted");
        // SAFETY: the whole mapping is now private zeros.
        assert_eq!(unsafe { std::ptr::read_volatile(p) }, 0);
        drop(g);
        // SAFETY: exactly the mapping made above.
        unsafe { libc::munmap(p.cast(), len) };
        let _ = std::fs::remove_file(&path);
    }
}
