//! One entry point that drives every parser with arbitrary bytes; shared by
//! the deterministic randomized test (`tests/fuzz.rs`) and the libFuzzer
//! target (`fuzz/fuzz_targets/region.rs`). It asserts the parsers' promises:
//! no panic, drain plans bounded by the capacity, clamped counts in bounds.

use crate::region::{
    decode_kind_name, parse_record, parse_region_header, parse_slot, plan_drain,
    record_offset_in_slot, validate_record, SLOT_PRODUCER_BYTES,
};
use crate::shadow::{
    common_prefix, parse_event, parse_frames, parse_shadow_head, stored_frames, validate_event,
    SHADOW_HEAD_BYTES,
};
use crate::{
    EVENT_SIZE, RECORD_SIZE, TS_EVENT_RING_CAPACITY, TS_KIND_NAME_LEN, TS_MAX_KINDS, TS_MAX_SLOTS,
    TS_RING_CAPACITY, TS_SHADOW_DEPTH,
};

/// Feeds `data` to every parser in turn. Panics only if a promise breaks.
pub fn exercise(data: &[u8]) {
    // The whole input as a region header, with a few claimed file lengths.
    let claimed = [
        data.len(),
        0,
        usize::MAX,
        data.first().map_or(0, |&b| (b as usize) << 16),
    ];
    for file_len in claimed {
        if let Ok(h) = parse_region_header(data, file_len) {
            assert!(h.max_slots >= 1 && h.max_slots <= TS_MAX_SLOTS);
            assert!(h.slots_used <= h.max_slots);
            assert!(h.kinds_count as usize <= TS_MAX_KINDS);
            assert_eq!(h.kinds.len(), TS_MAX_KINDS);
            assert!(file_len >= crate::region_size(h.max_slots as usize));
        }
    }
    // Every window as a slot, a record, a kind name.
    let _ = parse_slot(data);
    if data.len() > SLOT_PRODUCER_BYTES {
        let _ = parse_slot(&data[data.len() - SLOT_PRODUCER_BYTES..]);
    }
    for chunk in data.chunks(RECORD_SIZE) {
        if let Ok(r) = parse_record(chunk) {
            let _ = validate_record(&r, Some(r.tid ^ (chunk[0] as u32 & 1)));
            let _ = validate_record(&r, None);
        }
    }
    for chunk in data.chunks(TS_KIND_NAME_LEN + 3) {
        let name = decode_kind_name(chunk);
        assert!(name.chars().all(|c| !c.is_control()));
        assert!(name.chars().count() < TS_KIND_NAME_LEN);
    }
    // The input as a shadow stack: the frame count is clamped whatever the
    // depth says, and diffing two copies is bounded.
    if let Ok(h) = parse_shadow_head(data) {
        let n = stored_frames(h.depth);
        assert!(n <= TS_SHADOW_DEPTH);
        let mut frames = Vec::new();
        parse_frames(&data[SHADOW_HEAD_BYTES..], h.depth, &mut frames);
        assert!(frames.len() <= n as usize);
        let mut shifted = Vec::new();
        parse_frames(
            &data[SHADOW_HEAD_BYTES.min(data.len())..],
            h.depth ^ 1,
            &mut shifted,
        );
        assert!(common_prefix(&frames, &shifted) <= frames.len().min(shifted.len()));
    }
    for chunk in data.chunks(EVENT_SIZE) {
        if let Ok(e) = parse_event(chunk) {
            let _ = validate_event(&e, e.tid ^ (chunk[0] as u32 & 1), 0, u64::MAX / 2);
        }
    }
    // The first 16 bytes as (head, tail): a drain step is always bounded.
    if data.len() >= 16 {
        let head = u64::from_le_bytes(data[0..8].try_into().unwrap());
        let tail = u64::from_le_bytes(data[8..16].try_into().unwrap());
        let p = plan_drain(head, tail, TS_RING_CAPACITY);
        assert!(p.count <= TS_RING_CAPACITY);
        assert_eq!(p.new_tail, head);
        assert_eq!(
            p.resync,
            head < tail || head - tail > TS_RING_CAPACITY as u64
        );
        for k in 0..p.count {
            let idx = p.ring_index(k, TS_RING_CAPACITY);
            assert!(idx < TS_RING_CAPACITY);
            let off = record_offset_in_slot(idx);
            assert!(off + RECORD_SIZE <= crate::SLOT_SIZE);
        }
        let p = plan_drain(head, tail, TS_EVENT_RING_CAPACITY);
        assert!(p.count <= TS_EVENT_RING_CAPACITY);
        for k in 0..p.count {
            let off = crate::shadow::event_offset_in_slot(p.ring_index(k, TS_EVENT_RING_CAPACITY));
            assert!(off + EVENT_SIZE <= crate::SLOT_SIZE);
        }
    }
}
