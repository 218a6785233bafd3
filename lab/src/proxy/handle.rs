//! One request, from either server: read whole, told to an operation, faulted on its
//! operation's first attempt, forwarded, and what its client is given noted.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use super::answers::{stopping, text};
use super::client_watch::{ClientWatch, Presence};
use super::forward::forward;
use super::shared::Shared;
use crate::fault::Fault;
use crate::goaway::Stream;
use crate::ledger::{Answer, Attempt};
use crate::unanswered::{Unanswered, DROPPED, REFUSED};
use tower_retry_safety::BoxError;

type Answered = Result<Response<Full<Bytes>>, Unanswered>;

/// The client a request came from: its HTTP/1.1 connection, or its HTTP/2 stream (through
/// which it is forwarded only while the connection has not gone away).
#[derive(Clone, Debug)]
pub(super) enum Peer {
    Http1(Arc<ClientWatch>),
    Http2(Stream),
}

impl Peer {
    fn stream(&self) -> Option<&Stream> {
        match self {
            Peer::Http1(_) => None,
            Peer::Http2(stream) => Some(stream),
        }
    }
}

/// One request: its body read whole, its operation's attempt begun, then faulted or
/// forwarded.
pub(super) async fn handle<B>(shared: Arc<Shared>, req: Request<B>, peer: Peer) -> Answered
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let config = &shared.config;
    let (parts, body) = req.into_parts();
    if parts.method == Method::CONNECT {
        // A tunnel, not a request to forward: its body (the tunnel's bytes) would never end.
        return Ok(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the fault lab is a reverse proxy: CONNECT is not forwarded\n",
        ));
    }
    let body = match read_body(&shared, body, &peer).await? {
        Ok(body) => body,
        Err(too_large) => return Ok(too_large),
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let signals = config
        .identity
        .identify(&parts.method, &path_and_query, &parts.headers, &body);
    let (kind, route) = config.routes.classify(&parts.method, parts.uri.path());
    let Some(attempt) = shared.ledger.begin(&signals, kind, route) else {
        return Ok(stopping());
    };
    // Counted, never sent: a GOAWAY left the stream out (its client takes it as not processed).
    if peer.stream().is_some_and(Stream::is_refused) {
        shared.ledger.answered(&attempt, Answer::Lost);
        return Err(REFUSED);
    }
    if let Some(unforwarded) = before_forwarding(&shared, &attempt, &peer) {
        return unforwarded;
    }
    forwarded(shared, attempt, peer, parts, path_and_query, body).await
}

/// The request's body, whole; the inner `Err` is the 413 for one over `--max-body`.
async fn read_body<B>(
    shared: &Shared,
    body: B,
    peer: &Peer,
) -> Result<Result<Bytes, Response<Full<Bytes>>>, Unanswered>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let collecting = Limited::new(body, shared.config.max_body).collect();
    let collected = match peer.stream() {
        Some(stream) => tokio::select! {
            biased;
            collected = collecting => collected,
            // A GOAWAY left the stream out before its request arrived whole (its client may
            // never send the rest): not counted, as it cannot be told apart.
            () = stream.refused() => return Err(REFUSED),
        },
        None => collecting.await,
    };
    match collected {
        Ok(body) => Ok(Ok(body.to_bytes())),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            // Never seen whole, so never checked: the run does not pass.
            shared.ledger.refused_over_limit();
            Ok(Err(text(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the fault lab reads request bodies up to its --max-body; this one is longer\n",
            )))
        }
        // The client's body broke off: there is no request to forward.
        Err(_) => Err(DROPPED),
    }
}

/// The faults that answer before the upstream is asked; `None` to forward.
fn before_forwarding(shared: &Shared, attempt: &Attempt, peer: &Peer) -> Option<Answered> {
    let lost = || shared.ledger.answered(attempt, Answer::Lost);
    Some(match attempt.fault {
        Fault::TooManyRequestsBeforeApply => {
            let mut res = text(StatusCode::TOO_MANY_REQUESTS, "");
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("0"));
            answered(shared, attempt, peer, res)
        }
        Fault::InternalErrorBeforeApply => {
            let res = text(StatusCode::INTERNAL_SERVER_ERROR, "");
            answered(shared, attempt, peer, res)
        }
        Fault::ResetBeforeForwarding => {
            lost();
            Err(DROPPED)
        }
        Fault::RefusedStream => {
            lost();
            Err(REFUSED)
        }
        Fault::GoAwayBeforeForwarding => {
            lost();
            Err(match peer.stream() {
                // HTTP/1.1 has no GOAWAY: the connection is closed, as for a reset.
                None => DROPPED,
                Some(stream) if stream.go_away_before_forwarding() => Unanswered::GoneAway,
                // Another stream's GOAWAY came first: refused, as every stream it left out.
                Some(_) => REFUSED,
            })
        }
        _ => return None,
    })
}

/// Forwards the attempt, then gives the client the upstream's answer, or the fault's.
async fn forwarded(
    shared: Arc<Shared>,
    attempt: Attempt,
    peer: Peer,
    parts: Parts,
    path_and_query: String,
    body: Bytes,
) -> Answered {
    // Forwarded and counted in a task of its own: a client that gives up (the server then
    // drops this future) does not stop a request the upstream may already be running, nor
    // its count.
    let forwarding = tokio::spawn({
        let shared = shared.clone();
        let stream = peer.stream().cloned();
        async move {
            // On HTTP/2, only while the connection has not gone away.
            if stream.is_some_and(|s| !s.admit()) {
                return (attempt, None);
            }
            let res = forward(&shared, &attempt, &parts, &path_and_query, body).await;
            (attempt, Some(res))
        }
    });
    let (attempt, res) = forwarding.await.map_err(|_| DROPPED)?;
    let Some(res) = res else {
        // Not forwarded: the GOAWAY leaves the stream unprocessed.
        shared.ledger.answered(&attempt, Answer::Lost);
        return Err(REFUSED);
    };
    let res = match res {
        Ok(res) => res,
        Err(res) => return answered(&shared, &attempt, &peer, res),
    };
    after_apply(&shared, &attempt, &peer, res).await
}

/// The faults that strike once the upstream has answered.
async fn after_apply(
    shared: &Shared,
    attempt: &Attempt,
    peer: &Peer,
    res: Response<Full<Bytes>>,
) -> Answered {
    match attempt.fault {
        Fault::DropAfterApply => {
            shared.ledger.answered(attempt, Answer::Lost);
            Err(DROPPED)
        }
        Fault::GoAwayAfterApply => {
            shared.ledger.answered(attempt, Answer::Lost);
            match peer.stream() {
                // HTTP/1.1: the connection is closed, as for drop-after-apply.
                None => Err(DROPPED),
                Some(stream) => {
                    stream.go_away_after_apply();
                    Err(Unanswered::GoneAway)
                }
            }
        }
        Fault::SlowAfterApply => {
            // Noted only if the hold ends before the client gives up (the server drops
            // this future when the client closes the connection or resets the stream).
            tokio::time::sleep(shared.config.slow).await;
            answered(shared, attempt, peer, res)
        }
        Fault::UnavailableAfterApply => {
            let res = text(StatusCode::SERVICE_UNAVAILABLE, "");
            answered(shared, attempt, peer, res)
        }
        _ => answered(shared, attempt, peer, res),
    }
}

/// Notes what the client is given, and gives it. An HTTP/1.1 client that closed its
/// connection is given nothing (the connection is closed), and noted so: its answer
/// would never arrive. One whose pipelined requests are still unread may have closed behind
/// them: its answer is noted as unconfirmed until a later look finds it there.
fn answered(
    shared: &Shared,
    attempt: &Attempt,
    peer: &Peer,
    res: Response<Full<Bytes>>,
) -> Answered {
    let status = res.status().as_u16();
    let answer = match peer {
        Peer::Http1(watch) => match watch.presence() {
            Presence::Gone => {
                shared.ledger.answered(attempt, Answer::Lost);
                return Err(DROPPED);
            }
            Presence::There => {
                shared.ledger.confirm(watch.take_unconfirmed());
                Answer::Status(status)
            }
            Presence::Hidden => {
                if (200..300).contains(&status) {
                    watch.given_unconfirmed(attempt.unconfirmed());
                }
                Answer::Unconfirmed(status)
            }
        },
        Peer::Http2(_) => Answer::Status(status),
    };
    shared.ledger.answered(attempt, answer);
    Ok(res)
}
