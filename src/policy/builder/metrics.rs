use super::RetryPolicyBuilder;

impl RetryPolicyBuilder {
    /// Records what each request's retries did in OpenTelemetry instruments made from `meter`
    /// (once, by [`build`](Self::build): a request makes none): attempts per request, retries
    /// by the failed attempt's class, the waits, hedges, writes suppressed because they may
    /// have been applied, refused retries and the server's stored responses. The
    /// [`metrics`](crate::metrics) module lists every instrument with its unit and attributes.
    /// The tower layer, the reqwest adapter and the tonic front end record through the same
    /// policy; the attributes never hold a path, a query, a key or a header value.
    ///
    /// For the global meter provider, hand over
    /// `opentelemetry::global::meter("tower-retry-safety")`.
    ///
    /// ```
    /// use tower_retry_safety::RetryPolicy;
    ///
    /// let meter = opentelemetry::global::meter("tower-retry-safety");
    /// let policy = RetryPolicy::builder().meter(meter).build()?;
    /// # drop(policy);
    /// # Ok::<(), tower_retry_safety::BuildError>(())
    /// ```
    ///
    /// Defaults to none: nothing is recorded, and a request pays one check of an `Option`
    /// at its end.
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub fn meter(mut self, meter: opentelemetry::metrics::Meter) -> Self {
        self.meter = Some(meter);
        self
    }
}

impl super::Rules {
    /// `grpc.method`'s values besides `other`: the gRPC methods the rules name literally (a
    /// POST route without a template part, for any host or one) and every method of a
    /// described service. Anything else a caller sends is `other`: a path is no bounded
    /// attribute.
    pub(super) fn grpc_methods(&self) -> Vec<String> {
        let literal = |method: &http::Method, template: &str| {
            let name = (*method == http::Method::POST && !template.contains('{'))
                .then(|| crate::classify::grpc::method_name(template))
                .flatten()?;
            Some(name.to_owned())
        };
        let routes = self.routes.iter().map(|(m, t, _)| (m, t));
        let host_routes = self.host_routes.iter().map(|(_, m, t, _)| (m, t));
        let key_routes = self.key_routes.iter().map(|(m, t, _)| (m, t));
        let mut methods: Vec<String> = routes
            .chain(host_routes)
            .chain(key_routes)
            .filter_map(|(m, t)| literal(m, t))
            .collect();
        methods.extend(self.described.methods.iter().cloned());
        methods
    }
}
