"""Coarse-grained CPU parallelism for block loops written in PyTorch ops.

A flash-style loop issues thousands of small tensor ops. With PyTorch's intra-op threads each op opens and
closes an OpenMP parallel region, and when the machine is busy (more runnable threads than cores) every such
barrier waits for a descheduled thread: measured on 2 shared cores, the TAPA chunked forward ran 10-25x slower
that way than with the same work split into independent tasks. :func:`run_tasks` instead runs independent
tasks (e.g. query blocks) on worker threads whose ops are single-threaded, so each core works through its own
tasks without barriers; the tensor ops release the GIL.

Workers set their own intra-op thread count to 1 (OpenMP and MKL keep it per thread); PyTorch also records the
value as the process-wide default for threads it has not seen yet, so the caller's value is restored after
every call.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence, TypeVar

import torch

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_key: tuple[int, int] | None = None  # (process id, workers): a forked child builds its own pool


def _single_threaded_worker() -> None:
    torch.get_num_threads()  # runs ATen's once-per-thread setup now, so it cannot later undo the next line
    torch.set_num_threads(1)


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_key
    with _lock:
        key = (os.getpid(), workers)
        if _pool is None or _pool_key != key:
            if _pool is not None and _pool_key[0] == key[0]:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="hf-posenc-cpu", initializer=_single_threaded_worker)
            _pool_key = key
        return _pool


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block's tensor ops on the calling thread only (small work: one core without barriers beats two
    with a barrier per op); the caller's intra-op thread count is restored afterwards."""
    caller_threads = torch.get_num_threads()
    if caller_threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(caller_threads)


def run_tasks(tasks: Sequence[Callable[[], T]], threads: int | None = None) -> list[T]:
    """Run independent tasks and return their results in order.

    threads=None: on the caller's ``torch.get_num_threads()`` single-threaded workers, under the caller's grad
    and inference mode (a single task runs inline with the caller's settings, its ops multi-threaded);
    threads=1: inline, ops single-threaded; threads=n: n workers. Tasks must not write to the same memory; an
    exception in a task is raised here."""
    n = torch.get_num_threads() if threads is None else threads
    if n <= 1:
        with single_threaded():
            return [task() for task in tasks]
    if len(tasks) <= 1:
        return [task() for task in tasks]
    caller_threads = torch.get_num_threads()
    grad_enabled, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def call(task: Callable[[], T]) -> T:
        # grad and inference mode are per thread: carry the caller's over
        with torch.inference_mode(inference), torch.set_grad_enabled(grad_enabled):
            return task()

    try:
        return list(_executor(n).map(call, tasks))
    finally:
        torch.set_num_threads(caller_threads)  # a worker starting up recorded 1 as the process-wide default
