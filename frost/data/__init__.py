"""Data loading: datasets, the DataLoader (worker threads or processes), device-resident datasets, transforms."""
from frost.data.dataset import (ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, is_iterable_dataset,
                                 random_split)
from frost.data.loader import DataLoader, DataLoaderTimeoutError, DataLoaderWorkerError, WorkerInfo, get_worker_info
from frost.data.cifar import CIFAR10
from frost.data.folder import ImageFolder, ImageList, decode_image
from frost.data.text import TokenDataset
from frost.data.resident import DeviceDataset
from frost.data import transforms
from frost.data.png_device import DevicePNGList
from frost.data.jpeg_device import DeviceJPEGList
from frost.data.distributed import DistributedSampler
from frost.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "Subset", "ConcatDataset", "random_split",
           "is_iterable_dataset", "DataLoader", "DataLoaderWorkerError",
           "DataLoaderTimeoutError", "WorkerInfo", "get_worker_info", "CIFAR10", "ImageFolder", "ImageList",
           "decode_image", "TokenDataset", "DeviceDataset", "DevicePNGList", "DeviceJPEGList", "DistributedSampler",
           "transforms", "Sampler", "SequentialSampler", "RandomSampler", "BatchSampler"]
