//! `tandem`: train text classifiers under different parallel-training strategies.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use tandem_experiment::backend::is_compiled;
use tandem_experiment::{run, BackendKind, Manifest, Ranks, RunOptions};

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "Train text classifiers under parallel-training strategies and compare them"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every model × seed of an experiment manifest.
    Run {
        manifest: PathBuf,
        /// Backend to run on (overrides the manifest): flex, ndarray, wgpu, cuda.
        #[arg(long)]
        backend: Option<BackendKind>,
        /// Devices to run on (overrides the manifest), e.g. `cuda:0,cuda:1`. Without it,
        /// `--backend` replaces manifest devices of another backend by its first device.
        #[arg(long, value_delimiter = ',')]
        devices: Option<Vec<String>>,
        /// Results root; runs go to <out>/<experiment>/<run-id>/.
        #[arg(long, default_value = "results")]
        out: PathBuf,
        /// Never download the dataset; fail if it is missing.
        #[arg(long)]
        offline: bool,
        /// Start every run over, replacing its folder (by default finished runs are skipped
        /// and interrupted ones resumed).
        #[arg(long)]
        fresh: bool,
    },
    /// Write a Markdown + HTML report with SVG plots from results folders
    /// (results roots, experiment folders or single runs).
    Report {
        #[arg(required = true)]
        results: Vec<PathBuf>,
        /// Folder for report.md, report.html and the plots.
        #[arg(long, default_value = "report")]
        out: PathBuf,
    },
    /// Check a manifest without running it.
    Validate { manifest: PathBuf },
    /// List the backends compiled into this build and the architectures.
    List,
    /// Get or check the AG News dataset.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
}

#[derive(Subcommand)]
enum DataCommand {
    /// Download and unpack the canonical AG News archive, verifying each file's md5.
    Fetch {
        /// Target directory (default: $TANDEM_DATA_DIR, else datasets/ag_news).
        #[arg(long)]
        dir: Option<PathBuf>,
        #[arg(long, default_value = tandem_data::DEFAULT_ARCHIVE_URL)]
        url: String,
    },
    /// Validate a data directory: rows, classes, md5.
    Check {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    tandem_train::keep_freed_memory();
    match dispatch(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        // Already reported (by every rank of a job that failed everywhere).
        Err(message) if message.is_empty() => ExitCode::FAILURE,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> Result<(), String> {
    match command {
        Command::Run { manifest, backend, devices, out, offline, fresh } => {
            let manifest = Manifest::load(&manifest).map_err(|e| e.to_string())?;
            let progress = std::io::stderr().is_terminal();
            let options = RunOptions { backend, devices, out, progress, ranks: join_mpi_job()?, fresh };
            // In a multi-process job every rank must call the same collectives: no second attempt.
            let offline = offline || options.job().is_some();
            let outcome = match run(&manifest, &options) {
                Err(e) if e.is_missing_data() && !offline => {
                    let dir = manifest.data_dir();
                    eprintln!("{e}\nfetching it now (pass --offline to stop instead)…");
                    fetch(Some(dir), tandem_data::DEFAULT_ARCHIVE_URL)?;
                    run(&manifest, &options)
                }
                other => other,
            };
            match (outcome, options.job()) {
                (Ok(summaries), job) if job.is_none_or(|r| r.rank() == 0) => {
                    eprintln!(
                        "{} runs finished; results in {}",
                        summaries.len(),
                        options.out.join(&manifest.experiment.name).display()
                    );
                    Ok(())
                }
                (Ok(_), _) => Ok(()),
                // A failure on this rank alone would leave the others waiting: end the job.
                (Err(e), Some(ranks)) if !e.is_on_every_rank() => ranks.abort(&e.to_string()),
                // Every rank failed alike: each reports it, then waits for the others, since the
                // first rank to exit with an error makes mpirun kill the rest.
                (Err(e), Some(ranks)) => {
                    // One write, so that the ranks' lines do not interleave.
                    let line = format!("error: rank {}: {e}\n", ranks.rank());
                    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                    let _ = ranks.check_same("end of the job", 0);
                    Err(String::new())
                }
                (Err(e), None) => match e.exit_status() {
                    Some(status) => {
                        eprintln!("{e}");
                        std::process::exit(i32::from(status))
                    }
                    None => Err(e.to_string()),
                },
            }
        }
        Command::Report { results, out } => {
            let files = tandem_report::write_report(&results, &out).map_err(|e| e.to_string())?;
            println!(
                "{} finished runs reported ({} did not finish) → {} ({} plots), {}",
                files.finished,
                files.not_finished,
                files.markdown.display(),
                files.plots.len(),
                files.html.display()
            );
            Ok(())
        }
        Command::Validate { manifest: path } => {
            let manifest = Manifest::load(&path).map_err(|e| e.to_string())?;
            let runs = manifest.models.len() * manifest.strategies.len() * manifest.experiment.seeds.len();
            println!(
                "{}: valid — experiment `{}`, {} models × {} strategies ({}) × {} seeds = {runs} runs, backend {}",
                path.display(),
                manifest.experiment.name,
                manifest.models.len(),
                manifest.strategies.len(),
                manifest.strategies.iter().map(|s| s.label()).collect::<Vec<_>>().join(", "),
                manifest.experiment.seeds.len(),
                manifest.experiment.backend
            );
            if !is_compiled(manifest.experiment.backend) {
                println!("note: backend `{}` is not compiled into this build", manifest.experiment.backend);
            }
            Ok(())
        }
        Command::List => {
            println!("backends in this build:");
            for b in BackendKind::ALL {
                println!("  {:<8} {}", b.name(), if is_compiled(b) { "yes" } else { "no (cargo feature not enabled)" });
            }
            println!(
                "multi-process jobs (mpirun): {}",
                if cfg!(feature = "mpi") { "yes" } else { "no (cargo feature `mpi` not enabled)" }
            );
            println!("architectures:");
            for a in tandem_models::Architecture::ALL {
                println!("  {}", a.name());
            }
            println!("strategies:");
            println!("  sequential      one model on one device");
            println!("  data-parallel   replicas on several devices, gradients averaged by all-reduce");
            println!("  model-parallel  stages on several devices; schedules naive, gpipe, 1f1b");
            println!("  predictive-sync model parallel that skips most exchanges, predicting each stage's parameters");
            Ok(())
        }
        Command::Data { command: DataCommand::Fetch { dir, url } } => fetch(dir, &url),
        Command::Data { command: DataCommand::Check { dir } } => {
            let dir = tandem_data::resolve_data_dir(dir.as_deref());
            let report = tandem_data::check_dir(&dir).map_err(|e| e.to_string())?;
            println!("{report}");
            if report.all_ok() {
                Ok(())
            } else {
                Err(format!("{} does not hold the expected AG News files", dir.display()))
            }
        }
    }
}

/// This process's rank when an MPI launcher started it (builds with the `mpi` feature).
#[cfg(feature = "mpi")]
fn join_mpi_job() -> Result<Option<Arc<dyn Ranks>>, String> {
    Ok(tandem_experiment::MpiRanks::join()?.map(|r| Arc::new(r) as Arc<dyn Ranks>))
}

#[cfg(not(feature = "mpi"))]
fn join_mpi_job() -> Result<Option<Arc<dyn Ranks>>, String> {
    match tandem_experiment::launched_job_size() {
        // Every rank would run the whole experiment on its own.
        Some(size) if size > 1 => Err(format!("this build has no MPI support, but an MPI launcher started it as one of {size} processes: rebuild with `--features mpi`")),
        _ => Ok(None),
    }
}

fn fetch(dir: Option<PathBuf>, url: &str) -> Result<(), String> {
    let dir = tandem_data::resolve_data_dir(dir.as_deref());
    let report = tandem_data::fetch(&dir, url, std::io::stderr().is_terminal()).map_err(|e| e.to_string())?;
    println!("{report}");
    Ok(())
}
