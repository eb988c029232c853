//! Tandem's one-pass AdamW against Burn's own.

use burn::backend::{Flex, NdArray};
use burn::optim::{AdamWState, SimpleOptimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use tandem_train::optim::{adamw_config, HostAdamW};
use tandem_train::TrainConfig;

/// Values that differ from one step and one element to the next, with some exact zeros.
fn values<B: Backend>(salt: f32, shape: [usize; 2]) -> Tensor<B, 2> {
    let n = shape[0] * shape[1];
    let data: Vec<f32> = (0..n).map(|i| if i % 7 == 3 { 0.0 } else { ((i as f32 + 1.0) * salt).sin() * 0.1 }).collect();
    Tensor::from_data(TensorData::new(data, shape), &Default::default())
}

fn flat<B: Backend>(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().expect("f32 values")
}

/// Four steps with changing learning rates: parameters and both moments equal Burn's.
fn host_adamw_equals_burns<B: Backend>() {
    assert!(
        HostAdamW::one_pass_on::<B>(),
        "{} takes Burn's path: the test would prove nothing",
        std::any::type_name::<B>()
    );
    for weight_decay in [0.0, 0.01] {
        let config = TrainConfig { weight_decay, ..Default::default() };
        let host = HostAdamW::new(&config);
        let burn = adamw_config(&config).build();
        let shape = [13, 5];
        let (mut ours, mut theirs) = (values::<B>(0.3, shape), values::<B>(0.3, shape));
        let (mut our_state, mut their_state): (Option<AdamWState<B, 2>>, Option<AdamWState<B, 2>>) = (None, None);
        for step in 0..4 {
            let lr = 1e-3 * (step + 1) as f64;
            let grad = values::<B>(1.7 + step as f32, shape);
            (ours, our_state) = host.step(lr, ours, grad.clone(), our_state);
            (theirs, their_state) = burn.step(lr, theirs, grad, their_state);
            let what = format!("{} weight decay {weight_decay} step {step}", std::any::type_name::<B>());
            assert_eq!(flat(ours.clone()), flat(theirs.clone()), "{what}: parameters");
            let (o, t) = (our_state.clone().expect("a state").momentum, their_state.clone().expect("a state").momentum);
            assert_eq!(o.time, t.time, "{what}: time");
            assert_eq!(flat(o.moment_1), flat(t.moment_1), "{what}: first moment");
            assert_eq!(flat(o.moment_2), flat(t.moment_2), "{what}: second moment");
        }
        assert_ne!(flat(ours), flat(values::<B>(0.3, shape)), "the parameters moved");
    }
}

#[test]
fn host_adamw_equals_burns_adamw_on_flex() {
    host_adamw_equals_burns::<Flex>();
}

#[test]
fn host_adamw_equals_burns_adamw_on_ndarray() {
    host_adamw_equals_burns::<NdArray>();
}
