//! What every resend carries, and whether a keyed request is resent, against the server's
//! `IdempotencyLayer`.

mod keyed_requests_resent_or_not;
