//! Response bodies read whole for a keyed write, cut past the limit, continued with the
//! server's stored response.

mod read_whole_keyed;
