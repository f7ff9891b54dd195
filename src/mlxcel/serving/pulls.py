"""Downloads started over HTTP (`POST /models/pull`): each runs on a thread of its own, and its
progress is read by as many event streams as watch it. Off unless --allow-downloads: a server
facing a network should not fetch what a request names."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlxcel.hub.pull import PullCancelled, PullError, PullSpec, Tracker, plan, pull

Status = Literal["running", "done", "failed", "cancelled"]
# How often a watcher looks at a pull's progress.
WATCH_EVERY_S = 0.25


@dataclass
class PullJob:
    """One download: what it fetches, how far it is, and how it ended."""

    id: str
    spec: PullSpec
    tracker: Tracker
    files: int
    status: Status = "running"
    path: Path | None = None
    error: str | None = None
    ended: threading.Event = field(default_factory=threading.Event)

    def state(self) -> dict[str, Any]:
        """What `GET /models/pull/{id}` and each event say of it."""
        progress = self.tracker.progress
        answer: dict[str, Any] = {
            "id": self.id,
            "model": str(self.spec),
            "status": self.status,
            "files": self.files,
            "file": progress.file,
            "done_bytes": progress.done,
            "total_bytes": progress.total,
            "rate_bytes_per_s": round(progress.rate, 1),
            "eta_s": None if progress.eta_s is None else round(progress.eta_s, 1),
        }
        if self.path is not None:
            answer["path"] = str(self.path)
        if self.error is not None:
            answer["error"] = self.error
        return answer


class PullJobs:
    """The server's downloads, by id."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self._cache_dir = cache_dir
        self._jobs: dict[str, PullJob] = {}
        self._ids = itertools.count(1)

    def get(self, job_id: str) -> PullJob | None:
        return self._jobs.get(job_id)

    async def start(self, model: str) -> PullJob:
        """Plan the pull (PullError for a repo that is not there, offline, ...), then start it."""
        spec = PullSpec.parse(model)
        files = await asyncio.to_thread(plan, spec)
        tracker = Tracker(sum(f.size for f in files), None)
        job = PullJob(f"pull-{next(self._ids)}", spec, tracker, len(files))
        self._jobs[job.id] = job

        def run() -> None:
            try:
                job.path = pull(spec, files, tracker, self._cache_dir)
                job.status = "done"
            except PullCancelled:
                job.status = "cancelled"
            except PullError as exc:
                job.status, job.error = "failed", str(exc)
            finally:
                job.ended.set()

        threading.Thread(target=run, name=job.id, daemon=True).start()
        return job

    @staticmethod
    async def events(job: PullJob) -> AsyncIterator[dict[str, Any]]:
        """`progress` events as the bytes come, then one `done`, `failed` or `cancelled`."""
        last = None
        while not job.ended.is_set():
            state = job.state()
            if state != last:
                yield {"type": "progress", **state}
                last = state
            await asyncio.sleep(WATCH_EVERY_S)
        yield {"type": job.status, **job.state()}
