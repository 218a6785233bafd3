//! What a request is, for messages: its method and path, never its query string, capped in
//! length. A leaf: the error, the bookkeeping and the server all print with it.

use http::{Method, Uri};

/// Longest path echoed in errors and logs.
pub(crate) const MAX_PATH_LEN: usize = 256;

/// The method and path of the request, for messages. The query string is never kept.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) method: Method,
    path: TargetPath,
    /// A gRPC call: messages name it `package.Service/Method`, not `POST /package.Service/Method`.
    grpc: bool,
}

#[derive(Clone, Debug)]
enum TargetPath {
    /// Cloning a `Uri` shares its bytes; the path is cut out only when printed.
    Uri(Uri),
    /// The reqwest adapter's: the path and the host, cut out of its URL.
    Text {
        path: Box<str>,
        host: Option<Box<str>>,
    },
}

impl Target {
    #[inline]
    pub(crate) fn from_uri(method: Method, uri: Uri) -> Self {
        Target {
            method,
            path: TargetPath::Uri(uri),
            grpc: false,
        }
    }

    #[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
    pub(crate) fn from_path(method: Method, host: Option<&str>, path: &str) -> Self {
        Target {
            method,
            path: TargetPath::Text {
                path: cap(path, MAX_PATH_LEN).into(),
                host: host.map(|h| cap(h, MAX_PATH_LEN).into()),
            },
            grpc: false,
        }
    }

    /// Marks the request as a gRPC call.
    pub(crate) fn mark_grpc_call(&mut self) {
        self.grpc = true;
    }

    /// The host the request went to, if known.
    pub(crate) fn host(&self) -> Option<&str> {
        match &self.path {
            TargetPath::Uri(uri) => uri.host(),
            TargetPath::Text { host, .. } => host.as_deref(),
        }
    }

    /// The request's URI, when the target was made from one.
    pub(crate) fn uri(&self) -> Option<&Uri> {
        match &self.path {
            TargetPath::Uri(uri) => Some(uri),
            TargetPath::Text { .. } => None,
        }
    }

    /// The path without query, capped in length.
    pub(crate) fn path(&self) -> &str {
        match &self.path {
            TargetPath::Uri(uri) => cap(uri.path(), MAX_PATH_LEN),
            TargetPath::Text { path, .. } => path,
        }
    }
}

/// What the request is, for a message: `POST /v1/messages`, or for a gRPC call
/// `package.Service/Method` (when its path has that shape).
impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = self.path();
        // A call's path of gRPC's shape names its method; any other is shown as HTTP's.
        match self
            .grpc
            .then(|| crate::classify::grpc::method_name(path))
            .flatten()
        {
            Some(method) => f.write_str(method),
            None => write!(f, "{} {path}", self.method),
        }
    }
}

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
