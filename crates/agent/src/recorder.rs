//! The recording: set up, poll, finalise.
//!
//! Order matters and is the point of this module:
//! 1. refuse early (bad PID, existing output) before touching the kernel;
//! 2. load BPF, then add the target — for a launched command, while it is
//!    parked before exec — so that its first request is already seen;
//! 3. poll every `--poll-us`: drain the region's rings (marker) and/or the
//!    BPF ringbuf (infer) into the writer; sleep, never spin;
//! 4. on SIGINT/SIGTERM (flags set by the handlers, nothing else), target
//!    exit or `--duration`: one final drain, close the Parquet file, detach
//!    from the region, stop a launched child, write meta.json, summarise.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tailscope_abi::region::{validate_record, RecordFault};

/// Records whose kernel counters failed the sanity check (a counter larger
/// than the latency): the row is kept with `counters_valid = false`, since
/// its latency is still good, and the count goes to meta.json's notes.
pub static COUNTERS_REJECTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Validate a record; a record whose only fault is its counters loses the
/// counters flag instead of being dropped. `Err` means drop it (corrupt).
pub fn keep_record(
    r: &mut ts_request_record,
    slot_tid: Option<u32>,
) -> std::result::Result<(), RecordFault> {
    match validate_record(r, slot_tid) {
        Ok(()) => Ok(()),
        Err(RecordFault::CountersExceedLatency) => {
            r.flags &= !tailscope_abi::TS_REC_COUNTERS;
            COUNTERS_REJECTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(e),
    }
}
use tailscope_abi::{
    ts_request_record, TS_BURST_CLOSED, TS_BURST_DETACHED, TS_BURST_WINDOW_SHIFT,
    TS_DEFAULT_SAMPLE_PPM, TS_FEAT_SNAP_GUARD, TS_KC_ENTRIES, TS_RING_CAPACITY,
};

use crate::burst::{self, Burst};
use crate::cli::{Mode, RecordArgs, Target};
use crate::error::{exit, AgentError, Result};
use crate::launch::{spawn_gated, Launched};
use crate::meta::{AgentCost, Drops, Meta, Sampling, TargetInfo};
use crate::observer::{ObserverConfig, ObserverReport, ObserverThread};
use crate::progress::{drops_text, Progress, Snapshot};
use crate::region::{MappedRegion, MarkerSource, RegionMemory};
use crate::sys;
use crate::tracer::{agent_error, Tracer, TracerError, TracerOptions};
use crate::writer::{RequestWriter, WriterPolicy};

/// How long a launched command has to create its region: in auto mode
/// before falling back to infer, in marker mode before giving up.
const AUTO_REGION_WAIT: Duration = Duration::from_secs(1);
const MARKER_REGION_WAIT: Duration = Duration::from_secs(5);
/// Grace between SIGTERM and SIGKILL for a launched command.
const CHILD_GRACE: Duration = Duration::from_secs(3);
const RINGBUF_BYTES: usize = 16 << 20;

enum Source {
    Marker(Box<MarkerSource<MappedRegion>>),
    Infer,
    /// A launched command has not created its region yet. Inferred records
    /// are held until the choice is made (kept if it falls back to infer).
    Deciding {
        deadline: Instant,
        fallback_infer: bool,
        pending: Vec<ts_request_record>,
        last_error: Option<String>,
    },
}

fn display_dir(dir: &Path) -> String {
    let s = dir.display().to_string();
    if s.ends_with('/') {
        s
    } else {
        s + "/"
    }
}

fn check_output(dir: &Path, force: bool) -> Result<()> {
    if dir.exists() || dir.symlink_metadata().is_ok() {
        if !force {
            return Err(AgentError::new(
                exit::OUTPUT,
                format!(
                    "output directory {} already exists; use --force to overwrite",
                    display_dir(dir)
                ),
            ));
        }
        if !dir.is_dir() {
            return Err(AgentError::new(
                exit::OUTPUT,
                format!("{} exists and is not a directory", dir.display()),
            ));
        }
    }
    Ok(())
}

/// Creates `dir`; with --force, removes only what a recording consists of.
fn prepare_output(dir: &Path) -> Result<()> {
    let fail = |e: std::io::Error| {
        AgentError::new(
            exit::OUTPUT,
            format!("cannot prepare {}: {e}", dir.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let _ = std::fs::remove_file(dir.join("meta.json"));
    if let Ok(entries) = std::fs::read_dir(dir.join("requests")) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".parquet") || name.ends_with(".parquet.inprogress") {
                std::fs::remove_file(e.path()).map_err(fail)?;
            }
        }
    }
    Ok(())
}

struct Signals {
    int: Arc<AtomicBool>,
    term: Arc<AtomicBool>,
    /// Readable once either signal arrived: a sleep that polls it ends at
    /// once (marker mode's sleep between burst windows lasts up to 750 ms).
    wake: Option<std::os::unix::net::UnixStream>,
}

impl Signals {
    fn register() -> Result<Signals> {
        let mut s = Signals {
            int: Arc::new(AtomicBool::new(false)),
            term: Arc::new(AtomicBool::new(false)),
            wake: None,
        };
        let fail = |e: std::io::Error| AgentError::internal(format!("cannot handle signals: {e}"));
        // Flags first, so the self-pipe's write (registered after) comes
        // after the flag is set.
        for (sig, flag) in [
            (signal_hook::consts::SIGINT, &s.int),
            (signal_hook::consts::SIGTERM, &s.term),
        ] {
            signal_hook::flag::register(sig, Arc::clone(flag)).map_err(fail)?;
        }
        let (rx, tx) = std::os::unix::net::UnixStream::pair().map_err(fail)?;
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::low_level::pipe::register(sig, tx.try_clone().map_err(fail)?)
                .map_err(fail)?;
        }
        s.wake = Some(rx);
        Ok(s)
    }

    fn which(&self) -> Option<&'static str> {
        if self.int.load(Ordering::Relaxed) {
            Some("SIGINT")
        } else if self.term.load(Ordering::Relaxed) {
            Some("SIGTERM")
        } else {
            None
        }
    }
}

/// Everything the loop accumulates.
struct State {
    writer: RequestWriter,
    source: Source,
    target_pid: u32,
    sampling: Sampling,
    corrupt_inferred: u64,
    inferred_discarded: u64,
    buf: Vec<ts_request_record>,
    /// `--functions`: the observer's configuration, and the observer once
    /// the region is attached.
    functions: Option<ObserverConfig>,
    observer: Option<ObserverThread>,
    output: PathBuf,
    start_mono: u64,
    /// The current drain period (adaptive; see [`next_wait`]).
    wait: Duration,
    /// Burst sampling (`--burst`), once the source is known.
    burst: Option<Burst>,
    burst_arg: burst::BurstArg,
    /// The plan inference was loaded with (its in-window rate is in BPF).
    infer_burst: Option<burst::BurstPlan>,
    burst_checked: bool,
    /// The context-switch programs are switched with the windows too.
    sched_burst: bool,
    /// Bursts given up on after a failed window switch, and why.
    burst_failed: Option<(Burst, String)>,
    /// The next poll waits no longer than this (the burst schedule's next step).
    wait_cap: Option<Duration>,
    /// The target's pidfd (readable once it exits; absent on kernels
    /// without pidfd_open): marker mode sleeps on it between burst
    /// windows. Owned by the recording's ProcessWatch.
    exit_fd: Option<std::os::fd::RawFd>,
    /// Readable once SIGINT or SIGTERM arrived ([`Signals`]).
    signal_fd: Option<std::os::fd::RawFd>,
    /// The pidfd was readable: check the target's exit now.
    exit_hint: bool,
    /// Ring-full drops (request and event rings) seen at the last drain with the observer running
    /// (ring pressure, see [`ObserverThread::pressure`]); None before the
    /// first such drain, which also takes what the rings held before the
    /// agent attached and is not judged.
    pressure_drops: Option<u64>,
}

/// Burst windows of inference: the gate and open-request count are in BPF.
struct InferWindows<'a>(&'a mut Tracer);

impl burst::Windows for InferWindows<'_> {
    fn close_gate(&mut self, _: u32) -> std::result::Result<(), TracerError> {
        self.0.set_gate(false)
    }
    fn still_open(&self) -> Option<i64> {
        Some(self.0.open_sampled())
    }
    fn detach(&mut self, _: u32) -> std::result::Result<(), TracerError> {
        self.0.set_window(false)
    }
    fn open(&mut self, _: u32) -> std::result::Result<(), TracerError> {
        self.0.set_window(true)?;
        self.0.set_gate(true)
    }
}

/// Burst windows of marker mode: the gate is the region header's
/// `burst_gate`; DETACHED goes up before the programs go (abi.h).
struct MarkerWindows<'a> {
    t: &'a mut Tracer,
    m: &'a mut MarkerSource<MappedRegion>,
}

impl burst::Windows for MarkerWindows<'_> {
    fn close_gate(&mut self, w: u32) -> std::result::Result<(), TracerError> {
        self.m
            .set_burst_gate((w << TS_BURST_WINDOW_SHIFT) | TS_BURST_CLOSED);
        Ok(())
    }
    fn still_open(&self) -> Option<i64> {
        Some(self.m.sampled_in_progress() as i64)
    }
    fn detach(&mut self, w: u32) -> std::result::Result<(), TracerError> {
        self.m
            .set_burst_gate((w << TS_BURST_WINDOW_SHIFT) | TS_BURST_CLOSED | TS_BURST_DETACHED);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.t.set_window(false)
    }
    fn open(&mut self, w: u32) -> std::result::Result<(), TracerError> {
        self.t.set_window(true)?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.m.set_burst_gate(w << TS_BURST_WINDOW_SHIFT);
        Ok(())
    }
}

/// Maps `pid`'s region and attaches to it as its agent. Each agent has its
/// own kcounters array, so agents can record different processes at once;
/// but a process's region has one agent: refuse if another live agent is
/// attached (the header names it and its array is pinned and live; anything
/// else was left by an agent that is gone). The claim is a compare-and-swap,
/// so two agents starting at once cannot both attach.
fn attach_region(
    pid: u32,
    agent_pid: u32,
    sample: Option<u32>,
    start_mono: u64,
) -> std::result::Result<MarkerSource<MappedRegion>, String> {
    let m = MappedRegion::open(pid).map_err(|e| e.to_string())?;
    // Nothing is written to a region of another version or a corrupt one.
    let mut hdr = vec![0u8; tailscope_abi::REGION_HEADER_SIZE];
    m.read(0, &mut hdr);
    tailscope_abi::region::parse_region_header(&hdr, m.len()).map_err(|e| e.to_string())?;
    let off = tailscope_abi::region::header_offsets::AGENT_PID;
    let other = m.load_u32(off);
    let busy = |who: u32| {
        format!("another tailscope agent (pid {who}) is recording process {pid}; stop it first")
    };
    if other != 0 && other != agent_pid && tailscope_bpf::agent_is_live(other) {
        return Err(busy(other));
    }
    if !m.cas_u32(off, other, agent_pid) {
        return Err(busy(m.load_u32(off)));
    }
    MarkerSource::attach(m, agent_pid, sample, start_mono).map_err(|e| e.to_string())
}

/// Seconds per full sweep of the kcounters array for entries of dead
/// threads (see `Tracer::gc_dead_threads_step`).
const GC_SWEEP_S: u32 = 64;

/// The longest the agent sleeps between burst windows, when nothing is
/// sampled: each wake-up costs a context switch on a CPU the target or its
/// clients need. Bounded so that exits and signals are seen soon.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// The longest the agent sleeps between drains (zero-instrumentation and
/// undecided sources; marker mode: MARKER_WAIT).
const MAX_WAIT: Duration = Duration::from_millis(16);

/// Marker mode between burst windows: nothing is sampled, so the agent
/// sleeps until the next window (mean period 1 s at 1%), the target's
/// exit (its pidfd) or a signal, but no longer than this.
const MARKER_IDLE_WAIT: Duration = Duration::from_millis(750);

/// Marker mode: the longest the agent sleeps between drains. A ring that
/// reaches TS_RING_WAKE_FILL (a quarter) wakes it sooner (ABI 5), so this
/// bounds only how stale the files and the progress line get, and how late
/// an exit or a signal is seen (as IDLE_WAIT).
const MARKER_WAIT: Duration = Duration::from_millis(50);

/// A thread producing this many requests per second fills a quarter of its
/// ring in the longest wait the sampling rate allows (see [`max_wait`]).
const PLANNED_MAX_RATE_PER_THREAD: f64 = 250_000.0;

/// The longest safe drain period for a sampling rate: a thread serving
/// PLANNED_MAX_RATE_PER_THREAD requests/s must not fill more than a quarter
/// of its ring (TS_RING_CAPACITY records) meanwhile. 1%: 16 ms; 100%: the
/// configured period.
fn max_wait(rate_ppm: u32, min: Duration) -> Duration {
    let per_s = PLANNED_MAX_RATE_PER_THREAD * f64::from(rate_ppm.max(1)) / 1e6;
    let secs = (TS_RING_CAPACITY as f64 / 4.0) / per_s;
    Duration::from_secs_f64(secs).clamp(min, MAX_WAIT.max(min))
}

/// Adaptive drain period: back off (doubling) while drains find little,
/// return to the configured period as soon as one finds a busy ring. Each
/// wakeup costs a context switch on a CPU the target or its clients need;
/// at 1% sampling most of them found nothing.
fn next_wait(cur: Duration, min: Duration, max: Duration, busiest: usize) -> Duration {
    if busiest >= TS_RING_CAPACITY as usize / 8 {
        min
    } else {
        (cur * 2).clamp(min, max.max(min))
    }
}

/// A drain that took this many records from one ring found it close to
/// full: the agent is falling behind (see [`ObserverThread::pressure`]).
const PRESSURE_FILL: usize = TS_RING_CAPACITY as usize * 3 / 4;

/// Whether the target's rings are under pressure after a drain: the
/// busiest request ring came within a quarter of full, or request or event
/// rings dropped records since the last drain.
fn ring_hot(busiest: usize, ring_full: u64, ring_full_before: u64) -> bool {
    busiest >= PRESSURE_FILL || ring_full > ring_full_before
}

impl State {
    fn drops(&self, tracer: &Tracer) -> Drops {
        let b = tracer.stats();
        let mut d = Drops {
            bpf_ringbuf: b.ringbuf_drops,
            kc_collisions: b.kc_collisions,
            corrupt_records: self.corrupt_inferred,
            abandoned: b.inferred_abandoned,
            ..Default::default()
        };
        if let Source::Marker(m) = &self.source {
            let s = m.stats();
            d.ring_full = s.ring_full;
            d.corrupt_records += s.corrupt_records;
            d.ring_resyncs = s.ring_resyncs;
            d.slots_exhausted = s.slots_exhausted;
        }
        d
    }

    fn push_inferred(&mut self, records: &[ts_request_record]) -> Result<()> {
        for r in records {
            let mut r = *r;
            if keep_record(&mut r, None).is_err() {
                self.corrupt_inferred += 1;
                continue;
            }
            self.writer.push(self.target_pid, "inferred", &r)?;
        }
        Ok(())
    }

    /// One poll step. It may block for new records up to the adaptive
    /// period, which stays within [`min_wait`, max_wait(sampling rate)];
    /// in marker mode up to MARKER_WAIT, woken early by the target when a
    /// ring fills (never sooner than `min_wait` after the last drain).
    fn poll(&mut self, tracer: &mut Tracer, min_wait: Duration, infer_loaded: bool) -> Result<()> {
        // In burst windows the rings fill at the in-window rate; between
        // windows nothing is sampled, so the period may grow to IDLE_WAIT
        // (the burst schedule's cap still wakes the agent for the next
        // window, and the first poll of a window is back within max_wait).
        let rate = self
            .burst
            .as_ref()
            .map_or(self.sampling.rate_ppm, |b| b.plan.in_window_ppm);
        let marker = matches!(self.source, Source::Marker(_));
        let between = self.burst.as_ref().is_some_and(|b| b.between_windows());
        let max = if marker && between {
            MARKER_IDLE_WAIT
        } else if marker {
            MARKER_WAIT
        } else if between {
            IDLE_WAIT
        } else {
            max_wait(rate, min_wait)
        };
        // Marker mode: the rings wake the agent, so it waits the longest.
        let mut wait = if marker { max } else { self.wait };
        wait = wait.max(min_wait).min(max.max(min_wait));
        if let Some(cap) = self.wait_cap.take() {
            wait = wait.min(cap.max(Duration::from_micros(100)));
        }
        let mut busiest = 0usize;
        let infer_active = matches!(
            self.source,
            Source::Infer
                | Source::Deciding {
                    fallback_infer: true,
                    ..
                }
        );
        if infer_loaded {
            self.buf.clear();
            let w = if infer_active { wait } else { Duration::ZERO };
            tracer.poll_records(w, &mut self.buf).map_err(agent_error)?;
            // The ringbuf holds far more than a thread's ring: scale down.
            busiest = self.buf.len() / 8;
            let records = std::mem::take(&mut self.buf);
            match &mut self.source {
                Source::Infer => self.push_inferred(&records)?,
                Source::Deciding { pending, .. } => pending.extend_from_slice(&records),
                Source::Marker(_) => self.inferred_discarded += records.len() as u64,
            }
            self.buf = records;
            if !infer_active {
                self.sleep(wait, min_wait, between);
            }
        } else {
            self.sleep(wait, min_wait, between);
        }
        if let Source::Marker(m) = &mut self.source {
            let (writer, pid) = (&mut self.writer, self.target_pid);
            m.drain(|r: &ts_request_record, kind: &str| writer.push(pid, kind, r))?;
            busiest = busiest.max(m.last_busiest());
            if let Some(o) = self.observer.as_mut() {
                // Request rings (drained here) and event rings (drained by
                // the observer) alike.
                let ring_full = m.stats().ring_full.saturating_add(o.event_drops());
                if let Some(before) = self.pressure_drops {
                    o.pressure(
                        ring_hot(m.last_busiest(), ring_full, before),
                        Instant::now(),
                    );
                }
                self.pressure_drops = Some(ring_full);
            }
        }
        self.wait = next_wait(wait, min_wait, max, busiest);
        Ok(())
    }

    /// Waits `wait` for records: marker mode sleeps on the region's drain
    /// futex, which the target wakes when a ring fills, but never returns
    /// sooner than `min_wait` (a target that wakes the agent all the time
    /// gets drains at the old fixed period, no more).
    ///
    /// Between burst windows nothing is sampled: marker mode then sleeps on
    /// the target's pidfd (its exit ends the sleep, as does a signal). At a
    /// high record rate the target wakes it when a ring is a quarter full.
    fn sleep(&mut self, wait: Duration, min_wait: Duration, between: bool) {
        let Source::Marker(m) = &self.source else {
            std::thread::sleep(wait);
            return;
        };
        if between {
            // (without a pidfd, poll ignores the -1 and waits for a signal)
            let fd = self.exit_fd.unwrap_or(-1);
            self.exit_hint |= sys::wait_readable_or(fd, self.signal_fd, wait);
            return;
        }
        let t0 = Instant::now();
        m.wait_for_records(wait);
        if let Some(rest) = min_wait.min(wait).checked_sub(t0.elapsed()) {
            std::thread::sleep(rest);
        }
    }

    /// Starts burst sampling once the source is known (see [`burst`]): for
    /// inference with the plan BPF was loaded with; for marker mode from the
    /// runtime's (or --sample's) rate, raising the runtime's rate to the
    /// in-window rate. Not with --functions, which records every call.
    fn start_burst(&mut self, tracer: &mut Tracer, now: Instant) -> Result<()> {
        if self.burst_checked || matches!(self.source, Source::Deciding { .. }) {
            return Ok(());
        }
        self.burst_checked = true;
        let seed = self.start_mono ^ u64::from(self.target_pid) << 32;
        let plan = match &mut self.source {
            Source::Infer => self.infer_burst,
            Source::Marker(m) if self.functions.is_none() => {
                let p = burst::plan(self.burst_arg, self.sampling.rate_ppm)
                    .map_err(AgentError::usage)?;
                if let Some(p) = p {
                    // Every snapshot is the runtime's, taken by the running
                    // thread: the context-switch programs can go too, if
                    // this runtime refuses counters to a thread whose
                    // switch-in BPF missed (older ones do not).
                    if m.current_features() & TS_FEAT_SNAP_GUARD != 0 {
                        tracer.set_sched_burst(true).map_err(agent_error)?;
                        self.sched_burst = true;
                    }
                    // closed until the first window (Burst::new)
                    m.set_burst_gate(TS_BURST_CLOSED);
                    // the overall rate first: tailscope_sample_ppm() never
                    // sees the in-window rate alone
                    m.set_effective_ppm(self.sampling.rate_ppm);
                    m.set_sample_ppm(p.in_window_ppm);
                }
                p
            }
            _ => None,
        };
        self.burst = plan.map(|p| Burst::new(p, now, seed));
        Ok(())
    }

    /// A window switch failed (an attach error mid-recording): sample
    /// continuously from now on rather than stop recording.
    fn abandon_burst(&mut self, tracer: &mut Tracer, e: TracerError) -> Result<()> {
        let why = format!("{}", agent_error(e));
        eprintln!("tailscope: warning: burst sampling stopped ({why}); sampling continuously");
        let rate = self.sampling.rate_ppm;
        tracer.set_window(true).map_err(agent_error)?;
        tracer.set_sched_burst(false).map_err(agent_error)?;
        self.sched_burst = false;
        tracer.set_gate(true).map_err(agent_error)?;
        if let Source::Marker(m) = &mut self.source {
            m.set_burst_gate(0);
            m.set_sample_ppm(rate);
            m.set_effective_ppm(0);
        }
        if let Some(b) = self.burst.take() {
            self.burst_failed = Some((b, why));
        }
        Ok(())
    }

    /// While deciding: try to attach to a freshly created region.
    fn try_decide(&mut self, agent_pid: u32, sample: Option<u32>, start_mono: u64) -> Result<()> {
        let Source::Deciding {
            deadline,
            fallback_infer,
            pending,
            last_error,
        } = &mut self.source
        else {
            return Ok(());
        };
        let attempt = attach_region(self.target_pid, agent_pid, sample, start_mono);
        match attempt {
            Ok(m) => {
                self.inferred_discarded += pending.len() as u64;
                self.sampling = marker_sampling(&m, sample);
                self.source = Source::Marker(Box::new(m));
            }
            Err(e) => {
                if Instant::now() < *deadline {
                    *last_error = Some(e);
                } else if *fallback_infer {
                    let pending = std::mem::take(pending);
                    self.source = Source::Infer;
                    self.push_inferred(&pending)?;
                } else {
                    return Err(AgentError::new(
                        exit::REGION,
                        format!(
                            "{}{} did not appear within {} s ({}); is libtailscope linked into the command?",
                            if self.functions.is_some() { "--functions: " } else { "" },
                            MappedRegion::path(self.target_pid).display(),
                            MARKER_REGION_WAIT.as_secs(),
                            last_error.take().unwrap_or(e)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// With --functions, start the observer once the region is attached.
    fn start_observer(&mut self) -> Result<()> {
        let (Some(cfg), None, Source::Marker(m)) = (self.functions, &self.observer, &self.source)
        else {
            return Ok(());
        };
        let max_slots = m.header().max_slots;
        let mem = MappedRegion::open(self.target_pid).map_err(|e| {
            AgentError::new(
                exit::REGION,
                format!("{}: {e}", MappedRegion::path(self.target_pid).display()),
            )
        })?;
        self.observer = Some(ObserverThread::spawn(
            mem,
            max_slots,
            self.target_pid,
            cfg,
            &self.output,
            self.start_mono,
        )?);
        Ok(())
    }

    fn mode_name(&self) -> &'static str {
        match self.source {
            Source::Marker(_) => "marker",
            _ => "infer",
        }
    }
}

fn marker_sampling(m: &MarkerSource<MappedRegion>, sample: Option<u32>) -> Sampling {
    match sample {
        Some(ppm) => Sampling {
            rate_ppm: ppm,
            decided_by: "agent",
            burst: None,
        },
        None => Sampling {
            rate_ppm: m.header().sample_ppm_runtime,
            decided_by: "runtime",
            burst: None,
        },
    }
}

fn target_info(pid: u32, launched: Option<&[String]>) -> TargetInfo {
    TargetInfo {
        pid,
        comm: sys::process_comm(pid).unwrap_or_default(),
        cmdline: sys::process_cmdline(pid)
            .filter(|c| !c.is_empty())
            .or_else(|| launched.map(<[String]>::to_vec))
            .unwrap_or_default(),
        launched: launched.is_some(),
        exit_status: None,
    }
}

/// Runs one recording to the end.
pub fn run(args: RecordArgs) -> Result<()> {
    let agent_pid = std::process::id();
    if let Target::Pid(p) = args.target {
        if !sys::process_exists(p) {
            return Err(AgentError::new(
                exit::TARGET,
                format!("no process with PID {p}"),
            ));
        }
    }
    check_output(&args.output, args.force)?;
    // --functions reads the runtime's shadow stacks: marker mode or nothing.
    let mode = match (args.functions, args.mode) {
        (Some(_), Mode::Auto) => Mode::Marker,
        (_, m) => m,
    };
    if let (Some(_), Target::Pid(p)) = (args.functions, &args.target) {
        if !MappedRegion::path(*p).exists() {
            return Err(AgentError::new(
                exit::REGION,
                format!(
                    "--functions: PID {p} does not run the tailscope runtime (no {}); build it with `tailscope flags` or tailscope-cc",
                    MappedRegion::path(*p).display()
                ),
            ));
        }
    }
    let signals = Signals::register()?;

    // Which source, as far as it can be known before the target runs.
    let region_now = matches!(args.target, Target::Pid(p) if MappedRegion::path(p).exists());
    let infer_loaded = match (mode, &args.target) {
        (Mode::Infer, _) => true,
        (Mode::Marker, _) => false,
        (Mode::Auto, Target::Pid(_)) => !region_now,
        (Mode::Auto, Target::Launch(_)) => true,
    };
    if let (Mode::Marker, Target::Pid(p)) = (mode, &args.target) {
        if !region_now {
            return Err(AgentError::new(
                exit::REGION,
                format!(
                    "no {} (is libtailscope linked into PID {p}?); try --mode infer",
                    MappedRegion::path(*p).display()
                ),
            ));
        }
    }
    let infer_ppm = args.sample_ppm.unwrap_or(TS_DEFAULT_SAMPLE_PPM);
    // Burst windows sample at a higher rate for the same overall rate.
    let burst_plan = if infer_loaded && args.functions.is_none() {
        burst::plan(args.burst, infer_ppm).map_err(AgentError::usage)?
    } else {
        None
    };
    let mut tracer = Tracer::load(&TracerOptions {
        infer: infer_loaded,
        infer_sample_ppm: burst_plan.map_or(infer_ppm, |p| p.in_window_ppm),
        ringbuf_bytes: RINGBUF_BYTES,
        agent_pid,
        gate_closed_at_start: burst_plan.is_some(),
    })
    .map_err(agent_error)?;
    prepare_output(&args.output)?;
    let stale_regions = crate::region::sweep_stale_regions();

    let start_mono = sys::monotonic_ns();
    let start_unix = sys::unix_ns();
    let clock_offset = sys::monotonic_to_unix_offset_ns();
    let started = Instant::now();
    let cpu_at_start = sys::self_cpu_seconds();

    let (target_pid, mut launched, argv): (u32, Option<Launched>, Option<Vec<String>>) =
        match &args.target {
            Target::Pid(p) => {
                tracer.add_target(*p).map_err(agent_error)?;
                (*p, None, None)
            }
            Target::Launch(argv) => {
                let mut l = spawn_gated(argv)?;
                if let Err(e) = tracer.add_target(l.pid) {
                    l.terminate(Duration::ZERO);
                    return Err(agent_error(e));
                }
                l.release(&argv[0])?;
                (l.pid, Some(l), Some(argv.clone()))
            }
        };
    let watch = sys::ProcessWatch::new(target_pid);
    restrict_pin(&mut tracer, &mut false);

    let infer_sampling = Sampling {
        rate_ppm: infer_ppm,
        decided_by: "bpf",
        burst: None,
    };
    let source = match (&args.target, mode, region_now) {
        (Target::Pid(_), Mode::Infer, _) | (Target::Pid(_), Mode::Auto, false) => Source::Infer,
        (Target::Pid(p), _, _) => {
            let m = attach_region(*p, agent_pid, args.sample_ppm, start_mono).map_err(|e| {
                AgentError::new(
                    exit::REGION,
                    format!("{}: {e}", MappedRegion::path(*p).display()),
                )
            })?;
            Source::Marker(Box::new(m))
        }
        (Target::Launch(_), Mode::Infer, _) => Source::Infer,
        (Target::Launch(_), mode, _) => Source::Deciding {
            deadline: Instant::now()
                + if mode == Mode::Marker {
                    MARKER_REGION_WAIT
                } else {
                    AUTO_REGION_WAIT
                },
            fallback_infer: mode == Mode::Auto,
            pending: Vec::new(),
            last_error: None,
        },
    };
    let sampling = match &source {
        Source::Marker(m) => marker_sampling(m, args.sample_ppm),
        _ => infer_sampling,
    };

    let writer = RequestWriter::new(&args.output, WriterPolicy::default())?;
    let mut st = State {
        writer,
        source,
        target_pid,
        sampling,
        corrupt_inferred: 0,
        inferred_discarded: 0,
        buf: Vec::with_capacity(4096),
        functions: args.functions,
        observer: None,
        output: args.output.clone(),
        start_mono,
        wait: args.poll,
        burst: None,
        burst_arg: args.burst,
        infer_burst: burst_plan,
        burst_checked: false,
        sched_burst: false,
        burst_failed: None,
        wait_cap: None,
        exit_fd: watch.raw_fd(),
        signal_fd: signals.wake.as_ref().map(std::os::fd::AsRawFd::as_raw_fd),
        exit_hint: false,
        pressure_drops: None,
    };
    st.start_observer()?;
    let mut meta = Meta {
        host: sys::hostname(),
        kernel: sys::kernel_release(),
        target: target_info(target_pid, argv.as_deref()),
        mode: st.mode_name(),
        sampling: st.sampling.clone(),
        drops: Drops::default(),
        start_unix_ns: start_unix,
        duration_s: 0.0,
        requests_recorded: 0,
        monotonic_to_unix_ns: clock_offset,
        finalised_by: None,
        bytes_written: 0,
        files: vec![],
        agent: AgentCost {
            pid: agent_pid,
            poll_us: args.poll.as_micros() as u64,
            ..Default::default()
        },
        notes: json!({}),
        ldb: None,
    };
    meta.write(&args.output)?;

    let result = record_loop(
        &args,
        &mut st,
        &mut tracer,
        &signals,
        &mut launched,
        &watch,
        started,
        infer_loaded,
        agent_pid,
        start_mono,
        &mut meta,
    );

    // Finalise, whatever happened in the loop.
    let finalised_by = match &result {
        Ok(by) => Some(*by),
        Err(_) => None,
    };
    // Back to normal priority before the last drain and the file closes.
    if let Some(o) = st.observer.as_mut() {
        o.unidle();
    }
    // No real wait before the last drain (it may have grown to IDLE_WAIT,
    // or MARKER_WAIT in marker mode): the cap's floor, 100 us.
    st.wait = Duration::ZERO;
    st.wait_cap = Some(Duration::ZERO);
    let final_drain = st
        .poll(&mut tracer, Duration::ZERO, infer_loaded)
        .and_then(|_| {
            // The ringbuf may hold more than one poll returns.
            for _ in 0..64 {
                if !infer_loaded || !matches!(st.source, Source::Infer) {
                    break;
                }
                st.buf.clear();
                if tracer
                    .poll_records(Duration::ZERO, &mut st.buf)
                    .map_err(agent_error)?
                    == 0
                {
                    break;
                }
                let records = std::mem::take(&mut st.buf);
                st.push_inferred(&records)?;
                st.buf = records;
            }
            Ok(())
        });
    let drops = st.drops(&tracer);
    let mode = st.mode_name();
    let ldb_report = st.observer.take().map(ObserverThread::finish);
    let features = match &st.source {
        Source::Marker(m) => m.current_features(),
        _ => 0,
    };
    let marker_stats = match &mut st.source {
        Source::Marker(m) => {
            m.detach();
            Some(m.stats())
        }
        _ => None,
    };
    let State {
        writer,
        mut sampling,
        inferred_discarded,
        burst,
        burst_failed,
        sched_burst,
        ..
    } = st;
    let failed = burst_failed.as_ref().map(|(_, why)| why.clone());
    if let Some(mut b) = burst.or(burst_failed.map(|(b, _)| b)) {
        b.finish(Instant::now());
        let duty = b.plan.window.as_secs_f64() / b.plan.period.as_secs_f64();
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        sampling.burst = Some(json!({
            "effective_rate_ppm": (b.plan.in_window_ppm as f64 * b.stats.open_s / secs).round(),
            "failed": failed,
            "window_ms": b.plan.window.as_secs_f64() * 1e3,
            "mean_period_ms": b.plan.period.as_secs_f64() * 1e3,
            "duty": duty,
            "in_window_rate_ppm": b.plan.in_window_ppm,
            "windows": b.stats.windows,
            "open_s": b.stats.open_s,
            "cut_at_window_end": b.stats.cut,
            "switch_s": b.stats.switch_s,
            "scheduler_switched": sched_burst,
        }));
    }
    let written = writer.finish();
    let duration = started.elapsed();
    let cpu = sys::self_cpu_seconds() - cpu_at_start;
    if let Some(l) = launched.as_mut() {
        meta.target.exit_status = l.terminate(CHILD_GRACE);
    }

    let (summary, write_err) = match written {
        Ok(s) => (s, None),
        Err(e) => (Default::default(), Some(e)),
    };
    meta.mode = mode;
    meta.sampling = sampling;
    meta.drops = drops;
    meta.duration_s = duration.as_secs_f64();
    meta.requests_recorded = summary.rows;
    meta.finalised_by = finalised_by;
    meta.bytes_written = summary.bytes;
    meta.files = summary.files.clone();
    meta.agent.cpu_seconds = cpu;
    meta.agent.cpu_percent_of_one_core = 100.0 * cpu / duration.as_secs_f64().max(1e-9);
    meta.agent.max_rss_kib = sys::self_max_rss_kib();
    let mut notes = serde_json::Map::new();
    notes.insert(
        "counters_rejected".into(),
        json!(COUNTERS_REJECTED.load(std::sync::atomic::Ordering::Relaxed)),
    );
    if let Some(s) = marker_stats {
        notes.insert("records_before_start".into(), json!(s.before_start));
        notes.insert("torn_records".into(), json!(s.torn));
        notes.insert("bad_slot_states".into(), json!(s.bad_slot_states));
    }
    let region_faults = crate::shmguard::faults();
    if region_faults > 0 {
        eprintln!(
            "tailscope-agent: warning: the target shrank its shared-memory region while it was \
             mapped ({region_faults} faults); records after that were not read"
        );
    }
    notes.insert("region_faults".into(), json!(region_faults));
    notes.insert("stale_regions_removed".into(), json!(stale_regions));
    if inferred_discarded > 0 {
        notes.insert(
            "inferred_discarded_in_marker_mode".into(),
            json!(inferred_discarded),
        );
    }
    notes.insert(
        "agent_cost_excludes".into(),
        json!("in-kernel BPF time, which is charged to the traced threads"),
    );
    meta.notes = serde_json::Value::Object(notes);
    let ldb_report = match ldb_report {
        Some(Ok(r)) => Some(r),
        Some(Err(e)) => {
            meta.write(&args.output)?;
            return Err(e);
        }
        None => None,
    };
    if let Some(r) = &ldb_report {
        meta.ldb = Some(ldb_meta(r, features));
        for s in [&r.functions, &r.locks, &r.request_events] {
            meta.bytes_written += s.bytes;
            meta.files.extend(s.files.iter().cloned());
        }
    }
    meta.write(&args.output)?;
    if let Some(r) = &ldb_report {
        if features & tailscope_abi::TS_FEAT_FN_HOOKS == 0 {
            eprintln!(
                "warning: --functions: no instrumented function ran in PID {target_pid}; build it with `tailscope flags` (-finstrument-functions) to get function latencies"
            );
        }
        eprintln!(
            "functions: {} calls, {} lock events, {} request events; observer period p50 {} ns, {} walks, {} DTE / {} seqlock discards",
            r.stats.functions,
            r.stats.lock_events,
            r.stats.request_events,
            r.stats.period_p50_ns,
            r.stats.full_walks,
            r.stats.dte_discards,
            r.stats.seqlock_discards
        );
        if r.priority.raised_for_ring_pressure > 0 {
            eprintln!(
                "note: the target's rings filled, so the agent left idle priority {} time(s) ({:.1} s in all) rather than drop records",
                r.priority.raised_for_ring_pressure, r.priority.raised_s
            );
        }
    }

    result?;
    final_drain?;
    if let Some(e) = write_err {
        return Err(e);
    }
    eprintln!(
        "recorded {} requests ({} dropped{}) in {:.1} s → {} ({:.2} MB)",
        summary.rows,
        drops.requests_lost(),
        drops_text(&drops).replacen(", drops: ", "; ", 1),
        duration.as_secs_f64(),
        display_dir(&args.output),
        summary.bytes as f64 / 1e6
    );
    Ok(())
}

/// Narrows who may open this agent's counters array to the targets' user
/// (`Tracer::restrict_pin`); warns once when they run as several users, or
/// when it cannot (no CAP_CHOWN, a uid outside a user namespace): the array
/// then stays root-only and non-root targets record without kernel
/// counters. Never ends a recording.
fn restrict_pin(tracer: &mut Tracer, warned: &mut bool) {
    let why = match tracer.restrict_pin() {
        Ok(tailscope_bpf::PinAccess::Owner(_)) => return,
        Ok(tailscope_bpf::PinAccess::Everyone(uids)) => format!(
            "the targets run as several users ({uids:?}); their counters array stays writable \
             by every local user"
        ),
        Err(e) => format!(
            "cannot hand the counters array to the targets' user ({e}); targets that do not run \
             as root record without kernel counters"
        ),
    };
    if !std::mem::replace(warned, true) {
        eprintln!("tailscope-agent: warning: {why}");
    }
}

#[allow(clippy::too_many_arguments)]
fn record_loop(
    args: &RecordArgs,
    st: &mut State,
    tracer: &mut Tracer,
    signals: &Signals,
    launched: &mut Option<Launched>,
    watch: &sys::ProcessWatch,
    started: Instant,
    infer_loaded: bool,
    agent_pid: u32,
    start_mono: u64,
    meta: &mut Meta,
) -> Result<&'static str> {
    let mut progress = Progress::new(args.quiet);
    let mut last_slow = Instant::now();
    let mut last_gc = Instant::now();
    let mut rescans = 0u64;
    let mut warned_pin = false;
    let decided_before = !matches!(st.source, Source::Deciding { .. });
    let mut decided = decided_before;
    let by = loop {
        if let Some(sig) = signals.which() {
            break sig;
        }
        if let Some(d) = args.duration {
            // not past --duration by a whole (marker mode: 50 ms) wait
            let left = d.saturating_sub(started.elapsed());
            st.wait_cap = Some(st.wait_cap.map_or(left, |c| c.min(left)));
        }
        st.poll(tracer, args.poll, infer_loaded)?;
        let now = Instant::now();
        if args
            .duration
            .is_some_and(|d| now.duration_since(started) >= d)
        {
            break "duration";
        }
        if matches!(st.source, Source::Deciding { .. }) {
            st.try_decide(agent_pid, args.sample_ppm, start_mono)?;
            st.start_observer()?;
        }
        if !decided && !matches!(st.source, Source::Deciding { .. }) {
            decided = true;
            meta.mode = st.mode_name();
            meta.sampling = st.sampling.clone();
            meta.write(&args.output)?;
        }
        st.start_burst(tracer, now)?;
        if let Some(b) = st.burst.as_mut() {
            let cap = match &mut st.source {
                Source::Infer => b.step(now, &mut InferWindows(tracer)),
                Source::Marker(m) => b.step(
                    now,
                    &mut MarkerWindows {
                        t: tracer,
                        m: m.as_mut(),
                    },
                ),
                Source::Deciding { .. } => Ok(MAX_WAIT),
            };
            match cap {
                Ok(c) => st.wait_cap = Some(c),
                Err(e) => st.abandon_burst(tracer, e)?,
            }
        }
        st.writer.tick(now)?;
        // Cheap but not free: every 50 ms.
        if std::mem::take(&mut st.exit_hint)
            || now.duration_since(last_slow) >= Duration::from_millis(50)
        {
            last_slow = now;
            let exited = match launched.as_mut() {
                Some(l) => l.try_wait().is_some(),
                None => watch.has_exited(),
            };
            if exited {
                if let Some(l) = launched.as_mut() {
                    meta.target.exit_status = l.try_wait();
                }
                break "target-exit";
            }
            progress.maybe_print(
                now,
                &Snapshot {
                    elapsed: now.duration_since(started),
                    requests: st.writer.rows(),
                    drops: st.drops(tracer),
                    bytes: st.writer.bytes_written(),
                },
            );
        }
        // Upkeep waits while a burst window is open: the window's first
        // drain must not be late (its rings fill at the in-window rate).
        let in_window = st.burst.as_ref().is_some_and(|b| !b.between_windows());
        if !in_window && now.duration_since(last_gc) >= Duration::from_secs(1) {
            last_gc = now;
            // a full sweep every GC_SWEEP_S seconds, a slice each second
            tracer.gc_dead_threads_step(TS_KC_ENTRIES / GC_SWEEP_S);
            // follows targets that change user (setuid after start)
            restrict_pin(tracer, &mut warned_pin);
            rescans += 1;
            if rescans % 5 == 1 {
                // reads every fd of the targets: every 5 s
                tracer.rescan_targets().map_err(agent_error)?;
            }
        }
    };
    progress.finish();
    Ok(by)
}

/// meta.json's `ldb` section.
fn ldb_meta(r: &ObserverReport, features: u32) -> serde_json::Value {
    json!({
        "observer": r.stats,
        "config": {
            "period_ns": r.config.period.as_nanos() as u64,
            "busy_poll": r.config.period.is_zero(),
            "threshold_ns": r.config.threshold_ns,
            "dte_tolerance": r.config.dte_tolerance,
            "mutex_thresh_ns": r.config.mutex_thresh_ns,
        },
        "runtime_features": {
            "fn_hooks": features & tailscope_abi::TS_FEAT_FN_HOOKS != 0,
            "lock_shim": features & tailscope_abi::TS_FEAT_LOCK_SHIM != 0,
            "fn_clock": features & tailscope_abi::TS_FEAT_FN_CLOCK != 0,
        },
        "rows": {
            "functions": r.functions.rows,
            "locks": r.locks.rows,
            "request_events": r.request_events.rows,
        },
        "modules": r.modules,
        "priority": r.priority,
    })
}

/// Path helper for tests and the integration owner.
pub fn region_path(pid: u32) -> PathBuf {
    MappedRegion::path(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_are_hot_when_nearly_full_or_dropping() {
        assert!(!ring_hot(0, 0, 0));
        assert!(!ring_hot(PRESSURE_FILL - 1, 7, 7), "old drops only");
        assert!(ring_hot(PRESSURE_FILL, 0, 0), "three quarters full");
        assert!(ring_hot(1, 8, 7), "a new drop");
    }

    #[test]
    fn output_checks() {
        let dir = crate::writer::tests::tempdir("out");
        let e = check_output(&dir, false).unwrap_err();
        assert_eq!(e.code, exit::OUTPUT);
        assert!(e
            .to_string()
            .ends_with("already exists; use --force to overwrite"));
        check_output(&dir, true).unwrap();
        // --force removes only recording files.
        std::fs::create_dir_all(dir.join("requests")).unwrap();
        std::fs::write(dir.join("requests/part-00000.parquet"), b"x").unwrap();
        std::fs::write(dir.join("meta.json"), b"{}").unwrap();
        std::fs::write(dir.join("notes.txt"), b"keep").unwrap();
        prepare_output(&dir).unwrap();
        assert!(!dir.join("meta.json").exists());
        assert!(!dir.join("requests/part-00000.parquet").exists());
        assert!(dir.join("notes.txt").exists());
        let f = dir.join("notes.txt");
        assert_eq!(check_output(&f, true).unwrap_err().code, exit::OUTPUT);
        std::fs::remove_dir_all(&dir).unwrap();
        check_output(&dir, false).unwrap();
    }
}
