//! Routes read from a service's description (a gRPC descriptor set, read by the gRPC front
//! end): idempotent POST paths that a rule given by hand outranks.

use super::*;

/// The described paths read so far, or the first description that was refused.
#[derive(Debug, Default)]
pub(crate) struct DescribedRoutes {
    pub(crate) paths: Vec<String>,
    /// Every described method's full name (`package.Service/Method`), harmless or not: the
    /// `grpc.method` values a meter may record.
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    pub(crate) methods: Vec<String>,
    pub(crate) refused: Option<BuildError>,
}

impl DescribedRoutes {
    /// Adds a rule for each path that has none of its own: a rule given by hand outranks
    /// the proto.
    pub(super) fn add_to(
        &mut self,
        routes: &mut Vec<(Method, String, Idempotency)>,
    ) -> Result<(), BuildError> {
        if let Some(err) = self.refused.take() {
            return Err(err);
        }
        if self.paths.is_empty() {
            return Ok(());
        }
        // The hand rules for POST, to find the ones a proto path falls under: a catch-all
        // such as `/pkg.Service/{*rest}` given by hand outranks the proto's exact paths
        // (matching would prefer the exact one).
        let mut hand = RouteTable::default();
        for (method, template, idempotency) in routes.iter() {
            if *method == Method::POST {
                hand.insert(method.clone(), template, *idempotency)?;
            }
        }
        for path in self.paths.drain(..) {
            if hand.lookup(&Method::POST, &path).is_none() {
                routes.push((Method::POST, path, Idempotency::Idempotent));
            }
        }
        Ok(())
    }
}
