// Something that is not a store handed to the server layer: the error names the stores.
use std::collections::HashMap;

use tower_idempotency_keys::IdempotencyLayer;

fn main() {
    let _layer = IdempotencyLayer::new(HashMap::<String, Vec<u8>>::new());
}
