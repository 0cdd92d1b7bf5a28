//! The client-side apiserver rate limit as a tower layer under the kube client: every
//! request waits for a token of one bucket shared by all reconciles of this worker.
//!
//! The kube client drives its stack from one buffer task, which calls `poll_ready` before
//! each `call`; holding `poll_ready` until a token is free delays the request itself, not
//! just its response.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Instant,
};

use switchyard_reconciler_core::ratelimit::TokenBucket;
use tower::{Layer, Service};

#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl RateLimitLayer {
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst, Instant::now()))),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            token: false,
            sleep: None,
        }
    }
}

pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    /// A token taken for the next call.
    token: bool,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.token {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            let taken = self
                .bucket
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .try_take(Instant::now());
            match taken {
                Ok(()) => self.token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, time::Duration};

    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn calls_beyond_the_burst_wait_for_tokens() {
        let layer = RateLimitLayer::new(20.0, 5);
        let mut service = layer.layer(tower::service_fn(|()| async { Ok::<_, Infallible>(()) }));
        let start = Instant::now();
        for _ in 0..5 {
            service.ready().await.unwrap().call(()).await.unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_millis(40),
            "the burst passes at once"
        );
        for _ in 0..4 {
            service.ready().await.unwrap().call(()).await.unwrap();
        }
        // Four more at 20 per second take about 200 ms.
        assert!(
            start.elapsed() >= Duration::from_millis(190),
            "{:?}",
            start.elapsed()
        );
    }
}
