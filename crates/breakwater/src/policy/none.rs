//! No overload control: admit everything, queue without bound. The
//! baseline that collapses.

use super::{
    Acquire, Arrival, ClientId, ClientPolicy, Completion, Feedback, Nanos, Policy, QueueView,
    Verdict,
};

#[derive(Debug, Clone, Default)]
pub struct NoControl;

impl Policy for NoControl {
    fn name(&self) -> &'static str {
        "none"
    }
    fn on_arrival(&mut self, _now: Nanos, _msg: &Arrival, _queue: &QueueView) -> Verdict {
        Verdict::Admit
    }
    fn on_complete(&mut self, _now: Nanos, _done: &Completion, _queue: &QueueView) -> Feedback {
        Feedback::None
    }
    fn feedback(&mut self, _now: Nanos, _client: ClientId) -> Feedback {
        Feedback::None
    }
}

/// A client that sends everything at once.
#[derive(Debug, Clone, Default)]
pub struct Unlimited;

impl ClientPolicy for Unlimited {
    fn name(&self) -> &'static str {
        "none"
    }
    fn try_acquire(&mut self, _now: Nanos, _priority: u8) -> Acquire {
        Acquire::Send(super::Kind::Request)
    }
}
