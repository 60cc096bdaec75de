//! ASQM: a mutex whose waiters can refuse to queue when the lock is
//! congested (thesis §2.3, "Active Synchronization Queue Management").
//!
//! `lock_unless_congested(&mut budget)` behaves like `lock()` unless the
//! lock's current queueing delay (now − arrival of its oldest waiter)
//! exceeds the request's remaining queueing budget; then it returns `None`
//! at once and the handler answers with a failure (`bw-reject:
//! lock-congested`, status 503), which the server layer counts as a drop.
//! Time spent waiting is deducted from the budget, so a request cannot
//! spend its budget twice across several locks.
//!
//! The server layer puts each request's remaining [`QueueBudget`] (its AQM
//! budget minus its wait in the FIFO) into the request's extensions.

use crate::clock;
use crate::policy::Nanos;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// The queueing time a request may still spend, in the request extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBudget {
    pub remaining_ns: Nanos,
}

pub struct AsqmMutex<T> {
    data: Mutex<T>,
    /// Arrival times of the current waiters, oldest first.
    waiters: Mutex<VecDeque<Nanos>>,
}

impl<T> AsqmMutex<T> {
    pub fn new(value: T) -> Self {
        AsqmMutex {
            data: Mutex::new(value),
            waiters: Mutex::new(VecDeque::new()),
        }
    }

    /// Current queueing delay of this lock.
    pub fn queue_delay(&self, now: Nanos) -> Nanos {
        let w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        w.front().map_or(0, |&t| now.saturating_sub(t))
    }

    /// Lock no matter what (for code that cannot handle a drop).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lock, unless waiting would exceed `budget`; see the module docs.
    pub fn lock_unless_congested(&self, budget: &mut QueueBudget) -> Option<MutexGuard<'_, T>> {
        if let Ok(g) = self.data.try_lock() {
            return Some(g);
        }
        let arrived = clock::now();
        {
            let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            let delay = w.front().map_or(0, |&t| arrived.saturating_sub(t));
            if delay > budget.remaining_ns {
                return None;
            }
            w.push_back(arrived);
        }
        let guard = self.lock();
        {
            let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = w.iter().position(|&t| t == arrived) {
                w.remove(i);
            }
        }
        let waited = clock::now().saturating_sub(arrived);
        budget.remaining_ns = budget.remaining_ns.saturating_sub(waited);
        Some(guard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn uncontended_lock_is_granted_and_costs_no_budget() {
        let m = AsqmMutex::new(5);
        let mut b = QueueBudget { remaining_ns: 10 };
        assert_eq!(*m.lock_unless_congested(&mut b).unwrap(), 5);
        assert_eq!(b.remaining_ns, 10);
    }

    #[test]
    fn refuses_when_the_oldest_waiter_has_waited_longer_than_the_budget() {
        let m = Arc::new(AsqmMutex::new(()));
        let holder = m.lock();
        // A waiter queues behind the holder with a generous budget.
        let m2 = m.clone();
        let waiter = std::thread::spawn(move || {
            let mut b = QueueBudget {
                remaining_ns: 10_000_000_000,
            };
            let got = m2.lock_unless_congested(&mut b).is_some();
            (got, b.remaining_ns)
        });
        // Queued (a slow thread start on a loaded machine must not make the
        // wait short), then 25 ms more.
        let t0 = std::time::Instant::now();
        while m.queue_delay(clock::now()) == 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(25));
        assert!(m.queue_delay(clock::now()) >= 20_000_000);
        // A tight budget is refused at once; a loose one would queue.
        let mut tight = QueueBudget {
            remaining_ns: 1_000_000,
        };
        assert!(m.lock_unless_congested(&mut tight).is_none());
        assert_eq!(tight.remaining_ns, 1_000_000);
        drop(holder);
        let (got, left) = waiter.join().unwrap();
        assert!(got);
        // The wait was deducted from the waiter's budget.
        assert!(left <= 10_000_000_000 - 20_000_000, "{left}");
        assert_eq!(m.queue_delay(clock::now()), 0);
    }
}
