//! The policy's clock when a front end reads the response body
//! ([`ReadWholeLayer`](crate::resume::ReadWholeLayer)). Inside the attempt, the per-attempt timeout
//! bounds the wait for the head, then each wait for a frame of the body: the body's reader says
//! it has the head, and the retry layer's timer then leaves the body to it (the deadline stays
//! absolute). A body handed on to the caller as it streams is bounded the same way: each wait
//! for a frame by the per-attempt timeout, the whole by the deadline.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::timed_out::TimedOut;

/// Put in an attempt's extensions by the retry layer when the attempt has a clock (a
/// per-attempt timeout or a deadline), for a front end that reads the body.
#[derive(Clone, Debug)]
pub(crate) struct AttemptClock {
    /// The per-attempt timeout: the longest wait for one frame of the body.
    pub(crate) frame_wait: Option<Duration>,
    /// When the request's deadline passes.
    pub(crate) deadline: Option<Instant>,
    /// Whether a failure of this attempt could be followed by another (the request's repeat is
    /// harmless, retries are left and its body can be sent again): if not, reading its body
    /// inside the attempt would only put it under the attempt's clock.
    pub(crate) may_repeat: bool,
    reading: Arc<AtomicBool>,
}

impl AttemptClock {
    pub(crate) fn new(
        frame_wait: Option<Duration>,
        deadline: Option<Instant>,
        may_repeat: bool,
    ) -> Self {
        AttemptClock {
            frame_wait,
            deadline,
            may_repeat,
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

/// Bounds a body as it streams: each wait for a frame by the per-attempt timeout, the whole by
/// the deadline. Its timer is made at the first wait, and reset by each frame.
#[derive(Debug)]
pub(crate) struct FrameClock {
    frame_wait: Option<Duration>,
    deadline: Option<Instant>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl FrameClock {
    /// `None` when the clock has neither a per-attempt timeout nor a deadline.
    pub(crate) fn of(clock: &AttemptClock) -> Option<Self> {
        Self::new(clock.frame_wait, clock.deadline)
    }

    pub(crate) fn new(frame_wait: Option<Duration>, deadline: Option<Instant>) -> Option<Self> {
        // A wait too long to be a time (`Duration::MAX`) bounds nothing.
        let frame_wait = frame_wait.filter(|&wait| Instant::now().checked_add(wait).is_some());
        (frame_wait.is_some() || deadline.is_some()).then_some(FrameClock {
            frame_wait,
            deadline,
            sleep: None,
        })
    }

    /// When the wait that starts now ends (`None`: nothing bounds it).
    fn end(&self) -> Option<Instant> {
        let next = self
            .frame_wait
            .and_then(|wait| Instant::now().checked_add(wait));
        match (next, self.deadline) {
            (Some(next), Some(deadline)) => Some(next.min(deadline)),
            (Some(at), None) | (None, Some(at)) => Some(at),
            (None, None) => None,
        }
    }

    /// While no frame is ready: ready with the clock that ran out, if one did.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<TimedOut> {
        // Read first: a timer made after the deadline fires only at the driver's next turn.
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Poll::Ready(TimedOut::Deadline);
        }
        if self.sleep.is_none() {
            // Unbounded: the body's own wake is the only one (it registered the waker).
            let Some(end) = self.end() else {
                return Poll::Pending;
            };
            self.sleep = Some(Box::pin(tokio::time::sleep_until(end)));
        }
        if let Some(sleep) = self.sleep.as_mut() {
            ready!(sleep.as_mut().poll(cx));
        }
        self.sleep = None;
        let past_deadline = self.deadline.is_some_and(|d| Instant::now() >= d);
        Poll::Ready(if past_deadline {
            TimedOut::Deadline
        } else {
            TimedOut::Attempt
        })
    }

    /// A frame came: the wait for the next one starts now.
    pub(crate) fn on_frame(&mut self) {
        match (self.end(), self.sleep.as_mut()) {
            (Some(end), Some(sleep)) => sleep.as_mut().reset(end),
            (None, Some(_)) => self.sleep = None,
            (_, None) => {}
        }
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
        let clock = AttemptClock::new(Some(Duration::from_secs(1)), None, true);
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
