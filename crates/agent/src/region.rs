//! Marker mode: the target's `/dev/shm/tailscope.<pid>` region, mapped and
//! drained.
//!
//! Everything is read through [`RegionMemory`] — a copy of the bytes, then
//! the hostile-input parsers of `tailscope_abi::region` — never by casting
//! the mapping to a struct. The only words the agent writes are its own:
//! each slot's `ring_tail` (store-release, after the records are copied) and
//! the header's `agent_pid`, `sample_ppm_agent`, `sample_ppm_effective`,
//! `burst_gate`, `agent_heartbeat_ns` and `drain_waiting` (and exited slots'
//! `state`, handed back by the LDB observer).
//!
//! A target that truncates its region file while mapped would make the next
//! read fault (SIGBUS): [`crate::shmguard`] replaces the mapping with zeros
//! instead, the region then reads as empty, and the fault is counted
//! (meta.json `notes.region_faults`).

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tailscope_abi::region::{
    header_offsets, parse_kinds_table, parse_record, parse_region_header, parse_slot, plan_drain,
    record_offset_in_slot, slot_offset, slot_offsets, AbiError, RegionHeader, SLOT_PRODUCER_BYTES,
};
use tailscope_abi::{
    ts_request_record, RECORD_SIZE, REGION_HEADER_SIZE, TS_REC_COUNTERS, TS_REC_TORN,
    TS_REGION_PATH_PREFIX, TS_RING_CAPACITY, TS_RING_WAKE_FILL, TS_SLOT_EXITED, TS_SLOT_LIVE,
};

/// Shared memory as the agent may touch it. Reads out of bounds yield zeros
/// (and are impossible after header validation); writes out of bounds are
/// ignored.
pub trait RegionMemory {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn read(&self, off: usize, buf: &mut [u8]);
    fn load_u64_acquire(&self, off: usize) -> u64;
    fn store_u64_release(&self, off: usize, v: u64);
    fn store_u32(&self, off: usize, v: u32);
    /// Compare-and-swap of an aligned u32 (false when out of bounds).
    fn cas_u32(&self, off: usize, old: u32, new: u32) -> bool;
    fn load_u32(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        self.read(off, &mut b);
        u32::from_le_bytes(b)
    }
    fn load_u64(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        self.read(off, &mut b);
        u64::from_le_bytes(b)
    }
    /// Sleeps up to `timeout` while the aligned u32 at `off` equals
    /// `expected`; another process sharing the memory may wake it early
    /// (FUTEX_WAKE). It may also return early for no reason (a signal, a
    /// hostile wake): callers re-check what they wait for. Default: sleeps.
    fn futex_wait(&self, off: usize, expected: u32, timeout: Duration) {
        let _ = (off, expected);
        std::thread::sleep(timeout);
    }
}

/// A `Vec<u8>` standing in for a region (tests).
impl RegionMemory for std::cell::RefCell<Vec<u8>> {
    fn len(&self) -> usize {
        self.borrow().len()
    }
    fn read(&self, off: usize, buf: &mut [u8]) {
        let b = self.borrow();
        match off.checked_add(buf.len()).and_then(|end| b.get(off..end)) {
            Some(src) => buf.copy_from_slice(src),
            None => buf.fill(0),
        }
    }
    fn load_u64_acquire(&self, off: usize) -> u64 {
        self.load_u64(off)
    }
    fn store_u64_release(&self, off: usize, v: u64) {
        if let Some(d) = self.borrow_mut().get_mut(off..off + 8) {
            d.copy_from_slice(&v.to_le_bytes());
        }
    }
    fn store_u32(&self, off: usize, v: u32) {
        if let Some(d) = self.borrow_mut().get_mut(off..off + 4) {
            d.copy_from_slice(&v.to_le_bytes());
        }
    }
    fn cas_u32(&self, off: usize, old: u32, new: u32) -> bool {
        if self.load_u32(off) != old || off.checked_add(4).is_none_or(|e| e > self.len()) {
            return false;
        }
        self.store_u32(off, new);
        true
    }
}

/// A region file mapped shared, read-write.
pub struct MappedRegion {
    ptr: *mut u8,
    len: usize,
    guard: Option<crate::shmguard::Guard>,
}

/// Removes the regions (`/dev/shm/tailscope.<pid>`) of processes that are
/// gone: the runtime unlinks its region at exit, but a process killed with
/// SIGKILL leaves it behind (~100 KB each as used). A region is kept while
/// any process still maps it, which also spares those of processes in other
/// pid namespaces that share this /dev/shm (the agent sees every process:
/// it runs in the initial pid namespace, as its BPF programs' tgids are
/// global). Best effort; returns how many were removed.
pub fn sweep_stale_regions() -> usize {
    let started = std::time::SystemTime::now();
    let prefix = std::path::Path::new(TS_REGION_PATH_PREFIX);
    let (Some(dir), Some(stem)) = (prefix.parent(), prefix.file_name()) else {
        return 0;
    };
    let stem = stem.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut stale: Vec<PathBuf> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = region_pid(&name, &stem)?;
            pid_gone(pid).then(|| e.path())
        })
        .collect();
    if stale.is_empty() {
        return 0;
    }
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for p in procs.flatten() {
            if stale.is_empty() {
                break;
            }
            if !p
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
            {
                continue;
            }
            let Ok(maps) = std::fs::read_to_string(p.path().join("maps")) else {
                continue;
            };
            stale.retain(|f| {
                let f = f.to_string_lossy();
                !maps.lines().any(|l| l.ends_with(f.as_ref()))
            });
        }
    }
    // Checked again right before the unlink: a new process given the same
    // pid meanwhile recreates (O_TRUNC) the file, which is then newer than
    // this sweep, and is alive.
    stale
        .iter()
        .filter(|f| {
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned());
            let pid = name.as_deref().and_then(|n| region_pid(n, &stem));
            let old = std::fs::symlink_metadata(f)
                .ok()
                .filter(|m| m.file_type().is_file())
                .and_then(|m| m.modified().ok())
                .is_some_and(|t| t < started);
            old && pid.is_some_and(pid_gone) && std::fs::remove_file(f).is_ok()
        })
        .count()
}

/// The pid in a region's file name (`tailscope.<digits>`).
fn region_pid(name: &str, stem: &str) -> Option<i32> {
    let digits = name.strip_prefix(stem)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&p: &i32| p > 0)
}

/// Whether no process has this pid (in the agent's pid namespace).
fn pid_gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence.
    let rc = unsafe { libc::kill(pid, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

impl MappedRegion {
    pub fn path(pid: u32) -> PathBuf {
        PathBuf::from(format!("{TS_REGION_PATH_PREFIX}{pid}"))
    }

    pub fn open(pid: u32) -> std::io::Result<MappedRegion> {
        let path = Self::path(pid);
        let f = OpenOptions::new().read(true).write(true).open(&path)?;
        let len = f.metadata()?.len() as usize;
        if len < REGION_HEADER_SIZE {
            return Err(std::io::Error::other(format!(
                "{} is {len} bytes, shorter than a region header",
                path.display()
            )));
        }
        // SAFETY: a fresh shared mapping of a file we opened rw, of its length.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MappedRegion {
            ptr: ptr.cast(),
            len,
            guard: crate::shmguard::register(ptr.cast(), len),
        })
    }

    fn in_bounds(&self, off: usize, n: usize) -> bool {
        off.checked_add(n).is_some_and(|end| end <= self.len)
    }
}

// SAFETY: the mapping is plain shared memory; every access goes through
// bounds-checked volatile or atomic reads and writes, from any thread.
unsafe impl Send for MappedRegion {}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // Unguard first: the range is about to go.
        drop(self.guard.take());
        // SAFETY: exactly the mapping made in open().
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl RegionMemory for MappedRegion {
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self, off: usize, buf: &mut [u8]) {
        if !self.in_bounds(off, buf.len()) {
            buf.fill(0);
            return;
        }
        // Volatile: the producer writes this memory concurrently; we want
        // one real load per word, and validate what we got afterwards.
        // SAFETY: in bounds of the mapping (checked above).
        unsafe {
            let src = self.ptr.add(off);
            if off.is_multiple_of(8) && buf.len().is_multiple_of(8) {
                for (i, chunk) in buf.chunks_exact_mut(8).enumerate() {
                    let w = std::ptr::read_volatile(src.cast::<u64>().add(i));
                    chunk.copy_from_slice(&w.to_ne_bytes());
                }
            } else {
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = std::ptr::read_volatile(src.add(i));
                }
            }
        }
    }
    fn load_u64_acquire(&self, off: usize) -> u64 {
        if !self.in_bounds(off, 8) || !off.is_multiple_of(8) {
            return 0;
        }
        // SAFETY: aligned, in bounds; AtomicU64 has u64's layout.
        unsafe { (*self.ptr.add(off).cast::<AtomicU64>()).load(Ordering::Acquire) }
    }
    fn store_u64_release(&self, off: usize, v: u64) {
        if self.in_bounds(off, 8) && off.is_multiple_of(8) {
            // SAFETY: as above.
            unsafe { (*self.ptr.add(off).cast::<AtomicU64>()).store(v, Ordering::Release) }
        }
    }
    fn store_u32(&self, off: usize, v: u32) {
        if self.in_bounds(off, 4) && off.is_multiple_of(4) {
            // SAFETY: as above.
            unsafe { (*self.ptr.add(off).cast::<AtomicU32>()).store(v, Ordering::Release) }
        }
    }
    fn futex_wait(&self, off: usize, expected: u32, timeout: Duration) {
        if !(self.in_bounds(off, 4) && off.is_multiple_of(4)) {
            std::thread::sleep(timeout);
            return;
        }
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: an aligned word inside our own shared mapping; the kernel
        // only reads it (and the timespec) and returns EAGAIN, ETIMEDOUT,
        // EINTR or a wake, all of which the caller treats alike. Not
        // FUTEX_PRIVATE_FLAG: the waker is another process.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.ptr.add(off),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
                0usize,
                0u32,
            );
        }
    }
    fn cas_u32(&self, off: usize, old: u32, new: u32) -> bool {
        if !(self.in_bounds(off, 4) && off.is_multiple_of(4)) {
            return false;
        }
        // SAFETY: as above.
        unsafe {
            (*self.ptr.add(off).cast::<AtomicU32>())
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        }
    }
}

/// Counters of what a marker source saw go wrong.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MarkerStats {
    pub records: u64,
    pub ring_full: u64,
    pub corrupt_records: u64,
    pub ring_resyncs: u64,
    pub slots_exhausted: u64,
    /// Slot reads with an impossible `state`.
    pub bad_slot_states: u64,
    /// Records whose request started before the recording (left from before
    /// attach); skipped, not drops.
    pub before_start: u64,
    /// Records with TS_REC_TORN (written with counters_valid = false).
    pub torn: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct SlotTrack {
    tid: u32,
    dropped_baseline: u64,
    dropped_last: u64,
}

pub struct MarkerSource<M: RegionMemory> {
    mem: M,
    header: RegionHeader,
    agent_pid: u32,
    start_mono_ns: u64,
    slots: Vec<SlotTrack>,
    exhausted_baseline: u64,
    stats: MarkerStats,
    slot_buf: Vec<u8>,
    /// Most records the last drain took from one slot.
    busiest: usize,
    /// A run of records copied out of a ring.
    run_buf: Vec<u8>,
}

impl<M: RegionMemory> MarkerSource<M> {
    /// Validates the region and announces the agent in its header. Records
    /// that started before `start_mono_ns` are skipped.
    pub fn attach(
        mem: M,
        agent_pid: u32,
        sample_ppm_agent: Option<u32>,
        start_mono_ns: u64,
    ) -> Result<Self, AbiError> {
        let mut hdr = vec![0u8; REGION_HEADER_SIZE];
        mem.read(0, &mut hdr);
        let header = parse_region_header(&hdr, mem.len())?;
        // Whatever an earlier agent left (it may have been killed mid-window
        // or with an override) is reset.
        mem.store_u32(
            header_offsets::SAMPLE_PPM_AGENT,
            sample_ppm_agent.unwrap_or(0),
        );
        mem.store_u32(header_offsets::BURST_GATE, 0);
        mem.store_u32(header_offsets::SAMPLE_PPM_EFFECTIVE, 0);
        mem.store_u64_release(
            header_offsets::AGENT_HEARTBEAT_NS,
            crate::sys::monotonic_ns(),
        );
        mem.store_u32(header_offsets::AGENT_PID, agent_pid);
        let mut src = MarkerSource {
            exhausted_baseline: header.slots_exhausted,
            slots: vec![SlotTrack::default(); header.max_slots as usize],
            header,
            mem,
            agent_pid,
            start_mono_ns,
            stats: MarkerStats::default(),
            slot_buf: vec![0u8; SLOT_PRODUCER_BYTES],
            busiest: 0,
            run_buf: Vec::new(),
        };
        // Drops before attach are not this recording's.
        for i in 0..src.header.max_slots {
            src.mem.read(slot_offset(i), &mut src.slot_buf);
            if let Ok(s) = parse_slot(&src.slot_buf) {
                src.slots[i as usize] = SlotTrack {
                    tid: s.tid,
                    dropped_baseline: s.dropped_ring_full,
                    dropped_last: s.dropped_ring_full,
                };
            }
        }
        Ok(src)
    }

    pub fn header(&self) -> &RegionHeader {
        &self.header
    }

    /// The runtime's `TS_FEAT_*` as of now (they are set lazily).
    pub fn current_features(&self) -> u32 {
        self.mem.load_u32(header_offsets::FEATURES)
    }

    pub fn stats(&self) -> MarkerStats {
        self.stats
    }

    /// Most records the last [`drain`](Self::drain) took from one slot: how
    /// close the busiest ring came to full.
    pub fn last_busiest(&self) -> usize {
        self.busiest
    }

    /// Sleeps up to `timeout`, or until the target wakes the agent (ABI 5):
    /// a thread's ring reached TS_RING_WAKE_FILL records, or a thread
    /// exited with records in its ring. Returns at once when either is
    /// already so. The target controls the futex word and may wake the
    /// agent at any time or never: the caller bounds both (a floor between
    /// drains, and `timeout`).
    pub fn wait_for_records(&self, timeout: Duration) {
        let seen = self.mem.load_u32(header_offsets::DRAIN_FUTEX);
        self.mem.store_u32(header_offsets::DRAIN_WAITING, 1);
        // Dekker with the runtime (request.c ts_wake_agent): our store of
        // drain_waiting before our loads of the rings, its ring_head store
        // before its load of drain_waiting; one of us sees the other.
        fence(Ordering::SeqCst);
        if !self.records_waiting() {
            self.mem
                .futex_wait(header_offsets::DRAIN_FUTEX, seen, timeout);
        }
        self.mem.store_u32(header_offsets::DRAIN_WAITING, 0);
    }

    /// A live or exited thread's ring at least TS_RING_WAKE_FILL full, or
    /// an exited thread's ring not empty. A nonsensical fill (tail past
    /// head, more than the ring) is not a reason to stay awake: the drain
    /// resynchronises such a ring anyway. Bounded by max_slots; reads only.
    fn records_waiting(&self) -> bool {
        let used = self
            .mem
            .load_u32(header_offsets::SLOTS_USED)
            .min(self.header.max_slots);
        (0..used).any(|i| {
            let base = slot_offset(i);
            let state = self.mem.load_u32(base + slot_offsets::STATE);
            if state != TS_SLOT_LIVE && state != TS_SLOT_EXITED {
                return false;
            }
            let head = self.mem.load_u64_acquire(base + slot_offsets::RING_HEAD);
            let fill = head.wrapping_sub(self.mem.load_u64(base + slot_offsets::RING_TAIL));
            fill <= u64::from(TS_RING_CAPACITY)
                && (fill >= u64::from(TS_RING_WAKE_FILL) || (fill != 0 && state == TS_SLOT_EXITED))
        })
    }

    fn refresh_header(&mut self) {
        let kinds_count = self.mem.load_u32(header_offsets::KINDS_COUNT);
        if kinds_count != self.header.kinds_count {
            let mut hdr = vec![0u8; REGION_HEADER_SIZE];
            self.mem.read(0, &mut hdr);
            self.header.kinds = parse_kinds_table(&hdr);
            self.header.kinds_count = kinds_count.min(self.header.kinds.len() as u32);
        }
        let exhausted = self.mem.load_u64(header_offsets::SLOTS_EXHAUSTED);
        self.stats.slots_exhausted = exhausted.saturating_sub(self.exhausted_baseline);
    }

    /// Drains every live or exited slot once; calls `emit(record, kind)`
    /// for each valid record. Bounded: at most `max_slots × capacity` records.
    pub fn drain<E>(&mut self, mut emit: E) -> Result<usize, E::Error>
    where
        E: Emit,
    {
        self.refresh_header();
        // Alive and draining (abi.h agent_heartbeat_ns).
        self.mem.store_u64_release(
            header_offsets::AGENT_HEARTBEAT_NS,
            crate::sys::monotonic_ns(),
        );
        let mut n = 0;
        // Taken out of self for the loop (take_record borrows self).
        let mut run_buf = std::mem::take(&mut self.run_buf);
        self.busiest = 0;
        // Slots are claimed in order up to the slots_used high-water mark
        // (recycling reuses them): none above it has ever held a thread.
        // The target may lie about it, but only to hide its own records.
        let used = self
            .mem
            .load_u32(header_offsets::SLOTS_USED)
            .min(self.header.max_slots);
        for i in 0..used {
            let base = slot_offset(i);
            self.mem.read(base, &mut self.slot_buf);
            let slot = match parse_slot(&self.slot_buf) {
                Ok(s) => s,
                Err(_) => {
                    self.stats.bad_slot_states += 1;
                    continue;
                }
            };
            self.track_drops(i as usize, slot.tid, slot.dropped_ring_full);
            if !slot.drainable() {
                continue;
            }
            let head = self.mem.load_u64_acquire(base + slot_offsets::RING_HEAD);
            let plan = plan_drain(head, slot.ring_tail, TS_RING_CAPACITY);
            if plan.resync {
                self.stats.ring_resyncs += 1;
            }
            self.busiest = self.busiest.max(plan.count as usize);
            // The records are copied out in runs (at most two: the ring
            // wraps once), one sequential read each, which the hardware
            // prefetches: they were written on another CPU, and a record at
            // a time cost a cache miss or two per record.
            let mut k = 0;
            while k < plan.count {
                let first = plan.ring_index(k, TS_RING_CAPACITY);
                let run = (plan.count - k).min(TS_RING_CAPACITY - first);
                let bytes = run as usize * RECORD_SIZE;
                run_buf.resize(bytes.max(run_buf.len()), 0);
                self.mem
                    .read(base + record_offset_in_slot(first), &mut run_buf[..bytes]);
                k += run;
                for rec in run_buf[..bytes].chunks_exact(RECORD_SIZE) {
                    match self.take_record(rec, slot.tid, &mut emit) {
                        Ok(m) => n += m,
                        Err(e) => {
                            self.run_buf = run_buf;
                            return Err(e);
                        }
                    }
                }
            }
            // The records are copied: hand the space back to the producer.
            fence(Ordering::Release);
            self.mem
                .store_u64_release(base + slot_offsets::RING_TAIL, plan.new_tail);
        }
        self.run_buf = run_buf;
        self.sum_drops();
        Ok(n)
    }

    /// Parses, checks and emits one record copied out of a ring; 1 if it
    /// was emitted.
    fn take_record<E: Emit>(
        &mut self,
        rec_buf: &[u8],
        slot_tid: u32,
        emit: &mut E,
    ) -> Result<usize, E::Error> {
        let Ok(mut r) = parse_record(rec_buf) else {
            self.stats.corrupt_records += 1;
            return Ok(0);
        };
        if crate::recorder::keep_record(&mut r, Some(slot_tid)).is_err() {
            self.stats.corrupt_records += 1;
            return Ok(0);
        }
        if r.start_ns < self.start_mono_ns {
            self.stats.before_start += 1;
            return Ok(0);
        }
        if r.flags & (TS_REC_COUNTERS | TS_REC_TORN) == TS_REC_COUNTERS | TS_REC_TORN {
            self.stats.torn += 1;
        }
        let kind = self
            .header
            .kinds
            .get(r.kind as usize)
            .map_or("", String::as_str);
        emit.emit(&r, kind)?;
        self.stats.records += 1;
        Ok(1)
    }

    fn track_drops(&mut self, i: usize, tid: u32, dropped: u64) {
        let t = &mut self.slots[i];
        if tid != t.tid || dropped < t.dropped_last {
            // A new thread in this slot (or the counter was reset): all its
            // drops happened during the recording.
            *t = SlotTrack {
                tid,
                dropped_baseline: 0,
                dropped_last: dropped,
            };
        } else {
            t.dropped_last = dropped;
        }
    }

    /// Drops of every slot's threads since attach (after a drain's
    /// track_drops calls, once per drain rather than once per slot).
    fn sum_drops(&mut self) {
        self.stats.ring_full = self
            .slots
            .iter()
            .map(|s| s.dropped_last.saturating_sub(s.dropped_baseline))
            .fold(0u64, u64::saturating_add);
    }

    /// Leaves the header as it was before attach: no agent, no override,
    /// no burst windows.
    /// Only while this agent still owns the region: another may have taken
    /// it over (after deciding this one was gone), and its settings stay.
    pub fn detach(&mut self) {
        if self.mem.load_u32(header_offsets::AGENT_PID) != self.agent_pid {
            return;
        }
        self.mem.store_u32(header_offsets::SAMPLE_PPM_EFFECTIVE, 0);
        self.mem.store_u32(header_offsets::SAMPLE_PPM_AGENT, 0);
        self.mem.store_u32(header_offsets::BURST_GATE, 0);
        self.mem
            .store_u64_release(header_offsets::AGENT_HEARTBEAT_NS, 0);
        self.mem
            .cas_u32(header_offsets::AGENT_PID, self.agent_pid, 0);
    }

    /// Slots with a sampled request in progress (`cur_active`), read
    /// without the seqlock: a count for burst sampling's closing wait.
    pub fn sampled_in_progress(&self) -> usize {
        let used = self
            .mem
            .load_u32(header_offsets::SLOTS_USED)
            .min(self.header.max_slots);
        (0..used)
            .filter(|&i| {
                self.mem.load_u32(
                    slot_offset(i)
                        + std::mem::offset_of!(tailscope_abi::ts_thread_slot, cur_active),
                ) == 1
            })
            .count()
    }

    /// Burst sampling: the header's `burst_gate` (`TS_BURST_*`).
    pub fn set_burst_gate(&mut self, v: u32) {
        self.mem.store_u32(header_offsets::BURST_GATE, v);
    }

    /// Overrides the runtime's sampling rate (e.g. the in-window rate).
    pub fn set_sample_ppm(&mut self, ppm: u32) {
        self.mem.store_u32(header_offsets::SAMPLE_PPM_AGENT, ppm);
    }

    /// The overall rate while burst windows run (0: no bursts), for the
    /// target's tailscope_sample_ppm().
    pub fn set_effective_ppm(&mut self, ppm: u32) {
        self.mem
            .store_u32(header_offsets::SAMPLE_PPM_EFFECTIVE, ppm);
    }
}

/// Where drained records go.
pub trait Emit {
    type Error;
    fn emit(&mut self, r: &ts_request_record, kind: &str) -> Result<(), Self::Error>;
}

impl<F, Er> Emit for F
where
    F: FnMut(&ts_request_record, &str) -> Result<(), Er>,
{
    type Error = Er;
    fn emit(&mut self, r: &ts_request_record, kind: &str) -> Result<(), Er> {
        self(r, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::time::Instant;

    /// Pids of two processes that have exited (reaped).
    /// Held by the tests that put region files of dead pids in the real
    /// region directory: the sweep test's sweep removes any such file that
    /// is not mapped yet, including another test's (a flake seen once in
    /// ~20 runs of the futex test).
    static REGION_DIR: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn dead_pids() -> (u32, u32) {
        let mut a = std::process::Command::new("true").spawn().unwrap();
        let mut b = std::process::Command::new("true").spawn().unwrap();
        a.wait().unwrap();
        b.wait().unwrap();
        (a.id(), b.id())
    }

    #[test]
    fn stale_regions_of_exited_processes_are_swept() {
        let _dir = REGION_DIR.lock().unwrap_or_else(|p| p.into_inner());
        let (gone, mapped) = dead_pids();
        let live = std::process::id();
        let paths: Vec<PathBuf> = [gone, mapped, live]
            .iter()
            .map(|p| MappedRegion::path(*p))
            .collect();
        if paths.iter().any(|p| p.exists()) {
            eprintln!("SKIP: a region of these pids exists already");
            return;
        }
        for p in &paths {
            std::fs::write(p, [0u8; 4096]).unwrap();
        }
        // a region some process still maps (another pid namespace, say)
        let f = std::fs::File::open(&paths[1]).unwrap();
        // SAFETY: a fresh read-only shared mapping of a 4 KiB file.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(m, libc::MAP_FAILED);
        let n = sweep_stale_regions();
        let exists: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(m, 4096) };
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
        assert!(n >= 1);
        assert_eq!(
            exists,
            [false, true, true],
            "only the unmapped region of the exited pid goes"
        );
    }
    use tailscope_abi::{synth, TS_REC_SAMPLED, TS_SLOT_EXITED, TS_SLOT_LIVE};

    /// What keeps the agent awake: a quarter-full ring, an exited thread's
    /// records; not fewer records, nor a corrupt ring.
    #[test]
    fn records_waiting_wants_a_quarter_full_ring_or_an_exited_threads_records() {
        let mut b = synth::region(4, 99);
        synth::claim_slot(&mut b, 0, 100, TS_SLOT_LIVE);
        synth::claim_slot(&mut b, 1, 101, TS_SLOT_EXITED);
        let src = MarkerSource::attach(RefCell::new(b), 7, None, 0).unwrap();
        assert!(!src.records_waiting(), "empty");
        for i in 1..u64::from(TS_RING_WAKE_FILL) {
            synth::push_record(&mut src.mem.borrow_mut(), 0, &rec(100, i));
        }
        assert!(!src.records_waiting(), "a live ring one short of the mark");
        synth::push_record(&mut src.mem.borrow_mut(), 0, &rec(100, 999));
        assert!(src.records_waiting(), "a live ring at the mark");
        let base = slot_offset(0);
        let head = src.mem.load_u64(base + slot_offsets::RING_HEAD);
        src.mem
            .store_u64_release(base + slot_offsets::RING_TAIL, head);
        assert!(!src.records_waiting(), "drained");
        src.mem
            .store_u64_release(base + slot_offsets::RING_TAIL, head + 1000);
        assert!(
            !src.records_waiting(),
            "a tail past the head is no reason to wake"
        );
        src.mem
            .store_u64_release(base + slot_offsets::RING_TAIL, head);
        synth::push_record(&mut src.mem.borrow_mut(), 1, &rec(101, 1));
        assert!(src.records_waiting(), "one record of an exited thread");
        src.mem.store_u32(slot_offset(1) + slot_offsets::STATE, 7);
        assert!(!src.records_waiting(), "a slot in no known state");
    }

    /// ABI 5: the agent sleeps on the header's futex word and the target
    /// wakes it through its own mapping of the region (another process in
    /// real life; here another mapping, which needs the shared futex key).
    #[test]
    fn the_target_wakes_a_waiting_agent_through_the_drain_futex() {
        let _dir = REGION_DIR.lock().unwrap_or_else(|p| p.into_inner());
        let (pid, full_pid) = dead_pids();
        let (path, full_path) = (MappedRegion::path(pid), MappedRegion::path(full_pid));
        if path.exists() || full_path.exists() {
            eprintln!("SKIP: a region of these pids exists already");
            return;
        }
        let mut b = synth::region(4, pid);
        synth::claim_slot(&mut b, 0, 100, TS_SLOT_LIVE);
        std::fs::write(&path, &b).unwrap();
        let mut full = synth::region(4, full_pid);
        synth::claim_slot(&mut full, 0, 100, TS_SLOT_LIVE);
        for i in 0..u64::from(TS_RING_WAKE_FILL) {
            synth::push_record(&mut full, 0, &rec(100, i + 1));
        }
        std::fs::write(&full_path, &full).unwrap();
        let cleanup = || {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(&full_path);
        };
        let agent = MarkerSource::attach(MappedRegion::open(pid).unwrap(), 7, None, 0).unwrap();
        let target = MappedRegion::open(pid).unwrap();

        // Nothing waiting: sleeps the whole timeout, and is awake after it.
        let t0 = Instant::now();
        agent.wait_for_records(Duration::from_millis(30));
        let slept = t0.elapsed();
        let waiting_after = agent.mem.load_u32(header_offsets::DRAIN_WAITING);

        // The target's side of request.c ts_wake_agent, from another thread
        // through another mapping, 50 ms into a 20 s wait.
        let waker = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while target.load_u32(header_offsets::DRAIN_WAITING) == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(50));
            assert!(
                target.cas_u32(header_offsets::DRAIN_WAITING, 1, 0),
                "agent waits"
            );
            let v = target.load_u32(header_offsets::DRAIN_FUTEX);
            target.store_u32(header_offsets::DRAIN_FUTEX, v + 1);
            // SAFETY: an aligned word of the test's own shared mapping.
            unsafe {
                let word = target.ptr.add(header_offsets::DRAIN_FUTEX);
                libc::syscall(
                    libc::SYS_futex,
                    word,
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    0usize,
                    0usize,
                    0u32,
                )
            }
        });
        let t1 = Instant::now();
        agent.wait_for_records(Duration::from_secs(20));
        let woken = t1.elapsed();
        let woke = waker.join();

        // A ring already a quarter full: no sleep at all.
        let full_agent =
            MarkerSource::attach(MappedRegion::open(full_pid).unwrap(), 7, None, 0).unwrap();
        let t2 = Instant::now();
        full_agent.wait_for_records(Duration::from_secs(20));
        let immediate = t2.elapsed();
        cleanup();

        assert!(slept >= Duration::from_millis(30), "slept {slept:?}");
        assert_eq!(waiting_after, 0, "drain_waiting is cleared on waking");
        woke.unwrap();
        assert!(
            woken >= Duration::from_millis(40) && woken < Duration::from_secs(10),
            "woken after {woken:?}"
        );
        assert!(immediate < Duration::from_secs(5), "{immediate:?}");
    }

    fn rec(tid: u32, id: u64) -> ts_request_record {
        ts_request_record {
            request_id: id,
            start_ns: 1_000_000 + id,
            latency_ns: 10_000,
            tid,
            kind: 1,
            flags: TS_REC_SAMPLED | TS_REC_COUNTERS,
            oncpu_ns: 9_000,
            ..Default::default()
        }
    }

    fn drain_all(src: &mut MarkerSource<RefCell<Vec<u8>>>) -> Vec<(ts_request_record, String)> {
        let mut out = vec![];
        src.drain(|r: &ts_request_record, k: &str| {
            out.push((*r, k.to_string()));
            Ok::<(), ()>(())
        })
        .unwrap();
        out
    }

    #[test]
    fn drains_live_and_exited_slots() {
        let mut b = synth::region(4, 99);
        synth::set_kind(&mut b, 1, "GET");
        synth::claim_slot(&mut b, 0, 100, TS_SLOT_LIVE);
        synth::claim_slot(&mut b, 2, 102, TS_SLOT_EXITED);
        // Left over from before the recording: skipped.
        let mut old = rec(100, 0);
        old.start_ns = 10;
        synth::push_record(&mut b, 0, &old);
        for i in 1..=5 {
            synth::push_record(&mut b, 0, &rec(100, i));
        }
        synth::push_record(&mut b, 2, &rec(102, 50));
        let mem = RefCell::new(b);
        let mut src = MarkerSource::attach(mem, 7, Some(20_000), 1_000).unwrap();
        assert_eq!(
            src.mem.load_u32(header_offsets::AGENT_PID),
            7,
            "agent announced"
        );
        assert_eq!(src.mem.load_u32(header_offsets::SAMPLE_PPM_AGENT), 20_000);
        let out = drain_all(&mut src);
        assert_eq!(out.len(), 6);
        assert_eq!(out[0].1, "GET");
        assert_eq!(src.stats().before_start, 1);
        // Tail advanced: a second drain finds nothing.
        assert!(drain_all(&mut src).is_empty());
        // Ring wrap: more than a ring's worth in two steps.
        for i in 0..TS_RING_CAPACITY as u64 {
            synth::push_record(&mut src.mem.borrow_mut(), 0, &rec(100, 100 + i));
        }
        assert!(!synth::push_record(
            &mut src.mem.borrow_mut(),
            0,
            &rec(100, 9999)
        ));
        // Across the wrap (the ring starts 6 records in): every record, in
        // order, none twice (a wrong offset in the second run would repeat
        // or skip ids).
        let ids: Vec<u64> = drain_all(&mut src)
            .iter()
            .map(|(r, _)| r.request_id)
            .collect();
        let want: Vec<u64> = (0..TS_RING_CAPACITY as u64).map(|i| 100 + i).collect();
        assert_eq!(ids, want);
        assert_eq!(src.stats().ring_full, 1);
        assert!(
            src.mem.load_u64(header_offsets::AGENT_HEARTBEAT_NS) > 0,
            "heartbeat"
        );
        src.set_effective_ppm(10_000);
        assert_eq!(
            src.mem.load_u32(header_offsets::SAMPLE_PPM_EFFECTIVE),
            10_000
        );
        src.detach();
        assert_eq!(src.mem.load_u32(header_offsets::AGENT_PID), 0);
        assert_eq!(src.mem.load_u32(header_offsets::SAMPLE_PPM_AGENT), 0);
        assert_eq!(src.mem.load_u32(header_offsets::SAMPLE_PPM_EFFECTIVE), 0);
        assert_eq!(src.mem.load_u64(header_offsets::AGENT_HEARTBEAT_NS), 0);
    }

    #[test]
    fn hostile_region_is_counted_not_fatal() {
        let mut b = synth::region(3, 99);
        synth::claim_slot(&mut b, 0, 100, TS_SLOT_LIVE);
        synth::claim_slot(&mut b, 1, 101, TS_SLOT_LIVE);
        synth::claim_slot(&mut b, 2, 102, TS_SLOT_LIVE);
        // Kinds table with garbage: no NULs, escape sequences, bad UTF-8.
        let k = header_offsets::KINDS;
        b[k..k + 24 * 64].fill(0xff);
        b[k + 24..k + 30].copy_from_slice(b"\x1b[2J\xc3(");
        synth::write_u64(&mut b, header_offsets::KINDS_COUNT, u32::MAX as u64);
        // Slot 0: head far ahead of tail. Slot 1: head behind tail.
        synth::write_u64(
            &mut b,
            slot_offset(0) + slot_offsets::RING_HEAD,
            u64::MAX - 3,
        );
        synth::write_u64(&mut b, slot_offset(1) + slot_offsets::RING_TAIL, 50);
        synth::write_u64(&mut b, slot_offset(1) + slot_offsets::RING_HEAD, 10);
        // Slot 2: absurd records among good ones.
        let mut absurd = rec(102, 1);
        absurd.latency_ns = u64::MAX;
        synth::push_record(&mut b, 2, &absurd);
        let mut wrong_tid = rec(555, 2);
        wrong_tid.kind = 1;
        synth::push_record(&mut b, 2, &wrong_tid);
        let mut too_much_cpu = rec(102, 3);
        too_much_cpu.oncpu_ns = 1 << 40;
        synth::push_record(&mut b, 2, &too_much_cpu);
        synth::push_record(&mut b, 2, &rec(102, 4));
        let mem = RefCell::new(b);
        let mut src = MarkerSource::attach(mem, 7, None, 0).unwrap();
        let out = drain_all(&mut src);
        // The record with impossible counters keeps its latency, loses its
        // counters; the absurd and foreign ones are dropped and counted.
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|o| o.1.chars().all(|c| !c.is_control())));
        let kept: Vec<_> = out.iter().filter(|o| o.0.request_id == 3).collect();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].0.flags & tailscope_abi::TS_REC_COUNTERS, 0);
        let s = src.stats();
        assert_eq!(s.ring_resyncs, 2);
        assert_eq!(s.corrupt_records, 2);
        // Resynced: the next drain is clean.
        assert!(drain_all(&mut src).is_empty());
        assert_eq!(src.stats().ring_resyncs, 2);
        // A bad slot state is counted and skipped.
        src.mem.store_u32(slot_offset(0) + slot_offsets::STATE, 77);
        drain_all(&mut src);
        assert_eq!(src.stats().bad_slot_states, 1);
    }

    #[test]
    fn incompatible_region_is_refused() {
        let mut b = synth::region(2, 1);
        b[8..12].copy_from_slice(&(tailscope_abi::TS_ABI_VERSION + 1).to_le_bytes());
        let e = MarkerSource::attach(RefCell::new(b), 7, None, 0)
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "ABI version mismatch: region has {}, agent supports {}",
                tailscope_abi::TS_ABI_VERSION + 1,
                tailscope_abi::TS_ABI_VERSION
            )
        );
        // Shorter than its max_slots promise.
        let mut b = synth::region(4, 1);
        b.truncate(b.len() - 1);
        assert!(MarkerSource::attach(RefCell::new(b), 7, None, 0).is_err());
    }
}
