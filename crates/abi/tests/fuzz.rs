//! Deterministic randomized fuzzing of the region parsers, run by `cargo test`.
//!
//! Three generators, 200k cases in all: mutated valid headers (the
//! interesting inputs are one field away from valid), random slots and
//! records, and a simulated agent draining a synthetic region whose producer
//! fields are forged. The seed is fixed so a failure reproduces; set
//! `TAILSCOPE_FUZZ_SEED` to explore others. Coverage-guided fuzzing of the
//! same entry point lives in `fuzz/` (cargo-fuzz).

use tailscope_abi::fuzzing::exercise;
use tailscope_abi::region::*;
use tailscope_abi::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Values that break parsers: edges, near-edges, random.
    fn nasty_u64(&mut self) -> u64 {
        match self.below(8) {
            0 => 0,
            1 => u64::MAX,
            2 => u64::MAX - self.below(1024),
            3 => self.below(2 * TS_RING_CAPACITY as u64),
            4 => 1 << self.below(64),
            5 => u32::MAX as u64 + self.below(3),
            _ => self.next(),
        }
    }
}

fn seed() -> u64 {
    std::env::var("TAILSCOPE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7a11_5c09e)
}

fn mutate(rng: &mut Rng, b: &mut [u8]) {
    for _ in 0..=rng.below(4) {
        let off = rng.below(b.len() as u64) as usize;
        match rng.below(3) {
            0 => b[off] ^= 1 << rng.below(8),
            1 => b[off] = rng.next() as u8,
            _ => {
                let v = rng.nasty_u64().to_le_bytes();
                let off = off & !3;
                let n = (b.len() - off).min(if rng.below(2) == 0 { 4 } else { 8 });
                b[off..off + n].copy_from_slice(&v[..n]);
            }
        }
    }
}

#[test]
fn parsers_survive_mutated_headers() {
    let mut rng = Rng(seed());
    let valid = synth::region(2, 77);
    let header = &valid[..REGION_HEADER_SIZE];
    let mut ok = 0;
    for _ in 0..80_000 {
        let mut b = header.to_vec();
        mutate(&mut rng, &mut b);
        let cut = if rng.below(16) == 0 {
            rng.below(b.len() as u64 + 1) as usize
        } else {
            b.len()
        };
        let file_len = match rng.below(4) {
            0 => valid.len(),
            1 => rng.below(1 << 26) as usize,
            2 => usize::MAX,
            _ => region_size(TS_MAX_SLOTS as usize),
        };
        if parse_region_header(&b[..cut], file_len).is_ok() {
            ok += 1;
        }
        exercise(&b[..cut]);
    }
    // The mutations must sometimes leave the header valid (e.g. only the
    // kinds table or reserved bytes hit), or this test explores nothing.
    assert!(ok > 1_000, "only {ok} mutated headers parsed");
}

#[test]
fn parsers_survive_random_bytes() {
    let mut rng = Rng(seed() ^ 0xdead_beef);
    for _ in 0..60_000 {
        let len = rng.below(300) as usize;
        let b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        exercise(&b);
    }
}

/// A consumer loop like the agent's, over a region whose producer fields and
/// records are forged between steps. It must terminate every step, count
/// the impossible, and never emit a record that fails validation.
#[test]
fn drain_survives_forged_producer() {
    let mut rng = Rng(seed() ^ 0x5107);
    let mut region = synth::region(1, 77);
    synth::claim_slot(&mut region, 0, 1000, TS_SLOT_LIVE);
    let base = slot_offset(0);
    let (mut emitted, mut corrupt, mut resyncs) = (0u64, 0u64, 0u64);
    for step in 0..60_000u64 {
        // The producer: sometimes honest, sometimes hostile.
        match rng.below(6) {
            0..=2 => {
                for _ in 0..rng.below(8) {
                    let r = ts_request_record {
                        request_id: step,
                        start_ns: step * 1000,
                        latency_ns: rng.below(1_000_000),
                        tid: if rng.below(20) == 0 { 1 } else { 1000 },
                        flags: TS_REC_SAMPLED | TS_REC_COUNTERS,
                        oncpu_ns: rng.below(1_000_000),
                        kind: rng.below(70) as u16,
                        ..Default::default()
                    };
                    synth::push_record(&mut region, 0, &r);
                }
            }
            3 => synth::write_u64(&mut region, base + slot_offsets::RING_HEAD, rng.nasty_u64()),
            4 => {
                let at = base
                    + slot_offsets::RING
                    + rng.below((TS_RING_CAPACITY as u64) * RECORD_SIZE as u64) as usize;
                let n = 8.min(region.len() - at);
                region[at..at + n].copy_from_slice(&rng.next().to_le_bytes()[..n]);
            }
            _ => {
                let off = base + rng.below(SLOT_PRODUCER_BYTES as u64) as usize;
                region[off] = rng.next() as u8;
            }
        }
        // The consumer.
        let slot = match parse_slot(&region[base..base + SLOT_PRODUCER_BYTES]) {
            Ok(s) => s,
            Err(_) => {
                synth::claim_slot(&mut region, 0, 1000, TS_SLOT_LIVE);
                continue;
            }
        };
        let plan = plan_drain(slot.ring_head, slot.ring_tail, TS_RING_CAPACITY);
        assert!(plan.count <= TS_RING_CAPACITY);
        resyncs += plan.resync as u64;
        for k in 0..plan.count {
            let off = base + record_offset_in_slot(plan.ring_index(k, TS_RING_CAPACITY));
            let r = parse_record(&region[off..off + RECORD_SIZE]).unwrap();
            match validate_record(&r, Some(slot.tid)) {
                Ok(()) => {
                    emitted += 1;
                    assert!(r.latency_ns <= region::MAX_SANE_LATENCY_NS);
                }
                Err(_) => corrupt += 1,
            }
        }
        synth::write_u64(&mut region, base + slot_offsets::RING_TAIL, plan.new_tail);
    }
    assert!(emitted > 10_000, "emitted {emitted}");
    assert!(
        corrupt > 0 && resyncs > 0,
        "corrupt {corrupt} resyncs {resyncs}"
    );
}

/// A consumer of the LDB parts of a slot (shadow stack seqlock read, event
/// ring drain), over a slot whose producer writes garbage between steps. It
/// must stay bounded, never emit an invalid event, and count the rest.
#[test]
fn ldb_reader_survives_forged_slot() {
    use tailscope_abi::shadow::*;
    let mut rng = Rng(seed() ^ 0x1db);
    let mut region = synth::region(1, 77);
    synth::claim_slot(&mut region, 0, 1000, TS_SLOT_LIVE);
    let base = slot_offset(0);
    let (mut consistent, mut torn, mut good_events, mut bad_events) = (0u64, 0u64, 0u64, 0u64);
    let mut gen = 0u64;
    for step in 0..40_000u64 {
        match rng.below(5) {
            0 | 1 => {
                gen += 2;
                let depth = rng.below(2 * TS_SHADOW_DEPTH as u64 + 3) as u32;
                let frames: Vec<ts_frame> = (0..stored_frames(depth))
                    .map(|i| ts_frame {
                        r#fn: 0x1000 + i as u64,
                        site: rng.next(),
                        id: gen.wrapping_sub(2 * i as u64),
                        sp: rng.next(),
                        entry_ns: 0,
                    })
                    .collect();
                synth::set_shadow(&mut region, 0, gen, depth, &frames);
                let e = ts_event {
                    ts_ns: step,
                    object: rng.next(),
                    arg: 0,
                    r#type: rng.below(10) as u32,
                    tid: 1000,
                };
                synth::push_event(&mut region, 0, &e);
            }
            2 => {
                // A writer caught mid-update (gen odd), then a byte of garbage.
                synth::write_u64(&mut region, base + ldb_offsets::SHADOW_GEN, gen + 1);
                let off = base + ldb_offsets::SHADOW + rng.below(SHADOW_SIZE as u64) as usize;
                region[off] = rng.next() as u8;
            }
            3 => synth::write_u64(&mut region, base + ldb_offsets::EV_HEAD, rng.nasty_u64()),
            _ => {
                let at = base
                    + ldb_offsets::EVENTS
                    + rng.below((TS_EVENT_RING_CAPACITY as u64) * EVENT_SIZE as u64) as usize;
                let n = 8.min(region.len() - at);
                region[at..at + n].copy_from_slice(&rng.next().to_le_bytes()[..n]);
            }
        }
        // Seqlock read of the stack.
        let h =
            parse_shadow_head(&region[base + ldb_offsets::SHADOW..][..SHADOW_HEAD_BYTES]).unwrap();
        let mut frames = vec![];
        parse_frames(
            &region[base + ldb_offsets::SHADOW_FRAMES..][..SHADOW_SIZE - SHADOW_HEAD_BYTES],
            h.depth,
            &mut frames,
        );
        assert!(frames.len() <= TS_SHADOW_DEPTH as usize);
        if h.busy() || synth::read_u64(&region, base + ldb_offsets::SHADOW_GEN) != h.gen {
            torn += 1;
        } else {
            consistent += 1;
        }
        // Event drain.
        let head = synth::read_u64(&region, base + ldb_offsets::EV_HEAD);
        let tail = synth::read_u64(&region, base + ldb_offsets::EV_TAIL);
        let plan = plan_drain(head, tail, TS_EVENT_RING_CAPACITY);
        assert!(plan.count <= TS_EVENT_RING_CAPACITY);
        for k in 0..plan.count {
            let off = base + event_offset_in_slot(plan.ring_index(k, TS_EVENT_RING_CAPACITY));
            let e = parse_event(&region[off..off + EVENT_SIZE]).unwrap();
            match validate_event(&e, 1000, 0, 1 << 40) {
                Ok(()) => {
                    good_events += 1;
                    assert!(event_name(e.r#type).is_some());
                }
                Err(_) => bad_events += 1,
            }
        }
        synth::write_u64(&mut region, base + ldb_offsets::EV_TAIL, plan.new_tail);
    }
    assert!(
        consistent > 1000 && torn > 100,
        "consistent {consistent} torn {torn}"
    );
    assert!(
        good_events > 1000 && bad_events > 100,
        "good {good_events} bad {bad_events}"
    );
}
