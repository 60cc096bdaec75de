//! Synthetic regions in a `Vec<u8>`, laid out exactly as the C runtime lays
//! out `/dev/shm/tailscope.<pid>`. For tests and fuzzing of the agent's
//! reader without a running service; nothing here is used in production.

use core::mem::offset_of;

use crate::region::{header_offsets, record_offset_in_slot, slot_offset, slot_offsets};
use crate::{
    region_size, ts_region_header, ts_request_record, RECORD_SIZE, REGION_HEADER_SIZE, SLOT_SIZE,
    TS_ABI_MAGIC, TS_ABI_VERSION, TS_KIND_NAME_LEN, TS_RING_CAPACITY,
};

fn put(b: &mut [u8], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

/// A valid, empty region with `max_slots` free slots, owned by `pid`.
pub fn region(max_slots: u32, pid: u32) -> Vec<u8> {
    let mut b = vec![0u8; region_size(max_slots as usize)];
    put(&mut b, 0, &TS_ABI_MAGIC.to_le_bytes());
    let fields: [(usize, u32); 9] = [
        (
            offset_of!(ts_region_header, shadow_depth),
            crate::TS_SHADOW_DEPTH,
        ),
        (
            offset_of!(ts_region_header, event_ring_capacity),
            crate::TS_EVENT_RING_CAPACITY,
        ),
        (offset_of!(ts_region_header, abi_version), TS_ABI_VERSION),
        (
            offset_of!(ts_region_header, header_size),
            REGION_HEADER_SIZE as u32,
        ),
        (offset_of!(ts_region_header, slot_size), SLOT_SIZE as u32),
        (offset_of!(ts_region_header, max_slots), max_slots),
        (
            offset_of!(ts_region_header, ring_capacity),
            TS_RING_CAPACITY,
        ),
        (
            offset_of!(ts_region_header, record_size),
            RECORD_SIZE as u32,
        ),
        (offset_of!(ts_region_header, pid), pid),
    ];
    for (off, v) in fields {
        put(&mut b, off, &v.to_le_bytes());
    }
    put(
        &mut b,
        offset_of!(ts_region_header, sample_ppm_runtime),
        &crate::TS_DEFAULT_SAMPLE_PPM.to_le_bytes(),
    );
    b
}

/// Registers kind `index` with `name` (truncated to fit, NUL-terminated).
pub fn set_kind(b: &mut [u8], index: usize, name: &str) {
    let off = header_offsets::KINDS + index * TS_KIND_NAME_LEN;
    let n = name.len().min(TS_KIND_NAME_LEN - 1);
    b[off..off + TS_KIND_NAME_LEN].fill(0);
    put(b, off, &name.as_bytes()[..n]);
    let count = u32::from_le_bytes(b[header_offsets::KINDS_COUNT..][..4].try_into().unwrap());
    let count = count.max(index as u32 + 1);
    put(b, header_offsets::KINDS_COUNT, &count.to_le_bytes());
}

/// Claims slot `slot` for `tid` with state `state` (TS_SLOT_*).
pub fn claim_slot(b: &mut [u8], slot: u32, tid: u32, state: u32) {
    let base = slot_offset(slot);
    put(b, base + slot_offsets::TID, &tid.to_le_bytes());
    put(b, base + slot_offsets::STATE, &state.to_le_bytes());
    let used_off = header_offsets::SLOTS_USED;
    let used = u32::from_le_bytes(b[used_off..used_off + 4].try_into().unwrap());
    put(b, used_off, &used.max(slot + 1).to_le_bytes());
}

/// Produces `r` into slot `slot`'s ring the way the runtime does: write the
/// entry at `head & (cap-1)`, then advance `ring_head`. If the ring is full
/// the record is dropped and `dropped_ring_full` counted instead.
pub fn push_record(b: &mut [u8], slot: u32, r: &ts_request_record) -> bool {
    let base = slot_offset(slot);
    let head = read_u64(b, base + slot_offsets::RING_HEAD);
    let tail = read_u64(b, base + slot_offsets::RING_TAIL);
    if head.wrapping_sub(tail) >= TS_RING_CAPACITY as u64 {
        let d = read_u64(b, base + slot_offsets::DROPPED_RING_FULL).wrapping_add(1);
        put(b, base + slot_offsets::DROPPED_RING_FULL, &d.to_le_bytes());
        return false;
    }
    let idx = (head & (TS_RING_CAPACITY as u64 - 1)) as u32;
    let rec = crate::region::record_to_bytes(r);
    put(b, base + record_offset_in_slot(idx), &rec);
    put(
        b,
        base + slot_offsets::RING_HEAD,
        &head.wrapping_add(1).to_le_bytes(),
    );
    true
}

/// Reads a little-endian u64 at `off`.
pub fn read_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// Overwrites a little-endian u64 at `off` (to forge hostile values).
pub fn write_u64(b: &mut [u8], off: usize, v: u64) {
    put(b, off, &v.to_le_bytes());
}

/// Writes a consistent shadow stack for slot `slot`: `frames` stored, logical
/// `depth` (may exceed the frames given, as when truncated), seqlock `gen`.
pub fn set_shadow(b: &mut [u8], slot: u32, gen: u64, depth: u32, frames: &[crate::ts_frame]) {
    use crate::shadow::{frame_offset_in_slot, frame_to_bytes, ldb_offsets};
    let base = slot_offset(slot);
    write_u64(b, base + ldb_offsets::SHADOW_GEN, gen);
    put(
        b,
        base + ldb_offsets::SHADOW + offset_of!(crate::ts_shadow_stack, depth),
        &depth.to_le_bytes(),
    );
    for (i, f) in frames
        .iter()
        .enumerate()
        .take(crate::TS_SHADOW_DEPTH as usize)
    {
        put(b, base + frame_offset_in_slot(i as u32), &frame_to_bytes(f));
    }
}

/// Produces an event into slot `slot`'s event ring (drops when full).
pub fn push_event(b: &mut [u8], slot: u32, e: &crate::ts_event) -> bool {
    use crate::shadow::{event_offset_in_slot, event_to_bytes, ldb_offsets};
    let base = slot_offset(slot);
    let head = read_u64(b, base + ldb_offsets::EV_HEAD);
    let tail = read_u64(b, base + ldb_offsets::EV_TAIL);
    if head.wrapping_sub(tail) >= crate::TS_EVENT_RING_CAPACITY as u64 {
        let d = read_u64(b, base + ldb_offsets::EV_DROPPED).wrapping_add(1);
        write_u64(b, base + ldb_offsets::EV_DROPPED, d);
        return false;
    }
    let idx = (head % crate::TS_EVENT_RING_CAPACITY as u64) as u32;
    put(b, base + event_offset_in_slot(idx), &event_to_bytes(e));
    write_u64(b, base + ldb_offsets::EV_HEAD, head.wrapping_add(1));
    true
}
