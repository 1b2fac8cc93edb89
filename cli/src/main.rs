//! rocectl: manage and inspect ferroce through roced's REST API (see `cli::ctl`).

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut err = std::io::stderr();
    let code = cli::ctl::run(std::env::args_os(), &mut out, &mut err);
    let _ = out.flush();
    ExitCode::from(code)
}
