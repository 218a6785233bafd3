//! Hosts in one canonical form, so that a rule scoped to a host matches every spelling that
//! reaches it: `API.example.com`, `api.example.com.` (a trailing dot: the same name to DNS and
//! TLS), `api%2Eexample.com` (percent-encoded, as URL parsers decode it), `[0:0:0:0:0:0:0:1]`
//! for `[::1]`, `[::ffff:127.0.0.1]` for `127.0.0.1`, and the IPv4 shorthands that resolvers
//! and the URL standard accept (`127.1`, `0x7f.0.0.1`, `2130706433`, `0177.0.0.1`).

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The longest host read: a DNS name is at most 253 bytes, a bracketed IPv6 address with a
/// zone far less.
const MAX_HOST_LEN: usize = 255;

/// `host` (as a URI spells it: IPv6 in brackets) in canonical form: lowercase, percent-decoded,
/// trailing dots removed, an IP literal written as `Display` writes it (an IPv4-mapped IPv6
/// address as IPv4). Borrowed when it is already canonical (the common case: no allocation).
pub(crate) fn canonical(host: &str) -> Cow<'_, str> {
    if is_plain_name(host) {
        return Cow::Borrowed(host);
    }
    // Longer than any host: not decoded (each round of nested escapes is a pass over it, so a
    // long one would cost its length squared); it matches no scope, which are all shorter.
    if host.len() > MAX_HOST_LEN {
        return Cow::Owned(host.to_ascii_lowercase());
    }
    let mut name = String::with_capacity(host.len());
    if !percent_decode_into(host, &mut name) {
        // Not ASCII once decoded: no resolver takes it as written; compare it lowercased.
        return Cow::Owned(host.to_ascii_lowercase());
    }
    // Decoded until no escape is left (a host escaped twice is still that host), within
    // bounds: each round shortens it.
    while name.contains('%') {
        let mut again = String::with_capacity(name.len());
        if !percent_decode_into(&name, &mut again) || again == name {
            break;
        }
        name = again;
    }
    name.make_ascii_lowercase();
    if let Some(inner) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        // A zone (`[fe80::1%25eth0]`, decoded above) names an interface, not another host.
        let inner = inner.split('%').next().unwrap_or(inner);
        return match inner.parse::<Ipv6Addr>() {
            Ok(ip) => Cow::Owned(match ip.to_ipv4_mapped() {
                Some(v4) => v4.to_string(),
                None => format!("[{ip}]"),
            }),
            Err(_) => Cow::Owned(name),
        };
    }
    while name.len() > 1 && name.ends_with('.') {
        name.pop();
    }
    match ipv4(&name) {
        Some(ip) => Cow::Owned(ip.to_string()),
        None => Cow::Owned(name),
    }
}

/// Lowercase letters, digits, `-` and `.`, not ending in a dot, and not an IPv4 address in a
/// form other than dotted decimal: already canonical.
fn is_plain_name(host: &str) -> bool {
    let bytes = host.as_bytes();
    if bytes.is_empty() || bytes[bytes.len() - 1] == b'.' {
        return false;
    }
    if !bytes
        .iter()
        .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return false;
    }
    // A name whose last label is a number is an IPv4 address (the URL standard's rule):
    // canonical only as four decimal parts without leading zeros.
    let last = host.rsplit('.').next().unwrap_or(host);
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if !hex && !last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    is_dotted_decimal(host)
}

/// Four decimal parts of at most 255 without leading zeros: an IPv4 address as `Display`
/// writes it (checked without writing it).
fn is_dotted_decimal(host: &str) -> bool {
    let mut parts = 0;
    for part in host.split('.') {
        parts += 1;
        let ok = !part.is_empty()
            && part.len() <= 3
            && part.bytes().all(|b| b.is_ascii_digit())
            && (part == "0" || !part.starts_with('0'))
            && part.parse::<u16>().is_ok_and(|n| n <= 255);
        if !ok {
            return false;
        }
    }
    parts == 4
}

/// Decodes `%XX` escapes of `host` into `out`; false if the result is not ASCII.
fn percent_decode_into(host: &str, out: &mut String) -> bool {
    let bytes = host.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' && i + 2 < bytes.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                let decoded = (h * 16 + l) as u8;
                if !decoded.is_ascii() {
                    return false;
                }
                out.push(decoded as char);
                i += 3;
                continue;
            }
        }
        if !b.is_ascii() {
            return false;
        }
        out.push(b as char);
        i += 1;
    }
    true
}

/// The URL standard's IPv4 parser: up to four dot-separated parts (one empty last part
/// allowed), each decimal, hex (`0x`) or octal (leading `0`); the last part fills the bytes
/// left. `None` if `name` is not a number in that sense (a name, or an invalid address).
fn ipv4(name: &str) -> Option<Ipv4Addr> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return None;
    }
    let mut parts = [0u64; 4];
    let mut count = 0;
    for part in name.split('.') {
        if count == 4 {
            return None;
        }
        parts[count] = number(part)?;
        count += 1;
    }
    let (last, init) = (parts[count - 1], &parts[..count - 1]);
    if init.iter().any(|&p| p > 255) || last >= 1u64 << (8 * (5 - count)) {
        return None;
    }
    let mut value = last;
    for (i, &p) in init.iter().enumerate() {
        value += p << (8 * (3 - i));
    }
    u32::try_from(value).ok().map(Ipv4Addr::from)
}

fn number(part: &str) -> Option<u64> {
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        // "0x" alone is zero in the URL standard; an empty part is not a number.
        return (radix == 16).then_some(0);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // Leading zeros are allowed in any number (resolvers take `0x0000007f.1`); past them, a
    // part too long for an address is not one.
    let significant = digits.trim_start_matches('0');
    if significant.len() > 12 {
        return None;
    }
    if significant.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(significant, radix).ok()
}

/// What a request says of its host, before a policy's origin is considered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostSeen<'a> {
    /// Named by the request's URI (absolute form, HTTP/2's `:authority`), with no `Host`
    /// header naming another host.
    Uri(&'a str, Option<u16>),
    /// A request in origin form (`/v1/send`) whose `Host` header names this host. `decides`:
    /// the header is where the request goes (HTTP/1.x, as hyper's connection-level client
    /// sends it). Over HTTP/2 it is not: the authority is added below the layer (tonic's
    /// `Channel` adds its endpoint's, whatever metadata the call carries).
    Header {
        host: &'a str,
        port: Option<u16>,
        decides: bool,
    },
    /// Nothing in the request names its host.
    Nothing,
    /// The request names two hosts (its URI and its `Host` header, or two `Host` fields): the
    /// server may route by either, so the host is not known.
    Conflict,
}

impl<'a> HostSeen<'a> {
    /// The host the request itself names, if one does (what hedging's latency slots are
    /// kept by).
    pub(crate) fn named(self) -> Option<(&'a str, Option<u16>)> {
        match self {
            HostSeen::Uri(host, port) | HostSeen::Header { host, port, .. } => Some((host, port)),
            HostSeen::Nothing | HostSeen::Conflict => None,
        }
    }

    /// The host the request goes to, given the origin the layer was told (`None`: none), or
    /// `None` when that is not known. A `Host` header that names another host than the
    /// origin leaves it unknown: the server may route by either (fail closed).
    pub(crate) fn target<'o>(self, origin: Option<&'o HostScope>) -> Option<RequestHost<'o>>
    where
        'a: 'o,
    {
        match (self, origin) {
            (HostSeen::Uri(host, port), _) => Some(RequestHost::new(host, port)),
            (HostSeen::Header { host, .. }, Some(origin)) => {
                (*canonical(host) == *origin.host).then(|| RequestHost::of_scope(origin))
            }
            (
                HostSeen::Header {
                    host,
                    port,
                    decides: true,
                },
                None,
            ) => Some(RequestHost::new(host, port)),
            (HostSeen::Header { decides: false, .. }, None) => None,
            (HostSeen::Nothing, origin) => origin.map(RequestHost::of_scope),
            (HostSeen::Conflict, _) => None,
        }
    }
}

/// What a request says of its host: its URI's, or for a request in origin form its `Host`
/// header's (see [`HostSeen`]; `version` says whether that header decides where it goes).
pub(crate) fn of_request<'a>(
    uri: &'a http::Uri,
    headers: &'a http::HeaderMap,
    version: http::Version,
) -> HostSeen<'a> {
    // One lookup when there is no `Host` (the common case for a client's request).
    let header = match headers.get(http::header::HOST) {
        None => None,
        Some(first) => {
            if headers.get_all(http::header::HOST).iter().nth(1).is_some() {
                // Two `Host` fields: servers differ on which one counts (or refuse it).
                return HostSeen::Conflict;
            }
            Some(first)
        }
    };
    let parts = uri.authority().map(|a| authority_parts(a.as_str()));
    match (parts, header) {
        (Some((host, port)), header) => {
            let port = port.or_else(|| scheme_port(uri));
            match unless_disagreeing(host, port, header) {
                Some((host, port)) => HostSeen::Uri(host, port),
                None => HostSeen::Conflict,
            }
        }
        (None, Some(value)) => match host_header(value) {
            Some((host, port)) => HostSeen::Header {
                host,
                port,
                decides: version < http::Version::HTTP_2,
            },
            // A `Host` that names nothing readable: the server's reading of it is unknown.
            None => HostSeen::Conflict,
        },
        (None, None) => HostSeen::Nothing,
    }
}

/// `host` and `port` (a URI's or URL's), unless the request's `Host` header names another host:
/// the server may route by either, so the host is then not known (`None`). A `Host` that names
/// the same host on another port keeps the URI's port, the one the request reaches: a proxy
/// forwards requests with the `Host` its clients sent (its own address).
pub(crate) fn unless_disagreeing<'a>(
    host: &'a str,
    port: Option<u16>,
    header: Option<&http::HeaderValue>,
) -> Option<(&'a str, Option<u16>)> {
    let Some(value) = header else {
        return Some((host, port));
    };
    let (other, _) = host_header(value)?;
    (canonical(host) == canonical(other)).then_some((host, port))
}

/// A `Host` header's host and port; `None` if it is empty or not visible ASCII (HTTP parsers
/// trim the spaces around a field value, so this does too).
pub(crate) fn host_header(value: &http::HeaderValue) -> Option<(&str, Option<u16>)> {
    if value.len() > MAX_HOST_LEN + ":65535".len() {
        // Longer than any host and port: not a host the request could go to (fail closed).
        return None;
    }
    let value = value.to_str().ok()?.trim();
    let (host, port) = match value.rfind(':') {
        // A colon inside brackets is IPv6, not a port.
        Some(i) if !value[i..].contains(']') => (&value[..i], value[i + 1..].parse().ok()),
        _ => (value, None),
    };
    (!host.is_empty()).then_some((host, port))
}

/// An authority's host and port, as `http::uri::Authority::host` and `port_u16` read them,
/// in one pass over its bytes (those two search it four times: a third of what finding a
/// request's host cost). The host is what follows the last `@`: up to its first `]` if it
/// opens with `[`, else up to its first `:`; the port is the digits after the last `:`.
pub(crate) fn authority_parts(authority: &str) -> (&str, Option<u16>) {
    let bytes = authority.as_bytes();
    // The start of what follows the last `@`, the first `:` after it, and the last `:`.
    let (mut start, mut first_colon, mut last_colon) = (0, None, None);
    for (i, &b) in bytes.iter().enumerate() {
        if b == b':' {
            first_colon.get_or_insert(i);
            last_colon = Some(i);
        } else if b == b'@' {
            start = i + 1;
            first_colon = None;
        }
    }
    let host = if bytes.get(start) == Some(&b'[') {
        let host_port = &authority[start..];
        host_port.find(']').map_or(host_port, |i| &host_port[..=i])
    } else {
        &authority[start..first_colon.unwrap_or(bytes.len())]
    };
    let port = last_colon.and_then(|i| port_digits(&bytes[i + 1..]));
    (host, port)
}

/// A port as `http::uri::Port` parses one: 1 to 5 ASCII digits within `u16`.
fn port_digits(digits: &[u8]) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u32, |n, b| n * 10 + u32::from(b - b'0'));
    u16::try_from(n).ok()
}

/// The default port of a URI's scheme, if it is one that has one (a comparison of http's
/// scheme values: no text is compared for the standard two).
fn scheme_port(uri: &http::Uri) -> Option<u16> {
    let scheme = uri.scheme()?;
    if *scheme == http::uri::Scheme::HTTPS {
        Some(443)
    } else if *scheme == http::uri::Scheme::HTTP {
        Some(80)
    } else {
        default_port(scheme.as_str())
    }
}

pub(crate) fn default_port(scheme: &str) -> Option<u16> {
    if scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("wss") {
        Some(443)
    } else if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("ws") {
        Some(80)
    } else {
        None
    }
}

/// A host a setting names, and the port it is limited to, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostScope {
    /// Canonical (see [`canonical`]).
    pub(crate) host: Box<str>,
    /// `None`: every port.
    pub(crate) port: Option<u16>,
}

impl HostScope {
    /// What a user holds: a host (`api.example.com`, `[::1]`), an authority with a port
    /// (`localhost:8080`: that port only), or a base URL (`https://api.example.com/v1`: its
    /// host, and its port unless it is the scheme's default; the path is ignored, since
    /// templates are whole paths). `Err` says what is wrong.
    pub(crate) fn parse(input: &str) -> Result<HostScope, &'static str> {
        if input.is_empty() {
            return Err("it is empty");
        }
        if input.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err("a host is visible ASCII");
        }
        let (authority, scheme) = match input.split_once("://") {
            Some((scheme, rest)) => {
                let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
                (&rest[..end], Some(scheme))
            }
            None => {
                if input.contains(['/', '?', '#']) {
                    return Err(
                        "give a host, an authority (host:port) or a base URL with its scheme",
                    );
                }
                (input, None)
            }
        };
        if authority.contains('@') {
            return Err("leave user information out (it may be a secret)");
        }
        let authority: http::uri::Authority = authority
            .parse()
            .map_err(|_| "not a valid host or authority")?;
        let host = authority.host();
        if host.is_empty() {
            return Err("it has no host");
        }
        if authority.port_u16() == Some(0) {
            return Err("port 0 is no port a request reaches");
        }
        let port = match (authority.port_u16(), scheme.and_then(default_port)) {
            (Some(p), Some(default)) if p == default => None,
            (port, _) => port,
        };
        Ok(HostScope {
            host: canonical(host).into(),
            port,
        })
    }

    /// Whether a request to `host` (canonical) on `port` is in scope.
    pub(crate) fn covers(&self, host: &str, port: Option<u16>) -> bool {
        *self.host == *host && self.port.is_none_or(|p| port == Some(p))
    }
}

/// A request's host, canonical, and the port it reaches.
#[derive(Clone, Debug)]
pub(crate) struct RequestHost<'a> {
    pub(crate) host: Cow<'a, str>,
    pub(crate) port: Option<u16>,
}

impl<'a> RequestHost<'a> {
    pub(crate) fn new(host: &'a str, port: Option<u16>) -> Self {
        RequestHost {
            host: canonical(host),
            port,
        }
    }

    /// The host of a scope (already canonical) and its port: a policy's origin.
    pub(crate) fn of_scope(scope: &'a HostScope) -> Self {
        RequestHost {
            host: Cow::Borrowed(&scope.host),
            port: scope.port,
        }
    }
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
