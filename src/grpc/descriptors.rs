//! Route rules from a gRPC service's descriptors: each method's `idempotency_level`.

use prost::Message;
use prost_types::method_options::IdempotencyLevel;
use prost_types::FileDescriptorSet;

use crate::build_error::BuildError;
use crate::classify::grpc::{is_full_name, is_name};
use crate::policy::builder::DescribedRoutes;
use crate::policy::builder::RetryPolicyBuilder;

/// Adds the harmless methods of `set` to `routes`, or says why `set` is refused.
fn read(routes: &mut DescribedRoutes, set: &FileDescriptorSet) {
    for file in &set.file {
        let package = file.package();
        for service in &file.service {
            for method in &service.method {
                let level = method
                    .options
                    .as_ref()
                    .map_or(IdempotencyLevel::IdempotencyUnknown, |o| {
                        o.idempotency_level()
                    });
                let (service, method) = (service.name(), method.name());
                let named = is_full_name(package) && is_name(service) && is_name(method);
                let path = if package.is_empty() {
                    format!("/{service}/{method}")
                } else {
                    format!("/{package}.{service}/{method}")
                };
                if named {
                    routes.methods.push(path[1..].to_owned());
                }
                // IDEMPOTENCY_UNKNOWN says nothing: the call stays a POST, a write.
                if level == IdempotencyLevel::IdempotencyUnknown {
                    continue;
                }
                // Names from bytes are checked, so no rule can be a template by accident.
                if !named {
                    routes.refused.get_or_insert(BuildError::setting(
                        "grpc_descriptors",
                        format!(
                            "{package:?}.{service:?}/{method:?} is not a proto name \
                             (letters, digits and `_`, dotted in the package)"
                        ),
                    ));
                    continue;
                }
                routes.paths.push(path);
            }
        }
    }
}

impl RetryPolicyBuilder {
    /// Rules from a gRPC service's descriptors: each method whose
    /// `idempotency_level` is `NO_SIDE_EFFECTS` or `IDEMPOTENT` gets a rule
    /// [`Idempotent`](crate::classify::Idempotency::Idempotent) for `POST /package.Service/Method`, so the
    /// proto, not a list by hand, says which calls are safe to repeat. A method without the
    /// option stays a write. A [`route`](Self::route) given by hand for the same path
    /// outranks the proto's.
    ///
    /// Defaults to none. [`build`](Self::build) refuses a name that is not a proto name.
    ///
    /// ```
    /// use prost_types::{
    ///     method_options::IdempotencyLevel, FileDescriptorProto, FileDescriptorSet,
    ///     MethodDescriptorProto, MethodOptions, ServiceDescriptorProto,
    /// };
    /// use tower_retry_safety::{Idempotency, RetryPolicy};
    ///
    /// let method = |name: &str, level: IdempotencyLevel| MethodDescriptorProto {
    ///     name: Some(name.into()),
    ///     options: Some(MethodOptions {
    ///         idempotency_level: Some(level as i32),
    ///         ..Default::default()
    ///     }),
    ///     ..Default::default()
    /// };
    /// let set = FileDescriptorSet {
    ///     file: vec![FileDescriptorProto {
    ///         package: Some("lab.v1".into()),
    ///         service: vec![ServiceDescriptorProto {
    ///             name: Some("Ledger".into()),
    ///             method: vec![
    ///                 method("Count", IdempotencyLevel::NoSideEffects),
    ///                 method("Append", IdempotencyLevel::IdempotencyUnknown),
    ///             ],
    ///             ..Default::default()
    ///         }],
    ///         ..Default::default()
    ///     }],
    /// };
    /// let policy = RetryPolicy::builder().grpc_descriptors(&set).build()?;
    ///
    /// let count = http::Request::post("http://svc/lab.v1.Ledger/Count").body(())?;
    /// assert_eq!(policy.classify(&count).idempotency(), Idempotency::Idempotent);
    /// let append = http::Request::post("http://svc/lab.v1.Ledger/Append").body(())?;
    /// assert_eq!(policy.classify(&append).idempotency(), Idempotency::NonIdempotent);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grpc_descriptors(mut self, set: &FileDescriptorSet) -> Self {
        read(self.described_routes(), set);
        self
    }

    /// [`grpc_descriptors`](Self::grpc_descriptors) from an encoded `FileDescriptorSet`
    /// (what `tonic-prost-build`'s `file_descriptor_set_path` writes, or a reflection
    /// service serves). [`build`](Self::build) refuses bytes that do not decode.
    pub fn grpc_descriptor_bytes(mut self, bytes: &[u8]) -> Self {
        match FileDescriptorSet::decode(bytes) {
            Ok(set) => read(self.described_routes(), &set),
            Err(err) => {
                self.described_routes()
                    .refused
                    .get_or_insert(BuildError::setting(
                        "grpc_descriptor_bytes",
                        format!("not an encoded FileDescriptorSet: {err}"),
                    ));
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::RetryPolicy;

    #[test]
    fn bad_bytes_and_bad_names_fail_build_naming_the_setting() {
        let err = RetryPolicy::builder()
            .grpc_descriptor_bytes(b"\xff\xff\xff")
            .build()
            .unwrap_err();
        assert_eq!(err.setting_name(), "grpc_descriptor_bytes");

        let set = FileDescriptorSet {
            file: vec![prost_types::FileDescriptorProto {
                package: Some("lab.v1".into()),
                service: vec![prost_types::ServiceDescriptorProto {
                    name: Some("Ledger".into()),
                    method: vec![prost_types::MethodDescriptorProto {
                        name: Some("{*any}".into()),
                        options: Some(prost_types::MethodOptions {
                            idempotency_level: Some(IdempotencyLevel::Idempotent as i32),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let err = RetryPolicy::builder()
            .grpc_descriptors(&set)
            .build()
            .unwrap_err();
        assert_eq!(err.setting_name(), "grpc_descriptors");
        assert!(err.to_string().contains("not a proto name"), "{err}");
    }
}
