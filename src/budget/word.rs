//! A count and the epoch it belongs to, in one 64-bit word, so that the two change together:
//! the epoch in the high half, the count in the low half. Epochs are serial numbers: they wrap
//! at 2^32 and are compared by their difference (RFC 1982), which holds as long as no thread
//! acts on an epoch 2^31 slots (over four years at the shortest slot) out of date.

/// The word for `count` in `epoch`.
pub(super) const fn pack(epoch: u32, count: u32) -> u64 {
    (epoch as u64) << 32 | count as u64
}

/// The epoch half of a word.
pub(super) const fn epoch(word: u64) -> u32 {
    (word >> 32) as u32
}

/// The count half of a word.
pub(super) const fn count(word: u64) -> u32 {
    word as u32
}

/// Whether epoch `a` comes after epoch `b`.
pub(super) const fn newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_round_trip() {
        let w = pack(u32::MAX, 7);
        assert_eq!((epoch(w), count(w)), (u32::MAX, 7));
        assert_eq!(count(w + 1), 8);
    }

    #[test]
    fn newer_across_the_wrap() {
        assert!(newer(1, 0));
        assert!(!newer(0, 1));
        assert!(!newer(5, 5));
        assert!(newer(2, u32::MAX - 1));
        assert!(!newer(u32::MAX - 1, 2));
    }
}
