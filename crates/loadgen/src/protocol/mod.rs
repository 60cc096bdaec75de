//! Wire protocols: how a [`Request`] is encoded and how a reply is framed.
//!
//! Every protocol here is request/response with replies in request order,
//! so a connection can pipeline freely and match replies FIFO. A parser
//! looks at the bytes received so far and answers "not yet" (`Ok(None)`),
//! "one reply of `n` bytes" or "this stream is not the protocol" (`Err`).
//! Parsers are pure functions of the buffer, so a reply split across any
//! number of reads parses the same as one read whole; the tests feed every
//! prefix to check this.

mod http;
mod line;
mod memcached;
mod redis;

pub use http::Http;
pub use line::Line;
pub use memcached::Memcached;
pub use redis::Redis;

use crate::workload::Request;

/// How the server answered a request that it did answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// A well-formed error reply (`-ERR`, `SERVER_ERROR`, HTTP >= 400, a
    /// mismatched `line` id): counted in `errors`, kept out of the latency
    /// histogram.
    Error,
}

/// One complete reply at the front of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub len: usize,
    pub outcome: Outcome,
}

/// The stream cannot be framed; the connection is unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub type ParseResult = Result<Option<Reply>, ProtocolError>;

pub trait Protocol {
    /// Append the wire form of `req` to `out`.
    fn encode(&self, req: &Request, out: &mut Vec<u8>);

    /// Frame the first reply in `buf`. `expected_id` is the id of the oldest
    /// request still waiting on this connection.
    fn parse(&self, buf: &[u8], expected_id: u64) -> ParseResult;
}

/// Offset of the first `\r\n` at or after `from`.
pub(crate) fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let tail = buf.get(from..)?;
    tail.windows(2).position(|w| w == b"\r\n").map(|p| from + p)
}

/// Parse an ASCII decimal, rejecting empty input, signs and overflow.
pub(crate) fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &d| {
        d.is_ascii_digit().then(|| acc * 10 + u64::from(d - b'0'))
    })
}

/// Append `key:<n>`, the key naming shared by redis and memcached.
pub(crate) fn push_key(out: &mut Vec<u8>, key: u64) {
    out.extend_from_slice(b"key:");
    push_decimal(out, key);
}

/// Append `n` in decimal without going through `fmt`.
pub(crate) fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Number of decimal digits of `key:<n>`.
pub(crate) fn key_len(key: u64) -> usize {
    4 + key.checked_ilog10().map_or(1, |d| d as usize + 1)
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;

    /// Feed every strict prefix of `stream` (all must be incomplete), then
    /// the whole, and return the sequence of replies it frames.
    pub fn frame_all(p: &dyn Protocol, stream: &[u8], first_id: u64) -> Vec<Reply> {
        let mut replies = Vec::new();
        let mut at = 0;
        let mut id = first_id;
        while at < stream.len() {
            let rest = &stream[at..];
            let whole = p.parse(rest, id).unwrap().expect("complete reply");
            for cut in 0..whole.len {
                assert_eq!(
                    p.parse(&rest[..cut], id),
                    Ok(None),
                    "prefix {cut} of {rest:?}"
                );
            }
            replies.push(whole);
            at += whole.len;
            id += 1;
        }
        replies
    }

    #[test]
    fn decimal_helpers() {
        let mut v = Vec::new();
        push_decimal(&mut v, 0);
        push_key(&mut v, 1234);
        assert_eq!(v, b"0key:1234");
        assert_eq!(key_len(0), 5);
        assert_eq!(key_len(9999), 8);
        assert_eq!(parse_decimal(b"123"), Some(123));
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"99999999999999999999"), None);
    }
}
