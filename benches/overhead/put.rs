//! A 16 KiB PUT through the layer as a stream body (recorded as it is read) against the same
//! PUT as `Full<Bytes>`, with and without the layer.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Service, ServiceExt};
use tower_retry_safety::RetryPolicy;

use super::{Res, ALLOCS};
use retry_safety_testing::bench::{median, print_ratio, Req};

const PUT_LEN: usize = 16 * 1024;
const PUT_CHUNK: usize = 4 * 1024;

/// Reads each request's body to its end, as a transport would, and answers 200.
#[derive(Clone)]
struct Drain;

impl<B> Service<Request<B>> for Drain
where
    B: http_body::Body + Unpin,
    B::Error: std::fmt::Debug,
{
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        use bytes::Buf;
        // Both bodies here are ready at once: polled with a no-op waker, as hyper would.
        let mut body = req.into_body();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut read = 0;
        while let Poll::Ready(Some(frame)) = std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
            read += frame
                .expect("frame")
                .data_ref()
                .map_or(0, |d| d.remaining());
        }
        assert_eq!(read, PUT_LEN);
        ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }
}

type StreamReq = Request<http_body_util::combinators::BoxBody<Bytes, Infallible>>;

/// A 16 KiB PUT in 4 KiB chunks, streamed: the layer records it as it is read.
fn stream_put_request(chunks: &[Bytes]) -> StreamReq {
    use http_body_util::BodyExt;
    let frames: Vec<Result<http_body::Frame<Bytes>, Infallible>> = chunks
        .iter()
        .map(|c| Ok(http_body::Frame::data(c.clone())))
        .collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed();
    Request::put("https://api.example.com/v1/files/1")
        .body(body)
        .expect("valid request")
}

/// The same PUT as one `Full<Bytes>`: the layer keeps a copy (a handle) of it.
fn full_put_request(whole: &Bytes) -> Req {
    Request::put("https://api.example.com/v1/files/1")
        .body(Full::new(whole.clone()))
        .expect("valid request")
}

async fn send_put<S, B>(svc: &mut S, req: Request<B>)
where
    S: Service<Request<B>, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let res = ServiceExt::<Request<B>>::ready(svc)
        .await
        .expect("ready")
        .call(req)
        .await;
    black_box(res.expect("ok"));
}

/// `n` 16 KiB PUTs through one variant, for instruction counts: `stream_put` and `full_put`
/// (through the layer), `bare_stream_put` and `bare_full_put` (without it).
pub(crate) async fn put_only(policy: &RetryPolicy, variant: &str, n: u64) {
    let whole = Bytes::from(vec![7u8; PUT_LEN]);
    let chunks: Vec<Bytes> = (0..PUT_LEN / PUT_CHUNK)
        .map(|i| whole.slice(i * PUT_CHUNK..(i + 1) * PUT_CHUNK))
        .collect();
    let mut layer = tower::Layer::layer(policy, Drain);
    let mut bare = Drain;
    for _ in 0..n {
        match variant {
            "stream_put" => send_put(&mut layer, stream_put_request(&chunks)).await,
            "full_put" => send_put(&mut layer, full_put_request(&whole)).await,
            "bare_stream_put" => send_put(&mut bare, stream_put_request(&chunks)).await,
            "bare_full_put" => send_put(&mut bare, full_put_request(&whole)).await,
            other => panic!("unknown variant {other}"),
        }
    }
}

/// A 16 KiB PUT through the layer as a stream body (recorded as it is read) against the same
/// PUT as `Full<Bytes>` (copied as a handle), both read to the end by the inner service.
pub(crate) async fn stream_put(policy: &RetryPolicy) {
    let whole = Bytes::from(vec![7u8; PUT_LEN]);
    let chunks: Vec<Bytes> = (0..PUT_LEN / PUT_CHUNK)
        .map(|i| whole.slice(i * PUT_CHUNK..(i + 1) * PUT_CHUNK))
        .collect();
    let mut stream_layer = tower::Layer::layer(policy, Drain);
    let mut full_layer = tower::Layer::layer(policy, Drain);
    let (mut stream_bare, mut full_bare) = (Drain, Drain);
    macro_rules! put {
        ($svc:expr, $req:expr) => {{
            send_put(&mut $svc, $req).await
        }};
    }
    macro_rules! allocs {
        ($svc:expr, $req:expr) => {{
            const N: u64 = 10_000;
            let before = ALLOCS.load(Ordering::Relaxed);
            for _ in 0..N {
                put!($svc, $req);
            }
            (ALLOCS.load(Ordering::Relaxed) - before) as f64 / N as f64
        }};
    }
    for _ in 0..20_000 {
        put!(stream_layer, stream_put_request(&chunks));
        put!(full_layer, full_put_request(&whole));
    }
    let stream_allocs = allocs!(stream_layer, stream_put_request(&chunks));
    let stream_bare_allocs = allocs!(stream_bare, stream_put_request(&chunks));
    let full_allocs = allocs!(full_layer, full_put_request(&whole));
    let (mut stream, mut full, mut bare, mut bare_full) = (vec![], vec![], vec![], vec![]);
    let batch = 2_000;
    let deadline = Instant::now() + Duration::from_secs(30);
    for _ in 0..201 {
        let start = Instant::now();
        for _ in 0..batch {
            put!(stream_layer, stream_put_request(&chunks));
        }
        stream.push(start.elapsed().as_nanos() as f64 / batch as f64);
        let start = Instant::now();
        for _ in 0..batch {
            put!(full_layer, full_put_request(&whole));
        }
        full.push(start.elapsed().as_nanos() as f64 / batch as f64);
        let start = Instant::now();
        for _ in 0..batch {
            put!(stream_bare, stream_put_request(&chunks));
        }
        bare.push(start.elapsed().as_nanos() as f64 / batch as f64);
        let start = Instant::now();
        for _ in 0..batch {
            put!(full_bare, full_put_request(&whole));
        }
        bare_full.push(start.elapsed().as_nanos() as f64 / batch as f64);
        if Instant::now() > deadline {
            break;
        }
    }
    let allocs = [stream_allocs, stream_bare_allocs, full_allocs];
    print_puts([stream, full, bare, bare_full], allocs);
}

/// The PUTs' ratios and medians, from the samples of each round (`[layer as a stream, layer
/// as Full, stream without the layer, Full without it]`), and the allocations per request
/// (`[layer as a stream, the stream without the layer, layer as Full]`).
fn print_puts(samples: [Vec<f64>; 4], allocs: [f64; 3]) {
    let [mut stream, mut full, mut bare, mut bare_full] = samples;
    let [stream_allocs, stream_bare_allocs, full_allocs] = allocs;
    // Each round's ratios, before the medians sort the samples.
    print_ratio("layer_stream_put/layer_full_put", &stream, &full, "");
    print_ratio("layer_stream_put/bare_stream_put", &stream, &bare, "");
    // What the stream costs before any layer: building it and reading it frame by frame.
    print_ratio("bare_stream_put/bare_full_put", &bare, &bare_full, "");
    // The recording's own cost: how much more a stream costs than `Full` through the layer,
    // over how much more it costs without it.
    let with_layer: Vec<f64> = stream.iter().zip(&full).map(|(s, f)| s / f).collect();
    let without: Vec<f64> = bare.iter().zip(&bare_full).map(|(s, f)| s / f).collect();
    print_ratio("recording_overhead", &with_layer, &without, "");
    let (stream, full, bare) = (median(&mut stream), median(&mut full), median(&mut bare));
    let bare_full = median(&mut bare_full);
    println!(
        "16 KiB PUT, median ns/request: layer as a stream {stream:.1}, layer as Full {full:.1}, \
         stream without the layer {bare:.1}, Full without the layer {bare_full:.1}"
    );
    println!(
        "allocations/request: layer as a stream {stream_allocs:.2} (the recording: {:.2} over \
         the stream without the layer), layer as Full {full_allocs:.2}",
        stream_allocs - stream_bare_allocs
    );
    println!(
        "layer's cost: +{:.0} ns on the stream (recording included), +{:.0} ns on Full",
        stream - bare,
        full - bare_full
    );
}
