"""Checkpoint files: where they live, how they are written atomically, how they load.

Layout: ``<checkpoint_storage.path>/<experiment_id>-<key>/<trial_id>/<uuid>/`` (the
experiment's folder: :func:`trials.checkpoint_storage.trial_checkpoint_dir`) holding
``state.pt`` (``torch.save`` of a dict of tensors and plain containers, so it loads
with ``torch.load(weights_only=True)``) and ``metadata.json`` (step, epoch, metrics;
for people and tools that do not load torch). A relative ``checkpoint_storage.path``
is taken relative to the experiment's model directory (the config file's folder),
like the entrypoint.

``checkpoint_storage.path`` may also be an fsspec URL (``s3://bucket/prefix``): the
same layout under it. :mod:`trials.checkpoint_storage` writes the files atomically:
in a folder, a hidden temporary directory renamed into place; on object storage, the
files under the checkpoint's prefix and a manifest written last. A reader never sees a
half-written checkpoint. A write that fails (the disk is full, the folder read-only,
the bucket missing or refusing) removes what it wrote, leaves the checkpoints written
before it untouched, and raises :class:`~trials.checkpoint_storage.CheckpointStorageError`: one line naming the
folder or URL and the storage's reason.

Who writes: rank 0 holds a :class:`TrialCheckpoints`, which writes the files and
records the checkpoint's row; every other rank holds :data:`NO_CHECKPOINTS`, which
writes nothing (the trial's checkpoint is rank 0's state, gathered where it must be).
Callers save on every rank alike; the choice is made once, where the context is built.

With ``checkpoint_storage.async_upload`` rank 0's write overlaps training: the state is
serialised to memory on the training thread (a snapshot), written and recorded on a
background thread, and waited for by the next save and by the trial's end. The
guarantees stay: a checkpoint is recorded only once it is whole (its manifest
written), so a crash never loses a recorded one; it may lose the one being written,
and a restart then continues from the one before.
"""

from __future__ import annotations

import io
import json
import pickle
import random
import re
import uuid as uuid_lib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol

import torch

from trials.checkpoint_storage import CheckpointCorruptedError, FileWriter, store_for
from trials.config import is_url
from trials.entrypoints import InvalidTrialError
from trials.runtime._background import Background
from trials.runtime._recording import Recorder

STATE_FILE = "state.pt"
METADATA_FILE = "metadata.json"
FORMAT_VERSION = 1
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def checkpoint_files(
    state: Mapping[str, Any], metadata: Mapping[str, Any]
) -> dict[str, FileWriter]:
    """The files of a checkpoint of ``state``, each as a writer of its bytes."""

    def write_state(f: IO[bytes]) -> None:
        torch.save(dict(state), f)

    def write_metadata(f: IO[bytes]) -> None:
        f.write(json.dumps(dict(metadata), indent=2, sort_keys=True, default=str).encode())

    return {STATE_FILE: write_state, METADATA_FILE: write_metadata}


def in_memory(files: Mapping[str, FileWriter]) -> dict[str, FileWriter]:
    """``files`` serialised now, as writers of those bytes: a snapshot that stays as it is
    while training goes on changing the tensors it was taken from."""
    snapshot: dict[str, FileWriter] = {}
    for name, write in files.items():
        buffer = io.BytesIO()
        write(buffer)

        def write_bytes(f: IO[bytes], data: io.BytesIO = buffer) -> None:
            f.write(data.getbuffer())

        snapshot[name] = write_bytes
    return snapshot


def write_files(
    directory: Path | str, uuid: str, files: Mapping[str, FileWriter]
) -> tuple[Path | str, int]:
    """Write ``files`` as checkpoint ``uuid`` under ``directory``; ``(location, size_bytes)``.

    The location is a :class:`~pathlib.Path` for a folder, the URL for object storage.
    Raises :class:`~trials.checkpoint_storage.CheckpointStorageError` when the storage
    refuses the write.
    """
    location, size = store_for(directory).write(str(directory), uuid, files)
    return (location if is_url(location) else Path(location)), size


def write_checkpoint(
    directory: Path | str, uuid: str, state: Mapping[str, Any], metadata: Mapping[str, Any]
) -> tuple[Path | str, int]:
    """Write ``state`` as checkpoint ``uuid`` under ``directory`` (see :func:`write_files`)."""
    return write_files(directory, uuid, checkpoint_files(state, metadata))


class CheckpointWriter(Protocol):
    """Where a rank's checkpoints go: rank 0 writes and records them, the others nothing."""

    def write(
        self,
        build_state: Callable[[], Mapping[str, Any]],
        *,
        steps_completed: int,
        epoch: float | None,
        metrics: Mapping[str, float],
    ) -> str | None:
        """Write what ``build_state()`` returns as a new checkpoint; its uuid, if written.

        ``metrics`` are the validation metrics reported at ``steps_completed``.
        """
        ...

    def wait(self) -> None:
        """Wait until the checkpoints written so far are recorded; raise a write's failure."""
        ...


class TrialCheckpoints:
    """Rank 0's writer: the files under the trial's folder, then the row, then garbage.

    The row is recorded once the files are whole. Synchronously by default: once
    :meth:`write` returns, a restart finds the checkpoint. With ``async_upload`` the
    state is serialised to memory in :meth:`write` and the files written and recorded
    on a background thread (:mod:`trials.runtime._background`) while training goes on;
    :meth:`wait`, the next :meth:`write` and the trial's end (the runner) wait for it.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        experiment_id: int,
        trial_id: int,
        recorder: Recorder,
        async_upload: bool = False,
    ) -> None:
        self.directory = directory
        self._experiment_id = experiment_id
        self._trial_id = trial_id
        self._recorder = recorder
        self._background = Background("slotsweep-checkpoint-write") if async_upload else None

    def write(
        self,
        build_state: Callable[[], Mapping[str, Any]],
        *,
        steps_completed: int,
        epoch: float | None,
        metrics: Mapping[str, float],
    ) -> str:
        uuid = str(uuid_lib.uuid4())
        metrics = dict(metrics)
        files = checkpoint_files(
            build_state(),
            {
                "uuid": uuid,
                "trial_id": self._trial_id,
                "experiment_id": self._experiment_id,
                "steps_completed": steps_completed,
                "epoch": epoch,
                "metrics": metrics,
                "format": FORMAT_VERSION,
            },
        )

        def write_and_record(files: Mapping[str, FileWriter]) -> None:
            path, size = write_files(self.directory, uuid, files)
            # Only now: a checkpoint is recorded once its files (its manifest) are whole.
            self._recorder.checkpoint(
                uuid=uuid,
                step=steps_completed,
                epoch=epoch,
                path=path,
                size_bytes=size,
                metrics=metrics,
            )

        if self._background is None:
            write_and_record(files)
            return uuid
        # The previous checkpoint is recorded (or its failure raised here) first: rows go
        # in step order, and one snapshot at a time is held in memory.
        self._background.wait()
        snapshot = in_memory(files)
        self._background.start(lambda: write_and_record(snapshot))
        return uuid

    def wait(self) -> None:
        if self._background is not None:
            self._background.wait()


class NoCheckpoints:
    """The writer of a rank that writes no checkpoint: its state is not built at all.

    Example:
        >>> NO_CHECKPOINTS.write(dict, steps_completed=4, epoch=None, metrics={}) is None
        True
    """

    def write(
        self,
        build_state: Callable[[], Mapping[str, Any]],
        *,
        steps_completed: int,
        epoch: float | None,
        metrics: Mapping[str, float],
    ) -> None:
        return None

    def wait(self) -> None:
        """Nothing was written."""


NO_CHECKPOINTS = NoCheckpoints()


class CheckpointMismatchError(InvalidTrialError):
    """A whole checkpoint that this trial cannot take: not corruption, but code that
    changed since it was written (a model whose shapes changed, a trial that wraps more
    optimizers, state torch refuses to load as weights only).

    Every older checkpoint of the trial would fail alike, so the attempt fails as any
    trial that cannot run as configured does (not restarted), with the cause in one line.
    """


def one_line(error: BaseException) -> str:
    """``error``'s message on one line (torch's errors span several), at most 500 characters.

    Example:
        >>> one_line(RuntimeError("Error(s) in loading state_dict for Linear:\\n\\tsize mismatch"))
        'Error(s) in loading state_dict for Linear: size mismatch'
    """
    # torch colours parts of some messages: the escapes mean nothing in a log or a table.
    text = " ".join(_ANSI_ESCAPE.sub("", str(error)).split()) or type(error).__name__
    return text if len(text) <= 500 else text[:499] + "…"


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint (its folder or URL, or its ``state.pt``) onto the CPU, weights only.

    Every file is first checked against the checkpoint's manifest (sizes and SHA-256
    digests): ``torch.load`` only sees bytes that are the ones written. Raises
    :class:`~trials.checkpoint_storage.CheckpointCorruptedError` for a checkpoint that
    is damaged (a file missing, truncated or altered; or, for one written before
    manifests had digests, bytes torch cannot read), a
    :class:`~trials.checkpoint_storage.CheckpointMissingError` (a ``FileNotFoundError``)
    when nothing is there, and :class:`CheckpointMismatchError` for intact bytes that
    are not a checkpoint this code can load.
    """
    text = str(path)
    suffix = "/" + STATE_FILE
    location = text[: -len(suffix)] if text.endswith(suffix) else text
    source: IO[bytes]
    name = STATE_FILE
    if not is_url(location) and Path(location).is_file():
        # A checkpoint of one file (written by hand, or before checkpoints were folders):
        # no manifest to compare with.
        source, digested = open(location, "rb"), False  # noqa: SIM115 (closed below)
        name = Path(location).name
    else:
        source, digested = store_for(location).open_verified(location, STATE_FILE)
    with source:
        try:
            state = torch.load(source, map_location="cpu", weights_only=True)
        except Exception as error:
            # Bytes that match their digest are the ones written: torch refusing them is
            # about the code (weights only), never about the storage. Without a digest,
            # only the weights-only refusal says so.
            if digested or _refused_as_unsafe(error):
                raise CheckpointMismatchError(
                    f"checkpoint {location}: torch.load(weights_only=True) refuses "
                    f"{name}: {_torch_reason(error)}"
                ) from error
            raise CheckpointCorruptedError(
                location, f"{name} cannot be read by torch.load: {_torch_reason(error)}"
            ) from error
    if not isinstance(state, dict):
        raise CheckpointMismatchError(
            f"checkpoint {location} does not hold a slotsweep checkpoint"
        )
    return state


def _torch_reason(error: BaseException) -> str:
    """What ``torch.load``'s error says went wrong, on one line: its weights-only
    unpickler's reason alone, without the paragraph of advice around it.

    Example:
        >>> _torch_reason(RuntimeError("Weights only load failed. Advice.\\n\\tWeightsUnpickler "
        ...     "error: Unsupported operand 120\\n\\nCheck the documentation"))
        'Weights only load failed: Unsupported operand 120'
    """
    full = " ".join(_ANSI_ESCAPE.sub("", str(error)).split())
    _, marker, reason = full.partition("WeightsUnpickler error: ")
    if not marker:
        return one_line(error)
    reason = reason.split(". ", 1)[0].split(" Check the documentation", 1)[0]
    return one_line(RuntimeError(f"Weights only load failed: {reason.rstrip('.')}"))


def _refused_as_unsafe(error: BaseException) -> bool:
    """Whether ``torch.load(weights_only=True)`` refused a type it read (not a damaged file).

    Its unpickler reports garbage bytes as "Weights only load failed" too ("Unsupported
    operand"); only an unsupported *global* is a type the code saved that it may not load.
    """
    text = str(error)
    return isinstance(error, pickle.UnpicklingError) and "Unsupported global" in text


def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """This process's Python, NumPy, torch (and CUDA) RNG states as weights-only data."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {
            "version": version,
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss,
        },
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch's wheels
        return state
    legacy: Any = np.random.get_state(legacy=True)
    name, keys, pos, has_gauss, cached = legacy
    state["numpy"] = {
        "name": str(name),
        "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return state


def restore_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Set this process's RNGs from :func:`capture_rng_state`'s result."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    if "numpy" in state:
        import numpy as np

        np_state = state["numpy"]
        np.random.set_state(
            (
                np_state["name"],
                np_state["keys"].numpy().astype(np.uint32),
                np_state["pos"],
                np_state["has_gauss"],
                np_state["cached_gaussian"],
            )
        )
