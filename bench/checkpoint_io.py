"""Checkpoint save and load throughput, local disk against S3, and what a step waits.

One run: a 200 MB checkpoint (``--mb``) of float32 tensors, written with slotsweep's
own writer (``write_checkpoint``: the folder's tmp + fsync + rename, or the bucket's
objects + manifest) and read back with ``read_checkpoint`` (``weights_only=True``), to
a local folder and to an S3 server, ``--repeats`` times each (the best is reported).
Without ``--s3-url`` the S3 server is a moto server on 127.0.0.1 started and stopped by
``.ci/s3.sh`` (in memory: it measures the client's and the protocol's cost, not a
network's); with it, that bucket prefix with the credentials of the environment.

What the manifest's digests cost, against a baseline measured in the same run on the
same local folder: a save with slotsweep's writer (digests taken from the bytes as they
are written, the manifest, fsync and rename) against a bare ``torch.save`` of the same
state with an fsync, and a load with ``read_checkpoint`` (every file checked against its
SHA-256 digest first) against a bare ``torch.load(weights_only=True)`` of the same file.

Then the time a training step waits for a save, with rank 0's own writer
(``TrialCheckpoints``) as the managed loop uses it: a loop of steps of ``--step-ms``
of work, a checkpoint saved after every ``--every`` steps (by default enough steps for
twice that storage's measured save time: a write the data allow to overlap has the
time to end before the next save); the wait is the slowest step
with a save minus the median step without one. Measured twice per storage: as saves
are by default (synchronous: the step waits for the whole write, the upload included)
and with ``checkpoint_storage.async_upload`` (the step waits for the state's
serialisation to memory, and for what is left of the previous write when the next save
comes first; the write itself overlaps the steps after it). The loop ends as a trial
does, waiting for the last write; that wait is printed too, and the whole loop's time
beyond its steps' work (a write beside training also slows the steps it overlaps: it
competes for the cores and, in Python, the GIL).

Run:
    .venv/bin/python bench/checkpoint_io.py [--mb 200] [--s3-url s3://bucket/prefix]
Last line (machine-readable):
    local_save_mb_s=<a> local_load_mb_s=<b> s3_save_mb_s=<c> s3_load_mb_s=<d> \
step_wait_local_s=<e> step_wait_s3_s=<f> step_wait_local_async_s=<g> \
step_wait_s3_async_s=<h> save_vs_bare=<i> verified_load_vs_bare=<j> overlap=<yes|no>
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from trials import store_for  # noqa: E402
from trials.checkpoint_storage import join  # noqa: E402
from trials.runtime._checkpoint import (  # noqa: E402
    TrialCheckpoints,
    read_checkpoint,
    write_checkpoint,
)
from trials.runtime._recording import NO_RECORDER  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _moto_bucket() -> Iterator[str]:
    """A bucket on a moto server of this run's own; the server stopped by its PID."""
    folder = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    port = _free_port()
    script = REPO_ROOT / ".ci" / "s3.sh"
    subprocess.run(
        ["bash", str(script), "start", str(folder), str(port)],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    try:
        os.environ.update(
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        )
        import boto3

        boto3.client("s3").create_bucket(Bucket="bench")
        yield "s3://bench/checkpoints"
    finally:
        subprocess.run(["bash", str(script), "stop", str(folder)], check=False)


def _state(mb: int) -> dict[str, torch.Tensor]:
    # Layers of 4 MB each, as a model's might be.
    return {f"layer{i}": torch.randn(1_000_000) for i in range(max(1, mb // 4))}


def _throughput(folder: str, state: dict[str, torch.Tensor], repeats: int) -> tuple[float, float]:
    """Best save and load MB/s of ``state`` under ``folder``."""
    save_s, load_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        location, size = write_checkpoint(folder, str(uuid.uuid4()), state, {"bench": True})
        save_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        read_checkpoint(location)
        load_s.append(time.perf_counter() - start)
        store_for(str(location)).delete(str(location))
    mb = size / 1e6
    return mb / min(save_s), mb / min(load_s)


def _digest_cost(folder: str, state: dict[str, torch.Tensor], repeats: int) -> tuple[float, float]:
    """Slotsweep's save and verified load of ``state`` in ``folder``, each as a ratio to a
    bare ``torch.save`` + fsync and a bare ``torch.load`` of the same bytes (best times)."""
    bare_save, save, bare_load, load = [], [], [], []
    for _ in range(repeats):
        bare = Path(folder) / "bare.pt"
        start = time.perf_counter()
        with open(bare, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        bare_save.append(time.perf_counter() - start)
        start = time.perf_counter()
        location, _ = write_checkpoint(folder, str(uuid.uuid4()), state, {"bench": True})
        save.append(time.perf_counter() - start)
        start = time.perf_counter()
        torch.load(Path(location) / "state.pt", map_location="cpu", weights_only=True)
        bare_load.append(time.perf_counter() - start)
        start = time.perf_counter()
        read_checkpoint(location)
        load.append(time.perf_counter() - start)
        store_for(str(location)).delete(str(location))
        bare.unlink()
    return min(save) / min(bare_save), min(load) / min(bare_load)


def _step_wait(
    folder: str, state: dict[str, torch.Tensor], step_ms: float, every: int, async_upload: bool
) -> tuple[float, float, float]:
    """In seconds: the slowest step that saved minus the median step that did not; the
    wait for the last write at the loop's end; and the whole loop's time (that wait
    included) beyond its steps' median, which also counts steps slowed by a write
    running beside them."""
    writer = TrialCheckpoints(
        folder, experiment_id=0, trial_id=0, recorder=NO_RECORDER, async_upload=async_upload
    )
    a = torch.randn(512, 512)
    plain, saving, written = [], [], []
    for step in range(1, every * 2 + 1):
        start = time.perf_counter()
        deadline = start + step_ms / 1000
        while time.perf_counter() < deadline:  # the step's own work
            a = torch.tanh(a @ a / 512)
        if step % every == 0:
            written.append(
                writer.write(lambda: state, steps_completed=step, epoch=None, metrics={})
            )
            saving.append(time.perf_counter() - start)
        else:
            plain.append(time.perf_counter() - start)
    start = time.perf_counter()
    writer.wait()
    end_wait = time.perf_counter() - start
    typical = statistics.median(plain)
    lost = sum(plain) + sum(saving) + end_wait - typical * (len(plain) + len(saving))
    store = store_for(folder)
    for name in written:
        store.delete(join(folder, name))
    return max(saving) - typical, end_wait, lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument(
        "--every",
        type=int,
        help="steps between saves (default: enough for twice the storage's own save time, "
        "so that a write can end before the next save comes)",
    )
    parser.add_argument("--s3-url", help="an s3:// prefix to use instead of a moto server")
    args = parser.parse_args()

    torch.manual_seed(0)
    state = _state(args.mb)
    print(
        f"checkpoint: {sum(t.numel() * 4 for t in state.values()) / 1e6:.0f} MB "
        f"of float32 in {len(state)} tensors",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="bench-ckpt-") as local,
        contextlib.ExitStack() as stack,
    ):
        s3 = args.s3_url or stack.enter_context(_moto_bucket())
        results: dict[str, float] = {}
        save_ratio, load_ratio = _digest_cost(local, state, args.repeats)
        results["save_vs_bare"], results["verified_load_vs_bare"] = save_ratio, load_ratio
        print(
            f"local digests: a save takes {save_ratio:.2f}x a bare torch.save + fsync, "
            f"a verified load {load_ratio:.2f}x a bare torch.load",
            flush=True,
        )
        for name, folder in (("local", local), ("s3", s3)):
            save, load = _throughput(folder, state, args.repeats)
            results[f"{name}_save_mb_s"], results[f"{name}_load_mb_s"] = save, load
            print(
                f"{name:5s} {folder}: save {save:8.1f} MB/s, load {load:8.1f} MB/s",
                flush=True,
            )
            every = args.every or max(5, math.ceil(2 * (args.mb / save) / (args.step_ms / 1000)))
            for mode, async_upload in (("", False), ("_async", True)):
                wait, end_wait, lost = _step_wait(folder, state, args.step_ms, every, async_upload)
                results[f"step_wait_{name}{mode}_s"] = wait
                print(
                    f"{name:5s} {'async_upload' if async_upload else 'synchronous':12s} "
                    f"(a save every {every} steps): "
                    f"a step that saves waits {wait:6.2f} s longer; "
                    f"the end waits {end_wait:6.2f} s for the last write; "
                    f"the loop took {lost:6.2f} s more than its steps' work",
                    flush=True,
                )
    # Overlap shows as a wait well under the synchronous save's own.
    overlap = "yes" if results["step_wait_s3_async_s"] < 0.5 * results["step_wait_s3_s"] else "no"
    print(
        "a save overlaps training: "
        + (
            "yes, with async_upload (the step waits for the serialisation to memory only)"
            if overlap == "yes"
            else "no: the step waits for the whole write even with async_upload"
        )
    )
    print(
        " ".join(
            f"{key}={results[key]:.2f}"
            for key in (
                "local_save_mb_s",
                "local_load_mb_s",
                "s3_save_mb_s",
                "s3_load_mb_s",
                "step_wait_local_s",
                "step_wait_s3_s",
                "step_wait_local_async_s",
                "step_wait_s3_async_s",
                "save_vs_bare",
                "verified_load_vs_bare",
            )
        )
        + f" overlap={overlap}"
    )


if __name__ == "__main__":
    main()
