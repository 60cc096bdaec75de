//! Glue between tower and hyper 1.x over HTTP/2 (h2c): serve a tower
//! service on a listener, and a tower service that sends on an HTTP/2
//! client connection. Nothing Breakwater-specific lives here.

use crate::server::BoxError;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
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

/// An HTTP/2 client connection as a tower service. The response body is
/// read to the end before the response is returned.
#[derive(Clone)]
pub struct H2Transport {
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
}

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
}

impl Service<Request<Full<Bytes>>> for H2Transport {
    type Response = Response<Bytes>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Bytes>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.sender.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        let fut = self.sender.send_request(req);
        Box::pin(async move {
            let resp = fut.await?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await?.to_bytes();
            Ok(Response::from_parts(parts, bytes))
        })
    }
}
