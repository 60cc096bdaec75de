//! Pick a control by name, with parameters derived from the SLO the way the
//! thesis tunes them, and build both of its halves. The example server, the
//! load generator and the simulator all go through this, so "breakwater"
//! means the same thing in all three.

use crate::policy::breakwater::{Breakwater, BreakwaterClient, BreakwaterConfig, Signal};
use crate::policy::dagor::{Dagor, DagorClient, DagorConfig};
use crate::policy::gradient::{Gradient, GradientConfig};
use crate::policy::none::{NoControl, Unlimited};
use crate::policy::seda::{SedaClient, SedaConfig, SedaServer};
use crate::policy::{ClientPolicy, ConfigError, Nanos, Policy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ControlKind {
    None,
    Breakwater,
    BreakwaterEfficiency,
    Seda,
    Dagor,
    Gradient,
}

impl ControlKind {
    pub const ALL: [ControlKind; 6] = [
        ControlKind::None,
        ControlKind::Breakwater,
        ControlKind::BreakwaterEfficiency,
        ControlKind::Seda,
        ControlKind::Dagor,
        ControlKind::Gradient,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ControlKind::None => "none",
            ControlKind::Breakwater => "breakwater",
            ControlKind::BreakwaterEfficiency => "breakwater-efficiency",
            ControlKind::Seda => "seda",
            ControlKind::Dagor => "dagor",
            ControlKind::Gradient => "gradient",
        }
    }
}

impl std::str::FromStr for ControlKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ControlKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ControlKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown control {s:?} (known: {})", names.join(", "))
            })
    }
}

/// Everything needed to build a control's two halves.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ControlSpec {
    pub kind: ControlKind,
    /// End-to-end SLO; the other times derive from it.
    pub slo_ns: Nanos,
    /// Server cores (workers): Breakwater's C_min, gradient's floor.
    pub cores: u64,
    /// Network RTT: Breakwater's update period.
    pub rtt_ns: Nanos,
    /// Breakwater ablation switches.
    pub overcommit: bool,
    pub aqm: bool,
    /// AQM against the forecast wait (default) or the oldest's age only.
    pub aqm_forecast: bool,
    /// The forecast counts the gap between jobs (`BreakwaterConfig::forecast_gap`).
    pub forecast_gap: bool,
    /// The service reserve stays where it is configured (no adaptation,
    /// `BreakwaterConfig::adaptive_reserve` off; sessions 1–10).
    pub fixed_reserve: bool,
    /// The adaptive reserve's target late share; `None`: the default.
    pub late_target: Option<f64>,
    /// The adaptive reserve's ceiling; `None`: the default (70% of the SLO).
    pub max_reserve_ns: Option<Nanos>,
    /// A drained client's credit wait carries its oldest request
    /// ([`crate::Kind::Await`]) rather than going alone (the thesis's
    /// protocol, the default; see docs/breakwater.md for the measurements).
    pub carry: bool,
    /// With `carry`: a held request whose time runs out stays at the server
    /// as its client's credit wait until the pool can spare the client a
    /// credit (`BreakwaterConfig::hold_expired`); the bound on held
    /// requests then defaults to one per client (no cap of its own).
    pub hold_expired: bool,
    /// Breakwater: push explicit credits only on known demand (demand
    /// lines), see `BreakwaterConfig::demand_only`.
    pub demand_only: bool,
    /// Eq. 2.4's floor (`C_oc ≥ this`); `None`: 1, or 0 with `carry`.
    pub overcommit_floor: Option<u64>,
    /// Breakwater's bound on requests held for a credit; `None` keeps the
    /// default (64 × cores).
    pub max_held: Option<u64>,
    /// Breakwater's d_t; `None` keeps the thesis's 40% of the SLO.
    pub target_delay_ns: Option<Nanos>,
    /// Breakwater's service reserve (the AQM budget is SLO − this); `None`
    /// keeps the default, 30% of the SLO.
    pub service_reserve_ns: Option<Nanos>,
    /// SEDA: additive increase (req/s per adjustment) and starting rate per
    /// client. Tune to the per-client share of capacity.
    pub seda_adj_i: f64,
    pub seda_initial_rate: f64,
    /// DAGOR_q; default 35% of the SLO (the thesis's 70 µs of 200 µs).
    pub dagor_q_ns: Option<Nanos>,
}

impl ControlSpec {
    pub fn new(kind: ControlKind, slo_ns: Nanos, cores: u64) -> Self {
        ControlSpec {
            kind,
            slo_ns,
            cores,
            rtt_ns: 100_000,
            overcommit: true,
            aqm: true,
            aqm_forecast: true,
            forecast_gap: true,
            fixed_reserve: false,
            late_target: None,
            max_reserve_ns: None,
            carry: false,
            hold_expired: false,
            demand_only: false,
            overcommit_floor: None,
            max_held: None,
            target_delay_ns: None,
            service_reserve_ns: None,
            seda_adj_i: 1.0,
            seda_initial_rate: 100.0,
            dagor_q_ns: None,
        }
    }

    pub fn breakwater_config(&self) -> BreakwaterConfig {
        let mut c = BreakwaterConfig::for_slo(self.slo_ns, self.cores);
        c.rtt_ns = self.rtt_ns;
        c.overcommit = self.overcommit;
        c.aqm = self.aqm;
        c.aqm_forecast = self.aqm_forecast;
        c.forecast_gap = self.forecast_gap;
        c.adaptive_reserve = !self.fixed_reserve;
        if let Some(q) = self.late_target {
            c.late_target = q;
        }
        if let Some(m) = self.max_reserve_ns {
            c.max_reserve_ns = m.min(self.slo_ns);
        }
        if let Some(r) = self.service_reserve_ns {
            c.service_reserve_ns = r.min(self.slo_ns);
            c.queue_budget_ns = self.slo_ns.saturating_sub(r).max(1);
        }
        if self.carry {
            c.overcommit_floor = 0;
        }
        if self.hold_expired {
            c.hold_expired = true;
            c.max_held = u64::from(u32::MAX);
        }
        c.demand_only = self.demand_only;
        if let Some(f) = self.overcommit_floor {
            c.overcommit_floor = f;
        }
        if let Some(d) = self.target_delay_ns {
            c.target_delay_ns = d;
        }
        if let Some(h) = self.max_held {
            c.max_held = h;
        }
        if self.kind == ControlKind::BreakwaterEfficiency {
            c.signal = Signal::Efficiency;
        }
        c
    }

    /// The server half. Zero or negative settings are refused here.
    pub fn server(&self) -> Result<Box<dyn Policy>, ConfigError> {
        if self.slo_ns == 0 {
            return Err(ConfigError("slo must be > 0".into()));
        }
        if self.cores == 0 {
            return Err(ConfigError("cores must be > 0".into()));
        }
        Ok(match self.kind {
            ControlKind::None => Box::new(NoControl),
            ControlKind::Breakwater | ControlKind::BreakwaterEfficiency => {
                Box::new(Breakwater::new(self.breakwater_config())?)
            }
            ControlKind::Seda => Box::new(SedaServer),
            ControlKind::Dagor => Box::new(Dagor::new(DagorConfig::new(
                self.dagor_q_ns.unwrap_or(self.slo_ns * 7 / 20),
            ))?),
            ControlKind::Gradient => {
                Box::new(Gradient::new(GradientConfig::new(self.cores as f64))?)
            }
        })
    }

    /// The client half.
    pub fn client(&self) -> Result<Box<dyn ClientPolicy>, ConfigError> {
        Ok(match self.kind {
            ControlKind::None | ControlKind::Gradient => Box::new(Unlimited),
            ControlKind::Breakwater | ControlKind::BreakwaterEfficiency => {
                Box::new(if self.carry {
                    BreakwaterClient::carrying()
                } else {
                    BreakwaterClient::new()
                })
            }
            ControlKind::Seda => Box::new(SedaClient::new(SedaConfig::new(
                self.slo_ns,
                self.seda_adj_i,
                self.seda_initial_rate,
            ))?),
            ControlKind::Dagor => Box::new(DagorClient::default()),
        })
    }
}
