//! Sending the check's requests, and what came back.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use super::{Ctx, MAX_BODY, SETTLE_PAUSE, SETTLE_TRIES, VARIANT};
use crate::headers::{HOLD_HEADER, RUN_HEADER};

/// A server's answer, or how the request failed.
#[derive(Clone, Debug)]
pub(super) enum Reply {
    Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    /// No answer: the connection closed, or no answer in time.
    NoAnswer,
}

impl Reply {
    pub(super) fn status(&self) -> Option<StatusCode> {
        match self {
            Reply::Answer { status, .. } => Some(*status),
            Reply::NoAnswer => None,
        }
    }

    pub(super) fn is_success(&self) -> bool {
        self.status().is_some_and(|s| s.is_success())
    }

    /// What names the handler run behind a 2xx: its run header, else its body. Only the run
    /// header proves two answers came from one run; equal bodies may be two runs.
    pub(super) fn run(&self) -> Option<Vec<u8>> {
        match self {
            Reply::Answer {
                status,
                headers,
                body,
            } if status.is_success() => Some(match headers.get(RUN_HEADER) {
                Some(run) => run.as_bytes().to_vec(),
                None => body.to_vec(),
            }),
            _ => None,
        }
    }

    /// Whether the answer names its handler run (the run header).
    pub(super) fn names_run(&self) -> bool {
        matches!(self, Reply::Answer { headers, .. } if headers.contains_key(RUN_HEADER))
    }

    pub(super) fn shown(&self) -> String {
        match self.status() {
            Some(status) => status.as_u16().to_string(),
            None => "no answer".to_owned(),
        }
    }
}

impl Ctx<'_> {
    pub(super) fn key(&self, rule: &str) -> String {
        format!("\"lab-{}-{rule}\"", self.run)
    }

    pub(super) fn payload(&self, rule: &str, variant: u32) -> Bytes {
        let tag = format!("lab-{}-{rule}-{variant}", self.run);
        match &self.check.body {
            Some(template) => Bytes::from(template.replace(VARIANT, &tag)),
            None => Bytes::from(format!(
                "{{\"lab\":\"{}\",\"rule\":\"{rule}\",\"variant\":{variant}}}",
                self.run
            )),
        }
    }

    pub(super) async fn send(
        &self,
        key: &str,
        body: Bytes,
        extra: &[(&'static str, String)],
    ) -> Reply {
        let check = self.check;
        let uri = format!(
            "{}://{}{}",
            check.target.scheme_str().unwrap_or("http"),
            check.target.authority().map_or("", |a| a.as_str()),
            check.path
        );
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = check.method.clone();
        let Ok(uri) = uri.parse() else {
            return Reply::NoAnswer;
        };
        *req.uri_mut() = uri;
        let headers = req.headers_mut();
        headers.extend(check.headers.clone());
        if !headers.contains_key(http::header::CONTENT_TYPE) {
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        if let Ok(key) = HeaderValue::from_str(key) {
            headers.insert(check.key_header.clone(), key);
        }
        for (name, value) in extra {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(*name, value);
            }
        }
        let limit = check.hold + Duration::from_secs(30);
        let sent = async {
            let res = self.client.request(req).await.ok()?;
            let (head, body) = res.into_parts();
            let body = Limited::new(body, MAX_BODY)
                .collect()
                .await
                .ok()?
                .to_bytes();
            Some(Reply::Answer {
                status: head.status,
                headers: head.headers,
                body,
            })
        };
        match tokio::time::timeout(limit, sent).await {
            Ok(Some(reply)) => reply,
            _ => Reply::NoAnswer,
        }
    }

    /// Sends a repeat, again while it gets 409 (the first may still be being stored).
    pub(super) async fn send_settled(&self, key: &str, body: Bytes) -> Reply {
        let mut reply = self.send(key, body.clone(), &[]).await;
        for _ in 0..SETTLE_TRIES {
            if reply.status() != Some(StatusCode::CONFLICT) {
                break;
            }
            tokio::time::sleep(SETTLE_PAUSE).await;
            reply = self.send(key, body.clone(), &[]).await;
        }
        reply
    }

    pub(super) fn hold_header(&self) -> [(&'static str, String); 1] {
        [(HOLD_HEADER, self.check.hold.as_millis().to_string())]
    }

    /// Whether every request sends one payload: a `--body` without `{variant}`.
    pub(super) fn one_payload(&self) -> bool {
        self.check
            .body
            .as_ref()
            .is_some_and(|b| !b.contains(VARIANT))
    }
}

/// Runs the futures together and returns their outputs in order (no futures-util in the
/// library).
pub(super) async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future,
{
    let mut pinned: Vec<_> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in pinned.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
