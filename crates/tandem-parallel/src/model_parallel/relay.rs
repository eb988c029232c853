//! Stage boundaries between ranks. A stage whose neighbour runs in another process keeps its
//! ordinary in-process link ends (so its schedule, byte counts and waits are unchanged); a relay
//! thread on each side carries the messages over a [`RankLink`]: the sending side's relay takes
//! what its stage sends, encodes it and sends it to the other rank; the receiving side's relay
//! polls for arrivals, decodes them onto its stage's device and hands them on (through any
//! simulated interconnect, whose delay the receiving stage then counts as transfer time).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use tandem_models::Activation;

use super::payload::{Packed, Payload};
use crate::link::{LinkReceiver, LinkSender, RecvError};
use crate::ranks::RankLink;
use crate::supervisor::panic_message;

/// A message on a forward or backward link: global batch, micro-batch, values.
pub(crate) type Message<B> = (usize, usize, Payload<B>);

/// What a relay did in an epoch.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Relayed {
    /// Bytes sent to the other rank (encoded, headers included; a receiving relay counts none).
    pub bytes: u64,
    /// Time spent in MPI sends and receives.
    pub busy: Duration,
}

/// How long a relay waits for its stage: the stage's own waits are bounded, and it ends the
/// relay by dropping its end of the link (or the run by raising `stop`).
const UNTIL_THE_STAGE_ENDS: Duration = Duration::from_secs(1_000_000);

/// A relay thread's work: one direction of a stage boundary between this rank and another.
pub(crate) enum Relay<'l, B: AutodiffBackend> {
    /// Carries what local stage `stage` sends to a stage of rank `to`.
    Out { stage: usize, from_stage: LinkReceiver<Message<B>>, link: &'l mut dyn RankLink, to: usize },
    /// Carries what a stage of rank `from` sends to local stage `stage`, on its `device`.
    In { stage: usize, to_stage: LinkSender<Message<B>>, link: &'l mut dyn RankLink, from: usize, device: B::Device },
}

impl<B: AutodiffBackend> Relay<'_, B> {
    fn stage(&self) -> usize {
        match self {
            Relay::Out { stage, .. } | Relay::In { stage, .. } => *stage,
        }
    }

    /// Runs the relay until its stage's epoch is over; on failure (a panic too) it stops the run.
    /// Returns the stage it relays for, and what it moved.
    pub fn run(self, timeout: Duration, done: &AtomicBool, stop: &AtomicBool) -> (usize, Result<Relayed, String>) {
        let stage = self.stage();
        let result = catch_unwind(AssertUnwindSafe(|| match self {
            Relay::Out { from_stage, link, to, .. } => send_out::<B>(from_stage, link, to, timeout, stop),
            Relay::In { to_stage, link, from, device, .. } => {
                receive_in::<B>(to_stage, link, from, &device, timeout, done, stop)
            }
        }))
        .unwrap_or_else(|panic| Err(format!("its relay panicked: {}", panic_message(&panic))));
        match result {
            // The run was stopped elsewhere: that failure explains this one.
            Err(_) if stop.load(Ordering::SeqCst) => (stage, Ok(Relayed::default())),
            Err(e) => {
                stop.store(true, Ordering::SeqCst);
                (stage, Err(e))
            }
            relayed => (stage, relayed),
        }
    }
}

/// Sends each message `stage` puts on its link to rank `to`, until the stage drops its end
/// (its epoch is over) or `stop` is raised. Each send fails past `timeout`.
fn send_out<B: AutodiffBackend>(
    stage: LinkReceiver<Message<B>>,
    link: &mut dyn RankLink,
    to: usize,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<Relayed, String> {
    let mut relayed = Relayed::default();
    loop {
        let ((batch, micro, value), _) = match stage.recv(UNTIL_THE_STAGE_ENDS, stop) {
            Ok(message) => message,
            Err(RecvError::Disconnected | RecvError::Stopped) => return Ok(relayed),
            Err(e) => return Err(format!("relaying to rank {to}: {e}")),
        };
        let bytes = encode::<B>(batch, micro, value);
        relayed.bytes += bytes.len() as u64;
        let sending = Instant::now();
        link.send(to, bytes, timeout, stop).map_err(|e| e.to_string())?;
        relayed.busy += sending.elapsed();
    }
}

/// Hands each message that arrives from rank `from` to `stage`, placed on `device`, until
/// `done` (this rank's stages have finished the epoch) or `stop` is raised. Each receive fails
/// past `timeout`.
///
/// Messages carry no epoch number: the epoch's end is a barrier (every rank gathers the
/// epoch's figures before any starts the next), so no message of the next epoch can arrive
/// before `done`.
fn receive_in<B: AutodiffBackend>(
    mut stage: LinkSender<Message<B>>,
    link: &mut dyn RankLink,
    from: usize,
    device: &B::Device,
    timeout: Duration,
    done: &AtomicBool,
    stop: &AtomicBool,
) -> Result<Relayed, String> {
    let mut relayed = Relayed::default();
    let mut last_arrival = Instant::now();
    while !done.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
        let receiving = Instant::now();
        let Some(bytes) = link.try_receive(from, timeout, stop).map_err(|e| e.to_string())? else {
            // Poll tightly just after traffic (a pipeline's messages come in bursts), then
            // gently, leaving the cores to the stages.
            let pause = if last_arrival.elapsed() < Duration::from_millis(2) { 5 } else { 100 };
            std::thread::sleep(Duration::from_micros(pause));
            continue;
        };
        relayed.busy += receiving.elapsed();
        last_arrival = Instant::now();
        let message = decode::<B>(&bytes, device).map_err(|e| format!("a message from rank {from}: {e}"))?;
        let counted = message.2.bytes();
        if stage.send(message, counted).is_err() {
            // The stage has stopped; its own error explains why.
            return Ok(relayed);
        }
    }
    Ok(relayed)
}

/// Bytes of the fixed header: kind, rank (dimensions), batch, micro-batch.
const HEADER: usize = 2 + 8 + 8;

/// `[kind, dimensions, batch (u64), micro-batch (u64), each dimension (u64)…, values…]`,
/// little-endian; values as f32 (features) or i32 (token ids), 4 bytes each as the links count,
/// or a codec's packed bytes (kind 3).
fn encode<B: AutodiffBackend>(batch: usize, micro: usize, payload: Payload<B>) -> Vec<u8> {
    let (kind, dims, values) = match payload {
        Payload::Values(Activation::Tokens(t)) => {
            (0u8, t.dims().to_vec(), t.into_data().convert::<i32>().as_bytes().to_vec())
        }
        Payload::Values(Activation::Sequence(t)) => {
            (1, t.dims().to_vec(), t.into_data().convert::<f32>().as_bytes().to_vec())
        }
        Payload::Values(Activation::Features(t)) => {
            (2, t.dims().to_vec(), t.into_data().convert::<f32>().as_bytes().to_vec())
        }
        Payload::Packed(packed) => (3, packed.dims, packed.bytes),
    };
    let mut bytes = Vec::with_capacity(HEADER + 8 * dims.len() + values.len());
    bytes.extend([kind, dims.len() as u8]);
    for n in [batch, micro].iter().chain(&dims) {
        bytes.extend((*n as u64).to_le_bytes());
    }
    bytes.extend_from_slice(&values);
    bytes
}

/// The inverse of [`encode`], onto `device`.
fn decode<B: AutodiffBackend>(bytes: &[u8], device: &B::Device) -> Result<Message<B>, String> {
    let short = || format!("{} bytes is too short for its header", bytes.len());
    let word = |i: usize| -> Result<usize, String> {
        let at = 2 + 8 * i;
        let raw = bytes.get(at..at + 8).ok_or_else(short)?;
        Ok(u64::from_le_bytes(raw.try_into().expect("8 bytes")) as usize)
    };
    let (&kind, &rank) = (bytes.first().ok_or_else(short)?, bytes.get(1).ok_or_else(short)?);
    let (batch, micro) = (word(0)?, word(1)?);
    let dims = (0..rank as usize).map(|i| word(2 + i)).collect::<Result<Vec<_>, _>>()?;
    let values = bytes.get(HEADER + 8 * dims.len()..).ok_or_else(short)?.to_vec();
    if kind == 3 {
        return Ok((batch, micro, Payload::Packed(Packed { dims, bytes: values })));
    }
    if values.len() != 4 * dims.iter().product::<usize>() {
        return Err(format!("{} value bytes for a tensor of shape {dims:?}", values.len()));
    }
    let data = TensorData::from_bytes_vec(values, dims, if kind == 0 { DType::I32 } else { DType::F32 });
    let value = match (kind, rank) {
        (0, 2) => Activation::Tokens(Tensor::<B::InnerBackend, 2, Int>::from_data(data, device)),
        (1, 3) | (2, 2) => Activation::from_data(data, device).map_err(|e| e.to_string())?,
        _ => return Err(format!("unknown activation kind {kind} of {rank} dimensions")),
    };
    Ok((batch, micro, Payload::Values(value)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};

    type B = Autodiff<NdArray>;

    #[test]
    fn messages_survive_encoding() {
        let device = Default::default();
        let sequence = Tensor::<NdArray, 3>::from_data(
            TensorData::new((0..24).map(|v| v as f32 * 0.5 - 3.0).collect::<Vec<_>>(), [2, 3, 4]),
            &device,
        );
        let tokens = Tensor::<NdArray, 2, Int>::from_data(TensorData::new(vec![1i64, 7, 19_999, 0], [2, 2]), &device);
        for value in [Activation::Sequence(sequence), Activation::Tokens(tokens)] {
            let expected = match &value {
                Activation::Sequence(t) => t.to_data().iter::<f32>().collect::<Vec<_>>(),
                Activation::Tokens(t) => t.to_data().iter::<f32>().collect(),
                Activation::Features(_) => unreachable!(),
            };
            let (kind, elements) = (value.kind(), value.num_elements());
            let bytes = encode::<B>(5, 2, Payload::Values(value));
            assert_eq!(bytes.len(), HEADER + 8 * if kind == "token ids" { 2 } else { 3 } + 4 * elements);
            let (batch, micro, back) = decode::<B>(&bytes, &device).unwrap();
            let Payload::Values(back) = back else { panic!("values come back as values") };
            assert_eq!((batch, micro, back.kind()), (5, 2, kind));
            let got = match back {
                Activation::Sequence(t) => t.to_data().iter::<f32>().collect::<Vec<_>>(),
                Activation::Tokens(t) => t.to_data().iter::<f32>().collect(),
                Activation::Features(_) => unreachable!(),
            };
            assert_eq!(got, expected);
        }
        assert!(decode::<B>(&[1, 3, 0], &device).unwrap_err().contains("too short"));
        let packed = Packed { dims: vec![2, 3], bytes: vec![9, 8, 7] };
        let bytes = encode::<B>(1, 0, Payload::Packed(packed.clone()));
        assert_eq!(bytes.len(), HEADER + 16 + 3);
        assert!(matches!(decode::<B>(&bytes, &device).unwrap(), (1, 0, Payload::Packed(p)) if p == packed));
    }
}
