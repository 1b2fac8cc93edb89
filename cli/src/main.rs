//! rocectl: the ferroce command-line tool.

use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Manage and inspect ferroce, the software RoCEv2 NIC.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Print one line per RoCEv2 packet of a pcap or pcapng capture, as tshark shows the
    /// protocol (opcode, QP, PSN, extension headers, ECN), with the ICRC checked, then a summary.
    ///
    /// Exit status: 0; 1 with --verify-icrc when any ICRC is bad; 2 when the file cannot be read.
    Decode {
        /// The capture (pcap or pcapng, Ethernet).
        file: PathBuf,
        /// Exit non-zero if any RoCEv2 packet has a bad ICRC.
        #[arg(long)]
        verify_icrc: bool,
        /// JSON lines (one object per packet, then one with the summary) instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Decode {
            file,
            verify_icrc,
            json,
        } => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let s = match cli::decode::decode(&file, json, &mut out) {
                Ok(s) => s,
                Err(e) => {
                    let _ = out.flush();
                    eprintln!("rocectl decode: {e}");
                    return ExitCode::from(2);
                }
            };
            let _ = if json {
                writeln!(out, "{}", cli::decode::summary_json(&s))
            } else {
                write!(out, "{}", cli::decode::summary_text(&s))
            };
            let _ = out.flush();
            if verify_icrc && s.bad_icrc > 0 {
                eprintln!(
                    "rocectl decode: {} RoCEv2 packet(s) with a bad ICRC",
                    s.bad_icrc
                );
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
    }
}
