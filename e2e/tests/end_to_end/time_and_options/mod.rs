//! A hedged keyed request against the server's `IdempotencyLayer`: the handler runs once.

mod hedged_keyed_put;
