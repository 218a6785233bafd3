//! The per-attempt timeout when a front end reads the response body inside the attempt
//! ([`ReadWholeLayer`](crate::ReadWholeLayer)): it bounds the wait for the head, then each wait
//! for a frame of the body, as it does for a body that streams to the caller. The body's reader
//! says it has the head; the retry layer's timer then leaves the body to it. The deadline
//! stays absolute.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Poll};
use std::time::Duration;

use crate::timed_out::TimedOut;

/// Put in an attempt's extensions by the retry layer when the attempt has a per-attempt timeout
/// (and not only a deadline), for a front end that reads the body inside the attempt.
#[derive(Clone, Debug)]
pub(crate) struct AttemptClock {
    /// The per-attempt timeout: the longest wait for one frame of the body.
    pub(crate) frame_wait: Duration,
    reading: Arc<AtomicBool>,
}

impl AttemptClock {
    pub(crate) fn new(frame_wait: Duration) -> Self {
        AttemptClock {
            frame_wait,
            reading: Arc::default(),
        }
    }

    /// The head is in and the body is being read: each wait for a frame is bounded from now on
    /// by the reader.
    pub(crate) fn start_reading(&self) {
        self.reading.store(true, Ordering::Release);
    }

    fn is_reading(&self) -> bool {
        self.reading.load(Ordering::Acquire)
    }
}

/// What an attempt's timer means when it fires.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fired {
    /// The attempt is cut: it timed out.
    Cut(TimedOut),
    /// The per-attempt timeout passed while the body was being read (each of whose frames the
    /// reader times): only the deadline, this far away, still cuts the attempt.
    Until(Duration),
    /// As `Until`, without a deadline: nothing cuts the attempt here any more.
    Never,
}

/// `why`: which clock the timer was set for; `clock`: the attempt's, if it has one;
/// `time_left`: before the request's deadline, if it has one.
#[inline]
pub(crate) fn when_fired(
    why: TimedOut,
    clock: Option<&AttemptClock>,
    time_left: Option<Duration>,
) -> Fired {
    match (why, clock) {
        (TimedOut::Attempt, Some(clock)) if clock.is_reading() => match time_left {
            Some(left) if left.is_zero() => Fired::Cut(TimedOut::Deadline),
            Some(left) => Fired::Until(left),
            None => Fired::Never,
        },
        _ => Fired::Cut(why),
    }
}

/// Runs `attempt` under its timer (`limit`, set for `why`), as the tower layer's response
/// future does, for a front end that awaits its attempts (the reqwest adapter).
#[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
pub(crate) async fn timed<F: Future>(
    attempt: F,
    limit: Duration,
    why: TimedOut,
    clock: Option<&AttemptClock>,
    time_left: impl Fn() -> Option<Duration>,
) -> Result<F::Output, TimedOut> {
    let mut attempt = pin!(attempt);
    let mut sleep = pin!(tokio::time::sleep(limit));
    let mut why = why;
    let mut timed = true;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = attempt.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        while timed {
            ready!(sleep.as_mut().poll(cx));
            match when_fired(why, clock, time_left()) {
                Fired::Cut(why) => return Poll::Ready(Err(why)),
                Fired::Until(left) => {
                    sleep.as_mut().reset(tokio::time::Instant::now() + left);
                    why = TimedOut::Deadline;
                }
                Fired::Never => timed = false,
            }
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_cuts_unless_the_body_is_being_read_and_the_deadline_still_holds() {
        let clock = AttemptClock::new(Duration::from_secs(1));
        let left = Some(Duration::from_secs(3));
        assert_eq!(
            when_fired(TimedOut::Attempt, Some(&clock), left),
            Fired::Cut(TimedOut::Attempt)
        );
        assert_eq!(
            when_fired(TimedOut::Attempt, None, left),
            Fired::Cut(TimedOut::Attempt)
        );
        clock.start_reading();
        assert_eq!(
            when_fired(TimedOut::Attempt, Some(&clock), left),
            Fired::Until(Duration::from_secs(3))
        );
        assert_eq!(
            when_fired(TimedOut::Attempt, Some(&clock), None),
            Fired::Never
        );
        assert_eq!(
            when_fired(TimedOut::Attempt, Some(&clock), Some(Duration::ZERO)),
            Fired::Cut(TimedOut::Deadline)
        );
        // The deadline is absolute, whatever the reader does.
        assert_eq!(
            when_fired(TimedOut::Deadline, Some(&clock), left),
            Fired::Cut(TimedOut::Deadline)
        );
    }
}
