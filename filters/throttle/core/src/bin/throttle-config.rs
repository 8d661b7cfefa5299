//! `throttle-config`: the filter's own configuration parser on the command line.
//!
//!   throttle-config check \[FILE\]   validate a plugin configuration (JSON; stdin if no FILE)
//!   throttle-config schema         print the JSON Schema (filters/throttle/config.schema.json)
//!   throttle-config reference      print the README's configuration reference table
//!   throttle-config stats          print the README's statistics table

use std::io::Read;
use std::process::ExitCode;

use throttle_core::config::{self, spec};
use throttle_core::stats;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("check") => check(args.get(1).map(String::as_str)),
        Some("schema") => match serde_json::to_string_pretty(&spec::json_schema()) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("throttle-config: {e}");
                ExitCode::FAILURE
            }
        },
        Some("reference") => {
            print!("{}", spec::reference_table());
            ExitCode::SUCCESS
        }
        Some("stats") => {
            print!("{}", stats::reference_table());
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: throttle-config check [FILE] | schema | reference | stats");
            ExitCode::from(2)
        }
    }
}

fn check(path: Option<&str>) -> ExitCode {
    let mut bytes = Vec::new();
    let read = match path {
        None | Some("-") => std::io::stdin().read_to_end(&mut bytes).map(|_| ()),
        Some(p) => std::fs::read(p).map(|b| bytes = b),
    };
    if let Err(e) = read {
        eprintln!(
            "throttle-config: cannot read {}: {e}",
            path.unwrap_or("stdin")
        );
        return ExitCode::from(2);
    }
    match config::parse(&bytes) {
        Ok(c) => {
            println!("ok: {} rule(s)", c.rules.len());
            for line in c.describe() {
                println!("  {line}");
            }
            for warning in c.warnings() {
                println!("warning: {warning}");
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in errors {
                println!("{e}");
            }
            ExitCode::FAILURE
        }
    }
}
