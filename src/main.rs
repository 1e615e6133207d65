//! The `qwen3-vl` command-line tool.

mod cli;

fn main() {
    std::process::exit(cli::run());
}
