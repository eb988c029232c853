//! Multi-process jobs: `mpirun -np 2 tandem run …` on this machine (feature `mpi`).
//!
//! Skipped with a message when `mpirun` or the data is missing, unless `TANDEM_REQUIRE_MPI=1`
//! (CI), which makes a missing `mpirun` a failure.
//!
//! Built only with the `mpi` feature; without it, one ignored test says how to run them.

#[cfg(not(feature = "mpi"))]
#[test]
#[ignore = "needs the `mpi` feature and mpirun: cargo test -p tandem-cli --features mpi --test mpi"]
fn multi_process_jobs_need_the_mpi_feature() {}

#[cfg(feature = "mpi")]
mod common;

#[cfg(feature = "mpi")]
mod tests {
    use super::common;

    use std::io::{BufRead, BufReader};
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use burn::backend::NdArray;
    use common::data_dir;
    use tandem_experiment::{Manifest, RunSummary};
    use tandem_models::{Classifier, InputSpec};

    /// `mpirun` with the settings a test on one machine needs: root allowed (CI runs as root), no
    /// core binding and no network transports (shared memory only).
    fn mpirun() -> Option<Command> {
        let found = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
        if !found {
            assert!(
                std::env::var_os("TANDEM_REQUIRE_MPI").is_none(),
                "TANDEM_REQUIRE_MPI is set but `mpirun` does not run"
            );
            eprintln!("mpirun not found: skipping the multi-process test");
            return None;
        }
        let mut command = Command::new("mpirun");
        command
            .args(["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader"])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        Some(command)
    }

    /// A tiny manifest of a 2-layer GRU (4 blocks) trained `epochs` epochs with `strategies` (TOML)
    /// on ndarray.
    fn manifest(dir: &Path, name: &str, data: &Path, strategies: &str, epochs: usize, extra: &str) -> PathBuf {
        manifest_on("ndarray", dir, name, data, strategies, epochs, extra)
    }

    /// [`manifest`] on `backend`.
    fn manifest_on(
        backend: &str,
        dir: &Path,
        name: &str,
        data: &Path,
        strategies: &str,
        epochs: usize,
        extra: &str,
    ) -> PathBuf {
        let path = dir.join(format!("{name}.toml"));
        let text = format!(
            "[experiment]\nname = \"{name}\"\nseeds = [3]\nbackend = \"{backend}\"\n\n[data]\ndir = \"{}\"\nmax_len = 12\nmax_train_rows = 192\nmax_holdout_rows = 64\nvocab = {{ max_size = 300, min_freq = 1 }}\n\n[train]\nepochs = {epochs}\nbatch_size = 30\n\n{strategies}\n{extra}\n[[models]]\nname = \"gru\"\narchitecture = \"gru\"\nembedding_dim = 8\nhidden = 8\nlayers = 2\ndropout = 0.0\n",
            data.display()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `[strategy]` for `replicas` data-parallel replicas (per rank); `extra` goes into the section.
    fn data_parallel(replicas: usize, extra: &str) -> String {
        format!("[strategy]\nkind = \"data-parallel\"\nreplicas = {replicas}\n{extra}")
    }

    /// The run folder under `out/<experiment>/` whose name starts with `run`.
    fn run_dir(out: &Path, experiment: &str, run: &str) -> PathBuf {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(out.join(experiment))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(run))
            .collect();
        assert_eq!(dirs.len(), 1, "{dirs:?}");
        dirs.remove(0)
    }

    /// The trained parameters a run saved.
    fn saved_parameters(run: &Path) -> Vec<f32> {
        let summary: RunSummary =
            serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
        let manifest = Manifest::load(&run.join("manifest.toml")).unwrap();
        let input = InputSpec { vocab_size: summary.vocab_size, max_len: summary.max_len, num_classes: 4 };
        let device = Default::default();
        let model: Classifier<NdArray> = manifest.models[0].config.init(&input, &device);
        let (bytes, _) = tandem_results::read_sealed(&run.join("model.bin")).unwrap();
        let model = tandem_train::checkpoint::load_model_bytes(model, &bytes, &device).unwrap();
        model.parameter_values()
    }

    fn output(command: &mut Command) -> (bool, String) {
        let out = command.output().expect("run mpirun");
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    }

    #[test]
    fn two_ranks_of_one_replica_equal_one_process_of_two() {
        across_ranks_equals_one_process(1, "");
    }

    #[test]
    fn two_ranks_of_two_replicas_equal_one_process_of_four() {
        across_ranks_equals_one_process(2, "");
    }

    /// With a batch per replica, each of the four replicas of the job takes 30 rows: a global
    /// batch of 120, as in one process of four.
    #[test]
    fn a_batch_per_replica_spans_every_replica_of_the_job() {
        if let Some(job) = across_ranks_equals_one_process(2, PER_REPLICA) {
            assert_eq!(job.global_batch, Some(120));
        }
    }

    /// On Flex, where a replica writes the reduced embedding rows over its own gradient's buffer
    /// (ndarray copies instead), 2 ranks × 2 replicas train as sequential training on the global
    /// batch: 30 rows split four ways, or four replicas' 30 rows together (120, at √4 × the
    /// learning rate).
    #[test]
    fn on_flex_ranks_train_as_sequential_training_under_both_batch_semantics() {
        let (Some(_), Some(data)) = (mpirun(), data_dir()) else { return };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("results");
        let lr = tandem_train::TrainConfig::default().learning_rate;
        // The semantics, their `[strategy]` settings, and the sequential run's batch and rate.
        for (name, extra, batch, lr) in [("global", "", 30, lr), ("per_replica", PER_REPLICA, 120, 4f64.sqrt() * lr)] {
            let (job, alone) = (format!("{name}_job"), format!("{name}_sequential"));
            let ranks = "\n[cluster]\nranks = 2\n";
            run_on_two_ranks(&out, &manifest_on("flex", dir.path(), &job, &data, &data_parallel(2, extra), 2, ranks));
            let sequential = "[strategy]\nkind = \"sequential\"\n";
            let (batch_key, lr_key) = (format!("train.batch_size={batch}"), format!("train.learning_rate={lr}"));
            run_in_one_process(
                &out,
                &manifest_on("flex", dir.path(), &alone, &data, sequential, 2, ""),
                &["--set", &batch_key, "--set", &lr_key],
            );
            let (job, alone) = (run_dir(&out, &job, "gru"), run_dir(&out, &alone, "gru"));
            assert_eq!(summary(&job).global_batch, Some(batch), "{name}");
            let difference = parameter_difference(&job, &alone);
            eprintln!("flex, {name}: 2 ranks × 2 vs sequential: relative parameter difference {difference:e}");
            assert!(difference <= 1e-5, "{name}: relative parameter difference {difference}");
        }
    }

    /// `[strategy]` settings of a batch per replica, its learning rate by the square-root rule.
    const PER_REPLICA: &str = "batch = \"per-replica\"\nlr_scaling = \"sqrt\"\n";

    /// `[cluster] launch = "local"`: `tandem run` starts its two ranks itself, and they train as
    /// under `mpirun -np 2`: the parameters of one process of two replicas.
    #[test]
    fn a_manifest_starts_its_own_ranks() {
        let (Some(_), Some(data)) = (mpirun(), data_dir()) else { return };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("results");
        let cluster = "\n[cluster]\nranks = 2\nlaunch = \"local\"\n";
        let local = manifest(dir.path(), "local", &data, &data_parallel(1, ""), 2, cluster);
        let mut tandem = Command::new(env!("CARGO_BIN_EXE_tandem"));
        // The launcher as the other tests start it: shared memory only.
        tandem.env("TANDEM_MPIRUN", "mpirun --bind-to none --mca btl self,vader");
        let (ok, log) = output(tandem.args(["run", "--offline", "--out"]).arg(&out).arg(&local));
        assert!(ok, "{log}");
        run_in_one_process(&out, &manifest(dir.path(), "single", &data, &data_parallel(2, ""), 2, ""), &[]);
        let (local, single) = (run_dir(&out, "local", "gru"), run_dir(&out, "single", "gru"));
        let difference = parameter_difference(&local, &single);
        assert!(difference <= 1e-5, "relative parameter difference {difference}");
        assert_eq!(summary(&local).cluster.expect("a cluster block").ranks, 2);
        assert_rank_1_finished(&local, 2);

        // A launcher that does not start: named in the error, nothing run.
        let mut tandem = Command::new(env!("CARGO_BIN_EXE_tandem"));
        tandem.env("TANDEM_MPIRUN", "no-such-mpirun -v");
        let (ok, log) = output(tandem.args(["run", "--offline", "--out"]).arg(&out).arg(dir.path().join("local.toml")));
        assert!(!ok && log.contains("no-such-mpirun") && log.contains("TANDEM_MPIRUN"), "{log}");
    }

    /// Relative distance between two runs' saved parameters.
    fn parameter_difference(a: &Path, b: &Path) -> f32 {
        let (a, b) = (saved_parameters(a), saved_parameters(b));
        let norm = b.iter().map(|v| v * v).sum::<f32>().sqrt();
        a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>().sqrt() / norm
    }

    fn summary(run: &Path) -> RunSummary {
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
    }

    /// Runs `manifest` with `mpirun -np 2`, results under `out`.
    fn run_on_two_ranks(out: &Path, manifest: &Path) {
        let Some(mut mpirun) = mpirun() else { unreachable!("checked by the caller") };
        let (ok, log) = output(
            mpirun.args(["-np", "2", env!("CARGO_BIN_EXE_tandem"), "run", "--offline", "--out"]).arg(out).arg(manifest),
        );
        assert!(ok, "{log}");
    }

    /// Runs `manifest` in one process with `overrides` (`--set key=value` pairs), results under `out`.
    fn run_in_one_process(out: &Path, manifest: &Path, overrides: &[&str]) {
        let run = ["run", "--offline", "--out", out.to_str().unwrap(), manifest.to_str().unwrap()];
        let (ok, _, stderr) = common::tandem(&[&run[..], overrides].concat());
        assert!(ok, "{stderr}");
    }

    /// 2 ranks × `replicas` against 1 process × 2·`replicas` (`extra`: more data-parallel
    /// settings): the same shards of every batch, so the same parameters after training. Returns
    /// the job's summary (`None`: skipped, without MPI or data).
    fn across_ranks_equals_one_process(replicas: usize, extra: &str) -> Option<RunSummary> {
        let (Some(_), Some(data)) = (mpirun(), data_dir()) else { return None };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("results");
        let (across, single) = (data_parallel(replicas, extra), data_parallel(2 * replicas, extra));
        run_on_two_ranks(&out, &manifest(dir.path(), "across", &data, &across, 2, "\n[cluster]\nranks = 2\n"));
        run_in_one_process(&out, &manifest(dir.path(), "single", &data, &single, 2, ""), &[]);
        let (across, single) = (run_dir(&out, "across", "gru"), run_dir(&out, "single", "gru"));
        let difference = parameter_difference(&across, &single);
        eprintln!("2 ranks × {replicas} vs 1 process × {}: relative parameter difference {difference:e}", 2 * replicas);
        assert!(difference <= 1e-5, "relative parameter difference {difference}");

        // Rank 0 wrote the results, with a cluster block; rank 1 only its log.
        let (summary, single_summary) = (summary(&across), summary(&single));
        let cluster = summary.cluster.clone().expect("a cluster block");
        assert_eq!((cluster.ranks, cluster.replicas_per_rank), (2, Some(replicas)));
        assert!(
            cluster.cross_rank_bytes_per_replica_per_step.is_some_and(|b| b > 0.0) && cluster.cross_rank_seconds > 0.0,
            "{cluster:?}"
        );
        assert_eq!(summary.train_samples, single_summary.train_samples);
        assert_eq!(summary.global_batch, single_summary.global_batch);
        let loss = |s: &RunSummary| s.final_holdout_loss.unwrap();
        assert!(
            (loss(&summary) - loss(&single_summary)).abs() < 1e-4,
            "{} vs {}",
            loss(&summary),
            loss(&single_summary)
        );
        assert_rank_1_finished(&across, 2);
        Some(summary)
    }

    fn assert_rank_1_finished(run: &Path, epochs: usize) {
        let rank1: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("rank-1.json")).unwrap()).unwrap();
        assert_eq!(rank1["status"], "finished", "{rank1}");
        assert_eq!(rank1["epochs_completed"], epochs, "{rank1}");
    }

    /// The last record of a run's `epochs.jsonl`.
    fn last_epoch(run: &Path) -> tandem_train::EpochRecord {
        let text = std::fs::read_to_string(run.join("epochs.jsonl")).unwrap();
        serde_json::from_str(text.lines().last().unwrap()).unwrap()
    }

    /// Vanilla model parallelism (1F1B; cut by a time balance on rank 0, whose cut points hold for
    /// both ranks), predictive sync (velocity, adaptive trigger: the sync votes and the loss cross
    /// ranks), each with its 2 stages on 2 ranks, and a 4-stage GPipe run with 2 stages per rank,
    /// against the same strategies and cuts in one process.
    #[test]
    fn stages_on_two_ranks_equal_stages_in_one_process() {
        let (Some(_), Some(data)) = (mpirun(), data_dir()) else { return };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("results");
        let pipeline = |cuts: &str| {
            format!(
                "[[strategies]]\nkind = \"model-parallel\"\nstages = 2\nschedule = \"1f1b\"\nmicro_batches = 3\n{cuts}\n"
            )
        };
        let sync = "[[strategies]]\nkind = \"predictive-sync\"\nmodel_parallel = { stages = 2, cuts = [1], schedule = \"gpipe\", micro_batches = 3 }\n\
            predictor = { kind = \"velocity\" }\ntrigger = { kind = \"adaptive\", max_horizon = 4 }\n";
        let four = "[[strategies]]\nkind = \"model-parallel\"\nstages = 4\nschedule = \"gpipe\"\nmicro_batches = 3\n";
        run_on_two_ranks(
            &out,
            &manifest(
                dir.path(),
                "across",
                &data,
                &(pipeline("balance = \"time\"") + sync + four),
                2,
                "\n[cluster]\nranks = 2\n",
            ),
        );
        let cuts = last_epoch(&run_dir(&out, "across", "gru-model-parallel-2s"))
            .figures
            .pipeline()
            .expect("pipeline")
            .cuts
            .clone();
        run_in_one_process(
            &out,
            &manifest(dir.path(), "single", &data, &(pipeline(&format!("cuts = {cuts:?}")) + sync + four), 2, ""),
            &[],
        );

        for (run, per_rank) in [("gru-model-parallel-2s", 1), ("gru-predictive-sync", 1), ("gru-model-parallel-4s", 2)]
        {
            let (across, single) = (run_dir(&out, "across", run), run_dir(&out, "single", run));
            let difference = parameter_difference(&across, &single);
            eprintln!("{run}: on 2 ranks vs in 1 process: relative parameter difference {difference:e}");
            assert_eq!(difference, 0.0, "{run}: the same computation, whatever process each stage runs in");
            let (across_summary, single_summary) = (summary(&across), summary(&single));
            assert_eq!(across_summary.final_holdout_loss, single_summary.final_holdout_loss, "{run}");
            let cluster = across_summary.cluster.clone().expect("a cluster block");
            assert_eq!((cluster.ranks, cluster.stages_per_rank, cluster.replicas_per_rank), (2, Some(per_rank), None));
            assert!(
                cluster.cross_rank_bytes_per_step.is_some_and(|b| b > 0.0) && cluster.cross_rank_seconds > 0.0,
                "{cluster:?}"
            );
            // Every stage's figures are gathered on rank 0: the links count what one process counts.
            let (a, b) = (last_epoch(&across).figures, last_epoch(&single).figures);
            let (a, b) = (a.pipeline().expect("pipeline figures"), b.pipeline().expect("pipeline figures"));
            assert_eq!(a.cuts, b.cuts, "{run}: `cuts`");
            assert_eq!(a.bytes_per_step, b.bytes_per_step, "{run}: `bytes_per_step`");
            assert_eq!(a.links_per_step, b.links_per_step, "{run}: `links_per_step`");
            assert_eq!(a.peak_live_activations, b.peak_live_activations, "{run}: `peak_live_activations`");
            assert_eq!(a.stage_parameters, b.stage_parameters, "{run}: `stage_parameters`");
            let (a, b) = (a.sync.as_ref().map(|s| s.sync_steps), b.sync.as_ref().map(|s| s.sync_steps));
            assert_eq!(a, b, "{run}: `sync_steps`");
            assert_rank_1_finished(&across, 2);
        }
    }

    #[test]
    fn stages_that_do_not_divide_among_the_ranks_are_refused_on_every_rank() {
        let (Some(mut mpirun), Some(data)) = (mpirun(), data_dir()) else { return };
        let dir = tempfile::tempdir().unwrap();
        let job = manifest(dir.path(), "uneven", &data, "[strategy]\nkind = \"model-parallel\"\nstages = 3\n", 1, "");
        let (ok, log) = output(
            mpirun
                .args(["-np", "2", env!("CARGO_BIN_EXE_tandem"), "run", "--offline", "--out"])
                .arg(dir.path().join("results"))
                .arg(&job),
        );
        assert!(!ok, "{log}");
        for rank in [0, 1] {
            assert!(
                log.contains(&format!("rank {rank}: "))
                    && log.contains("3 stages cannot be spread evenly over the job's 2 ranks"),
                "{log}"
            );
        }
    }

    #[test]
    fn ranks_with_different_manifests_stop_with_the_same_clear_error() {
        let (Some(mut mpirun), Some(data)) = (mpirun(), data_dir()) else { return };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("results");
        let a = manifest(dir.path(), "a", &data, &data_parallel(1, ""), 1, "");
        let b = manifest(dir.path(), "b", &data, &data_parallel(1, ""), 2, "");
        let tandem = env!("CARGO_BIN_EXE_tandem");
        let started = Instant::now();
        let (ok, log) = output(
            mpirun
                .args(["-np", "1", tandem, "run", "--offline", "--out"])
                .arg(&out)
                .arg(&a)
                .args([":", "-np", "1", tandem, "run", "--offline", "--out"])
                .arg(&out)
                .arg(&b),
        );
        assert!(!ok, "{log}");
        for rank in [0, 1] {
            assert!(
                log.contains(&format!("rank {rank}: "))
                    && log.contains("rank(s) [1] have a different manifest from rank 0's"),
                "{log}"
            );
        }
        assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
        assert!(!out.join("a").exists() && !out.join("b").exists(), "no results for a job that did not start");
    }

    /// What became of a disturbed job.
    struct Ended {
        success: bool,
        /// mpirun's output.
        log: String,
        /// From the disturbance to mpirun's exit.
        after: Duration,
        /// Holds the results.
        dir: tempfile::TempDir,
    }

    /// Starts a long 2-rank job of `strategy`, waits until rank 0 reports its first epoch, does
    /// `act` to rank 1's process, and waits (bounded) for the job to end.
    fn disturb_rank_1(act: &str, strategy: &str) -> Option<Ended> {
        let (Some(mut mpirun), Some(data)) = (mpirun(), data_dir()) else { return None };
        let dir = tempfile::tempdir().unwrap();
        let job = manifest(dir.path(), "long", &data, strategy, 50, "");
        let mut child = mpirun
            .args(["-np", "2", env!("CARGO_BIN_EXE_tandem"), "run", "--offline", "--out"])
            .arg(dir.path().join("results"))
            .arg(&job)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                BufReader::new(stream).lines().map_while(Result::ok).for_each(|line| drop(tx.send(line)))
            });
        }
        let mut log = String::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !log.contains("epoch  1:") {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("no first epoch:\n{log}"));
            log += &(line + "\n");
        }
        let rank1 = rank_pid(&job, 1).expect("rank 1's process");
        assert!(Command::new("kill").args([act, &rank1.to_string()]).status().unwrap().success());
        let acted = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if acted.elapsed() > Duration::from_secs(90) {
                let _ = child.kill();
                panic!("the job did not end within 90 s of `kill {act}` on rank 1:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let ended = acted.elapsed();
        eprintln!("`kill {act}` on rank 1: the job ended {ended:?} later");
        std::thread::sleep(Duration::from_millis(200));
        log.extend(rx.try_iter().map(|l| l + "\n"));
        eprintln!("{log}");
        Some(Ended { success: status.success(), log, after: ended, dir })
    }

    /// The process of MPI rank `rank` running the manifest `job`.
    fn rank_pid(job: &Path, rank: usize) -> Option<u32> {
        let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let runs_job = cmdline.split(|&b| b == 0).any(|arg| arg == job.as_os_str().as_encoded_bytes());
            (runs_job && environ.split(|&b| b == 0).any(|v| v == wanted.as_bytes())).then_some(pid)
        })
    }

    #[test]
    fn a_killed_rank_ends_the_job_with_an_error_naming_it() {
        let Some(ended) = disturb_rank_1("-KILL", &data_parallel(1, "")) else { return };
        assert!(!ended.success, "{}", ended.log);
        // mpirun's own report.
        assert!(ended.log.contains("process rank 1"), "{}", ended.log);
        assert!(ended.after < Duration::from_secs(30), "took {:?}", ended.after);
    }

    #[test]
    fn a_stuck_rank_ends_the_job_after_the_timeout_and_rank_0_keeps_its_results() {
        // Rank 1 stops (SIGSTOP) but does not die: only Tandem's own deadline notices.
        let Some(ended) = disturb_rank_1("-STOP", &data_parallel(1, "timeout_seconds = 5\n")) else { return };
        assert!(!ended.success, "{}", ended.log);
        assert!(
            ended.log.contains("error: rank 0 of 2: ")
                && ended.log.contains("no answer from the other ranks for 4.5 s"),
            "{}",
            ended.log
        );
        assert!(ended.after < Duration::from_secs(30), "took {:?}", ended.after);
        let run = run_dir(&ended.dir.path().join("results"), "long", "gru");
        let summary: RunSummary =
            serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
        // Rank 0 waited in a step's all-reduce, or (rank 1 stopped between two epochs) for the
        // ranks' word at the end of the epoch.
        assert!(
            summary.error.as_deref().is_some_and(|e| e.contains("while in a gradient all-reduce across ranks")
                || e.contains("while receiving rank 0's word at the end of an epoch")),
            "{summary:?}"
        );
        assert!(
            summary.epochs_completed >= 1 && run.join("model.bin").exists(),
            "finished epochs and the model are kept"
        );
    }

    #[test]
    fn a_stuck_rank_of_a_pipeline_ends_the_job_after_the_timeout_and_rank_0_keeps_its_results() {
        let pipeline = "[strategy]\nkind = \"model-parallel\"\nstages = 2\nschedule = \"1f1b\"\nmicro_batches = 3\ntimeout_seconds = 5\n";
        let Some(ended) = disturb_rank_1("-STOP", pipeline) else { return };
        assert!(!ended.success, "{}", ended.log);
        assert!(ended.log.contains("error: rank 0 of 2: "), "{}", ended.log);
        assert!(ended.after < Duration::from_secs(30), "took {:?}", ended.after);
        let run = run_dir(&ended.dir.path().join("results"), "long", "gru");
        let summary: RunSummary =
            serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
        let error = summary.error.clone().unwrap_or_default();
        // Rank 0 waited for rank 1's stage to send, to take what it sent, or to join a sum.
        let named = error.contains("stage 1, on rank 1, sent nothing for 4.5 s")
            || error.contains("no answer from the other ranks for 4.5 s");
        assert!(named, "{error}");
        assert!(
            summary.epochs_completed >= 1 && run.join("model.bin").exists(),
            "finished epochs and the model are kept"
        );
    }

    /// Each record of a run's `epochs.jsonl` without what differs between runs (timings, figures).
    fn records_without_timings(run: &Path) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(run.join("epochs.jsonl")).unwrap();
        text.lines()
            .map(|line| {
                let mut record: serde_json::Value = serde_json::from_str(line).unwrap();
                for timing in ["train_seconds", "eval_seconds", "wall_seconds", "train_samples_per_second", "figures"] {
                    record.as_object_mut().unwrap().remove(timing);
                }
                record
            })
            .collect()
    }

    /// A job stopped by SIGTERM to `mpirun` (which passes it on to every rank) once rank 0 holds a
    /// checkpoint, then run again, ends with the bytes of the job never stopped: data parallelism
    /// (a replica per rank) and a pipeline (a stage per rank).
    #[test]
    fn a_job_stopped_by_a_signal_resumes_to_the_bytes_of_one_never_stopped() {
        const EPOCHS: usize = 300;
        let (Some(_), Some(data)) = (mpirun(), data_dir()) else { return };
        let pipeline =
            "[strategy]\nkind = \"model-parallel\"\nstages = 2\ncuts = [2]\nschedule = \"1f1b\"\nmicro_batches = 3\n";
        for (name, strategy) in [("dp", data_parallel(1, "")), ("mp", pipeline.to_string())] {
            let dir = tempfile::tempdir().unwrap();
            let job = manifest(dir.path(), name, &data, &strategy, EPOCHS, "\n[cluster]\nranks = 2\n");
            let whole = dir.path().join("whole");
            run_on_two_ranks(&whole, &job);

            let out = dir.path().join("stopped");
            let mut child = mpirun()
                .unwrap()
                .args(["-np", "2", env!("CARGO_BIN_EXE_tandem"), "run", "--offline", "--out"])
                .arg(&out)
                .arg(&job)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let started = Instant::now();
            while !out.join(name).is_dir() || !run_dir(&out, name, "gru").join("checkpoint.bin").is_file() {
                assert!(child.try_wait().unwrap().is_none(), "{name}: the job ended before its first checkpoint");
                assert!(started.elapsed() < Duration::from_secs(120), "{name}: no checkpoint after 2 minutes");
                std::thread::sleep(Duration::from_millis(5));
            }
            // Well within the job (about 12 ms an epoch here).
            std::thread::sleep(Duration::from_millis(300));
            assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
            let stopped = child.wait_with_output().unwrap();
            let stopped = String::from_utf8_lossy(&stopped.stderr).into_owned();
            let run = run_dir(&out, name, "gru");
            // Both ranks stopped at the same point, with a checkpoint each and rank 0's summary.
            assert!(stopped.contains("interrupted (signal 15) after"), "{name}:\n{stopped}");
            assert_eq!(summary(&run).status, tandem_results::RunStatus::Interrupted, "{name}");
            assert!(run.join("checkpoint.rank-1.bin").is_file(), "{name}: rank 1 checkpoints too:\n{stopped}");

            let (ok, resumed) = output(
                mpirun()
                    .unwrap()
                    .args(["-np", "2", env!("CARGO_BIN_EXE_tandem"), "run", "--offline", "--out"])
                    .arg(&out)
                    .arg(&job),
            );
            assert!(ok && resumed.contains("resuming after"), "{name}:\n{stopped}\n--- resumed:\n{resumed}");
            let expected = run_dir(&whole, name, "gru");
            assert!(
                std::fs::read(expected.join("model.bin")).unwrap() == std::fs::read(run.join("model.bin")).unwrap(),
                "{name}: the resumed job ends with other parameters:\n{resumed}"
            );
            assert_eq!(records_without_timings(&run), records_without_timings(&expected), "{name}");
            assert!(!run.join("checkpoint.bin").exists() && !run.join("checkpoint.rank-1.bin").exists());
            assert_rank_1_finished(&run, EPOCHS);
        }
    }
}
