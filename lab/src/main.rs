//! `retry-safety-lab`: the fault lab's command line (see the crate's `lab` module).

use std::process::ExitCode;

fn main() -> ExitCode {
    retry_safety_lab::main_with_args(std::env::args_os().skip(1))
}
