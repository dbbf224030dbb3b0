"""Data loading: datasets, the threaded DataLoader, device-resident datasets, and transforms (CPU and GPU)."""
from frost.data.dataset import Dataset, IterableDataset, TensorDataset
from frost.data.loader import DataLoader, DataLoaderTimeoutError, DataLoaderWorkerError, WorkerInfo, get_worker_info
from frost.data.cifar import CIFAR10
from frost.data.folder import ImageFolder, ImageList, decode_image
from frost.data.text import TokenDataset
from frost.data.resident import DeviceDataset
from frost.data import transforms
from frost.data.png_device import DevicePNGList

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "DataLoader", "DataLoaderWorkerError",
           "DataLoaderTimeoutError", "WorkerInfo", "get_worker_info", "CIFAR10", "ImageFolder", "ImageList",
           "decode_image", "TokenDataset", "DeviceDataset", "DevicePNGList", "transforms"]
