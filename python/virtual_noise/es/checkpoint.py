"""Checkpoints that survive crashes: atomic writes, rolling files, clear errors on bad files.

``save_atomic`` writes to a temporary file in the target's directory, flushes and
fsyncs it, renames it over the target (atomic on POSIX filesystems) and fsyncs
the directory, so a crash or ``kill -9`` during a write leaves the previous
checkpoint intact. ``Checkpointer`` keeps the last ``keep`` checkpoints of a run
as ``checkpoint-GGGGGGGG.pt`` (G the generation) and saves every ``every``
generations or ``minutes`` minutes, whichever comes first; ``latest`` finds the
newest one that loads.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
import time

import torch

FORMAT = "virtual_noise.es.checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt or not one of ours (the message says which file)."""


def save_atomic(obj, path) -> None:
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself reaches the disk
    finally:
        os.close(dir_fd)


def wrap(es_state: dict, extra: dict) -> dict:
    return {"format": FORMAT, "version": VERSION, "es": es_state, "extra": extra}


def load_checked(path) -> dict:
    """The checkpoint at ``path``, or CheckpointError saying which file and what is wrong with it."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path}: no such file")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"checkpoint {path}: the file is empty (truncated)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)  # generator states are CPU tensors
    except Exception as e:  # zip/pickle/EOF errors of a truncated or corrupt file
        raise CheckpointError(f"checkpoint {path}: truncated or corrupt ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:120] if str(e) else 'unreadable'})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: not a virtual_noise ES checkpoint (it lacks the format marker "
                              f"{FORMAT!r})")
    if ckpt.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path}: format version {ckpt.get('version')!r}, this virtual_noise reads "
                              f"version {VERSION}")
    return ckpt


_NAME = re.compile(r"checkpoint-(\d+)\.pt$")


class Checkpointer:
    """Rolling checkpoints of a run in ``directory``: every ``every`` generations or ``minutes`` minutes.

    Use ``maybe_save(es, **extra)`` after every generation (it saves when one is due), ``save(es, **extra)``
    to force one, and ``latest()`` / ``ES.load`` to resume. With several ranks only rank 0 writes
    (``ES.save`` waits for it on every rank).
    """

    def __init__(self, directory, every: int = 50, minutes: float | None = 10.0, keep: int = 2):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"Checkpointer: `every` must be a positive int; got {every!r}")
        if keep < 1:
            raise ValueError(f"Checkpointer: `keep` must be >= 1; got {keep!r}")
        self.directory = os.fspath(directory)
        self.every, self.minutes, self.keep = every, minutes, keep
        self._last_time = time.monotonic()

    def path_for(self, generation: int) -> str:
        return os.path.join(self.directory, f"checkpoint-{generation:08d}.pt")

    def due(self, generation: int) -> bool:
        if generation % self.every == 0:
            return True
        return self.minutes is not None and time.monotonic() - self._last_time >= 60 * self.minutes

    def maybe_save(self, es, **extra) -> str | None:
        return self.save(es, **extra) if self.due(es.generation) else None

    def save(self, es, **extra) -> str:
        """Write the checkpoint of this generation; never more than ``keep`` files, at any moment.

        With keep >= 2 the oldest go before the write (keep - 1 complete checkpoints remain while it
        runs); removing them after it, a kill in between left keep + 1. With keep = 1 the one file is
        replaced only once the new one is complete.
        """
        path = self.path_for(es.generation)
        if es.rank == 0 and self.keep >= 2:
            self._prune(self.keep - 1, path)
        es.save(path, **extra)
        self._last_time = time.monotonic()
        if es.rank == 0:
            self._prune(self.keep - 1, path)
        return path

    def _prune(self, keep: int, path: str) -> None:
        """Remove all but the newest ``keep`` checkpoints besides ``path`` (the one being written)."""
        others = [p for p in self.files() if os.path.abspath(p) != os.path.abspath(path)]
        for old in others[:max(0, len(others) - keep)]:
            os.unlink(old)

    def files(self) -> list[str]:
        """This run's checkpoint files, oldest first."""
        found = [(int(_NAME.search(p).group(1)), p)
                 for p in glob.glob(os.path.join(self.directory, "checkpoint-*.pt")) if _NAME.search(p)]
        return [p for _, p in sorted(found)]

    def latest(self) -> tuple[str, list[str]]:
        """(the newest checkpoint that loads, one line per newer file that does not). CheckpointError if none."""
        path, _, skipped = self.newest()
        return path, skipped

    def newest(self) -> tuple[str, dict, list[str]]:
        """As ``latest``, with the loaded checkpoint (for ES.load_state_dict and its ``extra``), read once."""
        skipped = []
        for path in reversed(self.files()):
            try:
                return path, load_checked(path), skipped
            except CheckpointError as e:
                skipped.append(str(e))
        if skipped:
            raise CheckpointError(f"no checkpoint in {self.directory} loads: " + "; ".join(skipped))
        raise CheckpointError(f"no checkpoint in {self.directory} to resume from (checkpoint-*.pt)")
