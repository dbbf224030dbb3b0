"""Benchmarks run by the `frost bench` command: the seed ResNet on CIFAR-10, timed and checked for accuracy."""
