//! The faults the proxy injects into an operation's first attempt.

use crate::error::LabError;

/// What happens to an operation's first attempt. Later attempts always pass through.
///
/// "After apply" means the proxy forwarded the request and the upstream answered; the proxy
/// then loses, delays or replaces that answer (a request forwarded and not answered counts as
/// applied too). "Before" means the request never reached the upstream.
///
/// # HTTP/2's GOAWAY
///
/// `goaway-before-forwarding` and `goaway-after-apply` (not in the default mix) end an HTTP/2
/// client's connection as a server shutting down would: one `GOAWAY` (`NO_ERROR`) whose
/// last-stream-id is the highest stream the proxy forwarded on that connection (RFC 9113 §6.8),
/// then a graceful close. Before forwarding, that id is below the faulted stream unless a higher
/// one was already forwarded; after apply, it covers the faulted stream, whose answer is never
/// sent. Nothing is forwarded after the GOAWAY: a stream above its id, or one it covers that was
/// not yet forwarded, is refused (`REFUSED_STREAM`: not processed) and counted as never sent; one
/// whose request had not arrived whole is not counted (it cannot be told apart). A counted refusal
/// uses up its operation's first attempt, and its fault. Streams already forwarded get their
/// answers if the upstream gives them within the slow delay and 2 s after the GOAWAY, before the
/// connection closes (a later one is cut off: its client sees a failure after a request that may
/// have applied; the ledger, which counts an answer once it is handed over, may already count it
/// answered). HTTP/1.1 has no GOAWAY: there the two close the connection, as
/// `reset-before-forwarding` and `drop-after-apply` do.
///
/// tower-retry-safety's classifier takes a remote GOAWAY as ambiguous (hyper can report one for a
/// request it already wrote), so its layer resends neither fault's writes, only reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// Forwarded, and the upstream's answer passed on.
    None,
    /// Forwarded; once the upstream has answered, the connection is closed without a response.
    DropAfterApply,
    /// Forwarded; the upstream's answer is held for the proxy's slow delay (or until the
    /// client gives up).
    SlowAfterApply,
    /// Forwarded; the upstream's answer is replaced by a 503.
    UnavailableAfterApply,
    /// Not forwarded: a 429 with `Retry-After: 0`.
    TooManyRequestsBeforeApply,
    /// Not forwarded: a 500.
    InternalErrorBeforeApply,
    /// Not forwarded: the connection is closed without a response. The client cannot tell
    /// this from [`DropAfterApply`](Fault::DropAfterApply); the lab can.
    ResetBeforeForwarding,
    /// Not forwarded: an HTTP/2 client's stream is reset with `REFUSED_STREAM`, which tells
    /// it the request was not processed (RFC 9113 §8.7), so a client may resend even a
    /// write. An HTTP/1.1 client's connection is closed, as for
    /// [`ResetBeforeForwarding`](Fault::ResetBeforeForwarding).
    RefusedStream,
    /// Not forwarded: an HTTP/2 client gets a `GOAWAY` whose last-stream-id is below its
    /// stream, which tells it the request was not processed (RFC 9113 §6.8), and the
    /// connection then closes; nothing else is sent on the stream. Streams the proxy had
    /// already forwarded on that connection are answered first (for at most the slow delay
    /// and 2 s after the GOAWAY; a later answer is cut off): the last-stream-id is the
    /// highest of them (so it covers the faulted stream when a higher one was forwarded: the
    /// client then cannot tell, the lab can). An HTTP/1.1 client's connection is closed, as
    /// for [`ResetBeforeForwarding`](Fault::ResetBeforeForwarding).
    GoAwayBeforeForwarding,
    /// Forwarded; once the upstream has answered, an HTTP/2 client gets a `GOAWAY` whose
    /// last-stream-id covers its stream (it may have been processed) and the connection
    /// closes without the answer, as a server shutting down mid-request. Other streams the
    /// GOAWAY covers are answered first. An HTTP/1.1 client's connection is closed, as for
    /// [`DropAfterApply`](Fault::DropAfterApply).
    GoAwayAfterApply,
}

impl Fault {
    /// The default mix, given in turn to the first attempts of each route's operations: the
    /// tour's six faults.
    pub const DEFAULT_MIX: [Fault; 6] = [
        Fault::None,
        Fault::DropAfterApply,
        Fault::SlowAfterApply,
        Fault::UnavailableAfterApply,
        Fault::TooManyRequestsBeforeApply,
        Fault::InternalErrorBeforeApply,
    ];

    /// Every fault the proxy knows.
    pub const ALL: [Fault; 10] = [
        Fault::None,
        Fault::DropAfterApply,
        Fault::SlowAfterApply,
        Fault::UnavailableAfterApply,
        Fault::TooManyRequestsBeforeApply,
        Fault::InternalErrorBeforeApply,
        Fault::ResetBeforeForwarding,
        Fault::RefusedStream,
        Fault::GoAwayBeforeForwarding,
        Fault::GoAwayAfterApply,
    ];

    /// The fault's name in `--faults` lists and in output.
    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::DropAfterApply => "drop-after-apply",
            Fault::SlowAfterApply => "slow-after-apply",
            Fault::UnavailableAfterApply => "503-after-apply",
            Fault::TooManyRequestsBeforeApply => "429-before-apply",
            Fault::InternalErrorBeforeApply => "500-before-apply",
            Fault::ResetBeforeForwarding => "reset-before-forwarding",
            Fault::RefusedStream => "refused-stream",
            Fault::GoAwayBeforeForwarding => "goaway-before-forwarding",
            Fault::GoAwayAfterApply => "goaway-after-apply",
        }
    }

    /// The fault of that name, if any.
    pub fn from_name(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Whether the attempt reaches the upstream.
    pub fn forwards(self) -> bool {
        matches!(
            self,
            Fault::None
                | Fault::DropAfterApply
                | Fault::SlowAfterApply
                | Fault::UnavailableAfterApply
                | Fault::GoAwayAfterApply
        )
    }

    /// A comma-separated list of names (`none,drop-after-apply`), in the order the faults are
    /// given out. Refuses an empty list and names the unknown entry.
    pub fn parse_list(list: &str) -> Result<Vec<Fault>, LabError> {
        let mut faults = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let fault = Fault::from_name(name).ok_or_else(|| {
                let known: Vec<_> = Fault::ALL.iter().map(|f| f.name()).collect();
                LabError::new(
                    "--faults",
                    format!("unknown fault {name:?}; known: {}", known.join(", ")),
                )
            })?;
            faults.push(fault);
        }
        if faults.is_empty() {
            return Err(LabError::new("--faults", "the list is empty"));
        }
        Ok(faults)
    }
}
