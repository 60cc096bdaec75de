//! HTTP/1.1 keep-alive `GET <path>`, replies framed by `Content-Length`.
//!
//! Enough of HTTP for nginx serving a static file: status line, headers,
//! a body of `Content-Length` bytes (none for 1xx/204/304). Chunked bodies
//! are refused with a clear error rather than mis-framed. Status >= 400
//! counts as an error reply.

use super::{parse_decimal, Outcome, ParseResult, Protocol, ProtocolError, Reply};
use crate::workload::Request;

pub struct Http {
    request: Vec<u8>,
}

impl Http {
    pub fn new(host: &str, path: &str) -> Self {
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tailscope-loadgen\r\n\r\n");
        Http {
            request: request.into_bytes(),
        }
    }
}

/// Headers larger than this mean we are not talking to an HTTP server.
const MAX_HEADER_BYTES: usize = 64 * 1024;

impl Protocol for Http {
    fn encode(&self, _req: &Request, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.request);
    }

    fn parse(&self, buf: &[u8], _expected_id: u64) -> ParseResult {
        let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            if buf.len() > MAX_HEADER_BYTES {
                return Err(ProtocolError("HTTP response headers exceed 64 KiB".into()));
            }
            return Ok(None);
        };
        let head = &buf[..head_end];
        let mut lines = head
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let status_line = lines.next().unwrap_or_default();
        let status = parse_status(status_line).ok_or_else(|| {
            ProtocolError(format!(
                "bad HTTP status line: {:?}",
                String::from_utf8_lossy(status_line)
            ))
        })?;
        let mut content_length = None;
        for header in lines {
            let Some(colon) = header.iter().position(|&b| b == b':') else {
                continue;
            };
            let name = &header[..colon];
            let value = header[colon + 1..].trim_ascii();
            if name.eq_ignore_ascii_case(b"content-length") {
                content_length = Some(parse_decimal(value).ok_or_else(|| {
                    ProtocolError(format!(
                        "bad Content-Length: {:?}",
                        String::from_utf8_lossy(value)
                    ))
                })?);
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                return Err(ProtocolError(
                    "chunked HTTP responses are not supported".into(),
                ));
            }
        }
        let body_len = match (content_length, status) {
            (Some(n), _) => n as usize,
            (None, 100..=199 | 204 | 304) => 0,
            (None, _) => return Err(ProtocolError("HTTP response without Content-Length".into())),
        };
        let len = head_end + 4 + body_len;
        if buf.len() < len {
            return Ok(None);
        }
        let outcome = if status >= 400 {
            Outcome::Error
        } else {
            Outcome::Ok
        };
        Ok(Some(Reply { len, outcome }))
    }
}

/// `HTTP/1.x NNN reason` -> NNN.
fn parse_status(line: &[u8]) -> Option<u16> {
    let rest = line.strip_prefix(b"HTTP/1.")?;
    let code = rest.get(2..5)?;
    (rest.get(1) == Some(&b' ')).then_some(())?;
    parse_decimal(code).map(|c| c as u16)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::frame_all;
    use super::*;
    use crate::workload::Op;

    #[test]
    fn encodes_keep_alive_get() {
        let mut out = Vec::new();
        Http::new("127.0.0.1:8080", "/index.html").encode(
            &Request {
                id: 0,
                op: Op::Get,
                key: 0,
            },
            &mut out,
        );
        assert!(out.starts_with(b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"));
        assert!(out.ends_with(b"\r\n\r\n"));
    }

    #[test]
    fn frames_bodies_across_partial_reads() {
        let stream = b"HTTP/1.1 200 OK\r\nServer: nginx\r\ncontent-length: 5\r\n\r\nhello\
HTTP/1.1 204 No Content\r\n\r\n\
HTTP/1.1 503 Busy\r\nContent-Length:  0 \r\n\r\n";
        let got = frame_all(&Http::new("h", "/"), stream, 0);
        let outcomes: Vec<Outcome> = got.iter().map(|r| r.outcome).collect();
        assert_eq!(outcomes, [Outcome::Ok, Outcome::Ok, Outcome::Error]);
    }

    #[test]
    fn refuses_what_it_cannot_frame() {
        let p = Http::new("h", "/");
        assert!(p
            .parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 0)
            .is_err());
        assert!(p.parse(b"HTTP/1.1 200 OK\r\n\r\n", 0).is_err());
        assert!(p.parse(b"+OK\r\n\r\n", 0).is_err());
    }
}
