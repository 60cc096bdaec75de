//! Rust mirror of the shared-memory ABI in `runtime/include/tailscope/abi.h`.
//!
//! The C header is the source of truth. `tests/layout.rs` compiles a probe
//! against the header and checks that every size and offset here matches.
//! Everything read through these types comes from a process the agent does
//! not trust: never follow a value as a pointer, and bounds-check every
//! index and count before use.

#![allow(non_camel_case_types)]

pub mod fuzzing;
pub mod region;
pub mod shadow;
pub mod synth;

pub const TS_ABI_MAGIC: u64 = 0x3130_504f_4353_5354;
pub const TS_ABI_VERSION: u32 = 5;

pub const TS_KC_PIN_DIR: &str = "/sys/fs/bpf/tailscope";
pub const TS_KC_PIN_PREFIX: &str = "/sys/fs/bpf/tailscope/kcounters-";

/// Where the agent with this pid pins its kcounters array.
pub fn kc_pin_path(agent_pid: u32) -> String {
    format!("{TS_KC_PIN_PREFIX}{agent_pid}")
}
pub const TS_KC_ENTRIES: u32 = 65536;
pub const TS_KC_PROBE: u32 = 4;
pub const TS_KC_ENTRY_SIZE: u32 = 128;

pub const TS_WAIT_NONE: u32 = 0;
pub const TS_WAIT_RUNNABLE: u32 = 1;
pub const TS_WAIT_BLOCKED: u32 = 2;

pub const TS_REGION_PATH_PREFIX: &str = "/dev/shm/tailscope.";
pub const TS_MAX_SLOTS: u32 = 256;
pub const TS_RING_CAPACITY: u32 = 512;
/// A ring this full wakes an agent sleeping on `drain_futex` (ABI 5).
pub const TS_RING_WAKE_FILL: u32 = 128;
pub const TS_MAX_KINDS: usize = 64;
pub const TS_KIND_NAME_LEN: usize = 24;
pub const TS_PPM: u32 = 1_000_000;
pub const TS_DEFAULT_SAMPLE_PPM: u32 = 10_000;

pub const TS_REC_SAMPLED: u16 = 0x1;
pub const TS_REC_INFERRED: u16 = 0x2;
pub const TS_REC_COUNTERS: u16 = 0x4;
pub const TS_REC_TORN: u16 = 0x8;

pub const TS_SHADOW_DEPTH: u32 = 64;
pub const TS_EVENT_RING_CAPACITY: u32 = 1024;
pub const TS_MUTEX_THRESH_NS: u64 = 1000;

pub const TS_FEAT_FN_HOOKS: u32 = 0x1;
pub const TS_FEAT_LOCK_SHIM: u32 = 0x2;
pub const TS_FEAT_FN_CLOCK: u32 = 0x4;
pub const TS_FEAT_SNAP_GUARD: u32 = 0x8;

pub const TS_LDB_LOCKS: u32 = 0x1;
pub const TS_LDB_REQUESTS: u32 = 0x2;
pub const TS_LDB_SLOTS: u32 = 0x4;

pub const TS_AGENT_STALE_NS: u64 = 3_000_000_000;
pub const TS_BURST_CLOSED: u32 = 0x1;
pub const TS_BURST_DETACHED: u32 = 0x2;
pub const TS_BURST_WINDOW_SHIFT: u32 = 2;

pub const TS_EV_FUNCTION: u32 = 1;
pub const TS_EV_MUTEX_WAIT: u32 = 2;
pub const TS_EV_MUTEX_LOCK: u32 = 3;
pub const TS_EV_MUTEX_UNLOCK: u32 = 4;
pub const TS_EV_REQ_START: u32 = 5;
pub const TS_EV_REQ_BLOCK: u32 = 6;
pub const TS_EV_REQ_END: u32 = 7;
pub const TS_EV_REQ_END_ALL: u32 = 8;

pub const TS_SLOT_FREE: u32 = 0;
pub const TS_SLOT_LIVE: u32 = 1;
pub const TS_SLOT_EXITED: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ts_kc_header {
    pub magic: u64,
    pub abi_version: u32,
    pub entry_size: u32,
    pub entries: u32,
    pub agent_pid: u32,
    pub live: u32,
    pub _pad0: u32,
    pub collisions: u64,
    pub _reserved: [u8; 88],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ts_kcounters {
    pub tid: u32,
    pub seq: u32,
    pub oncpu_ns: u64,
    pub switch_in_ns: u64,
    pub wait_since_ns: u64,
    pub wait_state: u32,
    pub last_blocked_ns: u32,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    pub irq_ns: u64,
    pub softirq_ns: u64,
    pub runnable_count: u32,
    pub blocked_count: u32,
    pub irq_count: u32,
    pub softirq_count: u32,
    pub fault_user_count: u32,
    pub fault_kernel_count: u32,
    pub migrations: u32,
    pub vol_switches: u32,
    pub invol_switches: u32,
    pub tgid: u32,
    pub sampled_refs: u32,
    pub _reserved: [u8; 12],
}

/// One finished request, from a runtime ring or the BPF ringbuf.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ts_request_record {
    pub request_id: u64,
    pub start_ns: u64,
    pub latency_ns: u64,
    pub tid: u32,
    pub kind: u16,
    pub flags: u16,
    pub oncpu_ns: u64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    pub irq_ns: u64,
    pub softirq_ns: u64,
    pub runnable_count: u32,
    pub blocked_count: u32,
    pub irq_count: u32,
    pub softirq_count: u32,
    pub fault_user_count: u32,
    pub fault_kernel_count: u32,
    pub migrations: u32,
    pub vol_switches: u32,
    pub invol_switches: u32,
    pub cpu: u32,
}

/// One live call on a shadow stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ts_frame {
    pub r#fn: u64,
    pub site: u64,
    pub id: u64,
    pub sp: u64,
    pub entry_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ts_shadow_stack {
    pub gen: u64,
    pub depth: u32,
    pub _pad0: u32,
    pub truncated: u64,
    pub resyncs: u64,
    pub skipped: u64,
    pub _pad1: [u64; 3],
    pub frames: [ts_frame; TS_SHADOW_DEPTH as usize],
}

/// A lock or request event from a thread's event ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ts_event {
    pub ts_ns: u64,
    pub object: u64,
    pub arg: u64,
    pub r#type: u32,
    pub tid: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ts_thread_slot {
    pub tid: u32,
    pub state: u32,
    pub gen: u64,
    pub cur_request_id: u64,
    pub cur_start_ns: u64,
    pub cur_kind: u32,
    pub cur_active: u32,
    pub ring_head: u64,
    pub dropped_ring_full: u64,
    pub _pad_producer: [u64; 1],
    pub ring_tail: u64,
    pub _pad_consumer: [u64; 7],
    pub ring: [ts_request_record; TS_RING_CAPACITY as usize],
    pub shadow: ts_shadow_stack,
    pub ev_head: u64,
    pub ev_dropped: u64,
    pub _pad_ev_producer: [u64; 6],
    pub ev_tail: u64,
    pub _pad_ev_consumer: [u64; 7],
    pub events: [ts_event; TS_EVENT_RING_CAPACITY as usize],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ts_region_header {
    pub magic: u64,
    pub abi_version: u32,
    pub header_size: u32,
    pub slot_size: u32,
    pub max_slots: u32,
    pub ring_capacity: u32,
    pub record_size: u32,
    pub pid: u32,
    pub slots_used: u32,
    pub sample_ppm_runtime: u32,
    pub sample_ppm_agent: u32,
    pub agent_pid: u32,
    pub kinds_count: u32,
    pub created_ns: u64,
    pub slots_exhausted: u64,
    pub kinds: [[u8; TS_KIND_NAME_LEN]; TS_MAX_KINDS],
    pub shadow_depth: u32,
    pub event_ring_capacity: u32,
    pub features: u32,
    pub ldb_flags: u32,
    pub mutex_thresh_ns: u64,
    pub burst_gate: u32,
    pub sample_ppm_effective: u32,
    pub agent_heartbeat_ns: u64,
    pub _pad_drain: [u8; 16],
    pub drain_futex: u32,
    pub drain_waiting: u32,
    pub _reserved: [u8; 376],
}

/// Byte offsets and sizes the rest of the agent relies on.
pub const REGION_HEADER_SIZE: usize = core::mem::size_of::<ts_region_header>();
pub const SLOT_SIZE: usize = core::mem::size_of::<ts_thread_slot>();
pub const RECORD_SIZE: usize = core::mem::size_of::<ts_request_record>();
pub const FRAME_SIZE: usize = core::mem::size_of::<ts_frame>();
pub const EVENT_SIZE: usize = core::mem::size_of::<ts_event>();
pub const SHADOW_SIZE: usize = core::mem::size_of::<ts_shadow_stack>();

/// Total size of a region file with `max_slots` slots.
pub const fn region_size(max_slots: usize) -> usize {
    REGION_HEADER_SIZE + max_slots * SLOT_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sizes_are_what_the_header_promises() {
        assert_eq!(
            core::mem::size_of::<ts_kc_header>(),
            TS_KC_ENTRY_SIZE as usize
        );
        assert_eq!(
            core::mem::size_of::<ts_kcounters>(),
            TS_KC_ENTRY_SIZE as usize
        );
        assert_eq!(RECORD_SIZE, 112);
        assert_eq!(REGION_HEADER_SIZE, 2048);
        assert_eq!(FRAME_SIZE, 40);
        assert_eq!(EVENT_SIZE, 32);
        assert_eq!(SLOT_SIZE % 64, 0);
    }
}
