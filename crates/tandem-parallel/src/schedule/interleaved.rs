//! Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
//! Clusters Using Megatron-LM", SC 2021): each device runs `virtual_stages` non-adjacent stages
//! (stage `s` on device `s % devices`), so a micro-batch crosses every device `virtual_stages`
//! times and the pipeline bubble shrinks by that factor. Micro-batches go in groups of one per
//! device: a device runs a group's forwards stage by stage, its backwards in the reverse stage
//! order, and after a warm-up alternates one forward with one backward, as Megatron-LM does
//! (which needs the micro-batches to fill whole groups; otherwise all forwards run first).

use tandem_models::Invalid;

use super::{Layout, Pass, PipelineSchedule};

pub struct Interleaved1F1B;

impl PipelineSchedule for Interleaved1F1B {
    fn name(&self) -> &'static str {
        "interleaved-1f1b"
    }

    fn check_virtual_stages(&self, virtual_stages: usize) -> Result<(), Invalid> {
        match virtual_stages {
            0 | 1 => Err(Invalid::at(
                "virtual_stages",
                format!(
                    "schedule `{}` needs at least 2 stages per device (`virtual_stages`), got {virtual_stages}",
                    self.name()
                ),
            )),
            _ => Ok(()),
        }
    }

    fn passes(&self, layout: &Layout, device: usize) -> Vec<Pass> {
        let &Layout { devices, virtual_stages, micro } = layout;
        let order = |reversed: bool| {
            let mut passes = Vec::with_capacity(micro * virtual_stages);
            for first in (0..micro).step_by(devices) {
                for v in 0..virtual_stages {
                    let v = if reversed { virtual_stages - 1 - v } else { v };
                    let stage = v * devices + device;
                    passes.extend((first..micro.min(first + devices)).map(|m| (stage, m)));
                }
            }
            passes
        };
        let forwards: Vec<Pass> =
            order(false).into_iter().map(|(stage, micro)| Pass::Forward { stage, micro }).collect();
        let backwards: Vec<Pass> =
            order(true).into_iter().map(|(stage, micro)| Pass::Backward { stage, micro }).collect();
        let total = forwards.len();
        // Megatron-LM's warm-up assumes whole groups; with a short last group the devices run
        // every forward first (as GPipe does), which cannot deadlock.
        let warmup = match micro % devices {
            0 => ((devices - 1 - device) * 2 + (virtual_stages - 1) * devices).min(total),
            _ => total,
        };
        let mut passes = forwards[..warmup].to_vec();
        for (forward, backward) in forwards[warmup..].iter().zip(&backwards) {
            passes.push(*forward);
            passes.push(*backward);
        }
        passes.extend_from_slice(&backwards[total - warmup..]);
        passes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Action, Schedule};
    use Pass::{Backward as B, Forward as F};

    #[test]
    fn every_layout_runs_each_pass_once_and_completes() {
        super::super::check(&Interleaved1F1B, 1..5, &[2, 3, 4]);
    }

    #[test]
    fn two_devices_two_stages_each_follow_megatron_order() {
        let layout = Layout { devices: 2, virtual_stages: 2, micro: 4 };
        let f = |stage, micro| F { stage, micro };
        let b = |stage, micro| B { stage, micro };
        // Device 0 runs stages 0 and 2; warm-up (2 − 1) · 2 + (2 − 1) · 2 = 4 forwards.
        assert_eq!(
            Interleaved1F1B.passes(&layout, 0),
            vec![
                f(0, 0),
                f(0, 1),
                f(2, 0),
                f(2, 1),
                f(0, 2),
                b(2, 0),
                f(0, 3),
                b(2, 1),
                f(2, 2),
                b(0, 0),
                f(2, 3),
                b(0, 1),
                b(2, 2),
                b(2, 3),
                b(0, 2),
                b(0, 3),
            ]
        );
        // A micro-batch's activation crosses from device 1 (stage 1) back to device 0 (stage 2).
        let device1 = Interleaved1F1B.actions(&layout, 1);
        assert!(device1.contains(&Action::SendActivation { stage: 1, micro: 0 }));
        assert!(Interleaved1F1B.actions(&layout, 0).contains(&Action::ReceiveActivation { stage: 2, micro: 0 }));
    }

    #[test]
    fn needs_several_stages_per_device() {
        assert!(Schedule::INTERLEAVED_1F1B.check_virtual_stages(1).is_err());
        assert!(Schedule::INTERLEAVED_1F1B.check_virtual_stages(2).is_ok());
        assert!(Schedule::ONE_F_ONE_B.check_virtual_stages(2).is_err());
    }
}
