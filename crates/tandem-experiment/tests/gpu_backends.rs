//! The GPU backends (wgpu, cuda) compute what the ndarray reference computes, and every
//! strategy runs on them end to end.
//!
//! Runs on each GPU backend compiled into the test (`--features wgpu`, `cuda`; ndarray is the reference). A backend whose
//! device cannot start here is skipped with a message, unless `TANDEM_REQUIRE_BACKENDS` names it
//! (e.g. `wgpu`: CI runs wgpu on lavapipe, Mesa's CPU Vulkan driver, and must not skip it).
//!
//! Built only with a GPU backend's feature; without one, one ignored test says how to run them.

#[cfg(not(all(feature = "ndarray", any(feature = "wgpu", feature = "cuda"))))]
#[test]
#[ignore = "needs a GPU backend compiled in: cargo test -p tandem-experiment --no-default-features --features ndarray,wgpu --test gpu_backends"]
fn the_gpu_backends_need_their_features() {}

#[cfg(all(feature = "ndarray", any(feature = "wgpu", feature = "cuda")))]
mod common;

#[cfg(all(feature = "ndarray", any(feature = "wgpu", feature = "cuda")))]
mod tests {
    use super::common;

    use burn::backend::{Autodiff, NdArray};
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::optim::GradientsParams;
    use burn::tensor::backend::{AutodiffBackend, Backend};
    use burn::tensor::{Bool, Int, Tensor, TensorData};
    use tandem_experiment::backend::{compiled_backends, launches, with_backend, BackendKind, BackendTask, DeviceSpec};
    use tandem_models::{
        Architecture, Classifier, CnnConfig, InputSpec, ModelConfig, RecurrentConfig, TransformerConfig,
    };
    use tandem_ops::ledger;
    use tandem_parallel::{DataParallel, DataParallelConfig, ModelParallel, ModelParallelConfig, Schedule};
    use tandem_testing::{
        exact_train_config, initial_model, one_epoch, reference_model, relative_difference, toy_data, toy_models,
    };
    use tandem_train::optim::AnyOptimizer;
    use tandem_train::{Sequential, Strategy, TrainConfig};

    type Reference = Autodiff<NdArray>;

    /// The backends' seeded RNGs are process-global: tests that seed them must not interleave.
    static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        RNG.lock().unwrap_or_else(|e| e.into_inner())
    }

    const INPUT: InputSpec = InputSpec { vocab_size: 60, max_len: 12, num_classes: 4 };

    /// Each architecture at a small size, dropout off (dropout masks differ between backends).
    fn configs() -> Vec<ModelConfig> {
        let recurrent = RecurrentConfig {
            embedding_dim: 8,
            hidden: 6,
            layers: 2,
            embedding_dropout: 0.0,
            dropout: 0.0,
            ..Default::default()
        };
        vec![
            ModelConfig::Cnn(CnnConfig {
                embedding_dim: 8,
                filters: 5,
                kernel_widths: vec![2, 3],
                embedding_dropout: 0.0,
                dropout: 0.0,
                ..Default::default()
            }),
            ModelConfig::Lstm(recurrent.clone()),
            ModelConfig::Gru(recurrent),
            ModelConfig::Transformer(TransformerConfig {
                d_model: 8,
                heads: 2,
                layers: 2,
                d_ff: 16,
                embedding_dropout: 0.0,
                dropout: 0.0,
                ..Default::default()
            }),
        ]
    }

    /// The GPU backends to test: those compiled in whose device starts, or that must be tested.
    fn backends_to_test() -> Vec<BackendKind> {
        let required = std::env::var("TANDEM_REQUIRE_BACKENDS").unwrap_or_default();
        let mut out = Vec::new();
        for kind in compiled_backends().into_iter().filter(|b| !b.is_cpu()) {
            match with_backend(kind, &[DeviceSpec::first_of(kind)], CheckOn(Check::Starts, kind)) {
                Ok(()) => out.push(kind),
                Err(e) if required.split(',').any(|r| r.trim() == kind.name()) => {
                    panic!("{kind} is required here: {e}")
                }
                Err(e) => eprintln!("skipped {kind}: {e}"),
            }
        }
        out
    }

    /// What a test checks on a GPU backend (each a function generic over the backend).
    #[derive(Clone, Copy)]
    enum Check {
        /// The device starts (nothing else).
        Starts,
        Agreement,
        RecurrentShapes,
        TransformerShapes,
        ReferenceShapes,
        Loss,
        Matmul,
        Training,
        Strategies,
        Ledger,
    }

    /// A check on one backend.
    struct CheckOn(Check, BackendKind);

    impl BackendTask for CheckOn {
        type Output = ();

        fn run<B: AutodiffBackend>(self, mut devices: Vec<B::Device>) {
            let (name, device) = (self.1.name(), devices.remove(0));
            match self.0 {
                Check::Starts => {}
                Check::Agreement => agrees_with_ndarray::<B>(name, device),
                Check::RecurrentShapes => cases_agree_with_ndarray::<B>(name, device, recurrent_cases()),
                Check::TransformerShapes => cases_agree_with_ndarray::<B>(name, device, transformer_cases()),
                Check::ReferenceShapes => cases_agree_with_ndarray::<B>(name, device, reference_cases()),
                Check::Loss => loss_agrees_with_ndarray::<B>(name, device),
                Check::Matmul => matmul_agrees_with_ndarray::<B>(name, device),
                Check::Training => training_agrees_with_ndarray::<B>(name, device),
                Check::Strategies => strategies_agree_on::<B>(name, device),
                Check::Ledger => every_tandem_launch_writes_down_its_work::<B>(name, device),
            }
        }
    }

    /// Runs `check` on device 0 of each backend of [`backends_to_test`].
    fn on_each_gpu_backend(check: Check) {
        for backend in backends_to_test() {
            with_backend(backend, &[DeviceSpec::first_of(backend)], CheckOn(check, backend))
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Sequences with 12, 7 and 1 real tokens.
    fn batch<B: Backend>(device: &B::Device) -> (Tensor<B, 2, Int>, Tensor<B, 2, Bool>) {
        batch_of::<B>(&[12, 7, 1], INPUT.max_len, INPUT.vocab_size, device)
    }

    /// One sequence of `seq` positions per length in `lengths`, padded after its real tokens, of
    /// ids below `vocab` (many tokens at several positions).
    fn batch_of<B: Backend>(
        lengths: &[usize],
        seq: usize,
        vocab: usize,
        device: &B::Device,
    ) -> (Tensor<B, 2, Int>, Tensor<B, 2, Bool>) {
        let mut ids = Vec::new();
        let mut pad = Vec::new();
        for (row, &len) in lengths.iter().enumerate() {
            for pos in 0..seq {
                ids.push(if pos < len { ((row * 13 + pos * 7) % (vocab - 2) + 2) as i64 } else { 0 });
                pad.push(pos >= len);
            }
        }
        let rows = lengths.len();
        (
            Tensor::from_data(TensorData::new(ids, [rows, seq]), device),
            Tensor::from_data(TensorData::new(pad, [rows, seq]), device),
        )
    }

    /// Every parameter's gradient, in visiting order.
    struct CollectGradients<'a, B: AutodiffBackend>(&'a B::Gradients, Vec<Vec<f32>>);

    impl<B: AutodiffBackend> ModuleVisitor<B> for CollectGradients<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = param.val().grad(self.0).expect("every parameter takes part in the loss");
            self.1.push(grad.into_data().convert::<f32>().iter::<f32>().collect());
        }
    }

    /// Logits and every parameter's gradient of a fixed weighted sum of the logits.
    fn logits_and_gradients<B: AutodiffBackend>(
        model: &Classifier<B>,
        device: &B::Device,
    ) -> (Vec<f32>, Vec<Vec<f32>>) {
        logits_and_gradients_on(model, batch::<B>(device), device)
    }

    /// [`logits_and_gradients`] on a batch of `tokens` and their padding mask.
    fn logits_and_gradients_on<B: AutodiffBackend>(
        model: &Classifier<B>,
        (tokens, mask): (Tensor<B, 2, Int>, Tensor<B, 2, Bool>),
        device: &B::Device,
    ) -> (Vec<f32>, Vec<Vec<f32>>) {
        let rows = tokens.dims()[0];
        // Every backend draws the same dropout masks from the same stream.
        tandem_ops::dropout::begin_step(7, 0, 0);
        let logits = model.forward(tokens, &mask);
        let weights: Vec<f32> = (0..rows * 4).map(|i| (i as f32 * 0.37).sin()).collect();
        let weights = Tensor::<B, 2>::from_data(TensorData::new(weights, [rows, 4]), device);
        let grads = (logits.clone() * weights).sum().backward();
        let mut collect = CollectGradients::<B>(&grads, Vec::new());
        model.visit(&mut collect);
        (logits.into_data().convert::<f32>().iter::<f32>().collect(), collect.1)
    }

    /// Largest difference relative to the largest reference value (at least 1).
    fn largest_relative_difference(reference: &[f32], got: &[f32]) -> f32 {
        assert_eq!(reference.len(), got.len());
        let scale = reference.iter().fold(1f32, |m, v| m.max(v.abs()));
        reference.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) / scale
    }

    /// Builds each architecture on ndarray, copies its parameters to `B`, and compares logits and
    /// every gradient (relative difference ≤ 1e-4; on CUDA ≤ 2e-3, whose f32 matrix products round
    /// more coarsely: on an NVIDIA H200 the largest difference over the four architectures was
    /// 7.1e-4, as TensorFloat-32 products would give); the recurrent layers run as one autodiff node
    /// on both.
    fn agrees_with_ndarray<B: AutodiffBackend>(name: &str, device: B::Device) {
        assert!(
            tandem_ops::FastPath::Recurrence.active_on::<B>(),
            "{name}: the recurrent layers fall back to ordinary operations (is tandem-models' `{name}` feature on?)"
        );
        let reference_device = Default::default();
        let tolerance = if name == "cuda" { 2e-3 } else { 1e-4 };
        // Every comparison is made and printed before the test fails, so one run shows them all.
        let mut beyond = Vec::new();
        for config in configs() {
            let reference: Classifier<Reference> = config.init(&INPUT, &reference_device);
            let model: Classifier<B> = config.init(&INPUT, &device).with_parameters_of(&reference);
            let (expected_logits, expected_grads) = logits_and_gradients(&reference, &reference_device);
            let (logits, grads) = logits_and_gradients(&model, &device);
            let arch = config.architecture().name();
            let mut check = |what: String, d: f32| {
                eprintln!("{name} {arch}: {what} within {d:e} (relative) of ndarray");
                if d > tolerance {
                    beyond.push(format!("{name} {arch}: {what} differ from ndarray by {d:e} (relative)"));
                }
            };
            check("logits".into(), largest_relative_difference(&expected_logits, &logits));
            assert_eq!(expected_grads.len(), grads.len());
            for (i, (e, g)) in expected_grads.iter().zip(&grads).enumerate() {
                assert!(
                    e.iter().any(|v| *v != 0.0),
                    "{arch}: parameter {i} has a zero gradient, the test would prove nothing"
                );
                check(format!("gradient of parameter {i}"), largest_relative_difference(e, g));
            }
        }
        assert!(beyond.is_empty(), "{}", beyond.join("\n"));
    }

    #[test]
    fn every_architecture_agrees_with_ndarray_in_logits_and_every_gradient() {
        let _serial = serial();
        on_each_gpu_backend(Check::Agreement);
    }

    /// One model at one shape: what it is, its configuration, the real tokens of each sample, the
    /// positions of every sample and the vocabulary.
    struct Case {
        what: String,
        config: ModelConfig,
        lengths: Vec<usize>,
        seq: usize,
        vocab: usize,
    }

    /// Logits and every gradient of each case agree with ndarray's as in [`agrees_with_ndarray`].
    fn cases_agree_with_ndarray<B: AutodiffBackend>(name: &str, device: B::Device, cases: Vec<Case>) {
        let tolerance = if name == "cuda" { 2e-3 } else { 1e-4 };
        let mut beyond = Vec::new();
        for Case { what, config, lengths, seq, vocab } in cases {
            let input = InputSpec { max_len: seq, vocab_size: vocab, ..INPUT };
            let reference_device = Default::default();
            let reference: Classifier<Reference> = config.init(&input, &reference_device);
            let model: Classifier<B> = config.init(&input, &device).with_parameters_of(&reference);
            let (expected_logits, expected_grads) = logits_and_gradients_on(
                &reference,
                batch_of::<Reference>(&lengths, seq, vocab, &reference_device),
                &reference_device,
            );
            let (logits, grads) =
                logits_and_gradients_on(&model, batch_of::<B>(&lengths, seq, vocab, &device), &device);
            let case =
                format!("{name} {} {what}, batch {}, {seq} positions", config.architecture().name(), lengths.len());
            let mut worst = largest_relative_difference(&expected_logits, &logits);
            for (e, g) in expected_grads.iter().zip(&grads) {
                worst = worst.max(largest_relative_difference(e, g));
            }
            eprintln!("{case}: logits and gradients within {worst:e} (relative) of ndarray");
            if worst > tolerance {
                beyond.push(format!("{case}: {worst:e} (relative) away from ndarray"));
            }
        }
        assert!(beyond.is_empty(), "{}", beyond.join("\n"));
    }

    /// The recurrent layers' kernels at the edges of the shapes manifests allow: hidden 16 and 512
    /// (more units than a cube has threads), odd sizes, one step and 512 steps, one sample and 1,024
    /// (several samples per cube), both directions, stacked layers; LSTM and GRU.
    fn recurrent_cases() -> Vec<Case> {
        // (hidden, layers, bidirectional, real tokens per sample, positions)
        let shapes: [(usize, usize, bool, Vec<usize>, usize); 6] = [
            (16, 1, false, vec![1], 1),
            (33, 2, true, vec![9, 4, 1], 9),
            (512, 1, true, vec![3, 2], 3),
            (17, 1, false, vec![512, 300], 512),
            (16, 1, true, (0..1024).map(|i| 1 + i % 5).collect(), 5),
            (130, 1, false, vec![7; 67], 7),
        ];
        let mut cases = Vec::new();
        for (hidden, layers, bidirectional, lengths, seq) in shapes {
            let recurrent = RecurrentConfig {
                embedding_dim: 8,
                hidden,
                layers,
                bidirectional,
                embedding_dropout: 0.0,
                dropout: 0.0,
                ..Default::default()
            };
            let what =
                format!("hidden {hidden}, {layers} layer(s){}", if bidirectional { ", bidirectional" } else { "" });
            for config in [ModelConfig::Lstm(recurrent.clone()), ModelConfig::Gru(recurrent.clone())] {
                cases.push(Case { what: what.clone(), config, lengths: lengths.clone(), seq, vocab: INPUT.vocab_size });
            }
        }
        cases
    }

    /// The Transformer's kernels (attention, GELU, layer norm, dropout) at odd widths: one position
    /// (a softmax over one score), odd model and feed-forward widths, pre- and post-norm, more rows
    /// than a cube has units, and dropout everywhere (the same masks on every backend).
    fn transformer_cases() -> Vec<Case> {
        // (d_model, heads, d_ff, pre-norm, dropout, real tokens per sample, positions)
        type Shape = (usize, usize, usize, bool, f64, Vec<usize>, usize);
        let shapes: [Shape; 4] = [
            (6, 3, 7, true, 0.0, vec![1], 1),
            (12, 4, 20, false, 0.0, vec![9, 4, 1], 9),
            (10, 2, 13, true, 0.0, (0..70).map(|i| 1 + i % 5).collect(), 5),
            (16, 4, 24, true, 0.3, vec![11, 6, 2, 11], 11),
        ];
        shapes
            .into_iter()
            .map(|(d_model, heads, d_ff, norm_first, dropout, lengths, seq)| Case {
                what: format!(
                    "d_model {d_model}, {heads} heads, d_ff {d_ff}, {}, dropout {dropout}",
                    if norm_first { "pre-norm" } else { "post-norm" }
                ),
                config: ModelConfig::Transformer(TransformerConfig {
                    d_model,
                    heads,
                    layers: 1,
                    d_ff,
                    norm_first,
                    embedding_dropout: dropout,
                    dropout,
                    ..Default::default()
                }),
                lengths,
                seq,
                vocab: INPUT.vocab_size,
            })
            .collect()
    }

    /// Every architecture at the shape that trains: the reference model (vocabulary 20,000,
    /// embedding 128; hidden 128; Transformer d_model 128, 4 heads, d_ff 256) on a batch of 64 × 64
    /// positions, with padding and tokens at many positions; and the Transformer at 256 positions.
    fn reference_cases() -> Vec<Case> {
        let lengths: Vec<usize> = (0..64).map(|i| [64, 40, 17, 1][i % 4]).collect();
        let mut cases: Vec<Case> = Architecture::ALL
            .into_iter()
            .map(|arch| Case {
                what: "reference shape".into(),
                config: reference_model(arch),
                lengths: lengths.clone(),
                seq: 64,
                vocab: 20_000,
            })
            .collect();
        cases.push(Case {
            what: "reference shape".into(),
            config: reference_model(Architecture::Transformer),
            lengths: vec![256, 200, 31, 1],
            seq: 256,
            vocab: 20_000,
        });
        cases
    }

    #[test]
    fn every_architecture_agrees_with_ndarray_at_the_reference_shape() {
        let _serial = serial();
        on_each_gpu_backend(Check::ReferenceShapes);
    }

    #[test]
    fn recurrent_layers_agree_with_ndarray_at_the_edges_of_the_shapes_manifests_allow() {
        let _serial = serial();
        on_each_gpu_backend(Check::RecurrentShapes);
    }

    /// The loss of `rows` fixed logits of `classes` classes, and the logits' gradient of three times it.
    fn loss_and_gradient<B: AutodiffBackend>(rows: usize, classes: usize, device: &B::Device) -> Vec<Vec<f32>> {
        let values: Vec<f32> = (0..rows * classes).map(|i| (i as f32 * 0.71).sin() * 4.0).collect();
        let labels: Vec<i64> = (0..rows).map(|r| ((r * 5 + 3) % classes) as i64).collect();
        let logits = Tensor::<B, 2>::from_data(TensorData::new(values, [rows, classes]), device).require_grad();
        let loss = tandem_train::loss(logits.clone(), Tensor::from_data(TensorData::new(labels, [rows]), device));
        let gradient = logits.grad(&(loss.clone() * 3.0).backward()).expect("the logits require a gradient");
        [loss.into_data(), gradient.into_data()].map(|d| d.convert::<f32>().iter::<f32>().collect()).into()
    }

    /// The loss's value and the logits' gradient agree with Burn's cross-entropy on ndarray: one
    /// row, more rows than the forward kernel's cube has units, odd class counts.
    fn loss_agrees_with_ndarray<B: AutodiffBackend>(name: &str, device: B::Device) {
        let tolerance = if name == "cuda" { 2e-3 } else { 1e-4 };
        let mut beyond = Vec::new();
        for (rows, classes) in [(1, 4), (3, 7), (300, 4), (1025, 2)] {
            let expected = loss_and_gradient::<Reference>(rows, classes, &Default::default());
            let got = loss_and_gradient::<B>(rows, classes, &device);
            let worst = expected.iter().zip(&got).map(|(e, g)| largest_relative_difference(e, g)).fold(0f32, f32::max);
            let case = format!("{name} loss of {rows} rows, {classes} classes");
            eprintln!("{case}: value and gradient within {worst:e} (relative) of ndarray");
            if worst > tolerance {
                beyond.push(format!("{case}: {worst:e} (relative) away from ndarray"));
            }
        }
        assert!(beyond.is_empty(), "{}", beyond.join("\n"));
    }

    /// `lhs · rhsᵀ` of fixed values, `lhs` of `[m, k]` and `rhs` of `[n, k]` (as a layer's
    /// gradient meets its weights).
    fn product<B: Backend>(m: usize, k: usize, n: usize, device: &B::Device) -> Vec<f32> {
        let lhs: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let rhs: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.53).cos()).collect();
        let lhs = Tensor::<B, 2>::from_data(TensorData::new(lhs, [m, k]), device);
        let rhs = Tensor::<B, 2>::from_data(TensorData::new(rhs, [n, k]), device);
        lhs.matmul(rhs.transpose()).into_data().convert::<f32>().iter::<f32>().collect()
    }

    /// Burn's matmul, which Tandem's layers use, agrees with ndarray's at inner dimensions that
    /// are multiples of 8 but not of 16 (CubeCL's double-buffered unit matmul, which Burn's
    /// opt-in autotuning may choose, sums those wrong) and at the LSTM's gate widths.
    fn matmul_agrees_with_ndarray<B: AutodiffBackend>(name: &str, device: B::Device) {
        let tolerance = if name == "cuda" { 2e-3 } else { 1e-4 };
        let mut beyond = Vec::new();
        for (m, k, n) in [(469, 520, 8), (469, 8, 520), (64, 520, 64), (512, 1032, 16), (67, 130, 520), (3, 7, 5)] {
            let expected = product::<NdArray>(m, k, n, &Default::default());
            let worst = largest_relative_difference(&expected, &product::<B::InnerBackend>(m, k, n, &device));
            eprintln!("{name} matmul [{m}, {k}] by [{k}, {n}]: within {worst:e} (relative) of ndarray");
            if worst > tolerance {
                beyond.push(format!("{name} matmul [{m}, {k}] by [{k}, {n}]: {worst:e} (relative) away from ndarray"));
            }
        }
        assert!(beyond.is_empty(), "{}", beyond.join("\n"));
    }

    /// One training step (clipped AdamW) of each small architecture and of a Transformer with
    /// dropout: each launch of a Tandem kernel has the ledger entry the kernel table reads, and
    /// each entry its launch.
    fn every_tandem_launch_writes_down_its_work<B: AutodiffBackend>(name: &str, device: B::Device) {
        assert!(launches::install(), "the launch counter is the process's tracing subscriber");
        let mut configs = configs();
        configs.push(ModelConfig::Transformer(TransformerConfig {
            d_model: 8,
            heads: 2,
            d_ff: 16,
            ..Default::default()
        }));
        for config in configs {
            let model = config.init::<B>(&INPUT, &device);
            let mut optimizer = AnyOptimizer::for_model(&TrainConfig::default(), &model);
            let (tokens, pad) = batch::<B>(&device);
            B::sync(&device).expect("the device finishes its queued work");
            launches::name_launches();
            ledger::open();
            let labels = Tensor::from_data(TensorData::new(vec![0i64, 1, 2], [3]), &device);
            let loss = tandem_train::loss(model.forward(tokens, &pad), labels);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let _ = optimizer.step(1e-3, model, grads);
            B::sync(&device).expect("the device finishes its queued work");
            let works = ledger::close();
            let paired = ledger::pair(launches::named_launches(), works)
                .unwrap_or_else(|e| panic!("{name}, {}: {e}", config.architecture().name()));
            let tandem = paired.iter().filter(|(_, work)| work.is_some()).count();
            eprintln!(
                "{name}, {}: {} launches, {tandem} of Tandem's kernels, each written down",
                config.architecture().name(),
                paired.len()
            );
            assert!(tandem > 0);
        }
    }

    #[test]
    fn every_launch_of_a_tandem_kernel_writes_down_its_work_for_the_kernel_table() {
        let _serial = serial();
        on_each_gpu_backend(Check::Ledger);
    }

    #[test]
    fn burns_matmul_agrees_with_ndarray_at_inner_sizes_autotuning_gets_wrong() {
        let _serial = serial();
        on_each_gpu_backend(Check::Matmul);
    }

    #[test]
    fn the_loss_agrees_with_ndarray_in_value_and_gradient() {
        let _serial = serial();
        on_each_gpu_backend(Check::Loss);
    }

    #[test]
    fn transformer_layers_agree_with_ndarray_at_odd_widths() {
        let _serial = serial();
        on_each_gpu_backend(Check::TransformerShapes);
    }

    /// One epoch of sequential training (global-norm clipping, AdamW with warm-up) on `B` ends with
    /// the parameters the same epoch ends with on ndarray: on the GPU backends the clipping factor is
    /// computed on the device and AdamW steps every parameter in one kernel, on ndarray both run on
    /// the host.
    fn training_agrees_with_ndarray<B: AutodiffBackend>(name: &str, device: B::Device) {
        let (data, _, vocab_size) = toy_data();
        let train = exact_train_config();
        let tolerance = if name == "cuda" { 2e-3 } else { 1e-4 };
        let mut beyond = Vec::new();
        for config in toy_models() {
            let arch = config.architecture().name();
            let reference_model = initial_model::<Reference>(&config, vocab_size);
            let model = initial_model::<B>(&config, vocab_size).with_parameters_of(&reference_model);
            let mut reference = Sequential::new(reference_model, &train, Default::default());
            let mut sequential = Sequential::new(model, &train, device.clone());
            one_epoch(&mut reference, &data, &train);
            one_epoch(&mut sequential, &data, &train);
            let d = relative_difference(&sequential.model().parameter_values(), &reference.model().parameter_values());
            eprintln!("{name} {arch}: one epoch of training within {d:e} (relative) of ndarray's");
            if d > tolerance {
                beyond.push(format!("{name} {arch}: one epoch of training ends {d:e} (relative) away from ndarray's"));
            }
        }
        assert!(beyond.is_empty(), "{}", beyond.join("\n"));
    }

    /// One epoch of sequential training, data parallel (2 replicas, row-sparse embedding exchange)
    /// and model parallel (2 stages, 1F1B) on one device of `B` end with the same parameters.
    /// (Replicas and stages run on threads of their own: this is what caught CubeCL's per-thread
    /// streams, see `one_stream_per_device`.)
    fn strategies_agree_on<B: AutodiffBackend>(name: &str, device: B::Device) {
        let (data, _, vocab_size) = toy_data();
        let train = exact_train_config();
        for config in toy_models() {
            let arch = config.architecture().name();
            let mut sequential = Sequential::new(initial_model::<B>(&config, vocab_size), &train, device.clone());
            one_epoch(&mut sequential, &data, &train);
            let expected = sequential.model().parameter_values();
            let dp = DataParallelConfig { replicas: 2, sparse_embedding: true, ..Default::default() };
            let mut data_parallel =
                DataParallel::new(initial_model::<B>(&config, vocab_size), &train, &dp, vec![device.clone(); 2])
                    .unwrap();
            let mp = ModelParallelConfig {
                stages: 2,
                schedule: Schedule::ONE_F_ONE_B,
                micro_batches: 3,
                ..Default::default()
            };
            let mut model_parallel = ModelParallel::new(
                initial_model::<B>(&config, vocab_size),
                &train,
                &mp,
                vec![device.clone(); 2],
                &data,
            )
            .unwrap();
            for (strategy, parallel) in
                [("data parallel", &mut data_parallel as &mut dyn Strategy<B>), ("model parallel", &mut model_parallel)]
            {
                one_epoch(parallel, &data, &train);
                let d = relative_difference(&parallel.model().parameter_values(), &expected);
                assert!(d <= 1e-5, "{name} {arch}: {strategy} ends {d:e} (relative) away from sequential");
            }
            eprintln!("{name} {arch}: data parallel and model parallel match sequential");
        }
    }

    #[test]
    fn one_epoch_of_training_on_the_gpu_ends_with_the_parameters_of_ndarray() {
        let _serial = serial();
        on_each_gpu_backend(Check::Training);
    }

    #[test]
    fn data_and_model_parallel_on_one_gpu_match_sequential_on_it() {
        let _serial = serial();
        on_each_gpu_backend(Check::Strategies);
    }

    #[test]
    fn every_strategy_runs_end_to_end_with_replicas_and_stages_sharing_one_gpu() {
        let _serial = serial();
        let Some(data) = common::data_dir() else { return };
        for backend in backends_to_test() {
            let device = format!("{backend}:0");
            let (out, result) = common::run_tiny(&data, backend, &[&device, &device]);
            let summaries = result.unwrap();
            common::check_results(out.path(), &summaries, backend);
            for s in &summaries {
                assert_eq!(s.shared_devices, !s.strategy.starts_with("sequential"), "{}", s.run_id);
            }
        }
    }

    #[test]
    fn a_device_that_does_not_exist_fails_the_run_with_its_name() {
        let _serial = serial();
        let Some(data) = common::data_dir() else { return };
        for backend in backends_to_test() {
            let missing = format!("{backend}:7");
            let (out, result) = common::run_tiny(&data, backend, &[&missing]);
            let err = result.unwrap_err();
            assert!(err.to_string().contains("6 of 6 runs failed"), "{err}");
            let summary: tandem_experiment::RunSummary = serde_json::from_str(
                &std::fs::read_to_string(out.path().join("tiny/gru-sequential-seed1/summary.json")).unwrap(),
            )
            .unwrap();
            let why = summary.error.unwrap();
            assert!(why.contains(&format!("device `{missing}` does not exist or cannot start")), "{why}");
        }
    }
}
