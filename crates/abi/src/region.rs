//! Hostile-input parsers for the per-process region (`/dev/shm/tailscope.<pid>`).
//!
//! The region is written by a process the agent does not trust, so nothing
//! here reads through a pointer or trusts a count: every function takes a byte
//! slice (a snapshot the caller copied out of the mapping), bounds-checks every
//! offset, and turns nonsense into an [`AbiError`] or a counted
//! [`RecordFault`] — never a panic and never an unbounded loop. That makes
//! them fuzzable (`tests/fuzz.rs`, `fuzz/`).
//!
//! How the agent uses them, per poll:
//! 1. [`parse_region_header`] once at attach (and again to refresh the kinds
//!    table when `kinds_count` changes);
//! 2. for each slot, [`parse_slot`] over the slot's first [`SLOT_PRODUCER_BYTES`]
//!    bytes, then [`plan_drain`] with the slot's `ring_head` and `ring_tail`;
//! 3. for each index of the plan, copy [`RECORD_SIZE`] bytes out of the ring,
//!    [`parse_record`] and [`validate_record`] them;
//! 4. store-release `ring_tail = plan.new_tail`.
//!
//! All integers are little-endian (the ABI is only defined for LE hosts).

use core::fmt;
use core::mem::offset_of;

use crate::{
    ts_region_header, ts_request_record, ts_thread_slot, RECORD_SIZE, REGION_HEADER_SIZE,
    SLOT_SIZE, TS_ABI_MAGIC, TS_ABI_VERSION, TS_KIND_NAME_LEN, TS_MAX_KINDS, TS_MAX_SLOTS,
    TS_REC_COUNTERS, TS_RING_CAPACITY, TS_SLOT_EXITED, TS_SLOT_FREE, TS_SLOT_LIVE,
};

/// Why a region (or a slot of it) cannot be used at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbiError {
    /// Fewer bytes than the structure needs.
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    BadMagic(u64),
    VersionMismatch {
        region: u32,
        supported: u32,
    },
    /// A size field in the header disagrees with this agent's layout.
    SizeMismatch {
        field: &'static str,
        region: u32,
        expected: u32,
    },
    /// `max_slots` is zero or above `TS_MAX_SLOTS`.
    BadMaxSlots(u32),
    /// `ring_capacity` is not a power of two, or not `TS_RING_CAPACITY`.
    BadRingCapacity(u32),
    /// The file is shorter than `header_size + max_slots * slot_size`.
    FileTooShort {
        file_len: usize,
        need: usize,
    },
    /// A slot's `state` is none of `TS_SLOT_*`.
    BadSlotState(u32),
    /// `shadow_depth` or `event_ring_capacity` differ from this agent's.
    BadLdbLayout {
        field: &'static str,
        region: u32,
        expected: u32,
    },
}

impl fmt::Display for AbiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbiError::Truncated { what, need, have } => {
                write!(f, "{what} truncated: need {need} bytes, have {have}")
            }
            AbiError::BadMagic(m) => write!(f, "bad magic {m:#018x} (not a tailscope region)"),
            AbiError::VersionMismatch { region, supported } => write!(
                f,
                "ABI version mismatch: region has {region}, agent supports {supported}"
            ),
            AbiError::SizeMismatch {
                field,
                region,
                expected,
            } => write!(
                f,
                "ABI layout mismatch: region {field} is {region}, agent expects {expected}"
            ),
            AbiError::BadMaxSlots(n) => {
                write!(f, "bad max_slots {n} (must be 1..={TS_MAX_SLOTS})")
            }
            AbiError::BadRingCapacity(n) => write!(
                f,
                "bad ring_capacity {n} (must be the power of two {TS_RING_CAPACITY})"
            ),
            AbiError::FileTooShort { file_len, need } => write!(
                f,
                "region file is {file_len} bytes, its header promises {need}"
            ),
            AbiError::BadSlotState(s) => write!(f, "bad slot state {s}"),
            AbiError::BadLdbLayout {
                field,
                region,
                expected,
            } => write!(
                f,
                "ABI layout mismatch: region {field} is {region}, agent expects {expected}"
            ),
        }
    }
}

impl std::error::Error for AbiError {}

// ---- little-endian field readers ---------------------------------------

/// Reads `N` bytes at `off`; `None` when out of bounds (no panics).
fn bytes_at<const N: usize>(b: &[u8], off: usize) -> Option<[u8; N]> {
    let end = off.checked_add(N)?;
    b.get(off..end)?.try_into().ok()
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    bytes_at::<2>(b, off).map_or(0, u16::from_le_bytes)
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    bytes_at::<4>(b, off).map_or(0, u32::from_le_bytes)
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    bytes_at::<8>(b, off).map_or(0, u64::from_le_bytes)
}

fn need(what: &'static str, b: &[u8], n: usize) -> Result<(), AbiError> {
    if b.len() < n {
        Err(AbiError::Truncated {
            what,
            need: n,
            have: b.len(),
        })
    } else {
        Ok(())
    }
}

// ---- region header ------------------------------------------------------

/// A validated copy of `struct ts_region_header`.
///
/// Invariants (checked by [`parse_region_header`]): layout sizes equal this
/// agent's, `1 <= max_slots <= TS_MAX_SLOTS`, and the file holds every slot.
/// `slots_used` and `kinds_count` are clamped to their bounds, not trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionHeader {
    pub abi_version: u32,
    pub max_slots: u32,
    pub pid: u32,
    /// High-water mark of claimed slots, clamped to `max_slots`.
    pub slots_used: u32,
    pub sample_ppm_runtime: u32,
    pub sample_ppm_agent: u32,
    pub agent_pid: u32,
    /// Clamped to `TS_MAX_KINDS`.
    pub kinds_count: u32,
    pub created_ns: u64,
    pub slots_exhausted: u64,
    /// Decoded, sanitised names; index = `ts_request_record.kind`.
    pub kinds: Vec<String>,
    /// `TS_FEAT_*` the runtime announced (ABI 2).
    pub features: u32,
    /// `TS_LDB_*` as last written by an agent.
    pub ldb_flags: u32,
}

/// Byte offsets of header fields the agent writes or re-reads in place.
pub mod header_offsets {
    use super::*;
    pub const SAMPLE_PPM_AGENT: usize = offset_of!(ts_region_header, sample_ppm_agent);
    pub const AGENT_PID: usize = offset_of!(ts_region_header, agent_pid);
    pub const KINDS_COUNT: usize = offset_of!(ts_region_header, kinds_count);
    pub const SLOTS_USED: usize = offset_of!(ts_region_header, slots_used);
    pub const SLOTS_EXHAUSTED: usize = offset_of!(ts_region_header, slots_exhausted);
    pub const KINDS: usize = offset_of!(ts_region_header, kinds);
    pub const FEATURES: usize = offset_of!(ts_region_header, features);
    pub const LDB_FLAGS: usize = offset_of!(ts_region_header, ldb_flags);
    pub const MUTEX_THRESH_NS: usize = offset_of!(ts_region_header, mutex_thresh_ns);
    pub const BURST_GATE: usize = offset_of!(ts_region_header, burst_gate);
    pub const SAMPLE_PPM_EFFECTIVE: usize = offset_of!(ts_region_header, sample_ppm_effective);
    pub const AGENT_HEARTBEAT_NS: usize = offset_of!(ts_region_header, agent_heartbeat_ns);
    pub const DRAIN_FUTEX: usize = offset_of!(ts_region_header, drain_futex);
    pub const DRAIN_WAITING: usize = offset_of!(ts_region_header, drain_waiting);
}

/// Parses and validates a region header.
///
/// `bytes` is at least the header (more is fine); `file_len` is the size of
/// the whole region file, so that `max_slots` can be checked against it.
pub fn parse_region_header(bytes: &[u8], file_len: usize) -> Result<RegionHeader, AbiError> {
    need("region header", bytes, REGION_HEADER_SIZE)?;
    let magic = u64_at(bytes, offset_of!(ts_region_header, magic));
    if magic != TS_ABI_MAGIC {
        return Err(AbiError::BadMagic(magic));
    }
    let abi_version = u32_at(bytes, offset_of!(ts_region_header, abi_version));
    if abi_version != TS_ABI_VERSION {
        return Err(AbiError::VersionMismatch {
            region: abi_version,
            supported: TS_ABI_VERSION,
        });
    }
    let size_check = |field: &'static str, off: usize, expected: usize| {
        let region = u32_at(bytes, off);
        if region as usize != expected {
            Err(AbiError::SizeMismatch {
                field,
                region,
                expected: expected as u32,
            })
        } else {
            Ok(())
        }
    };
    size_check(
        "header_size",
        offset_of!(ts_region_header, header_size),
        REGION_HEADER_SIZE,
    )?;
    size_check(
        "slot_size",
        offset_of!(ts_region_header, slot_size),
        SLOT_SIZE,
    )?;
    size_check(
        "record_size",
        offset_of!(ts_region_header, record_size),
        RECORD_SIZE,
    )?;
    let ring_capacity = u32_at(bytes, offset_of!(ts_region_header, ring_capacity));
    if !ring_capacity.is_power_of_two() || ring_capacity != TS_RING_CAPACITY {
        return Err(AbiError::BadRingCapacity(ring_capacity));
    }
    for (field, off, expected) in [
        (
            "shadow_depth",
            offset_of!(ts_region_header, shadow_depth),
            crate::TS_SHADOW_DEPTH,
        ),
        (
            "event_ring_capacity",
            offset_of!(ts_region_header, event_ring_capacity),
            crate::TS_EVENT_RING_CAPACITY,
        ),
    ] {
        let region = u32_at(bytes, off);
        if region != expected {
            return Err(AbiError::BadLdbLayout {
                field,
                region,
                expected,
            });
        }
    }
    let max_slots = u32_at(bytes, offset_of!(ts_region_header, max_slots));
    if max_slots == 0 || max_slots > TS_MAX_SLOTS {
        return Err(AbiError::BadMaxSlots(max_slots));
    }
    let need_len = crate::region_size(max_slots as usize);
    if file_len < need_len {
        return Err(AbiError::FileTooShort {
            file_len,
            need: need_len,
        });
    }
    let kinds_count = u32_at(bytes, offset_of!(ts_region_header, kinds_count));
    let kinds_count = kinds_count.min(TS_MAX_KINDS as u32);
    Ok(RegionHeader {
        abi_version,
        max_slots,
        pid: u32_at(bytes, offset_of!(ts_region_header, pid)),
        slots_used: u32_at(bytes, offset_of!(ts_region_header, slots_used)).min(max_slots),
        sample_ppm_runtime: u32_at(bytes, offset_of!(ts_region_header, sample_ppm_runtime)),
        sample_ppm_agent: u32_at(bytes, offset_of!(ts_region_header, sample_ppm_agent)),
        agent_pid: u32_at(bytes, offset_of!(ts_region_header, agent_pid)),
        kinds_count,
        created_ns: u64_at(bytes, offset_of!(ts_region_header, created_ns)),
        slots_exhausted: u64_at(bytes, offset_of!(ts_region_header, slots_exhausted)),
        kinds: parse_kinds_table(bytes),
        features: u32_at(bytes, header_offsets::FEATURES),
        ldb_flags: u32_at(bytes, header_offsets::LDB_FLAGS),
    })
}

/// Decodes all `TS_MAX_KINDS` names of the header's kinds table (index =
/// kind id). Unregistered entries decode to `""`.
pub fn parse_kinds_table(header_bytes: &[u8]) -> Vec<String> {
    (0..TS_MAX_KINDS)
        .map(|i| {
            let off = header_offsets::KINDS + i * TS_KIND_NAME_LEN;
            let end = (off + TS_KIND_NAME_LEN).min(header_bytes.len());
            decode_kind_name(header_bytes.get(off..end).unwrap_or(&[]))
        })
        .collect()
}

/// Decodes one kind name: up to the first NUL, and at most
/// `TS_KIND_NAME_LEN - 1` bytes even when no NUL is present (the C side
/// promises a terminator; a missing one is not read past). Invalid UTF-8
/// becomes U+FFFD; control characters become `?`, so a name is always safe
/// to print on a terminal or put in a CSV.
pub fn decode_kind_name(raw: &[u8]) -> String {
    let bounded = &raw[..raw.len().min(TS_KIND_NAME_LEN - 1)];
    let name = match bounded.iter().position(|&c| c == 0) {
        Some(n) => &bounded[..n],
        None => bounded,
    };
    String::from_utf8_lossy(name)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

// ---- thread slots -------------------------------------------------------

/// Bytes of a slot before its ring: the producer and consumer fields.
pub const SLOT_PRODUCER_BYTES: usize = offset_of!(ts_thread_slot, ring);

/// Byte offsets of slot fields, relative to the start of the slot.
pub mod slot_offsets {
    use super::*;
    pub const TID: usize = offset_of!(ts_thread_slot, tid);
    pub const STATE: usize = offset_of!(ts_thread_slot, state);
    pub const RING_HEAD: usize = offset_of!(ts_thread_slot, ring_head);
    pub const DROPPED_RING_FULL: usize = offset_of!(ts_thread_slot, dropped_ring_full);
    pub const RING_TAIL: usize = offset_of!(ts_thread_slot, ring_tail);
    pub const RING: usize = offset_of!(ts_thread_slot, ring);
}

/// Offset of slot `index` from the start of the region.
pub fn slot_offset(index: u32) -> usize {
    REGION_HEADER_SIZE + index as usize * SLOT_SIZE
}

/// Offset of ring entry `ring_index` (already masked) within a slot.
pub fn record_offset_in_slot(ring_index: u32) -> usize {
    slot_offsets::RING + (ring_index as usize % TS_RING_CAPACITY as usize) * RECORD_SIZE
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    Free,
    Live,
    Exited,
}

/// The fields of one `struct ts_thread_slot` the agent needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotView {
    pub tid: u32,
    pub state: SlotState,
    pub ring_head: u64,
    pub ring_tail: u64,
    pub dropped_ring_full: u64,
}

impl SlotView {
    /// Whether the agent should drain this slot's ring.
    pub fn drainable(&self) -> bool {
        matches!(self.state, SlotState::Live | SlotState::Exited)
    }
}

/// Parses a slot from (at least) its first [`SLOT_PRODUCER_BYTES`] bytes.
pub fn parse_slot(bytes: &[u8]) -> Result<SlotView, AbiError> {
    need("thread slot", bytes, SLOT_PRODUCER_BYTES)?;
    let state = match u32_at(bytes, slot_offsets::STATE) {
        TS_SLOT_FREE => SlotState::Free,
        TS_SLOT_LIVE => SlotState::Live,
        TS_SLOT_EXITED => SlotState::Exited,
        other => return Err(AbiError::BadSlotState(other)),
    };
    Ok(SlotView {
        tid: u32_at(bytes, slot_offsets::TID),
        state,
        ring_head: u64_at(bytes, slot_offsets::RING_HEAD),
        ring_tail: u64_at(bytes, slot_offsets::RING_TAIL),
        dropped_ring_full: u64_at(bytes, slot_offsets::DROPPED_RING_FULL),
    })
}

// ---- ring drain ---------------------------------------------------------

/// What one drain step of a ring should copy.
///
/// Invariant: `count <= capacity`, so a caller that loops `count` times is
/// bounded whatever the producer wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainPlan {
    /// First sequence number to copy (the old tail).
    pub first: u64,
    /// How many records to copy, at ring indices `(first + k) & (capacity - 1)`.
    pub count: u32,
    /// The tail to store-release once they are copied.
    pub new_tail: u64,
    /// `head`/`tail` were impossible (head behind tail, or more than a ring
    /// ahead): nothing is copied and the tail jumps to head.
    pub resync: bool,
}

impl DrainPlan {
    /// Ring index of the `k`-th record of this plan.
    pub fn ring_index(&self, k: u32, capacity: u32) -> u32 {
        (self.first.wrapping_add(k as u64) & (capacity.max(1) as u64 - 1)) as u32
    }
}

/// Plans a drain step of a single-producer ring.
///
/// `head` is the producer's count (read with acquire), `tail` the consumer's,
/// `capacity` a power of two. A well-behaved producer keeps
/// `tail <= head <= tail + capacity`; anything else is corruption: the step
/// copies nothing and resynchronises `tail = head`, so the next step starts
/// fresh instead of replaying garbage or looping.
pub fn plan_drain(head: u64, tail: u64, capacity: u32) -> DrainPlan {
    let capacity = if capacity.is_power_of_two() {
        capacity
    } else {
        // Not reachable through parse_region_header; stay safe anyway.
        TS_RING_CAPACITY
    };
    match head.checked_sub(tail) {
        Some(n) if n <= capacity as u64 => DrainPlan {
            first: tail,
            count: n as u32,
            new_tail: head,
            resync: false,
        },
        _ => DrainPlan {
            first: head,
            count: 0,
            new_tail: head,
            resync: true,
        },
    }
}

// ---- records ------------------------------------------------------------

/// Parses one `struct ts_request_record` (exactly or at least `RECORD_SIZE`
/// bytes).
pub fn parse_record(bytes: &[u8]) -> Result<ts_request_record, AbiError> {
    need("request record", bytes, RECORD_SIZE)?;
    macro_rules! f {
        ($field:ident, u64) => {
            u64_at(bytes, offset_of!(ts_request_record, $field))
        };
        ($field:ident, u32) => {
            u32_at(bytes, offset_of!(ts_request_record, $field))
        };
        ($field:ident, u16) => {
            u16_at(bytes, offset_of!(ts_request_record, $field))
        };
    }
    Ok(ts_request_record {
        request_id: f!(request_id, u64),
        start_ns: f!(start_ns, u64),
        latency_ns: f!(latency_ns, u64),
        tid: f!(tid, u32),
        kind: f!(kind, u16),
        flags: f!(flags, u16),
        oncpu_ns: f!(oncpu_ns, u64),
        runnable_ns: f!(runnable_ns, u64),
        blocked_ns: f!(blocked_ns, u64),
        irq_ns: f!(irq_ns, u64),
        softirq_ns: f!(softirq_ns, u64),
        runnable_count: f!(runnable_count, u32),
        blocked_count: f!(blocked_count, u32),
        irq_count: f!(irq_count, u32),
        softirq_count: f!(softirq_count, u32),
        fault_user_count: f!(fault_user_count, u32),
        fault_kernel_count: f!(fault_kernel_count, u32),
        migrations: f!(migrations, u32),
        vol_switches: f!(vol_switches, u32),
        invol_switches: f!(invol_switches, u32),
        cpu: f!(cpu, u32),
    })
}

/// Serialises a record to its C layout (tests and synthetic regions).
pub fn record_to_bytes(r: &ts_request_record) -> [u8; RECORD_SIZE] {
    let mut b = [0u8; RECORD_SIZE];
    macro_rules! put {
        ($field:ident) => {{
            let v = r.$field.to_le_bytes();
            let off = offset_of!(ts_request_record, $field);
            b[off..off + v.len()].copy_from_slice(&v);
        }};
    }
    put!(request_id);
    put!(start_ns);
    put!(latency_ns);
    put!(tid);
    put!(kind);
    put!(flags);
    put!(oncpu_ns);
    put!(runnable_ns);
    put!(blocked_ns);
    put!(irq_ns);
    put!(softirq_ns);
    put!(runnable_count);
    put!(blocked_count);
    put!(irq_count);
    put!(softirq_count);
    put!(fault_user_count);
    put!(fault_kernel_count);
    put!(migrations);
    put!(vol_switches);
    put!(invol_switches);
    put!(cpu);
    b
}

/// Requests longer than this are taken for corruption.
pub const MAX_SANE_LATENCY_NS: u64 = 3_600 * 1_000_000_000;

/// Why a record was rejected. Rejected records are counted, never written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordFault {
    /// `latency_ns` is above [`MAX_SANE_LATENCY_NS`].
    AbsurdLatency,
    /// `tid` is not the slot owner's.
    TidMismatch,
    /// `kind` indexes past the kinds table.
    BadKind,
    /// With `TS_REC_COUNTERS` set, a time counter (or on-CPU + runnable +
    /// blocked) exceeds the latency by more than [`counter_tolerance_ns`].
    CountersExceedLatency,
    /// `start_ns + latency_ns` overflows.
    TimeOverflow,
}

/// Slack allowed between the counters and the latency: the runtime's
/// counter snapshots and its clock reads are not atomic with each other, so
/// the sum may overshoot a little (one tick or 1/8 of the latency).
pub fn counter_tolerance_ns(latency_ns: u64) -> u64 {
    (latency_ns / 8).max(1_000_000)
}

/// Validates a record read from a ring. `slot_tid` is the slot's owner, or
/// `None` for records that belong to no slot (the BPF ringbuf).
pub fn validate_record(r: &ts_request_record, slot_tid: Option<u32>) -> Result<(), RecordFault> {
    if r.latency_ns > MAX_SANE_LATENCY_NS {
        return Err(RecordFault::AbsurdLatency);
    }
    if r.start_ns.checked_add(r.latency_ns).is_none() {
        return Err(RecordFault::TimeOverflow);
    }
    if let Some(tid) = slot_tid {
        if tid != 0 && r.tid != tid {
            return Err(RecordFault::TidMismatch);
        }
    }
    if r.kind as usize >= TS_MAX_KINDS {
        return Err(RecordFault::BadKind);
    }
    if r.flags & TS_REC_COUNTERS != 0 {
        let limit = r.latency_ns + counter_tolerance_ns(r.latency_ns);
        let times = [
            r.oncpu_ns,
            r.runnable_ns,
            r.blocked_ns,
            r.irq_ns,
            r.softirq_ns,
        ];
        let sum = r
            .oncpu_ns
            .checked_add(r.runnable_ns)
            .and_then(|s| s.checked_add(r.blocked_ns));
        if times.iter().any(|&t| t > limit) || sum.is_none_or(|s| s > limit) {
            return Err(RecordFault::CountersExceedLatency);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn valid_header(max_slots: u32) -> Vec<u8> {
        let mut b = vec![0u8; REGION_HEADER_SIZE];
        let mut put32 = |off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
        put32(offset_of!(ts_region_header, abi_version), TS_ABI_VERSION);
        put32(
            offset_of!(ts_region_header, header_size),
            REGION_HEADER_SIZE as u32,
        );
        put32(offset_of!(ts_region_header, slot_size), SLOT_SIZE as u32);
        put32(offset_of!(ts_region_header, max_slots), max_slots);
        put32(
            offset_of!(ts_region_header, ring_capacity),
            TS_RING_CAPACITY,
        );
        put32(
            offset_of!(ts_region_header, record_size),
            RECORD_SIZE as u32,
        );
        put32(offset_of!(ts_region_header, pid), 42);
        put32(
            offset_of!(ts_region_header, shadow_depth),
            crate::TS_SHADOW_DEPTH,
        );
        put32(
            offset_of!(ts_region_header, event_ring_capacity),
            crate::TS_EVENT_RING_CAPACITY,
        );
        put32(offset_of!(ts_region_header, kinds_count), 2);
        b[..8].copy_from_slice(&TS_ABI_MAGIC.to_le_bytes());
        let k = header_offsets::KINDS + TS_KIND_NAME_LEN;
        b[k..k + 4].copy_from_slice(b"GET\0");
        b
    }

    #[test]
    fn valid_header_parses() {
        let b = valid_header(4);
        let h = parse_region_header(&b, crate::region_size(4)).unwrap();
        assert_eq!(h.pid, 42);
        assert_eq!(h.max_slots, 4);
        assert_eq!(h.kinds[1], "GET");
        assert_eq!(h.kinds[0], "");
        assert_eq!(h.kinds.len(), TS_MAX_KINDS);
    }

    #[test]
    fn version_mismatch_names_both_versions() {
        let mut b = valid_header(4);
        b[8..12].copy_from_slice(&(TS_ABI_VERSION + 1).to_le_bytes());
        let e = parse_region_header(&b, crate::region_size(4)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "ABI version mismatch: region has {}, agent supports {TS_ABI_VERSION}",
                TS_ABI_VERSION + 1
            )
        );
    }

    #[test]
    fn header_rejections() {
        let len = crate::region_size(4);
        let mut b = valid_header(4);
        b[0] ^= 1;
        assert!(matches!(
            parse_region_header(&b, len),
            Err(AbiError::BadMagic(_))
        ));
        let b = valid_header(4);
        assert!(matches!(
            parse_region_header(&b, len - 1),
            Err(AbiError::FileTooShort { .. })
        ));
        assert!(matches!(
            parse_region_header(&b[..100], len),
            Err(AbiError::Truncated { .. })
        ));
        let b = valid_header(TS_MAX_SLOTS + 1);
        assert_eq!(
            parse_region_header(&b, usize::MAX),
            Err(AbiError::BadMaxSlots(TS_MAX_SLOTS + 1))
        );
        let mut b = valid_header(4);
        let off = offset_of!(ts_region_header, ring_capacity);
        b[off..off + 4].copy_from_slice(&500u32.to_le_bytes());
        assert_eq!(
            parse_region_header(&b, len),
            Err(AbiError::BadRingCapacity(500))
        );
        let mut b = valid_header(4);
        let off = offset_of!(ts_region_header, slot_size);
        b[off..off + 4].copy_from_slice(&7u32.to_le_bytes());
        assert!(matches!(
            parse_region_header(&b, len),
            Err(AbiError::SizeMismatch {
                field: "slot_size",
                ..
            })
        ));
    }

    #[test]
    fn kind_names_are_bounded_and_sanitised() {
        assert_eq!(decode_kind_name(b"GET\0junk"), "GET");
        assert_eq!(decode_kind_name(b""), "");
        assert_eq!(decode_kind_name(&[b'A'; 40]).len(), TS_KIND_NAME_LEN - 1);
        assert_eq!(decode_kind_name(b"a\x1b[31mb\0"), "a?[31mb");
        assert_eq!(decode_kind_name(b"\xff\xfeok\0"), "\u{fffd}\u{fffd}ok");
    }

    #[test]
    fn drain_plans() {
        assert_eq!(
            plan_drain(10, 4, 512),
            DrainPlan {
                first: 4,
                count: 6,
                new_tail: 10,
                resync: false
            }
        );
        assert_eq!(plan_drain(5, 5, 512).count, 0);
        assert_eq!(plan_drain(512, 0, 512).count, 512);
        let p = plan_drain(513, 0, 512);
        assert!(p.resync && p.count == 0 && p.new_tail == 513);
        let p = plan_drain(3, 9, 512);
        assert!(p.resync && p.count == 0 && p.new_tail == 3);
        let p = plan_drain(u64::MAX, 0, 512);
        assert!(p.resync);
        let p = plan_drain(1000, 990, 512);
        assert_eq!(p.ring_index(0, 512), 990 & 511);
        assert_eq!(p.ring_index(9, 512), 999 & 511);
    }

    #[test]
    fn record_round_trip_and_validation() {
        let r = ts_request_record {
            request_id: 7,
            start_ns: 1_000,
            latency_ns: 50_000,
            tid: 9,
            kind: 1,
            flags: TS_REC_COUNTERS | 1,
            oncpu_ns: 40_000,
            runnable_ns: 5_000,
            cpu: 1,
            ..Default::default()
        };
        let b = record_to_bytes(&r);
        assert_eq!(parse_record(&b).unwrap(), r);
        assert_eq!(validate_record(&r, Some(9)), Ok(()));
        assert_eq!(validate_record(&r, Some(10)), Err(RecordFault::TidMismatch));
        let bad = ts_request_record {
            oncpu_ns: 10_000_000,
            ..r
        };
        assert_eq!(
            validate_record(&bad, None),
            Err(RecordFault::CountersExceedLatency)
        );
        let no_counters = ts_request_record { flags: 1, ..bad };
        assert_eq!(validate_record(&no_counters, None), Ok(()));
        let bad = ts_request_record {
            latency_ns: MAX_SANE_LATENCY_NS + 1,
            ..r
        };
        assert_eq!(validate_record(&bad, None), Err(RecordFault::AbsurdLatency));
        let bad = ts_request_record { kind: 64, ..r };
        assert_eq!(validate_record(&bad, None), Err(RecordFault::BadKind));
        let bad = ts_request_record {
            oncpu_ns: u64::MAX,
            runnable_ns: u64::MAX,
            ..r
        };
        assert!(validate_record(&bad, None).is_err());
        assert!(parse_record(&b[..RECORD_SIZE - 1]).is_err());
    }

    #[test]
    fn slot_parse() {
        let mut b = vec![0u8; SLOT_PRODUCER_BYTES];
        b[slot_offsets::STATE..slot_offsets::STATE + 4].copy_from_slice(&1u32.to_le_bytes());
        b[slot_offsets::RING_HEAD..slot_offsets::RING_HEAD + 8]
            .copy_from_slice(&5u64.to_le_bytes());
        let s = parse_slot(&b).unwrap();
        assert_eq!(s.state, SlotState::Live);
        assert_eq!(s.ring_head, 5);
        b[slot_offsets::STATE] = 9;
        assert_eq!(parse_slot(&b), Err(AbiError::BadSlotState(9)));
        assert!(parse_slot(&b[..10]).is_err());
    }
}
