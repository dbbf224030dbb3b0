"""Train the seed CIFAR ResNet with augmentation on worker threads: a complete, short Frost training script.

    python examples/train_cifar.py --data DIR --steps 2000            # CPU
    python examples/train_cifar.py --data DIR --steps 20000 --device cuda

DIR holds CIFAR-10 in any layout frost.data.CIFAR10 reads (or pass --download).
"""
import argparse

import numpy as np
from tqdm import tqdm

import frost
import frost.nn.functional as F
from frost.data import CIFAR10, DataLoader
from frost.data.transforms import Compose, RandomCrop, RandomHorizontalFlip, ToFloat
from frost.models.resnet import cifar_resnet


def main(argv=None) -> float:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="~/.cache/frost/cifar10")
    p.add_argument("--download", action="store_true")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args(argv)

    frost.manual_seed(0)
    augment = Compose([RandomCrop(32, padding=4), RandomHorizontalFlip(), ToFloat()])
    train = CIFAR10(args.data, train=True, download=args.download, transform=augment)
    test = CIFAR10(args.data, train=False)
    loader = DataLoader(train, batch_size=32, shuffle=True, drop_last=True, num_workers=args.workers, seed=0)

    model = cifar_resnet().to(args.device)
    opt = frost.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = frost.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    bar = tqdm(total=args.steps, desc="train")
    step = 0
    while step < args.steps:
        for images, labels in loader:  # images: float32 NHWC in [0, 1], filled by the worker threads
            x = images.permute(0, 3, 1, 2).to(args.device)
            loss = F.cross_entropy(model(x), labels.to(args.device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if step == args.steps:
                break
    bar.close()
    print(f"train loss {loss.item()!r} at step {step}")  # every digit: two runs give the same bits

    model.eval()
    correct = 0
    with frost.no_grad():
        for start in range(0, len(test), 500):
            x = frost.tensor(test.data[start:start + 500].astype(np.float32) / 255).permute(0, 3, 1, 2)
            pred = model(x.to(args.device)).argmax(1).cpu().numpy()
            correct += int((pred == test.targets[start:start + 500]).sum())
    accuracy = correct / len(test)
    print(f"test accuracy {accuracy:.2%} after {args.steps} steps")
    return accuracy


if __name__ == "__main__":
    main()
