//! The client-side apiserver rate limit as a tower layer under the kube client: every
//! request waits for a token of one bucket shared by all reconciles of this worker.
//!
//! The kube client drives its stack from one buffer task, which calls `poll_ready` before
//! each `call`; holding `poll_ready` until a token is free delays the request itself, not
//! just its response. Requests so wait one at a time, in order, and the time spent holding
//! them is counted ([`RateLimitCounters`]).

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Instant,
};

use switchyard_reconciler_core::ratelimit::TokenBucket;
use tower::{Layer, Service};

use crate::metrics::RateLimitCounters;

#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<TokenBucket>>,
    counters: RateLimitCounters,
}

impl RateLimitLayer {
    pub fn new(qps: f64, burst: u32, counters: RateLimitCounters) -> Self {
        Self {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst, Instant::now()))),
            counters,
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            counters: self.counters.clone(),
            token: false,
            sleep: None,
            waiting_since: None,
        }
    }
}

pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    counters: RateLimitCounters,
    /// A token taken for the next call.
    token: bool,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// When the next call started waiting for a token, if it had to.
    waiting_since: Option<Instant>,
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
            let now = Instant::now();
            let taken = self
                .bucket
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .try_take(now);
            match taken {
                Ok(()) => {
                    self.token = true;
                    if let Some(since) = self.waiting_since.take() {
                        self.counters
                            .held
                            .inc_by(now.saturating_duration_since(since).as_secs_f64());
                        self.counters.waited.inc();
                    }
                }
                Err(wait) => {
                    self.waiting_since.get_or_insert(now);
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
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
    async fn calls_beyond_the_burst_wait_for_tokens_and_are_counted() {
        let counters = RateLimitCounters::default();
        let layer = RateLimitLayer::new(20.0, 5, counters.clone());
        let mut service = layer.layer(tower::service_fn(|()| async { Ok::<_, Infallible>(()) }));
        let start = Instant::now();
        for _ in 0..5 {
            service.ready().await.unwrap().call(()).await.unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_millis(40),
            "the burst passes at once"
        );
        assert_eq!(counters.waited.get(), 0, "nothing waited within the burst");
        for _ in 0..4 {
            service.ready().await.unwrap().call(()).await.unwrap();
        }
        // Four more at 20 per second take about 200 ms, each held for its token.
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(190), "{elapsed:?}");
        assert_eq!(counters.waited.get(), 4);
        let held = counters.held.get();
        assert!(
            held >= 0.19 && held <= elapsed.as_secs_f64(),
            "held {held} s of {elapsed:?}"
        );
    }
}
