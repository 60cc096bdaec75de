//! The client side of the example: logical clients, each wrapped in the
//! Breakwater client layer, sharing one HTTP/2 connection to `bw-server`.
//!
//! ```text
//! bw-server --listen 127.0.0.1:8080 &
//! bw-client --target 127.0.0.1:8080 --clients 100 --rate 2000 --duration 2
//! ```
//!
//! It prints what happened to the requests: answered, refused by the
//! server (with the `bw-reject` reason), expired waiting for credit.

use breakwater::client::ClientError;
use breakwater::control::{ControlKind, ControlSpec};
use breakwater::http::H2Transport;
use breakwater::rng::SplitMix64;
use breakwater::ClientLayer;
use bytes::Bytes;
use clap::Parser;
use http::Request;
use http_body_util::Full;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::{Layer, Service};

#[derive(Debug, Parser)]
#[command(name = "bw-client", about = "Breakwater client layer over HTTP/2")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8080")]
    target: String,
    #[arg(long, default_value = "breakwater")]
    control: String,
    #[arg(long, default_value = "100")]
    clients: usize,
    /// Requests per second, Poisson, over all clients.
    #[arg(long, default_value = "2000")]
    rate: f64,
    #[arg(long, default_value = "2")]
    duration: f64,
    #[arg(long, default_value = "2000")]
    slo_us: u64,
    /// Subscribe the connection's credit stream: drained clients wait for
    /// credits the server pushes instead of sending credit waits.
    #[arg(long)]
    push: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bw-client: error: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    if !(args.rate > 0.0 && args.duration > 0.0) || args.clients == 0 || args.slo_us == 0 {
        return Err("--rate, --duration, --clients and --slo-us must be > 0".into());
    }
    let kind: ControlKind = args.control.parse()?;
    let spec = ControlSpec::new(kind, args.slo_us * 1000, 1);
    spec.client().map_err(|e| e.to_string())?;
    let addr = args
        .target
        .parse()
        .map_err(|e| format!("bad --target {:?}: {e}", args.target))?;
    let transport = H2Transport::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", args.target))?;
    // One layer, many logical clients: each `layer()` is a new client with
    // its own id and credits.
    let layer = ClientLayer::new(
        Arc::new(move || spec.client().expect("validated")),
        Duration::from_micros(args.slo_us),
    )
    .map_err(|e| e.to_string())?;
    let link = if args.push {
        Some(
            transport
                .open_credit_stream()
                .await
                .map_err(|e| format!("--push: {e}"))?,
        )
    } else {
        None
    };
    let clients: Vec<_> = (0..args.clients)
        .map(|_| match &link {
            Some(link) => layer.layer_pushed(transport.clone(), link),
            None => layer.layer(transport.clone()),
        })
        .collect();
    let outcomes = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let mut rng = SplitMix64::new(1);
    let start = Instant::now();
    let mut next = 0.0f64;
    let mut tasks = Vec::new();
    while next < args.duration {
        next += rng.exponential(1.0 / args.rate);
        tokio::time::sleep_until((start + Duration::from_secs_f64(next)).into()).await;
        let mut client = clients[rng.below(clients.len() as u64) as usize].clone();
        let outcomes = outcomes.clone();
        tasks.push(tokio::spawn(async move {
            let result = client.call(Request::new(Full::new(Bytes::new()))).await;
            let key = match result {
                Ok(r) if r.status().is_success() => "ok".to_string(),
                Ok(r) => format!(
                    "refused {} {}",
                    r.status().as_u16(),
                    r.headers()
                        .get(breakwater::wire::REJECT)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                ),
                Err(e) => match e.downcast_ref::<ClientError>() {
                    Some(ClientError::Expired) => "expired at client".into(),
                    Some(ClientError::Dropped) => "dropped at client".into(),
                    None => format!("transport error: {e}"),
                },
            };
            *outcomes.lock().unwrap().entry(key).or_default() += 1;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    for c in &clients {
        let _ = c.deregister::<Full<Bytes>, Bytes>().await;
    }
    for (k, v) in outcomes.lock().unwrap().iter() {
        println!("{v:>8}  {k}");
    }
    Ok(())
}
