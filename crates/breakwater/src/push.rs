//! Server-pushed credits: the transport half of the thesis's explicit
//! credits (§2.3.2, "explicit credit messages are only generated when
//! piggybacking a credit on a response is not possible").
//!
//! HTTP has no server push, so without this a drained client (no credit,
//! nothing in flight) must *ask* for credit with a credit wait: one more
//! message the server receives and answers per such request
//! (docs/breakwater.md, session 6: 0.95 credit waits per admitted request at
//! 2x). With a credit stream, each client connection opens one long-lived
//! HTTP/2 stream (`bw-subscribe: <stream id>`) whose response body never
//! ends; a client names its connection's stream when it registers
//! (`bw-stream`), and the server writes explicit credits for it into that
//! body as lines `<client> <limit>\n`. An explicit credit then costs the
//! server one send (coalesced per connection) and no receive, and a drained
//! client waits locally for a pushed credit instead of sending a credit
//! wait.
//!
//! Who gets a credit is the policy's decision ([`crate::Policy::push_credits`]);
//! this module only routes and delivers: [`PushHub`] maps clients to
//! streams and streams to [`CreditFeed`] bodies, which the hyper glue
//! ([`crate::http::serve_with_push`]) hands back as the subscription's
//! response body. The client half is [`crate::client::PushLink`].

use crate::policy::{ClientId, Feedback};
use crate::wire;
use bytes::Bytes;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Routes explicit credits to the credit streams clients subscribed.
#[derive(Default)]
pub struct PushHub {
    state: Mutex<HubState>,
    /// Open streams: lets the server skip the policy call when none is.
    open: AtomicUsize,
}

#[derive(Default)]
struct HubState {
    streams: HashMap<u64, mpsc::UnboundedSender<Bytes>>,
    routes: HashMap<ClientId, u64>,
}

/// What one [`PushHub::deliver`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Delivered {
    /// Explicit credits written to a stream.
    pub credits: u64,
    /// Stream chunks written (one per stream per call).
    pub chunks: u64,
    /// Credits for clients whose stream is gone (dropped).
    pub lost: u64,
}

impl PushHub {
    pub fn new() -> Arc<Self> {
        Arc::new(PushHub::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any credit stream is open.
    pub fn active(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
    }

    /// Open credit stream `id` (replacing one of the same id): the returned
    /// body carries the explicit credits routed to it until it is dropped.
    pub fn subscribe(self: &Arc<Self>, id: u64) -> CreditFeed {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.lock();
        if st.streams.insert(id, tx).is_none() {
            self.open.fetch_add(1, Ordering::Relaxed);
        }
        CreditFeed {
            rx,
            hub: Arc::downgrade(self),
            id,
        }
    }

    /// Explicit credits for `client` go to stream `stream`. False (and no
    /// route) if that stream is not open here.
    pub fn route(&self, client: ClientId, stream: u64) -> bool {
        let mut st = self.lock();
        if !st.streams.contains_key(&stream) {
            st.routes.remove(&client);
            return false;
        }
        st.routes.insert(client, stream);
        true
    }

    /// Write the grants (drained) to their clients' streams, one chunk per
    /// stream.
    pub fn deliver(&self, grants: &mut Vec<(ClientId, Feedback)>) -> Delivered {
        let mut done = Delivered::default();
        let mut chunks: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut st = self.lock();
        for (client, fb) in grants.drain(..) {
            let Feedback::CreditLimit(limit) = fb else {
                continue;
            };
            match st.routes.get(&client) {
                Some(&s) if st.streams.contains_key(&s) => {
                    wire::encode_push(chunks.entry(s).or_default(), client, limit);
                    done.credits += 1;
                }
                _ => done.lost += 1,
            }
        }
        for (s, chunk) in chunks {
            let sent = st.streams.get(&s).map(|tx| tx.send(Bytes::from(chunk)));
            match sent {
                Some(Ok(())) => done.chunks += 1,
                _ => {
                    if st.streams.remove(&s).is_some() {
                        self.open.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
        }
        done
    }
}

/// The body of a credit stream's response: explicit credits as they are
/// pushed, coalesced into one HTTP/2 DATA frame per poll. It never ends by
/// itself; dropping it (the connection closed) closes the stream at the
/// hub.
pub struct CreditFeed {
    rx: mpsc::UnboundedReceiver<Bytes>,
    hub: Weak<PushHub>,
    id: u64,
}

impl http_body::Body for CreditFeed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(first)) => {
                let mut more = Vec::new();
                while let Ok(b) = self.rx.try_recv() {
                    if more.is_empty() {
                        more.extend_from_slice(&first);
                    }
                    more.extend_from_slice(&b);
                }
                let data = if more.is_empty() {
                    first
                } else {
                    Bytes::from(more)
                };
                Poll::Ready(Some(Ok(http_body::Frame::data(data))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for CreditFeed {
    fn drop(&mut self) {
        self.rx.close();
        if let Some(hub) = self.hub.upgrade() {
            let mut st = hub.lock();
            // Only our own stream: a resubscription may have replaced it.
            if st.streams.get(&self.id).is_some_and(|tx| tx.is_closed()) {
                st.streams.remove(&self.id);
                hub.open.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn grants_are_routed_coalesced_and_dropped_with_their_stream() {
        let hub = PushHub::new();
        assert!(!hub.active());
        assert!(!hub.route(1, 10), "no such stream yet");
        let mut a = hub.subscribe(10);
        let b = hub.subscribe(20);
        assert!(hub.active());
        assert!(hub.route(1, 10) && hub.route(2, 10) && hub.route(3, 20));
        let mut g = vec![
            (1, Feedback::CreditLimit(5)),
            (2, Feedback::CreditLimit(7)),
            (3, Feedback::CreditLimit(1)),
            (4, Feedback::CreditLimit(1)),
        ];
        let d = hub.deliver(&mut g);
        assert!(g.is_empty());
        assert_eq!(
            d,
            Delivered {
                credits: 3,
                chunks: 2,
                lost: 1
            }
        );
        hub.deliver(&mut vec![(1, Feedback::CreditLimit(6))]);
        // Both chunks waiting on stream 10 come out as one frame.
        let frame = a.frame().await.unwrap().unwrap().into_data().unwrap();
        let mut buf = frame.to_vec();
        let mut got = Vec::new();
        wire::decode_pushes(&mut buf, &mut got);
        got.sort();
        assert_eq!(got, vec![(1, 5), (1, 6), (2, 7)]);
        drop(b);
        let d = hub.deliver(&mut vec![(3, Feedback::CreditLimit(2))]);
        assert_eq!(d.credits, 0, "stream 20 is closed");
        assert!(hub.active(), "stream 10 is still open");
        drop(a);
        assert!(!hub.active());
    }
}
