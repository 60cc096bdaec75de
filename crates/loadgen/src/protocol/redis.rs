//! RESP2, the redis protocol: `GET key` and `SET key value` as arrays of
//! bulk strings; replies of any RESP2 type, nested arrays included.
//! `-` replies are errors; `$-1` (a missing key) is a normal reply.

use super::{find_crlf, key_len, parse_decimal, push_decimal, push_key};
use super::{Outcome, ParseResult, Protocol, ProtocolError, Reply};
use crate::workload::{Op, Request};

pub struct Redis {
    value: Vec<u8>,
}

impl Redis {
    pub fn new(value_size: usize) -> Self {
        Redis {
            value: vec![b'x'; value_size],
        }
    }
}

impl Protocol for Redis {
    fn encode(&self, req: &Request, out: &mut Vec<u8>) {
        match req.op {
            Op::Get => out.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$"),
            Op::Set => out.extend_from_slice(b"*3\r\n$3\r\nSET\r\n$"),
        }
        push_decimal(out, key_len(req.key) as u64);
        out.extend_from_slice(b"\r\n");
        push_key(out, req.key);
        out.extend_from_slice(b"\r\n");
        if req.op == Op::Set {
            out.push(b'$');
            push_decimal(out, self.value.len() as u64);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&self.value);
            out.extend_from_slice(b"\r\n");
        }
    }

    fn parse(&self, buf: &[u8], _expected_id: u64) -> ParseResult {
        Ok(parse_value(buf, 0, 0)?.map(|(end, outcome)| Reply { len: end, outcome }))
    }
}

/// Deeper nesting than this is not something GET/SET can return.
const MAX_DEPTH: usize = 8;

/// Parse one RESP value starting at `at`; returns its end and outcome.
fn parse_value(
    buf: &[u8],
    at: usize,
    depth: usize,
) -> Result<Option<(usize, Outcome)>, ProtocolError> {
    let Some(eol) = find_crlf(buf, at) else {
        return Ok(None);
    };
    if eol == at {
        return Err(ProtocolError("empty RESP line".into()));
    }
    let after_line = eol + 2;
    let header = &buf[at + 1..eol];
    let bad = || {
        ProtocolError(format!(
            "bad RESP reply: {:?}",
            String::from_utf8_lossy(&buf[at..eol])
        ))
    };
    match buf[at] {
        b'+' | b':' => Ok(Some((after_line, Outcome::Ok))),
        b'-' => Ok(Some((after_line, Outcome::Error))),
        b'$' => {
            if header == b"-1" {
                return Ok(Some((after_line, Outcome::Ok)));
            }
            let len = parse_decimal(header).ok_or_else(bad)? as usize;
            let end = after_line + len + 2;
            if buf.len() < end {
                return Ok(None);
            }
            if &buf[end - 2..end] != b"\r\n" {
                return Err(bad());
            }
            Ok(Some((end, Outcome::Ok)))
        }
        b'*' => {
            if header == b"-1" {
                return Ok(Some((after_line, Outcome::Ok)));
            }
            if depth >= MAX_DEPTH {
                return Err(ProtocolError("RESP arrays nested too deeply".into()));
            }
            let count = parse_decimal(header).ok_or_else(bad)?;
            let mut end = after_line;
            for _ in 0..count {
                match parse_value(buf, end, depth + 1)? {
                    Some((e, _)) => end = e,
                    None => return Ok(None),
                }
            }
            Ok(Some((end, Outcome::Ok)))
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::frame_all;
    use super::*;

    #[test]
    fn encodes_get_and_set() {
        let p = Redis::new(3);
        let mut out = Vec::new();
        p.encode(
            &Request {
                id: 0,
                op: Op::Get,
                key: 42,
            },
            &mut out,
        );
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$6\r\nkey:42\r\n");
        out.clear();
        p.encode(
            &Request {
                id: 0,
                op: Op::Set,
                key: 7,
            },
            &mut out,
        );
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$5\r\nkey:7\r\n$3\r\nxxx\r\n");
    }

    #[test]
    fn frames_every_reply_type_across_partial_reads() {
        let stream = b"+OK\r\n$5\r\nhe\r\no\r\n$-1\r\n-ERR wrong type\r\n:12\r\n*2\r\n$1\r\na\r\n*1\r\n+x\r\n$0\r\n\r\n";
        let got: Vec<Outcome> = frame_all(&Redis::new(1), stream, 0)
            .iter()
            .map(|r| r.outcome)
            .collect();
        use Outcome::*;
        assert_eq!(got, [Ok, Ok, Ok, Error, Ok, Ok, Ok]);
    }

    #[test]
    fn rejects_garbage() {
        let p = Redis::new(1);
        assert!(p.parse(b"HTTP/1.1 200 OK\r\n", 0).is_err());
        assert!(p.parse(b"$abc\r\n", 0).is_err());
        assert!(p.parse(b"$1\r\nabc\r\n", 0).is_err());
        assert!(p.parse(b"\r\n", 0).is_err());
    }
}
