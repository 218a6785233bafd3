//! The stores: [`MemoryStore`], embedded and bounded, for one process; `RedisStore` (feature
//! `redis`), shared by a fleet; `PostgresStore` (feature `postgres`), in lease mode or, with
//! the items of `stores::postgres`, in atomic mode.
//!
//! Each implements [`IdempotencyStore`](crate::store::IdempotencyStore); the [crate
//! docs](crate#stores) say what each guarantees.

pub use crate::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use crate::postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use crate::redis::{RedisStore, RedisStoreBuilder};

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    //! PostgreSQL's atomic mode (feature `postgres`): the key's entry commits in the handler's
    //! own transaction.
    //!
    //! [`AtomicLayer`] is made by
    //! [`IdempotencyLayer::atomic`](crate::layer::IdempotencyLayer::atomic); the handler writes
    //! in the request's [`KeyTransaction`](crate::postgres::atomic::KeyTransaction) through a
    //! [`KeyTransactionGuard`]; [`SCHEMA`] is the table the store keeps its keys in.

    pub use crate::postgres::atomic::{
        AtomicLayer, AtomicService, KeyTransactionGuard, TransactionError,
    };
    pub use crate::postgres::SCHEMA;
}
