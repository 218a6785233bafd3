use super::*;

fn table(rules: &[(Method, &str, Idempotency)]) -> RouteTable {
    let mut t = RouteTable::default();
    for (m, p, i) in rules {
        t.insert(m.clone(), p, *i).unwrap();
    }
    t
}

#[test]
fn parameters_and_catch_all_match() {
    let t = table(&[
        (
            Method::POST,
            "/v1/tools/{slug}/execute",
            Idempotency::NonIdempotent,
        ),
        (Method::POST, "/v1/files/{*path}", Idempotency::Idempotent),
    ]);
    assert_eq!(
        t.lookup(&Method::POST, "/v1/tools/GMAIL_SEND/execute"),
        Some(Idempotency::NonIdempotent)
    );
    assert_eq!(
        t.lookup(&Method::POST, "/v1/files/a/b/c.txt"),
        Some(Idempotency::Idempotent)
    );
    assert_eq!(t.lookup(&Method::POST, "/v1/tools/x"), None);
    // Rules are per method.
    assert_eq!(t.lookup(&Method::PUT, "/v1/files/a"), None);
}

#[test]
fn extension_methods_have_their_own_rules() {
    let purge = Method::from_bytes(b"PURGE").unwrap();
    let t = table(&[(purge.clone(), "/cache/{key}", Idempotency::Idempotent)]);
    assert_eq!(t.lookup(&purge, "/cache/x"), Some(Idempotency::Idempotent));
    let other = Method::from_bytes(b"LINK").unwrap();
    assert_eq!(t.lookup(&other, "/cache/x"), None);
}

#[test]
fn duplicate_rule_is_named() {
    let mut t = table(&[(Method::PUT, "/v1/a/{id}", Idempotency::Idempotent)]);
    let err = t
        .insert(Method::PUT, "/v1/a/{id}", Idempotency::NonIdempotent)
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("PUT /v1/a/{id}"), "{msg}");
    assert!(
        msg.contains("two rules for the same method and template"),
        "{msg}"
    );
    assert_eq!(t.len(), 1);
}

/// Found by the `route_template` fuzz target: matchit panics on more than 26 parameters.
#[test]
fn too_many_parameters_is_an_error_not_a_panic() {
    let template: String = (0..30).map(|i| format!("/{{p{i}}}")).collect();
    let mut t = RouteTable::default();
    let err = t
        .insert(Method::GET, &template, Idempotency::Idempotent)
        .unwrap_err();
    assert!(err.to_string().contains("at most 16 parameters"), "{err}");
    let sixteen: String = (0..16).map(|i| format!("/{{p{i}}}")).collect();
    t.insert(Method::GET, &sixteen, Idempotency::Idempotent)
        .unwrap();
    // Escaped braces are not parameters.
    assert_eq!(parameter_count("/a/{{literal}}/{id}"), 1);
}

const SEND: &str = "/v1/send/{id}";

fn send_rule() -> RouteTable {
    table(&[(Method::PUT, SEND, Idempotency::NonIdempotent)])
}

fn put(t: &RouteTable, path: &str) -> Option<Idempotency> {
    t.lookup(&Method::PUT, path)
}

#[test]
fn a_non_idempotent_rule_matches_every_spelling() {
    let t = send_rule();
    for path in [
        "/v1/send/m0",
        "/v1/send/m1/",
        "/v1/send/m1//",
        "/v1/%73end/m2",
        "/v1/%73%65%6E%64/m2",
        "/v1/SEND/m3",
        "/V1/Send/M3",
        "/v1/%53END/m3",
        "/v1//send/m4",
        "//v1/send/m4",
        "/v1/./send/m5",
        "/v1/x/../send/m6",
        "/v1/x/%2E%2e/send/m6",
        "/../v1/send/m6",
        // A parameter value in escapes, decoded or not, is still one segment.
        "/v1/send/m%37",
        "/v1/send/a%2Fb",
        // Decoded before routing by WSGI servers and Go's ServeMux.
        "/v1%2Fsend/m8",
        "/v1/send%2Fm8",
        "/v1%2fsend%2Fm8",
        "/v1%252Fsend/m8",
        // Segment parameters, cut by servlet containers.
        "/v1/send;v=1/m2",
        "/v1;a=b/send;jsessionid=x/m2",
        "/v1/send/m2;v=1",
        // A backslash, read as a slash by IIS.
        "/v1\\send/m9",
        "/v1%5Csend/m9",
    ] {
        assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
    }
    for path in [
        "/v1/send;v=1",
        "/v1/send%3Bv=1/m2/x",
        "/v1/send",
        "/v1/send/",
        "/v1/send/m9/more",
        "/v1/x/send/m9",
    ] {
        assert_eq!(put(&t, path), None, "{path}");
    }
}

/// Found by review: Rails routes `capture.json` to the `capture` action.
#[test]
fn a_format_suffix_is_routed_alike() {
    let t = table(&[(
        Method::POST,
        "/v1/charges/{id}/capture",
        Idempotency::NonIdempotent,
    )]);
    let post = |path| t.lookup(&Method::POST, path);
    for path in [
        "/v1/charges/c1/capture.json",
        "/v1/charges/c1/capture.xml",
        "/v1/charges/c1/capture%2Ejson",
        "/v1/charges/c1/Capture.JSON",
    ] {
        assert_eq!(post(path), Some(Idempotency::NonIdempotent), "{path}");
    }
    for path in ["/v1/charges/c1/.capture", "/v1/charges/c1/captured.json"] {
        assert_eq!(post(path), None, "{path}");
    }
}

#[test]
fn escapes_decode_in_either_hex_case() {
    let t = table(&[
        (Method::PUT, "/v1/~user/{id}", Idempotency::NonIdempotent),
        (Method::PUT, "/v1/a-b/{id}", Idempotency::NonIdempotent),
        (Method::PUT, "/v1/a%2Fb/{id}", Idempotency::NonIdempotent),
    ]);
    for path in [
        "/v1/%7Euser/x",
        "/v1/%7euser/x",
        "/v1/a%2db/x",
        "/v1/a%2Db/x",
        "/v1/a%2Fb/x",
        // Folding lower-cases the template's escape too.
        "/v1/a%2fb/x",
    ] {
        assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
    }
    assert_eq!(put(&t, "/v1/a/b/x"), None);
}

#[test]
fn catch_all_matches_every_spelling() {
    let t = table(&[(
        Method::DELETE,
        "/v1/files/{*path}",
        Idempotency::NonIdempotent,
    )]);
    for path in [
        "/v1/files/a/b.txt",
        "/v1/files/a/b.txt/",
        "/v1//files//a/b.txt",
        "/v1/FILES/a",
        "/v1/x/../files/a",
        "/v1/%66iles/a",
    ] {
        assert_eq!(
            t.lookup(&Method::DELETE, path),
            Some(Idempotency::NonIdempotent),
            "{path}"
        );
    }
    // The catch-all needs a non-empty tail.
    for path in ["/v1/files", "/v1/files/", "/v1/FILES/"] {
        assert_eq!(t.lookup(&Method::DELETE, path), None, "{path}");
    }
}

#[test]
fn idempotent_rules_match_only_the_path_as_sent() {
    let t = table(&[
        (Method::POST, "/v1/search", Idempotency::Idempotent),
        // A NonIdempotent rule for the method, so other spellings are looked at.
        (Method::POST, "/v1/send/{id}", Idempotency::NonIdempotent),
    ]);
    assert_eq!(
        t.lookup(&Method::POST, "/v1/search"),
        Some(Idempotency::Idempotent)
    );
    // A guess about the server's normalisation never makes a write retryable.
    for path in ["/v1/search/", "/v1/SEARCH", "/v1/%73earch", "/v1//search"] {
        assert_eq!(t.lookup(&Method::POST, path), None, "{path}");
    }
}

#[test]
fn the_stricter_verdict_wins_across_spellings() {
    let t = table(&[
        (Method::PUT, "/v1/{*rest}", Idempotency::Idempotent),
        (Method::PUT, SEND, Idempotency::NonIdempotent),
    ]);
    // As sent, these reach only the Idempotent catch-all; normalised or folded, the send.
    for path in [
        "/v1/send/m0",
        "/v1/send/m1/",
        "/v1/%73end/m2",
        "/v1/SEND/m3",
        "/v1//send/m4",
        "/v1/./send/m5",
        "/v1/x/../send/m6",
    ] {
        assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
    }
    for path in ["/v1/other/x", "/v1/send/m0/more", "/v1/Other"] {
        assert_eq!(put(&t, path), Some(Idempotency::Idempotent), "{path}");
    }
}

#[test]
fn a_specific_idempotent_exception_keeps_its_spelling() {
    let t = table(&[
        (Method::PUT, "/v1/{*rest}", Idempotency::NonIdempotent),
        (Method::PUT, "/v1/files/{id}", Idempotency::Idempotent),
    ]);
    assert_eq!(put(&t, "/v1/files/x"), Some(Idempotency::Idempotent));
    // Other spellings reach the catch-all as sent.
    for path in ["/v1/FILES/x", "/v1/files/x/", "/v1/%66iles/x"] {
        assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
    }
}

#[test]
fn templates_are_folded_too() {
    let t = table(&[(Method::PUT, "/v1/Send/{id}/", Idempotency::NonIdempotent)]);
    for path in ["/v1/Send/m1/", "/v1/send/m1", "/V1/SEND/m1", "/v1/send/m1/"] {
        assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
    }
    assert_eq!(put(&t, "/v1/sent/m1"), None);
}

#[test]
fn rules_that_fold_together_share_the_stricter_verdict() {
    for order in [false, true] {
        let mut rules = vec![
            (Method::PUT, "/v1/Items/{id}", Idempotency::Idempotent),
            (Method::PUT, "/v1/items/{key}/", Idempotency::NonIdempotent),
        ];
        if order {
            rules.reverse();
        }
        let t = table(&rules);
        assert_eq!(t.len(), 2);
        // As sent the Idempotent rule matches; folded, both are one route.
        assert_eq!(put(&t, "/v1/Items/a"), Some(Idempotency::NonIdempotent));
        assert_eq!(put(&t, "/v1/items/a"), Some(Idempotency::NonIdempotent));
        assert_eq!(put(&t, "/v1/items/a/b"), None);
    }
    // Two Idempotent rules stay Idempotent as sent.
    let t = table(&[
        (Method::GET, "/A/{x}", Idempotency::Idempotent),
        (Method::GET, "/a/{y}", Idempotency::Idempotent),
        (Method::GET, "/n/{x}", Idempotency::NonIdempotent),
    ]);
    assert_eq!(
        t.lookup(&Method::GET, "/A/1"),
        Some(Idempotency::Idempotent)
    );
}

#[test]
fn an_overlap_only_folding_creates_is_named_and_leaves_no_trace() {
    let mut t = table(&[(Method::PUT, "/A/{x}", Idempotency::Idempotent)]);
    let err = t
        .insert(Method::PUT, "/a/{*rest}", Idempotency::NonIdempotent)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("PUT /a/{*rest}: once letter case and spelling are folded")
            && msg.contains("against PUT /a/{x}"),
        "{msg}"
    );
    assert_eq!(t.len(), 1);
    assert_eq!(put(&t, "/a/x/y"), None);
    assert_eq!(put(&t, "/A/x"), Some(Idempotency::Idempotent));
}

#[test]
fn long_paths_are_respelled_too() {
    let t = table(&[(Method::PUT, "/v1/send/{*rest}", Idempotency::NonIdempotent)]);
    let tail = "a".repeat(2 * spelling::STACK_PATH);
    for path in [
        format!("/v1/%73end/{tail}"),
        format!("/V1/send/{tail}"),
        format!("/v1/send//{tail}/"),
    ] {
        assert_eq!(put(&t, &path), Some(Idempotency::NonIdempotent));
    }
}

#[test]
fn paths_that_are_not_absolute_are_only_folded() {
    let t = table(&[(Method::OPTIONS, "/x", Idempotency::NonIdempotent)]);
    assert_eq!(t.lookup(&Method::OPTIONS, "*"), None);
    assert_eq!(t.lookup(&Method::OPTIONS, ""), None);
}

#[test]
fn invalid_templates_are_named() {
    let mut t = RouteTable::default();
    for bad in [
        "/v1/{unclosed",
        "/v1/{*path}/more",
        "no-slash",
        "/a?x=1",
        "/v1/{}",
        "/v1/./send",
        "/v1/x/../send",
        "/v1/%2e%2E/send",
    ] {
        let err = t
            .insert(Method::GET, bad, Idempotency::Idempotent)
            .unwrap_err();
        assert!(err.to_string().contains(bad), "{err}");
    }
    assert!(t.is_empty());
}
