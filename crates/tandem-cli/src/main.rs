//! `tandem`: train text classifiers under different parallel-training strategies.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, CommandFactory, Parser, Subcommand};
use tandem_experiment::backend::is_compiled;
use tandem_experiment::{run, BackendKind, Launch, Manifest, Override, Ranks, Restart, RunOptions};

mod inference;
mod launch;

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "Train text classifiers under parallel-training strategies and compare them",
    after_help = "Start here:\n  tandem data fetch\n  tandem run experiments/quickstart.toml\n  tandem report results/quickstart --out report/quickstart"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every model × strategy × seed of an experiment manifest.
    #[command(
        after_help = "Examples:\n  tandem run experiments/quickstart.toml\n  tandem run experiments/quickstart.toml --set train.epochs=1 --set models.cnn.train.learning_rate=0.002\n  tandem run experiments/quickstart.toml --backend wgpu --out /tmp/results"
    )]
    Run {
        /// The experiment manifest (TOML), e.g. experiments/quickstart.toml.
        manifest: PathBuf,
        /// Backend to run on (overrides the manifest): flex, ndarray, wgpu, cuda. E.g. `--backend ndarray`.
        #[arg(long)]
        backend: Option<BackendKind>,
        /// Devices to run on (overrides the manifest), e.g. `cuda:0,cuda:1`. Without it,
        /// `--backend` replaces manifest devices of another backend by its first device.
        #[arg(long, value_delimiter = ',')]
        devices: Option<Vec<String>>,
        /// Results root; runs go to <out>/<experiment>/<run-id>/. E.g. `--out /tmp/results`.
        #[arg(long, default_value = "results")]
        out: PathBuf,
        /// Never download the dataset; fail if it is missing.
        #[arg(long)]
        offline: bool,
        #[command(flatten)]
        sets: Sets,
        /// Start every run over, replacing its folder (by default finished runs are skipped
        /// and interrupted ones resumed).
        #[arg(long, conflicts_with = "restart_changed")]
        fresh: bool,
        /// Start over only the runs whose manifest changed since they ran (a `--set`, an edit),
        /// replacing their folders; the others are skipped or resumed as usual.
        #[arg(long)]
        restart_changed: bool,
    },
    /// Write a Markdown + HTML report with SVG plots from results folders
    /// (results roots, experiment folders or single runs).
    #[command(
        after_help = "Example:\n  tandem report results/quickstart --out report/quickstart   # then open report/quickstart/report.html"
    )]
    Report {
        /// Results roots, experiment folders or run folders, e.g. results/quickstart.
        #[arg(required = true)]
        results: Vec<PathBuf>,
        /// Folder for report.md, report.html and the plots.
        #[arg(long, default_value = "report")]
        out: PathBuf,
    },
    /// Check a manifest without running it.
    #[command(
        after_help = "Examples:\n  tandem validate experiments/quickstart.toml\n  tandem validate experiments/quickstart.toml --set data.max_len=32"
    )]
    Validate {
        /// The experiment manifest (TOML), e.g. experiments/quickstart.toml.
        manifest: PathBuf,
        #[command(flatten)]
        sets: Sets,
    },
    /// Classify texts with a trained run: the class name and every class's probability.
    #[command(
        override_usage = "tandem predict <RUN> <TEXTS>...\n       tandem predict <RUN> --file <FILE>",
        after_help = "Examples:\n  tandem predict results/quickstart/cnn-sequential-seed42 \"Stocks fell as oil prices rose\"\n  tandem predict results/quickstart/cnn-sequential-seed42 --file news.txt --json\n  tandem predict results/quickstart/cnn-sequential-seed42 --file datasets/ag_news/test.csv --backend ndarray"
    )]
    Predict {
        /// A run folder written by `tandem run` (<out>/<experiment>/<run-id>), holding
        /// manifest.toml, vocab.json and model.bin.
        run: PathBuf,
        /// Texts to classify, each one argument (quote it). E.g. "Stocks fell as oil prices rose".
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        texts: Vec<String>,
        #[command(flatten)]
        inference: InferenceOptions,
        /// Texts from a file: an AG News CSV (class,title,description) or one text per line. E.g. `--file news.txt`.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Evaluate a trained run on labelled data: accuracy, per-class and macro P/R/F1, confusion matrix.
    #[command(
        after_help = "Examples:\n  tandem evaluate results/quickstart/cnn-sequential-seed42 --data datasets/ag_news\n  tandem evaluate results/quickstart/cnn-sequential-seed42 --data my-news.csv --json"
    )]
    Evaluate {
        /// A run folder written by `tandem run` (<out>/<experiment>/<run-id>).
        run: PathBuf,
        /// An AG News data folder (its test.csv is used) or an AG News-format CSV file. E.g. `--data datasets/ag_news`.
        #[arg(long)]
        data: PathBuf,
        #[command(flatten)]
        inference: InferenceOptions,
    },
    /// List the backends compiled into this build and the architectures.
    #[command(after_help = "Example:\n  tandem list")]
    List,
    /// Get or check the AG News dataset.
    #[command(after_help = "Examples:\n  tandem data fetch\n  tandem data check datasets/ag_news")]
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
    /// Describe the manifest format: every key, or its JSON Schema.
    #[command(
        after_help = "Examples:\n  tandem manifest reference > manifest-reference.md\n  tandem manifest schema > tandem-manifest.schema.json"
    )]
    Manifest {
        #[command(subcommand)]
        command: ManifestCommand,
    },
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  tandem completions bash > ~/.local/share/bash-completion/completions/tandem\n  tandem completions zsh > ~/.zfunc/_tandem\n  tandem completions fish > ~/.config/fish/completions/tandem.fish"
    )]
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum ManifestCommand {
    /// Print the key reference in Markdown: every key's type, default, allowed values, meaning.
    #[command(after_help = "Example:\n  tandem manifest reference > manifest-reference.md")]
    Reference,
    /// Print the manifest's JSON Schema, for editors' TOML completion and checks (e.g. Taplo /
    /// Even Better TOML, pointed at it for experiments/*.toml).
    #[command(after_help = "Example:\n  tandem manifest schema > tandem-manifest.schema.json")]
    Schema,
}

/// `--set key.path=value`, shared by `run` and `validate`.
#[derive(Args)]
struct Sets {
    /// Change a manifest setting without editing the file (repeatable; `run` records it in each
    /// run's manifest.toml). Keys go through tables with dots; entries of [[models]] / [[strategies]]
    /// by name or 0-based index. Values are TOML, else a string.
    /// E.g. `--set train.epochs=1 --set models.cnn.train.learning_rate=0.002 --set models.0.hidden=32`.
    #[arg(long = "set", value_name = "KEY.PATH=VALUE")]
    overrides: Vec<Override>,
}

/// Options shared by `predict` and `evaluate`.
#[derive(Args)]
struct InferenceOptions {
    /// Backend to compute on: flex, ndarray, wgpu, cuda (default: the run's if compiled, else flex). E.g. `--backend ndarray`.
    #[arg(long)]
    backend: Option<BackendKind>,
    /// Texts per batch. E.g. `--batch-size 512`.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum DataCommand {
    /// Download and unpack the canonical AG News archive, verifying each file's md5.
    #[command(
        after_help = "Examples:\n  tandem data fetch\n  TANDEM_DATA_DIR=/data/ag_news tandem data fetch\n  tandem data fetch --dir /data/ag_news\n  tandem data fetch --url ~/Downloads/ag_news_csv.tgz"
    )]
    Fetch {
        /// Target directory (default: $TANDEM_DATA_DIR, else datasets/ag_news). E.g. `--dir /data/ag_news`.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Where the archive is: an http(s) URL, or a copy on disk (a path or a file:// URL), checked the same way.
        #[arg(long, default_value = tandem_data::DEFAULT_ARCHIVE_URL)]
        url: String,
    },
    /// Validate a data directory: rows, classes, md5.
    #[command(after_help = "Examples:\n  tandem data check\n  tandem data check datasets/ag_news")]
    Check {
        /// The directory to check (default: $TANDEM_DATA_DIR, else datasets/ag_news). E.g. `datasets/ag_news`.
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The directory to check, as an option (same as DIR).
        #[arg(long = "dir", value_name = "DIR", conflicts_with = "dir")]
        dir_option: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    tandem_train::keep_freed_memory();
    // GPU runs record the kernels a training step launches (a no-op in a CPU-only build).
    tandem_experiment::backend::launches::install();
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
        Command::Run { manifest, backend, devices, out, offline, sets, fresh, restart_changed } => {
            let manifest = Manifest::load_with(&manifest, &sets.overrides).map_err(|e| e.to_string())?;
            manifest.shadowed_overrides().iter().for_each(|note| eprintln!("{note}"));
            let local_ranks = manifest.cluster.ranks.filter(|&n| n > 1 && manifest.cluster.launch == Launch::Local);
            if let Some(ranks) = local_ranks.filter(|_| !tandem_experiment::launched_by_mpi()) {
                let status = launch::local_job(ranks)?;
                return match status.success() {
                    true => Ok(()),
                    // The ranks said why.
                    false => std::process::exit(exit_code(status)),
                };
            }
            let progress = std::io::stderr().is_terminal();
            let ranks = join_mpi_job()?;
            let on_stuck_worker: Option<fn()> = Some(|| std::process::exit(1));
            let restart = match (fresh, restart_changed) {
                (true, _) => Restart::All,
                (false, true) => Restart::Changed,
                (false, false) => Restart::None,
            };
            let options = RunOptions { backend, devices, out, progress, ranks, restart, on_stuck_worker };
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
                (Ok(_), _) => Ok(()),
                // A failure on this rank alone would leave the others waiting: end the job.
                (Err(e), Some(ranks)) if !e.is_on_every_rank() => ranks.abort(&e.to_string()),
                // Every rank failed alike: each reports it, then waits for the others, since the
                // first rank to exit with an error makes mpirun kill the rest.
                (Err(e), Some(ranks)) => {
                    // One write, so that the ranks' lines do not interleave; an interruption
                    // (every rank stopped at the same point) is told once.
                    let status = e.exit_status();
                    let line = match status {
                        Some(_) => (ranks.rank() == 0).then(|| format!("{e}\n")),
                        None => Some(format!("error: rank {}: {e}\n", ranks.rank())),
                    };
                    if let Some(line) = line {
                        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                    }
                    let _ = ranks.check_same("end of the job", 0);
                    match status {
                        Some(status) => std::process::exit(i32::from(status)),
                        None => Err(String::new()),
                    }
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
        Command::Validate { manifest: path, sets } => {
            let manifest = Manifest::load_with(&path, &sets.overrides).map_err(|e| e.to_string())?;
            manifest.shadowed_overrides().iter().for_each(|note| eprintln!("{note}"));
            manifest.check_paths().map_err(|e| e.to_string())?;
            let (models, strategies, seeds) =
                (manifest.models.len(), manifest.strategies.len(), manifest.experiment.seeds.len());
            let count = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
            println!(
                "{}: valid — experiment `{}`, {} × {} ({}) × {} = {}, backend {}",
                path.display(),
                manifest.experiment.name,
                count(models, "model", "models"),
                count(strategies, "strategy", "strategies"),
                manifest.strategies.iter().map(|s| s.label()).collect::<Vec<_>>().join(", "),
                count(seeds, "seed", "seeds"),
                count(models * strategies * seeds, "run", "runs"),
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
            for (kind, meaning) in tandem_experiment::manifest::reference::strategy_kinds() {
                println!("  {kind:<16}{meaning}");
            }
            println!("pipeline schedules: {}", tandem_experiment::manifest::reference::schedules().join(", "));
            Ok(())
        }
        Command::Manifest { command: ManifestCommand::Reference } => {
            print!("{}", tandem_experiment::manifest::reference::markdown());
            Ok(())
        }
        Command::Manifest { command: ManifestCommand::Schema } => {
            let schema = tandem_experiment::manifest::reference::json_schema();
            println!("{}", serde_json::to_string_pretty(&schema).map_err(|e| e.to_string())?);
            Ok(())
        }
        Command::Data { command: DataCommand::Fetch { dir, url } } => fetch(dir, &url),
        Command::Predict { run, texts, inference, file } => {
            inference::predict(&run, texts, file.as_deref(), &inference)
        }
        Command::Evaluate { run, data, inference } => inference::evaluate(&run, &data, &inference),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "tandem", &mut std::io::stdout());
            Ok(())
        }
        Command::Data { command: DataCommand::Check { dir, dir_option } } => {
            let dir = tandem_data::resolve_data_dir(dir.or(dir_option).as_deref());
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

/// A child's exit status as this process's: its code, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or(status.signal().map(|s| 128 + s)).unwrap_or(1)
}

/// This process's rank when an MPI launcher started it (builds with the `mpi` feature).
#[cfg(feature = "mpi")]
fn join_mpi_job() -> Result<Option<Arc<dyn Ranks>>, String> {
    Ok(tandem_experiment::MpiRanks::join().map_err(|e| e.to_string())?.map(|r| Arc::new(r) as Arc<dyn Ranks>))
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
    let report = tandem_data::fetch(&dir, url, std::io::stderr().is_terminal()).map_err(|e| {
        format!(
            "{e}\nwithout a download: put the AG News CSVs you have (test.csv, optionally train.csv) in a folder \
             and point TANDEM_DATA_DIR, or the manifest's `data.dir`, at it"
        )
    })?;
    println!("{report}");
    Ok(())
}
