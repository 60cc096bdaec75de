//! `tailscope-loadgen` binary: parse flags, run, report. Errors are one
//! line on stderr and a non-zero exit (2 for bad usage, 1 for run failures).

use clap::Parser;
use std::process::ExitCode;
use tailscope_loadgen::{cli::Args, report};

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match args.to_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tailscope-loadgen: error: {e}");
            return ExitCode::from(2);
        }
    };
    let summary = match tailscope_loadgen::run(&config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tailscope-loadgen: error: {e}");
            return ExitCode::from(1);
        }
    };
    if !args.quiet {
        eprint!("{}", report::human(&summary));
    }
    let outputs = [
        (args.json.as_deref(), report::json as fn(&_) -> String),
        (args.csv.as_deref(), report::csv),
    ];
    for (path, render) in outputs {
        if let Some(path) = path {
            if let Err(e) = report::write_to(path, &render(&summary)) {
                eprintln!("tailscope-loadgen: error: {e}");
                return ExitCode::from(1);
            }
        }
    }
    if let Some(path) = args.requests_out.as_deref() {
        if let Err(e) = std::fs::write(path, report::requests_bytes(&summary)) {
            eprintln!("tailscope-loadgen: error: cannot write {path}: {e}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
