//! The LDB observer: a Shim-style loop (Shim ch. 3) that scans the target's
//! shadow stacks and drains its event rings, on its own thread.
//!
//! Each pass visits every claimed slot:
//! - **fast path**: the stack's version — `gen` and `depth`: a push changes
//!   `gen`, a plain pop only `depth` (runtime/src/shadow.c) — equals the one
//!   of the last accepted walk — nothing changed, two loads, no clock, no
//!   copy;
//! - **invalid**: `gen` is odd — the owner is mid-update; look next pass;
//! - **full walk**: clock `Cs`, copy the head and the stored frames (bounded
//!   by `TS_SHADOW_DEPTH` whatever `depth` says), re-read `gen`, clock `Ce`.
//!   A changed `gen` is a **seqlock discard**. Then Shim's double-time error
//!   filter (§3.4.1): with the previous walk of this thread at
//!   (`Cs'`, `Ce'`), the walk is kept only if `(Ce − Ce') / (Cs − Cs')` is
//!   within `1 ± tolerance`; otherwise its observation window was skewed
//!   (the observer was descheduled mid-walk, say) and it is a **DTE
//!   discard**. Discarded walks are retried on the next pass, so a change
//!   is delayed, never lost.
//!
//! An accepted walk is diffed against the thread's tracked frames: frames
//! are the same call when their id (the gen at entry), function and call
//! site match. Tracked frames past the common prefix have returned: each
//! becomes a FUNCTION row, timed from when it was first seen (or its exact
//! entry stamp, with TAILSCOPE_FN_CLOCK=1) to `Cs` of this walk. Both ends
//! carry the same bias, so a latency's error is within one scan interval.
//!
//! Nothing read from the region is followed as a pointer: function, call
//! site, mutex and queue addresses are copied as numbers. Every count is
//! clamped, every offset bounds-checked by the [`RegionMemory`] reader.

use std::path::Path;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tailscope_abi::region::{header_offsets, plan_drain, slot_offset, slot_offsets};
use tailscope_abi::shadow::{
    common_prefix, event_name, event_offset_in_slot, is_lock_event, ldb_offsets, parse_event,
    parse_frames, parse_shadow_head, stored_frames, validate_event, SHADOW_HEAD_BYTES,
};
use tailscope_abi::{
    ts_frame, EVENT_SIZE, FRAME_SIZE, TS_EVENT_RING_CAPACITY, TS_LDB_LOCKS, TS_LDB_REQUESTS,
    TS_LDB_SLOTS, TS_SHADOW_DEPTH, TS_SLOT_EXITED, TS_SLOT_FREE, TS_SLOT_LIVE,
};

use crate::error::Result;
use crate::region::RegionMemory;
use crate::table::{Cell, TableWriter};
use crate::writer::WriterSummary;

/// The `functions` table (pinned to schema/recording.json by a test).
pub const FUNCTION_COLUMNS: &[(&str, &str)] = &[
    ("tid", "uint32"),
    ("fn_addr", "uint64"),
    ("call_site", "uint64"),
    ("parent_fn", "uint64"),
    ("depth", "uint32"),
    ("start_ns", "uint64"),
    ("latency_ns", "uint64"),
    ("start_exact", "bool"),
    ("error_bound_ns", "uint64"),
];

/// The `locks` table: MUTEX_WAIT / MUTEX_LOCK / MUTEX_UNLOCK events.
pub const LOCK_COLUMNS: &[(&str, &str)] = &[
    ("ts_ns", "uint64"),
    ("tid", "uint32"),
    ("event", "string"),
    ("mutex", "uint64"),
];

/// The `request_events` table: REQ_START / REQ_BLOCK / REQ_END / REQ_END_ALL.
pub const REQUEST_EVENT_COLUMNS: &[(&str, &str)] = &[
    ("ts_ns", "uint64"),
    ("tid", "uint32"),
    ("event", "string"),
    ("request_id", "uint64"),
    ("queue", "uint64"),
];

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObserverConfig {
    /// Time between the starts of two passes; zero busy-polls.
    pub period: Duration,
    /// Run the observer thread under SCHED_IDLE: it gets only CPU time no
    /// other thread wants, and any waking thread preempts it at once.
    pub idle_priority: bool,
    /// FUNCTION rows only for calls at least this long (0: every call seen).
    pub threshold_ns: u64,
    /// DTE tolerance: keep a walk when its clock ratio is within 1 ± this.
    pub dte_tolerance: f64,
    /// Lock events when a wait or a hold exceeds this (written to the header).
    pub mutex_thresh_ns: u64,
}

impl Default for ObserverConfig {
    fn default() -> Self {
        // A pass every millisecond at idle priority (bench/ldb,
        // docs/ldb.md). Busy-polling, even at SCHED_IDLE, keeps a CPU busy
        // that would otherwise sleep: in a VM the host then takes that
        // vCPU away for milliseconds at a time, and whatever the guest
        // wakes on it next (the target, its clients) waits. A pass per
        // millisecond costs the machine ~0.5% of a CPU. Busy-polling
        // (`--fn-period-us 0`) is for a spare core.
        ObserverConfig {
            period: Duration::from_millis(1),
            idle_priority: true,
            threshold_ns: 0,
            dte_tolerance: 0.01,
            mutex_thresh_ns: DEFAULT_MUTEX_THRESH_NS,
        }
    }
}

/// The agent's lock-event threshold, written to the header (the runtime's
/// own default, TS_MUTEX_THRESH_NS, is the same 1 us; LDB's
/// MUTEX_EVENT_THRESH). With instrumented code inside critical sections
/// many holds pass 1 us (memcached at 44k SET/s: ~57k lock events a
/// second); `--mutex-threshold-us 10` logs ~2k (bench/ldb, docs/ldb.md).
pub const DEFAULT_MUTEX_THRESH_NS: u64 = 1_000;

/// A throttled observer whose passes find nothing new backs off to this
/// many periods between passes (an idle target costs few wake-ups; the
/// first change after a quiet spell is seen up to this many periods late,
/// which the error bounds of the calls it starts carry).
pub const IDLE_BACKOFF: u32 = 2;

/// Buckets of the pass-period histogram: bucket `i` counts periods in
/// `[2^i, 2^(i+1))` ns (bucket 0 also takes 0).
pub const PERIOD_BUCKETS: usize = 40;

/// What the observer saw and did; goes to meta.json (`ldb.observer`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ObserverStats {
    pub passes: u64,
    /// Slot checks whose gen had not changed.
    pub fast_path: u64,
    /// Accepted walks.
    pub full_walks: u64,
    /// Checks that found a writer mid-update (gen odd).
    pub invalid: u64,
    /// Walks whose gen changed while copying (torn, discarded).
    pub seqlock_discards: u64,
    /// Walks discarded by the double-time error filter.
    pub dte_discards: u64,
    pub functions: u64,
    /// Calls seen to end but shorter than the threshold (not written).
    pub below_threshold: u64,
    /// Calls still on a stack when its thread exited or the recording ended.
    pub unterminated: u64,
    /// Calls deeper than TS_SHADOW_DEPTH (counted by the runtime).
    pub truncated: u64,
    /// Frames the runtime dropped to resynchronise (longjmp, exceptions).
    pub resyncs: u64,
    /// Calls the runtime did not push because a signal handler interrupted
    /// one of its hooks mid-update (counted by the runtime; never seen).
    pub skipped: u64,
    pub lock_events: u64,
    pub request_events: u64,
    /// Events the runtime lost to a full event ring.
    pub event_ring_full: u64,
    pub corrupt_events: u64,
    pub event_ring_resyncs: u64,
    pub threads_seen: u64,
    pub max_depth_seen: u32,
    /// `period_hist_ns[i]` = passes whose period was in [2^i, 2^(i+1)) ns.
    pub period_hist_ns: Vec<u64>,
    pub period_p50_ns: u64,
    pub period_p99_ns: u64,
    pub period_max_ns: u64,
    /// The observer thread's scheduling: "idle" (SCHED_IDLE), "normal", or
    /// "normal (SCHED_IDLE refused: ...)".
    pub scheduling: String,
}

impl Default for ObserverStats {
    fn default() -> Self {
        ObserverStats {
            passes: 0,
            fast_path: 0,
            full_walks: 0,
            invalid: 0,
            seqlock_discards: 0,
            dte_discards: 0,
            functions: 0,
            below_threshold: 0,
            unterminated: 0,
            truncated: 0,
            resyncs: 0,
            skipped: 0,
            lock_events: 0,
            request_events: 0,
            event_ring_full: 0,
            corrupt_events: 0,
            event_ring_resyncs: 0,
            threads_seen: 0,
            max_depth_seen: 0,
            period_hist_ns: vec![0; PERIOD_BUCKETS],
            period_p50_ns: 0,
            period_p99_ns: 0,
            period_max_ns: 0,
            scheduling: "normal".into(),
        }
    }
}

/// Upper edge of the histogram bucket holding quantile `q` of the periods.
fn hist_quantile(hist: &[u64], q: f64) -> u64 {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return 0;
    }
    let want = (q * total as f64).ceil().max(1.0) as u64;
    let mut acc = 0;
    for (i, &n) in hist.iter().enumerate() {
        acc += n;
        if acc >= want {
            return 1u64 << (i + 1).min(63);
        }
    }
    u64::MAX
}

/// One FUNCTION row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionRow {
    pub tid: u32,
    pub fn_addr: u64,
    pub call_site: u64,
    pub parent_fn: u64,
    pub depth: u32,
    pub start_ns: u64,
    pub latency_ns: u64,
    pub start_exact: bool,
    /// |latency − true latency| ≤ this: the observer's gaps at the start and
    /// the end (the scan intervals in which the frame appeared and vanished).
    pub error_bound_ns: u64,
}

#[derive(Debug, Clone, Copy)]
struct Tracked {
    f: ts_frame,
    first_seen: u64,
    /// How late `first_seen` can be: since the state was last confirmed.
    start_gap: u64,
}

#[derive(Debug, Default)]
struct Track {
    tid: u32,
    /// (gen, depth) of the last accepted walk.
    last_version: Option<(u64, u32)>,
    /// When the tracked frames were last known to be the thread's stack.
    confirmed_ns: u64,
    /// An exited thread whose final stack has been read.
    retired: bool,
    frames: Vec<Tracked>,
    prev: Option<(u64, u64)>,
    truncated: (u64, u64),
    resyncs: (u64, u64),
    skipped: (u64, u64),
    ev_dropped: (u64, u64),
}

impl Track {
    fn delta(p: (u64, u64)) -> u64 {
        p.1.saturating_sub(p.0)
    }
}

/// What a walk of one slot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    Unchanged,
    Busy,
    Discarded,
    Accepted,
}

/// Accepts an event time when it lies within an hour of the recording.
const EVENT_TIME_SLACK_NS: u64 = 3_600 * 1_000_000_000;

pub struct Observer<M: RegionMemory> {
    mem: M,
    cfg: ObserverConfig,
    max_slots: u32,
    start_mono_ns: u64,
    tracks: Vec<Track>,
    stats: ObserverStats,
    prev_pass_ns: Option<u64>,
    pass_ns: u64,
    /// The current pass found something new (see [`Observer::pass`]).
    changed: bool,
    before_pass_ns: u64,
    head_buf: Vec<u8>,
    frames_buf: Vec<u8>,
    new_frames: Vec<ts_frame>,
    ev_buf: [u8; EVENT_SIZE],
    /// Output of the passes so far, taken by the caller.
    pub functions: Vec<FunctionRow>,
    pub lock_events: Vec<(u64, u32, &'static str, u64)>,
    pub request_events: Vec<(u64, u32, &'static str, u64, u64)>,
}

impl<M: RegionMemory> Observer<M> {
    /// `max_slots` comes from the validated region header. Announces the
    /// recording to the runtime (ldb_flags, the mutex threshold).
    pub fn new(mem: M, max_slots: u32, cfg: ObserverConfig, start_mono_ns: u64) -> Self {
        mem.store_u64_release(header_offsets::MUTEX_THRESH_NS, cfg.mutex_thresh_ns);
        // Diagnostic knob (bench/docs), like the BPF programs':
        // TAILSCOPE_DEBUG_SKIP=ldb-locks leaves the lock shim off.
        let skip_locks = std::env::var("TAILSCOPE_DEBUG_SKIP")
            .is_ok_and(|v| v.split(',').any(|p| p.trim() == "ldb-locks"));
        let locks = if skip_locks { 0 } else { TS_LDB_LOCKS };
        mem.store_u32(
            header_offsets::LDB_FLAGS,
            locks | TS_LDB_REQUESTS | TS_LDB_SLOTS,
        );
        let mut tracks = Vec::new();
        tracks.resize_with(max_slots as usize, Track::default);
        Observer {
            mem,
            cfg,
            max_slots,
            start_mono_ns,
            tracks,
            stats: ObserverStats::default(),
            prev_pass_ns: None,
            pass_ns: 0,
            changed: false,
            before_pass_ns: 0,
            head_buf: vec![0u8; SHADOW_HEAD_BYTES],
            frames_buf: vec![0u8; TS_SHADOW_DEPTH as usize * FRAME_SIZE],
            new_frames: Vec::with_capacity(TS_SHADOW_DEPTH as usize),
            ev_buf: [0u8; EVENT_SIZE],
            functions: Vec::new(),
            lock_events: Vec::new(),
            request_events: Vec::new(),
        }
    }

    pub fn stats(&self) -> &ObserverStats {
        &self.stats
    }

    /// The runtime stops logging lock and request events.
    pub fn detach(&self) {
        self.mem.store_u32(header_offsets::LDB_FLAGS, 0);
    }

    /// One pass over every claimed slot. `clock` returns CLOCK_MONOTONIC ns.
    /// Returns whether it found anything new: a changed or busy stack, an
    /// event, a thread that came or went (a throttled observer backs off
    /// while nothing changes).
    pub fn pass(&mut self, clock: &mut dyn FnMut() -> u64) -> bool {
        self.changed = false;
        let t = clock();
        self.before_pass_ns = self.prev_pass_ns.unwrap_or(self.start_mono_ns.min(t));
        self.pass_ns = t;
        if let Some(p) = self.prev_pass_ns {
            let period = t.saturating_sub(p);
            let b = (63 - period.max(1).leading_zeros() as usize).min(PERIOD_BUCKETS - 1);
            self.stats.period_hist_ns[b] += 1;
            self.stats.period_max_ns = self.stats.period_max_ns.max(period);
        }
        self.prev_pass_ns = Some(t);
        self.stats.passes += 1;
        let used = self
            .mem
            .load_u32(header_offsets::SLOTS_USED)
            .min(self.max_slots);
        for i in 0..used {
            self.visit(i, clock);
        }
        self.changed
    }

    fn visit(&mut self, i: u32, clock: &mut dyn FnMut() -> u64) {
        let base = slot_offset(i);
        let state = self.mem.load_u32(base + slot_offsets::STATE);
        let tid = self.mem.load_u32(base + slot_offsets::TID);
        let live = state == TS_SLOT_LIVE;
        if !(live || state == TS_SLOT_EXITED) {
            if self.tracks[i as usize].tid != 0 {
                self.changed = true;
                self.end_thread(i);
            }
            return;
        }
        if self.tracks[i as usize].tid != tid {
            self.changed = true;
            self.end_thread(i);
            let (trunc, resync, skip) = self.read_head(base);
            let drop0 = self.mem.load_u64(base + ldb_offsets::EV_DROPPED);
            let t = &mut self.tracks[i as usize];
            t.tid = tid;
            t.truncated = (trunc, trunc);
            t.resyncs = (resync, resync);
            t.skipped = (skip, skip);
            t.ev_dropped = (drop0, drop0);
            // Not this thread's slot at the previous pass: its calls began since.
            t.confirmed_ns = self.before_pass_ns;
            self.stats.threads_seen += 1;
        }
        self.drain_events(i, tid);
        if self.tracks[i as usize].retired {
            self.hand_back(i, base);
            return;
        }
        let walk = self.walk(i, base, clock);
        self.changed |= walk != Walk::Unchanged;
        if !live && matches!(walk, Walk::Unchanged | Walk::Accepted) {
            // Exited: its stack is final. Calls still on it never ended in view.
            let (trunc, resync, skip) = self.read_head(base);
            let t = &mut self.tracks[i as usize];
            t.truncated.1 = trunc.max(t.truncated.0);
            t.resyncs.1 = resync.max(t.resyncs.0);
            t.skipped.1 = skip.max(t.skipped.0);
            self.fold(i);
            self.tracks[i as usize].retired = true;
            self.hand_back(i, base);
        }
    }

    /// An exited thread's slot, read to the end (stack final, events
    /// drained), goes back to the runtime (EXITED -> FREE, TS_LDB_SLOTS)
    /// once the request ring is drained too, so no record is lost.
    fn hand_back(&mut self, i: u32, base: usize) {
        let head = self.mem.load_u64_acquire(base + slot_offsets::RING_HEAD);
        let tail = self.mem.load_u64_acquire(base + slot_offsets::RING_TAIL);
        let ev_head = self.mem.load_u64_acquire(base + ldb_offsets::EV_HEAD);
        let ev_tail = self.mem.load_u64_acquire(base + ldb_offsets::EV_TAIL);
        if head == tail
            && ev_head == ev_tail
            && self
                .mem
                .cas_u32(base + slot_offsets::STATE, TS_SLOT_EXITED, TS_SLOT_FREE)
        {
            self.end_thread(i);
        }
    }

    /// One seqlock read of slot `i`'s shadow stack, applied if consistent.
    fn walk(&mut self, i: u32, base: usize, clock: &mut dyn FnMut() -> u64) -> Walk {
        let gen = self.mem.load_u64_acquire(base + ldb_offsets::SHADOW_GEN);
        let depth = self.mem.load_u32(base + ldb_offsets::SHADOW_DEPTH);
        if self.tracks[i as usize].last_version == Some((gen, depth)) {
            self.stats.fast_path += 1;
            self.tracks[i as usize].confirmed_ns = self.pass_ns;
            return Walk::Unchanged;
        }
        if gen & 1 == 1 {
            self.stats.invalid += 1;
            return Walk::Busy;
        }
        let cs = clock();
        self.mem
            .read(base + ldb_offsets::SHADOW, &mut self.head_buf);
        let Ok(head) = parse_shadow_head(&self.head_buf) else {
            return Walk::Busy;
        };
        let n = stored_frames(head.depth) as usize;
        self.mem.read(
            base + ldb_offsets::SHADOW_FRAMES,
            &mut self.frames_buf[..n * FRAME_SIZE],
        );
        fence(Ordering::Acquire);
        let gen2 = self.mem.load_u64_acquire(base + ldb_offsets::SHADOW_GEN);
        let ce = clock();
        if gen2 != gen || head.gen != gen {
            self.stats.seqlock_discards += 1;
            return Walk::Discarded;
        }
        let track = &mut self.tracks[i as usize];
        let prev = track.prev.replace((cs, ce));
        if let Some((pcs, pce)) = prev {
            let ds = cs.saturating_sub(pcs);
            let de = ce.saturating_sub(pce);
            if ds > 0 && ((de as f64 / ds as f64) - 1.0).abs() > self.cfg.dte_tolerance {
                self.stats.dte_discards += 1;
                return Walk::Discarded;
            }
        }
        track.last_version = Some((gen, head.depth));
        track.truncated.1 = head.truncated.max(track.truncated.0);
        track.resyncs.1 = head.resyncs.max(track.resyncs.0);
        track.skipped.1 = head.skipped.max(track.skipped.0);
        // The state changed after `confirmed_ns` and was read by `ce`.
        let gap = ce.saturating_sub(track.confirmed_ns);
        track.confirmed_ns = cs;
        self.stats.full_walks += 1;
        self.stats.max_depth_seen = self.stats.max_depth_seen.max(head.depth.min(1 << 20));
        self.new_frames.clear();
        parse_frames(
            &self.frames_buf[..n * FRAME_SIZE],
            n as u32,
            &mut self.new_frames,
        );
        self.apply(i, cs, gap);
        Walk::Accepted
    }

    /// (truncated, resyncs, skipped) of slot `base`'s shadow stack.
    fn read_head(&mut self, base: usize) -> (u64, u64, u64) {
        self.mem
            .read(base + ldb_offsets::SHADOW, &mut self.head_buf);
        parse_shadow_head(&self.head_buf).map_or((0, 0, 0), |h| (h.truncated, h.resyncs, h.skipped))
    }

    /// Diff the accepted snapshot in `new_frames` against the tracked ones.
    fn apply(&mut self, i: u32, at: u64, gap: u64) {
        let track = &mut self.tracks[i as usize];
        let old: Vec<ts_frame> = track.frames.iter().map(|t| t.f).collect();
        let keep = common_prefix(&old, &self.new_frames);
        for j in (keep..track.frames.len()).rev() {
            let t = track.frames[j];
            let parent = if j > 0 { track.frames[j - 1].f.r#fn } else { 0 };
            let exact = t.f.entry_ns != 0
                && t.f.entry_ns <= at
                && t.f.entry_ns + EVENT_TIME_SLACK_NS >= self.start_mono_ns;
            let start = if exact { t.f.entry_ns } else { t.first_seen };
            let row = FunctionRow {
                tid: track.tid,
                fn_addr: t.f.r#fn,
                call_site: t.f.site,
                parent_fn: parent,
                depth: j as u32,
                start_ns: start,
                latency_ns: at.saturating_sub(start),
                start_exact: exact,
                error_bound_ns: if exact {
                    gap
                } else {
                    t.start_gap.saturating_add(gap)
                },
            };
            if row.latency_ns >= self.cfg.threshold_ns {
                self.functions.push(row);
                self.stats.functions += 1;
            } else {
                self.stats.below_threshold += 1;
            }
        }
        track.frames.truncate(keep);
        for f in &self.new_frames[keep..] {
            track.frames.push(Tracked {
                f: *f,
                first_seen: at,
                start_gap: gap,
            });
        }
    }

    /// The slot's thread is gone (or the slot changed owner): calls still
    /// tracked never ended in view; count them.
    fn end_thread(&mut self, i: u32) {
        self.fold(i);
        self.tracks[i as usize] = Track::default();
    }

    /// Adds a thread's counters to the totals and rebases them; its open
    /// calls are counted as unterminated and forgotten.
    fn fold(&mut self, i: u32) {
        let t = &mut self.tracks[i as usize];
        self.stats.unterminated += t.frames.len() as u64;
        t.frames.clear();
        t.last_version = None;
        // Saturating: a forged slot's counters can be anything.
        let st = &mut self.stats;
        st.truncated = st.truncated.saturating_add(Track::delta(t.truncated));
        st.resyncs = st.resyncs.saturating_add(Track::delta(t.resyncs));
        st.skipped = st.skipped.saturating_add(Track::delta(t.skipped));
        st.event_ring_full = st
            .event_ring_full
            .saturating_add(Track::delta(t.ev_dropped));
        t.truncated.0 = t.truncated.1;
        t.resyncs.0 = t.resyncs.1;
        t.skipped.0 = t.skipped.1;
        t.ev_dropped.0 = t.ev_dropped.1;
    }

    /// Lock/function/request events lost to full event rings so far,
    /// live threads included (ring pressure reads it).
    pub fn event_drops_now(&self) -> u64 {
        self.tracks.iter().fold(self.stats.event_ring_full, |n, t| {
            n.saturating_add(Track::delta(t.ev_dropped))
        })
    }

    fn drain_events(&mut self, i: u32, tid: u32) {
        let base = slot_offset(i);
        let head = self.mem.load_u64_acquire(base + ldb_offsets::EV_HEAD);
        let tail = self.mem.load_u64(base + ldb_offsets::EV_TAIL);
        if head == tail {
            return;
        }
        self.changed = true;
        let plan = plan_drain(head, tail, TS_EVENT_RING_CAPACITY);
        if plan.resync {
            self.stats.event_ring_resyncs += 1;
        }
        let lo = self.start_mono_ns.saturating_sub(EVENT_TIME_SLACK_NS);
        let hi = crate::sys::monotonic_ns().saturating_add(EVENT_TIME_SLACK_NS);
        for k in 0..plan.count {
            let off = base + event_offset_in_slot(plan.ring_index(k, TS_EVENT_RING_CAPACITY));
            self.mem.read(off, &mut self.ev_buf);
            let Ok(e) = parse_event(&self.ev_buf) else {
                self.stats.corrupt_events += 1;
                continue;
            };
            if validate_event(&e, tid, lo, hi).is_err() {
                self.stats.corrupt_events += 1;
                continue;
            }
            let name = event_name(e.r#type).unwrap_or("?");
            if is_lock_event(e.r#type) {
                self.lock_events.push((e.ts_ns, e.tid, name, e.object));
                self.stats.lock_events += 1;
            } else {
                self.request_events
                    .push((e.ts_ns, e.tid, name, e.object, e.arg));
                self.stats.request_events += 1;
            }
        }
        fence(Ordering::Release);
        self.mem
            .store_u64_release(base + ldb_offsets::EV_TAIL, plan.new_tail);
        let dropped = self.mem.load_u64(base + ldb_offsets::EV_DROPPED);
        let t = &mut self.tracks[i as usize];
        t.ev_dropped.1 = dropped.max(t.ev_dropped.0);
    }

    /// Ends the recording: every thread's open calls are counted as
    /// unterminated and its counters folded into the totals.
    pub fn finish(&mut self) -> ObserverStats {
        for i in 0..self.max_slots {
            self.end_thread(i);
        }
        self.stats.period_p50_ns = hist_quantile(&self.stats.period_hist_ns, 0.5);
        self.stats.period_p99_ns = hist_quantile(&self.stats.period_hist_ns, 0.99);
        self.stats.clone()
    }
}

/// An executable mapping of the target, for symbolisation.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Module {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
}

/// Executable file mappings of `pid` from /proc/PID/maps.
pub fn read_modules(pid: u32) -> Vec<Module> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return vec![];
    };
    parse_maps(&text)
}

pub fn parse_maps(text: &str) -> Vec<Module> {
    let mut out = vec![];
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms), Some(off)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let path: Vec<&str> = it.skip(2).collect();
        let path = path.join(" ");
        if !perms.contains('x') || !path.starts_with('/') {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset)) = (
            u64::from_str_radix(a, 16),
            u64::from_str_radix(b, 16),
            u64::from_str_radix(off, 16),
        ) else {
            continue;
        };
        out.push(Module {
            start,
            end,
            offset,
            path,
        });
    }
    out
}

/// What the observer thread hands back at the end.
pub struct ObserverReport {
    pub stats: ObserverStats,
    pub functions: WriterSummary,
    pub locks: WriterSummary,
    pub request_events: WriterSummary,
    pub modules: Vec<Module>,
    pub config: ObserverConfig,
    pub priority: PriorityStats,
}

/// The observer on its own thread, writing its three tables.
pub struct ObserverThread {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Result<ObserverReport>>,
    /// Every agent thread was moved to SCHED_IDLE (see [`set_agent_threads_idle`]).
    agent_idle: bool,
    /// Ring pressure (see [`ObserverThread::pressure`]).
    idle_at_start: bool,
    pressure: Pressure,
    /// Events lost to full event rings, as of the observer's last flush
    /// (every 20 ms).
    event_drops: Arc<AtomicU64>,
}

/// When ring pressure takes the agent off idle priority.
///
/// SCHED_IDLE keeps the agent out of the target's way at light load, but a
/// busy target leaves it almost no CPU (a SCHED_IDLE thread weighs 3
/// against a normal thread's 1024) and the rings overflow: memcached SET
/// at 80% load lost 74% of its records in a minute (bench/ldb, session
/// 11). So while the rings are hot every agent thread goes back to
/// SCHED_OTHER, and returns to SCHED_IDLE once they have stayed calm for
/// [`PRESSURE_CALM`]. Lost records are worse than a little of the target's
/// CPU; both are shown (meta.json `ldb.priority` and the drop counters).
/// The target controls its rings, so it can hold the agent at normal
/// priority: what the agent ran at before idle priority was the default.
#[derive(Debug, Default)]
pub struct Pressure {
    raised: Option<Instant>,
    last_hot: Option<Instant>,
    raises: u64,
    raised_for: Duration,
}

impl Pressure {
    /// One drain's verdict. Returns the priority to switch to (`Some(true)`:
    /// back to idle), or None to stay.
    pub fn step(&mut self, hot: bool, now: Instant) -> Option<bool> {
        if hot {
            self.last_hot = Some(now);
            if self.raised.is_none() {
                self.raised = Some(now);
                self.raises += 1;
                return Some(false);
            }
            return None;
        }
        let (since, hot_at) = (self.raised?, self.last_hot?);
        if now.saturating_duration_since(hot_at) < PRESSURE_CALM {
            return None;
        }
        self.raised_for += now.saturating_duration_since(since);
        self.raised = None;
        Some(true)
    }

    /// The recording ends: a raise still open counts up to `now`.
    pub fn end(&mut self, now: Instant) {
        if let Some(since) = self.raised.take() {
            self.raised_for += now.saturating_duration_since(since);
        }
    }

    pub fn raises(&self) -> u64 {
        self.raises
    }

    pub fn raised_for(&self) -> Duration {
        self.raised_for
    }
}

/// How long the target's rings must stay calm before the agent, raised to
/// SCHED_OTHER by ring pressure, goes back to SCHED_IDLE.
pub const PRESSURE_CALM: Duration = Duration::from_secs(2);

/// What ring pressure did to the agent's priority over a recording.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PriorityStats {
    /// The agent ran at SCHED_IDLE (the default while `--functions` records).
    pub idle: bool,
    /// Times ring pressure raised it back to SCHED_OTHER.
    pub raised_for_ring_pressure: u64,
    /// Seconds it spent raised, in all.
    pub raised_s: f64,
}

impl ObserverThread {
    pub fn spawn<M: RegionMemory + Send + 'static>(
        mem: M,
        max_slots: u32,
        pid: u32,
        cfg: ObserverConfig,
        dir: &Path,
        start_mono_ns: u64,
    ) -> Result<ObserverThread> {
        let mut functions = TableWriter::new(
            dir,
            "functions",
            FUNCTION_COLUMNS,
            &["tid", "fn_addr", "call_site", "parent_fn", "depth"],
            &["start_ns"],
        )?;
        let mut locks = TableWriter::new(
            dir,
            "locks",
            LOCK_COLUMNS,
            &["tid", "event", "mutex"],
            &["ts_ns"],
        )?;
        let mut reqs = TableWriter::new(
            dir,
            "request_events",
            REQUEST_EVENT_COLUMNS,
            &["tid", "event"],
            &["ts_ns"],
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let event_drops = Arc::new(AtomicU64::new(0));
        let event_drops2 = Arc::clone(&event_drops);
        let handle = std::thread::Builder::new()
            .name("ts-observer".into())
            .spawn(move || {
                // SAFETY: prctl with an integer argument; 1 ns timer slack
                // lets short sleeps be short.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
                let mut obs = Observer::new(mem, max_slots, cfg, start_mono_ns);
                if cfg.idle_priority {
                    obs.stats.scheduling = set_idle_priority();
                }
                let mut clock = crate::sys::monotonic_ns;
                let mut modules = read_modules(pid);
                let mut last_flush = Instant::now();
                let mut last_maps = Instant::now();
                let mut gap = cfg.period;
                let result = (|| -> Result<()> {
                    loop {
                        let stopping = stop2.load(Ordering::Relaxed);
                        if stopping && cfg.idle_priority {
                            set_normal_priority(); // the last pass and flush: not starved
                        }
                        let t0 = Instant::now();
                        let changed = obs.pass(&mut clock);
                        if stopping || t0.duration_since(last_flush) >= Duration::from_millis(20) {
                            last_flush = t0;
                            flush(&mut obs, &mut functions, &mut locks, &mut reqs)?;
                            event_drops2.store(obs.event_drops_now(), Ordering::Relaxed);
                            functions.tick(t0)?;
                            locks.tick(t0)?;
                            reqs.tick(t0)?;
                        }
                        if t0.duration_since(last_maps) >= Duration::from_secs(1) {
                            last_maps = t0;
                            merge_modules(&mut modules, read_modules(pid));
                        }
                        if stopping {
                            return Ok(());
                        }
                        if cfg.period.is_zero() {
                            std::hint::spin_loop();
                            continue;
                        }
                        // Throttled: the next pass `period` after this one
                        // began; while passes find nothing new (an idle
                        // target), each waits twice as long, up to
                        // IDLE_BACKOFF periods.
                        gap = if changed {
                            cfg.period
                        } else {
                            (gap * 2).min(cfg.period * IDLE_BACKOFF)
                        };
                        if let Some(rest) = gap.checked_sub(t0.elapsed()) {
                            std::thread::sleep(rest);
                        }
                    }
                })();
                obs.detach();
                let stats = obs.finish();
                result?;
                Ok(ObserverReport {
                    stats,
                    functions: functions.finish()?,
                    locks: locks.finish()?,
                    request_events: reqs.finish()?,
                    modules,
                    config: cfg,
                    priority: PriorityStats::default(),
                })
            })
            .map_err(|e| {
                crate::error::AgentError::internal(format!("cannot start the observer thread: {e}"))
            })?;
        // The table writers' threads exist now, as do the drain loop's.
        let agent_idle = cfg.idle_priority && set_agent_threads_idle(true) > 0;
        Ok(ObserverThread {
            stop,
            handle,
            agent_idle,
            idle_at_start: agent_idle,
            pressure: Pressure::default(),
            event_drops,
        })
    }

    /// Ring pressure, after each drain: `hot` when the target's rings came
    /// close to full or dropped records since the last drain. Raises every
    /// agent thread to SCHED_OTHER, or lets them back to SCHED_IDLE, as
    /// [`Pressure`] decides.
    pub fn pressure(&mut self, hot: bool, now: Instant) {
        if !self.agent_idle {
            return;
        }
        if let Some(idle) = self.pressure.step(hot, now) {
            set_agent_threads_idle(idle);
        }
    }

    /// Events the target lost to full event rings, as of the observer's
    /// last flush: a starved observer overflows them, as a starved drain
    /// overflows the request rings.
    pub fn event_drops(&self) -> u64 {
        self.event_drops.load(Ordering::Relaxed)
    }

    /// Moves the agent's threads back to SCHED_OTHER if they were moved to
    /// SCHED_IDLE: the recorder calls this before its last drain, so that
    /// finalising the files is not starved by a busy target (a supervisor's
    /// kill grace period would otherwise cut it short).
    pub fn unidle(&mut self) {
        if self.agent_idle {
            self.pressure.end(Instant::now());
            set_agent_threads_idle(false);
            self.agent_idle = false;
        }
    }

    /// Stops after one last pass and returns what it wrote.
    pub fn finish(mut self) -> Result<ObserverReport> {
        self.unidle(); // the last drains and file closes: not starved
        self.stop.store(true, Ordering::Relaxed);
        let priority = PriorityStats {
            idle: self.idle_at_start,
            raised_for_ring_pressure: self.pressure.raises(),
            raised_s: self.pressure.raised_for().as_secs_f64(),
        };
        match self.handle.join() {
            Ok(r) => r.map(|r| ObserverReport { priority, ..r }),
            Err(_) => Err(crate::error::AgentError::internal(
                "the observer thread panicked",
            )),
        }
    }
}

/// Moves the calling thread to SCHED_IDLE; says what it got.
fn set_idle_priority() -> String {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` outlives the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
        "idle".into()
    } else {
        format!(
            "normal (SCHED_IDLE refused: {})",
            std::io::Error::last_os_error()
        )
    }
}

/// Back to SCHED_OTHER (best effort).
fn set_normal_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in set_idle_priority.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
}

/// Moves every thread of the agent to SCHED_IDLE (`idle`) or back to
/// SCHED_OTHER, best effort; returns how many threads it moved.
///
/// Why every thread, while `--functions` records at idle priority (the
/// default): the drain loop, the requests writer and the table writers
/// (nice 19) wake hundreds of times a second on the target's 2 vCPUs.
/// Under EEVDF a running nice-19 or nice-0 thread keeps its slice
/// protection (RUN_TO_PARITY) when the target's worker wakes, so the
/// worker waited up to a slice (~0.3-1.6 ms seen, bench/ldb/wakeups.py);
/// a SCHED_IDLE thread is preempted by any normal thread at once. At 20%
/// load on memcached SET (bench/ldb decomposition, 6 interleaved rounds)
/// this took the p99 from x10.3 to x3.3 of the uninstrumented build, and
/// the median from x1.37 to x1.17, every round better. Their work only
/// waits for idle CPU time; a drain that falls behind drops records,
/// which are counted (meta.json `drops`).
pub fn set_agent_threads_idle(idle: bool) -> usize {
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut moved = 0;
    for t in tasks.flatten() {
        let Some(tid) = t
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: sched_setscheduler on a thread id of this process (one
        // that exited meanwhile gets ESRCH); `param` outlives the call.
        if unsafe { libc::sched_setscheduler(tid, policy, &param) } == 0 {
            moved += 1;
        }
    }
    moved
}

fn merge_modules(into: &mut Vec<Module>, more: Vec<Module>) {
    for m in more {
        if !into.contains(&m) {
            into.push(m);
        }
    }
    into.sort();
}

fn flush<M: RegionMemory>(
    obs: &mut Observer<M>,
    functions: &mut TableWriter,
    locks: &mut TableWriter,
    reqs: &mut TableWriter,
) -> Result<()> {
    for r in obs.functions.drain(..) {
        functions.push(&[
            Cell::U32(r.tid),
            Cell::U64(r.fn_addr),
            Cell::U64(r.call_site),
            Cell::U64(r.parent_fn),
            Cell::U32(r.depth),
            Cell::U64(r.start_ns),
            Cell::U64(r.latency_ns),
            Cell::Bool(r.start_exact),
            Cell::U64(r.error_bound_ns),
        ])?;
    }
    for (ts, tid, name, m) in obs.lock_events.drain(..) {
        locks.push(&[Cell::U64(ts), Cell::U32(tid), Cell::Str(name), Cell::U64(m)])?;
    }
    for (ts, tid, name, id, q) in obs.request_events.drain(..) {
        reqs.push(&[
            Cell::U64(ts),
            Cell::U32(tid),
            Cell::Str(name),
            Cell::U64(id),
            Cell::U64(q),
        ])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use tailscope_abi::{synth, ts_event, TS_EV_MUTEX_WAIT, TS_EV_REQ_START};

    fn frame(id: u64, f: u64) -> ts_frame {
        ts_frame {
            r#fn: f,
            site: f + 0x10,
            id,
            sp: 0,
            entry_ns: 0,
        }
    }

    /// A clock that advances `step` per read, starting at `t`.
    fn ticking(t: u64, step: u64) -> impl FnMut() -> u64 {
        let mut now = t;
        move || {
            now += step;
            now
        }
    }

    fn setup() -> Observer<RefCell<Vec<u8>>> {
        let mut b = synth::region(2, 9);
        synth::claim_slot(&mut b, 0, 100, TS_SLOT_LIVE);
        let cfg = ObserverConfig {
            dte_tolerance: 0.5,
            ..Default::default()
        };
        Observer::new(RefCell::new(b), 2, cfg, 0)
    }

    fn set(o: &Observer<RefCell<Vec<u8>>>, gen: u64, frames: &[ts_frame]) {
        synth::set_shadow(&mut o.mem.borrow_mut(), 0, gen, frames.len() as u32, frames);
    }

    /// An exited thread's slot goes back to the runtime once the observer
    /// has read it and its rings are drained, and not before.
    #[test]
    fn exited_slots_are_handed_back_once_read_and_drained() {
        let mut o = setup();
        let mut clock = ticking(1_000, 10);
        o.pass(&mut clock);
        let state =
            |o: &Observer<RefCell<Vec<u8>>>| o.mem.load_u32(slot_offset(0) + slot_offsets::STATE);
        // The thread exits with a record still in its ring.
        o.mem
            .store_u32(slot_offset(0) + slot_offsets::STATE, TS_SLOT_EXITED);
        o.mem
            .store_u64_release(slot_offset(0) + slot_offsets::RING_HEAD, 1);
        o.pass(&mut clock);
        assert_eq!(
            state(&o),
            TS_SLOT_EXITED,
            "an undrained ring keeps the slot"
        );
        o.mem
            .store_u64_release(slot_offset(0) + slot_offsets::RING_TAIL, 1);
        o.pass(&mut clock);
        assert_eq!(state(&o), TS_SLOT_FREE, "read and drained: handed back");
    }

    #[test]
    fn calls_are_timed_from_first_sight_to_gone() {
        let mut o = setup();
        assert_eq!(
            o.mem.load_u32(header_offsets::LDB_FLAGS),
            TS_LDB_LOCKS | TS_LDB_REQUESTS | TS_LDB_SLOTS
        );
        let mut clock = ticking(1_000, 10);
        set(&o, 2, &[frame(1, 0x100)]);
        o.pass(&mut clock);
        set(&o, 4, &[frame(1, 0x100), frame(3, 0x200)]);
        o.pass(&mut clock);
        o.pass(&mut clock); // unchanged: fast path
        assert_eq!(o.stats().fast_path, 1);
        // Two calls of 0x300 from one site: told apart by id.
        set(&o, 6, &[frame(1, 0x100), frame(5, 0x300)]);
        o.pass(&mut clock);
        set(&o, 8, &[frame(1, 0x100), frame(7, 0x300)]);
        o.pass(&mut clock);
        set(&o, 10, &[]);
        o.pass(&mut clock);
        let f = &o.functions;
        assert_eq!(f.len(), 4, "{f:?}");
        assert_eq!(f[0].fn_addr, 0x200);
        assert_eq!(f[0].parent_fn, 0x100);
        assert_eq!(f[0].depth, 1);
        assert_eq!(f[1].fn_addr, 0x300);
        assert_eq!(f[2].fn_addr, 0x300);
        assert_eq!(f[3].fn_addr, 0x100);
        assert_eq!(f[3].depth, 0);
        assert!(f.iter().all(|r| r.tid == 100 && !r.start_exact));
        // Start and end are each the Cs of the walk that saw the change.
        assert!(f[3].latency_ns > f[0].latency_ns);
        assert_eq!(f[0].start_ns + f[0].latency_ns, f[1].start_ns);
        assert_eq!(o.stats().full_walks, 5);
    }

    /// The runtime pops without touching gen: a lower depth at the same gen
    /// is a change (the call ended), not the fast path. Skipped pushes are
    /// summed per thread like the other runtime counters.
    #[test]
    fn pops_change_depth_only_and_skips_are_counted() {
        let mut o = setup();
        let mut clock = ticking(1_000, 10);
        set(&o, 4, &[frame(1, 0x100), frame(3, 0x200)]);
        o.pass(&mut clock);
        set(&o, 4, &[frame(1, 0x100)]); // 0x200 returned: depth 2 -> 1, same gen
        o.pass(&mut clock);
        assert_eq!(o.stats().fast_path, 0);
        assert_eq!(o.functions.len(), 1);
        assert_eq!(o.functions[0].fn_addr, 0x200);
        o.pass(&mut clock);
        assert_eq!(o.stats().fast_path, 1, "(gen, depth) unchanged");
        let at = slot_offset(0)
            + ldb_offsets::SHADOW
            + core::mem::offset_of!(tailscope_abi::ts_shadow_stack, skipped);
        o.mem.borrow_mut()[at..at + 8].copy_from_slice(&7u64.to_le_bytes());
        set(&o, 6, &[frame(1, 0x100), frame(5, 0x300)]);
        o.pass(&mut clock);
        assert_eq!(o.finish().skipped, 7);
    }

    #[test]
    fn busy_writers_and_skewed_windows_are_retried() {
        let mut o = setup();
        let mut clock = ticking(1_000, 10);
        set(&o, 2, &[frame(1, 0x100)]);
        o.pass(&mut clock);
        set(&o, 3, &[frame(1, 0x100)]); // odd: mid-update
        o.pass(&mut clock);
        assert_eq!(o.stats().invalid, 1);
        // A walk whose Ce jumps (descheduled while copying): DTE discard.
        set(&o, 4, &[]);
        let mut reads = 0;
        let mut skewed = || {
            reads += 1;
            5_000 + reads * 10 + if reads == 3 { 1_000_000 } else { 0 }
        };
        o.pass(&mut skewed);
        assert_eq!(o.stats().dte_discards, 1);
        assert!(o.functions.is_empty(), "discarded: nothing applied yet");
        // The skewed walk is also the reference of the next ratio, so the
        // next walk may be discarded too (Shim: one bad window spoils two
        // ratios); the one after is clean.
        let mut later = ticking(2_000_000, 10);
        o.pass(&mut later);
        o.pass(&mut later);
        assert_eq!(o.functions.len(), 1, "retried on later passes");
        assert!(o.stats().dte_discards <= 2);
    }

    #[test]
    fn exact_starts_threshold_and_events() {
        let mut b = synth::region(1, 9);
        synth::claim_slot(&mut b, 0, 100, TS_SLOT_LIVE);
        let cfg = ObserverConfig {
            threshold_ns: 50,
            dte_tolerance: 10.0,
            ..Default::default()
        };
        let mut o = Observer::new(RefCell::new(b), 1, cfg, 0);
        let mut clock = ticking(1_000, 10);
        let mut f = frame(1, 0x100);
        f.entry_ns = 900;
        set(&o, 2, &[f, frame(3, 0x200)]);
        o.pass(&mut clock);
        set(&o, 4, &[f]);
        o.pass(&mut clock); // 0x200: ~30 ns < 50: not written
        set(&o, 6, &[]);
        o.pass(&mut clock);
        assert_eq!(o.stats().below_threshold, 1);
        assert_eq!(o.functions.len(), 1);
        assert!(o.functions[0].start_exact && o.functions[0].start_ns == 900);
        let now = crate::sys::monotonic_ns();
        for (t, obj) in [(TS_EV_MUTEX_WAIT, 0xaa), (TS_EV_REQ_START, 7), (99, 1)] {
            let e = ts_event {
                ts_ns: now,
                object: obj,
                arg: 0,
                r#type: t,
                tid: 100,
            };
            synth::push_event(&mut o.mem.borrow_mut(), 0, &e);
        }
        o.pass(&mut clock);
        assert_eq!(o.lock_events, vec![(now, 100, "MUTEX_WAIT", 0xaa)]);
        assert_eq!(o.request_events, vec![(now, 100, "REQ_START", 7, 0)]);
        assert_eq!(o.stats().corrupt_events, 1);
        o.detach();
        assert_eq!(o.mem.load_u32(header_offsets::LDB_FLAGS), 0);
        let s = o.finish();
        assert_eq!(s.unterminated, 0);
        assert!(s.period_p50_ns > 0);
    }

    /// Event-ring drops are visible while the thread lives (ring pressure
    /// reads them between folds), counted from the slot's value at first
    /// sight, and kept once the thread is gone.
    #[test]
    fn event_drops_are_seen_live() {
        let mut b = synth::region(1, 9);
        synth::claim_slot(&mut b, 0, 100, TS_SLOT_LIVE);
        let mut o = Observer::new(RefCell::new(b), 1, ObserverConfig::default(), 0);
        let mut clock = ticking(1_000, 10);
        let at = slot_offset(0) + ldb_offsets::EV_DROPPED;
        o.mem.store_u64_release(at, 5); // before the observer first sees the thread
        o.pass(&mut clock);
        assert_eq!(o.event_drops_now(), 0);
        o.mem.store_u64_release(at, 12);
        let e = ts_event {
            ts_ns: crate::sys::monotonic_ns(),
            object: 1,
            arg: 0,
            r#type: TS_EV_MUTEX_WAIT,
            tid: 100,
        };
        synth::push_event(&mut o.mem.borrow_mut(), 0, &e);
        o.pass(&mut clock);
        assert_eq!(o.event_drops_now(), 7);
        assert_eq!(o.finish().event_ring_full, 7);
    }

    /// Hostile slot contents: random writes over the shadow stacks, event
    /// rings and slot headers between passes. The observer must not panic,
    /// must stay bounded per pass, and must count what it rejects.
    #[test]
    fn survives_forged_slots() {
        let mut b = synth::region(4, 9);
        for s in 0..4 {
            synth::claim_slot(&mut b, s, 100 + s, TS_SLOT_LIVE);
        }
        let len = b.len();
        let mut o = Observer::new(RefCell::new(b), 4, ObserverConfig::default(), 0);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut clock = ticking(1_000, 100);
        for _ in 0..20_000 {
            for _ in 0..8 {
                let slot = (rnd() % 4) as u32;
                let base = slot_offset(slot);
                let off = match rnd() % 4 {
                    0 => base + ldb_offsets::SHADOW + (rnd() % 64) as usize,
                    1 => base + ldb_offsets::EV_HEAD + (rnd() % 16) as usize,
                    2 => base + (rnd() % 64) as usize,
                    _ => base + ldb_offsets::SHADOW + (rnd() % 3000) as usize,
                };
                let v = rnd().to_le_bytes();
                let mut m = o.mem.borrow_mut();
                let n = 8.min(len - off);
                m[off..off + n].copy_from_slice(&v[..n]);
            }
            let before = o.functions.len();
            o.pass(&mut clock);
            assert!(o.functions.len() - before <= 4 * TS_SHADOW_DEPTH as usize);
            assert!(o.lock_events.len() + o.request_events.len() <= 20_000 * 4 * 1024);
            o.functions.clear();
            o.lock_events.clear();
            o.request_events.clear();
        }
        let s = o.finish();
        assert!(s.full_walks > 0 && s.passes == 20_000);
        assert!(s.max_depth_seen <= 1 << 20);
    }

    /// Every thread of the process moves to SCHED_IDLE and back, including
    /// one started before the call (like the writers and the drain loop).
    #[test]
    fn every_agent_thread_goes_idle_and_back() {
        let (tx, rx) = std::sync::mpsc::channel::<libc::pid_t>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            // SAFETY: a plain syscall.
            tx.send(unsafe { libc::gettid() }).unwrap();
            done_rx.recv().ok();
        });
        let other_tid = rx.recv().unwrap();
        // SAFETY: plain syscalls on threads of this process.
        let policy = |tid: libc::pid_t| unsafe { libc::sched_getscheduler(tid) };
        let me = unsafe { libc::gettid() };
        let moved_idle = set_agent_threads_idle(true);
        let idle = (policy(me), policy(other_tid));
        let moved_back = set_agent_threads_idle(false);
        let back = (policy(me), policy(other_tid));
        done_tx.send(()).unwrap();
        other.join().unwrap();
        assert!(moved_idle >= 2, "moved {moved_idle} threads to SCHED_IDLE");
        assert_eq!(idle, (libc::SCHED_IDLE, libc::SCHED_IDLE));
        assert!(moved_back >= 2, "moved {moved_back} threads back");
        assert_eq!(back, (libc::SCHED_OTHER, libc::SCHED_OTHER));
    }

    /// Ring pressure raises the agent at the first hot drain, keeps it
    /// raised while drains stay hot, and lets it back to idle only after
    /// PRESSURE_CALM without one; the raises and their time are counted.
    #[test]
    fn ring_pressure_raises_then_calms() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let calm_ms = PRESSURE_CALM.as_millis() as u64;
        let mut p = Pressure::default();
        assert_eq!(
            p.step(false, at(0)),
            None,
            "calm from the start: stays idle"
        );
        assert_eq!(p.step(true, at(10)), Some(false), "first hot drain: raised");
        assert_eq!(p.step(true, at(20)), None, "already raised");
        assert_eq!(p.step(false, at(30)), None);
        assert_eq!(
            p.step(false, at(20 + calm_ms - 1)),
            None,
            "not calm long enough"
        );
        assert_eq!(
            p.step(true, at(500)),
            None,
            "hot again: the calm clock restarts"
        );
        assert_eq!(p.step(false, at(500 + calm_ms - 1)), None);
        assert_eq!(
            p.step(false, at(500 + calm_ms)),
            Some(true),
            "calm: back to idle"
        );
        assert_eq!(p.step(false, at(600 + calm_ms)), None);
        assert_eq!(p.raises(), 1);
        assert_eq!(p.raised_for(), Duration::from_millis(490 + calm_ms));
        assert_eq!(p.step(true, at(10_000)), Some(false), "a second raise");
        p.end(at(10_250));
        assert_eq!(p.raises(), 2);
        assert_eq!(p.raised_for(), Duration::from_millis(490 + calm_ms + 250));
    }

    #[test]
    fn maps_keep_executable_file_mappings() {
        let text = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 123 /usr/bin/toy
55d0c0a02000-55d0c0a05000 r-xp 00002000 fd:01 123 /usr/bin/toy
7f00aa000000-7f00aa100000 r-xp 00028000 fd:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd1000-7ffd2000 r-xp 00000000 00:00 0 [vdso]
garbage line
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].offset, 0x2000);
        assert_eq!(m[1].path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
    }
}
