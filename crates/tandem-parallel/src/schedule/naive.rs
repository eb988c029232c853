//! The naive schedule: the whole batch at once, forward through every stage, then backward —
//! one stage busy at a time.

use super::{Layout, Pass, PipelineSchedule};

pub struct Naive;

impl PipelineSchedule for Naive {
    fn name(&self) -> &'static str {
        "naive"
    }

    fn micro_batches(&self, _requested: usize) -> usize {
        1
    }

    fn passes(&self, layout: &Layout, device: usize) -> Vec<Pass> {
        super::GPipe.passes(layout, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_micro_batch_forward_then_backward() {
        assert_eq!(Naive.micro_batches(8), 1);
        let layout = Layout { devices: 2, virtual_stages: 1, micro: 1 };
        assert_eq!(
            Naive.passes(&layout, 1),
            vec![Pass::Forward { stage: 1, micro: 0 }, Pass::Backward { stage: 1, micro: 0 }]
        );
        super::super::check(&Naive, 1..5, &[1]);
    }
}
