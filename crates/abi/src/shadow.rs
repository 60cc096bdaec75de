//! Hostile-input parsers for the LDB parts of a thread slot (ABI 2): the
//! shadow stack kept by the `-finstrument-functions` hooks, and the event
//! ring of lock and request events.
//!
//! Same rules as [`crate::region`]: every function reads from a byte slice the
//! caller copied out of the mapping, bounds-checks every offset, clamps every
//! count, and never treats a value as a pointer (function addresses, call
//! sites, mutex addresses and stack addresses are data to be printed and
//! symbolised, never followed).
//!
//! How the observer reads a shadow stack (a seqlock read):
//! 0. `gen` and `depth` unchanged since the last walk: nothing changed (a
//!    push changes `gen`; a pop changes only `depth`);
//! 1. `gen` with acquire; odd means the owner is mid-update: skip this pass;
//! 2. copy [`SHADOW_HEAD_BYTES`], then [`stored_frames`]`(depth)` frames;
//! 3. re-read `gen`; a different value means the copy may be torn: discard.

use core::mem::offset_of;

use crate::region::AbiError;
use crate::{
    ts_event, ts_frame, ts_shadow_stack, ts_thread_slot, EVENT_SIZE, FRAME_SIZE,
    TS_EVENT_RING_CAPACITY, TS_EV_MUTEX_LOCK, TS_EV_MUTEX_UNLOCK, TS_EV_MUTEX_WAIT,
    TS_EV_REQ_BLOCK, TS_EV_REQ_END, TS_EV_REQ_END_ALL, TS_EV_REQ_START, TS_SHADOW_DEPTH,
};

/// Bytes of the shadow stack before its frames (gen, depth, counters).
pub const SHADOW_HEAD_BYTES: usize = offset_of!(ts_shadow_stack, frames);

/// Offsets of LDB fields relative to the start of a slot.
pub mod ldb_offsets {
    use super::*;
    pub const SHADOW: usize = offset_of!(ts_thread_slot, shadow);
    pub const SHADOW_GEN: usize = SHADOW + offset_of!(ts_shadow_stack, gen);
    pub const SHADOW_DEPTH: usize = SHADOW + offset_of!(ts_shadow_stack, depth);
    pub const SHADOW_FRAMES: usize = SHADOW + offset_of!(ts_shadow_stack, frames);
    pub const EV_HEAD: usize = offset_of!(ts_thread_slot, ev_head);
    pub const EV_DROPPED: usize = offset_of!(ts_thread_slot, ev_dropped);
    pub const EV_TAIL: usize = offset_of!(ts_thread_slot, ev_tail);
    pub const EVENTS: usize = offset_of!(ts_thread_slot, events);
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap()))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()))
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

/// The head of a shadow stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShadowHead {
    pub gen: u64,
    /// The logical depth as written (may exceed `TS_SHADOW_DEPTH`, or be
    /// garbage); use [`stored_frames`] to know how many frames to copy.
    pub depth: u32,
    pub truncated: u64,
    pub resyncs: u64,
    /// Calls the runtime did not push (a signal handler interrupted a hook).
    pub skipped: u64,
}

impl ShadowHead {
    /// A seqlock writer is mid-update.
    pub fn busy(&self) -> bool {
        self.gen & 1 == 1
    }
}

/// Parses the first [`SHADOW_HEAD_BYTES`] of a shadow stack.
pub fn parse_shadow_head(b: &[u8]) -> Result<ShadowHead, AbiError> {
    need("shadow stack head", b, SHADOW_HEAD_BYTES)?;
    Ok(ShadowHead {
        gen: u64_at(b, offset_of!(ts_shadow_stack, gen)),
        depth: u32_at(b, offset_of!(ts_shadow_stack, depth)),
        truncated: u64_at(b, offset_of!(ts_shadow_stack, truncated)),
        resyncs: u64_at(b, offset_of!(ts_shadow_stack, resyncs)),
        skipped: u64_at(b, offset_of!(ts_shadow_stack, skipped)),
    })
}

/// How many frames of a stack of logical `depth` are stored (and may be copied).
pub fn stored_frames(depth: u32) -> u32 {
    depth.min(TS_SHADOW_DEPTH)
}

/// Offset of frame `i` (clamped into the array) relative to the slot.
pub fn frame_offset_in_slot(i: u32) -> usize {
    ldb_offsets::SHADOW_FRAMES + (i.min(TS_SHADOW_DEPTH - 1) as usize) * FRAME_SIZE
}

/// Parses one `struct ts_frame`.
pub fn parse_frame(b: &[u8]) -> Result<ts_frame, AbiError> {
    need("frame", b, FRAME_SIZE)?;
    Ok(ts_frame {
        r#fn: u64_at(b, offset_of!(ts_frame, r#fn)),
        site: u64_at(b, offset_of!(ts_frame, site)),
        id: u64_at(b, offset_of!(ts_frame, id)),
        sp: u64_at(b, offset_of!(ts_frame, sp)),
        entry_ns: u64_at(b, offset_of!(ts_frame, entry_ns)),
    })
}

/// Parses `n` consecutive frames from `b` (at most `TS_SHADOW_DEPTH`, and at
/// most what `b` holds), appending to `out`.
pub fn parse_frames(b: &[u8], n: u32, out: &mut Vec<ts_frame>) {
    let n = (stored_frames(n) as usize).min(b.len() / FRAME_SIZE);
    for i in 0..n {
        if let Ok(f) = parse_frame(&b[i * FRAME_SIZE..]) {
            out.push(f);
        }
    }
}

/// Serialises a frame to its C layout (tests and synthetic regions).
pub fn frame_to_bytes(f: &ts_frame) -> [u8; FRAME_SIZE] {
    let mut b = [0u8; FRAME_SIZE];
    for (off, v) in [
        (offset_of!(ts_frame, r#fn), f.r#fn),
        (offset_of!(ts_frame, site), f.site),
        (offset_of!(ts_frame, id), f.id),
        (offset_of!(ts_frame, sp), f.sp),
        (offset_of!(ts_frame, entry_ns), f.entry_ns),
    ] {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// Length of the common prefix of two consistent snapshots of one thread's
/// stack: the calls still running. A frame is the same call only if its
/// `id` (the gen at entry, unique per call) and its function match.
pub fn common_prefix(old: &[ts_frame], new: &[ts_frame]) -> usize {
    old.iter()
        .zip(new)
        .take_while(|(a, b)| a.id == b.id && a.r#fn == b.r#fn && a.site == b.site)
        .count()
}

// ---- event ring -----------------------------------------------------------

/// Offset of event ring entry `idx` (masked) relative to the slot.
pub fn event_offset_in_slot(idx: u32) -> usize {
    ldb_offsets::EVENTS + (idx as usize % TS_EVENT_RING_CAPACITY as usize) * EVENT_SIZE
}

/// Parses one `struct ts_event`.
pub fn parse_event(b: &[u8]) -> Result<ts_event, AbiError> {
    need("event", b, EVENT_SIZE)?;
    Ok(ts_event {
        ts_ns: u64_at(b, offset_of!(ts_event, ts_ns)),
        object: u64_at(b, offset_of!(ts_event, object)),
        arg: u64_at(b, offset_of!(ts_event, arg)),
        r#type: u32_at(b, offset_of!(ts_event, r#type)),
        tid: u32_at(b, offset_of!(ts_event, tid)),
    })
}

/// Serialises an event to its C layout (tests and synthetic regions).
pub fn event_to_bytes(e: &ts_event) -> [u8; EVENT_SIZE] {
    let mut b = [0u8; EVENT_SIZE];
    for (off, v) in [
        (offset_of!(ts_event, ts_ns), e.ts_ns),
        (offset_of!(ts_event, object), e.object),
        (offset_of!(ts_event, arg), e.arg),
    ] {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
    let t = offset_of!(ts_event, r#type);
    b[t..t + 4].copy_from_slice(&e.r#type.to_le_bytes());
    let t = offset_of!(ts_event, tid);
    b[t..t + 4].copy_from_slice(&e.tid.to_le_bytes());
    b
}

/// The name of a ring event type as written in the recording, or `None`
/// for anything else (FUNCTION never travels through a ring).
pub fn event_name(t: u32) -> Option<&'static str> {
    Some(match t {
        TS_EV_MUTEX_WAIT => "MUTEX_WAIT",
        TS_EV_MUTEX_LOCK => "MUTEX_LOCK",
        TS_EV_MUTEX_UNLOCK => "MUTEX_UNLOCK",
        TS_EV_REQ_START => "REQ_START",
        TS_EV_REQ_BLOCK => "REQ_BLOCK",
        TS_EV_REQ_END => "REQ_END",
        TS_EV_REQ_END_ALL => "REQ_END_ALL",
        _ => return None,
    })
}

/// Whether an event type is a lock event (else a request event).
pub fn is_lock_event(t: u32) -> bool {
    matches!(t, TS_EV_MUTEX_WAIT | TS_EV_MUTEX_LOCK | TS_EV_MUTEX_UNLOCK)
}

/// Why an event was rejected (counted, never written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFault {
    BadType,
    TidMismatch,
    /// The timestamp lies outside `[lo, hi]`, the window the agent accepts.
    BadTime,
}

/// Validates an event from slot owner `slot_tid`; `[lo, hi]` bounds its time.
pub fn validate_event(e: &ts_event, slot_tid: u32, lo: u64, hi: u64) -> Result<(), EventFault> {
    if event_name(e.r#type).is_none() {
        return Err(EventFault::BadType);
    }
    if slot_tid != 0 && e.tid != slot_tid {
        return Err(EventFault::TidMismatch);
    }
    if e.ts_ns < lo || e.ts_ns > hi {
        return Err(EventFault::BadTime);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: u64, f: u64) -> ts_frame {
        ts_frame {
            r#fn: f,
            site: f + 1,
            id,
            sp: 0,
            entry_ns: 0,
        }
    }

    #[test]
    fn prefix_distinguishes_calls_by_id() {
        let a = [frame(2, 10), frame(4, 20), frame(6, 30)];
        let b = [frame(2, 10), frame(4, 20), frame(8, 30)];
        assert_eq!(common_prefix(&a, &b), 2, "same fn, new call: ended");
        assert_eq!(common_prefix(&a, &a[..1]), 1);
        assert_eq!(common_prefix(&[], &a), 0);
    }

    #[test]
    fn frames_round_trip_and_clamp() {
        let f = ts_frame {
            r#fn: 0xdead,
            site: 0xbeef,
            id: 7,
            sp: 9,
            entry_ns: 11,
        };
        let b = frame_to_bytes(&f);
        assert_eq!(parse_frame(&b).unwrap(), f);
        assert!(parse_frame(&b[..FRAME_SIZE - 1]).is_err());
        let mut out = vec![];
        parse_frames(&b.repeat(3), u32::MAX, &mut out);
        assert_eq!(out.len(), 3, "bounded by the bytes given");
        assert_eq!(stored_frames(u32::MAX), TS_SHADOW_DEPTH);
        assert!(frame_offset_in_slot(u32::MAX) < crate::SLOT_SIZE);
    }

    #[test]
    fn events_validate() {
        let e = ts_event {
            ts_ns: 100,
            object: 0x1234,
            arg: 0,
            r#type: TS_EV_MUTEX_WAIT,
            tid: 5,
        };
        let b = event_to_bytes(&e);
        assert_eq!(parse_event(&b).unwrap(), e);
        assert_eq!(validate_event(&e, 5, 0, 1000), Ok(()));
        assert_eq!(validate_event(&e, 6, 0, 1000), Err(EventFault::TidMismatch));
        assert_eq!(validate_event(&e, 5, 200, 1000), Err(EventFault::BadTime));
        let bad = ts_event {
            r#type: crate::TS_EV_FUNCTION,
            ..e
        };
        assert_eq!(validate_event(&bad, 5, 0, 1000), Err(EventFault::BadType));
        assert!(event_offset_in_slot(u32::MAX) + EVENT_SIZE <= crate::SLOT_SIZE);
    }
}
