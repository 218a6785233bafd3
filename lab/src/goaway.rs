//! One HTTP/2 connection's GOAWAY: which streams were handed to the upstream, and the
//! last-stream-id once a fault sends one. Both sit under one lock, so that no stream is
//! forwarded after the GOAWAY and its last-stream-id is never below a stream that was.

use std::sync::Arc;

use tokio::sync::watch;

/// The connection's books; a `watch` channel's lock, whose change wakes the connection (to
/// shut down) and the streams the GOAWAY leaves out (to be refused).
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Set once, when a fault goes away: the GOAWAY's last-stream-id.
    pub(crate) last_stream_id: Option<u32>,
    /// The highest stream id handed to the upstream.
    highest_forwarded: u32,
    /// Streams on which nothing more is sent, not even a reset: faulted ones.
    silenced: Vec<u32>,
}

impl State {
    /// Whether frames of stream `id` are kept from the client.
    pub(crate) fn is_silenced(&self, id: u32) -> bool {
        self.silenced.contains(&id)
    }
}

/// Shared by a connection, its outgoing-bytes filter and its streams.
#[derive(Debug)]
pub(crate) struct GoAway {
    state: watch::Sender<State>,
}

impl GoAway {
    pub(crate) fn new() -> Arc<GoAway> {
        Arc::new(GoAway {
            state: watch::Sender::new(State::default()),
        })
    }

    /// The books as they are now (a read lock: hold it briefly, never across an await).
    pub(crate) fn state(&self) -> watch::Ref<'_, State> {
        self.state.borrow()
    }

    /// Resolves once a GOAWAY was decided.
    pub(crate) async fn gone_away(&self) {
        let mut rx = self.state.subscribe();
        // The sender lives as long as `self`: the wait cannot fail while we hold it.
        let _ = rx.wait_for(|s| s.last_stream_id.is_some()).await;
    }
}

/// One stream of the connection, as the proxy's handler sees it.
#[derive(Clone, Debug)]
pub(crate) struct Stream {
    id: u32,
    conn: Arc<GoAway>,
}

impl Stream {
    pub(crate) fn new(conn: Arc<GoAway>, id: u32) -> Stream {
        Stream { id, conn }
    }

    /// Whether the stream may be handed to the upstream: only before the GOAWAY, and then the
    /// GOAWAY's last-stream-id will cover it.
    pub(crate) fn admit(&self) -> bool {
        let mut admitted = false;
        self.conn.state.send_if_modified(|s| {
            if s.last_stream_id.is_none() {
                s.highest_forwarded = s.highest_forwarded.max(self.id);
                admitted = true;
            }
            // Nobody waits for this change.
            false
        });
        admitted
    }

    /// The fault `goaway-before-forwarding`: goes away with the highest id forwarded so far
    /// (0 if none: the stream was not forwarded, so it is not counted) and silences this
    /// stream. `false` when the connection had already gone away: the stream is then refused
    /// as any other not forwarded after the GOAWAY.
    pub(crate) fn go_away_before_forwarding(&self) -> bool {
        self.conn.state.send_if_modified(|s| {
            if s.last_stream_id.is_some() {
                return false;
            }
            s.last_stream_id = Some(s.highest_forwarded);
            s.silenced.push(self.id);
            true
        })
    }

    /// The fault `goaway-after-apply`: the stream was forwarded, so the GOAWAY (this one, or
    /// one already sent) covers it; it is silenced, its answer never sent.
    pub(crate) fn go_away_after_apply(&self) {
        self.conn.state.send_modify(|s| {
            if s.last_stream_id.is_none() {
                s.last_stream_id = Some(s.highest_forwarded.max(self.id));
            }
            s.silenced.push(self.id);
        });
    }

    /// Whether a GOAWAY left this stream out (its id above the last-stream-id).
    pub(crate) fn is_refused(&self) -> bool {
        let state = self.conn.state();
        state.last_stream_id.is_some_and(|last| self.id > last)
    }

    /// Resolves once a GOAWAY leaves this stream out (its id above the last-stream-id): the
    /// client takes it as not processed, and it never was (it was not admitted).
    pub(crate) async fn refused(&self) {
        let mut rx = self.conn.state.subscribe();
        let _ = rx
            .wait_for(|s| s.last_stream_id.is_some_and(|last| self.id > last))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_stream_id_is_the_highest_forwarded_and_nothing_is_admitted_after() {
        let conn = GoAway::new();
        let (one, three, five) = (
            Stream::new(conn.clone(), 1),
            Stream::new(conn.clone(), 3),
            Stream::new(conn.clone(), 5),
        );
        assert!(three.admit());
        assert!(one.admit());
        assert!(five.go_away_before_forwarding());
        assert_eq!(conn.state().last_stream_id, Some(3));
        assert!(conn.state().is_silenced(5));
        assert!(!five.admit());
        assert!(!Stream::new(conn.clone(), 7).go_away_before_forwarding());
        assert!(!conn.state().is_silenced(7));
    }

    #[test]
    fn nothing_forwarded_goes_away_with_zero() {
        let conn = GoAway::new();
        assert!(Stream::new(conn.clone(), 1).go_away_before_forwarding());
        assert_eq!(conn.state().last_stream_id, Some(0));
    }

    #[test]
    fn after_apply_covers_the_stream_even_after_an_earlier_goaway() {
        let conn = GoAway::new();
        let (five, seven) = (Stream::new(conn.clone(), 5), Stream::new(conn.clone(), 7));
        assert!(five.admit());
        assert!(seven.admit());
        seven.go_away_after_apply();
        assert_eq!(conn.state().last_stream_id, Some(7));
        // A stream forwarded before that GOAWAY, whose fault comes later: still covered.
        five.go_away_after_apply();
        assert_eq!(conn.state().last_stream_id, Some(7));
        assert!(conn.state().is_silenced(5) && conn.state().is_silenced(7));
    }
}
