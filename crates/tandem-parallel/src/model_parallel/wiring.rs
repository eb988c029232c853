//! Where the stages run and how they are connected: which devices (and so stages) this process
//! runs, and the links between consecutive stages — in-process links, or, towards a stage of
//! another rank, a link to a relay thread that carries its messages over MPI.

use std::ops::Range;

use burn::tensor::backend::AutodiffBackend;

use super::relay::{Message, Relay};
use crate::link::{link, Interconnect, LinkReceiver, LinkSender};
use crate::ranks::RankLink;

/// Which devices this process runs: all of them, or in a multi-process job of `ranks` ranks the
/// `per_rank` consecutive devices of its rank (device `d` runs on rank `d / per_rank`). Stage `s`
/// runs on device `s % devices`.
#[derive(Clone, Debug)]
pub(super) struct Placement {
    pub local: Range<usize>,
    pub per_rank: usize,
    pub ranks: usize,
    pub devices: usize,
}

impl Placement {
    /// One process running all `devices`.
    pub fn single(devices: usize) -> Self {
        Self { local: 0..devices, per_rank: devices, ranks: 1, devices }
    }

    pub fn device_of(&self, stage: usize) -> usize {
        stage % self.devices
    }

    pub fn rank_of_stage(&self, stage: usize) -> usize {
        self.device_of(stage) / self.per_rank
    }

    pub fn runs_stage(&self, stage: usize) -> bool {
        self.local.contains(&self.device_of(stage))
    }
}

/// The links of a model-parallel run spread over ranks.
pub(super) struct AcrossRanks {
    /// Per stage boundary `s` (between stages `s` and `s + 1`): the forward and the backward link.
    pub boundaries: Vec<[Box<dyn RankLink>; 2]>,
    /// The clipping norms, the policies' sums (sync votes, loss), and the epoch's figures and
    /// parameters.
    pub norms: Box<dyn RankLink>,
    pub votes: Box<dyn RankLink>,
    pub gather: Box<dyn RankLink>,
}

/// One stage's ends of its links (absent at the ends of the pipeline).
pub(super) struct Ends<B: AutodiffBackend> {
    pub from_previous: Option<LinkReceiver<Message<B>>>,
    pub to_next: Option<LinkSender<Message<B>>>,
    pub from_next: Option<LinkReceiver<Message<B>>>,
    pub to_previous: Option<LinkSender<Message<B>>>,
}

/// The link ends of every stage (`devices[s]` is stage `s`'s device): stage `s` sends forward to
/// `s + 1` and back to `s − 1`. In a multi-process job (`boundaries`), a direction between one
/// of this process's stages and another rank's gets a relay; directions between two other
/// ranks get nothing.
pub(super) fn wire_up<'l, B: AutodiffBackend>(
    devices: &[B::Device],
    interconnect: Interconnect,
    placement: &Placement,
    boundaries: Option<&'l mut [[Box<dyn RankLink>; 2]]>,
) -> (Vec<Ends<B>>, Vec<Relay<'l, B>>) {
    let k = devices.len();
    let mut ends: Vec<Ends<B>> =
        (0..k).map(|_| Ends { from_previous: None, to_next: None, from_next: None, to_previous: None }).collect();
    let mut relays = Vec::new();
    let links: Vec<[Option<&'l mut dyn RankLink>; 2]> = match boundaries {
        Some(boundaries) => boundaries
            .iter_mut()
            .map(|[f, b]| [Some(&mut **f as &mut dyn RankLink), Some(&mut **b as &mut dyn RankLink)])
            .collect(),
        None => (1..k).map(|_| [None, None]).collect(),
    };
    // One direction, `from` → `to`: the sender's and the receiver's ends where they are local.
    let mut connect = |from: usize, to: usize, rank_link: Option<&'l mut dyn RankLink>| {
        let local = |s: usize| placement.runs_stage(s);
        match (local(from), local(to), rank_link) {
            (true, true, _) | (_, _, None) => {
                let (tx, rx) = link(interconnect);
                (Some(tx), Some(rx))
            }
            (true, false, Some(rank_link)) => {
                let (tx, rx) = link(Interconnect::default());
                let to = placement.rank_of_stage(to);
                relays.push(Relay::Out { stage: from, from_stage: rx, link: rank_link, to });
                (Some(tx), None)
            }
            (false, true, Some(rank_link)) => {
                // A simulated interconnect delays the message on the receiving rank, whose stage
                // counts the delay as transfer time (as in one process).
                let (tx, rx) = link(interconnect);
                relays.push(Relay::In {
                    stage: to,
                    to_stage: tx,
                    link: rank_link,
                    from: placement.rank_of_stage(from),
                    device: devices[to].clone(),
                });
                (None, Some(rx))
            }
            (false, false, Some(_)) => (None, None),
        }
    };
    for (s, [forward, backward]) in (1..k).zip(links) {
        (ends[s - 1].to_next, ends[s].from_previous) = connect(s - 1, s, forward);
        (ends[s].to_previous, ends[s - 1].from_next) = connect(s, s - 1, backward);
    }
    (ends, relays)
}
