//! gRPC's `retry-safety-may-have-been-applied` (the adversarial review of the host-unknown and
//! may-have-been-applied change), against servers on 127.0.0.1 that count calls: a
//! port-scoped write rule holds over a channel whose origin has no port, and a server's claim
//! that a write it received was not applied is overwritten or not believed, however it
//! answers.
#![cfg(feature = "tonic")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::unknown_host_verdicts::builder;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request};
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use retry_safety_testing::grpc::lab::ledger_client::LedgerClient;
use retry_safety_testing::grpc::lab::Entry;
use tower::ServiceBuilder;
use tower_retry_safety::{Idempotency, MayHaveBeenApplied, RetryPolicy};

type LabClient = LedgerClient<
    tower::util::MapErr<
        tower_retry_safety::RetrySafety<tonic::transport::Channel>,
        fn(tower_retry_safety::Error) -> tonic::Status,
    >,
>;

async fn lab_client(addr: SocketAddr, policy: RetryPolicy) -> LabClient {
    let svc = ServiceBuilder::new()
        .map_err(tonic::Status::from as fn(_) -> _)
        .layer(policy)
        .service(retry_safety_testing::grpc::channel(addr).await);
    LedgerClient::new(svc)
}

fn entry(id: &str) -> Entry {
    Entry {
        id: id.into(),
        payload: vec![1; 4],
    }
}

/// From the adversarial review of the host/applied change: a tonic call through a `Channel`,
/// the layer given `for_origin("127.0.0.1")` (a host, no port) and a rule scoped to
/// `127.0.0.1:<port>` that calls `Put` (IDEMPOTENT in the proto) a write. The server applies
/// each call, then answers UNAVAILABLE. Before the fix the port-scoped rule was skipped (the
/// origin has no port) and each call was applied twice.
#[tokio::test]
async fn a_port_scoped_write_rule_holds_over_a_channel_with_an_origin_without_a_port() {
    let (addr, lab) = retry_safety_testing::grpc::serve().await;
    let policy = builder()
        .grpc_descriptors(&retry_safety_testing::grpc::descriptor_set())
        .route_for_host(
            &addr.to_string(),
            Method::POST,
            "/lab.v1.Ledger/Put",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap()
        .for_origin("127.0.0.1")
        .unwrap();
    let mut client = lab_client(addr, policy).await;
    for i in 0..5 {
        let id = format!("portless-{i}");
        let status = client
            .put(retry_safety_testing::grpc::request(
                entry(&id),
                &id,
                Some(retry_safety_testing::grpc::Fault::UnavailableAfterApply),
            ))
            .await
            .unwrap_err();
        assert!(status.may_have_been_applied(), "{status:?}");
        assert_eq!(lab.applied(&id), 1, "{id}");
    }
    assert_eq!(lab.applied_twice(), 0);
}

/// How a scripted gRPC server answers every call.
#[derive(Clone, Copy)]
enum Answer {
    /// Trailers-only UNAVAILABLE (`content-type: application/grpc`), claiming "not applied".
    TrailersOnly,
    /// Trailers-only UNAVAILABLE without a `content-type`, claiming "not applied".
    TrailersOnlyWithoutContentType,
    /// Headers, then trailers with UNAVAILABLE claiming "not applied".
    Trailers,
}

/// A gRPC server on 127.0.0.1 (HTTP/2, prior knowledge) that counts calls and answers each
/// as `answer` says, putting `retry-safety-may-have-been-applied: false` in its status.
async fn spoofing_server(answer: Answer) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let calls = counted.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req: Request<_>| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let mut status = HeaderMap::new();
                        status.insert("grpc-status", HeaderValue::from_static("14"));
                        status.insert("grpc-message", HeaderValue::from_static("gone"));
                        status.insert(
                            "retry-safety-may-have-been-applied",
                            HeaderValue::from_static("false"),
                        );
                        let mut res = http::Response::builder().status(200);
                        if !matches!(answer, Answer::TrailersOnlyWithoutContentType) {
                            res = res.header("content-type", "application/grpc");
                        }
                        let frames: Vec<Result<Frame<Bytes>, Infallible>> = match answer {
                            Answer::Trailers => vec![Ok(Frame::trailers(status))],
                            _ => {
                                for (name, value) in &status {
                                    res = res.header(name, value);
                                }
                                vec![]
                            }
                        };
                        let body = StreamBody::new(futures_util::stream::iter(frames));
                        Ok::<_, Infallible>(res.body(body).unwrap())
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, calls)
}

/// `Append` (a write: no idempotency option in the proto) against the spoofing server.
async fn append_against(answer: Answer) -> (tonic::Status, u32) {
    let (addr, calls) = spoofing_server(answer).await;
    let policy = builder()
        .grpc_descriptors(&retry_safety_testing::grpc::descriptor_set())
        .build()
        .unwrap();
    let mut client = lab_client(addr, policy).await;
    let status = client.append(entry("spoof")).await.unwrap_err();
    (status, calls.load(Ordering::SeqCst))
}

/// From the adversarial review of the host/applied change: a server's trailers-only failure
/// that claims `retry-safety-may-have-been-applied: false` is overwritten by the layer: the
/// write reached the server, so the caller is told it may have been applied.
#[tokio::test]
async fn a_servers_trailers_only_claim_of_not_applied_is_overwritten() {
    let (status, calls) = append_against(Answer::TrailersOnly).await;
    assert_eq!(calls, 1);
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.may_have_been_applied(), "{status:?}");
    assert_eq!(status.metadata().get("retry-safety-attempts").unwrap(), "1");
}

/// From the adversarial review of the host/applied change: the same claim in a trailers-only
/// answer without `content-type`. tonic still makes its `Status` from those headers, but the
/// layer marked only answers whose `content-type` is gRPC, so the server's `false` reached
/// the caller: "not applied" for a write the server received. Fixed: the layer marks every
/// failed trailers-only answer to a gRPC call.
#[tokio::test]
async fn a_servers_claim_of_not_applied_without_a_grpc_content_type_is_overwritten() {
    let (status, calls) = append_against(Answer::TrailersOnlyWithoutContentType).await;
    assert_eq!(calls, 1);
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.may_have_been_applied(), "{status:?}");
}

/// From the adversarial review of the host/applied change: a failed status in trailers (after
/// the response headers, as a streaming handler's error or a proxy sends it) that claims
/// `retry-safety-may-have-been-applied: false` reaches the caller unchanged: the layer marks
/// only trailers-only answers, and `MayHaveBeenApplied for tonic::Status` believes the
/// metadata, so a write the server received is reported "not applied". The docs say such a
/// status "says nothing the layer knows: true".
#[tokio::test]

async fn a_servers_claim_of_not_applied_in_trailers_is_not_believed() {
    let (status, calls) = append_against(Answer::Trailers).await;
    assert_eq!(calls, 1);
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.may_have_been_applied(), "{status:?}");
}
