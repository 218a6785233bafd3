//! Verdicts from proto descriptors (the adversarial review of the gRPC support, issue 24): a
//! hand-written write rule outranks the proto, packages and letter case stay apart, an unknown
//! `idempotency_level` is a write, and malformed descriptor bytes fail `build()` without
//! panicking. A defect the review found is fixed and its test runs: a hand-written catch-all
//! write rule lost to the proto's exact paths.
#![cfg(feature = "tonic")]

use http::Method;
use prost::Message;
use retry_safety_testing::grpc::misbehaving_server::builder;
use tower_retry_safety::{Idempotency, RetryPolicy};

fn verdict(policy: &RetryPolicy, path: &str) -> Idempotency {
    let req = http::Request::post(format!("http://svc{path}"))
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    policy.classify(&req).idempotency()
}

fn method(name: &str, level: Option<i32>) -> prost_types::MethodDescriptorProto {
    prost_types::MethodDescriptorProto {
        name: Some(name.into()),
        options: level.map(|l| prost_types::MethodOptions {
            idempotency_level: Some(l),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn set(
    files: Vec<(&str, &str, Vec<prost_types::MethodDescriptorProto>)>,
) -> prost_types::FileDescriptorSet {
    prost_types::FileDescriptorSet {
        file: files
            .into_iter()
            .map(
                |(package, service, methods)| prost_types::FileDescriptorProto {
                    package: Some(package.into()),
                    service: vec![prost_types::ServiceDescriptorProto {
                        name: Some(service.into()),
                        method: methods,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )
            .collect(),
    }
}

const IDEMPOTENT: i32 = 2;
const NO_SIDE_EFFECTS: i32 = 1;

/// A rule by hand that says write, for the exact path the proto marks IDEMPOTENT: the write
/// wins (fails closed). The same method name in two packages: only the marked one is a read.
/// An unknown idempotency_level value is a write.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[test]
fn a_hand_written_write_rule_outranks_the_proto_and_packages_stay_apart() {
    let policy = builder()
        .route(
            Method::POST,
            "/lab.v1.Ledger/Put",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Put"),
        Idempotency::NonIdempotent
    );
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Count"),
        Idempotency::Idempotent
    );
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Append"),
        Idempotency::NonIdempotent
    );

    let two = set(vec![
        (
            "a.v1",
            "Ledger",
            vec![method("Count", Some(NO_SIDE_EFFECTS))],
        ),
        (
            "b.v1",
            "Ledger",
            vec![method("Count", None), method("Odd", Some(99))],
        ),
    ]);
    let policy = RetryPolicy::builder()
        .grpc_descriptors(&two)
        .build()
        .unwrap();
    assert_eq!(
        verdict(&policy, "/a.v1.Ledger/Count"),
        Idempotency::Idempotent
    );
    assert_eq!(
        verdict(&policy, "/b.v1.Ledger/Count"),
        Idempotency::NonIdempotent
    );
    assert_eq!(
        verdict(&policy, "/b.v1.Ledger/Odd"),
        Idempotency::NonIdempotent
    );
}

/// A catch-all rule by hand that says the whole service writes
/// (`POST /lab.v1.Ledger/{*rest}` NonIdempotent), and the proto marking `Count`
/// NO_SIDE_EFFECTS (and `Put` IDEMPOTENT).
///
/// Found by the review, fixed (weaker, did not fail closed): the proto won. `ProtoRoutes::add_to` skips a
/// proto path only when a hand rule has the very same template; otherwise it adds a static
/// `Idempotent` rule, and a static rule outranks a catch-all within one spelling. So the
/// user's explicit "this whole service writes" is silently overridden for every method the
/// proto marks, contrary to "a rule given by hand outranks the proto" (builder docs): today
/// `Count` classifies `Idempotent` (expected `NonIdempotent`), and a trailers-only
/// UNAVAILABLE after apply would be retried. Fix: in `add_to`, build a table of the hand rules
/// and skip a proto path that any hand `NonIdempotent` rule matches (or consult proto rules
/// only when no hand rule matches), or refuse the combination in `build()`.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[test]
fn a_hand_written_catch_all_write_rule_against_the_proto() {
    let policy = builder()
        .route(
            Method::POST,
            "/lab.v1.Ledger/{*rest}",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Append"),
        Idempotency::NonIdempotent
    );
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Count"),
        Idempotency::NonIdempotent,
        "a hand-written write rule covering the method lost to the proto"
    );
}

/// gRPC method paths are case-sensitive: `Get` marked IDEMPOTENT must not make its sibling
/// `get` (no option: a write) a read, nor a package `Lab.v1` make `lab.v1` one.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[test]
fn a_read_in_the_proto_does_not_make_a_method_differing_in_case_a_read() {
    let protos = set(vec![
        (
            "shop.v1",
            "Orders",
            vec![method("Get", Some(IDEMPOTENT)), method("get", None)],
        ),
        (
            "Lab.v1",
            "Ledger",
            vec![method("Send", Some(NO_SIDE_EFFECTS))],
        ),
        ("lab.v1", "Ledger", vec![method("Send", None)]),
    ]);
    let policy = RetryPolicy::builder().grpc_descriptors(&protos).build();
    let policy = policy.expect("a proto with methods differing in case builds");
    assert_eq!(
        verdict(&policy, "/shop.v1.Orders/Get"),
        Idempotency::Idempotent
    );
    assert_eq!(
        verdict(&policy, "/shop.v1.Orders/get"),
        Idempotency::NonIdempotent,
        "a write taken for a read through letter case"
    );
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Send"),
        Idempotency::NonIdempotent,
        "a write in another package taken for a read through letter case"
    );
}

/// Malformed descriptor bytes fail `build()`, never panic: truncations of a real set, a huge
/// length, nesting past prost's recursion limit.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[test]
fn malformed_descriptor_bytes_fail_build_without_panicking() {
    let good = retry_safety_testing::grpc::descriptor_set().encode_to_vec();
    assert!(RetryPolicy::builder()
        .grpc_descriptor_bytes(&good)
        .build()
        .is_ok());
    for cut in 0..good.len() {
        let bytes = &good[..cut];
        let decodes = prost_types::FileDescriptorSet::decode(bytes).is_ok();
        let built = RetryPolicy::builder().grpc_descriptor_bytes(bytes).build();
        assert_eq!(built.is_ok(), decodes, "cut at {cut}");
    }
    let huge = [0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f];
    assert!(RetryPolicy::builder()
        .grpc_descriptor_bytes(&huge)
        .build()
        .is_err());
    // FileDescriptorSet.file { message_type { nested_type { nested_type { ... } } } }
    let mut nested: Vec<u8> = Vec::new();
    for _ in 0..300 {
        let mut outer = vec![0x1a];
        prost::encoding::encode_varint(nested.len() as u64, &mut outer);
        outer.extend_from_slice(&nested);
        nested = outer;
    }
    let mut file = vec![0x22];
    prost::encoding::encode_varint(nested.len() as u64, &mut file);
    file.extend_from_slice(&nested);
    let mut deep = vec![0x0a];
    prost::encoding::encode_varint(file.len() as u64, &mut deep);
    deep.extend_from_slice(&file);
    let err = RetryPolicy::builder()
        .grpc_descriptor_bytes(&deep)
        .build()
        .unwrap_err();
    assert_eq!(err.setting_name(), "grpc_descriptor_bytes");
}
