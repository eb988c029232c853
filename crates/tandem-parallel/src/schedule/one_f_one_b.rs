//! One-forward-one-backward (PipeDream-flush; Narayanan et al., "Memory-Efficient
//! Pipeline-Parallel DNN Training", 2021): after a warm-up of forwards, each stage alternates a
//! forward and a backward, so at most `stages − stage` micro-batches' activations are alive at once.

use super::{Layout, Pass, PipelineSchedule};

pub struct OneFOneB;

impl PipelineSchedule for OneFOneB {
    fn name(&self) -> &'static str {
        "1f1b"
    }

    fn passes(&self, layout: &Layout, device: usize) -> Vec<Pass> {
        let (stage, micro) = (device, layout.micro);
        let forward = |micro| Pass::Forward { stage, micro };
        let backward = |micro| Pass::Backward { stage, micro };
        let warmup = (layout.devices - 1 - stage).min(micro);
        let mut passes: Vec<Pass> = (0..warmup).map(forward).collect();
        for m in warmup..micro {
            passes.push(forward(m));
            passes.push(backward(m - warmup));
        }
        passes.extend((micro - warmup..micro).map(backward));
        passes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Schedule;
    use Pass::{Backward as B, Forward as F};

    #[test]
    fn warms_up_then_alternates() {
        let layout = |devices, micro| Layout { devices, virtual_stages: 1, micro };
        let f = |stage, micro| F { stage, micro };
        let b = |stage, micro| B { stage, micro };
        assert_eq!(
            OneFOneB.passes(&layout(2, 4), 0),
            vec![f(0, 0), f(0, 1), b(0, 0), f(0, 2), b(0, 1), f(0, 3), b(0, 2), b(0, 3)]
        );
        assert_eq!(
            OneFOneB.passes(&layout(2, 4), 1),
            vec![f(1, 0), b(1, 0), f(1, 1), b(1, 1), f(1, 2), b(1, 2), f(1, 3), b(1, 3)]
        );
        assert_eq!(OneFOneB.passes(&layout(4, 2), 0), vec![f(0, 0), f(0, 1), b(0, 0), b(0, 1)]);
        super::super::check(&OneFOneB, 1..5, &[1]);
    }

    #[test]
    fn keeps_fewer_activations_alive_than_gpipe() {
        let layout = Layout { devices: 3, virtual_stages: 1, micro: 8 };
        for device in 0..3 {
            assert_eq!(Schedule::peak_live(&OneFOneB.actions(&layout, device)), 3 - device);
        }
    }
}
