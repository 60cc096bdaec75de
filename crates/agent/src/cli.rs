//! The command line. Hand-written rather than derived so that every mistake
//! is one line on stderr with a documented exit code, and so that
//! everything after `--` is the target's, untouched.

use std::path::PathBuf;
use std::time::Duration;

use tailscope_abi::{TS_DEFAULT_SAMPLE_PPM, TS_PPM};

use crate::error::{AgentError, Result};

pub const USAGE: &str = "\
tailscope-agent — record why requests are slow

USAGE:
    tailscope-agent record -o DIR (-p PID | -- CMD [ARGS...]) [OPTIONS]

    Records one row per sampled request (latency plus on-CPU, runnable and
    blocked wait, irq, softirq, faults, switches, migrations) into
    DIR/requests/part-NNNNN.parquet and DIR/meta.json, until Ctrl-C,
    SIGTERM, --duration, or the target's exit.

OPTIONS:
    -o, --output DIR    recording directory (must not exist, see --force)
    -p, --pid PID       attach to a running process; it is never signalled
    -- CMD [ARGS...]    launch CMD with the BPF programs already attached;
                        on Ctrl-C/SIGTERM the recording is finalised, then
                        CMD gets SIGTERM (SIGKILL after 3 s)
    --sample RATE       sampling rate: 0.01, 1% or 100% (default: the
                        runtime's own rate in marker mode, else 1%)
    --burst B           sample in windows: auto (default: at rates up to 2.5%,
                        50 ms windows sampled at 20%, e.g. every second on
                        average at 1%; between windows the per-request and
                        interrupt programs are detached and cost nothing),
                        off (sample every request independently, programs
                        always attached), or WINDOW_MS/PERIOD_MS; never with
                        --functions
    --mode MODE         auto (default): marker if the target has a
                        libtailscope region (a launched CMD gets 1 s to
                        create it), else infer;
                        marker: requests marked by libtailscope;
                        infer: zero-instrumentation, inferred by eBPF from
                        socket syscalls
    --duration SECS     stop after SECS seconds
    --force             reuse an existing DIR: its meta.json and
                        requests/*.parquet are replaced, nothing else touched
    --quiet             no progress line (the final summary is kept)
    --poll-us N         shortest drain period in microseconds (default 1000);
                        marker mode sleeps up to 50 ms unless a ring fills
                        a quarter (the target wakes it); zero-instrumentation
                        mode backs off to up to 16 ms while the rings stay
                        near empty (low sampling rates)
    --functions         also record function-level latency (LDB): scan the
                        target's shadow stacks (build it with `tailscope
                        flags` or tailscope-cc) into DIR/functions/, and its
                        lock and request hand-off events into DIR/locks/ and
                        DIR/request_events/; needs libtailscope in the target
    --fn-period-us N    observer scan period in microseconds (default 1000;
                        passes that find nothing new back off to 2 periods);
                        it runs at idle priority (SCHED_IDLE): only CPU
                        time nothing else wants; 0 busy-polls, for a spare
                        core (see --fn-normal-priority)
    --fn-normal-priority
                        run the observer (and the agent's other threads,
                        which --functions otherwise moves to SCHED_IDLE too)
                        at normal priority: finer scans under load, at the
                        cost of CPU and wake-up latency the target could use
    --fn-threshold-us N record only calls at least N us long (default 0: every
                        call the observer sees end)
    --mutex-threshold-us N  log a lock when its wait or hold exceeds N us
                        (default 1)
    --dte-tolerance F   Shim double-time error filter: keep a stack walk when
                        its clock ratio is within 1 +- F (default 0.01)
    -h, --help          this text
    -V, --version       the version

EXIT CODES:
    0  recording written
    1  internal error while recording (e.g. writing the output failed)
    2  bad command line
    3  no such PID, or CMD could not be started
    4  output directory exists (use --force) or cannot be written
    5  not root, or a capability is missing
    6  a BPF program was rejected or could not be attached
    7  marker mode (or --functions): no usable /dev/shm/tailscope.<pid> region
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Auto,
    Marker,
    Infer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pid(u32),
    Launch(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RecordArgs {
    pub output: PathBuf,
    pub target: Target,
    /// `None`: not given on the command line.
    pub sample_ppm: Option<u32>,
    /// `--burst` (not with `--functions`).
    pub burst: crate::burst::BurstArg,
    pub mode: Mode,
    pub duration: Option<Duration>,
    pub force: bool,
    pub quiet: bool,
    pub poll: Duration,
    /// `--functions`: the LDB observer's configuration.
    pub functions: Option<crate::observer::ObserverConfig>,
}

#[derive(Debug, PartialEq)]
pub enum Command {
    Record(RecordArgs),
    Help,
    Version,
}

pub const DEFAULT_POLL_US: u64 = 1000;

/// Parses `--burst`: `auto`, `off`, or `WINDOW_MS/PERIOD_MS` with
/// 0 < window < period <= 60 s.
pub fn parse_burst(s: &str) -> Result<crate::burst::BurstArg> {
    use crate::burst::BurstArg;
    match s.trim() {
        "auto" => return Ok(BurstArg::Auto),
        "off" => return Ok(BurstArg::Off),
        _ => {}
    }
    let bad = || {
        AgentError::usage(format!(
            "bad --burst {s:?}: expected auto, off or WINDOW_MS/PERIOD_MS with 0 < window < period <= 60000"
        ))
    };
    let (w, p) = s.split_once('/').ok_or_else(bad)?;
    let ms = |x: &str| -> Option<f64> {
        x.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0 && *v <= 60_000.0)
    };
    let (w, p) = (ms(w).ok_or_else(bad)?, ms(p).ok_or_else(bad)?);
    if w >= p {
        return Err(bad());
    }
    Ok(BurstArg::Window {
        window: Duration::from_secs_f64(w / 1e3),
        period: Duration::from_secs_f64(p / 1e3),
    })
}

/// Parses a sampling rate into parts per million: a fraction (`0.01`), a
/// percentage (`1%`, `100%`). Must be in (0, 100%] and not round to 0 ppm.
pub fn parse_rate(s: &str) -> Result<u32> {
    let bad = |why: &str| AgentError::usage(format!("bad sampling rate {s:?}: {why}"));
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(p) => (p.trim(), 100.0),
        None => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| bad("expected a fraction like 0.01 or a percentage like 1%"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(bad("must be above 0"));
    }
    let fraction = v / scale;
    if fraction > 1.0 {
        return Err(if scale == 1.0 {
            bad(&format!("above 1 (did you mean {num}%?)"))
        } else {
            bad("above 100%")
        });
    }
    let ppm = (fraction * TS_PPM as f64).round() as u32;
    if ppm == 0 {
        return Err(bad("below 1 per million"));
    }
    Ok(ppm)
}

/// Formats a ppm rate the way a user would write it.
pub fn format_ppm(ppm: u32) -> String {
    format!("{}%", ppm as f64 / 10_000.0)
}

pub fn default_sample_ppm() -> u32 {
    TS_DEFAULT_SAMPLE_PPM
}

fn parse_duration(s: &str) -> Result<Duration> {
    let v: f64 = s
        .trim_end_matches('s')
        .parse()
        .map_err(|_| AgentError::usage(format!("bad --duration {s:?}: expected seconds")))?;
    if !v.is_finite() || v <= 0.0 || v > 366.0 * 86_400.0 {
        return Err(AgentError::usage(format!(
            "bad --duration {s:?}: must be above 0"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Parses `argv` without the program name.
pub fn parse<I, S>(args: I) -> Result<Command>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let args: Vec<String> = args.into_iter().map(Into::into).collect();
    let mut it = args.into_iter();
    match it.next().as_deref() {
        None => {
            return Err(AgentError::usage(
                "missing command; try: tailscope-agent record --help",
            ))
        }
        Some("-h") | Some("--help") | Some("help") => return Ok(Command::Help),
        Some("-V") | Some("--version") => return Ok(Command::Version),
        Some("record") => {}
        Some(other) => {
            return Err(AgentError::usage(format!(
                "unknown command {other:?}; try: tailscope-agent --help"
            )))
        }
    }

    let mut output = None;
    let mut pid = None;
    let mut cmd: Option<Vec<String>> = None;
    let mut sample_ppm = None;
    let mut burst = crate::burst::BurstArg::Auto;
    let mut mode = Mode::Auto;
    let mut duration = None;
    let mut force = false;
    let mut quiet = false;
    let mut poll_us = DEFAULT_POLL_US;
    let mut functions = false;
    let mut obs = crate::observer::ObserverConfig::default();
    let mut fn_options = None;

    while let Some(arg) = it.next() {
        if arg == "--" {
            cmd = Some(it.by_ref().collect());
            break;
        }
        // --name=value or --name value
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |what: &str| -> Result<String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it
                    .next()
                    .ok_or_else(|| AgentError::usage(format!("{name} needs {what}"))),
            }
        };
        match name.as_str() {
            "-o" | "--output" => output = Some(PathBuf::from(value("a directory")?)),
            "-p" | "--pid" => {
                let v = value("a process id")?;
                let p: u32 = v
                    .parse()
                    .ok()
                    .filter(|&p| p > 0 && p <= i32::MAX as u32)
                    .ok_or_else(|| AgentError::usage(format!("bad PID {v:?}")))?;
                pid = Some(p);
            }
            "--sample" => sample_ppm = Some(parse_rate(&value("a rate")?)?),
            "--burst" => burst = parse_burst(&value("auto, off or WINDOW_MS/PERIOD_MS")?)?,
            "--mode" => {
                mode = match value("auto, marker or infer")?.as_str() {
                    "auto" => Mode::Auto,
                    "marker" => Mode::Marker,
                    "infer" => Mode::Infer,
                    m => {
                        return Err(AgentError::usage(format!(
                            "bad --mode {m:?}: expected auto, marker or infer"
                        )))
                    }
                }
            }
            "--duration" => duration = Some(parse_duration(&value("seconds")?)?),
            "--poll-us" => {
                let v = value("microseconds")?;
                poll_us = v
                    .parse()
                    .ok()
                    .filter(|&n| (50..=1_000_000).contains(&n))
                    .ok_or_else(|| {
                        AgentError::usage(format!("bad --poll-us {v:?}: expected 50..1000000"))
                    })?;
            }
            "--functions" => functions = true,
            "--fn-normal-priority" => {
                obs.idle_priority = false;
                fn_options.get_or_insert(name.clone());
            }
            "--fn-period-us" | "--fn-threshold-us" | "--mutex-threshold-us" => {
                let v = value("microseconds")?;
                let n: u64 = v.parse().ok().filter(|&n| n <= 10_000_000).ok_or_else(|| {
                    AgentError::usage(format!("bad {name} {v:?}: expected 0..10000000"))
                })?;
                match name.as_str() {
                    "--fn-period-us" => obs.period = Duration::from_micros(n),
                    "--fn-threshold-us" => obs.threshold_ns = n * 1000,
                    _ => obs.mutex_thresh_ns = (n * 1000).max(1),
                }
                fn_options.get_or_insert(name.clone());
            }
            "--dte-tolerance" => {
                let v = value("a fraction")?;
                obs.dte_tolerance = v
                    .parse()
                    .ok()
                    .filter(|f: &f64| f.is_finite() && *f > 0.0)
                    .ok_or_else(|| {
                        AgentError::usage(format!(
                            "bad --dte-tolerance {v:?}: expected a fraction above 0"
                        ))
                    })?;
                fn_options.get_or_insert(name.clone());
            }
            "--force" => force = true,
            "--quiet" | "-q" => quiet = true,
            "-h" | "--help" => return Ok(Command::Help),
            _ if name.starts_with('-') => {
                return Err(AgentError::usage(format!("unknown option {name}")))
            }
            _ => {
                return Err(AgentError::usage(format!(
                    "unexpected argument {arg:?}; put the command to launch after --"
                )))
            }
        }
    }

    let output = output.ok_or_else(|| AgentError::usage("missing -o DIR"))?;
    if let (false, Some(opt)) = (functions, &fn_options) {
        return Err(AgentError::usage(format!("{opt} needs --functions")));
    }
    if functions && mode == Mode::Infer {
        return Err(AgentError::usage(
            "--functions needs the tailscope runtime in the target; it cannot run with --mode infer",
        ));
    }
    let target = match (pid, cmd) {
        (Some(_), Some(_)) => {
            return Err(AgentError::usage("give either -p PID or -- CMD, not both"))
        }
        (Some(p), None) => Target::Pid(p),
        (None, Some(c)) if c.is_empty() => {
            return Err(AgentError::usage("missing command after --"))
        }
        (None, Some(c)) => Target::Launch(c),
        (None, None) => return Err(AgentError::usage("missing target: -p PID or -- CMD")),
    };
    Ok(Command::Record(RecordArgs {
        output,
        target,
        sample_ppm,
        burst,
        mode,
        duration,
        force,
        quiet,
        poll: Duration::from_micros(poll_us),
        functions: functions.then_some(obs),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("0.01").unwrap(), 10_000);
        assert_eq!(parse_rate("1%").unwrap(), 10_000);
        assert_eq!(parse_rate("100%").unwrap(), 1_000_000);
        assert_eq!(parse_rate("1").unwrap(), 1_000_000);
        assert_eq!(parse_rate("0.5 %").unwrap(), 5_000);
        assert_eq!(parse_rate("0.0001%").unwrap(), 1);
        assert_eq!(parse_rate("1e-3").unwrap(), 1_000);
        for bad in [
            "0", "0%", "-1%", "101%", "5", "abc", "", "%", "nan", "inf", "1e-9",
        ] {
            let e = parse_rate(bad).unwrap_err();
            assert_eq!(e.code, crate::error::exit::USAGE, "{bad}");
            assert!(!e.to_string().contains('\n'));
        }
        assert!(parse_rate("5")
            .unwrap_err()
            .to_string()
            .contains("did you mean 5%"));
        assert_eq!(format_ppm(10_000), "1%");
        assert_eq!(format_ppm(1_000_000), "100%");
    }

    fn rec(args: &[&str]) -> RecordArgs {
        match parse(args.iter().copied()).unwrap() {
            Command::Record(r) => r,
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn burst_args() {
        use crate::burst::BurstArg;
        assert_eq!(rec(&["record", "-o", "r", "-p", "1"]).burst, BurstArg::Auto);
        assert_eq!(
            rec(&["record", "-o", "r", "-p", "1", "--burst", "off"]).burst,
            BurstArg::Off
        );
        assert_eq!(
            rec(&["record", "-o", "r", "-p", "1", "--burst=10/100"]).burst,
            BurstArg::Window {
                window: Duration::from_millis(10),
                period: Duration::from_millis(100)
            }
        );
        for bad in ["100/10", "0/10", "x/10", "10", "5/70000", "sometimes"] {
            let e = parse(["record", "-o", "r", "-p", "1", "--burst", bad])
                .unwrap_err()
                .to_string();
            assert!(e.contains("bad --burst"), "{bad}: {e}");
        }
    }

    #[test]
    fn record_args() {
        let r = rec(&["record", "-o", "rec", "-p", "123"]);
        assert_eq!(r.target, Target::Pid(123));
        assert_eq!(r.sample_ppm, None);
        assert_eq!(r.mode, Mode::Auto);
        assert_eq!(r.poll, Duration::from_millis(1));
        let r = rec(&[
            "record",
            "--output=rec",
            "--sample",
            "5%",
            "--mode",
            "infer",
            "--duration",
            "2.5",
            "--force",
            "--quiet",
            "--poll-us",
            "500",
            "--",
            "redis-server",
            "--port",
            "7000",
        ]);
        assert_eq!(
            r.target,
            Target::Launch(vec!["redis-server".into(), "--port".into(), "7000".into()])
        );
        assert_eq!(r.sample_ppm, Some(50_000));
        assert_eq!(r.mode, Mode::Infer);
        assert_eq!(r.duration, Some(Duration::from_millis(2500)));
        assert!(r.force && r.quiet);
        assert_eq!(r.poll, Duration::from_micros(500));
        assert_eq!(r.functions, None);
        let r = rec(&[
            "record",
            "-o",
            "x",
            "--functions",
            "--fn-period-us",
            "0",
            "--fn-threshold-us",
            "5",
            "--",
            "srv",
        ]);
        let f = r.functions.unwrap();
        assert!(f.period.is_zero());
        assert_eq!(f.threshold_ns, 5000);
        assert!(
            f.idle_priority,
            "the observer runs at idle priority by default"
        );
        let d = rec(&["record", "-o", "x", "--functions", "--", "srv"]);
        assert_eq!(d.functions.unwrap().period, Duration::from_millis(1));
        let r = rec(&[
            "record",
            "-o",
            "x",
            "--functions",
            "--fn-normal-priority",
            "--",
            "srv",
        ]);
        assert!(!r.functions.unwrap().idle_priority);
        // Options after -- belong to the command.
        let r = rec(&["record", "-o", "x", "--", "sh", "-p", "--force"]);
        assert!(!r.force);
    }

    #[test]
    fn bad_args_are_usage_errors() {
        for args in [
            &[][..],
            &["frob"],
            &["record"],
            &["record", "-o", "x"],
            &["record", "-o", "x", "-p"],
            &["record", "-o", "x", "-p", "abc"],
            &["record", "-o", "x", "-p", "0"],
            &["record", "-o", "x", "-p", "1", "--", "ls"],
            &["record", "-o", "x", "--"],
            &["record", "-o", "x", "-p", "1", "--mode", "fast"],
            &["record", "-o", "x", "-p", "1", "--poll-us", "1"],
            &["record", "-o", "x", "-p", "1", "--duration", "-1"],
            &["record", "-o", "x", "-p", "1", "--bogus"],
            &["record", "-o", "x", "-p", "1", "stray"],
            &["record", "-o", "x", "-p", "1", "--fn-period-us", "5"],
            &[
                "record",
                "-o",
                "x",
                "-p",
                "1",
                "--functions",
                "--mode",
                "infer",
            ],
            &[
                "record",
                "-o",
                "x",
                "-p",
                "1",
                "--functions",
                "--dte-tolerance",
                "-1",
            ],
        ] {
            let e = parse(args.iter().copied()).unwrap_err();
            assert_eq!(e.code, crate::error::exit::USAGE, "{args:?}");
        }
        assert_eq!(parse(["--help"]).unwrap(), Command::Help);
        assert_eq!(parse(["record", "--help"]).unwrap(), Command::Help);
    }
}
