//! The memcached ASCII protocol: `get key` and `set key 0 0 len`.
//!
//! A get reply is zero or one `VALUE <key> <flags> <bytes> [<cas>]` block
//! followed by `END`; a miss is a bare `END`. `STORED` and its siblings
//! answer storage commands. `ERROR`, `CLIENT_ERROR` and `SERVER_ERROR` are
//! error replies.

use super::{find_crlf, parse_decimal, push_decimal, push_key};
use super::{Outcome, ParseResult, Protocol, ProtocolError, Reply};
use crate::workload::{Op, Request};

pub struct Memcached {
    value: Vec<u8>,
}

impl Memcached {
    pub fn new(value_size: usize) -> Self {
        Memcached {
            value: vec![b'x'; value_size],
        }
    }
}

impl Protocol for Memcached {
    fn encode(&self, req: &Request, out: &mut Vec<u8>) {
        match req.op {
            Op::Get => {
                out.extend_from_slice(b"get ");
                push_key(out, req.key);
                out.extend_from_slice(b"\r\n");
            }
            Op::Set => {
                out.extend_from_slice(b"set ");
                push_key(out, req.key);
                out.extend_from_slice(b" 0 0 ");
                push_decimal(out, self.value.len() as u64);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&self.value);
                out.extend_from_slice(b"\r\n");
            }
        }
    }

    fn parse(&self, buf: &[u8], _expected_id: u64) -> ParseResult {
        let mut at = 0;
        loop {
            let Some(eol) = find_crlf(buf, at) else {
                return Ok(None);
            };
            let line = &buf[at..eol];
            let next = eol + 2;
            let done = |outcome| Ok(Some(Reply { len: next, outcome }));
            if line.starts_with(b"VALUE ") {
                let bytes = line
                    .split(|&b| b == b' ')
                    .nth(3)
                    .and_then(parse_decimal)
                    .ok_or_else(|| bad(line))? as usize;
                let data_end = next + bytes + 2;
                if buf.len() < data_end {
                    return Ok(None);
                }
                if &buf[data_end - 2..data_end] != b"\r\n" {
                    return Err(bad(line));
                }
                at = data_end;
                continue;
            }
            return match line {
                b"END" | b"STORED" | b"NOT_STORED" | b"EXISTS" | b"NOT_FOUND" | b"DELETED" => {
                    done(Outcome::Ok)
                }
                _ if at == 0 && is_error_line(line) => done(Outcome::Error),
                _ => Err(bad(line)),
            };
        }
    }
}

fn is_error_line(line: &[u8]) -> bool {
    line == b"ERROR" || line.starts_with(b"CLIENT_ERROR") || line.starts_with(b"SERVER_ERROR")
}

fn bad(line: &[u8]) -> ProtocolError {
    ProtocolError(format!(
        "bad memcached reply line: {:?}",
        String::from_utf8_lossy(line)
    ))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::frame_all;
    use super::*;

    #[test]
    fn encodes_get_and_set() {
        let p = Memcached::new(2);
        let mut out = Vec::new();
        p.encode(
            &Request {
                id: 0,
                op: Op::Get,
                key: 5,
            },
            &mut out,
        );
        p.encode(
            &Request {
                id: 1,
                op: Op::Set,
                key: 6,
            },
            &mut out,
        );
        assert_eq!(out, b"get key:5\r\nset key:6 0 0 2\r\nxx\r\n");
    }

    #[test]
    fn frames_hits_misses_stores_and_errors_across_partial_reads() {
        let stream = b"VALUE key:5 0 4\r\nab\r\n\r\nEND\r\nEND\r\nSTORED\r\nSERVER_ERROR out of memory\r\nVALUE key:1 0 0 99\r\n\r\nEND\r\n";
        let got: Vec<Reply> = frame_all(&Memcached::new(1), stream, 0);
        let outcomes: Vec<Outcome> = got.iter().map(|r| r.outcome).collect();
        use Outcome::*;
        assert_eq!(outcomes, [Ok, Ok, Ok, Error, Ok]);
        assert_eq!(got[0].len, b"VALUE key:5 0 4\r\nab\r\n\r\nEND\r\n".len());
    }

    #[test]
    fn rejects_garbage() {
        let p = Memcached::new(1);
        assert!(p.parse(b"+OK\r\n", 0).is_err());
        assert!(p.parse(b"VALUE k 0 x\r\n", 0).is_err());
        assert!(p.parse(b"VALUE k 0 1\r\nabc\r\n", 0).is_err());
    }
}
