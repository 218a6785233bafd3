//! A retry replays what was sent and continues from the caller's body where the last attempt
//! stopped: an upload cut in the middle, the exact size hint kept, `UnsyncBoxBody` and `Either`
//! bodies, and a recording that shares the caller's chunks and lets go of them when the request
//! ends.

use std::io;
use std::time::Duration;

use crate::replay_reader::{policy, put, send, stream, whole, Chunks, End, Reader, Received};
use bytes::Bytes;
use http_body::Frame;
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Either, Full, StreamBody};
use tower::{Layer, ServiceExt};
use tower_retry_safety::RetryReport;

/// An upload cut in the middle is retried: the retry replays what was sent and reads the rest
/// from the caller's body.
#[tokio::test(start_paused = true)]
async fn an_upload_cut_in_the_middle_is_replayed_then_continued() {
    let chunks: Chunks = (0..6).map(|i| vec![i as u8; 100]).collect();
    let reader = Reader::new(vec![(3, End::Reset), (99, End::Ok)]);
    let body = stream(&chunks, true).boxed();
    let res = send(policy(64 * 1024), &reader, put(body)).await.unwrap();
    let got = reader.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].data.len(), 3);
    assert_eq!(
        Received {
            exact_len: None,
            ..got[1].clone()
        },
        whole(&chunks, true)
    );
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 2);
}

/// A retry replays the exact size the first attempt declared, so a transport sends the same
/// content-length again.
#[tokio::test(start_paused = true)]
async fn a_replay_keeps_the_exact_size_hint() {
    let body = Full::new(Bytes::from_static(b"0123456789"))
        .map_err(|never| match never {})
        .boxed();
    let reader = Reader::new(vec![(1, End::Reset), (99, End::Reset), (99, End::Ok)]);
    send(policy(1024), &reader, put(body)).await.unwrap();
    let got = reader.received();
    let hints: Vec<_> = got.iter().map(|g| g.exact_len).collect();
    assert_eq!(hints, [Some(10), Some(10), Some(10)]);
    assert_eq!(got[2].data.concat(), b"0123456789");
}

/// `UnsyncBoxBody` and `Either` record as `BoxBody` does.
#[tokio::test(start_paused = true)]
async fn unsync_boxed_and_either_bodies_are_replayed() {
    let chunks: Chunks = vec![b"left".to_vec(), b"right".to_vec()];
    let reader = Reader::new(vec![(1, End::Reset), (99, End::Ok)]);
    let body: UnsyncBoxBody<Bytes, io::Error> = stream(&chunks, false).boxed_unsync();
    send(policy(1024), &reader, put(body)).await.unwrap();
    assert_eq!(reader.received()[1].data.concat(), b"leftright");

    let reader = Reader::new(vec![(1, End::Reset), (99, End::Ok)]);
    let body: Either<BoxBody<Bytes, io::Error>, Full<Bytes>> =
        Either::Left(stream(&chunks, false).boxed());
    let out = policy(1024).layer(reader.clone()).oneshot(put(body)).await;
    assert_eq!(RetryReport::of(&out.unwrap()).unwrap().attempts(), 2);
    assert_eq!(reader.received()[1].data.concat(), b"leftright");
}

/// The recording holds the caller's chunks, not copies, and lets go of them when the request
/// ends — also when the transport still holds the last attempt's body (then at its next
/// frame).
#[tokio::test(start_paused = true)]
async fn the_recording_shares_the_chunks_and_lets_go_when_the_request_ends() {
    let (a, b) = (Bytes::from(vec![5u8; 4096]), Bytes::from(vec![6u8; 4096]));
    let frames: Vec<io::Result<_>> = vec![Ok(Frame::data(a.clone())), Ok(Frame::data(b.clone()))];
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    // Each attempt reads one chunk; the server answers the second with 200 and its
    // transport keeps the body, as hyper does while it is still sending it.
    let mut reader = Reader::new(vec![(1, End::Reset), (1, End::Ok)]);
    reader.holds = true;
    // The first attempt's body is let go of during the backoff, as a transport would.
    let hold = reader.hold.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        hold.lock().unwrap().clear();
    });
    let res = send(policy(64 * 1024), &reader, put(body)).await.unwrap();
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 2);
    // The chunk the retry sent is the caller's own bytes, not a copy.
    assert_eq!(reader.received()[1].data[0].as_ptr(), a.as_ptr());
    reader.log.lock().unwrap().clear();
    assert!(!a.is_unique(), "the held body's recording has it");
    // The request has ended: at its next frame the held body drops the recording and goes on
    // with the caller's body.
    let mut held = reader.hold.lock().unwrap().pop().unwrap();
    let body = held.downcast_mut::<BoxBody<Bytes, io::Error>>().unwrap();
    let next = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(next.as_ptr(), b.as_ptr());
    drop(next);
    assert!(a.is_unique(), "the recording still holds the first chunk");
    drop(held);
    assert!(b.is_unique());
}
