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
