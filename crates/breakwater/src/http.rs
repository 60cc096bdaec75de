//! Glue between tower and hyper 1.x over HTTP/2 (h2c): serve a tower
//! service on a listener, and a tower service that sends on an HTTP/2
//! client connection, and the two ends of a credit stream
//! ([`serve_with_push`], [`H2Transport::open_credit_stream`]).

use crate::client::PushLink;
use crate::push::{CreditFeed, DemandBody, PushHub};
use crate::server::BoxError;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::{TcpListener, TcpStream};
use tower::{Service, ServiceExt};

/// Adapts a cloneable tower service to hyper's `Service`. Errors become
/// responses: tower's `Overloaded` (LoadShed) a 503 with `bw-reject: limit`,
/// anything else a 500, so a failure is always answered at once.
#[derive(Clone)]
pub struct Hyper<S>(pub S);

impl<S> hyper::service::Service<Request<Incoming>> for Hyper<S>
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = Response<Full<Bytes>>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let svc = self.0.clone();
        Box::pin(async move {
            let result = svc.oneshot(req).await.map_err(Into::into);
            Ok(result.unwrap_or_else(|e: BoxError| {
                let overloaded = e.is::<tower::load_shed::error::Overloaded>();
                let (status, token) = if overloaded {
                    (StatusCode::SERVICE_UNAVAILABLE, "limit")
                } else {
                    (StatusCode::INTERNAL_SERVER_ERROR, "error")
                };
                let mut r = Response::new(Full::new(Bytes::new()));
                *r.status_mut() = status;
                r.headers_mut()
                    .insert(crate::wire::REJECT, http::HeaderValue::from_static(token));
                r
            }))
        })
    }
}

/// Accept HTTP/2 (prior knowledge) connections forever, serving `svc` on
/// each. Runs on the current tokio runtime.
pub async fn serve<S>(listener: TcpListener, svc: S, max_streams: u32) -> std::io::Result<()>
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let svc = Hyper(svc.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .max_concurrent_streams(max_streams)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// [`Hyper`] that also answers credit-stream subscriptions
/// (`bw-subscribe: <id>`) itself, with a never-ending body fed by `hub`.
#[derive(Clone)]
pub struct HyperPush<S> {
    svc: Hyper<S>,
    hub: Arc<PushHub>,
    /// This connection: stream ids are scoped to it, and every request
    /// that names a stream (`bw-stream`) carries it
    /// ([`crate::push::ConnId`]).
    conn: crate::push::ConnId,
}

type PushBody = Either<Full<Bytes>, CreditFeed>;

impl<S> hyper::service::Service<Request<Incoming>> for HyperPush<S>
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = Response<PushBody>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        if req.headers().contains_key(crate::wire::STREAM) {
            // Only a registration naming a credit stream needs it (the
            // extension map costs an allocation per request).
            req.extensions_mut().insert(self.conn);
        }
        let sub = req.headers().get(crate::wire::SUBSCRIBE).cloned();
        if let Some(raw) = sub {
            let r = match crate::wire::parse_stream(req.headers(), crate::wire::SUBSCRIBE) {
                Ok(Some(id)) => {
                    let demand =
                        req.headers().get(crate::wire::SIGNALS).is_some_and(|v| {
                            v.as_bytes() == crate::wire::SIGNALS_DEMAND.as_bytes()
                        }) && self.hub.accepts_demand();
                    let feed = self.hub.subscribe(self.conn, id);
                    let key = feed.key();
                    let mut r = Response::new(Either::Right(feed));
                    // Echoed, so a client can tell a subscription from a
                    // server that served the request as an ordinary RPC.
                    r.headers_mut().insert(crate::wire::SUBSCRIBE, raw);
                    if demand && key != 0 {
                        // Its request body carries demand lines (echoed:
                        // the client sends them only then).
                        tokio::spawn(self.hub.clone().read_demand(key, req.into_body()));
                        if let Ok(v) = http::HeaderValue::from_str(&self.hub.demand_echo()) {
                            r.headers_mut().insert(crate::wire::SIGNALS, v);
                        }
                    }
                    r
                }
                _ => {
                    let e = crate::wire::WireError::Malformed {
                        header: crate::wire::SUBSCRIBE,
                        value: String::from_utf8_lossy(raw.as_bytes()).into_owned(),
                    };
                    let mut r = Response::new(Either::Left(Full::new(Bytes::new())));
                    *r.status_mut() = e.status();
                    if let Ok(v) = http::HeaderValue::from_str(&e.token()) {
                        r.headers_mut().insert(crate::wire::REJECT, v);
                    }
                    r
                }
            };
            return Box::pin(std::future::ready(Ok(r)));
        }
        let fut = hyper::service::Service::call(&self.svc, req);
        Box::pin(async move { Ok(fut.await?.map(Either::Left)) })
    }
}

/// [`serve`], plus credit streams: a client connection may subscribe one
/// (`bw-subscribe`), and the explicit credits the server layer pushes to
/// `hub` ([`crate::server::Server::push_hub`]) are written into it.
pub async fn serve_with_push<S>(
    listener: TcpListener,
    svc: S,
    hub: Arc<PushHub>,
    max_streams: u32,
) -> std::io::Result<()>
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let svc = HyperPush {
            svc: Hyper(svc.clone()),
            hub: hub.clone(),
            conn: hub.next_conn(),
        };
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .max_concurrent_streams(max_streams)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// An HTTP/2 client connection as a tower service. The response body is
/// read to the end before the response is returned.
#[derive(Clone)]
pub struct H2Transport {
    sender: hyper::client::conn::http2::SendRequest<ReqBody>,
}

/// Request bodies on a client connection: whole (RPCs) or the demand lines
/// of a credit stream's subscription.
type ReqBody = Either<Full<Bytes>, DemandBody>;

impl H2Transport {
    /// Connect (prior-knowledge h2c) and drive the connection on the current
    /// tokio runtime.
    pub async fn connect(addr: SocketAddr) -> Result<Self, BoxError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(H2Transport { sender })
    }

    /// Subscribe this connection's credit stream and read it on a task of
    /// the current runtime. Clients made with
    /// [`crate::ClientLayer::layer_pushed`] on the returned link register
    /// with it and wait for pushed credits instead of sending credit
    /// waits (while the stream is up). Fails if the server does not serve
    /// credit streams ([`serve_with_push`]). The subscription asks for
    /// demand lines (`bw-signals: demand`); if the server echoes it, the
    /// link's drained clients send them ([`crate::push`]).
    pub async fn open_credit_stream(&self) -> Result<Arc<PushLink>, BoxError> {
        let link = PushLink::new();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut req = Request::new(Either::Right(DemandBody { rx }));
        req.headers_mut().insert(
            crate::wire::SUBSCRIBE,
            http::HeaderValue::from(link.stream_id()),
        );
        req.headers_mut().insert(
            crate::wire::SIGNALS,
            http::HeaderValue::from_static(crate::wire::SIGNALS_DEMAND),
        );
        let mut sender = self.sender.clone();
        futures_ready(&mut sender).await?;
        let resp = sender.send_request(req).await?;
        let echoed = resp
            .headers()
            .get(crate::wire::SUBSCRIBE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if !resp.status().is_success() || echoed != Some(link.stream_id()) {
            return Err(format!(
                "server does not serve credit streams (status {})",
                resp.status()
            )
            .into());
        }
        let sample = resp
            .headers()
            .get(crate::wire::SIGNALS)
            .and_then(|v| crate::wire::parse_signals_echo(v.as_bytes()));
        if let Some(n) = sample {
            link.enable_demand(tx, n);
        } // else `tx` drops here: the request body ends, no lines are sent
        link.set_live(true);
        tokio::spawn(link.clone().run(resp.into_body()));
        Ok(link)
    }
}

async fn futures_ready(
    sender: &mut hyper::client::conn::http2::SendRequest<ReqBody>,
) -> Result<(), BoxError> {
    std::future::poll_fn(|cx| sender.poll_ready(cx))
        .await
        .map_err(Into::into)
}

impl Service<Request<Full<Bytes>>> for H2Transport {
    type Response = Response<Bytes>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Bytes>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.sender.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        let fut = self.sender.send_request(req.map(Either::Left));
        Box::pin(async move {
            let resp = fut.await?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await?.to_bytes();
            Ok(Response::from_parts(parts, bytes))
        })
    }
}
