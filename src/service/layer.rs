use tower_layer::Layer;

use super::RetrySafety;
use crate::policy::RetryPolicy;

/// The policy is the layer: `ServiceBuilder::new().layer(policy)`.
impl<S> Layer<S> for RetryPolicy {
    type Service = RetrySafety<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetrySafety::new(inner, self.clone())
    }
}
