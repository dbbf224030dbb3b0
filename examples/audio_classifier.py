"""Classify synthetic sounds with a small log-mel 1-D CNN (frost.models.audio.AudioCNN).

    python examples/audio_classifier.py                        # CPU, the defaults below
    python examples/audio_classifier.py --steps 2000 --device cuda

The data is made on the spot, nothing is downloaded (frost.models.audio.synthesize_sounds): half-second clips at
8 kHz of six kinds of sound, in equal shares: a rising chirp, a falling chirp, two beeps, a tremolo tone (a
6-16 Hz amplitude wobble), a vibrato tone (a 5-10 Hz pitch wobble) and a burst of band-limited noise. Each
has a random pitch (250-2000 Hz), onset, length (0.2-0.35 s) and loudness, in white noise of a random level, so
neither the pitch nor the timing tells the class: the network must see the shape of the sound in the log-mel
spectrogram (40 mel bands, 32 frames of 32 ms every 16 ms, from frost.stft). The training and test clips come
from different seeds. Chance is 1 in 6 (16.7 %).

Measured 2026-12-04 on this machine: 2-core CPU, `python examples/audio_classifier.py` (the defaults: 3,000
training clips, 600 test clips, 600 steps of 64, AdamW lr 3e-3 with a cosine schedule): train accuracy 99.10 %,
test accuracy 93.67 %, in 58 s (the same digits on a rerun; 120 s while other jobs shared the two cores).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import frost
import frost.nn.functional as F
from frost.models.audio import SOUND_CLASSES, AudioCNN, synthesize_sounds

SAMPLE_RATE = 8000


def accuracy(model: AudioCNN, waves: np.ndarray, labels: np.ndarray, device: str, batch: int = 500) -> float:
    """The fraction of clips classified right, in eval mode (BatchNorm's running statistics)."""
    model.eval()
    correct = 0
    with frost.no_grad():
        for start in range(0, len(labels), batch):
            logits = model(frost.tensor(waves[start:start + batch]).to(device))
            correct += int((logits.argmax(1).cpu().numpy() == labels[start:start + batch]).sum())
    model.train()
    return correct / len(labels)


def train(model: AudioCNN, waves: np.ndarray, labels: np.ndarray, steps: int, batch_size: int, lr: float,
          device: str, seed: int) -> float:
    """`steps` AdamW steps on random batches (a new permutation every epoch); returns the last loss."""
    opt = frost.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = frost.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    rng = np.random.default_rng(seed)
    order, position, loss = rng.permutation(len(labels)), 0, None
    for _ in range(steps):
        if position + batch_size > len(order):
            order, position = rng.permutation(len(labels)), 0
        idx = order[position:position + batch_size]
        position += batch_size
        logits = model(frost.tensor(waves[idx]).to(device))
        loss = F.cross_entropy(logits, frost.tensor(labels[idx]).to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return loss.item()


def main(argv: list[str] | None = None) -> tuple[float, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=int, default=3000, help="training clips")
    p.add_argument("--test", type=int, default=600, help="test clips")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--width", type=int, default=64, help="channels of the first convolutions")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.batch_size > args.train:
        p.error(f"--batch-size ({args.batch_size}) must not exceed --train ({args.train})")

    start = time.perf_counter()
    frost.manual_seed(args.seed)
    train_waves, train_labels = synthesize_sounds(args.train, seed=args.seed, sample_rate=SAMPLE_RATE)
    test_waves, test_labels = synthesize_sounds(args.test, seed=args.seed + 1, sample_rate=SAMPLE_RATE)
    model = AudioCNN(len(SOUND_CLASSES), sample_rate=SAMPLE_RATE, width=args.width).to(args.device)
    loss = train(model, train_waves, train_labels, args.steps, args.batch_size, args.lr, args.device, args.seed)
    train_acc = accuracy(model, train_waves, train_labels, args.device)
    test_acc = accuracy(model, test_waves, test_labels, args.device)
    print(f"train loss {loss:.4f} after {args.steps} steps")
    print(f"train accuracy {train_acc:.2%}, test accuracy {test_acc:.2%} ({len(SOUND_CLASSES)} classes, chance "
          f"{1 / len(SOUND_CLASSES):.1%}) in {time.perf_counter() - start:.1f} s")
    return train_acc, test_acc


if __name__ == "__main__":
    main()
