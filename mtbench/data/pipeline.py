"""data.loader=dataloader: a torch DataLoader over a set's files with its usual training transforms, each step's
data wait, and what the pipeline costs (the workers' CPU, the bytes read, the storage the files are on).

Each epoch reads the set from its files again (unless data.persistent_workers keeps the workers and what they
read) and shuffles it. CIFAR-10 images go through the usual training transforms in the loader's workers (or in the
training process with data.workers=0): a random 32x32 crop of the image padded by 4, a horizontal flip half of the
time, then normalization by the training set's per-channel mean and std. Text sets are tokenized, encoded and padded
per batch by the workload's BatchRecipe, in the workers too. `Pipeline.next_batch` returns a batch and the seconds
the caller blocked for it: the step's data wait.
"""
from __future__ import annotations

import signal
import time
from typing import Any, Callable, List, Optional, Tuple

import torch

from mtbench.data import storage
from mtbench.data.base import IMAGES, BatchRecipe, DataSource, LoaderSettings, PipelineSet
from mtbench.data.meter import LoaderMeter
from mtbench.data.sets import CifarFiles, cifar_train_transform, image_set
from mtbench.errors import DataError, UsageError

__all__ = ["CifarFiles", "Pipeline", "cifar_train_transform", "open_pipeline"]


class Pipeline:
    """A DataLoader over a set's files, one epoch after another; `close()` ends its workers.

    `root` alone reads CIFAR-10 images from root/cifar-10-batches-py/; `dataset` (a factory) reads any set, whose
    items `collate` turns into a batch."""

    def __init__(self, root: str, settings: LoaderSettings, batch_size: int, seed: int, image_size: int = 32,
                 pin_memory: bool = False, dataset: Optional[Callable[[], torch.utils.data.Dataset]] = None,
                 collate: Optional[Callable[[List[Any]], Any]] = None, transforms: Optional[str] = None,
                 files: Optional[List[str]] = None) -> None:
        self.settings = settings
        self.root = root  # the folder or file read (the cache's, for data=synthetic)
        self.batch_size = batch_size
        self.pin_memory = pin_memory  # pinned only where a GPU trains: pinning for the CPU is wasted work
        self.collate = collate
        if dataset is None:
            images = image_set(root, *cifar_train_transform(image_size))
            dataset, transforms, files = images.make_dataset, images.transforms, images.files
        self.make_dataset = dataset
        self.transforms_module = transforms or "the data set's own"
        self.files = list(files or [])
        self.generator = torch.Generator().manual_seed(seed)  # each epoch's order, and the workers' seeds
        self.loader: Optional[torch.utils.data.DataLoader] = None
        self.iterator: Any = None
        self.epochs = 0  # epochs begun
        self.cache = {"cache": settings.cache}  # data.cache, and what a cold start did
        if settings.cache != "warm":
            self.cache.update(storage.make_cold(self.files, settings.cache))
        self.storage = storage.storage_of(self.files[0]) if self.files else None
        disk = (self.storage or {}).get("device") or {}
        self._sectors = storage.device_sectors_read(disk["name"]) if disk else None
        self.meter = LoaderMeter(settings.workers)  # after the cache drop, before the first epoch reads

    def _worker_pids(self) -> List[int]:
        # the live iterator's worker processes (torch keeps them in _workers, 2.0 to 2.14); none without workers
        return [w.pid for w in getattr(self.iterator, "_workers", None) or [] if w.pid is not None]

    def _new_epoch(self) -> None:
        if self.loader is None or not self.settings.persistent_workers:
            self._end_workers()
            dataset = self.make_dataset()  # the files are read again: each epoch reads the set as training does
            if len(dataset) < self.batch_size:
                raise DataError(f"the data set holds {len(dataset)} items, fewer than one batch of {self.batch_size}")
            workers = self.settings.workers
            # prefetch_factor only with workers: torch < 2.0 refuses any value (None included) without them
            prefetch = {"prefetch_factor": self.settings.prefetch_factor} if workers else {}
            self.loader = torch.utils.data.DataLoader(
                dataset, batch_size=self.batch_size, shuffle=True, drop_last=True, num_workers=workers,
                pin_memory=self.pin_memory, generator=self.generator, collate_fn=self.collate,
                persistent_workers=self.settings.persistent_workers and workers > 0, **prefetch)
        else:
            self.meter.read_workers(self._worker_pids())
        self.iterator = iter(self.loader)
        self.epochs += 1

    def next_batch(self) -> Tuple[Any, float]:
        """The next batch, starting a new epoch where one ended, and the seconds this call blocked for it."""
        start = time.monotonic()
        if not self.meter.marks:
            self.meter.mark(True, [])  # the window's start where no warm-up step ended before
        if self.iterator is None:
            self._new_epoch()
        try:
            try:
                batch = next(self.iterator)
            except StopIteration:
                self._new_epoch()
                batch = next(self.iterator)
        except (ConnectionError, EOFError) as exc:  # a worker killed while it sent a batch: torch's own error or this
            raise RuntimeError(f"DataLoader worker ended while sending a batch ({type(exc).__name__}: {exc})"
                               f"{self._dead_workers_ended()}") from None
        except RuntimeError as exc:  # torch's "DataLoader worker (pid(s) N) exited unexpectedly": name the signal
            if "DataLoader worker" not in str(exc):
                raise
            raise RuntimeError(f"{exc}{self._dead_workers_ended()}") from None
        wait_s = time.monotonic() - start
        self.meter.read_workers(self._worker_pids())
        return batch, wait_s

    def _dead_workers_ended(self) -> str:
        """How the dead workers ended, after the loader's workers are shut down: torch's SIGCHLD handler raises
        anew at any later signal while a failed worker is still registered (in the job's failure handling, say)."""
        deaths = self._deaths()
        try:
            self._end_workers()
        except Exception:  # noqa: BLE001 - the worker's death is the error to report
            pass
        return deaths

    def _deaths(self) -> str:
        """How the loader's workers that died ended (" (worker pid N killed by SIGKILL)"), or ""."""
        said = []
        for worker in getattr(self.iterator, "_workers", None) or []:
            code = worker.exitcode
            if code is not None and code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = f"signal {-code}"
                said.append(f"worker pid {worker.pid} killed by {name}")
            elif code:
                said.append(f"worker pid {worker.pid} exited with status {code}")
        return f" ({'; '.join(said)})" if said else ""

    def step_ended(self, warmup: bool) -> None:
        """The job's step ended: a reading of the workers' and the training process's CPU."""
        self.meter.mark(warmup, self._worker_pids())

    def describe(self) -> dict:
        """What summary.json records of the pipeline."""
        s = self.settings
        disk = (self.storage or {}).get("device") or {}
        sectors = storage.device_sectors_read(disk["name"]) if disk else None
        return {"loader": s.loader, "root": self.root, "workers": s.workers, "pin_memory": self.pin_memory,
                "prefetch_factor": s.prefetch_factor if s.workers else None,
                "persistent_workers": s.persistent_workers and s.workers > 0,
                "transforms": self.transforms_module, "epochs": self.epochs, **self.cache,
                "storage": self.storage,
                "device_bytes_read": None if sectors is None or self._sectors is None else 512 * (sectors - self._sectors),
                **self.meter.figures(self._worker_pids(), storage.files_bytes(self.files))}

    def _end_workers(self) -> None:
        # the iterator owns the worker processes: ending it joins them (torch's own shutdown, as its __del__ does)
        self.meter.read_workers(self._worker_pids())  # what each used up to now, before it is gone
        shutdown = getattr(self.iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self.iterator = None

    def close(self) -> None:
        """End the loader's workers (persistent ones too); the job calls it whatever ended the job."""
        self._end_workers()
        self.loader = None


def open_pipeline(data: DataSource, batch_size: int, seed: int, device: torch.device,
                  recipe: Optional[BatchRecipe]) -> Optional[Pipeline]:
    """The pipeline data.loader=dataloader asks for, or None for data.loader=preloaded (batches made before timing);
    a model that trains only on batches it prepares (recipe None) is refused in one line."""
    settings = data.loader_settings
    if settings.loader != "dataloader":
        if settings.cache != "warm":  # preloaded reads its files before timing: a cold page cache changes no figure
            raise UsageError(f"data.cache={settings.cache}: only data.loader=dataloader reads files while the job is "
                             "measured; allowed: data.cache=warm, or data.loader=dataloader")
        return None
    if recipe is None:
        raise UsageError("data.loader=dataloader: this model trains only on the batches it prepares (an Atari "
                         "environment has no files to load); allowed: data.loader=preloaded")
    found: PipelineSet = data.pipeline_set(recipe, settings.cache_dir)
    return Pipeline(found.location, settings, batch_size, seed, pin_memory=settings.pin_memory and device.type == "cuda",
                    dataset=found.make_dataset, collate=recipe.collate, transforms=found.transforms, files=found.files)


IMAGE_RECIPE = BatchRecipe(IMAGES)  # CIFAR-10 images and labels, stacked by torch's default collate
