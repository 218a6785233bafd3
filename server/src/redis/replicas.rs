//! The replicas a `RedisStore` waits for: `WAIT` beside a write, and the primary's role read
//! to know when a `WAIT` could not be confirmed (replicas gone), so that nothing waits for
//! its whole timeout meanwhile, and the primary is resolved again (it may be an old one cut
//! off from the fleet).

use std::sync::atomic::Ordering;

use redis::{Pipeline, Value};

use super::{unexpected, RedisStore};
use crate::store::StoreError;

impl RedisStore {
    /// `WAIT`, after the write it confirms, in the same round trip.
    pub(super) fn wait(&self, pipe: &mut Pipeline) {
        if self.replicas > 0 {
            pipe.cmd("WAIT")
                .arg(self.replicas)
                .arg(self.replica_timeout_ms);
        }
    }

    /// Whether the `WAIT` reply (the pipeline's last) counts enough replicas. One that does not
    /// marks the primary short of them and has the store ask again where the primary is: it
    /// may be an old primary cut off from the fleet, whose replica was promoted.
    pub(super) fn confirmed(&self, replies: &[Value]) -> Result<bool, StoreError> {
        if self.replicas == 0 {
            return Ok(true);
        }
        let confirmed = match replies.last() {
            Some(Value::Int(acked)) => *acked >= i64::from(self.replicas),
            Some(other) => return Err(unexpected("WAIT", other)),
            None => return Err(StoreError::new("no reply to WAIT")),
        };
        if !confirmed {
            self.link.short.store(true, Ordering::Relaxed);
            self.link.resolve_again();
        }
        Ok(confirmed)
    }

    /// Reads a `ROLE` reply: notes whether the primary is short of replicas and, if it is,
    /// has the store ask again where the primary is (as for a `WAIT` not confirmed). Returns
    /// whether it has enough (a reply this store cannot read counts as enough: `WAIT`
    /// decides), and whether the connections are to be resolved again.
    pub(super) fn note_role(&self, reply: Option<&Value>) -> (bool, bool) {
        let enough = reply
            .and_then(role_replicas)
            .is_none_or(|n| n >= self.replicas);
        self.link.short.store(!enough, Ordering::Relaxed);
        (enough, !enough && self.link.resolve_again())
    }

    /// Whether a write should wait for replicas: yes, unless the primary was last seen short
    /// of them and still is (`ROLE`, on the connection no `WAIT` blocks). A `WAIT` there would
    /// take its whole timeout and hold its connection, while nothing can confirm it.
    pub(super) async fn enough_replicas(&self) -> Result<bool, StoreError> {
        if !self.role || !self.link.short.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let mut pipe = redis::pipe();
        pipe.cmd("ROLE");
        let replies = self
            .link
            .query(&pipe, false)
            .await
            .map_err(StoreError::new)?;
        Ok(self.note_role(replies.first()).0)
    }

    pub(super) fn short_of_replicas(&self, what: &str) -> StoreError {
        StoreError::new(format!(
            "the primary has fewer than {} replica(s) connected: the {what} cannot be confirmed (WAIT)",
            self.replicas
        ))
    }

    pub(super) fn not_confirmed(&self, what: &str) -> StoreError {
        StoreError::new(format!(
            "the {what} was not confirmed by {} replica(s) within {} ms (WAIT)",
            self.replicas, self.replica_timeout_ms
        ))
    }
}

/// The replicas connected to a primary, from its `ROLE` reply (`["master", offset, [[ip,
/// port, offset], …]]`, online replicas only); 0 for a node of another role; `None` for a
/// reply of another shape.
fn role_replicas(reply: &Value) -> Option<u32> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let role = match parts.first()? {
        Value::BulkString(name) => name.as_slice(),
        Value::SimpleString(name) => name.as_bytes(),
        _ => return None,
    };
    if role != b"master" {
        return Some(0);
    }
    match parts.get(2)? {
        Value::Array(replicas) => Some(u32::try_from(replicas.len()).unwrap_or(u32::MAX)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::role_replicas;

    #[test]
    fn role_replies_are_read_for_the_online_replicas_of_a_primary() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let replica = Value::Array(vec![bulk("127.0.0.1"), bulk("7001"), bulk("42")]);
        let primary = |n| {
            Value::Array(vec![
                bulk("master"),
                Value::Int(42),
                Value::Array(vec![replica.clone(); n]),
            ])
        };
        assert_eq!(role_replicas(&primary(2)), Some(2));
        assert_eq!(role_replicas(&primary(0)), Some(0));
        let demoted = Value::Array(vec![bulk("slave"), bulk("127.0.0.1"), Value::Int(7000)]);
        assert_eq!(role_replicas(&demoted), Some(0));
        assert_eq!(role_replicas(&Value::Nil), None);
        assert_eq!(role_replicas(&Value::Array(vec![bulk("master")])), None);
    }
}
