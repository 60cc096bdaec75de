//! Invariants of the policy core: credit conservation, the bounds on the
//! pool, per-client unused ≤ demand + C_oc, the AIMD steps, Algorithm 1's
//! branch table, the AQM drop rule, lying demand, clock skew and
//! construction-time rejection of bad configuration. Randomised tests run
//! many seeded event sequences through the real policy.

use breakwater::control::{ControlKind, ControlSpec};
use breakwater::policy::breakwater::{
    Breakwater, BreakwaterClient, BreakwaterConfig, EfficiencyBranch, Signal,
};
use breakwater::policy::dagor::{Dagor, DagorClient, DagorConfig};
use breakwater::policy::gradient::{Gradient, GradientConfig};
use breakwater::policy::seda::{SedaClient, SedaConfig};
use breakwater::rng::SplitMix64;
use breakwater::{
    Acquire, Arrival, ClientPolicy, Completion, Feedback, Kind, Policy, QueueView, RejectReason,
    Release, Verdict,
};

const SLO: u64 = 1_000_000; // 1 ms

fn bw() -> Breakwater {
    Breakwater::new(BreakwaterConfig::for_slo(SLO, 4)).unwrap()
}

fn msg(client: u64, kind: Kind, demand: u32) -> Arrival {
    Arrival {
        client,
        kind,
        demand,
        budget_ns: None,
        priority: 1,
    }
}

fn empty() -> QueueView {
    QueueView {
        workers: 4,
        ..QueueView::default()
    }
}

fn queue_with_delay(now: u64, delay: u64) -> QueueView {
    QueueView {
        oldest_enqueue: Some(now - delay),
        len: 1,
        busy: 4,
        workers: 4,
    }
}

/// Check every structural invariant of the pool.
fn check(p: &Breakwater, clients: &[u64]) {
    assert_eq!(p.issued(), p.issued_recount(), "credit conservation");
    let c = p.c_total();
    let cfg = p.config();
    let n_c = (p.clients() as u64).max(1);
    assert!(c >= cfg.min_credits as f64, "C_total {c} below C_min");
    let c_max = (cfg.max_credits_per_client * n_c).max(cfg.min_credits) as f64;
    assert!(c <= c_max + 1e-9, "C_total {c} above C_max {c_max}");
    for &x in clients {
        if let Some(u) = p.unused(x) {
            assert!(
                u <= c.floor() as u64 + p.issued(),
                "unused {u} of client {x} absurd"
            );
        }
    }
}

/// A response to client `x` must leave it at most demand + C_oc unused.
fn grant_and_check(p: &mut Breakwater, now: u64, x: u64) -> Feedback {
    let fb = p.feedback(now, x);
    if p.unused(x).is_some() {
        let g = p.last_grant().expect("a grant was made");
        assert_eq!(g.client, x);
        assert!(g.unused_after <= g.demand + g.c_oc, "client {x}: {g:?}");
        assert_eq!(p.unused(x), Some(g.unused_after));
    }
    fb
}

#[test]
fn random_event_sequences_conserve_credits_and_respect_bounds() {
    for seed in 0..200u64 {
        let mut rng = SplitMix64::new(seed);
        let mut cfg = BreakwaterConfig::for_slo(SLO, 1 + rng.below(8));
        cfg.overcommit = rng.below(4) != 0;
        cfg.aqm = rng.below(4) != 0;
        cfg.client_idle_ns = 5_000_000;
        cfg.overcommit_floor = rng.below(2);
        cfg.max_held = 1 + rng.below(4);
        cfg.hold_expired = rng.below(3) == 0;
        cfg.max_hold_ns = 1 + rng.below(4 * SLO);
        cfg.demand_only = rng.below(2) == 0;
        cfg.adaptive_reserve = rng.below(2) == 0;
        cfg.forecast_gap = rng.below(2) == 0;
        let demand_only = cfg.demand_only;
        let mut p = Breakwater::new(cfg).unwrap();
        let ids: Vec<u64> = (0..1 + rng.below(40)).collect();
        // Requests admitted and not yet completed, by client.
        let mut running: Vec<u64> = Vec::new();
        // Clients with a request held for a credit.
        let mut held: Vec<u64> = Vec::new();
        let mut releases = Vec::new();
        // Clients that signal demand (demand lines).
        let mut signals = std::collections::HashSet::new();
        let mut now = 1_000u64;
        for _ in 0..3000 {
            now += rng.below(50_000);
            let x = ids[rng.below(ids.len() as u64) as usize];
            let delay = if rng.below(3) == 0 {
                rng.below(2 * SLO)
            } else {
                0
            };
            let q = if delay > 0 && delay < now {
                queue_with_delay(now, delay)
            } else {
                empty()
            };
            let demand = match rng.below(10) {
                0 => u32::MAX, // a liar
                d => d as u32,
            };
            match rng.below(10) {
                0 => {
                    p.on_arrival(now, &msg(x, Kind::Register, demand), &q);
                    if rng.below(2) == 0 {
                        if rng.below(2) == 0 {
                            p.set_signals_demand(x);
                            signals.insert(x);
                        }
                        p.set_pushable(x, x % 3);
                    }
                }
                1..=4 => {
                    let mut m = msg(x, Kind::Request, demand);
                    if rng.below(5) == 0 {
                        m.budget_ns = Some(rng.below(SLO));
                    }
                    if p.on_arrival(now, &m, &q) == Verdict::Admit {
                        running.push(x);
                    } else {
                        grant_and_check(&mut p, now, x);
                    }
                }
                5 | 6 if !running.is_empty() => {
                    let i = rng.below(running.len() as u64) as usize;
                    let y = running.swap_remove(i);
                    let done = Completion {
                        client: y,
                        ok: rng.below(10) != 0,
                        sojourn_ns: rng.below(SLO),
                    };
                    p.on_complete(now, &done, &q);
                    // The adaptive reserve stays within its bounds.
                    p.on_budget_spent(now, rng.below(2 * SLO), done.sojourn_ns);
                    assert!(p.service_reserve_ns() <= p.config().max_reserve_ns);
                    if !p.config().adaptive_reserve {
                        assert_eq!(p.service_reserve_ns(), p.config().service_reserve_ns);
                    }
                    if let Some(g) = p.last_grant().filter(|g| g.client == y) {
                        assert!(g.unused_after <= g.demand + g.c_oc, "{g:?}");
                        assert_eq!(p.unused(y), Some(g.unused_after));
                    }
                }
                7 if rng.below(2) == 0 => {
                    p.on_arrival(now, &msg(x, Kind::CreditWait, demand.max(1)), &q);
                }
                7 => {
                    let mut m = msg(x, Kind::Await, demand);
                    m.budget_ns = Some(rng.below(2 * SLO));
                    match p.on_arrival(now, &m, &q) {
                        Verdict::Admit => running.push(x),
                        Verdict::Park => {
                            assert!(!held.contains(&x), "two held requests of client {x}");
                            held.push(x);
                        }
                        _ => {}
                    }
                    assert!(p.held() as u64 <= p.config().max_held, "held past max_held");
                }
                8 if rng.below(3) == 0 => {
                    // Explicit credits: clients of group x % 3 are pushable
                    // (set on registration, below); pushes go only to
                    // drained ones, and only from the spare pool.
                    let before: Vec<Option<u64>> = ids.iter().map(|&y| p.unused(y)).collect();
                    let via = (rng.below(2) == 0).then_some(x);
                    let mut out = Vec::new();
                    p.push_credits(now, via, &mut out);
                    for &(y, fb) in &out {
                        assert!(matches!(fb, Feedback::CreditLimit(_)));
                        assert_eq!(
                            before[y as usize],
                            Some(0),
                            "pushed to a client with credit"
                        );
                        assert!(p.unused(y).unwrap() >= 1);
                        if let Some(v) = via {
                            assert_eq!(y % 3, v % 3, "pushed outside the responder's group");
                        }
                        if demand_only && signals.contains(&y) {
                            assert!(
                                p.demand(y).unwrap() > 0,
                                "pushed to client {y}, which signals demand, without any"
                            );
                        }
                        let g = p.last_grant().unwrap();
                        assert!(g.unused_after <= g.demand + g.c_oc, "{g:?}");
                    }
                    if !out.is_empty() {
                        assert!(p.issued() <= p.c_total() as u64, "a push overdrew the pool");
                    }
                }
                8 => {
                    let mut out = Vec::new();
                    p.on_tick(now, &q, &mut out);
                    for (_, fb) in out {
                        assert!(matches!(fb, Feedback::CreditLimit(_)));
                    }
                    p.release_parked(now, &q, &mut releases);
                    for (y, what) in releases.drain(..) {
                        let i = held
                            .iter()
                            .position(|&h| h == y)
                            .expect("released a held one");
                        held.swap_remove(i);
                        if what == Release::Admit {
                            running.push(y);
                            assert!(
                                p.issued() <= p.c_total() as u64,
                                "a release overdrew the pool"
                            );
                        }
                    }
                }
                9 if rng.below(2) == 0 => {
                    // A demand line (a liar's too), with any budget.
                    p.on_demand(now, x, demand, Some(rng.below(2 * SLO)));
                }
                _ => {
                    if rng.below(20) == 0 {
                        p.on_arrival(now, &msg(x, Kind::Deregister, 0), &q);
                    }
                }
            }
            assert!(p.wanting() <= p.clients(), "more wants than clients");
            check(&p, &ids);
        }
    }
}

/// A pushable client that stays silent past `client_idle` (drained, waiting
/// for a push) loses its unused credits but is not forgotten: a later
/// spare credit is still pushed to it.
#[test]
fn idle_pushable_clients_are_revoked_not_forgotten() {
    let mut p = bw();
    let q = empty();
    let now = 1_000;
    for x in [1, 2] {
        p.on_arrival(now, &msg(x, Kind::Register, 0), &q);
        let done = Completion {
            client: x,
            ok: true,
            sojourn_ns: 0,
        };
        p.on_complete(now, &done, &q); // nothing in flight
    }
    p.set_pushable(1, 7); // 2: no stream
    let later = now + 2 * BreakwaterConfig::for_slo(SLO, 4).client_idle_ns;
    let mut out = Vec::new();
    p.on_tick(later, &q, &mut out);
    assert_eq!(p.unused(1), Some(0), "revoked");
    assert_eq!(p.unused(2), None, "a client without a stream is forgotten");
    out.clear();
    p.set_c_total(p.issued() as f64 + 1.0);
    p.push_credits(later, None, &mut out);
    let got: Vec<u64> = out.iter().map(|&(x, _)| x).collect();
    assert_eq!(got, vec![1], "still pushed to");
}

#[test]
fn explicit_credits_are_pushed_to_drained_clients_round_each_group() {
    let mut p = bw();
    let q = empty();
    let now = 1_000;
    // Client 100 (no stream) keeps requests in flight throughout, so the
    // pool can be bound below while the others complete.
    p.set_c_total(50.0);
    let mut hog = u64::from(p.on_arrival(now, &msg(100, Kind::Register, 10), &q) == Verdict::Admit);
    while p.unused(100).unwrap() > 0 {
        p.on_arrival(now, &msg(100, Kind::Request, 10), &q);
        hog += 1;
    }
    assert!(hog >= 5, "client 100 holds {hog} in flight");
    let mut sent = Vec::new();
    for x in [1, 2, 3, 4, 9] {
        if p.on_arrival(now, &msg(x, Kind::Register, 0), &q) == Verdict::Admit {
            sent.push(x);
        }
        // Spend whatever the registration granted: no credit, in flight.
        while p.unused(x).unwrap() > 0 {
            assert_eq!(
                p.on_arrival(now, &msg(x, Kind::Request, 0), &q),
                Verdict::Admit
            );
            sent.push(x);
        }
        if x != 9 {
            p.set_pushable(x, if x <= 2 { 7 } else { 8 }); // 9: no stream
        }
    }
    let mut out = Vec::new();
    p.set_c_total(p.issued() as f64 + 3.0);
    p.push_credits(now, Some(1), &mut out);
    assert!(
        out.is_empty(),
        "spare credit, but every client has a request in flight (its \
         response carries its credit): nothing pushed, got {out:?}"
    );
    // Complete them in a bound pool: each response revokes (Eq. 2.6), so
    // the clients end drained (no credit, nothing in flight).
    p.set_c_total(0.0); // clamped to C_min (4), below client 100's share

    for &x in &sent {
        let done = Completion {
            client: x,
            ok: true,
            sojourn_ns: 10,
        };
        p.on_complete(now, &done, &q);
        assert_eq!(p.unused(x), Some(0), "client {x} revoked");
    }
    p.push_credits(now, Some(1), &mut out);
    assert!(out.is_empty(), "no spare credit: nothing to push");
    p.set_c_total(p.issued() as f64 + 3.0);
    p.push_credits(now, Some(1), &mut out);
    let got: Vec<u64> = out.iter().map(|&(x, _)| x).collect();
    assert_eq!(
        got,
        vec![1, 2],
        "only the responder's group, round its ring"
    );
    for &(x, fb) in &out {
        assert_eq!(p.unused(x), Some(1), "Eq. 2.5: demand 0 + C_oc 1");
        assert!(matches!(fb, Feedback::CreditLimit(_)));
    }
    out.clear();
    p.push_credits(now, Some(2), &mut out);
    assert!(out.is_empty(), "group 7 holds its credits now");
    p.push_credits(now, None, &mut out);
    assert_eq!(out.len(), 1, "the last spare credit");
    assert_eq!(out[0].0, 3, "group 8's first");
    assert_eq!(p.issued(), p.c_total() as u64);
    out.clear();
    p.push_credits(now, None, &mut out);
    assert!(out.is_empty(), "the pool is spent");
    p.set_c_total(p.issued() as f64 + 1.0);
    p.push_credits(now, None, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, 4, "group 8's ring moved on");
    assert_eq!(
        p.unused(9),
        Some(0),
        "never pushed to a client without a stream"
    );
    // The client half keeps the higher edge: a push overtaken by a
    // response is stale.
    let mut c = BreakwaterClient::new();
    assert_eq!(c.try_acquire(0, 1), Acquire::Send(Kind::Register));
    c.on_feedback(0, Feedback::CreditLimit(5));
    c.on_pushed(0, Feedback::CreditLimit(3));
    assert_eq!(c.available(), 4);
    c.on_pushed(0, Feedback::CreditLimit(7));
    assert_eq!(c.available(), 6);
}

/// Drained pushable clients 1..=4 that signal demand (1, 2 on connection
/// 7; 3, 4 on 8), none wanting yet, and client 100 (no stream) holding
/// requests in flight so the pool can be bound.
fn drained_signalling_clients(demand_only: bool) -> Breakwater {
    let mut cfg = BreakwaterConfig::for_slo(SLO, 4);
    cfg.demand_only = demand_only;
    let mut p = Breakwater::new(cfg).unwrap();
    let q = empty();
    let now = 1_000;
    // Client 100 (no stream) keeps requests in flight, binding the pool.
    p.set_c_total(50.0);
    p.on_arrival(now, &msg(100, Kind::Register, 10), &q);
    while p.unused(100).unwrap() > 0 {
        p.on_arrival(now, &msg(100, Kind::Request, 10), &q);
    }
    let mut sent = Vec::new();
    for x in [1, 2, 3, 4] {
        if p.on_arrival(now, &msg(x, Kind::Register, 0), &q) == Verdict::Admit {
            sent.push(x);
        }
        while p.unused(x).unwrap() > 0 {
            p.on_arrival(now, &msg(x, Kind::Request, 0), &q);
            sent.push(x);
        }
        p.set_signals_demand(x);
        p.set_pushable(x, if x <= 2 { 7 } else { 8 });
    }
    p.set_c_total(0.0); // C_min: every response revokes
    for &x in &sent {
        let done = Completion {
            client: x,
            ok: true,
            sojourn_ns: 10,
        };
        p.on_complete(now, &done, &q);
    }
    for x in [1, 2, 3, 4] {
        assert_eq!(p.unused(x), Some(0), "client {x} drained");
    }
    p
}

/// Demand lines are hostile input: a budget past the server's own is cut
/// to it, and a client streaming lines while an older entry holds the
/// front of the want queue cannot grow that queue without bound.
#[test]
fn demand_lines_cannot_pin_or_grow_the_want_queue() {
    let mut p = drained_signalling_clients(false);
    let now = 1_000;
    p.set_c_total(p.issued() as f64); // the pool is spent: nothing is granted
    p.on_demand(now, 3, 1, Some(u64::MAX));
    for i in 0..100_000u64 {
        p.on_demand(now + 1 + i / 1000, 4, 1, Some(SLO));
        assert!(
            p.want_queue_len() <= 2 * p.wanting() + 64,
            "line {i}: {} entries for {} live wants",
            p.want_queue_len(),
            p.wanting()
        );
    }
    assert_eq!(p.wanting(), 2);
    // Client 3's want lapses with the server's own budget, not its claim.
    let late = now + SLO + 1;
    p.on_demand(late, 4, 1, Some(SLO));
    assert_eq!(
        p.wanting(),
        1,
        "client 3's want outlived the server's budget"
    );
}

/// Demand lines, strict (`demand_only`, session 10's first try): a
/// pushable client that signals its demand is pushed an explicit credit
/// only while its demand is known and waiting: never speculatively round
/// the ring, newest demand first (the responder's connection first when a
/// response is leaving), no speculation (C_oc = 0) while known demand
/// waits, and a want lapses when its budget minus the service reserve
/// runs out.
#[test]
fn demand_only_pushes_go_only_to_clients_with_known_demand_newest_first() {
    let mut p = drained_signalling_clients(true);
    let q = empty();
    let now = 1_000;
    let reserve = p.config().service_reserve_ns;
    // Spare credits, but no drained client has said it wants one.
    p.set_c_total(p.issued() as f64 + 2.0);
    let mut out = Vec::new();
    p.push_credits(now, Some(1), &mut out);
    p.push_credits(now, None, &mut out);
    assert!(
        out.is_empty(),
        "no speculative push to clients that signal demand: {out:?}"
    );
    assert!(
        p.overcommit_per_client() >= 1,
        "Eq. 2.4's floor while nobody waits"
    );
    // Demand lines: 3 (oldest), then 4, both of connection 8, then 1 (7).
    p.on_demand(now, 3, 1, Some(SLO));
    p.on_demand(now + 10, 4, 1, Some(SLO));
    p.on_demand(now + 20, 1, 1, Some(SLO));
    assert_eq!(p.wanting(), 3);
    assert_eq!(
        p.overcommit_per_client(),
        0,
        "no speculation while demand waits"
    );
    // A response to client 2 is leaving: its connection's wanting client
    // first (the credit rides on that response), and only it.
    p.push_credits(now + 30, Some(2), &mut out);
    let got: Vec<u64> = out.iter().map(|&(x, _)| x).collect();
    assert_eq!(got, vec![1], "connection 7's wanting client");
    assert_eq!(p.unused(1), Some(1), "its demand, no speculative extra");
    out.clear();
    // The last spare credit: the newest demand of the rest.
    p.push_credits(now + 30, None, &mut out);
    let got: Vec<u64> = out.iter().map(|&(x, _)| x).collect();
    assert_eq!(got, vec![4], "newest first");
    assert_eq!(p.unused(3), Some(0));
    assert_eq!(p.wanting(), 1);
    assert_eq!(p.issued(), p.c_total() as u64, "never past C_total");
    // Client 3's want lapses when its budget minus the reserve runs out.
    let late = now + SLO - reserve;
    out.clear();
    p.set_c_total(p.issued() as f64 + 1.0);
    p.push_credits(late, None, &mut out);
    assert!(out.is_empty(), "a lapsed want gets nothing: {out:?}");
    assert_eq!(p.wanting(), 0);
    // A line from a client holding credit (one is on its way) is ignored.
    p.on_demand(late, 4, 2, Some(SLO));
    assert_eq!(p.wanting(), 0);
    // Demand piggybacked on a request whose response leaves the client
    // drained makes it wanting without a line.
    assert_eq!(
        p.on_arrival(late, &msg(4, Kind::Request, 1), &q),
        Verdict::Admit
    );
    p.set_c_total(0.0);
    let done = Completion {
        client: 4,
        ok: true,
        sojourn_ns: 10,
    };
    p.on_complete(late, &done, &q);
    assert_eq!(p.unused(4), Some(0));
    assert_eq!(p.wanting(), 1, "known demand 1, drained");
    p.set_c_total(p.issued() as f64 + 1.0);
    out.clear();
    p.push_credits(late, None, &mut out);
    assert_eq!(out.iter().map(|&(x, _)| x).collect::<Vec<_>>(), vec![4]);
    // A client without a stream is never made wanting.
    p.on_demand(late, 100, 5, Some(SLO));
    assert_eq!(p.wanting(), 0);
}

/// Demand lines, the default: known demand goes first only while the
/// queue is short (the forecast wait under half of d_t: the core is about
/// to idle), newest first and with no speculation then; with a long queue
/// the wanting clients wait and the spare credits go round the ring as
/// without demand lines (clients that signal demand included).
#[test]
fn known_demand_goes_first_while_the_queue_is_short() {
    let mut p = drained_signalling_clients(false);
    // Later than the setup by more than the queue delays used below.
    let now = 2 * SLO;
    let mut ex = Vec::new();
    let mut out = Vec::new();
    p.on_demand(now, 3, 1, Some(SLO));
    p.on_demand(now + 10, 4, 1, Some(SLO));
    assert_eq!(p.wanting(), 2);
    // A long queue (half the SLO old, d_t is 40% of it).
    let t = now + 20;
    p.on_tick(t, &queue_with_delay(t, SLO / 2), &mut ex);
    p.set_c_total(p.issued() as f64 + 1.0);
    assert!(p.overcommit_per_client() >= 1, "speculation goes on");
    p.push_credits(t, None, &mut out);
    let got: Vec<u64> = out.iter().map(|&(x, _)| x).collect();
    assert_eq!(
        got,
        vec![1],
        "round connection 7's ring, as without demand lines"
    );
    assert_eq!(p.wanting(), 2, "the wanting clients wait");
    // The queue is short again: the newest known demand first.
    let t = now + 30;
    p.on_tick(t, &empty(), &mut ex);
    p.set_c_total(p.issued() as f64 + 1.0);
    assert_eq!(
        p.overcommit_per_client(),
        0,
        "no speculation while demand waits"
    );
    out.clear();
    p.push_credits(t, None, &mut out);
    let got: Vec<u64> = out.iter().map(|&(x, _)| x).collect();
    assert_eq!(got, vec![4], "newest known demand first");
    assert_eq!(p.unused(4), Some(1));
    assert_eq!(p.wanting(), 1);
    // With a response leaving on connection 7, its wanting client first.
    p.on_demand(t + 10, 2, 1, Some(SLO));
    p.set_c_total(p.issued() as f64 + 1.0);
    out.clear();
    p.push_credits(t + 10, Some(1), &mut out);
    let got: Vec<u64> = out.iter().map(|&(x, _)| x).collect();
    assert_eq!(got, vec![2]);
    assert_eq!(p.wanting(), 1, "client 3 still waits");
    assert!(p.issued() <= p.c_total() as u64);
}

#[test]
fn grants_never_push_issued_past_c_total() {
    // Eq. 2.5 gives at most C_avail; Eq. 2.6 only takes back.
    let mut p = bw();
    let q = empty();
    for x in 0..50 {
        p.on_arrival(10, &msg(x, Kind::Register, 3), &q);
    }
    p.set_c_total(30.0);
    let before_total = p.c_total() as u64;
    for round in 0..5 {
        for x in 0..50 {
            let issued_before = p.issued();
            grant_and_check(&mut p, 20 + round, x);
            assert!(
                p.issued() <= before_total.max(issued_before),
                "{} > {}",
                p.issued(),
                before_total
            );
        }
    }
}

#[test]
fn equations_2_5_and_2_6() {
    let mut p = bw(); // C_total starts at C_min = 4
    let q = empty();
    // Registration with demand 2 (plus the piggybacked request): n_c = 1,
    // C_oc = (4 - 0)/1 = 4, c_new = min(3 + 4, 0 + 4) = 4; one is spent.
    assert_eq!(
        p.on_arrival(0, &msg(1, Kind::Register, 2), &q),
        Verdict::Admit
    );
    assert_eq!(p.unused(1), Some(3));
    assert_eq!(p.issued(), 4);
    // C_issued = C_total now: a response revokes one (Eq. 2.6, c_x − 1).
    let fb = p.on_complete(
        1,
        &Completion {
            client: 1,
            ok: true,
            sojourn_ns: 1,
        },
        &q,
    );
    // The completion returned its credit (issued 3 < 4): Eq. 2.5 again,
    // c_new = min(demand 2 + C_oc 1, 3 + 1) = 3.
    assert_eq!(p.unused(1), Some(3));
    assert_eq!(fb, Feedback::CreditLimit(1 + 3));
    // Shrink the pool below what is issued: the next response revokes.
    p.set_c_total(1.0);
    assert_eq!(p.c_total(), 4.0, "clamped to C_min");
}

#[test]
fn revocation_when_over_pool() {
    let mut cfg = BreakwaterConfig::for_slo(SLO, 1);
    cfg.rtt_ns = 1;
    let mut p = Breakwater::new(cfg).unwrap();
    let q = empty();
    for x in 0..3 {
        p.on_arrival(0, &msg(x, Kind::Register, 10), &q);
    }
    p.set_c_total(64.0);
    for x in 0..3 {
        p.feedback(1, x);
    }
    let issued = p.issued();
    assert!(issued > 1);
    // Congestion halves the pool (d_m far above d_t); a response to a
    // client with unused credits then takes one back (Eq. 2.6).
    p.set_c_total(1.0);
    let u0 = p.unused(0).unwrap();
    assert!(u0 > 0);
    p.feedback(2, 0);
    // Eq. 2.6: c_new = min(demand + C_oc, c_x − 1), here demand 0, C_oc 1.
    let g = p.last_grant().unwrap();
    assert_eq!((g.demand, g.c_oc), (0, 1));
    assert_eq!(p.unused(0), Some(1.min(u0 - 1)));
    assert_eq!(p.issued(), issued - (u0 - 1));
}

#[test]
fn aimd_steps_follow_equations_2_1_to_2_3() {
    let mut p = bw();
    let q = empty();
    for x in 0..2000 {
        p.on_arrival(0, &msg(x, Kind::Register, 0), &q);
    }
    p.set_c_total(1000.0);
    // Below target: += max(α·n_c, 1) = max(0.001·2000, 1) = 2.
    p.delay_step(0);
    assert_eq!(p.c_total(), 1002.0);
    // Above target: *= max(1 − β·(d_m − d_t)/d_t, 0.5); d_t = 400 µs.
    p.delay_step(600_000); // excess 0.5 → × 0.99
    assert!((p.c_total() - 1002.0 * 0.99).abs() < 1e-9);
    let before = p.c_total();
    p.delay_step(100_000_000); // huge excess → floor of × 0.5
    assert!((p.c_total() - before * 0.5).abs() < 1e-9);
    for _ in 0..100 {
        p.delay_step(100_000_000);
    }
    assert_eq!(p.c_total(), 4.0, "C_min = cores");
    // With one client, the ceiling is C_max = 64 · n_c ... with 2000 it is
    // 128000; the additive step is 1 for small n_c.
    let mut small = bw();
    small.on_arrival(0, &msg(7, Kind::Register, 0), &q);
    for _ in 0..1000 {
        small.delay_step(0);
    }
    assert_eq!(small.c_total(), 64.0);
}

#[test]
fn pool_updates_once_per_rtt() {
    let mut p = bw(); // rtt 100 µs
    let q = empty();
    p.on_arrival(0, &msg(1, Kind::Register, 0), &q);
    let c0 = p.c_total();
    p.on_arrival(50_000, &msg(1, Kind::Request, 0), &q);
    assert_eq!(p.c_total(), c0, "no update within one RTT");
    p.on_arrival(100_000, &msg(1, Kind::Request, 0), &q);
    assert_eq!(p.c_total(), c0 + 1.0);
}

#[test]
fn efficiency_branch_table() {
    // (in_last, out_last, in_cur, out_cur, drop_cur) -> branch, C up?
    let cases = [
        ((100, 90, 120, 110, 0), EfficiencyBranch::Efficient, true),
        ((100, 90, 120, 91, 0), EfficiencyBranch::Inefficient, false), // Δout 1 <= 0.1·20
        ((100, 90, 120, 92, 0), EfficiencyBranch::Inefficient, false), // Δout 2 == t_e·Δin: not >
        ((100, 90, 120, 93, 0), EfficiencyBranch::Efficient, true),
        ((120, 110, 100, 90, 0), EfficiencyBranch::Efficient, true), // both fell
        (
            (100, 90, 120, 80, 0),
            EfficiencyBranch::NoCorrelation,
            false,
        ),
        (
            (100, 90, 100, 95, 0),
            EfficiencyBranch::NoCorrelation,
            false,
        ), // Δin = 0
        ((100, 90, 120, 110, 121), EfficiencyBranch::DropCap, false), // drops > t_d·in
        ((100, 90, 120, 110, 120), EfficiencyBranch::Efficient, true), // == t_d·in: not >
    ];
    for ((il, ol, ic, oc, dc), branch, up) in cases {
        let mut cfg = BreakwaterConfig::for_slo(SLO, 4);
        cfg.signal = Signal::Efficiency;
        let mut p = Breakwater::new(cfg).unwrap();
        p.set_c_total(50.0);
        p.set_efficiency_counts(il, ol, ic, oc, dc);
        assert_eq!(p.efficiency_step(), branch, "{:?}", (il, ol, ic, oc, dc));
        if up {
            assert_eq!(p.c_total(), 51.0);
        } else {
            assert!((p.c_total() - 50.0 * 0.98).abs() < 1e-9);
        }
    }
}

#[test]
fn aqm_drops_exactly_when_queue_delay_exceeds_budget() {
    let mut cfg = BreakwaterConfig::for_slo(SLO, 4);
    cfg.queue_budget_ns = SLO / 2; // 500 µs
    cfg.service_reserve_ns = SLO / 2;
    let mut p = Breakwater::new(cfg).unwrap();
    let now = 10_000_000;
    p.on_arrival(0, &msg(1, Kind::Register, 50), &empty());
    p.set_c_total(64.0);
    p.feedback(1, 1);
    let at_budget = queue_with_delay(now, 500_000);
    assert_eq!(
        p.on_arrival(now, &msg(1, Kind::Request, 5), &at_budget),
        Verdict::Admit
    );
    let issued = p.issued();
    let unused = p.unused(1).unwrap();
    let over = queue_with_delay(now, 500_001);
    match p.on_arrival(now, &msg(1, Kind::Request, 5), &over) {
        Verdict::Reject(RejectReason::QueueDelay {
            delay_ns,
            budget_ns,
        }) => {
            assert_eq!((delay_ns, budget_ns), (500_001, 500_000));
        }
        v => panic!("expected an AQM drop, got {v:?}"),
    }
    // The credit was spent on arrival and returned by the drop: the pool
    // has one fewer outstanding, and the books still balance.
    assert_eq!(p.unused(1), Some(unused - 1));
    assert_eq!(p.issued(), issued - 1);
    assert_eq!(p.issued(), p.issued_recount());
    // A client's own smaller remaining time tightens the rule: it keeps
    // the service reserve (500 µs here) for after the queue.
    let mut m = msg(1, Kind::Request, 5);
    m.budget_ns = Some(600_000);
    assert_eq!(
        p.on_arrival(now, &m, &queue_with_delay(now, 100_001)),
        Verdict::Reject(RejectReason::QueueDelay {
            delay_ns: 100_001,
            budget_ns: 100_000
        })
    );
    assert_eq!(
        p.on_arrival(now, &m, &queue_with_delay(now, 100_000)),
        Verdict::Admit
    );
    m.budget_ns = Some(400_000); // less than the reserve: only an empty queue
    assert!(matches!(
        p.on_arrival(now, &m, &queue_with_delay(now, 1)),
        Verdict::Reject(RejectReason::QueueDelay { .. })
    ));
    // ...but cannot loosen it.
    m.budget_ns = Some(10 * SLO);
    assert!(matches!(
        p.on_arrival(now, &m, &queue_with_delay(now, 600_000)),
        Verdict::Reject(RejectReason::QueueDelay { .. })
    ));
    // Without AQM nothing is dropped for delay.
    let mut cfg = BreakwaterConfig::for_slo(SLO, 4);
    cfg.aqm = false;
    let mut p = Breakwater::new(cfg).unwrap();
    p.on_arrival(0, &msg(1, Kind::Register, 5), &empty());
    p.feedback(1, 1);
    assert_eq!(
        p.on_arrival(
            now,
            &msg(1, Kind::Request, 5),
            &queue_with_delay(now, 9 * SLO)
        ),
        Verdict::Admit
    );
}

#[test]
fn aqm_budget_defaults_to_slo_minus_service_reserve() {
    let c = BreakwaterConfig::for_slo(SLO, 4);
    assert_eq!(c.service_reserve_ns, SLO * 3 / 10);
    assert_eq!(c.queue_budget_ns + c.service_reserve_ns, SLO);
    assert!(c.aqm_forecast);
}

/// Client 1 registered (with `demand`) on one idle worker, the pool set
/// to `c_total` credits, and its first credit grant taken; returns the
/// idle one-worker queue.
fn registered(p: &mut Breakwater, demand: u32, c_total: f64) -> QueueView {
    let q = QueueView {
        workers: 1,
        ..QueueView::default()
    };
    p.on_arrival(0, &msg(1, Kind::Register, demand), &q);
    p.set_c_total(c_total);
    p.feedback(1, 1);
    q
}

/// Register client 1 with plenty of credit and teach the policy a mean
/// service time of `svc` (sojourn − wait EWMAs) through completions.
fn warmed(forecast: bool, svc: u64) -> Breakwater {
    let mut cfg = BreakwaterConfig::for_slo(SLO, 1);
    cfg.aqm_forecast = forecast;
    let mut p = Breakwater::new(cfg).unwrap();
    let q = registered(&mut p, 200, 1000.0);
    for i in 0..200 {
        assert_eq!(
            p.on_arrival(i, &msg(1, Kind::Request, 100), &q),
            Verdict::Admit
        );
        p.on_start(i, 0);
        p.on_complete(
            i,
            &Completion {
                client: 1,
                ok: true,
                sojourn_ns: svc,
            },
            &q,
        );
    }
    p
}

#[test]
fn adaptive_reserve_settles_where_the_late_share_is_the_target() {
    let slo = 2_000_000;
    let mk = |adaptive: bool| {
        let mut cfg = BreakwaterConfig::for_slo(slo, 1);
        cfg.adaptive_reserve = adaptive;
        cfg.late_target = 0.005;
        Breakwater::new(cfg).unwrap()
    };
    // Off: completions change nothing.
    let mut p = mk(false);
    for _ in 0..100 {
        p.on_budget_spent(0, 500_000, 900_000);
    }
    assert_eq!(p.service_reserve_ns(), 600_000);
    // On: ten late completions (sojourn + the reply's RTT past the budget
    // the request arrived with) raise it by ten steps of 20 us...
    let mut p = mk(true);
    for _ in 0..10 {
        p.on_budget_spent(0, 1_000_000, 1_100_000);
    }
    assert_eq!(p.service_reserve_ns(), 800_000);
    // ... and the AQM uses it: 1 ms left, a 300 us forecast wait (3 queued
    // x 100 us) is refused (budget 1000 - 800 = 200 us), not admitted.
    let q = registered(&mut p, 1, 100.0);
    for i in 0..100 {
        p.on_arrival(i, &msg(1, Kind::Request, 1), &q);
        p.on_start(i, 0);
        p.on_complete(
            i,
            &Completion {
                client: 1,
                ok: true,
                sojourn_ns: 100_000,
            },
            &q,
        );
    }
    let queued = QueueView {
        oldest_enqueue: Some(999_000),
        len: 3,
        busy: 0,
        workers: 1,
    };
    let mut req = msg(1, Kind::Request, 1);
    req.budget_ns = Some(1_000_000);
    p.feedback(1_000_000, 1);
    assert!(matches!(
        p.on_arrival(1_000_000, &req, &queued),
        Verdict::Reject(RejectReason::QueueDelay {
            budget_ns: 200_000,
            ..
        })
    ));
    // Never past 70% of the SLO however late things get.
    for _ in 0..1000 {
        p.on_budget_spent(0, slo, slo);
    }
    assert_eq!(p.service_reserve_ns(), slo * 7 / 10);
    // Equilibrium: when a completion is late with probability
    // exp(-reserve / 100 us) (an exponential tail), the reserve settles
    // near 100 us x ln(1 / 0.005) = 530 us and the late share near 0.5%.
    let mut p = mk(true);
    let mut rng = SplitMix64::new(7);
    let (mut late, n) = (0u64, 400_000u64);
    for i in 0..n {
        let r = p.service_reserve_ns() as f64;
        let is_late = rng.next_open01() < (-r / 100_000.0).exp();
        if is_late && i >= n / 2 {
            late += 1;
        }
        // Late: 200 us past the budget; on time: 200 us inside it.
        let sojourn = if is_late { 1_000_000 } else { 600_000 };
        p.on_budget_spent(i, 900_000, sojourn);
    }
    let share = late as f64 / (n / 2) as f64;
    let r = p.service_reserve_ns();
    assert!((430_000..=630_000).contains(&r), "reserve {r}");
    assert!((0.003..=0.008).contains(&share), "late share {share}");
    assert_eq!(p.stats().budget_outcomes, n);
}

/// A client's budget is remote input: one the reserve uses up is refused
/// at arrival even on an idle core, and outcomes of budgets below the
/// reserve plus a service never move the reserve (a stream of 1 us budgets
/// once drove it to its cap, cutting every other client's queue budget).
#[test]
fn hopeless_client_budgets_are_refused_and_do_not_move_the_reserve() {
    let slo = 2_000_000;
    let mut cfg = BreakwaterConfig::for_slo(slo, 1);
    cfg.adaptive_reserve = true;
    let mut p = Breakwater::new(cfg).unwrap();
    let idle = registered(&mut p, 100, 100.0);
    let before = p.service_reserve_ns();
    for budget in [0, 1_000, before / 2, before] {
        let mut req = msg(1, Kind::Request, 1);
        req.budget_ns = Some(budget);
        assert!(
            matches!(
                p.on_arrival(10, &req, &idle),
                Verdict::Reject(RejectReason::QueueDelay { budget_ns: 0, .. })
            ),
            "budget {budget} admitted"
        );
    }
    for _ in 0..1000 {
        p.on_budget_spent(10, 1_000, 500_000);
        p.on_budget_spent(10, before, before + 1);
    }
    assert_eq!(
        p.service_reserve_ns(),
        before,
        "hopeless outcomes moved the reserve"
    );
    assert_eq!(p.stats().budget_outcomes, 0);
    // A budget the AQM could meet still counts when late.
    p.on_budget_spent(10, slo, slo);
    assert_eq!(p.stats().budget_outcomes, 1);
    assert!(p.service_reserve_ns() > before);
}

#[test]
fn forecast_gap_counts_the_time_between_jobs() {
    // Jobs of 100 µs, and 40 µs from each completion that leaves work
    // queued to the next start (an inline worker's socket work).
    let (svc, gap) = (100_000u64, 40_000u64);
    let run = |forecast_gap: bool| {
        let mut cfg = BreakwaterConfig::for_slo(SLO, 1);
        cfg.forecast_gap = forecast_gap;
        let mut p = Breakwater::new(cfg).unwrap();
        let idle = registered(&mut p, 200, 1000.0);
        let queued = QueueView { len: 3, ..idle };
        let mut t = 1_000;
        for i in 0..300 {
            p.on_arrival(t, &msg(1, Kind::Request, 100), &queued);
            p.on_start(t, 0);
            t += svc;
            // Every other completion leaves the queue empty: no gap then
            // (the next start waits for an arrival, not for socket work).
            let after = if i % 2 == 0 { queued } else { idle };
            p.on_complete(
                t,
                &Completion {
                    client: 1,
                    ok: true,
                    sojourn_ns: svc,
                },
                &after,
            );
            t += if i % 2 == 0 { gap } else { 500_000 };
        }
        let now = t;
        let filling = QueueView {
            oldest_enqueue: Some(now - 10_000),
            len: 5,
            busy: 0,
            workers: 1,
        };
        (p.gap_estimate_ns(), p.expected_wait(now, &filling))
    };
    let (g, w) = run(true);
    assert!((g - gap as f64).abs() < 1_000.0, "gap estimate {g}");
    assert!(
        (695_000..=705_000).contains(&w),
        "5 ahead x (100 + 40) us, got {w}"
    );
    let (g, w) = run(false);
    assert_eq!(g, 0.0);
    assert!(
        (499_000..=501_000).contains(&w),
        "5 ahead x 100 us, got {w}"
    );
}

#[test]
fn aqm_forecast_counts_the_work_queued_ahead() {
    let svc = 100_000; // 100 µs
    let p = warmed(true, svc);
    assert!((p.service_estimate_ns() - svc as f64).abs() < 1.0);
    // 10 queued on one worker, the oldest only 50 µs old: a newcomer waits
    // about 1 ms, not 50 µs.
    let now = 10_000_000;
    let filling = QueueView {
        oldest_enqueue: Some(now - 50_000),
        len: 10,
        busy: 1,
        workers: 1,
    };
    let w = p.expected_wait(now, &filling);
    assert!((999_000..=1_001_000).contains(&w), "forecast {w}");
    // An old head of a short queue: the age is the larger, and is used.
    let stale = QueueView {
        oldest_enqueue: Some(now - 600_000),
        len: 2,
        ..filling
    };
    assert_eq!(p.expected_wait(now, &stale), 600_000);
    // The drop rule uses the forecast: budget 700 µs (default, SLO 1 ms)
    // refuses the newcomer to the filling queue...
    let mut p = warmed(true, svc);
    match p.on_arrival(now, &msg(1, Kind::Request, 5), &filling) {
        Verdict::Reject(RejectReason::QueueDelay {
            delay_ns,
            budget_ns,
        }) => {
            assert!(delay_ns > budget_ns);
            assert_eq!(budget_ns, SLO * 7 / 10);
        }
        v => panic!("expected an AQM drop on the forecast, got {v:?}"),
    }
    assert_eq!(p.issued(), p.issued_recount());
    // ...which the age-only rule (the thesis's signal) admits.
    let mut p = warmed(false, svc);
    assert_eq!(
        p.on_arrival(now, &msg(1, Kind::Request, 5), &filling),
        Verdict::Admit
    );
}

#[test]
fn requests_without_credit_are_refused() {
    let mut p = bw();
    let q = empty();
    assert_eq!(
        p.on_arrival(0, &msg(9, Kind::Request, 0), &q),
        Verdict::Reject(RejectReason::Unregistered)
    );
    // Register with no demand: C_oc = 4, but only demand 1 (the request)
    // + C_oc ... then spend everything and one more.
    p.on_arrival(0, &msg(9, Kind::Register, 0), &q);
    let mut admitted = 1;
    while p.on_arrival(1, &msg(9, Kind::Request, 0), &q) == Verdict::Admit {
        admitted += 1;
        assert!(admitted < 100, "credits never ran out");
    }
    assert_eq!(
        p.on_arrival(1, &msg(9, Kind::Request, 0), &q),
        Verdict::Reject(RejectReason::NoCredit)
    );
    assert_eq!(p.issued(), p.issued_recount());
}

#[test]
fn lying_demand_is_bounded_by_the_pool() {
    let mut p = bw();
    let q = empty();
    for x in 0..10 {
        p.on_arrival(0, &msg(x, Kind::Register, 1), &q);
    }
    p.set_c_total(40.0);
    // Client 0 claims an absurd demand on every message.
    for round in 0..50u64 {
        p.on_arrival(round, &msg(0, Kind::CreditWait, u32::MAX), &q);
        p.feedback(round, 0);
        let total = p.c_total() as u64;
        assert!(
            p.issued() <= total,
            "issued {} > C_total {total}",
            p.issued()
        );
        assert!(p.unused(0).unwrap() <= total);
        assert!(p.demand(0).unwrap() <= total, "demand clamped to C_total");
    }
}

#[test]
fn clock_skew_and_steps_back_are_harmless() {
    // The same scenario on two server clocks an hour apart gives the same
    // decisions: nothing compares client and server times.
    let offsets = [0u64, 3_600_000_000_000];
    let mut runs = Vec::new();
    for off in offsets {
        let mut p = bw();
        let mut verdicts = Vec::new();
        let mut m = msg(1, Kind::Register, 3);
        m.budget_ns = Some(300_000);
        verdicts.push(p.on_arrival(off + 1_000_000, &m, &empty()));
        for i in 0..20u64 {
            let now = off + 1_000_000 + i * 60_000;
            let q = queue_with_delay(now, (i % 7) * 100_000);
            let mut m = msg(1, Kind::Request, 2);
            m.budget_ns = Some(400_000);
            verdicts.push(p.on_arrival(now, &m, &q));
            p.feedback(now, 1);
        }
        runs.push((verdicts, p.c_total(), p.issued()));
    }
    assert_eq!(runs[0], runs[1]);
    // A clock that steps back: no panic, delay counts as zero.
    let mut p = bw();
    p.on_arrival(5_000_000, &msg(1, Kind::Register, 3), &empty());
    let q = QueueView {
        oldest_enqueue: Some(9_000_000),
        len: 1,
        busy: 1,
        workers: 4,
    };
    assert_eq!(q.delay(4_000_000), 0);
    p.on_arrival(4_000_000, &msg(1, Kind::Request, 3), &q);
    let mut out = Vec::new();
    p.on_tick(1, &q, &mut out);
    assert_eq!(p.issued(), p.issued_recount());
}

#[test]
fn zero_or_negative_configuration_is_rejected_at_construction() {
    let base = BreakwaterConfig::for_slo(SLO, 4);
    type Mutation = Box<dyn Fn(&mut BreakwaterConfig)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("target_delay", Box::new(|c| c.target_delay_ns = 0)),
        ("alpha", Box::new(|c| c.alpha = 0.0)),
        ("alpha", Box::new(|c| c.alpha = -0.1)),
        ("beta", Box::new(|c| c.beta = -1.0)),
        ("beta", Box::new(|c| c.beta = f64::NAN)),
        ("rtt", Box::new(|c| c.rtt_ns = 0)),
        ("min_credits", Box::new(|c| c.min_credits = 0)),
        (
            "max_credits_per_client",
            Box::new(|c| c.max_credits_per_client = 0),
        ),
        ("queue_budget", Box::new(|c| c.queue_budget_ns = 0)),
        (
            "efficiency_threshold",
            Box::new(|c| c.efficiency_threshold = 0.0),
        ),
        ("max_drop_rate", Box::new(|c| c.max_drop_rate = 1.5)),
        (
            "efficiency_step",
            Box::new(|c| c.efficiency_step = Some(-2.0)),
        ),
        (
            "efficiency_decrease",
            Box::new(|c| c.efficiency_decrease = 1.0),
        ),
        ("client_idle", Box::new(|c| c.client_idle_ns = 0)),
    ];
    for (field, mutate) in cases {
        let mut c = base.clone();
        mutate(&mut c);
        let err = Breakwater::new(c).unwrap_err().to_string();
        assert!(err.starts_with(field), "{field}: {err}");
        assert!(!err.contains('\n'));
    }
    assert!(Dagor::new(DagorConfig {
        alpha: 0.0,
        ..DagorConfig::new(1)
    })
    .is_err());
    assert!(Dagor::new(DagorConfig::new(0)).is_err());
    assert!(SedaClient::new(SedaConfig {
        adj_d: 1.0,
        ..SedaConfig::new(SLO, 1.0, 1.0)
    })
    .is_err());
    assert!(SedaClient::new(SedaConfig::new(SLO, -1.0, 1.0)).is_err());
    assert!(Gradient::new(GradientConfig::new(0.0)).is_err());
    for kind in ControlKind::ALL {
        assert!(
            ControlSpec::new(kind, 0, 1).server().is_err(),
            "{kind:?} slo 0"
        );
        assert!(
            ControlSpec::new(kind, SLO, 0).server().is_err(),
            "{kind:?} cores 0"
        );
        assert!(ControlSpec::new(kind, SLO, 1).server().is_ok());
        assert!(ControlSpec::new(kind, SLO, 1).client().is_ok());
    }
}

#[test]
fn client_spends_credits_and_registers_once() {
    let mut c = BreakwaterClient::new();
    assert_eq!(c.try_acquire(0, 1), Acquire::Send(Kind::Register));
    assert_eq!(
        c.try_acquire(0, 1),
        Acquire::Wait,
        "one registration in flight"
    );
    c.on_feedback(1, Feedback::CreditLimit(3)); // received 1, 2 more
    assert_eq!(c.try_acquire(1, 1), Acquire::Send(Kind::Request));
    assert_eq!(c.try_acquire(1, 1), Acquire::Send(Kind::Request));
    assert_eq!(c.try_acquire(1, 1), Acquire::Wait);
    assert!(c.needs_credit_wait(0));
    assert!(!c.needs_credit_wait(1), "a response is coming");
    // A stale (lower) absolute edge is applied as is: no credit is minted.
    c.on_feedback(2, Feedback::CreditLimit(2));
    assert_eq!(c.available(), 0);
    c.on_feedback(2, Feedback::CreditLimit(5));
    assert_eq!(c.available(), 2);
    c.on_feedback(2, Feedback::CreditLimit(5)); // duplicate: idempotent
    assert_eq!(c.available(), 2);
}

#[test]
fn client_and_server_agree_on_credits_end_to_end() {
    // Drive one honest client against the server policy directly: it never
    // gets a NoCredit reject, and both sides count the same.
    let mut p = bw();
    let mut c = BreakwaterClient::new();
    let q = empty();
    let mut inflight = Vec::new();
    let mut rng = SplitMix64::new(3);
    for step in 0..5000u64 {
        let now = step * 1000;
        if rng.below(2) == 0 {
            if let Acquire::Send(kind) = c.try_acquire(now, 1) {
                match p.on_arrival(now, &msg(1, kind, rng.below(5) as u32), &q) {
                    Verdict::Admit => inflight.push(now),
                    Verdict::Reject(r) => {
                        assert_ne!(r, RejectReason::NoCredit, "honest client refused");
                        c.on_feedback(now, p.feedback(now, 1));
                    }
                    v => panic!("{v:?}"),
                }
            }
        } else if !inflight.is_empty() {
            inflight.remove(0);
            let fb = p.on_complete(
                now,
                &Completion {
                    client: 1,
                    ok: true,
                    sojourn_ns: 10,
                },
                &q,
            );
            c.on_feedback(now, fb);
        }
        if c.needs_credit_wait(inflight.len()) {
            if p.on_arrival(now, &msg(1, Kind::CreditWait, 1), &q) == Verdict::Answer {
                c.on_feedback(now, p.feedback(now, 1));
            } else {
                let mut out = Vec::new();
                p.on_tick(now + 1, &q, &mut out);
                for (_, fb) in out {
                    c.on_feedback(now, fb);
                }
            }
        }
        assert_eq!(p.issued(), p.issued_recount());
    }
}

#[test]
fn dagor_threshold_falls_under_delay_and_recovers() {
    let mut d = Dagor::new(DagorConfig::new(100_000)).unwrap();
    let q = empty();
    let mut rng = SplitMix64::new(1);
    let mut now = 0;
    for _ in 0..20_000 {
        now += 1000;
        let m = Arrival {
            priority: 1 + rng.below(128) as u8,
            ..Arrival::request(1)
        };
        if d.on_arrival(now, &m, &q) == Verdict::Admit {
            d.on_start(now, 500_000); // long queueing: overloaded
        }
    }
    let low = d.threshold();
    assert!(low < 64, "threshold {low} did not fall");
    for _ in 0..200_000 {
        now += 1000;
        let m = Arrival {
            priority: 1 + rng.below(128) as u8,
            ..Arrival::request(1)
        };
        if d.on_arrival(now, &m, &q) == Verdict::Admit {
            d.on_start(now, 0);
        }
    }
    assert!(d.threshold() > low, "threshold did not recover");
    let mut c = DagorClient::default();
    c.on_feedback(0, Feedback::Threshold(10));
    assert_eq!(c.try_acquire(0, 11), Acquire::Drop);
    assert_eq!(c.try_acquire(0, 10), Acquire::Send(Kind::Request));
}

#[test]
fn seda_rate_follows_p99() {
    let mut s = SedaClient::new(SedaConfig::new(SLO, 10.0, 100.0)).unwrap();
    for i in 0..100 {
        s.on_response(i, SLO / 2, true);
    }
    assert_eq!(s.rate(), 110.0);
    for i in 0..100 {
        s.on_response(200 + i, 2 * SLO, true);
    }
    assert!((s.rate() - 110.0 / 1.04).abs() < 1e-9);
    // The bucket refuses beyond the rate.
    let mut sent = 0;
    for i in 0..1000u64 {
        if s.try_acquire(i * 1_000, 1) != Acquire::Drop {
            sent += 1;
        }
    }
    assert!(sent <= 2, "sent {sent} in 1 ms at ~106/s");
}

#[test]
fn gradient_limit_shrinks_when_latency_inflates() {
    let mut g = Gradient::new(GradientConfig::new(4.0)).unwrap();
    let q = empty();
    let start = g.limit();
    // Fill to the limit, then complete with latencies 10x the long average.
    for _ in 0..2000 {
        while g.on_arrival(0, &Arrival::request(1), &q) == Verdict::Admit {}
        g.on_complete(
            0,
            &Completion {
                client: 1,
                ok: true,
                sojourn_ns: 100_000,
            },
            &q,
        );
    }
    for _ in 0..200 {
        while g.on_arrival(0, &Arrival::request(1), &q) == Verdict::Admit {}
        g.on_complete(
            0,
            &Completion {
                client: 1,
                ok: true,
                sojourn_ns: 5_000_000,
            },
            &q,
        );
    }
    assert!(
        g.limit() < start.max(20.0),
        "limit {} did not shrink",
        g.limit()
    );
    assert_eq!(
        g.on_arrival(0, &Arrival::request(1), &q),
        Verdict::Reject(RejectReason::Limit)
    );
}

/// A request sent without credit (`await`) is admitted on a free credit,
/// held while the pool is spent (at most `max_held`, one per client), let
/// in the moment a completion frees a credit, and refused once it could no
/// longer start within its budget.
#[test]
fn awaits_are_admitted_held_released_and_refused() {
    let mut cfg = BreakwaterConfig::for_slo(SLO, 1);
    cfg.max_held = 2;
    cfg.overcommit_floor = 0;
    let mut p = Breakwater::new(cfg).unwrap();
    let q = QueueView {
        workers: 1,
        ..QueueView::default()
    };
    // Cold pool: C_total = C_min = 1.
    for x in 1..=4 {
        assert_eq!(
            p.on_arrival(0, &msg(x, Kind::Register, 0), &q),
            Verdict::Admit
        );
    }
    for x in 1..=4 {
        let done = Completion {
            client: x,
            ok: true,
            sojourn_ns: 1_000,
        };
        p.on_complete(1, &done, &q);
    }
    assert_eq!(
        p.issued(),
        0,
        "floor 0 and no demand: no speculative credit"
    );
    let mut m = msg(1, Kind::Await, 0);
    m.budget_ns = Some(SLO);
    assert_eq!(p.on_arrival(2, &m, &q), Verdict::Admit, "a free credit");
    assert_eq!(p.issued(), 1);
    for x in [2, 3] {
        let mut m = msg(x, Kind::Await, 0);
        m.budget_ns = Some(SLO);
        assert_eq!(p.on_arrival(2, &m, &q), Verdict::Park, "pool spent: held");
    }
    let mut m = msg(2, Kind::Await, 0);
    m.budget_ns = Some(SLO);
    assert_eq!(
        p.on_arrival(2, &m, &q),
        Verdict::Reject(RejectReason::NoCredit),
        "one held request per client"
    );
    let mut m = msg(4, Kind::Await, 0);
    m.budget_ns = Some(SLO);
    assert_eq!(
        p.on_arrival(2, &m, &q),
        Verdict::Reject(RejectReason::Limit),
        "max_held reached"
    );
    assert_eq!(p.held(), 2);
    assert_eq!(p.issued(), p.issued_recount());
    // Nothing to release while the pool is spent.
    let mut out = Vec::new();
    p.release_parked(3, &q, &mut out);
    assert!(out.is_empty());
    // A completion frees the credit: the oldest held request goes in.
    let done = Completion {
        client: 1,
        ok: true,
        sojourn_ns: 1_000,
    };
    p.on_complete(4, &done, &q);
    p.release_parked(4, &q, &mut out);
    assert_eq!(out, vec![(2, Release::Admit)]);
    assert_eq!(p.issued(), 1);
    assert_eq!(p.issued(), p.issued_recount());
    // Client 3 waited past its budget (SLO minus the service reserve).
    out.clear();
    p.release_parked(SLO, &q, &mut out);
    assert!(
        matches!(
            out[..],
            [(3, Release::Reject(RejectReason::QueueDelay { .. }))]
        ),
        "{out:?}"
    );
    assert_eq!(p.held(), 0);
    assert_eq!(p.issued(), p.issued_recount());
}

/// With `hold_expired`, a held request whose time ran out is not refused:
/// it stays (never run, claiming no credit) as its client's credit wait,
/// and is answered `expired` with a credit when one frees, after the live
/// held requests, or without one once it was kept `max_hold`.
#[test]
fn expired_held_requests_stay_as_credit_waits() {
    let mut cfg = BreakwaterConfig::for_slo(SLO, 1);
    cfg.overcommit_floor = 0;
    cfg.hold_expired = true;
    cfg.max_hold_ns = 10 * SLO;
    cfg.rtt_ns = 1_000 * SLO; // no pool update during the test: C_total = 1
    let mut p = Breakwater::new(cfg).unwrap();
    let q = QueueView {
        workers: 1,
        ..QueueView::default()
    };
    for x in 1..=4 {
        p.on_arrival(0, &msg(x, Kind::Register, 0), &q);
    }
    for x in 1..=4 {
        let done = Completion {
            client: x,
            ok: true,
            sojourn_ns: 1_000,
        };
        p.on_complete(1, &done, &q);
    }
    assert_eq!(p.issued(), 0);
    let await_at = |p: &mut Breakwater, x: u64, now: u64| {
        let mut m = msg(x, Kind::Await, 0);
        m.budget_ns = Some(SLO);
        p.on_arrival(now, &m, &q)
    };
    assert_eq!(await_at(&mut p, 1, 2), Verdict::Admit, "a free credit");
    assert_eq!(await_at(&mut p, 2, 2), Verdict::Park);
    let mut out = Vec::new();
    // Client 2's time runs out while the pool is spent: kept, not refused.
    p.release_parked(SLO, &q, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!((p.held(), p.held_expired()), (1, 1));
    assert_eq!(
        await_at(&mut p, 2, SLO),
        Verdict::Reject(RejectReason::NoCredit),
        "still one held request per client"
    );
    // A live held request goes before the expired one.
    assert_eq!(await_at(&mut p, 3, SLO), Verdict::Park);
    let done = Completion {
        client: 1,
        ok: true,
        sojourn_ns: 1_000,
    };
    p.on_complete(SLO + 1, &done, &q);
    p.release_parked(SLO + 1, &q, &mut out);
    assert_eq!(out, vec![(3, Release::Admit)]);
    out.clear();
    // Client 3 completes: the freed credit goes to client 2's answer.
    let done = Completion {
        client: 3,
        ok: true,
        sojourn_ns: 1_000,
    };
    p.on_complete(SLO + 2, &done, &q);
    p.release_parked(SLO + 2, &q, &mut out);
    assert_eq!(out, vec![(2, Release::Reject(RejectReason::Expired))]);
    out.clear();
    assert!(matches!(p.feedback(SLO + 2, 2), Feedback::CreditLimit(_)));
    assert_eq!(p.unused(2), Some(1), "the answer carries a credit");
    assert_eq!(p.issued(), p.issued_recount());
    // Pool spent again (client 2 holds it): client 4's expired request is
    // answered only after max_hold, and without a credit.
    assert_eq!(await_at(&mut p, 4, SLO + 3), Verdict::Park);
    p.release_parked(2 * SLO + 3, &q, &mut out);
    assert!(out.is_empty(), "{out:?}");
    p.release_parked(11 * SLO + 3, &q, &mut out);
    assert_eq!(out, vec![(4, Release::Reject(RejectReason::Expired))]);
    p.feedback(11 * SLO + 3, 4);
    assert_eq!(p.unused(4), Some(0));
    assert_eq!(p.held(), 0);
    assert_eq!(p.issued(), p.issued_recount());
}

#[test]
fn a_carrying_client_sends_its_request_as_the_credit_wait() {
    let mut c = BreakwaterClient::carrying();
    assert!(c.carries_requests());
    assert!(!BreakwaterClient::new().carries_requests());
    assert_eq!(c.try_acquire(0, 1), Acquire::Send(Kind::Register));
    c.on_feedback(1, Feedback::CreditLimit(1));
    assert_eq!(c.try_acquire(1, 1), Acquire::Wait);
    assert!(c.needs_credit_wait(0));
    c.reset();
    assert!(c.carries_requests(), "reset keeps the protocol");
}
