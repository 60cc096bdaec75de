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
//! **Demand lines** (session 10). A drained pushed client tells the server
//! nothing by itself, so explicit credits went round every drained client
//! of a connection; with 1000 clients sending every ~67 ms almost none of
//! them had a request waiting, and the credit sat unused for tens of ms
//! while requests that wanted one expired at their clients (the server
//! idled 14% at 2x, docs/breakwater.md, session 9). With `bw-signals:
//! demand` on the subscription the credit stream is two-way: its request
//! body carries demand lines `<client> <demand> <budget_us>\n`, which a
//! client sends once when it goes from "nothing to send" to "a request
//! waiting" while it holds no credit and has nothing in flight (not per
//! request; coalesced per connection into one DATA frame per poll, with
//! no stream, headers or response of its own). The hub accepts a line
//! only for a client routed to that same stream, and hands it to the
//! server ([`PushHub::set_demand_sink`], [`crate::Policy::on_demand`]),
//! which then pushes explicit credits only to clients with known demand
//! (`policy::breakwater`, "explicit credits"). The server echoes the
//! header when it reads the lines; a client whose subscription was not
//! echoed sends none and keeps being pushed speculatively.
//!
//! Who gets a credit is the policy's decision ([`crate::Policy::push_credits`]);
//! this module only routes and delivers: [`PushHub`] maps clients to
//! streams and streams to [`CreditFeed`] bodies, which the hyper glue
//! ([`crate::http::serve_with_push`]) hands back as the subscription's
//! response body. The client half is [`crate::client::PushLink`].

use crate::policy::{ClientId, Feedback};
use crate::wire;
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Routes explicit credits to the credit streams clients subscribed.
///
/// Stream ids are chosen by clients, so they only name a stream within the
/// connection that subscribed it: a subscription and a registration are
/// matched on (connection, id), the connection being the [`ConnId`] the
/// transport ([`crate::http::serve_with_push`]) puts in every request's
/// extensions. A client cannot route its credits to, nor replace, another
/// connection's stream by naming its id.
#[derive(Default)]
pub struct PushHub {
    state: Mutex<HubState>,
    /// Open streams: lets the server skip the policy call when none is.
    open: AtomicUsize,
    /// Connection ids handed out by [`Self::next_conn`].
    conns: AtomicU64,
    /// Where demand lines go (the server layer sets it); without one the
    /// hub refuses `bw-signals: demand`.
    sink: OnceLock<DemandSink>,
    /// Refuse demand lines even with a sink (an A/B switch).
    refuse_demand: AtomicBool,
    /// Clients send a line for 1 in this many idle-to-busy transitions
    /// (0: [`DEFAULT_DEMAND_SAMPLE`]); told to them in the echoed
    /// `bw-signals`.
    demand_sample: std::sync::atomic::AtomicU32,
}

/// Clients send a demand line for 1 in this many of their idle-to-busy
/// transitions unless the server says otherwise
/// ([`PushHub::set_demand_sample`]). Measured at 2x (docs/breakwater.md,
/// session 10): every transition, 1.75 lines per admitted request, cost
/// more server and load-generator CPU than the aimed credits saved (0.69
/// of capacity against 0.73 without lines); 1 in 4 (0.36 lines per
/// admitted) still names enough waiting clients to fill the core's idle
/// moments (busy 0.88 -> 0.94; 0.77 of capacity).
pub const DEFAULT_DEMAND_SAMPLE: u32 = 4;

/// Receives the demand lines `(client, demand, budget_us)` of clients
/// routed to the stream they came on (drains the vector).
pub type DemandSink = Box<dyn Fn(&mut Vec<(ClientId, u32, u64)>) + Send + Sync>;

/// The connection a request came on, as the transport numbers them (in the
/// request's extensions). Requests without one share connection 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConnId(pub u64);

#[derive(Default)]
struct HubState {
    /// (connection, client-chosen id) → the stream's key.
    subs: HashMap<(u64, u64), u64>,
    /// Open streams by key (the key is also the policy's push group).
    streams: HashMap<u64, mpsc::UnboundedSender<Bytes>>,
    routes: HashMap<ClientId, u64>,
    next_key: u64,
    /// [`PushHub::close`] was called: no stream is open or opens again.
    closed: bool,
    /// Streams whose request body carries demand lines.
    demand: HashSet<u64>,
}

impl HubState {
    fn remove_stream(&mut self, key: u64, open: &AtomicUsize) {
        if self.streams.remove(&key).is_some() {
            open.fetch_sub(1, Ordering::Relaxed);
        }
        self.subs.retain(|_, k| *k != key);
        self.routes.retain(|_, k| *k != key);
        self.demand.remove(&key);
    }
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

    /// Send demand lines to `sink` (the server layer does this for its
    /// hub); only the first call counts.
    pub fn set_demand_sink(&self, sink: DemandSink) {
        let _ = self.sink.set(sink);
    }

    /// Refuse (or accept again) demand lines on new subscriptions: their
    /// clients are then pushed speculatively, as without demand lines.
    pub fn set_accept_demand(&self, accept: bool) {
        self.refuse_demand.store(!accept, Ordering::Relaxed);
    }

    /// Ask clients for a demand line on 1 in `n` of their idle-to-busy
    /// transitions (sampling: the server needs a few known waiters to aim
    /// credits at when its core would idle, not all of them).
    pub fn set_demand_sample(&self, n: u32) {
        self.demand_sample.store(n.max(1), Ordering::Relaxed);
    }

    /// The `bw-signals` value a subscription with demand lines is answered
    /// with: `demand`, or `demand/<n>` when sampling 1 in n.
    pub fn demand_echo(&self) -> String {
        match self.demand_sample.load(Ordering::Relaxed) {
            0 => format!("{}/{DEFAULT_DEMAND_SAMPLE}", wire::SIGNALS_DEMAND),
            1 => wire::SIGNALS_DEMAND.to_string(),
            n => format!("{}/{n}", wire::SIGNALS_DEMAND),
        }
    }

    /// Whether a subscription asking for demand lines gets them.
    pub fn accepts_demand(&self) -> bool {
        self.sink.get().is_some() && !self.refuse_demand.load(Ordering::Relaxed)
    }

    /// Whether the clients of push group `key` signal their demand.
    pub fn signals_demand(&self, key: u64) -> bool {
        self.lock().demand.contains(&key)
    }

    /// Read demand lines from a subscription's request body (the stream
    /// of `feed`) until it ends, handing those of clients routed to that
    /// stream to the sink. Marks the stream as signalling demand.
    pub async fn read_demand<Bd>(self: Arc<Self>, key: u64, body: Bd)
    where
        Bd: http_body::Body<Data = Bytes>,
    {
        use http_body_util::BodyExt;
        {
            let mut st = self.lock();
            if !st.streams.contains_key(&key) {
                return;
            }
            st.demand.insert(key);
        }
        let mut body = std::pin::pin!(body);
        let (mut buf, mut lines) = (Vec::new(), Vec::new());
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            if buf.len() > 1 << 16 && !buf.contains(&b'\n') {
                buf.clear(); // garbage without lines: do not grow forever
            }
            wire::decode_demands(&mut buf, &mut lines);
            self.demand(key, &mut lines);
        }
    }

    /// Hand demand lines that came on stream `key` to the sink, keeping
    /// only those of clients routed to it (a connection speaks only for
    /// its own clients). Takes the hub's lock, then calls the sink without
    /// it.
    pub fn demand(&self, key: u64, lines: &mut Vec<(ClientId, u32, u64)>) {
        if lines.is_empty() {
            return;
        }
        {
            let st = self.lock();
            lines.retain(|(c, _, _)| st.routes.get(c) == Some(&key));
        }
        if let Some(sink) = self.sink.get() {
            if !lines.is_empty() {
                sink(lines);
            }
        }
        lines.clear();
    }

    /// Whether any credit stream is open.
    pub fn active(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
    }

    /// A fresh connection id (never 0), for the transport to tag a new
    /// connection's requests with ([`ConnId`]).
    pub fn next_conn(&self) -> ConnId {
        ConnId(self.conns.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Open credit stream `id` of connection `conn` (replacing that
    /// connection's stream of the same id): the returned body carries the
    /// explicit credits routed to it until it is dropped or the hub is
    /// closed. After [`Self::close`] the body ends at once.
    pub fn subscribe(self: &Arc<Self>, conn: ConnId, id: u64) -> CreditFeed {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.lock();
        if st.closed {
            drop(tx); // the feed ends at once
            return CreditFeed {
                rx,
                hub: Weak::new(),
                key: 0,
            };
        }
        st.next_key += 1;
        let key = st.next_key;
        if let Some(old) = st.subs.insert((conn.0, id), key) {
            // The old stream's body ends; its clients re-register.
            st.remove_stream(old, &self.open);
        }
        st.streams.insert(key, tx);
        self.open.fetch_add(1, Ordering::Relaxed);
        CreditFeed {
            rx,
            hub: Arc::downgrade(self),
            key,
        }
    }

    /// Explicit credits for `client` go to stream `id` of its own
    /// connection `conn`. Returns the stream's key (the push group), or
    /// None (and no route) if that connection has no such stream open.
    pub fn route(&self, client: ClientId, conn: ConnId, id: u64) -> Option<u64> {
        let mut st = self.lock();
        let Some(&key) = st.subs.get(&(conn.0, id)) else {
            st.routes.remove(&client);
            return None;
        };
        st.routes.insert(client, key);
        Some(key)
    }

    /// Forget `client`'s route (it deregistered).
    pub fn unroute(&self, client: ClientId) {
        self.lock().routes.remove(&client);
    }

    /// End every credit stream (their bodies end, so HTTP/2 can close the
    /// streams and the connections can shut down) and refuse new ones:
    /// clients see their stream end and fall back to credit waits. For
    /// shutdown; the server's layer calls it when its last handle goes.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        let n = st.streams.len();
        st.streams.clear();
        st.demand.clear();
        st.subs.clear();
        st.routes.clear();
        self.open.fetch_sub(n, Ordering::Relaxed);
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
                _ => st.remove_stream(s, &self.open),
            }
        }
        done
    }
}

/// The body of a credit stream's response: explicit credits as they are
/// pushed, coalesced into one HTTP/2 DATA frame per poll. It ends when the
/// hub is closed ([`PushHub::close`]) or a resubscription of the same
/// connection and id replaces it; dropping it (the connection closed)
/// closes the stream at the hub.
pub struct CreditFeed {
    rx: mpsc::UnboundedReceiver<Bytes>,
    hub: Weak<PushHub>,
    key: u64,
}

impl CreditFeed {
    /// The stream's key at the hub (its push group); 0 for a feed that
    /// ended at once.
    pub fn key(&self) -> u64 {
        self.key
    }
}

/// The request body of a subscription with demand lines (client end):
/// the lines queued by [`crate::client::PushLink`], coalesced into one
/// DATA frame per poll. It ends when the link drops its sender.
pub struct DemandBody {
    pub(crate) rx: mpsc::UnboundedReceiver<Bytes>,
}

/// The next DATA frame of a channel-fed body: everything queued now,
/// coalesced into one frame (one frame per poll, not per message).
fn poll_coalesced(
    rx: &mut mpsc::UnboundedReceiver<Bytes>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<http_body::Frame<Bytes>, std::convert::Infallible>>> {
    match rx.poll_recv(cx) {
        Poll::Ready(Some(first)) => {
            let mut more = Vec::new();
            while let Ok(b) = rx.try_recv() {
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

impl http_body::Body for DemandBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        poll_coalesced(&mut self.rx, cx)
    }
}

impl http_body::Body for CreditFeed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        poll_coalesced(&mut self.rx, cx)
    }
}

impl Drop for CreditFeed {
    fn drop(&mut self) {
        self.rx.close();
        if let Some(hub) = self.hub.upgrade() {
            let mut st = hub.lock();
            // Only our own stream: a resubscription may have replaced it.
            if st.streams.get(&self.key).is_some_and(|tx| tx.is_closed()) {
                st.remove_stream(self.key, &hub.open);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// The (client, limit) pushes of the feed's next frame.
    async fn next_pushes(feed: &mut CreditFeed) -> Vec<(u64, u64)> {
        let frame = feed.frame().await.unwrap().unwrap().into_data().unwrap();
        let (mut buf, mut got) = (frame.to_vec(), Vec::new());
        wire::decode_pushes(&mut buf, &mut got);
        got
    }

    #[tokio::test]
    async fn grants_are_routed_coalesced_and_dropped_with_their_stream() {
        let hub = PushHub::new();
        let c1 = hub.next_conn();
        let c2 = hub.next_conn();
        assert_ne!(c1, c2);
        assert!(!hub.active());
        assert_eq!(hub.route(1, c1, 10), None, "no such stream yet");
        let mut a = hub.subscribe(c1, 10);
        let b = hub.subscribe(c2, 20);
        assert!(hub.active());
        let ka = hub.route(1, c1, 10).unwrap();
        assert_eq!(hub.route(2, c1, 10), Some(ka));
        let kb = hub.route(3, c2, 20).unwrap();
        assert_ne!(ka, kb, "one push group per stream");
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
        let mut got = next_pushes(&mut a).await;
        got.sort();
        assert_eq!(got, vec![(1, 5), (1, 6), (2, 7)]);
        drop(b);
        let d = hub.deliver(&mut vec![(3, Feedback::CreditLimit(2))]);
        assert_eq!(d.credits, 0, "stream 20 is closed");
        assert!(hub.active(), "stream 10 is still open");
        drop(a);
        assert!(!hub.active());
    }

    #[tokio::test]
    async fn stream_ids_only_name_streams_of_their_own_connection() {
        let hub = PushHub::new();
        let (c1, c2) = (hub.next_conn(), hub.next_conn());
        let mut a = hub.subscribe(c1, 7);
        assert_eq!(
            hub.route(5, c2, 7),
            None,
            "a client on connection 2 cannot name connection 1's stream"
        );
        // Connection 2 subscribing the same id gets its own stream; it
        // does not replace connection 1's.
        let mut b = hub.subscribe(c2, 7);
        let ka = hub.route(1, c1, 7).unwrap();
        let kb = hub.route(2, c2, 7).unwrap();
        assert_ne!(ka, kb);
        hub.deliver(&mut vec![
            (1, Feedback::CreditLimit(3)),
            (2, Feedback::CreditLimit(4)),
        ]);
        assert_eq!(
            next_pushes(&mut a).await,
            vec![(1, 3)],
            "connection 1 gets only its client's"
        );
        assert_eq!(next_pushes(&mut b).await, vec![(2, 4)]);
        // A resubscription on the same connection replaces its stream: the
        // old body ends, and its routes go with it.
        let _a2 = hub.subscribe(c1, 7);
        assert!(a.frame().await.is_none(), "the replaced stream ends");
        let d = hub.deliver(&mut vec![(1, Feedback::CreditLimit(9))]);
        assert_eq!(d.lost, 1, "client 1 must register again");
    }

    #[tokio::test]
    async fn demand_lines_reach_the_sink_only_for_the_streams_own_clients() {
        let hub = PushHub::new();
        let got = Arc::new(Mutex::new(Vec::new()));
        assert!(!hub.accepts_demand(), "no sink yet");
        let g = got.clone();
        hub.set_demand_sink(Box::new(move |lines| {
            g.lock().unwrap().extend(lines.drain(..));
        }));
        assert!(hub.accepts_demand());
        let (c1, c2) = (hub.next_conn(), hub.next_conn());
        let a = hub.subscribe(c1, 1);
        let b = hub.subscribe(c2, 1);
        let (ka, kb) = (a.key(), b.key());
        hub.route(10, c1, 1).unwrap();
        hub.route(20, c2, 1).unwrap();
        let mut body = Vec::new();
        wire::encode_demand(&mut body, 10, 1, 900);
        wire::encode_demand(&mut body, 20, 3, 900); // another connection's client
        wire::encode_demand(&mut body, 30, 1, 900); // not routed at all
        body.extend_from_slice(b"garbage\n");
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(hub.clone().read_demand(ka, DemandBody { rx }));
        // Split mid-line: the partial line waits for the rest.
        tx.send(Bytes::copy_from_slice(&body[..7])).unwrap();
        tx.send(Bytes::copy_from_slice(&body[7..])).unwrap();
        drop(tx);
        tokio::time::timeout(std::time::Duration::from_secs(30), reader)
            .await
            .expect("the reader ends with its body")
            .unwrap();
        assert!(hub.signals_demand(ka));
        assert!(!hub.signals_demand(kb), "only the stream that sent lines");
        assert_eq!(*got.lock().unwrap(), vec![(10, 1, 900)]);
        hub.set_accept_demand(false);
        assert!(!hub.accepts_demand());
        drop(a);
        assert!(!hub.signals_demand(ka), "forgotten with its stream");
        drop(b);
    }

    #[tokio::test]
    async fn close_ends_every_stream_and_refuses_new_ones() {
        let hub = PushHub::new();
        let c = hub.next_conn();
        let mut a = hub.subscribe(c, 1);
        hub.route(9, c, 1).unwrap();
        hub.close();
        assert!(!hub.active());
        let end = tokio::time::timeout(std::time::Duration::from_secs(30), a.frame()).await;
        assert!(matches!(end, Ok(None)), "the open stream ends");
        let mut late = hub.subscribe(c, 2);
        assert!(late.frame().await.is_none(), "a new one ends at once");
        assert!(!hub.active());
        assert_eq!(hub.route(9, c, 2), None);
        drop(a);
        drop(late);
        assert!(!hub.active(), "no double count on drop");
    }
}
