use std::fmt;

use http::StatusCode;

/// A set of status codes as a bitmap over 100..=999: membership is one shift and mask.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct StatusSet([u64; 16]);

impl StatusSet {
    pub(crate) const fn empty() -> Self {
        StatusSet([0; 16])
    }

    pub(crate) fn insert(&mut self, status: StatusCode) {
        let n = status.as_u16() as usize; // StatusCode guarantees 100..=999
        self.0[n / 64] |= 1 << (n % 64);
    }

    pub(crate) fn contains(&self, status: StatusCode) -> bool {
        let n = status.as_u16() as usize;
        self.0[n / 64] & (1 << (n % 64)) != 0
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = StatusCode> + '_ {
        (100u16..1000)
            .filter_map(|n| StatusCode::from_u16(n).ok())
            .filter(|s| self.contains(*s))
    }
}

impl fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(|s| s.as_u16()))
            .finish()
    }
}

impl FromIterator<StatusCode> for StatusSet {
    fn from_iter<I: IntoIterator<Item = StatusCode>>(iter: I) -> Self {
        let mut set = StatusSet::empty();
        for s in iter {
            set.insert(s);
        }
        set
    }
}
