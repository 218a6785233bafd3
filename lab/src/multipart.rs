//! A multipart body's content without its boundary: SDKs draw a new boundary per attempt
//! (the openai SDKs' `files.create`, Python's httpx and Node's FormData do), so two attempts
//! of one upload differ byte for byte while their parts are equal.

use http::header::CONTENT_TYPE;
use http::HeaderMap;
use sha2::{Digest, Sha256};

/// Feeds `hasher` the body's parts, each its header lines (names lowercased, sorted: a
/// client may write them in another order) and its content, without the boundary; `false`
/// (nothing fed) when the request is not multipart or its body does not parse as such.
pub(crate) fn hash_parts(headers: &HeaderMap, body: &[u8], hasher: &mut Sha256) -> bool {
    let Some(boundary) = boundary(headers) else {
        return false;
    };
    let Some(parts) = parts(body, boundary.as_bytes()) else {
        return false;
    };
    hasher.update(b"multipart\0");
    for part in parts {
        let (head, content) = match find(part, b"\r\n\r\n") {
            Some(i) => (&part[..i], &part[i + 4..]),
            None => (&b""[..], part),
        };
        let mut lines: Vec<String> = String::from_utf8_lossy(head)
            .split("\r\n")
            .filter(|l| !l.trim().is_empty())
            .map(|l| match l.split_once(':') {
                Some((name, value)) => {
                    format!("{}:{}", name.trim().to_ascii_lowercase(), value.trim())
                }
                None => l.trim().to_owned(),
            })
            .collect();
        lines.sort();
        for line in &lines {
            hasher.update(line.as_bytes());
            hasher.update([0]);
        }
        hasher.update((content.len() as u64).to_be_bytes());
        hasher.update(content);
    }
    true
}

/// The `boundary` parameter of a `multipart/*` content type, unquoted.
fn boundary(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let mut params = value.split(';');
    let media = params.next()?.trim();
    if !media.to_ascii_lowercase().starts_with("multipart/") {
        return None;
    }
    params.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        (!value.is_empty()).then(|| value.to_owned())
    })
}

/// The parts between `--boundary` delimiters (RFC 2046 §5.1.1), each without the line break
/// that belongs to the next delimiter; `None` without a closing delimiter.
fn parts<'a>(body: &'a [u8], boundary: &[u8]) -> Option<Vec<&'a [u8]>> {
    let mut delimiter = b"--".to_vec();
    delimiter.extend_from_slice(boundary);
    // The preamble before the first delimiter is not content (clients send none).
    let mut rest = &body[find(body, &delimiter)? + delimiter.len()..];
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Some(parts);
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let mut next = b"\r\n".to_vec();
        next.extend_from_slice(&delimiter);
        let end = find(rest, &next)?;
        parts.push(&rest[..end]);
        rest = &rest[end + next.len()..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(content_type: &str, body: &str) -> Option<Vec<u8>> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, content_type.parse().expect("valid"));
        let mut hasher = Sha256::new();
        hash_parts(&headers, body.as_bytes(), &mut hasher).then(|| hasher.finalize().to_vec())
    }

    fn upload(boundary: &str, first_header: &str, second_header: &str, content: &str) -> String {
        format!(
            "--{boundary}\r\n{first_header}\r\n{second_header}\r\n\r\n{content}\r\n--{boundary}\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n--{boundary}--\r\n"
        )
    }

    #[test]
    fn one_upload_under_two_boundaries_and_header_orders_is_one_content() {
        let disposition = "Content-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"";
        let kind = "Content-Type: application/octet-stream";
        let a = upload("abc123", disposition, kind, "{\"n\":1}");
        let b = upload("----formdata-undici-0457", kind, disposition, "{\"n\":1}");
        let c = upload("abc123", disposition, kind, "{\"n\":2}");
        let first = digest("multipart/form-data; boundary=abc123", &a).expect("parses");
        let quoted = "multipart/form-data; boundary=\"----formdata-undici-0457\"";
        assert_eq!(Some(first.clone()), digest(quoted, &b));
        assert_ne!(
            Some(first),
            digest("multipart/form-data; boundary=abc123", &c)
        );
    }

    #[test]
    fn a_body_that_is_not_multipart_is_left_to_the_byte_fingerprint() {
        assert_eq!(digest("application/json", "{}"), None);
        // No closing delimiter: not parsed.
        assert_eq!(
            digest("multipart/form-data; boundary=x", "--x\r\n\r\nhalf"),
            None
        );
        assert_eq!(digest("multipart/form-data", "--x--"), None);
    }
}
