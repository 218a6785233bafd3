//! The idempotency layer the fault and cut servers can put over their handlers: the server's
//! own, in memory, with the `server` feature. Without it no [`Keys`] value exists, so the
//! keyed paths compile and never run: the client's tests do not build the server.

/// The layer over a keyed server's handler.
#[cfg(feature = "server")]
pub type Keys =
    tower_idempotency_keys::IdempotencyLayer<tower_idempotency_keys::stores::MemoryStore>;

/// No layer: a value of this type cannot be made.
#[cfg(not(feature = "server"))]
#[derive(Clone, Debug)]
pub enum Keys {}
