//! Validation of `Idempotency-Key` values (IETF httpapi Idempotency-Key draft).

use http::HeaderValue;

/// Longest key accepted, in bytes, quotes included. Longer keys are malformed: they would be
/// echoed in errors and stored by servers.
pub(crate) const MAX_KEY_LEN: usize = 255;

/// The key's content, if the value is a well-formed, non-empty key. The client and the server
/// layer accept the same forms, so a key one sends the other honours.
///
/// The draft defines the value as a Structured Field string (RFC 8941 §3.3.3): a quoted string
/// of printable ASCII with `\"` and `\\` escapes. Many APIs (Stripe among them) send a bare token
/// instead; a bare value of visible ASCII without quotes, backslashes or spaces is accepted too.
pub fn parse(value: &HeaderValue) -> Option<&str> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_KEY_LEN {
        return None;
    }
    // Both forms are ASCII-only, so this cannot fail for a valid key.
    let text = std::str::from_utf8(bytes).ok()?;
    if let Some(inner) = text.strip_prefix('"') {
        let inner = inner.strip_suffix('"')?;
        return is_sf_string_content(inner).then_some(inner);
    }
    let bare_ok = text
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
    bare_ok.then_some(text)
}

/// RFC 8941 sf-string content between the quotes: printable ASCII (0x20–0x7E), where `"` and
/// `\` appear only escaped by a backslash. Empty content is not a key.
fn is_sf_string_content(inner: &str) -> bool {
    if inner.is_empty() {
        return false;
    }
    let mut escaped = false;
    for b in inner.bytes() {
        if !(0x20..=0x7e).contains(&b) {
            return false;
        }
        match (escaped, b) {
            (true, b'"' | b'\\') => escaped = false,
            (true, _) => return false,
            (false, b'\\') => escaped = true,
            (false, b'"') => return false,
            (false, _) => {}
        }
    }
    !escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &[u8]) -> Option<String> {
        HeaderValue::from_bytes(s)
            .ok()
            .and_then(|v| parse(&v).map(str::to_owned))
    }

    #[test]
    fn sf_strings() {
        assert_eq!(parse_str(b"\"abc-123\"").as_deref(), Some("abc-123"));
        assert_eq!(parse_str(b"\"a b\"").as_deref(), Some("a b"));
        assert_eq!(parse_str(br#""a\"b""#).as_deref(), Some(r#"a\"b"#));
    }

    #[test]
    fn bare_tokens() {
        assert_eq!(
            parse_str(b"8e03978e-40d5-43e8-bc93-6894a57f9324").as_deref(),
            Some("8e03978e-40d5-43e8-bc93-6894a57f9324")
        );
    }

    #[test]
    fn malformed_keys_do_not_count() {
        let long_quoted = format!("\"{}\"", "k".repeat(MAX_KEY_LEN));
        let long_bare = "k".repeat(MAX_KEY_LEN + 1);
        let bad: [&[u8]; 11] = [
            b"",
            b"\"\"",
            b"\"unterminated",
            b"\"a\"b\"",
            br#""a\x""#,
            br#""trailing\""#,
            b"a b",
            b"\xff\xfe",
            b"\"caf\xc3\xa9\"",
            long_quoted.as_bytes(),
            long_bare.as_bytes(),
        ];
        for b in bad {
            assert_eq!(parse_str(b), None, "{:?}", String::from_utf8_lossy(b));
        }
    }
}
