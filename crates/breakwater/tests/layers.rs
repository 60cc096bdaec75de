//! The tower layers end to end: the client layer in front of the server
//! layer in-process, then the same over real HTTP/2 with hyper.

use breakwater::client::ClientLayer;
use breakwater::control::{ControlKind, ControlSpec};
use breakwater::policy::none::NoControl;
use breakwater::server::{BoxError, Server, ServerConfig, ServerLayer, WorkerPriority};
use breakwater::wire;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};

type Body = Full<Bytes>;

/// Sends `per_client` requests from every pushed client at once and checks
/// that each one is served (none expires at its client).
async fn all_served(
    clients: &[breakwater::client::Client<breakwater::http::H2Transport>],
    per_client: usize,
) {
    let mut tasks = Vec::new();
    for c in clients {
        for _ in 0..per_client {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                c.oneshot(Request::new(Body::default())).await
            }));
        }
    }
    for t in tasks {
        let r = t.await.unwrap().expect("served, not expired");
        assert_eq!(r.status(), StatusCode::OK);
    }
}

fn handler(
    delay: Duration,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = BoxError, Future = impl Send>
       + Clone
       + Send {
    tower::service_fn(move |_req: Request<Body>| async move {
        std::thread::sleep(delay);
        Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

fn breakwater_server(workers: usize, delay: Duration) -> Server<Body, Body> {
    breakwater_server_slo(workers, delay, 50_000_000)
}

fn breakwater_server_slo(workers: usize, delay: Duration, slo_ns: u64) -> Server<Body, Body> {
    let spec = ControlSpec::new(ControlKind::Breakwater, slo_ns, workers as u64);
    let config = ServerConfig {
        workers,
        ..ServerConfig::default()
    };
    ServerLayer::new(spec.server().unwrap(), config)
        .unwrap()
        .layer(handler(delay))
}

fn with_headers(pairs: &[(&'static str, &str)]) -> Request<Body> {
    let mut r = Request::new(Body::default());
    for (k, v) in pairs {
        r.headers_mut()
            .insert(*k, HeaderValue::from_str(v).unwrap());
    }
    r
}

#[tokio::test]
async fn bad_metadata_gets_a_clear_status() {
    let server = breakwater_server(1, Duration::ZERO);
    type Case<'a> = (&'a [(&'static str, &'a str)], StatusCode, &'a str);
    let cases: [Case; 5] = [
        (
            &[],
            StatusCode::PRECONDITION_REQUIRED,
            "missing-credit-metadata",
        ),
        (
            &[(wire::CLIENT, "x1")],
            StatusCode::BAD_REQUEST,
            "malformed-bw-client",
        ),
        (
            &[(wire::CLIENT, "1"), (wire::DEMAND, "-3")],
            StatusCode::BAD_REQUEST,
            "malformed-bw-demand",
        ),
        // A well-formed request from a client that never registered.
        (
            &[(wire::CLIENT, "7")],
            StatusCode::TOO_MANY_REQUESTS,
            "unregistered",
        ),
        (
            &[(wire::CLIENT, "7"), (wire::KIND, "steal")],
            StatusCode::BAD_REQUEST,
            "malformed-bw-kind",
        ),
    ];
    for (headers, status, token) in cases {
        let resp = server.clone().oneshot(with_headers(headers)).await.unwrap();
        assert_eq!(resp.status(), status, "{headers:?}");
        assert_eq!(resp.headers()[wire::REJECT], token, "{headers:?}");
    }
    // Register, spend the window, then one more is refused for lack of credit.
    let reg = server
        .clone()
        .oneshot(with_headers(&[
            (wire::CLIENT, "9"),
            (wire::KIND, "register"),
        ]))
        .await
        .unwrap();
    assert_eq!(reg.status(), StatusCode::OK);
    let limit: u64 = reg.headers()[wire::CREDIT_LIMIT]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(limit >= 1);
    for _ in 1..limit {
        let r = server
            .clone()
            .oneshot(with_headers(&[(wire::CLIENT, "9")]))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    // Each response re-grants; a burst beyond the high-water mark without
    // waiting for responses is refused.
    let mut refused = 0;
    // `call` decides synchronously, so these all arrive before any answer.
    let futs: Vec<_> = (0..200)
        .map(|_| server.clone().call(with_headers(&[(wire::CLIENT, "9")])))
        .collect();
    for f in futs {
        if f.await.unwrap().status() == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
    }
    assert!(refused > 0, "a client without credit was served");
    let stats = server.stats();
    assert_eq!(stats.malformed, 4, "one missing + three malformed");
    assert_eq!(
        stats.control.issued,
        stats.control.issued.min(stats.control.control as u64 + 1)
    );
}

#[tokio::test]
async fn client_layer_in_front_of_server_layer() {
    // 2 workers, 2 ms per request: ~1000 req/s of capacity. 50 clients
    // offer 400 requests at once: the client layer must queue them
    // locally, release them as credits come back, and none may be refused
    // for lack of credit. The SLO (2 s) leaves room for all of them.
    let server = breakwater_server_slo(2, Duration::from_millis(2), 2_000_000_000);
    let spec = ControlSpec::new(ControlKind::Breakwater, 2_000_000_000, 2);
    let layer = ClientLayer::new(
        Arc::new(move || spec.client().unwrap()),
        Duration::from_secs(2),
    )
    .unwrap();
    let clients: Vec<_> = (0..50).map(|_| layer.layer(server.clone())).collect();
    let mut tasks = Vec::new();
    for i in 0..400 {
        let c = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            c.oneshot(Request::new(Body::default())).await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        assert_ne!(
            r.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "honest client refused"
        );
        if r.status() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 400, "only {ok} of 400 served");
    let stats = layer.stats();
    let waits = stats
        .credit_waits_sent
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(waits > 0, "queued clients never asked for credit");
    for c in &clients {
        c.deregister::<Body, Body>().await.unwrap();
    }
    let s = server.stats();
    assert_eq!(
        s.control.issued, 0,
        "all credits returned after deregistration: {s:?}"
    );
    assert_eq!(s.completed_ok, s.admitted);
}

#[tokio::test]
async fn requests_expire_at_the_client_without_credit() {
    // One worker stuck for 300 ms; a 50 ms client SLO: queued requests
    // fail locally with Expired and never reach the server.
    let server = breakwater_server(1, Duration::from_millis(300));
    let spec = ControlSpec::new(ControlKind::Breakwater, 50_000_000, 1);
    let layer = ClientLayer::new(
        Arc::new(move || spec.client().unwrap()),
        Duration::from_millis(50),
    )
    .unwrap();
    let client = layer.layer(server.clone());
    let first = tokio::spawn(client.clone().oneshot(Request::new(Body::default())));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut expired = 0;
    let mut others = Vec::new();
    for _ in 0..20 {
        others.push(tokio::spawn(
            client.clone().oneshot(Request::new(Body::default())),
        ));
    }
    for o in others {
        if let Err(e) = o.await.unwrap() {
            if e.downcast_ref::<breakwater::ClientError>().is_some() {
                expired += 1;
            }
        }
    }
    first.await.unwrap().unwrap();
    assert!(expired > 0, "nothing expired");
    assert!(
        server.stats().arrivals < 21 + 5,
        "expired requests reached the server"
    );
}

#[tokio::test]
async fn a_requests_own_deadline_bounds_its_wait_and_the_budget_it_sends() {
    use breakwater::client::Deadline;
    // The inner service records each request's advertised budget and
    // grants plenty of credit; the layer's SLO is 10 s.
    let budgets = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = budgets.clone();
    let inner = tower::service_fn(move |req: Request<Body>| {
        let b: u64 = req.headers()[wire::BUDGET_US]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        seen.lock().unwrap().push(b);
        async move {
            let mut r = Response::new(Body::default());
            r.headers_mut()
                .insert(wire::CREDIT_LIMIT, HeaderValue::from_static("1000"));
            Ok::<_, BoxError>(r)
        }
    });
    let spec = ControlSpec::new(ControlKind::Breakwater, 10_000_000_000, 1);
    let layer = ClientLayer::new(
        Arc::new(move || spec.client().unwrap()),
        Duration::from_secs(10),
    )
    .unwrap();
    let client = layer.layer(inner);
    let with_deadline = |d: u64| {
        let mut r = Request::new(Body::default());
        r.extensions_mut().insert(Deadline(d));
        r
    };
    let now = breakwater::clock::now();
    // 5 ms left: it says so (not the layer's 10 s).
    let r = client
        .clone()
        .oneshot(with_deadline(now + 5_000_000))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // Already past: fails at once, unsent.
    let now = breakwater::clock::now();
    let e = client
        .clone()
        .oneshot(with_deadline(now.saturating_sub(1)))
        .await
        .unwrap_err();
    assert!(matches!(
        e.downcast_ref::<breakwater::ClientError>(),
        Some(breakwater::ClientError::Expired)
    ));
    // Later than the layer's SLO: capped at it. No deadline: the SLO.
    let now = breakwater::clock::now();
    client
        .clone()
        .oneshot(with_deadline(now + 100_000_000_000))
        .await
        .unwrap();
    client
        .clone()
        .oneshot(Request::new(Body::default()))
        .await
        .unwrap();
    let b = budgets.lock().unwrap().clone();
    assert_eq!(b.len(), 3, "the expired request was sent: {b:?}");
    assert!(b[0] > 0 && b[0] <= 5_000, "{b:?}");
    assert!(b[1] > 9_000_000 && b[1] <= 10_000_000, "{b:?}");
    assert!(b[2] > 9_000_000 && b[2] <= 10_000_000, "{b:?}");
    assert_eq!(
        layer
            .stats()
            .expired
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn tower_stock_limit_sheds() {
    let inner = Server::start(
        handler(Duration::from_millis(20)),
        Box::new(NoControl),
        ServerConfig::default(),
    );
    let svc = tower::ServiceBuilder::new()
        .load_shed()
        .concurrency_limit(2)
        .service(inner);
    let futs: Vec<_> = (0..10)
        .map(|_| tokio::spawn(svc.clone().oneshot(Request::new(Body::default()))))
        .collect();
    let mut shed = 0;
    for f in futs {
        if let Err(e) = f.await.unwrap() {
            assert!(e.is::<tower::load_shed::error::Overloaded>());
            shed += 1;
        }
    }
    assert!(shed >= 5, "shed {shed}");
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn idle_priority_workers_run_in_sched_idle() {
    // The handler reports its own scheduling class: with
    // `WorkerPriority::Idle` every request must run in SCHED_IDLE (so the
    // I/O thread preempts it), with the default in the normal class.
    let class = tower::service_fn(|_req: Request<Body>| async move {
        // SAFETY: queries the calling thread's policy; touches no memory.
        let policy = unsafe { libc::sched_getscheduler(0) };
        let status = if policy == libc::SCHED_IDLE {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        };
        let mut r = Response::new(Body::default());
        *r.status_mut() = status;
        Ok::<_, BoxError>(r)
    });
    for (priority, want) in [
        (WorkerPriority::Idle, StatusCode::OK),
        (WorkerPriority::Normal, StatusCode::ACCEPTED),
    ] {
        let config = ServerConfig {
            workers: 2,
            worker_priority: priority,
            ..ServerConfig::default()
        };
        let server: Server<Body, Body> = ServerLayer::new(Box::new(NoControl), config)
            .unwrap()
            .layer(class);
        for _ in 0..4 {
            let r = server
                .clone()
                .oneshot(Request::new(Body::default()))
                .await
                .unwrap();
            assert_eq!(r.status(), want, "{priority:?}");
        }
    }
}

#[test]
fn zero_workers_and_zero_slo_are_refused() {
    let policy = ControlSpec::new(ControlKind::Breakwater, 1_000_000, 1)
        .server()
        .unwrap();
    let bad = ServerConfig {
        workers: 0,
        ..ServerConfig::default()
    };
    assert!(ServerLayer::<Body, Body>::new(policy, bad).is_err());
    let spec = ControlSpec::new(ControlKind::Breakwater, 1_000_000, 1);
    assert!(ClientLayer::new(Arc::new(move || spec.client().unwrap()), Duration::ZERO).is_err());
}

#[test]
fn over_real_http2() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spec = ControlSpec::new(ControlKind::Breakwater, 100_000_000, 1);
        let server: Server<hyper::body::Incoming, Body> =
            ServerLayer::new(spec.server().unwrap(), ServerConfig::default())
                .unwrap()
                .layer(tower::service_fn(
                    |_req: Request<hyper::body::Incoming>| async {
                        Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"hi"))))
                    },
                ));
        tokio::spawn(breakwater::http::serve(listener, server, 256));
        let transport = breakwater::http::H2Transport::connect(addr).await.unwrap();
        // Without the client layer: no credit metadata, refused with 428.
        let raw = transport
            .clone()
            .oneshot(Request::new(Body::default()))
            .await
            .unwrap();
        assert_eq!(raw.status(), StatusCode::PRECONDITION_REQUIRED);
        let layer = ClientLayer::new(
            Arc::new(move || spec.client().unwrap()),
            Duration::from_secs(1),
        )
        .unwrap();
        let client = layer.layer(transport);
        for _ in 0..20 {
            let r = client
                .clone()
                .oneshot(Request::new(Body::default()))
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.body().as_ref(), b"hi");
            assert!(r.headers().contains_key(wire::CREDIT_LIMIT));
        }
    });
}

#[test]
fn io_thread_slice_is_set_clamped_and_reset() {
    use breakwater::server::set_thread_slice;
    // On a thread of its own: the slice stays with the thread.
    std::thread::spawn(|| {
        let asked = Duration::from_micros(300);
        let got = match set_thread_slice(Some(asked)) {
            Ok(Some(s)) => s,
            Ok(None) => {
                eprintln!("skipped: the kernel reports no custom time slice (needs Linux >= 6.12)");
                return;
            }
            Err(e) => {
                eprintln!("skipped: sched_setattr refused a custom slice: {e}");
                return;
            }
        };
        assert_eq!(got, asked, "the kernel did not take the slice asked for");
        // Below the kernel's 0.1 ms floor: clamped, not refused.
        let floor = set_thread_slice(Some(Duration::from_micros(10)))
            .unwrap()
            .unwrap();
        assert_eq!(floor, Duration::from_micros(100));
        // Back to the default: no longer the slice we asked for.
        let back = set_thread_slice(None).unwrap();
        assert_ne!(back, Some(Duration::from_micros(100)));
    })
    .join()
    .unwrap();
}

/// `carry` + `hold_expired` through both layers: a drained client's request
/// held at the server past its SLO is reported `Expired` to its caller at
/// its deadline plus one SLO, though the server has not answered; the client
/// sends nothing more until the server answers (`expired`, with a credit)
/// once the pool frees, and then sends at once on that credit.
#[tokio::test]
async fn expired_held_requests_keep_the_client_quiet_until_credit() {
    let slo = Duration::from_millis(20);
    let mut spec = ControlSpec::new(ControlKind::Breakwater, slo.as_nanos() as u64, 1);
    spec.carry = true;
    spec.hold_expired = true;
    spec.rtt_ns = 10_000_000_000; // no pool updates: C_total stays 1
    let sleepy = tower::service_fn(|req: Request<Body>| async move {
        let ms = req
            .headers()
            .get("x-sleep-ms")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        std::thread::sleep(Duration::from_millis(ms));
        Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    let config = ServerConfig {
        workers: 1,
        ..ServerConfig::default()
    };
    let server: Server<Body, Body> = ServerLayer::new(spec.server().unwrap(), config)
        .unwrap()
        .layer(sleepy);
    let layer = ClientLayer::new(Arc::new(move || spec.client().unwrap()), slo).unwrap();
    let a = layer.layer(server.clone());
    let b = layer.layer(server.clone());
    let call = |c: &breakwater::client::Client<Server<Body, Body>>, sleep_ms: u64| {
        let mut r = Request::new(Body::default());
        r.headers_mut()
            .insert("x-sleep-ms", HeaderValue::from(sleep_ms));
        c.clone().oneshot(r)
    };
    // Register both (A keeps the pool's one credit, B is left with none).
    assert_eq!(call(&a, 0).await.unwrap().status(), StatusCode::OK);
    assert_eq!(call(&b, 0).await.unwrap().status(), StatusCode::OK);
    // A's credited request holds the worker (and the credit) for 250 ms.
    let slow = tokio::spawn(call(&a, 250));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let t0 = std::time::Instant::now();
    let held = call(&b, 0).await;
    let waited = t0.elapsed();
    let err = held.expect_err("B's held request cannot have run");
    assert!(
        matches!(
            err.downcast_ref::<breakwater::ClientError>(),
            Some(breakwater::ClientError::Expired)
        ),
        "{err}"
    );
    assert!(
        waited < Duration::from_millis(150),
        "the caller waited for the server's answer: {waited:?}"
    );
    // B is quiet while its credit wait is held: this one expires locally.
    let arrivals = server.stats().arrivals;
    let quiet = call(&b, 0).await;
    assert!(quiet.is_err(), "B sent while its credit wait was held");
    assert_eq!(
        server.stats().arrivals,
        arrivals,
        "B's request reached the server"
    );
    assert_eq!(
        server.stats().held_expired,
        0,
        "answered before a credit freed"
    );
    slow.await.unwrap().unwrap();
    // A's completion frees the credit: B's held request is answered with it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let s = server.stats();
    assert_eq!(s.held_expired, 1, "{s:?}");
    let r = call(&b, 0).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        server.stats().arrivals,
        s.arrivals + 1,
        "sent on the credit, no wait"
    );
}

/// Server-pushed credits over real HTTP/2: drained clients send no credit
/// wait, their queued requests go out on credits the server pushes (riding
/// on responses to other clients of the connection or on the credit
/// stream), and every request is served. A server without credit streams
/// refuses the subscription, so clients keep the thesis's credit waits.
#[test]
fn pushed_credits_replace_credit_waits_over_real_http2() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A generous SLO: nothing may expire even on a loaded CI box.
        let spec = ControlSpec::new(ControlKind::Breakwater, 2_000_000_000, 1);
        let make_server = || -> Server<hyper::body::Incoming, Body> {
            ServerLayer::new(spec.server().unwrap(), ServerConfig::default())
                .unwrap()
                .layer(tower::service_fn(
                    |_req: Request<hyper::body::Incoming>| async {
                        std::thread::sleep(Duration::from_millis(1));
                        Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"hi"))))
                    },
                ))
        };
        // A plain `serve` does not answer subscriptions.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain_addr = plain.local_addr().unwrap();
        tokio::spawn(breakwater::http::serve(plain, make_server(), 256));
        let t = breakwater::http::H2Transport::connect(plain_addr)
            .await
            .unwrap();
        assert!(t.open_credit_stream().await.is_err());

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = make_server();
        let stats = server.clone();
        let hub = server.push_hub();
        tokio::spawn(breakwater::http::serve_with_push(
            listener, server, hub, 256,
        ));
        let transport = breakwater::http::H2Transport::connect(addr).await.unwrap();
        let link = transport.open_credit_stream().await.unwrap();
        assert!(link.is_live());
        let spec2 = spec.clone();
        let layer = ClientLayer::new(
            Arc::new(move || spec2.client().unwrap()),
            Duration::from_secs(2),
        )
        .unwrap();
        let clients: Vec<_> = (0..20)
            .map(|_| layer.layer_pushed(transport.clone(), &link))
            .collect();
        all_served(&clients, 5).await;
        let cs = layer.stats();
        assert_eq!(
            cs.credit_waits_sent
                .load(std::sync::atomic::Ordering::Relaxed),
            0,
            "a pushed client never asks for credit"
        );
        assert!(
            cs.pushed_received
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        );
        let s = stats.stats();
        assert_eq!(s.credit_waits, 0);
        assert_eq!(s.completed_ok, 100);
        assert!(s.pushed_credits > 0, "{s:?}");
    });
}

/// Demand lines over real HTTP/2 (session 10): the subscription asks for
/// them, the server echoes it, drained clients send one when a request
/// starts waiting, and every line sent reaches the server; all requests
/// are served with no credit wait. A hub that refuses demand lines is not
/// sent any, and its clients are still served (speculative pushes).
#[test]
fn demand_lines_flow_on_the_credit_streams_request_body_over_real_http2() {
    use std::sync::atomic::Ordering::Relaxed;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for accept in [true, false] {
            // A generous SLO: nothing may expire even on a loaded CI box.
            let spec = ControlSpec::new(ControlKind::Breakwater, 2_000_000_000, 1);
            let server: Server<hyper::body::Incoming, Body> =
                ServerLayer::new(spec.server().unwrap(), ServerConfig::default())
                    .unwrap()
                    .layer(tower::service_fn(
                        |_req: Request<hyper::body::Incoming>| async {
                            std::thread::sleep(Duration::from_millis(1));
                            Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"hi"))))
                        },
                    ));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let stats = server.clone();
            let hub = server.push_hub();
            hub.set_accept_demand(accept);
            hub.set_demand_sample(1); // every transition: lines are certain
            tokio::spawn(breakwater::http::serve_with_push(
                listener, server, hub, 256,
            ));
            let transport = breakwater::http::H2Transport::connect(addr).await.unwrap();
            let link = transport.open_credit_stream().await.unwrap();
            assert_eq!(link.signals_demand(), accept, "echoed only when accepted");
            let spec2 = spec.clone();
            let layer = ClientLayer::new(
                Arc::new(move || spec2.client().unwrap()),
                Duration::from_secs(2),
            )
            .unwrap();
            let clients: Vec<_> = (0..20)
                .map(|_| layer.layer_pushed(transport.clone(), &link))
                .collect();
            // Rounds: every client's requests wait behind its first, so
            // drained clients with waiting requests are certain.
            for _ in 0..3 {
                all_served(&clients, 3).await;
            }
            let cs = layer.stats();
            assert_eq!(cs.credit_waits_sent.load(Relaxed), 0);
            let sent = cs.demand_sent.load(Relaxed);
            if accept {
                assert!(sent > 0, "no demand line sent");
                // Lines travel apart from the responses: wait (bounded) for
                // the last to arrive.
                let t0 = std::time::Instant::now();
                while stats.stats().demand_lines < sent && t0.elapsed() < Duration::from_secs(30) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            } else {
                assert_eq!(sent, 0, "lines sent to a server that does not read them");
            }
            let s = stats.stats();
            assert_eq!(s.demand_lines, sent, "every line sent arrives: {s:?}");
            assert_eq!(s.credit_waits, 0);
            assert_eq!(s.completed_ok, 180);
        }
    });
}

/// A pushed client whose requests wait for a pushed credit must not stay
/// stuck when its credit stream ends: the waiters make it send a credit
/// wait. The "server" is scripted (register: edge 1, so the next request
/// has no credit; credit wait: edge 10) and the stream is a real
/// `PushHub` feed that `close` ends. The SLO is 60 s: without the wake-up
/// the second request would sit until then (the test allows it 20 s).
#[test]
fn waiters_fall_back_to_a_credit_wait_when_the_credit_stream_ends() {
    use breakwater::policy::breakwater::BreakwaterClient;
    use breakwater::{ClientPolicy, Feedback, Kind};
    use std::sync::atomic::{AtomicU64, Ordering};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let waits = Arc::new(AtomicU64::new(0));
        let w = waits.clone();
        let mock = tower::service_fn(move |req: Request<Body>| {
            let w = w.clone();
            async move {
                let a = wire::parse_arrival(req.headers()).unwrap().unwrap();
                let edge = match a.kind {
                    Kind::Register => 1,
                    Kind::CreditWait => {
                        w.fetch_add(1, Ordering::SeqCst);
                        10
                    }
                    _ => 0,
                };
                let mut r = Response::new(Full::new(Bytes::from_static(b"ok")));
                if edge > 0 {
                    wire::write_feedback(r.headers_mut(), Feedback::CreditLimit(edge));
                }
                Ok::<_, BoxError>(r)
            }
        });
        let hub = breakwater::push::PushHub::new();
        let conn = hub.next_conn();
        let link = breakwater::client::PushLink::new();
        let feed = hub.subscribe(conn, link.stream_id());
        link.set_live(true);
        let reader = tokio::spawn(link.clone().run(feed));
        let layer = ClientLayer::new(
            Arc::new(|| Box::new(BreakwaterClient::new()) as Box<dyn ClientPolicy>),
            Duration::from_secs(60),
        )
        .unwrap();
        let mut client = layer.layer_pushed(mock, &link);
        let first = client
            .ready()
            .await
            .unwrap()
            .call(Request::new(Body::default()))
            .await;
        assert!(first.is_ok(), "register: {:?}", first.err());
        // No credit left, the stream is live: this one waits for a push.
        let mut c2 = client.clone();
        let second = tokio::spawn(async move {
            c2.ready()
                .await
                .unwrap()
                .call(Request::new(Body::default()))
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            waits.load(Ordering::SeqCst),
            0,
            "a pushed client sends no credit wait"
        );
        hub.close();
        tokio::time::timeout(Duration::from_secs(20), reader)
            .await
            .expect("the stream ends when the hub closes")
            .unwrap();
        assert!(!link.is_live());
        let got = tokio::time::timeout(Duration::from_secs(20), second)
            .await
            .expect("the waiting request must not wait out its 60 s SLO")
            .unwrap();
        assert!(got.is_ok(), "served after a credit wait: {:?}", got.err());
        assert_eq!(waits.load(Ordering::SeqCst), 1, "exactly one credit wait");
        assert_eq!(layer.stats().expired.load(Ordering::SeqCst), 0);
    });
}

/// One worker, inline on the runtime that calls the layer.
fn inline_config() -> ServerConfig {
    ServerConfig {
        workers: 1,
        worker_priority: WorkerPriority::Inline,
        ..ServerConfig::default()
    }
}

/// `WorkerPriority::Inline`: no worker thread; the worker runs each job on
/// the thread of the runtime that calls the layer, in FIFO order, one job
/// per turn, and the layer still answers everything (with Breakwater's
/// feedback on the responses).
#[tokio::test]
async fn inline_worker_runs_jobs_on_the_runtime_thread_in_fifo_order() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let inner = tower::service_fn(move |req: Request<Body>| {
        let record = record.clone();
        async move {
            let tag = req
                .headers()
                .get("x-tag")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let name = std::thread::current().name().unwrap_or("").to_string();
            record
                .lock()
                .unwrap()
                .push((tag, std::thread::current().id(), name));
            Ok::<_, BoxError>(Response::new(Body::default()))
        }
    });
    let spec = ControlSpec::new(ControlKind::Breakwater, 50_000_000, 1);
    let config = inline_config();
    let server: Server<Body, Body> = ServerLayer::new(spec.server().unwrap(), config)
        .unwrap()
        .layer(inner);
    let here = std::thread::current().id();
    // Five clients register at once: all are queued before the worker's
    // first turn (this task has not yielded: `call` only queues), then
    // served in order. (The layer is always ready: no poll_ready needed.)
    let futs: Vec<_> = (0..5)
        .map(|i| {
            let id = (100 + i).to_string();
            let req = with_headers(&[
                (wire::CLIENT, &id),
                (wire::KIND, "register"),
                ("x-tag", &i.to_string()),
            ]);
            server.clone().call(req)
        })
        .collect();
    assert_eq!(server.stats().queue_len, 5, "queued, none run yet");
    for (i, r) in futures_join(futs).await.into_iter().enumerate() {
        let r = r.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        assert!(
            r.headers().contains_key(wire::CREDIT_LIMIT),
            "request {i}: no credit feedback: {:?}",
            r.headers()
        );
    }
    let seen = seen.lock().unwrap().clone();
    let tags: Vec<&str> = seen.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_eq!(tags, ["0", "1", "2", "3", "4"], "FIFO order: {seen:?}");
    for (tag, thread, name) in &seen {
        assert_eq!(
            *thread, here,
            "job {tag} ran on {name:?}, not on the runtime's thread"
        );
    }
    assert_eq!(server.stats().completed_ok, 5);
    // An inline worker is one worker.
    let two = ServerConfig {
        workers: 2,
        worker_priority: WorkerPriority::Inline,
        ..ServerConfig::default()
    };
    assert!(ServerLayer::<Body, Body>::new(spec.server().unwrap(), two).is_err());
}

/// A handler that panics fails its own request; the worker lives on and
/// answers the next one (inline and thread workers alike).
#[tokio::test]
async fn a_panicking_handler_fails_its_request_and_the_worker_lives_on() {
    for priority in [WorkerPriority::Inline, WorkerPriority::Normal] {
        let inner = tower::service_fn(|req: Request<Body>| async move {
            if req.headers().contains_key("x-panic") {
                panic!("handler panic (expected by the test)");
            }
            Ok::<_, BoxError>(Response::new(Body::default()))
        });
        let spec = ControlSpec::new(ControlKind::Breakwater, 50_000_000, 1);
        let config = ServerConfig {
            workers: 1,
            worker_priority: priority,
            ..ServerConfig::default()
        };
        let server: Server<Body, Body> = ServerLayer::new(spec.server().unwrap(), config)
            .unwrap()
            .layer(inner);
        let bad = with_headers(&[
            (wire::CLIENT, "7"),
            (wire::KIND, "register"),
            ("x-panic", "1"),
        ]);
        let first = tokio::time::timeout(Duration::from_secs(30), server.clone().call(bad))
            .await
            .unwrap_or_else(|_| panic!("{priority:?}: the panicking request was never answered"));
        let failed = match first {
            Err(_) => true,
            Ok(r) => r.status().is_server_error(),
        };
        assert!(
            failed,
            "{priority:?}: a panicking handler's request must fail"
        );
        let good = with_headers(&[(wire::CLIENT, "8"), (wire::KIND, "register")]);
        let second = tokio::time::timeout(Duration::from_secs(30), server.clone().call(good))
            .await
            .unwrap_or_else(|_| panic!("{priority:?}: the worker died with the panicking handler"))
            .unwrap();
        assert_eq!(second.status(), StatusCode::OK, "{priority:?}");
        assert_eq!(server.stats().completed_ok, 1, "{priority:?}");
    }
}

/// The inline worker runs one job per turn: a task that a job wakes (as a
/// reply or a newly readable socket wakes a connection's task) runs before
/// the next job starts.
#[tokio::test]
async fn inline_worker_lets_other_tasks_run_between_jobs() {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Job i tells another task its number; that task stores i + 1 in
    // `acked`. Job i records `acked` when it starts: i if the other task
    // ran after job i − 1.
    let acked = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let (a, record) = (acked.clone(), seen.clone());
    let inner = tower::service_fn(move |_req: Request<Body>| {
        let (a, record, tx) = (a.clone(), record.clone(), tx.clone());
        async move {
            let mut seen = record.lock().unwrap();
            let i = seen.len() as u64;
            seen.push(a.load(Ordering::SeqCst));
            let _ = tx.send(i);
            Ok::<_, BoxError>(Response::new(Body::default()))
        }
    });
    let a = acked.clone();
    let other = tokio::spawn(async move {
        while let Some(i) = rx.recv().await {
            a.store(i + 1, Ordering::SeqCst);
        }
    });
    four_inline_requests(inner).await;
    other.abort();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [0, 1, 2, 3],
        "the task a job woke did not run before the next job (acked at each job's start)"
    );
}

/// What a socket poll brings in is answered before the next job: a task
/// woken by the runtime's I/O driver (a connection with a new request)
/// that spawns another task (hyper's stream task that sends a refusal) —
/// both run before the inline worker's next job.
#[cfg(unix)]
#[tokio::test]
async fn inline_worker_lets_socket_work_and_its_spawns_run_between_jobs() {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::AsyncReadExt;
    let (std_end, tokio_end) = std::os::unix::net::UnixStream::pair().unwrap();
    tokio_end.set_nonblocking(true).unwrap();
    let mut tokio_end = tokio::net::UnixStream::from_std(tokio_end).unwrap();
    let std_end = Arc::new(std::sync::Mutex::new(std_end));
    // Job i writes byte i; the reader (woken by the driver) spawns a task
    // that stores i + 1 in `acked`. Job i records `acked` at its start.
    let acked = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (a, record, w) = (acked.clone(), seen.clone(), std_end.clone());
    let inner = tower::service_fn(move |_req: Request<Body>| {
        let (a, record, w) = (a.clone(), record.clone(), w.clone());
        async move {
            let mut seen = record.lock().unwrap();
            let i = seen.len() as u8;
            seen.push(a.load(Ordering::SeqCst));
            w.lock().unwrap().write_all(&[i]).unwrap();
            Ok::<_, BoxError>(Response::new(Body::default()))
        }
    });
    let a = acked.clone();
    let reader = tokio::spawn(async move {
        let mut b = [0u8; 1];
        while tokio_end.read_exact(&mut b).await.is_ok() {
            let (a, i) = (a.clone(), b[0] as u64);
            tokio::spawn(async move { a.store(i + 1, Ordering::SeqCst) });
        }
    });
    four_inline_requests(inner).await;
    reader.abort();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [0, 1, 2, 3],
        "socket work (and what it spawned) did not run before the next job (acked at each job's start)"
    );
}

/// Four requests through a layer (no control) with the inline worker around
/// `inner`, each answered OK; within 30 s, so that a worker that never runs
/// fails the test instead of hanging it.
async fn four_inline_requests<S>(inner: S)
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: 'static,
{
    let server: Server<Body, Body> = ServerLayer::new(Box::new(NoControl), inline_config())
        .unwrap()
        .layer(inner);
    let futs: Vec<_> = (0..4)
        .map(|_| server.clone().call(Request::new(Body::default())))
        .collect();
    let replies = tokio::time::timeout(Duration::from_secs(30), futures_join(futs))
        .await
        .expect("the inline worker did not answer 4 requests within 30 s");
    for r in replies {
        assert_eq!(r.unwrap().status(), StatusCode::OK);
    }
}

async fn futures_join<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    let handles: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await);
    }
    out
}
