//! The control metadata on the wire: HTTP/2 headers (gRPC metadata is the
//! same thing), one small decimal per header.
//!
//! | header | direction | meaning |
//! |---|---|---|
//! | `bw-client` | request | client id (u64) |
//! | `bw-kind` | request | `request` (default), `register`, `wait`, `await` (a request sent without credit, held until the server has one), `deregister` |
//! | `bw-demand` | request | requests queued at the client behind this one |
//! | `bw-budget-us` | request | the client's remaining time for this request (relative) |
//! | `bw-priority` | request | DAGOR priority, 1 (most important) ..= 128 |
//! | `bw-credit-limit` | response | cumulative credit edge (absolute) |
//! | `bw-threshold` | response | DAGOR admission threshold |
//! | `bw-reject` | response | why a request was refused (with its status) |
//! | `bw-subscribe` | request | open this connection's credit stream, named by a u64 (see [`crate::push`]) |
//! | `bw-stream` | request (`register`) | the credit stream explicit credits for this client go to |
//! | `bw-push` | response | explicit credits for *other* clients of the same credit stream, riding on this response: `<client>:<limit>,...` |
//! | `bw-signals` | request (`bw-subscribe`), echoed | `demand`: the subscription's request body carries demand lines (see [`crate::push`]) |
//!
//! A credit stream's body is a sequence of lines `<client> <limit>\n`,
//! each an explicit credit: the client's new cumulative edge. Its request
//! body, with `bw-signals: demand`, is a sequence of demand lines
//! `<client> <demand> <budget_us>\n` from drained clients of that
//! connection.
//! A message without `bw-client` is "missing metadata" (428 where the
//! policy requires it); a header that does not parse is "malformed" (400).

use crate::policy::{Arrival, Feedback, Kind, Nanos, RejectReason};
use http::{HeaderMap, HeaderValue, StatusCode};

pub const CLIENT: &str = "bw-client";
pub const KIND: &str = "bw-kind";
pub const DEMAND: &str = "bw-demand";
pub const BUDGET_US: &str = "bw-budget-us";
pub const PRIORITY: &str = "bw-priority";
pub const CREDIT_LIMIT: &str = "bw-credit-limit";
pub const THRESHOLD: &str = "bw-threshold";
pub const REJECT: &str = "bw-reject";
pub const SUBSCRIBE: &str = "bw-subscribe";
pub const STREAM: &str = "bw-stream";
pub const PUSH: &str = "bw-push";
pub const SIGNALS: &str = "bw-signals";
/// The `bw-signals` value of a subscription whose request body carries
/// demand lines.
pub const SIGNALS_DEMAND: &str = "demand";

/// At most this many explicit credits ride in one response's `bw-push`
/// (≤ 42 bytes each: ~2.7 KB, far under h2's default 16 KiB header list
/// limit, which an unbounded list passed at ~400 entries and turned the
/// response into a connection error). [`write_pushes`] leaves the rest for
/// the credit stream.
pub const MAX_PUSH_PER_RESPONSE: usize = 64;

/// Write up to [`MAX_PUSH_PER_RESPONSE`] explicit credits from the front of
/// `grants` into a response's `bw-push` header, removing them; what does
/// not fit stays in `grants` (send it on the credit stream). Returns how
/// many were written.
pub fn write_pushes(headers: &mut HeaderMap, grants: &mut Vec<(u64, Feedback)>) -> usize {
    use std::fmt::Write;
    let take = grants.len().min(MAX_PUSH_PER_RESPONSE);
    let mut v = String::new();
    let mut written = 0;
    for (client, fb) in grants.drain(..take) {
        if let Feedback::CreditLimit(limit) = fb {
            if !v.is_empty() {
                v.push(',');
            }
            let _ = write!(v, "{client}:{limit}");
            written += 1;
        }
    }
    if written > 0 {
        if let Ok(v) = HeaderValue::from_str(&v) {
            headers.insert(PUSH, v);
        }
    }
    written
}

/// Read a response's `bw-push` explicit credits into `out`; entries that
/// do not parse are skipped.
pub fn parse_pushes(headers: &HeaderMap, out: &mut Vec<(u64, u64)>) {
    let Some(v) = headers.get(PUSH).and_then(|v| v.to_str().ok()) else {
        return;
    };
    for item in v.split(',') {
        if let Some((c, l)) = item.split_once(':') {
            if let (Ok(c), Ok(l)) = (c.parse(), l.parse()) {
                out.push((c, l));
            }
        }
    }
}

/// The credit stream a request names (`bw-subscribe` or `bw-stream`):
/// `Ok(None)` when absent, malformed otherwise.
pub fn parse_stream(headers: &HeaderMap, name: &'static str) -> Result<Option<u64>, WireError> {
    number::<u64>(headers, name)
}

/// Append one explicit credit to a credit-stream chunk.
pub fn encode_push(out: &mut Vec<u8>, client: u64, limit: u64) {
    use std::io::Write;
    let _ = writeln!(out, "{client} {limit}");
}

/// Decode the complete lines of a credit-stream chunk into `(client,
/// limit)`; a trailing partial line is left in `buf` for the next chunk,
/// and a line that does not parse is skipped.
pub fn decode_pushes(buf: &mut Vec<u8>, out: &mut Vec<(u64, u64)>) {
    let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
        return;
    };
    for line in buf[..end].split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let mut it = line.split(' ');
        if let (Some(c), Some(l), None) = (it.next(), it.next(), it.next()) {
            if let (Ok(c), Ok(l)) = (c.parse(), l.parse()) {
                out.push((c, l));
            }
        }
    }
    buf.drain(..=end);
}

/// The sampling `n` of an echoed `bw-signals` (`demand` → 1, `demand/<n>`
/// → n), or None if it does not grant demand lines.
pub fn parse_signals_echo(v: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(v).ok()?;
    if s == SIGNALS_DEMAND {
        return Some(1);
    }
    let n: u32 = s
        .strip_prefix(SIGNALS_DEMAND)?
        .strip_prefix('/')?
        .parse()
        .ok()?;
    Some(n.max(1))
}

/// Append one demand line to a credit stream's request body: `client`
/// holds no credit, has nothing in flight and `demand` requests waiting,
/// the newest of which waits `budget_us` more.
pub fn encode_demand(out: &mut Vec<u8>, client: u64, demand: u32, budget_us: u64) {
    use std::io::Write;
    let _ = writeln!(out, "{client} {demand} {budget_us}");
}

/// Decode the complete demand lines of a chunk into `(client, demand,
/// budget_us)`; a trailing partial line stays in `buf`, and a line that
/// does not parse is skipped.
pub fn decode_demands(buf: &mut Vec<u8>, out: &mut Vec<(u64, u32, u64)>) {
    let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
        return;
    };
    for line in buf[..end].split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let mut it = line.split(' ');
        if let (Some(c), Some(d), Some(b), None) = (it.next(), it.next(), it.next(), it.next()) {
            if let (Ok(c), Ok(d), Ok(b)) = (c.parse(), d.parse(), b.parse()) {
                out.push((c, d, b));
            }
        }
    }
    buf.drain(..=end);
}

/// Bad control metadata on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    Missing,
    Malformed { header: &'static str, value: String },
}

impl WireError {
    pub fn status(&self) -> StatusCode {
        match self {
            WireError::Missing => StatusCode::PRECONDITION_REQUIRED,
            WireError::Malformed { .. } => StatusCode::BAD_REQUEST,
        }
    }

    /// The `bw-reject` token.
    pub fn token(&self) -> String {
        match self {
            WireError::Missing => "missing-credit-metadata".into(),
            WireError::Malformed { header, .. } => format!("malformed-{header}"),
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Missing => write!(f, "request carries no {CLIENT} header (no credit)"),
            WireError::Malformed { header, value } => {
                write!(f, "malformed {header} header: {value:?}")
            }
        }
    }
}

fn number<T: std::str::FromStr>(
    headers: &HeaderMap,
    name: &'static str,
) -> Result<Option<T>, WireError> {
    let Some(v) = headers.get(name) else {
        return Ok(None);
    };
    let bad = || WireError::Malformed {
        header: name,
        value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
    };
    let s = v.to_str().map_err(|_| bad())?;
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    s.parse::<T>().map(Some).map_err(|_| bad())
}

/// Parse a request's metadata. `Ok(None)`: no metadata at all.
pub fn parse_arrival(headers: &HeaderMap) -> Result<Option<Arrival>, WireError> {
    let Some(client) = number::<u64>(headers, CLIENT)? else {
        let any = [KIND, DEMAND, BUDGET_US, PRIORITY]
            .iter()
            .any(|h| headers.contains_key(*h));
        return if any {
            Err(WireError::Missing)
        } else {
            Ok(None)
        };
    };
    let kind = match headers.get(KIND).map(HeaderValue::as_bytes) {
        None | Some(b"request") => Kind::Request,
        Some(b"register") => Kind::Register,
        Some(b"wait") => Kind::CreditWait,
        Some(b"await") => Kind::Await,
        Some(b"deregister") => Kind::Deregister,
        Some(other) => {
            return Err(WireError::Malformed {
                header: KIND,
                value: String::from_utf8_lossy(other).into_owned(),
            })
        }
    };
    let demand = number::<u32>(headers, DEMAND)?.unwrap_or(0);
    let budget_ns = number::<u64>(headers, BUDGET_US)?.map(|us| us.saturating_mul(1000));
    let priority = match number::<u8>(headers, PRIORITY)? {
        None => 1,
        Some(p @ 1..=128) => p,
        Some(p) => {
            return Err(WireError::Malformed {
                header: PRIORITY,
                value: p.to_string(),
            })
        }
    };
    Ok(Some(Arrival {
        client,
        kind,
        demand,
        budget_ns,
        priority,
    }))
}

/// Write a request's metadata.
pub fn write_arrival(headers: &mut HeaderMap, a: &Arrival) {
    let kind = match a.kind {
        Kind::Request => "request",
        Kind::Register => "register",
        Kind::CreditWait => "wait",
        Kind::Await => "await",
        Kind::Deregister => "deregister",
    };
    headers.insert(CLIENT, HeaderValue::from(a.client));
    headers.insert(KIND, HeaderValue::from_static(kind));
    headers.insert(DEMAND, HeaderValue::from(a.demand));
    if let Some(b) = a.budget_ns {
        headers.insert(BUDGET_US, HeaderValue::from(b / 1000));
    }
    headers.insert(PRIORITY, HeaderValue::from(u16::from(a.priority)));
}

pub fn write_feedback(headers: &mut HeaderMap, fb: Feedback) {
    match fb {
        Feedback::None => {}
        Feedback::CreditLimit(l) => {
            headers.insert(CREDIT_LIMIT, HeaderValue::from(l));
        }
        Feedback::Threshold(t) => {
            headers.insert(THRESHOLD, HeaderValue::from(u16::from(t)));
        }
    }
}

/// Read the feedback on a response; a malformed value is ignored (the
/// client keeps its last state rather than trusting garbage).
pub fn parse_feedback(headers: &HeaderMap) -> Feedback {
    if let Ok(Some(l)) = number::<u64>(headers, CREDIT_LIMIT) {
        return Feedback::CreditLimit(l);
    }
    if let Ok(Some(t)) = number::<u8>(headers, THRESHOLD) {
        return Feedback::Threshold(t);
    }
    Feedback::None
}

/// Status and `bw-reject` token of a refusal.
pub fn reject_status(reason: &RejectReason) -> (StatusCode, &'static str) {
    match reason {
        RejectReason::NoCredit => (StatusCode::TOO_MANY_REQUESTS, "no-credit"),
        RejectReason::Unregistered => (StatusCode::TOO_MANY_REQUESTS, "unregistered"),
        RejectReason::QueueDelay { .. } => (StatusCode::SERVICE_UNAVAILABLE, "queue-delay"),
        RejectReason::Priority { .. } => (StatusCode::SERVICE_UNAVAILABLE, "priority"),
        RejectReason::Limit => (StatusCode::SERVICE_UNAVAILABLE, "limit"),
        RejectReason::Expired => (StatusCode::SERVICE_UNAVAILABLE, REJECT_EXPIRED),
    }
}

/// The `bw-reject` token a handler uses when ASQM refused it a lock.
pub const REJECT_LOCK: &str = "lock-congested";

/// The `bw-reject` token of [`RejectReason::Expired`].
pub const REJECT_EXPIRED: &str = "expired";

/// Convert a budget in ns to the header's microseconds.
pub fn budget_us(ns: Nanos) -> u64 {
    ns / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn round_trip() {
        let a = Arrival {
            client: 42,
            kind: Kind::Register,
            demand: 7,
            budget_ns: Some(1_500_000),
            priority: 9,
        };
        let mut h = HeaderMap::new();
        write_arrival(&mut h, &a);
        assert_eq!(parse_arrival(&h), Ok(Some(a)));
        let mut h = HeaderMap::new();
        write_feedback(&mut h, Feedback::CreditLimit(123));
        assert_eq!(parse_feedback(&h), Feedback::CreditLimit(123));
    }

    #[test]
    fn missing_and_malformed_are_distinct_statuses() {
        assert_eq!(parse_arrival(&HeaderMap::new()), Ok(None));
        let missing = parse_arrival(&headers(&[(DEMAND, "3")])).unwrap_err();
        assert_eq!(missing.status(), StatusCode::PRECONDITION_REQUIRED);
        for (h, v) in [
            (CLIENT, "abc"),
            (CLIENT, "-1"),
            (CLIENT, ""),
            (CLIENT, "99999999999999999999999"),
        ] {
            let e = parse_arrival(&headers(&[(h, v)])).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{h}={v}");
        }
        for (h, v) in [
            (DEMAND, "x"),
            (BUDGET_US, "1.5"),
            (PRIORITY, "0"),
            (PRIORITY, "200"),
            (KIND, "grab"),
        ] {
            let e = parse_arrival(&headers(&[(CLIENT, "1"), (h, v)])).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{h}={v}");
            assert!(e.token().starts_with("malformed-"), "{}", e.token());
        }
    }

    #[test]
    fn pushes_round_trip_across_split_chunks_and_skip_garbage() {
        let mut chunk = Vec::new();
        encode_push(&mut chunk, 7, 12);
        encode_push(&mut chunk, u64::MAX, 1);
        chunk.extend_from_slice(b"junk line\n-1 3\n9 4");
        let mut buf = chunk[..4].to_vec();
        let mut out = Vec::new();
        decode_pushes(&mut buf, &mut out);
        assert!(out.is_empty(), "no complete line yet");
        buf.extend_from_slice(&chunk[4..]);
        decode_pushes(&mut buf, &mut out);
        assert_eq!(out, vec![(7, 12), (u64::MAX, 1)]);
        assert_eq!(buf, b"9 4", "the partial line waits");
        buf.extend_from_slice(b"\n");
        decode_pushes(&mut buf, &mut out);
        assert_eq!(out.last(), Some(&(9, 4)));
        assert!(buf.is_empty());
        let mut h = HeaderMap::new();
        write_pushes(
            &mut h,
            &mut vec![(3, Feedback::CreditLimit(9)), (4, Feedback::CreditLimit(1))],
        );
        let mut got = Vec::new();
        parse_pushes(&h, &mut got);
        assert_eq!(got, vec![(3, 9), (4, 1)]);
        got.clear();
        parse_pushes(&headers(&[(PUSH, "1:2,x:3,4,5:6")]), &mut got);
        assert_eq!(got, vec![(1, 2), (5, 6)], "garbage entries skipped");
        let bad = headers(&[(SUBSCRIBE, "x1")]);
        assert!(parse_stream(&bad, SUBSCRIBE).is_err());
        assert_eq!(parse_stream(&HeaderMap::new(), STREAM), Ok(None));
    }

    #[test]
    fn demand_lines_round_trip_across_split_chunks_and_skip_garbage() {
        let mut chunk = Vec::new();
        encode_demand(&mut chunk, 7, 1, 1500);
        encode_demand(&mut chunk, u64::MAX, u32::MAX, 0);
        chunk.extend_from_slice(b"7 1\n1 2 3 4\n-1 2 3\nx 1 1\n9 2 ");
        let mut buf = chunk[..5].to_vec();
        let mut out = Vec::new();
        decode_demands(&mut buf, &mut out);
        assert!(out.is_empty(), "no complete line yet");
        buf.extend_from_slice(&chunk[5..]);
        decode_demands(&mut buf, &mut out);
        assert_eq!(out, vec![(7, 1, 1500), (u64::MAX, u32::MAX, 0)]);
        assert_eq!(buf, b"9 2 ", "the partial line waits");
        buf.extend_from_slice(b"40\n");
        decode_demands(&mut buf, &mut out);
        assert_eq!(out.last(), Some(&(9, 2, 40)));
        assert!(buf.is_empty());
        assert_eq!(parse_signals_echo(b"demand"), Some(1));
        assert_eq!(parse_signals_echo(b"demand/4"), Some(4));
        assert_eq!(parse_signals_echo(b"demand/0"), Some(1));
        assert_eq!(parse_signals_echo(b"demand/x"), None);
        assert_eq!(parse_signals_echo(b"credits"), None);
    }

    #[test]
    fn bw_push_is_capped_and_leaves_the_rest() {
        let n = 3 * MAX_PUSH_PER_RESPONSE + 5;
        let mut grants: Vec<(u64, Feedback)> = (0..n as u64)
            .map(|c| (u64::MAX - c, Feedback::CreditLimit(u64::MAX - 1)))
            .collect();
        let mut h = HeaderMap::new();
        let wrote = write_pushes(&mut h, &mut grants);
        assert_eq!(wrote, MAX_PUSH_PER_RESPONSE);
        assert_eq!(grants.len(), n - MAX_PUSH_PER_RESPONSE, "the rest stay");
        assert_eq!(
            grants[0].0,
            u64::MAX - MAX_PUSH_PER_RESPONSE as u64,
            "front first"
        );
        let len = h.get(PUSH).unwrap().len();
        assert!(len <= 4096, "bw-push of {len} bytes with the widest ids");
        let mut got = Vec::new();
        parse_pushes(&h, &mut got);
        assert_eq!(got.len(), MAX_PUSH_PER_RESPONSE);
        let mut h = HeaderMap::new();
        assert_eq!(write_pushes(&mut h, &mut Vec::new()), 0);
        assert!(h.get(PUSH).is_none(), "no empty header");
    }

    #[test]
    fn garbage_feedback_is_ignored() {
        assert_eq!(
            parse_feedback(&headers(&[(CREDIT_LIMIT, "lots")])),
            Feedback::None
        );
    }
}
