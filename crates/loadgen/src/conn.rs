//! One pipelined TCP connection: an output buffer, an input buffer, and the
//! FIFO of requests still waiting for a reply.
//!
//! Invariant: `inflight` holds exactly the requests whose bytes have been
//! queued in `out` (sent or not) and whose reply has not been framed yet, in
//! send order. Replies come back in that order, so the front of `inflight`
//! is always the request the next reply answers.

use crate::protocol::{Outcome, Protocol};
use crate::workload::Request;
use mio::net::TcpStream;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// A request on the wire, remembered until its reply arrives.
#[derive(Debug, Clone, Copy)]
pub struct InFlight {
    /// When the schedule meant it to go out (ns since run start).
    pub intended_ns: u64,
    pub id: u64,
}

const INITIAL_INPUT_BYTES: usize = 64 * 1024;

pub struct Conn {
    pub stream: TcpStream,
    out: Vec<u8>,
    out_sent: usize,
    input: Vec<u8>,
    /// Unparsed input is `input[in_start..in_end]`.
    in_start: usize,
    in_end: usize,
    pub inflight: VecDeque<InFlight>,
}

impl Conn {
    /// Blocking connect (with a timeout), then switch to non-blocking.
    /// Nagle is off: a pipelined request must leave now, not after the
    /// previous one is acknowledged.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let std_stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
        std_stream.set_nodelay(true)?;
        std_stream.set_nonblocking(true)?;
        Ok(Conn {
            stream: TcpStream::from_std(std_stream),
            out: Vec::with_capacity(16 * 1024),
            out_sent: 0,
            input: vec![0; INITIAL_INPUT_BYTES],
            in_start: 0,
            in_end: 0,
            inflight: VecDeque::new(),
        })
    }

    /// Encode `req` into the output buffer; the caller flushes.
    pub fn queue(&mut self, protocol: &dyn Protocol, req: &Request, intended_ns: u64) {
        protocol.encode(req, &mut self.out);
        self.inflight.push_back(InFlight {
            intended_ns,
            id: req.id,
        });
    }

    pub fn has_unsent(&self) -> bool {
        self.out_sent < self.out.len()
    }

    /// Write as much queued output as the socket takes. Leftovers wait for
    /// the next writable event.
    pub fn flush(&mut self) -> io::Result<()> {
        while self.out_sent < self.out.len() {
            match self.stream.write(&self.out[self.out_sent..]) {
                Ok(n) => self.out_sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.out_sent = 0;
        Ok(())
    }

    /// Read until the socket is drained, calling `on_reply` for every reply
    /// framed. `now_ns` is sampled after each read that returned data, so a
    /// reply's completion time is when its last byte was read.
    pub fn read_replies(
        &mut self,
        protocol: &dyn Protocol,
        mut now_ns: impl FnMut() -> u64,
        mut on_reply: impl FnMut(InFlight, Outcome, u64),
    ) -> Result<(), String> {
        loop {
            self.make_room();
            match self.stream.read(&mut self.input[self.in_end..]) {
                Ok(0) => return Err("server closed the connection".into()),
                Ok(n) => self.in_end += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.to_string()),
            }
            let now = now_ns();
            while self.in_start < self.in_end {
                let Some(front) = self.inflight.front() else {
                    return Err("reply received with no request outstanding".into());
                };
                let buf = &self.input[self.in_start..self.in_end];
                let Some(reply) = protocol.parse(buf, front.id).map_err(|e| e.0)? else {
                    break;
                };
                self.in_start += reply.len;
                let done = self.inflight.pop_front().expect("front exists");
                on_reply(done, reply.outcome, now);
            }
            if self.in_start == self.in_end {
                self.in_start = 0;
                self.in_end = 0;
            }
        }
    }

    /// Ensure free space after `in_end`: slide unparsed bytes to the front,
    /// or grow when a single reply is larger than the buffer.
    fn make_room(&mut self) {
        if self.in_end < self.input.len() {
            return;
        }
        if self.in_start > 0 {
            self.input.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
        } else {
            let len = self.input.len();
            self.input.resize(len * 2, 0);
        }
    }
}
