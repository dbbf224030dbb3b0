"""End to end with Frost alone: small models learn small generated tasks to a stated held-out accuracy."""
from __future__ import annotations

import numpy as np

import frost
import frost.nn.functional as F
from frost import nn
from frost.data import DataLoader, TensorDataset
from frost.optim import SGD, AdamW


def spirals(n_per_class: int, classes: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Interleaved 2-D spirals, one arm per class, with a little noise: not linearly separable."""
    xs, ys = [], []
    for k in range(classes):
        r = np.linspace(0.1, 1.0, n_per_class)
        theta = np.linspace(0, 3.5, n_per_class) + 2 * np.pi * k / classes + rng.normal(0, 0.08, n_per_class)
        xs.append(np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1))
        ys.append(np.full(n_per_class, k))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64)


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    with frost.no_grad():
        pred = model(frost.tensor(x)).argmax(dim=1).numpy()
    model.train()
    return float((pred == y).mean())


def test_mlp_learns_spirals_to_95_percent():
    rng = np.random.default_rng(0)
    x, y = spirals(300, 3, rng)
    order = rng.permutation(len(x))
    train, test = order[:600], order[600:]
    frost.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4)
    xt, yt = frost.tensor(x[train]), frost.tensor(y[train])
    first = None
    for _ in range(400):
        loss = F.cross_entropy(model(xt), yt)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.25 * first
    assert accuracy(model, x[test], y[test]) >= 0.95


def bars(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """8x8 one-channel images of a bright bar: 0 horizontal, 1 vertical, 2 diagonal, 3 anti-diagonal; noisy."""
    images = rng.normal(0, 0.3, (n, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 4, n)
    eye = np.eye(8, dtype=np.float32)
    for i, k in enumerate(labels):
        pos = rng.integers(0, 8)
        if k == 0:
            images[i, 0, pos, :] += 1.5
        elif k == 1:
            images[i, 0, :, pos] += 1.5
        elif k == 2:
            images[i, 0] += 1.5 * eye
        else:
            images[i, 0] += 1.5 * eye[::-1]
    return images, labels.astype(np.int64)


def test_conv_net_learns_bars_through_the_data_loader():
    rng = np.random.default_rng(1)
    x, y = bars(768, rng)
    frost.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 4))
    opt = SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=32, shuffle=True, drop_last=True,
                        num_workers=2, seed=1)
    for _ in range(6):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert accuracy(model, x[512:], y[512:]) >= 0.9
