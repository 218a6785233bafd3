//! Text the layer puts in logs: capped, never cut inside a character.

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub(crate) fn cap(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
