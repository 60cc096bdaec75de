//! What each request asks for: GET or SET, and which key.
//!
//! Keys are `key:<n>` with `n` uniform over `[0, keys)`; a request is a SET
//! with probability `set_ratio`. The draw uses its own seeded stream (split
//! from `--seed`) so that changing the mix never perturbs arrival times.

use crate::rng::SplitMix64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Get,
    Set,
}

/// One request, independent of wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Sequence number; the `line` protocol echoes it back.
    pub id: u64,
    pub op: Op,
    pub key: u64,
}

pub struct Workload {
    rng: SplitMix64,
    keys: u64,
    set_ratio: f64,
    next_id: u64,
}

impl Workload {
    pub fn new(seed: u64, keys: u64, set_ratio: f64) -> Self {
        Workload {
            // Different odd constant from the arrival stream's seed.
            rng: SplitMix64::new(seed ^ 0x5bd1_e995_5bd1_e995),
            keys: keys.max(1),
            set_ratio,
            next_id: 0,
        }
    }

    pub fn next_request(&mut self) -> Request {
        let op = if self.set_ratio > 0.0 && self.rng.next_open01() < self.set_ratio {
            Op::Set
        } else {
            Op::Get
        };
        let key = self.rng.below(self.keys);
        self.request(op, key)
    }

    /// A request for a specific key (used by `--preload`).
    pub fn request(&mut self, op: Op, key: u64) -> Request {
        let id = self.next_id;
        self.next_id += 1;
        Request { id, op, key }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_and_key_range() {
        let mut w = Workload::new(3, 100, 0.1);
        let reqs: Vec<Request> = (0..50_000).map(|_| w.next_request()).collect();
        let sets = reqs.iter().filter(|r| r.op == Op::Set).count() as f64;
        assert!((sets / 50_000.0 - 0.1).abs() < 0.01);
        assert!(reqs.iter().all(|r| r.key < 100));
        assert!(reqs.windows(2).all(|w| w[1].id == w[0].id + 1));
    }
}
