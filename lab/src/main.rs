//! `retry-safety-lab`: the fault lab's command line. Its modules (`cli`, and under it the
//! `demo` subcommand and the command line's error) are the binary's own; what it runs is the
//! `retry_safety_lab` library.

use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    cli::main_with_args(std::env::args_os().skip(1))
}
