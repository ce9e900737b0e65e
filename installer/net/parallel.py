"""Several independent downloads at once: the first failure cancels the rest."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from installer.base.dataclass import dataclass
from installer.base.errors import UsageError
from installer.net.retry import RetryPolicy
from installer.net.transfer import Cancelled, Downloaded, download

if TYPE_CHECKING:
    from installer.net.session import ArtifactSession

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class DownloadJob:
    """One artifact for :func:`download_all` (the extra fields default as in ``download``)."""

    url: str
    dest: Path
    expected_sha256: str | None = None
    label: str | None = None
    policy: RetryPolicy | None = None
    min_free_bytes: int = 0


def download_all(
    session: ArtifactSession, jobs: Sequence[DownloadJob], *, max_workers: int = 4
) -> list[Downloaded]:
    """Run independent downloads in parallel threads; results in ``jobs`` order.

    The first failure stops the others (queued jobs never start; running ones
    stop at their next chunk or wait, removing their temp files) and is raised.
    """
    jobs = list(jobs)
    if not jobs:
        return []
    _check_distinct(jobs)
    cancel = threading.Event()
    lock = threading.Lock()
    errors: list[BaseException] = []  # errors[0]: the first real failure

    def run(job: DownloadJob) -> Downloaded:
        # Checked here too: a worker freed by the failing job must not start the next one.
        if cancel.is_set():
            raise Cancelled()
        try:
            return download(session, job.url, Path(job.dest),
                            expected_sha256=job.expected_sha256, policy=job.policy,
                            min_free_bytes=job.min_free_bytes, label=job.label, cancel=cancel)
        except Cancelled:
            raise
        except BaseException as exc:
            with lock:
                errors.append(exc)
                cancel.set()  # before this future completes, so nothing new starts
            raise

    workers = max(1, min(max_workers, len(jobs)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="download") as pool:
        futures = [pool.submit(run, job) for job in jobs]
        try:
            for fut in as_completed(futures):
                if fut.exception() is not None:
                    break
        except BaseException as exc:  # e.g. KeyboardInterrupt in the waiting thread
            with lock:
                errors.insert(0, exc)
                cancel.set()
        if cancel.is_set():
            for fut in futures:
                fut.cancel()
            log.warning(
                "download_all_cancelled",
                failed=type(errors[0]).__name__ if errors else None,
                pending=sum(1 for f in futures if not f.done()),
            )
    if errors:
        raise errors[0]
    return [fut.result() for fut in futures]


def _check_distinct(jobs: Sequence[DownloadJob]) -> None:
    """Two jobs writing one file would race on its temp file: a caller's bug, refused."""
    dests = [Path(j.dest).resolve() for j in jobs]
    if len(set(dests)) != len(dests):
        raise UsageError(
            "two downloads target the same file",
            path=str(next(d for d in dests if dests.count(d) > 1)),
        )
