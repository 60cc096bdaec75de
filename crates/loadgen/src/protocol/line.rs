//! tailscope's test-server protocol: `REQ <id>\n` answered by `OK <id>\n`.
//!
//! The echoed id lets the generator check that replies really come back in
//! order; a reply for the wrong id, or `ERR ...`, counts as an error.

use super::{parse_decimal, push_decimal};
use super::{Outcome, ParseResult, Protocol, ProtocolError, Reply};
use crate::workload::Request;

pub struct Line;

impl Protocol for Line {
    fn encode(&self, req: &Request, out: &mut Vec<u8>) {
        out.extend_from_slice(b"REQ ");
        push_decimal(out, req.id);
        out.push(b'\n');
    }

    fn parse(&self, buf: &[u8], expected_id: u64) -> ParseResult {
        let Some(eol) = buf.iter().position(|&b| b == b'\n') else {
            return Ok(None);
        };
        let line = buf[..eol].strip_suffix(b"\r").unwrap_or(&buf[..eol]);
        let outcome = if let Some(id) = line.strip_prefix(b"OK ") {
            match parse_decimal(id) {
                Some(id) if id == expected_id => Outcome::Ok,
                Some(_) => Outcome::Error,
                None => return Err(bad(line)),
            }
        } else if line.starts_with(b"ERR") {
            Outcome::Error
        } else {
            return Err(bad(line));
        };
        Ok(Some(Reply {
            len: eol + 1,
            outcome,
        }))
    }
}

fn bad(line: &[u8]) -> ProtocolError {
    ProtocolError(format!(
        "bad line reply: {:?}",
        String::from_utf8_lossy(line)
    ))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::frame_all;
    use super::*;
    use crate::workload::Op;

    #[test]
    fn encodes_id() {
        let mut out = Vec::new();
        Line.encode(
            &Request {
                id: 17,
                op: Op::Get,
                key: 3,
            },
            &mut out,
        );
        assert_eq!(out, b"REQ 17\n");
    }

    #[test]
    fn verifies_ids_across_partial_reads() {
        // Ids 5, 6, then a reply claiming 9 where 7 was due, then an ERR.
        let got: Vec<Outcome> = frame_all(&Line, b"OK 5\nOK 6\r\nOK 9\nERR busy\n", 5)
            .iter()
            .map(|r| r.outcome)
            .collect();
        assert_eq!(
            got,
            [Outcome::Ok, Outcome::Ok, Outcome::Error, Outcome::Error]
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(Line.parse(b"+OK\r\n", 0).is_err());
        assert!(Line.parse(b"OK x\n", 0).is_err());
    }
}
