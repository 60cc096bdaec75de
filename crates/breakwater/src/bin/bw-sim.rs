//! `bw-sim`: run the discrete-event simulator's experiments (thesis Fig.
//! 2.7/2.8/2.11/2.12/2.13 shapes) and print JSON.
//!
//! ```text
//! bw-sim --experiment sweep|dist|shift|ablation|messages|all [--quick] [--json FILE]
//! bw-sim --control breakwater --dist exponential --mean-us 10 --demand 2.0 --duration 0.5
//! ```
//!
//! Bad flags are a one-line error and exit 2.

use breakwater::control::ControlKind;
use breakwater::sim::{self, ServiceDist, SimConfig};
use serde_json::{json, Value};
use std::process::ExitCode;

struct Args {
    experiment: Option<String>,
    control: ControlKind,
    dist: ServiceDist,
    mean_us: u64,
    demand: f64,
    duration: f64,
    quick: bool,
    json: Option<String>,
    seed: u64,
    seda_adj_i: Option<f64>,
    cores: Option<usize>,
    rtt_us: Option<u64>,
    clients: Option<usize>,
    slo_us: Option<u64>,
    rx_cost_us: Option<f64>,
    tx_cost_us: Option<f64>,
    carry: bool,
    max_held: Option<u64>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        experiment: None,
        control: ControlKind::Breakwater,
        dist: ServiceDist::Exponential,
        mean_us: 10,
        demand: 1.0,
        duration: 0.5,
        quick: false,
        json: None,
        seed: 1,
        seda_adj_i: None,
        cores: None,
        rtt_us: None,
        clients: None,
        slo_us: None,
        rx_cost_us: None,
        tx_cost_us: None,
        carry: false,
        max_held: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "--experiment" => a.experiment = Some(val("--experiment")?),
            "--control" => a.control = val("--control")?.parse()?,
            "--dist" => a.dist = val("--dist")?.parse()?,
            "--mean-us" => {
                a.mean_us = num(&val("--mean-us")?, "--mean-us")?;
                if a.mean_us == 0 {
                    return Err("--mean-us must be > 0".into());
                }
            }
            "--demand" => a.demand = pos(&val("--demand")?, "--demand")?,
            "--duration" => a.duration = pos(&val("--duration")?, "--duration")?,
            "--seed" => a.seed = num(&val("--seed")?, "--seed")?,
            "--seda-adj-i" => a.seda_adj_i = Some(pos(&val("--seda-adj-i")?, "--seda-adj-i")?),
            "--cores" => a.cores = Some(num(&val("--cores")?, "--cores")?.max(1) as usize),
            "--rtt-us" => a.rtt_us = Some(num(&val("--rtt-us")?, "--rtt-us")?.max(1)),
            "--clients" => a.clients = Some(num(&val("--clients")?, "--clients")?.max(1) as usize),
            "--slo-us" => a.slo_us = Some(num(&val("--slo-us")?, "--slo-us")?.max(1)),
            "--rx-cost-us" => a.rx_cost_us = Some(pos(&val("--rx-cost-us")?, "--rx-cost-us")?),
            "--tx-cost-us" => a.tx_cost_us = Some(pos(&val("--tx-cost-us")?, "--tx-cost-us")?),
            "--json" => a.json = Some(val("--json")?),
            "--carry" => a.carry = true,
            "--max-held" => a.max_held = Some(num(&val("--max-held")?, "--max-held")?),
            "--quick" => a.quick = true,
            "-h" | "--help" => {
                return Err("usage: bw-sim --experiment sweep|dist|shift|ablation|messages|all [--quick] [--json FILE] | --control NAME --dist D --mean-us N --demand X --duration S [--cores N --rtt-us N --clients N --slo-us N --rx-cost-us F --tx-cost-us F --carry --max-held N]".into())
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(a)
}

fn num(s: &str, name: &str) -> Result<u64, String> {
    s.parse()
        .map_err(|_| format!("{name}: not a non-negative integer: {s:?}"))
}

fn pos(s: &str, name: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{name} must be a positive number, got {s:?}")),
    }
}

fn one(
    kind: ControlKind,
    dist: ServiceDist,
    mean_us: u64,
    steps: Vec<(f64, f64)>,
    seed: u64,
    tweak: impl Fn(&mut SimConfig),
) -> Result<Value, String> {
    let mut cfg = SimConfig::thesis(kind, mean_us * 1000, dist);
    cfg.seed = seed;
    tweak(&mut cfg);
    cfg.steps = steps
        .iter()
        .map(|&(x, d)| (x * cfg.capacity_rps(), d))
        .collect();
    let r = sim::run(&cfg).map_err(|e| e.to_string())?;
    Ok(serde_json::to_value(r).expect("serialisable"))
}

fn experiment(name: &str, quick: bool, seed: u64) -> Result<Value, String> {
    let dur = if quick { 0.2 } else { 0.5 };
    let demands: &[f64] = if quick {
        &[0.5, 1.0, 2.0]
    } else {
        &[0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.2, 1.5, 2.0]
    };
    let mut out = Vec::new();
    match name {
        "sweep" => {
            for kind in [
                ControlKind::None,
                ControlKind::Breakwater,
                ControlKind::Dagor,
                ControlKind::Seda,
                ControlKind::Gradient,
            ] {
                for &d in demands {
                    let mut v = one(
                        kind,
                        ServiceDist::Exponential,
                        10,
                        vec![(d, dur)],
                        seed,
                        |_| {},
                    )?;
                    v["demand"] = json!(d);
                    out.push(v);
                }
            }
        }
        "dist" => {
            for dist in [
                ServiceDist::Constant,
                ServiceDist::Exponential,
                ServiceDist::Bimodal,
            ] {
                for d in [0.9, 1.2, 2.0] {
                    for kind in [
                        ControlKind::Breakwater,
                        ControlKind::Dagor,
                        ControlKind::Seda,
                    ] {
                        let mut v = one(kind, dist, 10, vec![(d, dur)], seed, |_| {})?;
                        v["demand"] = json!(d);
                        v["dist"] = json!(dist);
                        out.push(v);
                    }
                }
            }
        }
        "shift" => {
            let phase = if quick { 0.4 } else { 1.0 };
            for kind in [
                ControlKind::Breakwater,
                ControlKind::Dagor,
                ControlKind::Seda,
            ] {
                let steps = [0.5, 0.9, 1.4, 0.9, 0.5]
                    .iter()
                    .map(|&x| (x, phase))
                    .collect();
                let mut v = one(kind, ServiceDist::Exponential, 10, steps, seed, |c| {
                    c.warmup_s = 0.5
                })?;
                v["phase_s"] = json!(phase);
                out.push(v);
            }
        }
        "ablation" => {
            let variants: [(&str, ControlKind, bool, bool); 4] = [
                ("none", ControlKind::None, true, true),
                ("credits", ControlKind::Breakwater, false, false),
                ("credits+speculation", ControlKind::Breakwater, true, false),
                (
                    "credits+speculation+aqm",
                    ControlKind::Breakwater,
                    true,
                    true,
                ),
            ];
            for (label, kind, oc, aqm) in variants {
                for &d in demands {
                    let mut v = one(
                        kind,
                        ServiceDist::Exponential,
                        10,
                        vec![(d, dur)],
                        seed,
                        |c| {
                            c.control.overcommit = oc;
                            c.control.aqm = aqm;
                        },
                    )?;
                    v["demand"] = json!(d);
                    v["variant"] = json!(label);
                    out.push(v);
                }
            }
        }
        "messages" => {
            for (label, oc) in [("speculation", true), ("synchronization", false)] {
                for &d in demands {
                    let mut v = one(
                        ControlKind::Breakwater,
                        ServiceDist::Exponential,
                        10,
                        vec![(d, dur)],
                        seed,
                        |c| {
                            c.control.overcommit = oc;
                        },
                    )?;
                    v["demand"] = json!(d);
                    v["variant"] = json!(label);
                    out.push(v);
                }
            }
        }
        other => {
            return Err(format!(
                "unknown experiment {other:?} (sweep, dist, shift, ablation, messages, all)"
            ))
        }
    }
    Ok(Value::Array(out))
}

/// Single-run overrides of the thesis setting.
fn overrides(args: &Args, c: &mut SimConfig) {
    if let Some(a) = args.seda_adj_i {
        c.control.seda_adj_i = a;
    }
    if let Some(n) = args.cores {
        c.cores = n;
        c.control.cores = n as u64;
    }
    if let Some(r) = args.rtt_us {
        c.rtt_ns = r * 1000;
        c.control.rtt_ns = r * 1000;
    }
    if let Some(n) = args.clients {
        c.clients = n;
    }
    if let Some(s) = args.slo_us {
        c.control.slo_ns = s * 1000;
    }
    if let Some(us) = args.rx_cost_us {
        c.rx_cost_ns = (us * 1000.0) as u64;
    }
    if let Some(us) = args.tx_cost_us {
        c.tx_cost_ns = (us * 1000.0) as u64;
    }
    // The thesis's protocol unless asked: `--carry` sends a drained
    // client's oldest request as its credit wait (the bench VM's default).
    c.control.carry = args.carry;
    if args.max_held.is_some() {
        c.control.max_held = args.max_held;
    }
    let share = c.capacity_rps() / c.clients as f64;
    if args.seda_adj_i.is_none() {
        c.control.seda_adj_i = 4.0 * share / 850.0;
    }
    c.control.seda_initial_rate = share;
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bw-sim: error: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match &args.experiment {
        Some(name) if name == "all" => ["sweep", "dist", "shift", "ablation", "messages"]
            .iter()
            .map(|n| experiment(n, args.quick, args.seed).map(|v| (n.to_string(), v)))
            .collect::<Result<serde_json::Map<_, _>, _>>()
            .map(Value::Object),
        Some(name) => experiment(name, args.quick, args.seed),
        None => one(
            args.control,
            args.dist,
            args.mean_us,
            vec![(args.demand, args.duration)],
            args.seed,
            |c| overrides(&args, c),
        ),
    };
    let value = match result {
        Ok(v) => v,
        Err(e) => {
            eprintln!("bw-sim: error: {e}");
            return ExitCode::from(2);
        }
    };
    let text = serde_json::to_string(&value).expect("serialisable") + "\n";
    match &args.json {
        Some(path) => {
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("bw-sim: error: cannot write {path}: {e}");
                return ExitCode::from(1);
            }
        }
        None => print!("{text}"),
    }
    ExitCode::SUCCESS
}
