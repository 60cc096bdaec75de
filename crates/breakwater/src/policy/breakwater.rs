//! Breakwater: server-driven credits, demand speculation with
//! overcommitment, lazy distribution, and AQM (thesis ch. 2), plus Protego's
//! performance-driven efficiency signal (Algorithm 1).
//!
//! **Credit pool.** `C_total` is how many requests the server is willing to
//! have outstanding (unused at clients, in flight, queued or running). Every
//! `rtt` it moves by AIMD on the measured queueing delay `d_m`
//! (Eq. 2.1–2.3):
//!
//! ```text
//! d_m <  d_t:  C_total += max(α·n_c, 1)
//! d_m >= d_t:  C_total *= max(1 − β·(d_m − d_t)/d_t, 0.5)
//! C_min (= cores) <= C_total <= 64·n_c
//! ```
//!
//! With the efficiency signal it instead follows Algorithm 1 every four
//! end-to-end RTTs (see [`Breakwater::efficiency_step`]).
//!
//! **Credits issued.** `C_issued = Σ_x (unused_x + inflight_x)`: a credit is
//! issued when granted, turns from unused to in flight when its request
//! arrives, and comes back when the response (or reject) goes out. The
//! property tests recompute this sum after every event.
//!
//! **Lazy distribution** (Eq. 2.4–2.6). Credits are only decided when there
//! is a response to send to client `x`:
//!
//! ```text
//! C_oc  = max((C_total − C_issued)/n_c, 1)            (0 without overcommit)
//! C_issued <  C_total:  c_new = min(demand_x + C_oc, c_x + C_avail)
//! C_issued >= C_total:  c_new = min(demand_x + C_oc, c_x − 1)   (revoke)
//! ```
//!
//! The window goes back as a cumulative edge, `limit_x = received_x + c_new`:
//! absolute, so it is idempotent. Requests a client sent on a credit that
//! was revoked while they were on the wire are honoured (up to the highest
//! edge ever sent to it), and anything beyond that is refused, because
//! clients are not trusted. A client's reported demand is clamped to
//! `C_total`, so a liar can take at most the free credits of the pool: the
//! pool itself never grows past `C_total` by a grant.
//!
//! **Registration** rides on a client's first request. If the grant leaves
//! it no credit, the request is still admitted on an overdraft credit while
//! the queue delay is below `d_t` (a cold pool starts at `C_min`, and a
//! newcomer to an idle server should not be refused); when congested it is
//! refused with `no-credit` and the client layer re-queues it.
//!
//! **AQM.** A credited request whose remaining budget is smaller than the
//! queue delay it faces is refused at once, and its credit comes back. The
//! delay it faces is forecast as the larger of the oldest queued request's
//! age (the thesis's signal, which also drives the AIMD) and the queued
//! work ahead of it (length × mean service / workers): the age alone
//! admits requests into a queue that is filling faster than it drains. The
//! budget is the server's queue budget, tightened by the client's remaining
//! time (it says how long it will still wait, a relative value) minus the
//! service reserve: a request that spent its SLO waiting for credit at its
//! client is refused rather than served too late to count.
//!
//! **Explicit updates.** A client with demand but no credit and nothing in
//! flight parks a credit wait; ticks answer parked clients in FIFO order as
//! soon as credits are available. Clients silent for `client_idle` lose
//! their unused credits and are forgotten.
//!
//! **Explicit credits (server push).** Where the transport can push
//! (`set_pushable`: the client registered a credit stream, see
//! [`crate::push`]), drained clients send no credit wait; instead
//! `push_credits` hands the pool's spare credits — what is left after the
//! responses' lazy grants — to pushable clients that hold none, round a
//! ring per connection (the thesis picks at random), each by Eq. 2.5.
//! After a completion only clients of the responder's connection are
//! picked, so the credits ride on that response.
//!
//! **Known demand (demand lines, session 10).** A client that signals its
//! demand (`set_signals_demand`; [`crate::push`]) sends a line when it is
//! drained and a request starts waiting (`on_demand`); a response that
//! leaves such a client drained with piggybacked demand counts the same.
//! Those clients *want* a credit until their budget minus the service
//! reserve runs out. While the queue is short (forecast wait < d_t/2: the
//! core is about to idle) `push_credits` gives the spare credits to them
//! first, newest first, and C_oc is 0 (no speculation while known demand
//! waits); otherwise everything above is unchanged. With `demand_only`
//! they are pushed only on known demand, always (measured worse: each
//! targeted credit costs a round trip of the request's budget). The
//! invariants are the thesis's: a want only orders the spare credits
//! (never past `C_total`), and a grant is still Eq. 2.5/2.6
//! (`unused ≤ demand + C_oc`).

use super::{
    fraction, positive_f64, positive_u64, Acquire, Arrival, ClientId, ClientPolicy, Completion,
    ConfigError, Feedback, Kind, Nanos, Policy, PolicyStats, QueueView, RejectReason, Release,
    Verdict,
};
use std::collections::{HashMap, VecDeque};

/// Which overload signal drives `C_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// Request queueing delay (CPU congestion): AIMD every RTT.
    Delay,
    /// Protego's performance-driven efficiency (lock contention): Algorithm 1
    /// every 4 end-to-end RTTs.
    Efficiency,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BreakwaterConfig {
    pub signal: Signal,
    /// d_t: the queueing delay the pool aims at (thesis: 40% of the SLO).
    pub target_delay_ns: Nanos,
    /// α: additive increase per client (thesis: 0.1%).
    pub alpha: f64,
    /// β: multiplicative decrease per unit of relative excess delay (2%).
    pub beta: f64,
    /// How often the pool is updated: the network RTT.
    pub rtt_ns: Nanos,
    /// C_min: never fewer credits than this (the thesis: the core count).
    pub min_credits: u64,
    /// C_max = this × n_c (thesis: 64).
    pub max_credits_per_client: u64,
    /// AQM: the most a request may wait in the queue (thesis: target delay
    /// minus the p99 service and network times). Default: SLO − the
    /// service reserve, i.e. 70% of the SLO.
    pub queue_budget_ns: Nanos,
    /// What a request needs after its queueing (service + network, at the
    /// tail). A client's remaining time minus this is its own queue budget,
    /// so a request that waited at its client for credit is not served too
    /// late to count. Default: 30% of the SLO — the p99 service time plus
    /// an RTT under the thesis's SLO rule (SLO = 10 × (service + RTT)):
    /// exponential service has p99 ≈ 4.6 × mean, so 4.6·S + RTT ≤ 0.3 ×
    /// 10·(S + RTT). Measured on the bench VM: S = 100 µs, p99 460 µs,
    /// loopback HTTP/2 RTT ≈ 100–150 µs, sum ≈ 600 µs = 0.3 × 2 ms.
    pub service_reserve_ns: Nanos,
    /// Demand speculation with overcommitment (C_oc ≥ 1). Off: C_oc = 0, so
    /// clients get exactly their demand and must ask (credit waits) for more.
    pub overcommit: bool,
    /// Drop on queue delay > budget.
    pub aqm: bool,
    /// AQM compares the budget with the wait a request admitted now should
    /// expect — the larger of the oldest request's age and (queue length ×
    /// mean service / workers) — rather than with the age alone, which
    /// under-reads a queue that is filling (its oldest entry is young while
    /// many wait behind it).
    pub aqm_forecast: bool,
    /// The forecast counts, per request ahead, the mean time from a
    /// completion that leaves work queued to the next start (a worker on
    /// the I/O thread reads, admits, refuses and replies there: the queue
    /// drains one request per service time *plus* that gap), not the
    /// service time alone. Default on (session 11).
    pub forecast_gap: bool,
    /// The service reserve adapts (`service_reserve_ns` is where it
    /// starts): it tracks the reserve under which a share `late_target`
    /// of admitted requests finish late, as seen by the server (sojourn +
    /// `rtt_ns` for the reply > the budget the request arrived with). A
    /// late completion raises it by `reserve_step_ns`; an on-time one
    /// lowers it by `reserve_step_ns × late_target / (1 − late_target)`,
    /// so it settles where the late share is `late_target`, whatever the
    /// service tail, the forecast's error and the reply path cost. Kept
    /// within [0, `max_reserve_ns`]. The thesis's reserve is "p99 service +
    /// p99 network": this measures it instead of assuming it. Default on,
    /// target 0.3% (session 11, docs/breakwater.md).
    pub adaptive_reserve: bool,
    pub late_target: f64,
    pub reserve_step_ns: Nanos,
    /// The adaptive reserve's ceiling (default: 70% of the SLO).
    pub max_reserve_ns: Nanos,
    /// t_e: efficiency threshold (10%).
    pub efficiency_threshold: f64,
    /// t_d: maximum drop rate (100%).
    pub max_drop_rate: f64,
    /// a: additive step of the efficiency signal; `None` uses max(α·n_c, 1).
    pub efficiency_step: Option<f64>,
    /// d: multiplicative decrement of the efficiency signal.
    pub efficiency_decrease: f64,
    /// Unused credits of a client silent this long are revoked.
    pub client_idle_ns: Nanos,
    /// At most this many requests sent without credit ([`Kind::Await`])
    /// are held for one; more are refused at once (503 `limit`). The AQM
    /// rule already refuses a request whose forecast wait (queued + held
    /// ahead × mean service) exceeds its budget, so this is a backstop.
    pub max_held: u64,
    /// The floor of Eq. 2.4, `C_oc = max(spare/n_c, floor)`: the thesis's
    /// 1 guarantees a drained client a credit to send with. Clients whose
    /// credit wait carries the request ([`Kind::Await`]) do not need one,
    /// and a credit given to one of many mostly idle clients sits unused,
    /// holding back the pool: with await the floor is 0, so a response
    /// speculates only with the pool's spare credits.
    pub overcommit_floor: u64,
    /// With [`Kind::Await`]: a held request whose time runs out (or that
    /// could not start in time when it arrived) is not refused at once but
    /// kept, never run, as its client's credit wait: it is answered
    /// (`expired`, with the client's window) when the pool has a credit to
    /// spare for the client after the live held requests, or after
    /// `max_hold_ns`. Until then the client sends nothing (its new requests
    /// wait and expire at the client, for free), as a parked credit wait of
    /// the thesis's protocol keeps it quiet, while a live held request
    /// needs no second round trip. Off: the session-4 `await` (refuse at
    /// once).
    pub hold_expired: bool,
    /// The longest an expired held request is kept before it is answered
    /// anyway (without credit if the pool is spent).
    pub max_hold_ns: Nanos,
    /// Clients that signal their demand (demand lines, [`crate::push`])
    /// are pushed explicit credits *only* on known demand: never round the
    /// ring, and no speculation (C_oc = 0) while known demand waits. Off
    /// (the default): known demand is served first only while the queue
    /// is short (the forecast wait under half of d_t), when the core would
    /// otherwise idle; otherwise pushes and speculation go on as without
    /// demand lines. docs/breakwater.md, session 10: strict measured 0.54
    /// of capacity at 2x against 0.83 without demand lines (every
    /// targeted credit costs the extra round trip, so the pushed requests
    /// arrive with too little budget and the AQM refuses them).
    ///
    /// Strict mode needs every idle-to-busy transition signalled: pair it
    /// with a demand sample of 1 (`PushHub::set_demand_sample`; bw-server
    /// does so), or an unsampled drained client waits for a credit that
    /// never comes. A client whose queue grows after its line, before the
    /// want lapses, sends no second line (not handled; strict mode is an
    /// experiment, off by default).
    pub demand_only: bool,
}

impl BreakwaterConfig {
    /// The thesis's defaults for an SLO and a core count: d_t = 40% of the
    /// SLO, α = 0.1%, β = 2%, C_min = cores, C_max = 64·n_c, RTT 100 µs,
    /// t_e = 10%, t_d = 100%; the AQM budget is the thesis's "target delay
    /// minus p99 service and network" with the SLO as the target: 70% of it
    /// (see `service_reserve_ns`), against the forecast wait.
    pub fn for_slo(slo_ns: Nanos, cores: u64) -> Self {
        BreakwaterConfig {
            signal: Signal::Delay,
            target_delay_ns: slo_ns * 2 / 5,
            alpha: 0.001,
            beta: 0.02,
            rtt_ns: 100_000,
            min_credits: cores,
            max_credits_per_client: 64,
            queue_budget_ns: slo_ns - slo_ns * 3 / 10,
            service_reserve_ns: slo_ns * 3 / 10,
            overcommit: true,
            aqm: true,
            aqm_forecast: true,
            forecast_gap: true,
            adaptive_reserve: true,
            late_target: 0.003,
            reserve_step_ns: 20_000,
            max_reserve_ns: slo_ns * 7 / 10,
            efficiency_threshold: 0.1,
            max_drop_rate: 1.0,
            efficiency_step: None,
            efficiency_decrease: 0.02,
            client_idle_ns: 1_000_000_000,
            max_held: cores.max(1) * 64,
            overcommit_floor: 1,
            hold_expired: false,
            max_hold_ns: slo_ns.saturating_mul(50),
            demand_only: false,
        }
    }

    /// Refuse values the control cannot work with, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive_u64("target_delay", self.target_delay_ns)?;
        fraction("alpha", self.alpha, true)?;
        fraction("beta", self.beta, true)?;
        positive_u64("rtt", self.rtt_ns)?;
        positive_u64("min_credits", self.min_credits)?;
        positive_u64("max_credits_per_client", self.max_credits_per_client)?;
        positive_u64("queue_budget", self.queue_budget_ns)?;
        if self.adaptive_reserve {
            if !(self.late_target > 0.0 && self.late_target < 0.5) {
                return Err(ConfigError(format!(
                    "late_target must be in (0, 0.5), got {}",
                    self.late_target
                )));
            }
            positive_u64("reserve_step", self.reserve_step_ns)?;
        }
        fraction("efficiency_threshold", self.efficiency_threshold, true)?;
        fraction("max_drop_rate", self.max_drop_rate, true)?;
        if let Some(a) = self.efficiency_step {
            positive_f64("efficiency_step", a)?;
        }
        fraction("efficiency_decrease", self.efficiency_decrease, false)?;
        positive_u64("client_idle", self.client_idle_ns)?;
        positive_u64("max_held", self.max_held)?;
        positive_u64("max_hold", self.max_hold_ns)?;
        Ok(())
    }
}

/// What the server knows about one client.
#[derive(Debug, Clone, Default)]
struct ClientState {
    /// Credited requests received since registration.
    received: u64,
    /// Cumulative edge last granted: unused = limit − received.
    limit: u64,
    /// Highest edge ever sent: requests up to it are honoured.
    high_water: u64,
    /// Admitted requests whose response has not gone out.
    inflight: u64,
    demand: u64,
    last_seen: Nanos,
    parked: bool,
    /// A request of this client is held ([`Kind::Await`]).
    awaiting: bool,
    /// The group (connection) whose credit stream explicit credits for it
    /// can be pushed on.
    push_group: Option<u64>,
    /// It signals its demand when drained ([`Policy::on_demand`]): no
    /// speculative push to it.
    signals: bool,
    /// Its entry in `wanting` (0: none): it is drained and its demand
    /// waits for an explicit credit.
    want_seq: u64,
}

impl ClientState {
    fn unused(&self) -> u64 {
        self.limit.saturating_sub(self.received)
    }
}

/// Efficiency-signal bookkeeping (Algorithm 1).
#[derive(Debug, Clone, Default)]
struct Efficiency {
    in_cur: u64,
    out_cur: u64,
    drop_cur: u64,
    in_last: u64,
    out_last: u64,
    iteration_start: Nanos,
    /// EWMA of server sojourn, for the end-to-end RTT.
    sojourn_ewma_ns: f64,
    /// EWMA of the FIFO wait of started requests; sojourn − wait is the
    /// service time the AQM forecast uses.
    wait_ewma_ns: f64,
    /// EWMA of the gap from a completion that left work queued to the
    /// next start, and when that completion was (`forecast_gap`).
    gap_ewma_ns: f64,
    drain_from: Option<Nanos>,
}

/// Which branch of Algorithm 1 fired (for tests and traces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EfficiencyBranch {
    /// drop_cur > t_d · in_cur: decrease.
    DropCap,
    /// Δin·Δout > 0 and |Δout| > t_e·|Δin|: increase.
    Efficient,
    /// Δin·Δout > 0 but |Δout| <= t_e·|Δin|: decrease.
    Inefficient,
    /// Δin·Δout <= 0: decrease.
    NoCorrelation,
}

#[derive(Debug, Clone)]
pub struct Breakwater {
    config: BreakwaterConfig,
    c_total: f64,
    issued: u64,
    clients: HashMap<ClientId, ClientState>,
    parked: VecDeque<ClientId>,
    /// Requests sent without credit ([`Kind::Await`]) held for a credit,
    /// oldest first.
    held: VecDeque<Held>,
    /// `hold_expired`: held requests whose time ran out, kept as their
    /// clients' credit waits, oldest first. They claim no credit.
    expired: VecDeque<Held>,
    /// Held requests to refuse at the next release (their client left).
    held_rejects: Vec<ClientId>,
    last_update: Option<Nanos>,
    last_idle_scan: Nanos,
    eff: Efficiency,
    /// Grants made on responses / explicit updates, for message counts.
    pub explicit_updates: u64,
    last_grant: Option<GrantRecord>,
    /// Pushable clients by group, least recently pushed to first: explicit
    /// credits go round these rings (the thesis picks at random; with every
    /// client equally likely to have a request next, a ring is as good and
    /// spreads the credits evenly). Stale ids are dropped lazily.
    push_rings: HashMap<u64, VecDeque<ClientId>>,
    /// Groups, in the order pushes without a `via` visit them.
    push_groups: VecDeque<u64>,
    /// Credits granted by [`Policy::push_credits`].
    pub pushed: u64,
    /// Drained clients whose demand is known (a demand line, or the
    /// demand piggybacked on their last request) and waits for an explicit
    /// credit, in the order it became known; entries whose `seq` is no
    /// longer their client's `want_seq` are stale and skipped.
    wanting: VecDeque<Want>,
    /// Live entries of `wanting`.
    want_live: usize,
    want_next: u64,
    /// Demand lines received, and explicit credits granted to them.
    pub demand_lines: u64,
    pub demand_pushed: u64,
    /// At the latest event with a queue view: the forecast wait was under
    /// half of d_t (the core is about to idle): known demand goes first.
    queue_short: bool,
    /// The service reserve in use (`adaptive_reserve`; else the config's).
    reserve_ns: f64,
    /// Completions the reserve was adapted on, and those found late.
    pub budget_outcomes: u64,
    pub late_outcomes: u64,
}

/// A drained client whose demand waits for an explicit credit.
#[derive(Debug, Clone, Copy)]
struct Want {
    client: ClientId,
    seq: u64,
    group: u64,
    /// After this its requests can no longer be served in time: dropped.
    deadline: Nanos,
}

/// A request held for a credit.
#[derive(Debug, Clone, Copy)]
struct Held {
    client: ClientId,
    arrived: Nanos,
    /// The client's remaining time when it arrived.
    budget_ns: Nanos,
}

/// The inputs and result of the latest lazy-distribution decision, so tests
/// can check `unused ≤ demand + C_oc` at the moment it must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRecord {
    pub client: ClientId,
    pub demand: u64,
    pub c_oc: u64,
    pub unused_before: u64,
    pub unused_after: u64,
}

impl Breakwater {
    pub fn new(config: BreakwaterConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Breakwater {
            c_total: config.min_credits as f64,
            config,
            issued: 0,
            clients: HashMap::new(),
            parked: VecDeque::new(),
            held: VecDeque::new(),
            expired: VecDeque::new(),
            held_rejects: Vec::new(),
            last_update: None,
            last_idle_scan: 0,
            eff: Efficiency::default(),
            explicit_updates: 0,
            last_grant: None,
            push_rings: HashMap::new(),
            push_groups: VecDeque::new(),
            pushed: 0,
            wanting: VecDeque::new(),
            want_live: 0,
            want_next: 0,
            demand_lines: 0,
            demand_pushed: 0,
            queue_short: true,
            reserve_ns: 0.0,
            budget_outcomes: 0,
            late_outcomes: 0,
        })
        .map(|mut p| {
            p.reserve_ns = p.config.service_reserve_ns as f64;
            p
        })
    }

    /// The service reserve the AQM uses now.
    pub fn service_reserve_ns(&self) -> Nanos {
        self.reserve_ns as Nanos
    }

    pub fn config(&self) -> &BreakwaterConfig {
        &self.config
    }

    /// C_total (fractional; grants use its floor).
    pub fn c_total(&self) -> f64 {
        self.c_total
    }

    /// C_issued.
    pub fn issued(&self) -> u64 {
        self.issued
    }

    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Σ_x (unused_x + inflight_x), recomputed: must equal [`Self::issued`].
    pub fn issued_recount(&self) -> u64 {
        self.clients.values().map(|c| c.unused() + c.inflight).sum()
    }

    /// Server's view of the unused credits of `client`.
    pub fn unused(&self, client: ClientId) -> Option<u64> {
        self.clients.get(&client).map(ClientState::unused)
    }

    pub fn last_grant(&self) -> Option<GrantRecord> {
        self.last_grant
    }

    pub fn demand(&self, client: ClientId) -> Option<u64> {
        self.clients.get(&client).map(|c| c.demand)
    }

    fn n_c(&self) -> u64 {
        (self.clients.len() as u64).max(1)
    }

    fn total(&self) -> u64 {
        self.c_total as u64
    }

    fn c_max(&self) -> f64 {
        (self.config.max_credits_per_client * self.n_c()).max(self.config.min_credits) as f64
    }

    fn clamp_total(&mut self) {
        self.c_total = self
            .c_total
            .max(self.config.min_credits as f64)
            .min(self.c_max());
    }

    /// A = max(α·n_c, 1) (Eq. 2.3).
    fn additive_step(&self) -> f64 {
        (self.config.alpha * self.n_c() as f64).max(1.0)
    }

    /// C_oc = max((C_total − C_issued)/n_c, 1) (Eq. 2.4), 0 without
    /// overcommit, and 0 while a drained client's known demand waits for
    /// an explicit credit (see [`Self::wanting`]): speculation then takes
    /// credits from clients known to want them.
    pub fn overcommit_per_client(&self) -> u64 {
        if !self.config.overcommit || self.serve_wants_first() {
            return 0;
        }
        (self.total().saturating_sub(self.claimed()) / self.n_c()).max(self.config.overcommit_floor)
    }

    /// Credits issued plus requests held for one: a held request is demand
    /// the server already has, so it claims the pool's next free credit
    /// before any speculative grant does (lazy distribution sees the pool
    /// as spent while requests are held, and revokes).
    fn claimed(&self) -> u64 {
        self.issued + self.held.len() as u64
    }

    /// Eq. 2.1/2.2 on a measured queueing delay. Public for tests.
    pub fn delay_step(&mut self, d_m: Nanos) {
        let d_t = self.config.target_delay_ns;
        if d_m < d_t {
            self.c_total += self.additive_step();
        } else {
            let excess = (d_m - d_t) as f64 / d_t as f64;
            self.c_total *= (1.0 - self.config.beta * excess).max(0.5);
        }
        self.clamp_total();
    }

    /// Algorithm 1 on one iteration's counts; rolls the counts over. Public
    /// for the branch-table test.
    pub fn efficiency_step(&mut self) -> EfficiencyBranch {
        let e = &mut self.eff;
        let (t_e, t_d) = (self.config.efficiency_threshold, self.config.max_drop_rate);
        let d_in = e.in_cur as f64 - e.in_last as f64;
        let d_out = e.out_cur as f64 - e.out_last as f64;
        let branch = if e.drop_cur as f64 > t_d * e.in_cur as f64 {
            EfficiencyBranch::DropCap
        } else if d_in * d_out > 0.0 {
            if d_out.abs() > t_e * d_in.abs() {
                EfficiencyBranch::Efficient
            } else {
                EfficiencyBranch::Inefficient
            }
        } else {
            EfficiencyBranch::NoCorrelation
        };
        e.in_last = e.in_cur;
        e.out_last = e.out_cur;
        e.in_cur = 0;
        e.out_cur = 0;
        e.drop_cur = 0;
        if branch == EfficiencyBranch::Efficient {
            let a = self
                .config
                .efficiency_step
                .unwrap_or_else(|| self.additive_step());
            self.c_total += a;
        } else {
            self.c_total *= 1.0 - self.config.efficiency_decrease;
        }
        self.clamp_total();
        branch
    }

    /// Set the current iteration's counts (tests of the branch table).
    pub fn set_efficiency_counts(
        &mut self,
        in_last: u64,
        out_last: u64,
        in_cur: u64,
        out_cur: u64,
        drop_cur: u64,
    ) {
        self.eff.in_last = in_last;
        self.eff.out_last = out_last;
        self.eff.in_cur = in_cur;
        self.eff.out_cur = out_cur;
        self.eff.drop_cur = drop_cur;
    }

    pub fn set_c_total(&mut self, c: f64) {
        self.c_total = c;
        self.clamp_total();
    }

    /// Mean service time, from the sojourn and wait EWMAs (0 until known).
    pub fn service_estimate_ns(&self) -> f64 {
        (self.eff.sojourn_ewma_ns - self.eff.wait_ewma_ns).max(0.0)
    }

    /// Mean gap between a completion that leaves work queued and the next
    /// start (0 unless `forecast_gap`).
    pub fn gap_estimate_ns(&self) -> f64 {
        if self.config.forecast_gap {
            self.eff.gap_ewma_ns
        } else {
            0.0
        }
    }

    /// The queueing delay a request admitted now should expect: the age of
    /// the oldest queued request (the thesis's signal), or, when the queue
    /// is longer than that age says, the work queued ahead of it.
    pub fn expected_wait(&self, now: Nanos, queue: &QueueView) -> Nanos {
        let per = self.service_estimate_ns() + self.gap_estimate_ns();
        let ahead = queue.len as f64 * per / queue.workers.max(1) as f64;
        queue.delay(now).max(ahead as Nanos)
    }

    /// Whether known demand (wanting clients) takes the pool's spare
    /// credits before any speculation now.
    fn serve_wants_first(&self) -> bool {
        self.want_live > 0 && (self.config.demand_only || self.queue_short)
    }

    /// Run the pool update if its period has passed.
    fn maybe_update(&mut self, now: Nanos, queue: &QueueView) {
        self.queue_short = self.expected_wait(now, queue) < self.config.target_delay_ns / 2;
        let Some(last) = self.last_update else {
            self.last_update = Some(now);
            self.eff.iteration_start = now;
            return;
        };
        match self.config.signal {
            Signal::Delay => {
                if now.saturating_sub(last) >= self.config.rtt_ns {
                    self.delay_step(queue.delay(now));
                    self.last_update = Some(now);
                }
            }
            Signal::Efficiency => {
                let e2e = self.eff.sojourn_ewma_ns + self.config.rtt_ns as f64;
                let period = (4.0 * e2e) as Nanos;
                if now.saturating_sub(self.eff.iteration_start) >= period {
                    self.efficiency_step();
                    self.eff.iteration_start = now;
                    self.last_update = Some(now);
                }
            }
        }
    }

    /// Lazy distribution (Eq. 2.5/2.6) for one client: set its new unused
    /// credits and return its new edge.
    fn grant(&mut self, id: ClientId) -> u64 {
        let total = self.total();
        let c_oc = self.overcommit_per_client();
        let issued = self.claimed();
        let Some(c) = self.clients.get_mut(&id) else {
            return 0;
        };
        let c_x = c.unused();
        let want = c.demand.saturating_add(c_oc);
        let c_new = if issued < total {
            want.min(c_x + (total - issued))
        } else {
            want.min(c_x.saturating_sub(1))
        };
        self.issued = self.issued - c_x + c_new;
        if c_new > 0 && c.want_seq != 0 {
            c.want_seq = 0;
            self.want_live -= 1;
        }
        c.limit = c.received + c_new;
        c.high_water = c.high_water.max(c.limit);
        self.last_grant = Some(GrantRecord {
            client: id,
            demand: c.demand,
            c_oc,
            unused_before: c_x,
            unused_after: c_new,
        });
        c.limit
    }

    /// Drained clients whose known demand waits for an explicit credit now.
    pub fn wanting(&self) -> usize {
        self.want_live
    }

    /// `id` (known, pushable, drained) has `c.demand` > 0 waiting until
    /// `deadline`: queue it for an explicit credit (replacing its entry).
    fn add_want(&mut self, id: ClientId, deadline: Nanos) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        let Some(group) = c.push_group else {
            return;
        };
        if c.want_seq == 0 {
            self.want_live += 1;
        }
        self.want_next += 1;
        c.want_seq = self.want_next;
        self.wanting.push_back(Want {
            client: id,
            seq: self.want_next,
            group,
            deadline,
        });
        // A replaced entry stays behind as a stale one until it reaches the
        // front; a client sending line after line while an older live entry
        // holds the front would grow the queue without bound. Compact it.
        if self.wanting.len() > 2 * self.want_live + 64 {
            let clients = &self.clients;
            self.wanting
                .retain(|w| clients.get(&w.client).is_some_and(|c| c.want_seq == w.seq));
        }
    }

    /// Entries in the want queue, stale ones included (bounded by
    /// 2 × [`Self::wanting`] + 64).
    pub fn want_queue_len(&self) -> usize {
        self.wanting.len()
    }

    fn clear_want(&mut self, id: ClientId) {
        if let Some(c) = self.clients.get_mut(&id) {
            if c.want_seq != 0 {
                c.want_seq = 0;
                self.want_live -= 1;
            }
        }
    }

    /// Whether `w` is its client's current entry.
    fn want_is_live(&self, w: &Want) -> bool {
        self.clients
            .get(&w.client)
            .is_some_and(|c| c.want_seq == w.seq)
    }

    /// Drop stale and timed-out entries from the front (the oldest).
    fn prune_wants(&mut self, now: Nanos) {
        while let Some(&w) = self.wanting.front() {
            let live = self.want_is_live(&w);
            if live && w.deadline > now {
                break;
            }
            self.wanting.pop_front();
            if live {
                self.clear_want(w.client);
            }
        }
        if self.want_live == 0 {
            self.wanting.clear();
        }
    }

    /// Grant explicit credits to drained clients whose demand is known,
    /// newest first (they have the most time left; under overload the
    /// oldest are the ones that can no longer finish in time), those of
    /// `group` first when given, while the pool has spare credits.
    fn push_wanting(
        &mut self,
        now: Nanos,
        group: Option<u64>,
        out: &mut Vec<(ClientId, Feedback)>,
    ) {
        let mut i = self.wanting.len();
        while i > 0 && self.want_live > 0 && self.claimed() < self.total() {
            i -= 1;
            let w = self.wanting[i];
            if group.is_some_and(|g| g != w.group) {
                continue;
            }
            if !self.want_is_live(&w) {
                self.wanting.remove(i);
                continue;
            }
            self.wanting.remove(i);
            self.clear_want(w.client);
            if w.deadline <= now {
                continue;
            }
            let c = &self.clients[&w.client];
            if c.unused() > 0 || c.inflight > 0 || c.parked || c.awaiting || c.demand == 0 {
                continue;
            }
            let limit = self.grant(w.client);
            if self.clients[&w.client].unused() > 0 {
                self.pushed += 1;
                self.demand_pushed += 1;
                out.push((w.client, Feedback::CreditLimit(limit)));
            }
        }
    }

    fn register(&mut self, now: Nanos, id: ClientId) {
        let c = self.clients.entry(id).or_default();
        // A (re-)registration restarts the client's count: drop its unused
        // credits, keep what it has in flight.
        let unused = c.unused();
        c.received = 0;
        c.limit = 0;
        c.high_water = 0;
        c.last_seen = now;
        self.issued -= unused;
    }

    fn return_inflight(&mut self, id: ClientId) {
        if let Some(c) = self.clients.get_mut(&id) {
            if c.inflight > 0 {
                c.inflight -= 1;
                self.issued -= 1;
            }
        }
    }

    /// Forget clients silent for `client_idle` (revoking unused credits).
    /// A pushable client is only revoked, never forgotten: drained, it
    /// waits silently for a push, and once forgotten it would never be
    /// pushed again nor ask (it sends no credit waits while its stream is
    /// up). It leaves when it deregisters.
    fn expire_idle(&mut self, now: Nanos) {
        let idle = self.config.client_idle_ns;
        if now.saturating_sub(self.last_idle_scan) < idle / 4 {
            return;
        }
        self.last_idle_scan = now;
        let mut revoked = 0;
        let mut wants_gone = 0;
        self.clients.retain(|_, c| {
            if now.saturating_sub(c.last_seen) < idle || c.parked || c.awaiting {
                return true;
            }
            revoked += c.unused();
            c.limit = c.received;
            let keep = c.inflight > 0 || c.push_group.is_some();
            if !keep && c.want_seq != 0 {
                wants_gone += 1;
            }
            keep
        });
        self.issued -= revoked;
        self.want_live -= wants_gone;
    }
}

impl Breakwater {
    /// The AQM rule for a request with `remaining` client time, facing
    /// `queue` plus `ahead` more requests.
    fn aqm_check(
        &self,
        now: Nanos,
        remaining: Option<Nanos>,
        queue: &QueueView,
        ahead: usize,
    ) -> Result<(), RejectReason> {
        if !self.config.aqm {
            return Ok(());
        }
        let own = self.config.queue_budget_ns;
        let budget = remaining.map_or(own, |r| {
            own.min(r.saturating_sub(self.service_reserve_ns()))
        });
        let delay = if self.config.aqm_forecast {
            let q = QueueView {
                len: queue.len + ahead,
                ..*queue
            };
            self.expected_wait(now, &q)
        } else {
            queue.delay(now)
        };
        // A client budget the reserve uses up entirely cannot be met even
        // by an idle core: refused, never admitted as a sure late outcome
        // (which would also push the adaptive reserve up for everyone).
        if delay > budget || budget == 0 {
            Err(RejectReason::QueueDelay {
                delay_ns: delay,
                budget_ns: budget,
            })
        } else {
            Ok(())
        }
    }

    /// A request sent without credit ([`Kind::Await`]): admit it on a
    /// credit if one is free and nobody is held ahead of it, else hold it
    /// (or refuse it at once if it could not start in time).
    fn on_await(&mut self, now: Nanos, msg: &Arrival, queue: &QueueView) -> Verdict {
        let id = msg.client;
        let free = self.held.is_empty() && self.issued < self.total();
        let (awaiting, stale) = {
            let c = &self.clients[&id];
            (c.awaiting, c.unused() > 0)
        };
        if awaiting || self.held_rejects.contains(&id) {
            // One held request per client: clients are not trusted.
            return Verdict::Reject(RejectReason::NoCredit);
        }
        if !stale && !free {
            // Hold it, unless the work already queued and held ahead of it
            // would outlast its budget: then refuse now (a fast failure),
            // or, with `hold_expired`, keep it as the client's credit wait.
            let ahead = self.held.len() + 1;
            let full = (self.held.len() + self.expired.len()) as u64 >= self.config.max_held;
            let check = self.aqm_check(now, msg.budget_ns, queue, ahead);
            if full || (check.is_err() && !self.config.hold_expired) {
                self.eff.in_cur += 1;
                self.eff.drop_cur += 1;
                return Verdict::Reject(check.err().unwrap_or(RejectReason::Limit));
            }
            self.clients.get_mut(&id).expect("known").awaiting = true;
            let budget_ns = msg
                .budget_ns
                .unwrap_or(self.config.queue_budget_ns + self.config.service_reserve_ns);
            let held = Held {
                client: id,
                arrived: now,
                budget_ns,
            };
            if check.is_err() {
                self.expired.push_back(held);
            } else {
                self.held.push_back(held);
            }
            return Verdict::Park;
        }
        self.eff.in_cur += 1;
        let c = self.clients.get_mut(&id).expect("known");
        c.inflight += 1;
        if stale {
            // A grant still on its way to the client: spend one of it.
            c.limit -= 1;
        } else {
            self.issued += 1;
        }
        if let Err(reason) = self.aqm_check(now, msg.budget_ns, queue, 0) {
            self.return_inflight(id);
            let room = ((self.held.len() + self.expired.len()) as u64) < self.config.max_held;
            if self.config.hold_expired && room {
                // It cannot start in time: keep it (never run) as the
                // client's credit wait; it is counted when answered.
                self.eff.in_cur -= 1;
                self.clients.get_mut(&id).expect("known").awaiting = true;
                self.expired.push_back(Held {
                    client: id,
                    arrived: now,
                    budget_ns: msg.budget_ns.unwrap_or(0),
                });
                return Verdict::Park;
            }
            self.eff.drop_cur += 1;
            return Verdict::Reject(reason);
        }
        Verdict::Admit
    }

    /// Push spare credits round group `g`'s ring (see `push_credits`).
    fn push_group(&mut self, g: u64, out: &mut Vec<(ClientId, Feedback)>) {
        let Some(mut ring) = self.push_rings.remove(&g) else {
            return;
        };
        let mut visits = ring.len();
        while visits > 0 && self.claimed() < self.total() {
            visits -= 1;
            let Some(id) = ring.pop_front() else {
                break;
            };
            let Some(c) = self.clients.get(&id) else {
                continue; // forgotten (idle, deregistered): leaves the ring
            };
            if c.push_group != Some(g) || (c.signals && self.config.demand_only) {
                // Moved, or pushed only on its known demand: leaves the ring.
                continue;
            }
            ring.push_back(id);
            // Only a drained client (no credit and nothing in flight) is
            // pushed: one with a request in flight gets its credit lazily
            // on that response, and a push racing the response could be
            // revoked by the response's own grant (Eq. 2.6) after the
            // client had applied it.
            if c.unused() > 0 || c.inflight > 0 || c.parked || c.awaiting {
                continue;
            }
            let limit = self.grant(id);
            if self.clients[&id].unused() > 0 {
                self.pushed += 1;
                out.push((id, Feedback::CreditLimit(limit)));
            }
        }
        self.push_rings.insert(g, ring);
    }

    /// Requests currently held for a credit (expired ones included).
    pub fn held(&self) -> usize {
        self.held.len() + self.expired.len()
    }

    /// `hold_expired`: expired held requests kept as credit waits now.
    pub fn held_expired(&self) -> usize {
        self.expired.len()
    }
}

impl Policy for Breakwater {
    fn name(&self) -> &'static str {
        match self.config.signal {
            Signal::Delay => "breakwater",
            Signal::Efficiency => "breakwater-efficiency",
        }
    }

    fn requires_metadata(&self) -> bool {
        true
    }

    fn on_arrival(&mut self, now: Nanos, msg: &Arrival, queue: &QueueView) -> Verdict {
        self.maybe_update(now, queue);
        self.prune_wants(now);
        // Whatever it sends, the message says its demand now.
        self.clear_want(msg.client);
        let cap = self.total();
        match msg.kind {
            Kind::Deregister => {
                if let Some(c) = self.clients.get_mut(&msg.client) {
                    let unused = c.unused();
                    c.limit = c.received;
                    c.push_group = None;
                    self.issued -= unused;
                    if c.parked {
                        c.parked = false;
                        self.parked.retain(|&p| p != msg.client);
                    }
                    if c.awaiting {
                        c.awaiting = false;
                        self.held.retain(|h| h.client != msg.client);
                        self.expired.retain(|h| h.client != msg.client);
                        self.held_rejects.push(msg.client);
                    }
                    if c.inflight == 0 {
                        self.clients.remove(&msg.client);
                    }
                }
                return Verdict::Answer;
            }
            Kind::Register => self.register(now, msg.client),
            Kind::Request | Kind::CreditWait | Kind::Await => {
                if !self.clients.contains_key(&msg.client) {
                    return Verdict::Reject(RejectReason::Unregistered);
                }
            }
        }
        let c = self.clients.get_mut(&msg.client).expect("registered above");
        c.last_seen = now;
        c.demand = u64::from(msg.demand).min(cap);
        match msg.kind {
            Kind::CreditWait => {
                // The client holds no credit (else it would not ask), so any
                // unused credit on our books is stale: grant afresh.
                if c.parked {
                    return Verdict::Park;
                }
                self.grant(msg.client);
                let c = &self.clients[&msg.client];
                if c.unused() > 0 {
                    return Verdict::Answer;
                }
                self.clients.get_mut(&msg.client).expect("known").parked = true;
                self.parked.push_back(msg.client);
                return Verdict::Park;
            }
            Kind::Await => return self.on_await(now, msg, queue),
            Kind::Register => {
                // Count the piggybacked request, then grant it a window.
                // The request needs one credit of that window.
                c.demand = c.demand.saturating_add(1).min(cap.max(1));
                self.grant(msg.client);
                let c = self.clients.get_mut(&msg.client).expect("known");
                c.demand = c.demand.saturating_sub(1);
                if c.unused() == 0 && queue.delay(now) >= self.config.target_delay_ns {
                    // Congested and no credit to give: refuse; the client
                    // layer re-queues the request and asks for credit.
                    c.received += 1;
                    c.limit = c.received;
                    c.high_water = c.high_water.max(c.limit);
                    return Verdict::Reject(RejectReason::NoCredit);
                }
                // Otherwise a newcomer to an uncongested server is admitted,
                // on an overdraft credit if the pool is spent (a cold pool
                // starts at C_min); Eq. 2.6 takes it back on later responses.
            }
            Kind::Request => {
                let c = self.clients.get_mut(&msg.client).expect("known");
                if c.received >= c.high_water {
                    // Count it anyway, so an honest client that lost a race
                    // stays in step with us; it gets nothing for it.
                    c.received += 1;
                    c.limit = c.limit.max(c.received);
                    c.high_water = c.high_water.max(c.limit);
                    return Verdict::Reject(RejectReason::NoCredit);
                }
            }
            Kind::Deregister => unreachable!("answered above"),
        }
        // Spend one credit: unused -> in flight. A credit revoked while the
        // request was on the wire (received >= limit) is honoured as an
        // overdraft and counted as issued again.
        let c = self.clients.get_mut(&msg.client).expect("known");
        if c.received >= c.limit {
            self.issued += 1;
            c.limit = c.received + 1;
            c.high_water = c.high_water.max(c.limit);
        }
        c.received += 1;
        c.inflight += 1;
        self.eff.in_cur += 1;
        if let Err(reason) = self.aqm_check(now, msg.budget_ns, queue, 0) {
            self.return_inflight(msg.client);
            self.eff.drop_cur += 1;
            return Verdict::Reject(reason);
        }
        Verdict::Admit
    }

    fn on_start(&mut self, now: Nanos, queue_wait_ns: Nanos) {
        let w = 1.0 / 16.0;
        self.eff.wait_ewma_ns = (1.0 - w) * self.eff.wait_ewma_ns + w * queue_wait_ns as f64;
        if let Some(from) = self.eff.drain_from.take() {
            let gap = now.saturating_sub(from) as f64;
            self.eff.gap_ewma_ns = (1.0 - w) * self.eff.gap_ewma_ns + w * gap;
        }
    }

    fn on_complete(&mut self, now: Nanos, done: &Completion, queue: &QueueView) -> Feedback {
        self.return_inflight(done.client);
        if done.ok {
            self.eff.out_cur += 1;
        } else {
            self.eff.drop_cur += 1;
        }
        let w = 1.0 / 16.0;
        self.eff.sojourn_ewma_ns = if self.eff.sojourn_ewma_ns == 0.0 {
            done.sojourn_ns as f64
        } else {
            (1.0 - w) * self.eff.sojourn_ewma_ns + w * done.sojourn_ns as f64
        };
        // Work left queued: the next start measures the gap between jobs.
        self.eff.drain_from = (queue.len > 0).then_some(now);
        self.maybe_update(now, queue);
        self.prune_wants(now);
        let fb = self.feedback(now, done.client);
        // A demand-signalling client this response leaves drained with
        // demand piggybacked on its request: it sends no demand line (the
        // server knows), so its demand waits for an explicit credit. The
        // requests queued behind that one arrived later: the queue budget
        // from now bounds their time left.
        if let Some(c) = self.clients.get(&done.client) {
            if c.signals && c.demand > 0 && c.inflight == 0 && c.unused() == 0 {
                let deadline = now.saturating_add(self.config.queue_budget_ns);
                self.add_want(done.client, deadline);
            }
        }
        fb
    }

    fn on_budget_spent(&mut self, _now: Nanos, budget_ns: Nanos, sojourn_ns: Nanos) {
        if !self.config.adaptive_reserve {
            return;
        }
        // Only outcomes the AQM could have met count: a budget below the
        // reserve plus one service is the client's (remote, untrusted)
        // choice, and a stream of hopeless budgets must not drive the
        // reserve, and so every other client's queue budget, to its cap.
        // Above the floor a late outcome is a forecast miss like any
        // honest client's, and the higher the reserve the rarer it gets.
        let floor = self.reserve_ns + self.service_estimate_ns();
        if (budget_ns as f64) <= floor {
            return;
        }
        let late = sojourn_ns.saturating_add(self.config.rtt_ns) > budget_ns;
        let step = self.config.reserve_step_ns as f64;
        let q = self.config.late_target;
        self.budget_outcomes += 1;
        if late {
            self.late_outcomes += 1;
            self.reserve_ns += step;
        } else {
            self.reserve_ns -= step * q / (1.0 - q);
        }
        self.reserve_ns = self
            .reserve_ns
            .clamp(0.0, self.config.max_reserve_ns as f64);
    }

    fn feedback(&mut self, _now: Nanos, client: ClientId) -> Feedback {
        if !self.clients.contains_key(&client) {
            return Feedback::None;
        }
        Feedback::CreditLimit(self.grant(client))
    }

    fn on_tick(&mut self, now: Nanos, queue: &QueueView, explicit: &mut Vec<(ClientId, Feedback)>) {
        self.maybe_update(now, queue);
        self.expire_idle(now);
        while let Some(&id) = self.parked.front() {
            if self.issued >= self.total() {
                break;
            }
            self.parked.pop_front();
            let Some(c) = self.clients.get_mut(&id) else {
                continue;
            };
            c.parked = false;
            let limit = self.grant(id);
            self.explicit_updates += 1;
            explicit.push((id, Feedback::CreditLimit(limit)));
        }
    }

    fn release_parked(
        &mut self,
        now: Nanos,
        queue: &QueueView,
        out: &mut Vec<(ClientId, Release)>,
    ) {
        self.maybe_update(now, queue);
        for id in self.held_rejects.drain(..) {
            out.push((id, Release::Reject(RejectReason::NoCredit)));
        }
        let mut admitted = 0;
        while let Some(&h) = self.held.front() {
            let waited = now.saturating_sub(h.arrived);
            let left = h.budget_ns.saturating_sub(waited);
            let check = if self.config.aqm && left <= self.service_reserve_ns() {
                // Its time ran out while it was held.
                Err(RejectReason::QueueDelay {
                    delay_ns: waited,
                    budget_ns: 0,
                })
            } else {
                self.aqm_check(now, Some(left), queue, admitted)
            };
            if check.is_err() && self.config.hold_expired && self.clients.contains_key(&h.client) {
                // Never run; kept as the client's credit wait (below).
                self.held.pop_front();
                self.expired.push_back(h);
                continue;
            }
            let verdict = match check {
                Err(reason) => Release::Reject(reason),
                Ok(()) if self.issued < self.total() => Release::Admit,
                Ok(()) => break,
            };
            self.held.pop_front();
            let Some(c) = self.clients.get_mut(&h.client) else {
                out.push((h.client, Release::Reject(RejectReason::Unregistered)));
                continue;
            };
            c.awaiting = false;
            self.eff.in_cur += 1;
            if verdict == Release::Admit {
                c.inflight += 1;
                self.issued += 1;
                admitted += 1;
            } else {
                self.eff.drop_cur += 1;
            }
            out.push((h.client, verdict));
        }
        // Expired held requests: answer as many as the pool can give a
        // credit to after the live ones (the answer's feedback grants it,
        // Eq. 2.5 with the request's demand), and those kept `max_hold`.
        let mut spare = self.total().saturating_sub(self.claimed());
        while let Some(&h) = self.expired.front() {
            let overdue = now.saturating_sub(h.arrived) >= self.config.max_hold_ns;
            if spare == 0 && !overdue {
                break;
            }
            self.expired.pop_front();
            let Some(c) = self.clients.get_mut(&h.client) else {
                out.push((h.client, Release::Reject(RejectReason::Unregistered)));
                continue;
            };
            c.awaiting = false;
            c.demand = c.demand.max(1);
            spare = spare.saturating_sub(1);
            self.eff.in_cur += 1;
            self.eff.drop_cur += 1;
            out.push((h.client, Release::Reject(RejectReason::Expired)));
        }
    }

    fn parked_requests(&self) -> usize {
        self.held.len() + self.expired.len() + self.held_rejects.len()
    }

    fn set_pushable(&mut self, client: ClientId, group: u64) {
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        if c.push_group == Some(group) {
            return;
        }
        c.push_group = Some(group);
        if c.signals && self.config.demand_only {
            // Pushed only on its known demand, never round the ring.
            return;
        }
        let ring = self.push_rings.entry(group).or_insert_with(|| {
            self.push_groups.push_back(group);
            VecDeque::new()
        });
        ring.push_back(client);
    }

    fn set_signals_demand(&mut self, client: ClientId) {
        if let Some(c) = self.clients.get_mut(&client) {
            c.signals = true;
        }
    }

    /// A demand line: a drained client (no credit, nothing in flight) has
    /// `demand` requests waiting. Its demand is recorded (clamped to the
    /// pool, like piggybacked demand) and it queues for an explicit credit
    /// until its newest request's budget minus the service reserve runs
    /// out. Ignored from a client that is not pushable or, on our books,
    /// not drained (a credit is on its way, or a response will carry one).
    fn on_demand(&mut self, now: Nanos, client: ClientId, demand: u32, budget_ns: Option<Nanos>) {
        self.demand_lines += 1;
        self.prune_wants(now);
        let cap = self.total();
        let reserve = self.service_reserve_ns();
        // The budget comes from the network: never past our own (a huge
        // one would pin its entry at the front of `wanting` for good).
        let own = self.config.queue_budget_ns + self.config.service_reserve_ns;
        let budget = budget_ns.unwrap_or(own).min(own);
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        if c.push_group.is_none() {
            return;
        }
        c.last_seen = now;
        c.signals = true;
        c.demand = u64::from(demand).min(cap);
        let drained = c.unused() == 0 && c.inflight == 0 && !c.parked && !c.awaiting;
        if c.demand == 0 || !drained {
            self.clear_want(client);
            return;
        }
        let deadline = now.saturating_add(budget.saturating_sub(reserve));
        if deadline > now {
            self.add_want(client, deadline);
        } else {
            self.clear_want(client);
        }
    }

    /// Spare credits (`C_total − C_issued − held`, after the response's
    /// lazy grant) go to drained pushable clients (no credit, nothing in
    /// flight), round their
    /// group's ring, each by Eq. 2.5 (`min(demand + C_oc, C_avail)`: with
    /// the floor of 1 and no known demand, one credit). A client with
    /// unused credit, a parked credit wait (answered by `on_tick`) or a
    /// held request gets nothing here. Never grants past `C_total`.
    fn push_credits(
        &mut self,
        now: Nanos,
        via: Option<ClientId>,
        out: &mut Vec<(ClientId, Feedback)>,
    ) {
        self.prune_wants(now);
        if self.claimed() >= self.total() {
            return;
        }
        // Known demand first while the core is about to idle (or always,
        // `demand_only`), then the rings (speculation).
        let via_group = via.and_then(|v| self.clients.get(&v).and_then(|c| c.push_group));
        if self.serve_wants_first() {
            match via {
                Some(_) => {
                    if let Some(g) = via_group {
                        self.push_wanting(now, Some(g), out);
                    }
                }
                None => self.push_wanting(now, None, out),
            }
        }
        let strict = self.config.demand_only && self.want_live > 0;
        if strict || self.claimed() >= self.total() {
            return;
        }
        match via {
            Some(_) => {
                if let Some(g) = via_group {
                    self.push_group(g, out);
                }
            }
            None => {
                for _ in 0..self.push_groups.len() {
                    if self.claimed() >= self.total() {
                        break;
                    }
                    let Some(g) = self.push_groups.pop_front() else {
                        break;
                    };
                    self.push_groups.push_back(g);
                    self.push_group(g, out);
                }
            }
        }
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            control: self.c_total,
            issued: self.issued,
            clients: self.clients.len(),
            unused: self.clients.values().map(ClientState::unused).sum(),
            held_now: self.held.len() + self.expired.len(),
            wanting_now: self.want_live,
            reserve_ns: self.service_reserve_ns(),
            budget_outcomes: self.budget_outcomes,
            late_outcomes: self.late_outcomes,
        }
    }
}

/// The client half: spend credits, queue when there are none, register on
/// the first request, ask for credit when drained.
#[derive(Debug, Clone, Default)]
pub struct BreakwaterClient {
    registered: bool,
    registering: bool,
    /// Credited requests sent since registration (the server's `received`).
    sent: u64,
    /// Latest edge from the server.
    limit: u64,
    /// Send the oldest queued request as the credit wait ([`Kind::Await`]).
    carry: bool,
}

impl BreakwaterClient {
    pub fn new() -> Self {
        Self::default()
    }

    /// A client whose credit wait carries its oldest queued request.
    pub fn carrying() -> Self {
        BreakwaterClient {
            carry: true,
            ..Self::default()
        }
    }

    /// Credits the client may spend now.
    pub fn available(&self) -> u64 {
        self.limit.saturating_sub(self.sent)
    }
}

impl ClientPolicy for BreakwaterClient {
    fn name(&self) -> &'static str {
        "breakwater"
    }

    fn try_acquire(&mut self, _now: Nanos, _priority: u8) -> Acquire {
        if !self.registered {
            if self.registering {
                return Acquire::Wait;
            }
            self.registering = true;
            self.sent = 1;
            self.limit = 1;
            return Acquire::Send(Kind::Register);
        }
        if self.limit > self.sent {
            self.sent += 1;
            Acquire::Send(Kind::Request)
        } else {
            Acquire::Wait
        }
    }

    fn release(&mut self) {
        self.sent = self.sent.saturating_sub(1);
    }

    fn on_feedback(&mut self, _now: Nanos, feedback: Feedback) {
        if let Feedback::CreditLimit(limit) = feedback {
            if self.registering {
                self.registering = false;
                self.registered = true;
            }
            self.limit = limit;
        }
    }

    /// A push only ever grants (the server pushes to clients it believes
    /// drained), so a pushed edge below the current one is an old push
    /// that a response overtook: keep the higher edge. (The server honours
    /// requests up to the highest edge it ever sent, so this cannot get a
    /// request refused.)
    fn on_pushed(&mut self, now: Nanos, feedback: Feedback) {
        if let Feedback::CreditLimit(limit) = feedback {
            if self.registered && limit > self.limit {
                self.on_feedback(now, feedback);
            }
        }
    }

    fn needs_credit_wait(&self, inflight: usize) -> bool {
        self.registered && inflight == 0 && self.available() == 0
    }

    fn carries_requests(&self) -> bool {
        self.carry
    }

    fn reset(&mut self) {
        *self = BreakwaterClient {
            carry: self.carry,
            ..BreakwaterClient::default()
        };
    }
}
