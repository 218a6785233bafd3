//! Other spellings of a request path that a server may route to the same handler.
//!
//! The normalised spelling follows RFC 3986 §6.2.2 as common servers apply it before routing:
//! percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`, hex in either case) are
//! decoded, every other escape (`%2F`, `%20`, …) is left exactly as sent; then `.` and `..`
//! segments are removed (§5.2.4) and empty segments dropped, so `//` reads as `/` and a
//! trailing slash is ignored. The folded spelling is the normalised one in ASCII lower case.

/// Paths up to this long are respelled in a stack buffer; only longer ones allocate.
pub(crate) const STACK_PATH: usize = 256;

/// What a path needs before it reads the way a normalising or case-folding server routes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    /// An unreserved escape, an empty or dot segment or a trailing slash: normalising changes it.
    pub(crate) normalises: bool,
    /// An ASCII capital letter: folding changes it.
    pub(crate) has_upper: bool,
    /// A `;`, a `\\`, an escape of a reserved ASCII character (`%2F`, `%3B`, …) or a dot in
    /// the last segment (a format suffix): the lenient spelling differs.
    pub(crate) lenient: bool,
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The character escaped at `bytes[i..i + 3]`, if that is an escape of an unreserved one that
/// is decoded. One that follows a stray `%` (or `%` and a hex digit) is not: decoding `%%34A`
/// would spell a new escape, `%4A`, and normalising must be final (done once, it is done).
fn unreserved_escape(bytes: &[u8], i: usize) -> Option<u8> {
    let after_stray = match i {
        0 => false,
        1 => bytes[0] == b'%',
        _ => bytes[i - 1] == b'%' || (bytes[i - 2] == b'%' && hex(bytes[i - 1]).is_some()),
    };
    if after_stray {
        return None;
    }
    match bytes.get(i..i + 3)? {
        [b'%', hi, lo] => Some(hex(*hi)? << 4 | hex(*lo)?).filter(|&b| is_unreserved(b)),
        _ => None,
    }
}

/// The ASCII character escaped at `bytes[i..i + 3]`, if that is an escape of one.
fn ascii_escape(bytes: &[u8], i: usize) -> Option<u8> {
    match bytes.get(i..i + 3)? {
        [b'%', hi, lo] => Some(hex(*hi)? << 4 | hex(*lo)?).filter(u8::is_ascii),
        _ => None,
    }
}

/// One round of the lenient spelling before it is normalised: `;parameters` cut from each
/// segment, every escape of an ASCII character decoded once, `\\` read as `/`. Writes to the
/// front of `out` (at least `path.len()` bytes: nothing grows) and returns the length. Keeps
/// UTF-8: it cuts and decodes only ASCII.
pub(crate) fn lenient_into(path: &[u8], out: &mut [u8]) -> usize {
    let (mut len, mut i, mut in_parameters) = (0, 0, false);
    while i < path.len() {
        let b = path[i];
        let (byte, width) = match b {
            b'/' | b'\\' => {
                in_parameters = false;
                (Some(b'/'), 1)
            }
            _ if in_parameters => (None, 1),
            b';' => {
                in_parameters = true;
                (None, 1)
            }
            b'%' => match ascii_escape(path, i) {
                Some(b'\\') => (Some(b'/'), 3),
                Some(decoded) => (Some(decoded), 3),
                None => (Some(b), 1),
            },
            _ => (Some(b), 1),
        };
        if let Some(byte) = byte {
            out[len] = byte;
            len += 1;
        }
        i += width;
    }
    len
}

/// `path` without a format suffix on its last segment (`/charges/c1/capture.json` →
/// `/charges/c1/capture`): Rails routes every path with an optional `.format`, and older
/// Spring MVC matched suffixes alike. `None` if the last segment has none.
pub(crate) fn without_format(path: &str) -> Option<&str> {
    let start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[start..].rfind('.')?;
    (dot > 0).then(|| &path[..start + dot])
}

/// Whether `path` still has an escape of an ASCII character: another lenient round changes it.
pub(crate) fn has_ascii_escape(path: &[u8]) -> bool {
    (0..path.len()).any(|i| path[i] == b'%' && ascii_escape(path, i).is_some())
}

/// One pass over the path. Paths that do not start with `/` (`*`, authority forms) are never
/// normalised, only folded.
pub(crate) fn shape(path: &str) -> Shape {
    let bytes = path.as_bytes();
    let mut shape = Shape::default();
    if bytes.first() != Some(&b'/') {
        shape.has_upper = bytes.iter().any(u8::is_ascii_uppercase);
        return shape;
    }
    let mut segment_start = 1;
    for i in 1..=bytes.len() {
        match bytes.get(i) {
            None | Some(b'/') => {
                let segment = &bytes[segment_start..i];
                // "/" alone is the one path whose empty segment is canonical.
                if matches!(segment, b"." | b"..") || (segment.is_empty() && bytes.len() > 1) {
                    shape.normalises = true;
                }
                segment_start = i + 1;
            }
            Some(b'%') => {
                if unreserved_escape(bytes, i).is_some() {
                    shape.normalises = true;
                } else {
                    shape.lenient |= ascii_escape(bytes, i).is_some();
                }
            }
            Some(b';' | b'\\') => shape.lenient = true,
            Some(b) => shape.has_upper |= b.is_ascii_uppercase(),
        }
    }
    // A format suffix on the last segment (a dot segment normalises instead).
    let last = &bytes[bytes.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1)..];
    let escaped_dot = last
        .windows(3)
        .any(|w| w[0] == b'%' && w[1] == b'2' && (w[2] | 0x20) == b'e');
    if !matches!(last, b"." | b"..") && (escaped_dot || last.iter().skip(1).any(|&b| b == b'.')) {
        shape.lenient = true;
    }
    shape
}

/// Writes the normalised spelling of `path` to the front of `out` and returns its length.
/// `out` must hold at least `path.len()` bytes: each segment is written as `/` plus at most
/// its own length, and the path has one `/` per segment, so the spelling never outgrows it.
pub(crate) fn normalise_into(path: &str, out: &mut [u8]) -> usize {
    let bytes = path.as_bytes();
    let Some(rest) = bytes.strip_prefix(b"/") else {
        out[..bytes.len()].copy_from_slice(bytes);
        return bytes.len();
    };
    let mut len = 0;
    for segment in rest.split(|&b| b == b'/') {
        let start = len;
        out[len] = b'/';
        len += 1;
        let mut i = 0;
        while i < segment.len() {
            match unreserved_escape(segment, i) {
                Some(b) => {
                    out[len] = b;
                    i += 3;
                }
                None => {
                    out[len] = segment[i];
                    i += 1;
                }
            }
            len += 1;
        }
        // Decoding comes first, so `%2e` is a dot too (nginx does the same).
        match &out[start + 1..len] {
            b"" | b"." => len = start,
            b".." => len = out[..start].iter().rposition(|&b| b == b'/').unwrap_or(0),
            _ => {}
        }
    }
    if len == 0 {
        out[0] = b'/';
        len = 1;
    }
    len
}

/// Runs `f` on a zeroed scratch buffer of `len` bytes: on the stack up to [`STACK_PATH`].
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    if len <= STACK_PATH {
        f(&mut [0; STACK_PATH][..len])
    } else {
        f(&mut vec![0; len])
    }
}

/// Whether a template has a segment that reads as `.` or `..` once unreserved escapes are
/// decoded. Servers remove those before routing, so such a rule would match nothing they route.
pub(crate) fn has_dot_segment(template: &str) -> bool {
    template.split('/').any(|segment| {
        let mut rest = segment.as_bytes();
        let mut dots = 0;
        while !rest.is_empty() {
            match rest {
                [b'.', tail @ ..] => rest = tail,
                [b'%', b'2', b'e' | b'E', tail @ ..] => rest = tail,
                _ => return false,
            }
            dots += 1;
        }
        matches!(dots, 1 | 2)
    })
}

/// A template as the folded spelling of a path must match it: normalised the same way, then
/// lower-cased except inside `{parameter}` names (`{{` and `}}` are literal braces).
pub(crate) fn fold_template(template: &str) -> String {
    let mut out = vec![0; template.len()];
    let len = normalise_into(template, &mut out);
    out.truncate(len);
    let mut in_parameter = false;
    let mut i = 0;
    while i < out.len() {
        match (in_parameter, out[i], out.get(i + 1).copied()) {
            (false, b'{', Some(b'{')) | (false, b'}', Some(b'}')) => i += 1,
            (false, b'{', _) => in_parameter = true,
            (true, b'}', _) => in_parameter = false,
            (false, b, _) => out[i] = b.to_ascii_lowercase(),
            (true, _, _) => {}
        }
        i += 1;
    }
    // Normalising splits at '/' and replaces ASCII escapes with ASCII: still UTF-8.
    String::from_utf8(out).unwrap_or_else(|_| template.to_owned())
}

/// A template with its parameter names left out: two templates with the same shape are the
/// same route to matchit.
pub(crate) fn template_shape(template: &str) -> String {
    let mut shape = String::with_capacity(template.len());
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        shape.push(c);
        match c {
            '{' if chars.peek() == Some(&'{') => shape.extend(chars.next()),
            '}' if chars.peek() == Some(&'}') => shape.extend(chars.next()),
            '{' => {
                if chars.peek() == Some(&'*') {
                    shape.push('*');
                }
                for c in chars.by_ref() {
                    if c == '}' {
                        shape.push('}');
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    shape
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalised(path: &str) -> String {
        with_scratch(path.len(), |buf| {
            let len = normalise_into(path, buf);
            String::from_utf8(buf[..len].to_vec()).unwrap()
        })
    }

    #[test]
    fn normalises_every_spelling() {
        for (path, want) in [
            ("/", "/"),
            ("/v1/send/m1", "/v1/send/m1"),
            ("/v1/send/m1/", "/v1/send/m1"),
            ("/v1/%73end/m2", "/v1/send/m2"),
            ("/v1/%7Euser/%7ename", "/v1/~user/~name"),
            ("/v1/a%2db", "/v1/a-b"),
            ("/v1//send/m4", "/v1/send/m4"),
            ("//v1///send//", "/v1/send"),
            ("/v1/./send/m5", "/v1/send/m5"),
            ("/v1/x/../send/m6", "/v1/send/m6"),
            ("/v1/x/%2e%2E/send/m7", "/v1/send/m7"),
            ("/../../v1", "/v1"),
            ("/v1/..", "/"),
            ("/.", "/"),
            ("/v1/a%2Fb", "/v1/a%2Fb"),
            ("/v1/a%2fb/%20/%C3%A9", "/v1/a%2fb/%20/%C3%A9"),
            ("/v1/%", "/v1/%"),
            ("/v1/%7", "/v1/%7"),
            ("/v1/%zz", "/v1/%zz"),
            // Found by the property below: no decoding into a new escape.
            ("/%%34A", "/%%34A"),
            ("/%4%41", "/%4%41"),
            ("/v1/%%7e%73", "/v1/%%7es"),
            ("/v1/..a/.b/a.", "/v1/..a/.b/a."),
            ("/v1/caf\u{e9}/", "/v1/caf\u{e9}"),
            ("*", "*"),
        ] {
            assert_eq!(normalised(path), want, "{path}");
            assert_eq!(shape(path).normalises, path != want, "{path}");
        }
    }

    proptest::proptest! {
        /// The buffer-size claim of `normalise_into`, and that `shape` predicts it.
        #[test]
        fn normalising_fits_in_the_path_and_is_final(path in "/[a-zA-Z0-9%./~_-]{0,40}") {
            let once = normalised(&path);
            proptest::prop_assert!(once.len() <= path.len());
            proptest::prop_assert_eq!(shape(&path).normalises, once != path);
            proptest::prop_assert!(!shape(&once).normalises);
            proptest::prop_assert_eq!(normalised(&once), once);
        }
    }

    #[test]
    fn shape_sees_capitals() {
        assert!(shape("/v1/SEND").has_upper);
        assert!(!shape("/v1/send").has_upper);
        // A hex digit in an escape is a capital too: folding lower-cases it.
        assert!(shape("/v1/%2F").has_upper);
        assert!(shape("*A").has_upper);
    }

    #[test]
    fn long_paths_normalise_too() {
        let long = format!("/v1/{}/%73end/", "a".repeat(STACK_PATH));
        assert_eq!(
            normalised(&long),
            format!("/v1/{}/send", "a".repeat(STACK_PATH))
        );
    }

    #[test]
    fn templates_fold_outside_parameter_names() {
        assert_eq!(fold_template("/V1/Send/{Id}/"), "/v1/send/{Id}");
        assert_eq!(fold_template("/A/{{Lit}}/{*Rest}"), "/a/{{lit}}/{*Rest}");
        assert_eq!(fold_template("/img{Id}.PNG"), "/img{Id}.png");
        assert_eq!(fold_template("/v1/%53END//{id}"), "/v1/send/{id}");
    }

    #[test]
    fn shapes_leave_out_parameter_names() {
        assert_eq!(template_shape("/a/{x}/b/{*rest}"), "/a/{}/b/{*}");
        assert_eq!(template_shape("/a/{{x}}/{y}"), "/a/{{x}}/{}");
        assert_eq!(template_shape("/a/{x}"), template_shape("/a/{y}"));
        assert_ne!(template_shape("/a/{x}"), template_shape("/a/{*x}"));
    }

    #[test]
    fn dot_segments_in_templates_are_seen() {
        for t in ["/a/./b", "/a/..", "/a/%2e/b", "/a/%2E%2e/b", "/."] {
            assert!(has_dot_segment(t), "{t}");
        }
        for t in ["/a/b", "/a/.../b", "/a/.b", "/a/{id}.json", "/"] {
            assert!(!has_dot_segment(t), "{t}");
        }
    }
}
