//! Whether a write may be sent again when the server honours keys: key trust against the
//! server's `IdempotencyLayer`, and its stored responses as the client classifies them.

mod key_trust;
mod stored_response;
