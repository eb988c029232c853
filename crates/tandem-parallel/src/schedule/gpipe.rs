//! GPipe (Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
//! Parallelism", 2019): every micro-batch forward, then every micro-batch backward.

use super::{Layout, Pass, PipelineSchedule};

pub struct GPipe;

impl PipelineSchedule for GPipe {
    fn name(&self) -> &'static str {
        "gpipe"
    }

    fn passes(&self, layout: &Layout, device: usize) -> Vec<Pass> {
        let forwards = (0..layout.micro).map(|micro| Pass::Forward { stage: device, micro });
        let backwards = (0..layout.micro).map(|micro| Pass::Backward { stage: device, micro });
        forwards.chain(backwards).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Schedule;

    #[test]
    fn all_forwards_then_all_backwards() {
        let layout = Layout { devices: 3, virtual_stages: 1, micro: 8 };
        for device in 0..3 {
            assert_eq!(Schedule::peak_live(&GPipe.actions(&layout, device)), 8);
        }
        super::super::check(&GPipe, 1..5, &[1]);
    }
}
