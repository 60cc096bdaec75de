//! tailscope's eBPF programs and their loader.
//!
//! Two BPF objects are embedded (compiled from `bpf/` by build.rs):
//! - `kcounters` — per-thread cumulative kernel-event counters (on-CPU,
//!   runnable, blocked, irq, softirq, faults, switches, migrations) in the
//!   mmap-able array pinned at [`kc_pin_path`]`(agent pid)`, which the
//!   runtime maps and snapshots at request begin/end. Always loaded. Each
//!   agent has its own array and programs (they count only its targets),
//!   so several agents can record different processes at once.
//! - `infer` — zero-instrumentation requests inferred from socket syscalls,
//!   emitted as [`ts_request_record`]s on a ringbuf. Loaded and attached
//!   only with [`TracerOptions::infer`], since syscall tracepoints cost
//!   something on every syscall of every process.
//!
//! Invariants the rest of tailscope relies on:
//! - While a [`Tracer`] lives, the kcounters header says `live = 1` and the
//!   pin exists; on drop `live = 0` and the pin is gone.
//! - Only threads of processes passed to [`Tracer::add_target`] (and their
//!   forked children) get entries; everyone else costs one hash lookup per
//!   event.

use std::ffi::{c_int, c_void, CString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use libbpf_rs::{Link, MapCore, Object, ObjectBuilder, OpenObject, PrintLevel};
use tailscope_abi::{
    kc_pin_path, ts_kc_header, ts_kcounters, ts_request_record, RECORD_SIZE, TS_ABI_MAGIC,
    TS_ABI_VERSION, TS_DEFAULT_SAMPLE_PPM, TS_KC_ENTRIES, TS_KC_ENTRY_SIZE, TS_KC_PIN_DIR,
    TS_KC_PROBE, TS_PPM, TS_WAIT_NONE,
};

#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

static KCOUNTERS_OBJ: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("OUT_DIR"),
    "/kcounters.bpf.o"
)));
static INFER_OBJ: &Aligned<[u8]> =
    &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/infer.bpf.o")));

const TRACEFS: &str = "/sys/kernel/tracing";
const BPFFS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe4a11;
const TRACEFS_MAGIC: i64 = 0x74726163;

/// Tracepoints that only some machines have (irq_vectors are x86 and
/// config-dependent): a missing one is skipped, not an error. They are
/// also the rare vectors that stay attached between burst windows.
const OPTIONAL_TP_PREFIXES: &[&str] = &[
    "local_timer_",
    "call_function_",
    "reschedule_",
    "irq_work_",
    "x86_platform_ipi_",
    "error_apic_",
    "spurious_apic_",
    "thermal_apic_",
];

// infer.bpf.c stats[] indexes
const STAT_SEEN: u32 = 0;
const STAT_SAMPLED: u32 = 1;
const STAT_DROPS: u32 = 2;
const STAT_ABANDONED: u32 = 4;

#[derive(Debug, Clone)]
pub struct TracerOptions {
    /// Load and attach the socket-syscall request inference.
    pub infer: bool,
    /// Inferred requests sampled, in parts per million (0..=1_000_000).
    pub infer_sample_ppm: u32,
    /// Size of the inferred-record ringbuf; rounded up to a power of two >= 4 KiB.
    pub ringbuf_bytes: usize,
    /// Written into the kcounters header so runtimes can tell who records.
    pub agent_pid: u32,
    /// Burst sampling: inference starts with its sampling gate closed (the
    /// agent opens the first window).
    pub gate_closed_at_start: bool,
}

impl Default for TracerOptions {
    fn default() -> Self {
        TracerOptions {
            infer: false,
            infer_sample_ppm: TS_DEFAULT_SAMPLE_PPM,
            ringbuf_bytes: 4 << 20,
            agent_pid: std::process::id(),
            gate_closed_at_start: false,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct BpfStats {
    pub ringbuf_drops: u64,
    pub kc_collisions: u64,
    pub inferred_requests_seen: u64,
    pub inferred_requests_sampled: u64,
    /// Sampled inferred requests whose connection closed before a reply.
    pub inferred_abandoned: u64,
}

#[derive(Debug)]
pub enum TracerError {
    NotRoot(String),
    MissingCapability(String),
    LoadFailed {
        program: String,
        reason: String,
        hint: String,
    },
    Attach(String),
    Io(String),
}

impl std::fmt::Display for TracerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TracerError::NotRoot(s) => write!(f, "not root: {s}"),
            TracerError::MissingCapability(s) => write!(f, "missing capability: {s}"),
            TracerError::LoadFailed {
                program,
                reason,
                hint,
            } => write!(
                f,
                "BPF program {program} rejected by the kernel: {reason}; hint: {hint}"
            ),
            TracerError::Attach(s) => write!(f, "attach failed: {s}"),
            TracerError::Io(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for TracerError {}

/// Loaded programs, their links, and the mapped kcounters array.
pub struct Tracer {
    /// Where this tracer's kcounters array is pinned (one per agent).
    pin_path: String,
    kc_mem: *mut u8,
    kc_len: usize,
    kc_fd: OwnedFd,
    targets_fd: OwnedFd,
    buckets_fd: OwnedFd,
    server_ports_fd: Option<OwnedFd>,
    stats_fd: Option<OwnedFd>,
    rb: *mut libbpf_sys::ring_buffer,
    // Boxed: libbpf holds its address as the callback context, and the
    // Tracer may move.
    #[allow(clippy::box_collection)]
    rb_pending: Box<Vec<ts_request_record>>,
    skipped: Vec<String>,
    // Dropped after the Drop impl ran, links before objects. Each link
    // with its program's name, in attach order (exits before entries).
    links: Vec<(String, Link)>,
    /// Burst sampling: the per-request and per-interrupt programs are
    /// detached (see [`Tracer::set_window`]).
    burst_detached: bool,
    /// Burst sampling also switches the context-switch and wake-up programs
    /// (marker mode: see [`Tracer::set_sched_burst`]).
    sched_burst: bool,
    /// Burst windows opened so far (the gate's upper bits).
    window: u32,
    /// Where [`Tracer::gc_dead_threads_step`] resumes.
    gc_cursor: u32,
    /// Who may open the pin now (see [`Tracer::restrict_pin`]).
    pin_access: Option<PinAccess>,
    gate_fd: Option<OwnedFd>,
    open_sampled_fd: Option<OwnedFd>,
    /// Whether the Unix-socket receive hook is attached (see
    /// [`Tracer::watch_unix`]).
    unix_hook: bool,
    _infer_obj: Option<Object>,
    _kc_obj: Object,
}

/// Programs that [`attach_all`] leaves for later: `sock_recv_length` runs for
/// every receive on every socket of the machine (the loader's client too),
/// yet only Unix-socket requests need it (TCP requests open in
/// `tcp_rcv_space_adjust`). It is attached once a target holds a Unix
/// socket: about a quarter of all program runs under a TCP load.
const DEFERRED_PROGS: &[&str] = &["sock_recv_length"];

/// Programs that stay attached between burst-sampling windows: the
/// scheduler's (they keep each thread's switch and wait state, which a
/// window's first requests need), process fork/exit, listen/close tracking,
/// and the rare interrupt vectors ([`OPTIONAL_TP_PREFIXES`]: timer, IPIs,
/// irq work, APIC errors; a few hundred a second). Only what runs per
/// request or per packet is switched: softirqs, device irqs, page faults
/// and the inference programs.
/// Every switch patches kernel text and interrupts every CPU, several times
/// per program, so fewer switched programs mean fewer stalls.
const ALWAYS_ON_PREFIXES: &[&str] = &["sched_", "inet_sock_set_state"];

/// The scheduler programs that [`Tracer::set_sched_burst`] adds to the
/// switched set: the two that run per context switch and per wake-up (about
/// half of all program time at 1% sampling). Fork, exit, migration and
/// new-thread wake-ups are rare and stay.
const SCHED_BURST_PROGS: &[&str] = &["sched_switch", "sched_wakeup"];

fn burstable(name: &str) -> bool {
    !ALWAYS_ON_PREFIXES
        .iter()
        .chain(OPTIONAL_TP_PREFIXES)
        .any(|p| name.starts_with(p))
}

/// Who may open an agent's pinned counters array (see [`Tracer::restrict_pin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinAccess {
    /// Only this uid (and root): 0600.
    Owner(u32),
    /// The targets run as these several non-root uids: 0666.
    Everyone(Vec<u32>),
}

/// The filesystem uid process `tgid` runs as now (the one permission checks
/// use), from /proc/<tgid>/status; None if it is gone.
fn fs_uid(tgid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{tgid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("Uid:"))?;
    // real, effective, saved, filesystem
    line.split_whitespace().nth(4)?.parse().ok()
}

/// Whether process `tgid` holds a Unix-domain socket now: one of its fds is
/// a socket whose inode is in its network namespace's /proc/net/unix.
pub fn holds_unix_socket(tgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{tgid}/fd")) else {
        return false;
    };
    let mut inodes = std::collections::HashSet::new();
    for e in dir.flatten() {
        if let Ok(l) = std::fs::read_link(e.path()) {
            let l = l.to_string_lossy();
            if let Some(n) = l.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                if let Ok(n) = n.parse::<u64>() {
                    inodes.insert(n);
                }
            }
        }
    }
    if inodes.is_empty() {
        return false;
    }
    let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/net/unix")) else {
        return false;
    };
    let found = unix_inodes(&text).any(|i| inodes.contains(&i));
    found
}

/// The inode column of /proc/net/unix (the 7th field; the header skipped).
fn unix_inodes(text: &str) -> impl Iterator<Item = u64> + '_ {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(6)?.parse().ok())
}

// SAFETY: the raw pointers are an mmap owned by this Tracer and a libbpf
// ring_buffer used only through &mut self; nothing is shared with another
// thread behind our back.
unsafe impl Send for Tracer {}
// SAFETY: &self methods only read the mapping (volatile/seqlock) and do map
// syscalls; the ring buffer and pending records need &mut self.
unsafe impl Sync for Tracer {}

// ---- libbpf log capture ----------------------------------------------------

static LIBBPF_LOG: Mutex<String> = Mutex::new(String::new());

fn capture_print(_level: PrintLevel, msg: String) {
    let mut log = LIBBPF_LOG.lock().unwrap_or_else(|e| e.into_inner());
    if log.len() > 1 << 20 {
        let cut = log.len() - (1 << 19);
        let cut = (cut..log.len())
            .find(|&i| log.is_char_boundary(i))
            .unwrap_or(0);
        log.drain(..cut);
    }
    log.push_str(&msg);
}

/// The libbpf output (verifier logs included) captured during the last
/// [`Tracer::load`]; for `--verbose` diagnostics.
pub fn last_libbpf_log() -> String {
    LIBBPF_LOG.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The program named in the last failure, and the verifier's reason: the
/// last meaningful line of the last "PROG LOAD LOG".
fn explain_load_failure(log: &str) -> (Option<String>, Option<String>) {
    let program = log
        .lines()
        .rev()
        .filter(|l| l.contains("failed") || l.contains("LOAD LOG"))
        .find_map(|l| {
            let s = l.find("prog '")? + 6;
            let e = l[s..].find('\'')? + s;
            Some(l[s..e].to_string())
        });
    let reason = log.rfind("-- BEGIN PROG LOAD LOG --").and_then(|b| {
        let body = &log[b..];
        let body = &body[..body.find("-- END PROG LOAD LOG --").unwrap_or(body.len())];
        body.lines()
            .skip(1)
            .map(str::trim)
            .filter(|l| {
                !l.is_empty()
                    && !l.starts_with("processed ")
                    && !l.starts_with("verification time")
                    && !l.starts_with("stack depth")
                    && !l.starts_with("libbpf:")
            })
            .last()
            .map(String::from)
    });
    let reason = reason.or_else(|| {
        log.lines()
            .rev()
            .find(|l| l.contains("failed"))
            .map(|l| l.trim().to_string())
    });
    (program, reason)
}

fn load_error(what: &str, err: libbpf_rs::Error) -> TracerError {
    let log = last_libbpf_log();
    let (program, reason) = explain_load_failure(&log);
    let reason = reason.unwrap_or_else(|| err.to_string());
    let hint = if reason.contains("EPERM") || reason.contains("Operation not permitted") {
        "run as root, or grant CAP_BPF+CAP_PERFMON (and raise RLIMIT_MEMLOCK on kernels < 5.11)"
    } else if reason.contains("attach_btf_id")
        || reason.contains("btf_trace")
        || reason.contains("BTF")
    {
        "this kernel lacks a tracepoint or BTF the program needs (need CONFIG_DEBUG_INFO_BTF, kernel >= 5.8)"
    } else {
        "the verifier of this kernel rejects the program; see tailscope_bpf::last_libbpf_log() for the full log"
    };
    TracerError::LoadFailed {
        program: program.unwrap_or_else(|| what.to_string()),
        reason,
        hint: hint.to_string(),
    }
}

// ---- privileges and filesystems --------------------------------------------

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("CapEff:"))
                .and_then(|l| u64::from_str_radix(l[7..].trim(), 16).ok())
        })
        .unwrap_or(0)
}

fn check_privileges() -> Result<(), TracerError> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(TracerError::NotRoot(format!(
            "euid {euid} cannot load BPF programs; run as root or grant CAP_BPF+CAP_PERFMON"
        )));
    }
    Err(TracerError::MissingCapability(format!(
        "root without CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN (CapEff={caps:#x}); run outside a restricted container"
    )))
}

fn fs_magic(path: &str) -> Option<i64> {
    let c = CString::new(path).ok()?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_type as i64)
}

fn ensure_mounted(path: &str, fstype: &str, magic: i64) -> Result<(), TracerError> {
    if fs_magic(path) == Some(magic) {
        return Ok(());
    }
    std::fs::create_dir_all(path).map_err(|e| TracerError::Io(format!("mkdir {path}: {e}")))?;
    let src = CString::new(fstype).unwrap();
    let dst = CString::new(path).unwrap();
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            src.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(TracerError::Io(format!(
            "mount -t {fstype} {fstype} {path}: {e}"
        )));
    }
    Ok(())
}

/// Names of the tracepoints this kernel has (tracefs events/*/*).
fn available_tracepoints() -> Option<std::collections::HashSet<String>> {
    let mut set = std::collections::HashSet::new();
    for sys in std::fs::read_dir(format!("{TRACEFS}/events"))
        .ok()?
        .flatten()
    {
        if let Ok(evs) = std::fs::read_dir(sys.path()) {
            for ev in evs.flatten() {
                set.insert(ev.file_name().to_string_lossy().into_owned());
            }
        }
    }
    Some(set)
}

/// Buckets of the BPF target pre-filter (`TS_TGID_BUCKETS` in bpf/kc_entry.h).
const TS_TGID_BUCKETS: u32 = 4096;

/// Local ports of the LISTEN sockets in a /proc/net/tcp{,6} table.
/// Malformed lines are skipped.
pub fn listening_ports(table: &str) -> Vec<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let local = it.nth(1)?;
            let state = it.nth(1)?;
            if state != "0A" {
                return None;
            }
            let port = local.rsplit_once(':')?.1;
            u16::from_str_radix(port, 16).ok()
        })
        .collect()
}

/// The tracepoint a program attaches to, from its section name
/// ("tp_btf/sched_switch", "tracepoint/syscalls/sys_enter_read").
fn tp_of_section(section: &str) -> &str {
    section.rsplit('/').next().unwrap_or(section)
}

// ---- loading ----------------------------------------------------------------

fn open(bytes: &'static [u8], name: &str) -> Result<OpenObject, TracerError> {
    let mut b = ObjectBuilder::default();
    b.open_memory(bytes).map_err(|e| load_error(name, e))
}

/// Skips programs whose tracepoint this kernel lacks (tp_btf programs would
/// otherwise fail the whole object at load), when it is optional.
fn disable_missing(open: &mut OpenObject, skipped: &mut Vec<String>) -> Result<(), TracerError> {
    let Some(avail) = available_tracepoints() else {
        return Ok(());
    };
    for mut p in open.progs_mut() {
        let section = p.section().to_string_lossy().into_owned();
        let tp = tp_of_section(&section).to_string();
        if avail.contains(&tp) {
            continue;
        }
        if OPTIONAL_TP_PREFIXES.iter().any(|pre| tp.starts_with(pre)) {
            p.set_autoload(false);
            skipped.push(tp);
        } else {
            return Err(TracerError::LoadFailed {
                program: p.name().to_string_lossy().into_owned(),
                reason: format!("tracepoint {tp} does not exist on this kernel"),
                hint: "tailscope needs sched, irq, exceptions and syscalls tracepoints".into(),
            });
        }
    }
    Ok(())
}

/// Writes the first u32 of an object's 8-byte config struct, its only
/// .rodata variable, before load.
fn set_config(
    m: &mut libbpf_rs::OpenMapMut<'_>,
    obj: &str,
    var: &str,
    value: u32,
    salt: u32,
) -> Result<(), TracerError> {
    let v = m
        .initial_value_mut()
        .ok_or_else(|| TracerError::Io(format!("{obj} .rodata not mapped")))?;
    if v.len() != 8 {
        return Err(TracerError::Io(format!(
            "{obj} .rodata is {} bytes, expected only {var} (8)",
            v.len()
        )));
    }
    v[..4].copy_from_slice(&value.to_ne_bytes());
    v[4..8].copy_from_slice(&salt.to_ne_bytes());
    Ok(())
}

/// A per-load salt for the stateless TCP sampling draw (infer.bpf.c), so
/// that two recordings of the same connections sample different requests.
fn random_salt() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom into a local buffer of its length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 4 {
        u32::from_ne_bytes(b)
    } else {
        std::process::id()
            ^ (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos()))
    }
}

/// The start time (clock ticks since boot, /proc/<tgid>/stat field 22) of
/// process `tgid`, which tells it apart from a later process with its pid;
/// None if it is gone or a zombie (its exit has run).
fn process_start(tgid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    // after "pid (comm)": state is field 3, starttime field 22
    let mut f = s.get(s.rfind(')')? + 1..)?.split_whitespace();
    if matches!(f.next()?, "Z" | "X") {
        return None;
    }
    f.nth(18)?.parse().ok()
}

/// Removes `key` from a map with u32 keys (absent: nothing to do).
fn map_delete(fd: &OwnedFd, key: u32) {
    // SAFETY: a u32 key for a map with u32 keys.
    unsafe {
        libbpf_sys::bpf_map_delete_elem(fd.as_raw_fd(), &key as *const u32 as *const c_void);
    }
}

/// `map[key] = value` on a map with u32 keys.
fn map_set<V: Copy>(fd: &OwnedFd, key: u32, value: V) -> std::io::Result<()> {
    let rc = unsafe {
        libbpf_sys::bpf_map_update_elem(
            fd.as_raw_fd(),
            &key as *const u32 as *const c_void,
            &value as *const V as *const c_void,
            libbpf_sys::BPF_ANY as u64,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn map_fd(obj: &Object, name: &str) -> Result<OwnedFd, TracerError> {
    let m = obj
        .maps()
        .find(|m| m.name() == name)
        .ok_or_else(|| TracerError::Io(format!("BPF object has no map {name}")))?;
    m.as_fd()
        .try_clone_to_owned()
        .map_err(|e| TracerError::Io(format!("dup map fd {name}: {e}")))
}

/// Attaches every loaded program; exits before entries, so that an entry
/// never opens an interrupt frame whose exit we cannot see.
fn attach_all(
    obj: &Object,
    links: &mut Vec<(String, Link)>,
    skipped: &mut Vec<String>,
    want: &dyn Fn(&str) -> bool,
) -> Result<(), TracerError> {
    let mut progs: Vec<_> = obj.progs_mut().collect();
    progs.sort_by_key(|p| !p.name().to_string_lossy().ends_with("_exit"));
    // Diagnostic knob (bench/docs): TAILSCOPE_DEBUG_SKIP=prog,prog leaves
    // programs unattached, to measure what each one costs.
    let skip = std::env::var("TAILSCOPE_DEBUG_SKIP").unwrap_or_default();
    for p in progs {
        let name = p.name().to_string_lossy().into_owned();
        if !p.autoload() || !want(&name) {
            continue;
        }
        if skip
            .split(',')
            .any(|s| !s.is_empty() && name.starts_with(s))
        {
            skipped.push(format!("{name} (TAILSCOPE_DEBUG_SKIP)"));
            continue;
        }
        match p.attach() {
            Ok(l) => links.push((name, l)),
            Err(e) if OPTIONAL_TP_PREFIXES.iter().any(|pre| name.starts_with(pre)) => {
                skipped.push(format!("{name} ({e})"));
            }
            Err(e) => return Err(TracerError::Attach(format!("{name}: {e}"))),
        }
    }
    Ok(())
}

/// Whether the array pinned at `path` belongs to a live agent other than
/// this process (its header says live, and its agent process exists).
fn pin_owned_by_live_agent(path: &str) -> bool {
    let Ok(fd) = libbpf_rs::MapHandle::from_pinned_path(path) else {
        return false;
    };
    let key = 0u32.to_ne_bytes();
    let Ok(Some(v)) = fd.lookup(&key, libbpf_rs::MapFlags::ANY) else {
        return false;
    };
    if v.len() < std::mem::size_of::<ts_kc_header>() {
        return false;
    }
    let h: ts_kc_header = unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) };
    h.magic == TS_ABI_MAGIC
        && h.live == 1
        && h.agent_pid != std::process::id()
        && Path::new(&format!("/proc/{}", h.agent_pid)).exists()
}

/// Creates the pin directory, or checks the one that is there. bpffs is
/// world-writable (sticky), so a local user could have made it, or a symlink
/// in its place, before the first agent: whoever owns it could swap the
/// pins a runtime maps. Refuse anything but a root-owned real directory that
/// only root can write.
fn ensure_pin_dir() -> Result<(), TracerError> {
    let io =
        |what: &str, e: std::io::Error| TracerError::Io(format!("{what} {TS_KC_PIN_DIR}: {e}"));
    match std::fs::create_dir(TS_KC_PIN_DIR) {
        Ok(()) => std::fs::set_permissions(TS_KC_PIN_DIR, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io("chmod", e))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("mkdir", e)),
    }
    check_pin_dir(TS_KC_PIN_DIR)
}

fn check_pin_dir(dir: &str) -> Result<(), TracerError> {
    use std::os::unix::fs::MetadataExt;
    let m =
        std::fs::symlink_metadata(dir).map_err(|e| TracerError::Io(format!("stat {dir}: {e}")))?;
    if !m.file_type().is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(TracerError::Io(format!(
            "{dir} is not a root-owned directory that only root can write \
             (uid {}, mode {:o}); remove it and run again",
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Whether the agent with this pid is alive and recording: its array is
/// pinned, says live, and its process exists.
pub fn agent_is_live(pid: u32) -> bool {
    pin_owned_by_live_agent(&kc_pin_path(pid))
}

/// Marks a stale array dead (`live = 0`) before its pin goes. A runtime may
/// still map it: a SIGKILLed agent left `live = 1`, and the next agent with
/// the same pid pins a new array at the same path, so without this the
/// runtime would keep snapshotting the dead array, whose counters never move.
fn mark_dead(path: &str) {
    let Ok(fd) = libbpf_rs::MapHandle::from_pinned_path(path) else {
        return;
    };
    let key = 0u32.to_ne_bytes();
    let Ok(Some(mut v)) = fd.lookup(&key, libbpf_rs::MapFlags::ANY) else {
        return;
    };
    let off = std::mem::offset_of!(ts_kc_header, live);
    if v.len() >= off + 4 {
        v[off..off + 4].copy_from_slice(&0u32.to_ne_bytes());
        let _ = fd.update(&key, &v, libbpf_rs::MapFlags::ANY);
    }
}

/// Removes the arrays that agents which are gone left pinned (killed with
/// SIGKILL, they could not unpin: each holds 8 MiB of kernel memory), and
/// this pid's own leftover. Other live agents' pins stay: each agent has its
/// own array, so several can record at once. Best effort: another agent
/// may be removing the same pins at the same moment.
fn remove_stale_pins(own: &str) {
    let Ok(dir) = std::fs::read_dir(TS_KC_PIN_DIR) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let path = format!("{TS_KC_PIN_DIR}/{name}");
        let ours = name == "kcounters" || name.starts_with("kcounters-");
        if !ours || (path != own && pin_owned_by_live_agent(&path)) {
            continue;
        }
        mark_dead(&path);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("tailscope: warning: cannot remove stale {path}: {e}"),
        }
    }
}

unsafe extern "C" fn on_record(
    ctx: *mut c_void,
    data: *mut c_void,
    size: libbpf_sys::size_t,
) -> c_int {
    if (size as usize) >= RECORD_SIZE && !ctx.is_null() {
        let out = &mut *(ctx as *mut Vec<ts_request_record>);
        out.push(std::ptr::read_unaligned(data as *const ts_request_record));
    }
    0
}

impl Tracer {
    /// Mounts tracefs/bpffs if needed, checks privileges, loads and attaches
    /// the programs, fills the kcounters header and pins the array.
    pub fn load(opts: &TracerOptions) -> Result<Tracer, TracerError> {
        check_privileges()?;
        ensure_mounted(TRACEFS, "tracefs", TRACEFS_MAGIC)?;
        ensure_mounted(BPFFS, "bpf", BPF_FS_MAGIC)?;
        LIBBPF_LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
        libbpf_rs::set_print(Some((PrintLevel::Info, capture_print)));

        let mut skipped = Vec::new();
        let mut open_kc = open(&KCOUNTERS_OBJ.0, "kcounters")?;
        disable_missing(&mut open_kc, &mut skipped)?;
        let kc_obj = open_kc.load().map_err(|e| load_error("kcounters", e))?;
        let kc_fd = map_fd(&kc_obj, "kcounters")?;
        let targets_fd = map_fd(&kc_obj, "targets")?;
        let buckets_fd = map_fd(&kc_obj, "target_buckets")?;
        // One source of truth for the bucket count (bpf/kc_entry.h): check
        // the loaded map against this side's constant.
        let nb = kc_obj
            .maps()
            .find(|m| m.name() == "target_buckets")
            .and_then(|m| m.info().ok())
            .map(|i| i.info.max_entries)
            .unwrap_or(0);
        if nb != TS_TGID_BUCKETS {
            return Err(TracerError::Io(format!(
                "target_buckets has {nb} entries, the loader expects {TS_TGID_BUCKETS}"
            )));
        }

        // Map the array and write the header before anyone can see the pin.
        let kc_len = TS_KC_ENTRIES as usize * TS_KC_ENTRY_SIZE as usize;
        let mem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                kc_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                kc_fd.as_raw_fd(),
                0,
            )
        };
        if mem == libc::MAP_FAILED {
            return Err(TracerError::Io(format!(
                "mmap kcounters: {}",
                std::io::Error::last_os_error()
            )));
        }
        let mut t = Tracer {
            pin_path: kc_pin_path(opts.agent_pid),
            kc_mem: mem.cast(),
            kc_len,
            kc_fd,
            targets_fd,
            buckets_fd,
            server_ports_fd: None,
            stats_fd: None,
            rb: std::ptr::null_mut(),
            rb_pending: Box::new(Vec::new()),
            skipped,
            links: Vec::new(),
            burst_detached: false,
            sched_burst: false,
            window: 0,
            gc_cursor: 1,
            pin_access: None,
            gate_fd: None,
            open_sampled_fd: None,
            unix_hook: false,
            _infer_obj: None,
            _kc_obj: kc_obj,
        };
        unsafe {
            let h = t.kc_mem as *mut ts_kc_header;
            std::ptr::write_volatile(
                h,
                ts_kc_header {
                    magic: TS_ABI_MAGIC,
                    abi_version: TS_ABI_VERSION,
                    entry_size: TS_KC_ENTRY_SIZE,
                    entries: TS_KC_ENTRIES,
                    agent_pid: opts.agent_pid,
                    live: 1,
                    _pad0: 0,
                    collisions: 0,
                    _reserved: [0; 88],
                },
            );
        }

        ensure_pin_dir()?;
        remove_stale_pins(&t.pin_path);
        let path = CString::new(t.pin_path.as_str()).unwrap();
        if unsafe { libbpf_sys::bpf_obj_pin(t.kc_fd.as_raw_fd(), path.as_ptr()) } != 0 {
            return Err(TracerError::Io(format!(
                "pin {}: {}",
                t.pin_path,
                std::io::Error::last_os_error()
            )));
        }
        // Only root until the targets are known (restrict_pin): a runtime that
        // opens it meanwhile is refused and retries.
        std::fs::set_permissions(&t.pin_path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| TracerError::Io(format!("chmod {}: {e}", t.pin_path)))?;

        let mut links = Vec::new();
        attach_all(&t._kc_obj, &mut links, &mut t.skipped, &|_| true)?;
        t.links = links;

        if opts.infer {
            t.load_infer(opts)?;
        }
        Ok(t)
    }

    fn load_infer(&mut self, opts: &TracerOptions) -> Result<(), TracerError> {
        let mut open_inf = open(&INFER_OBJ.0, "infer")?;
        let ppm = opts.infer_sample_ppm.min(TS_PPM);
        let rb_bytes = opts.ringbuf_bytes.max(4096).next_power_of_two();
        for mut m in open_inf.maps_mut() {
            let name = m.name().to_string_lossy().into_owned();
            let io = |e: libbpf_rs::Error| TracerError::Io(format!("infer map {name}: {e}"));
            match name.as_str() {
                "kcounters" => m.reuse_fd(self.kc_fd.as_fd()).map_err(io)?,
                "targets" => m.reuse_fd(self.targets_fd.as_fd()).map_err(io)?,
                "target_buckets" => m.reuse_fd(self.buckets_fd.as_fd()).map_err(io)?,
                "records" => m.set_max_entries(rb_bytes as u32).map_err(io)?,
                n if n.ends_with(".rodata") => {
                    set_config(&mut m, "infer", "infer_cfg", ppm, random_salt())?
                }
                _ => {}
            }
        }
        disable_missing(&mut open_inf, &mut self.skipped)?;
        let obj = open_inf.load().map_err(|e| load_error("infer", e))?;
        let rb_fd = map_fd(&obj, "records")?;
        self.stats_fd = Some(map_fd(&obj, "infer_stats")?);
        self.server_ports_fd = Some(map_fd(&obj, "server_ports")?);
        let ctx = &mut *self.rb_pending as *mut Vec<ts_request_record> as *mut c_void;
        let rb = unsafe {
            libbpf_sys::ring_buffer__new(rb_fd.as_raw_fd(), Some(on_record), ctx, std::ptr::null())
        };
        if rb.is_null() {
            return Err(TracerError::Io(format!(
                "ring_buffer__new: {}",
                std::io::Error::last_os_error()
            )));
        }
        self.rb = rb;
        self.gate_fd = Some(map_fd(&obj, "burst_gate")?);
        self.open_sampled_fd = Some(map_fd(&obj, "open_sampled")?);
        if opts.gate_closed_at_start {
            self.set_gate(false)?;
        }
        attach_all(&obj, &mut self.links, &mut self.skipped, &|n| {
            !DEFERRED_PROGS.contains(&n)
        })?;
        self._infer_obj = Some(obj);
        Ok(())
    }

    /// Accounts the threads of process `tgid` (and of the children it forks).
    pub fn add_target(&mut self, tgid: u32) -> Result<(), TracerError> {
        let gone = || TracerError::Io(format!("add target {tgid}: the process has exited"));
        let started = process_start(tgid).ok_or_else(gone)?;
        // The pre-filter bucket first: BPF checks it before the set.
        let bucket = tgid & (TS_TGID_BUCKETS - 1);
        map_set(&self.buckets_fd, bucket, 1u32)
            .map_err(|e| TracerError::Io(format!("add target {tgid}: bucket: {e}")))?;
        map_set(&self.targets_fd, tgid, 1u8)
            .map_err(|e| TracerError::Io(format!("add target {tgid}: {e}")))?;
        // BPF removes a target when it exits (sched_process_exit). One that
        // exited before the insert would stay, and its pid could later name
        // another user's process: accounted, and given the pinned array
        // (restrict_pin). So the same process must still be there.
        if process_start(tgid) != Some(started) {
            map_delete(&self.targets_fd, tgid);
            return Err(gone());
        }
        if self.server_ports_fd.is_some() {
            self.mark_listening_ports(tgid)?;
            self.watch_unix(tgid)?;
        }
        Ok(())
    }

    /// Attaches the Unix-socket receive hook (see [`DEFERRED_PROGS`]) if
    /// `tgid` holds a Unix socket and the hook is not attached yet. Returns
    /// whether it is attached. Without inference there is nothing to do.
    pub fn watch_unix(&mut self, tgid: u32) -> Result<bool, TracerError> {
        if self.unix_hook {
            return Ok(true);
        }
        if self._infer_obj.is_none() || !holds_unix_socket(tgid) {
            return Ok(false);
        }
        if self.burst_detached {
            // Between burst windows: attached with the next window.
            self.unix_hook = true;
            return Ok(true);
        }
        let Some(obj) = self._infer_obj.as_mut() else {
            return Ok(false);
        };
        let skip = std::env::var("TAILSCOPE_DEBUG_SKIP").unwrap_or_default();
        for name in DEFERRED_PROGS {
            if skip
                .split(',')
                .any(|s| !s.is_empty() && name.starts_with(s))
            {
                continue;
            }
            if let Some(p) = obj.progs_mut().find(|p| p.name() == *name) {
                let l = p
                    .attach()
                    .map_err(|e| TracerError::Attach(format!("{name}: {e}")))?;
                self.links.push((name.to_string(), l));
            }
        }
        self.unix_hook = true;
        Ok(true)
    }

    /// Periodic work for added targets (the recorder calls it about once a
    /// second): attaches the Unix-socket hook once one of them opens a Unix
    /// socket. Processes that exited are forgotten.
    pub fn rescan_targets(&mut self) -> Result<(), TracerError> {
        if self.unix_hook || self._infer_obj.is_none() {
            return Ok(());
        }
        // The target set includes forked children (daemons, pre-fork
        // workers), not only what was added.
        for p in self.target_tgids() {
            if self.watch_unix(p)? {
                break;
            }
        }
        Ok(())
    }

    /// Lets exactly the targets' users open this agent's pinned counters
    /// array. The runtime in a target opens the pin (BPF_OBJ_GET) with the
    /// target's filesystem uid and maps it read-write, and anyone who can
    /// open it can rewrite every thread's counters or mark the agent dead.
    /// So: owner = the one non-root uid the targets run as (root needs no
    /// grant), mode 0600. Targets that run as several non-root users (rare)
    /// cannot all be owner: the array then stays world-writable, and the
    /// result says so. Called when targets are added and periodically, so
    /// a target that drops privileges after start (setuid) is followed:
    /// its runtime retries the open every 100 ms.
    pub fn restrict_pin(&mut self) -> Result<PinAccess, TracerError> {
        let mut uids: Vec<u32> = self
            .target_tgids()
            .into_iter()
            .filter_map(fs_uid)
            .filter(|&u| u != 0)
            .collect();
        uids.sort_unstable();
        uids.dedup();
        let (owner, mode, access) = match uids.as_slice() {
            [] => (0, 0o600, PinAccess::Owner(0)),
            [u] => (*u, 0o600, PinAccess::Owner(*u)),
            many => (0, 0o666, PinAccess::Everyone(many.to_vec())),
        };
        if self.pin_access.as_ref() == Some(&access) {
            return Ok(access);
        }
        // Mode first when narrowing, owner first when widening: never
        // readable by a user who is neither the old nor the new owner.
        std::fs::set_permissions(&self.pin_path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| TracerError::Io(format!("chmod {}: {e}", self.pin_path)))?;
        std::os::unix::fs::chown(&self.pin_path, Some(owner), Some(0))
            .map_err(|e| TracerError::Io(format!("chown {}: {e}", self.pin_path)))?;
        if mode != 0o600 {
            std::fs::set_permissions(&self.pin_path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| TracerError::Io(format!("chmod {}: {e}", self.pin_path)))?;
        }
        self.pin_access = Some(access.clone());
        Ok(access)
    }

    /// Whether the Unix-socket receive hook is attached.
    pub fn unix_hook_attached(&self) -> bool {
        self.unix_hook
    }

    /// Burst sampling: opens or closes the sampling gate of inference (no
    /// request is sampled while it is closed) for the current window.
    pub fn set_gate(&mut self, open: bool) -> Result<(), TracerError> {
        let Some(fd) = self.gate_fd.as_ref() else {
            return Ok(());
        };
        // bit 0: closed; above it the window number (see infer.bpf.c)
        map_set(fd, 0, (self.window << 1) | u32::from(!open))
            .map_err(|e| TracerError::Io(format!("burst gate: {e}")))
    }

    /// Sampled inferred requests of the current burst window still open
    /// (0 without inference).
    pub fn open_sampled(&self) -> i64 {
        let Some(fd) = self.open_sampled_fd.as_ref() else {
            return 0;
        };
        let mut v = 0i64;
        let key = self.window & 1;
        let rc = unsafe {
            libbpf_sys::bpf_map_lookup_elem(
                fd.as_raw_fd(),
                &key as *const u32 as *const c_void,
                &mut v as *mut i64 as *mut c_void,
            )
        };
        if rc == 0 {
            v
        } else {
            0
        }
    }

    /// Burst sampling, steps 2 and 3: detaches (`attached = false`) or
    /// re-attaches every program that runs per request or per interrupt
    /// (all but [`ALWAYS_ON_PREFIXES`]). Detaching goes in reverse attach
    /// order, entries before exits, so that no interrupt frame opens
    /// without its exit; attaching puts exits first again. Close the gate
    /// and let open sampled requests end before detaching.
    pub fn set_window(&mut self, attached: bool) -> Result<(), TracerError> {
        if attached != self.burst_detached {
            return Ok(());
        }
        let sched = self.sched_burst;
        let switched = move |n: &str| burstable(n) || (sched && SCHED_BURST_PROGS.contains(&n));
        if !attached {
            let mut keep = Vec::with_capacity(self.links.len());
            while let Some((n, l)) = self.links.pop() {
                if switched(&n) {
                    drop(l);
                } else {
                    keep.push((n, l));
                }
            }
            keep.reverse();
            self.links = keep;
            self.burst_detached = true;
            // The next window's number, gate closed; its open-request slot
            // (last used two windows ago) starts from zero. Requests of
            // this window still open are now stale (infer.bpf.c).
            self.window = self.window.wrapping_add(1) & (u32::MAX >> 1);
            self.set_gate(false)?;
            if let Some(fd) = self.open_sampled_fd.as_ref() {
                map_set(fd, self.window & 1, 0i64)
                    .map_err(|e| TracerError::Io(format!("burst: open_sampled: {e}")))?;
            }
            return Ok(());
        }
        // An interrupt that was running through the whole detach left its
        // frame on the shadow stack (its exit was detached): start every
        // CPU's stack empty. No program that writes it is attached now.
        self.clear_irq_stacks()?;
        if sched {
            self.reset_sched_state();
        }
        let unix = self.unix_hook;
        let mut scratch = Vec::new();
        // All or nothing: a failure part-way detaches what this call
        // attached, so that a retry (abandon_burst) does not attach a
        // program twice (a doubled sched_switch or irq exit would count
        // every event twice, or pop the wrong interrupt frame).
        let before = self.links.len();
        let mut r = attach_all(&self._kc_obj, &mut self.links, &mut scratch, &switched);
        if let (Ok(()), Some(obj)) = (&r, self._infer_obj.as_ref()) {
            r = attach_all(obj, &mut self.links, &mut scratch, &|n| {
                burstable(n) && (unix || !DEFERRED_PROGS.contains(&n))
            });
        }
        if let Err(e) = r {
            while self.links.len() > before {
                self.links.pop();
            }
            return Err(e);
        }
        self.burst_detached = false;
        Ok(())
    }

    /// Burst sampling in marker mode: also detach [`SCHED_BURST_PROGS`]
    /// between windows. Only where every snapshot is taken by the running
    /// thread itself (the runtime's): while they are detached each entry's
    /// switch and wait state goes stale, and [`Tracer::set_window`] resets
    /// it before re-attaching (see [`Tracer::reset_sched_state`]). Not for
    /// inference, whose snapshots are also taken for sleeping threads.
    /// Only while attached.
    pub fn set_sched_burst(&mut self, on: bool) -> Result<(), TracerError> {
        if self.burst_detached {
            return Err(TracerError::Io(
                "set_sched_burst: the window is closed".to_string(),
            ));
        }
        self.sched_burst = on;
        Ok(())
    }

    /// Before the scheduler programs are re-attached: mark every thread of
    /// the targets as running since now, with no open wait. Whatever the
    /// thread did while they were detached is unknown; this guess is right
    /// for a thread that is running (the busy server thread that never
    /// sleeps, whose requests would otherwise have no counters until it
    /// does) and harmless for one that is not: the first events seen for it
    /// are its wake-up (a no-op with no open wait) and its switch-in, which
    /// sets its state, and a request only starts on a running thread. A stale
    /// on-CPU start before a request cancels in the request's difference of
    /// two snapshots. A thread the reset missed (created meanwhile) keeps
    /// `switch_in_ns == 0` until its first switch-in, and the runtime gives
    /// its requests no counters until then (kcounters.c ts_kc_snapshot).
    fn reset_sched_state(&self) {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec out-pointer. CLOCK_MONOTONIC is
        // bpf_ktime_get_ns()'s clock.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        for tgid in self.target_tgids() {
            let Ok(dir) = std::fs::read_dir(format!("/proc/{tgid}/task")) else {
                continue;
            };
            for ent in dir.flatten() {
                let Some(tid) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                let Some(e) = self.find_entry(tid) else {
                    continue;
                };
                // SAFETY: e points into our mapping (find_entry). The
                // seqlock brackets the writes for the runtime's readers;
                // the programs that may still write this entry meanwhile
                // (migration, exit) take the same seqlock.
                unsafe {
                    let seq =
                        std::sync::atomic::AtomicU32::from_ptr(std::ptr::addr_of_mut!((*e).seq));
                    seq.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    std::ptr::write_volatile(std::ptr::addr_of_mut!((*e).switch_in_ns), now);
                    std::ptr::write_volatile(std::ptr::addr_of_mut!((*e).wait_state), TS_WAIT_NONE);
                    std::ptr::write_volatile(std::ptr::addr_of_mut!((*e).wait_since_ns), 0);
                    std::ptr::write_volatile(std::ptr::addr_of_mut!((*e).last_blocked_ns), 0);
                    seq.fetch_add(1, std::sync::atomic::Ordering::Release);
                }
            }
        }
    }

    fn clear_irq_stacks(&self) -> Result<(), TracerError> {
        let Some(m) = self._kc_obj.maps().find(|m| m.name() == "irq_stacks") else {
            return Ok(());
        };
        let ncpu = unsafe { libbpf_sys::libbpf_num_possible_cpus() };
        if ncpu <= 0 {
            return Ok(());
        }
        let per = (m.value_size() as usize).div_ceil(8) * 8;
        let zeros = vec![0u8; per * ncpu as usize];
        let key = 0u32;
        let rc = unsafe {
            libbpf_sys::bpf_map_update_elem(
                m.as_fd().as_raw_fd(),
                &key as *const u32 as *const c_void,
                zeros.as_ptr() as *const c_void,
                libbpf_sys::BPF_ANY as u64,
            )
        };
        if rc != 0 {
            return Err(TracerError::Io(format!(
                "burst: clear irq_stacks: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }

    /// The processes in the BPF target set: the added ones and the children
    /// they forked (sched_process_fork), minus those that exited.
    pub fn target_tgids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut key: u32 = 0;
        let mut first = true;
        for _ in 0..4096 {
            let mut next: u32 = 0;
            let prev: *const c_void = if first {
                std::ptr::null()
            } else {
                &key as *const u32 as *const c_void
            };
            let rc = unsafe {
                libbpf_sys::bpf_map_get_next_key(
                    self.targets_fd.as_raw_fd(),
                    prev,
                    &mut next as *mut u32 as *mut c_void,
                )
            };
            if rc != 0 {
                break;
            }
            out.push(next);
            key = next;
            first = false;
        }
        out
    }

    /// How many programs are attached now.
    pub fn attached_programs(&self) -> usize {
        self.links.len()
    }

    /// Marks the TCP ports that something listens on in `tgid`'s network
    /// namespace as server ports, so that inference treats the connections
    /// accepted on them as request-carrying (listeners created later are
    /// caught in BPF). Returns how many ports were marked.
    pub fn mark_listening_ports(&mut self, tgid: u32) -> Result<usize, TracerError> {
        let Some(fd) = self.server_ports_fd.as_ref() else {
            return Ok(0);
        };
        let mut ports = Vec::new();
        for f in ["tcp", "tcp6"] {
            // A missing file (IPv6 off, the process gone) has no listeners.
            if let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/net/{f}")) {
                ports.extend(listening_ports(&text));
            }
        }
        ports.sort_unstable();
        ports.dedup();
        for p in &ports {
            map_set(fd, *p as u32, 1u8)
                .map_err(|e| TracerError::Io(format!("mark server port {p}: {e}")))?;
        }
        Ok(ports.len())
    }

    /// Whether `tgid` is in the target set (added, or forked by a target,
    /// and not yet exited).
    pub fn is_target(&self, tgid: u32) -> bool {
        let mut v = 0u8;
        let rc = unsafe {
            libbpf_sys::bpf_map_lookup_elem(
                self.targets_fd.as_raw_fd(),
                &tgid as *const u32 as *const c_void,
                &mut v as *mut u8 as *mut c_void,
            )
        };
        rc == 0
    }

    /// Drains inferred request records into `out`, waiting up to `timeout`
    /// for the first. Returns how many were appended (0 when infer is off).
    pub fn poll_records(
        &mut self,
        timeout: Duration,
        out: &mut Vec<ts_request_record>,
    ) -> Result<usize, TracerError> {
        if self.rb.is_null() {
            return Ok(0);
        }
        // BPF submits without a wakeup until a quarter of the ring waits
        // (infer.bpf.c), so a poll that times out must still consume.
        // Rounded up: a sub-millisecond wait must not become a busy poll.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as c_int;
        let mut rc = unsafe { libbpf_sys::ring_buffer__poll(self.rb, ms) };
        if rc == 0 || rc == -libc::EINTR {
            rc = unsafe { libbpf_sys::ring_buffer__consume(self.rb) };
        }
        if rc < 0 && rc != -libc::EINTR {
            return Err(TracerError::Io(format!(
                "ring_buffer__poll: {}",
                std::io::Error::from_raw_os_error(-rc)
            )));
        }
        let n = self.rb_pending.len();
        out.append(&mut self.rb_pending);
        Ok(n)
    }

    pub fn stats(&self) -> BpfStats {
        let h = self.kc_mem as *const ts_kc_header;
        let collisions = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*h).collisions)) };
        let mut s = BpfStats {
            kc_collisions: collisions,
            ..Default::default()
        };
        if let Some(fd) = &self.stats_fd {
            s.inferred_requests_seen = percpu_sum(fd, STAT_SEEN);
            s.inferred_requests_sampled = percpu_sum(fd, STAT_SAMPLED);
            s.ringbuf_drops = percpu_sum(fd, STAT_DROPS);
            s.inferred_abandoned = percpu_sum(fd, STAT_ABANDONED);
        }
        s
    }

    /// Programs skipped because this kernel lacks their tracepoint.
    pub fn skipped_programs(&self) -> &[String] {
        &self.skipped
    }

    fn entry_ptr(&self, idx: u32) -> *mut ts_kcounters {
        debug_assert!(idx > 0 && idx < TS_KC_ENTRIES);
        unsafe { self.kc_mem.add(idx as usize * TS_KC_ENTRY_SIZE as usize) as *mut ts_kcounters }
    }

    fn find_entry(&self, tid: u32) -> Option<*mut ts_kcounters> {
        if tid == 0 {
            return None;
        }
        (0..TS_KC_PROBE)
            .map(|i| tid.wrapping_add(i) & (TS_KC_ENTRIES - 1))
            .filter(|&idx| idx != 0)
            .map(|idx| self.entry_ptr(idx))
            .find(|&e| unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*e).tid)) } == tid)
    }

    /// Seqlock-consistent copy of `tid`'s entry; None if it has none (or it
    /// never stopped changing over 1000 tries).
    pub fn kcounters(&self, tid: u32) -> Option<ts_kcounters> {
        let e = self.find_entry(tid)?;
        let seq = |e: *mut ts_kcounters| unsafe {
            std::sync::atomic::AtomicU32::from_ptr(std::ptr::addr_of_mut!((*e).seq))
                .load(std::sync::atomic::Ordering::Acquire)
        };
        for _ in 0..1000 {
            let s0 = seq(e);
            if s0 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let copy = unsafe { std::ptr::read_volatile(e) };
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            if seq(e) == s0 && copy.tid == tid {
                return Some(copy);
            }
        }
        None
    }

    /// Frees entries whose thread no longer exists; returns how many.
    pub fn gc_dead_threads(&mut self) -> usize {
        self.gc_range(1, TS_KC_ENTRIES)
    }

    /// [`Tracer::gc_dead_threads`] over the next `entries` entries only,
    /// resuming where the last step stopped (wrapping). A full pass reads all
    /// 8 MiB of the array, about 6 ms of the agent's CPU on this VM and the
    /// same amount of the last-level cache the target shares: the periodic
    /// sweep takes it a slice at a time. sched_process_exit frees almost every
    /// entry; this only catches the few it missed.
    pub fn gc_dead_threads_step(&mut self, entries: u32) -> usize {
        let start = self.gc_cursor.clamp(1, TS_KC_ENTRIES - 1);
        let end = start.saturating_add(entries.max(1)).min(TS_KC_ENTRIES);
        self.gc_cursor = if end >= TS_KC_ENTRIES { 1 } else { end };
        self.gc_range(start, end)
    }

    fn gc_range(&mut self, start: u32, end: u32) -> usize {
        let mut freed = 0;
        for idx in start..end {
            let e = self.entry_ptr(idx);
            let (tid, tgid) = unsafe {
                (
                    std::ptr::read_volatile(std::ptr::addr_of!((*e).tid)),
                    std::ptr::read_volatile(std::ptr::addr_of!((*e).tgid)),
                )
            };
            if tid == 0 {
                continue;
            }
            let alive = if tgid != 0 {
                Path::new(&format!("/proc/{tgid}/task/{tid}")).exists()
            } else {
                Path::new(&format!("/proc/{tid}")).exists() // /proc/<tid> resolves any thread
            };
            if alive {
                continue;
            }
            unsafe {
                // Clear everything but tid and seq, then release the slot.
                let base = e as *mut u8;
                std::ptr::write_bytes(base.add(8), 0, TS_KC_ENTRY_SIZE as usize - 8);
                let t = std::sync::atomic::AtomicU32::from_ptr(std::ptr::addr_of_mut!((*e).tid));
                if t.compare_exchange(
                    tid,
                    0,
                    std::sync::atomic::Ordering::AcqRel,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
                {
                    freed += 1;
                }
            }
        }
        freed
    }
}

fn percpu_sum(fd: &OwnedFd, key: u32) -> u64 {
    let ncpu = unsafe { libbpf_sys::libbpf_num_possible_cpus() };
    if ncpu <= 0 {
        return 0;
    }
    let mut vals = vec![0u64; ncpu as usize];
    let rc = unsafe {
        libbpf_sys::bpf_map_lookup_elem(
            fd.as_raw_fd(),
            &key as *const u32 as *const c_void,
            vals.as_mut_ptr() as *mut c_void,
        )
    };
    if rc != 0 {
        return 0;
    }
    vals.iter().sum()
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // Detach first, so nothing writes the array after live = 0.
        self.links.clear();
        if !self.rb.is_null() {
            unsafe { libbpf_sys::ring_buffer__free(self.rb) };
            self.rb = std::ptr::null_mut();
        }
        unsafe {
            let h = self.kc_mem as *mut ts_kc_header;
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*h).live), 0);
        }
        // Unpin only if the pin is still ours (same map id).
        if pinned_map_is(&self.pin_path, self.kc_fd.as_raw_fd()) {
            let _ = std::fs::remove_file(&self.pin_path);
        }
        unsafe { libc::munmap(self.kc_mem.cast(), self.kc_len) };
    }
}

fn map_id(fd: c_int) -> Option<u32> {
    let mut info: libbpf_sys::bpf_map_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libbpf_sys::bpf_map_info>() as u32;
    let rc = unsafe {
        libbpf_sys::bpf_obj_get_info_by_fd(fd, &mut info as *mut _ as *mut c_void, &mut len)
    };
    (rc == 0).then_some(info.id)
}

fn pinned_map_is(path: &str, fd: c_int) -> bool {
    let path = CString::new(path).unwrap();
    let pfd = unsafe { libbpf_sys::bpf_obj_get(path.as_ptr()) };
    if pfd < 0 {
        return false;
    }
    let same = map_id(pfd).is_some() && map_id(pfd) == map_id(fd);
    unsafe { libc::close(pfd) };
    same
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_dir_must_be_roots_and_private() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skip: needs root to make a root-owned directory");
            return;
        }
        let base = std::env::temp_dir().join(format!("ts-pindir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let ok = base.join("ok");
        std::fs::create_dir_all(&ok).unwrap();
        std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_pin_dir(ok.to_str().unwrap()).is_ok());
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = check_pin_dir(open.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("only root can write") && e.contains("1777"),
            "{e}"
        );
        let link = base.join("link");
        std::os::unix::fs::symlink(&ok, &link).unwrap();
        assert!(
            check_pin_dir(link.to_str().unwrap()).is_err(),
            "a symlink passed"
        );
        let other = base.join("other");
        std::fs::create_dir(&other).unwrap();
        std::os::unix::fs::chown(&other, Some(65534), None).unwrap();
        assert!(
            check_pin_dir(other.to_str().unwrap()).is_err(),
            "nobody's dir passed"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn verifier_reason_is_the_last_meaningful_line() {
        let log = "libbpf: prog 'sched_switch': BPF program load failed: Permission denied\n\
                   libbpf: prog 'sched_switch': -- BEGIN PROG LOAD LOG --\n\
                   0: R1=ctx() R10=fp0\n\
                   ; e->oncpu_ns += 1\n\
                   5: (79) r2 = *(u64 *)(r1 +8)\n\
                   R1 invalid mem access 'scalar'\n\
                   processed 6 insns (limit 1000000) max_states_per_insn 0\n\
                   -- END PROG LOAD LOG --\n";
        let (p, r) = explain_load_failure(log);
        assert_eq!(p.as_deref(), Some("sched_switch"));
        assert_eq!(r.as_deref(), Some("R1 invalid mem access 'scalar'"));
    }

    #[test]
    fn tracepoint_from_section() {
        assert_eq!(tp_of_section("tp_btf/sched_switch"), "sched_switch");
        assert_eq!(
            tp_of_section("tracepoint/syscalls/sys_enter_read"),
            "sys_enter_read"
        );
    }

    #[test]
    fn parses_proc_net_unix_inodes() {
        let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            ffff8a: 00000002 00000000 00010000 0001 01 23456 /run/x.sock\n\
            ffff8b: 00000003 00000000 00000000 0001 03 789\n\
            garbage\n";
        assert_eq!(unix_inodes(text).collect::<Vec<_>>(), vec![23456, 789]);
    }
}
