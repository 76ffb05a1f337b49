use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = tessera::cli::Cli::parse();
    match tessera::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
