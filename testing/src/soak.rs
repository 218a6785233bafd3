//! Soaks: a default run proves each property in seconds; `RETRY_SAFETY_SOAK=1` runs the long
//! form (more operations, more requests) of the same checks.

/// `quick` in a default run, `long` when `RETRY_SAFETY_SOAK` is set (to anything but empty or
/// `0`).
pub fn soak<T>(quick: T, long: T) -> T {
    match std::env::var("RETRY_SAFETY_SOAK") {
        Ok(v) if !v.is_empty() && v != "0" => long,
        _ => quick,
    }
}
