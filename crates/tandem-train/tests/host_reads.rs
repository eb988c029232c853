//! A training epoch never waits for the device within its steps: the steps' losses and correct
//! counts stay on the device and are read in one go, after the last step, with the figures they would
//! have given read step by step. (Its own test binary: the read counter is process-wide.)

use std::sync::Mutex;

use burn::backend::{Autodiff, NdArray};
use tandem_testing::{epoch_plan, exact_train_config, initial_model, toy_data, toy_models};
use tandem_train::{gradients, host_reads, Sequential, Strategy};

type B = Autodiff<NdArray>;

#[test]
fn an_epoch_reads_the_device_after_its_steps_and_never_within_them() {
    let (train, _, vocab) = toy_data();
    let config = exact_train_config();
    let model = initial_model::<B>(&toy_models()[1], vocab);
    // The losses the steps would read one by one, from the same start.
    let expected = {
        let mut strategy = Sequential::new(model.clone(), &config, Default::default());
        let order: Vec<usize> = (0..train.len()).collect();
        let batches: Vec<Vec<usize>> = tandem_data::batches(&order, config.batch_size).map(<[usize]>::to_vec).collect();
        let mut loss_sum = 0.0;
        for (i, batch) in batches.iter().enumerate() {
            // The step's dropout masks, as the strategy draws them.
            tandem_ops::dropout::begin_step(0, 0, i);
            let (loss, _) = gradients(&strategy.model(), train.batch::<B>(batch, &Default::default()));
            loss_sum += loss * batch.len() as f64;
            let mut plan = epoch_plan(vec![batch.clone()], &train, batches.len());
            plan.first_step = i;
            strategy.train_epoch(&plan).expect("one step");
        }
        loss_sum
    };

    let mut strategy = Sequential::new(model, &config, Default::default());
    let order: Vec<usize> = (0..train.len()).collect();
    let batches: Vec<Vec<usize>> = tandem_data::batches(&order, config.batch_size).map(<[usize]>::to_vec).collect();
    let steps = batches.len();
    let seen = Mutex::new(Vec::new());
    let on_batch = |_: usize| seen.lock().unwrap().push(host_reads());
    let mut plan = epoch_plan(batches, &train, steps);
    plan.on_batch = &on_batch;
    let before = host_reads();
    let stats = strategy.train_epoch(&plan).expect("training epoch");
    let after = host_reads();

    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), steps);
    assert!(seen.iter().all(|&r| r == before), "reads within the steps: {seen:?} from {before}");
    assert_eq!(after - before, 1, "the epoch's losses and correct counts, read in one transaction");
    assert_eq!(stats.tested, train.len());
    assert!(stats.correct <= stats.tested);
    assert!(
        (stats.loss_sum - expected).abs() <= 1e-9 * expected,
        "the tally's loss sum {} against the steps' {expected}",
        stats.loss_sum
    );
}
