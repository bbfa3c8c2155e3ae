//! Command-line handling shared by the tools (clap): every mistake is one line on stderr,
//! `PROGRAM: what was wrong`, and exit status 2.

use clap::error::ErrorKind;

/// Parses the process's arguments as `T`; prints help or version and exits 0 when asked,
/// or prints one line and exits 2 on a mistake.
pub fn parse_or_exit<T: clap::Parser>(program: &str) -> T {
    T::try_parse().unwrap_or_else(|e| {
        if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
            e.exit()
        }
        eprintln!("{program}: {}", one_line(&e));
        std::process::exit(2)
    })
}

/// A clap error as one line: its first paragraph (the message and, for missing arguments,
/// their names), without `error: `.
pub fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let para: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let line = para.join(" ");
    line.strip_prefix("error: ").unwrap_or(&line).to_string()
}
