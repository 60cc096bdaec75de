//! `tailscope-agent`: see `tailscope-agent --help` and the crate docs.

use tailscope_agent::cli::{self, Command, USAGE};
use tailscope_agent::error::{exit, AgentError};
use tailscope_agent::recorder;

fn main() {
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| {
            a.into_string()
                .map_err(|a| AgentError::usage(format!("argument {a:?} is not valid UTF-8")))
        })
        .collect();
    let outcome = args.and_then(cli::parse).and_then(|c| match c {
        Command::Help => {
            print!("{USAGE}");
            Ok(())
        }
        Command::Version => {
            println!("tailscope-agent {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Record(a) => recorder::run(a),
    });
    std::process::exit(match outcome {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("tailscope-agent: {e}");
            e.code
        }
    });
}
