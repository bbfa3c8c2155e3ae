//! `rdmx-bench`: the socket-pingpong baseline and the benchmark report generator.
//! See `rdmx-bench --help` and the `rdmx_bench` library docs.

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let result = match args {
        Ok(args) => rdmx_bench::cli::run(&args),
        Err(bad) => Err(rdmx_bench::Error::Usage(format!(
            "argument {bad:?} is not valid UTF-8"
        ))),
    };
    if let Err(e) = result {
        eprintln!("rdmx-bench: {e}");
        std::process::exit(e.exit_code());
    }
}
