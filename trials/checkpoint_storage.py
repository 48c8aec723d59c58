"""Where checkpoint files live: a local (or shared) folder, or any fsspec URL.

``checkpoint_storage.path`` is either a path (a folder every rank 0 can write) or a URL
such as ``s3://bucket/prefix``, ``gs://...`` or ``az://...`` (any protocol fsspec has
installed: ``pip install 'slotsweep[s3]'``, ``[gcs]``, ``[azure]``). Every part that
touches checkpoint files (save, load and restore, retention, the UI's download) goes
through :func:`store_for`, which picks one of the two stores behind one interface.

What is atomic:

- :class:`LocalStore` writes a checkpoint into a hidden ``.tmp-<uuid>`` folder beside
  its final place, fsyncs it and renames it into place: the folder appears whole or not
  at all.
- :class:`ObjectStore` cannot rename (object stores copy), so a checkpoint's prefix
  ``<uuid>/`` is temporary until its manifest ``MANIFEST.json`` is written last. A
  reader ignores a prefix without a manifest, or whose files do not match it;
  retention's garbage collection deletes such half-written prefixes.

What is verified: both stores write a manifest, ``MANIFEST.json``, naming every file of
the checkpoint with its size and its SHA-256 digest (computed from the bytes as they are
written, so it costs no second read), before the checkpoint counts as complete (before
the rename, or as the last object). :meth:`CheckpointStore.open_verified` checks every
file against it before a file is handed to ``torch.load``: a file that is missing,
truncated or altered since (a full disk, a torn write on a network filesystem, an
object half-uploaded or deleted) raises :class:`CheckpointCorruptedError`, which a
restore answers by falling back to an older checkpoint. A checkpoint written before
manifests had digests (a folder without ``MANIFEST.json``, a bucket manifest of sizes
only) is checked as far as what it records goes.

Credentials come only from where the provider's library looks itself (for S3:
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``,
``~/.aws/credentials``, instance roles; ``AWS_ENDPOINT_URL`` for an S3-compatible
server). A URL carrying credentials (``s3://key:secret@bucket``) is refused by the
config, so none reaches the database, a log or a command line.

Example:
    >>> is_url("s3://bucket/ckpt"), is_url("/shared/ckpt"), join("s3://b/p", "3", "7")
    (True, False, 's3://b/p/3/7')
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from trials.config import ExperimentConfig, is_url

MANIFEST_FILE = "MANIFEST.json"
TMP_PREFIX = ".tmp-"
# Object stores whose directories are only key prefixes: making one would create a
# bucket (s3fs does), which must fail instead when the bucket does not exist.
_PREFIX_ONLY = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})

FileWriter = Callable[[IO[bytes]], None]
"""Writes one file's bytes to the open binary file it is given."""


class CheckpointStorageError(Exception):
    """A checkpoint could not be written to ``checkpoint_storage.path``."""


class CheckpointCorruptedError(Exception):
    """A recorded checkpoint that is not as it was written: a file missing, truncated or
    altered (it fails its manifest), or bytes ``torch.load`` cannot read.

    ``problem`` says what, in one line that names the file ("state.pt: 64 bytes, its
    manifest says 6221"); the message adds the checkpoint's location.

    Example:
        >>> str(CheckpointCorruptedError("/ckpt/7/3f2a", "state.pt is missing"))
        'checkpoint /ckpt/7/3f2a: state.pt is missing'
    """

    def __init__(self, location: str, problem: str) -> None:
        super().__init__(f"checkpoint {location}: {problem}")
        self.location = location
        self.problem = problem


class CheckpointMissingError(CheckpointCorruptedError, FileNotFoundError):
    """No checkpoint is at a location: nothing at all (its folder or objects are gone), or,
    in a bucket, objects without a manifest (an upload never finished, or the manifest
    was deleted since).

    Example:
        >>> str(CheckpointMissingError("/ckpt/7/3f2a"))
        'no checkpoint at /ckpt/7/3f2a'
    """

    def __init__(
        self, location: str, problem: str = "its files are gone (nothing is at its location)"
    ) -> None:
        super().__init__(location, problem)
        self.args = (f"no checkpoint at {location}",)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Manifest:
    """What ``MANIFEST.json`` records of a checkpoint: each file's size and SHA-256 digest.

    ``digests`` is empty for a manifest written before digests were recorded.

    Example:
        >>> m = Manifest.parse(Manifest({"a": 3}, {"a": "ab"}).to_bytes())
        >>> m.sizes, m.digests
        ({'a': 3}, {'a': 'ab'})
    """

    sizes: dict[str, int]
    digests: dict[str, str]

    def to_bytes(self) -> bytes:
        return json.dumps({"files": self.sizes, "sha256": self.digests}, sort_keys=True).encode()

    @classmethod
    def parse(cls, raw: bytes) -> Manifest | None:
        """The manifest in ``raw``; None when it is not one (not JSON, not the shape)."""
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        files = data.get("files") if isinstance(data, dict) else None
        digests = data.get("sha256", {}) if isinstance(data, dict) else None
        if not isinstance(files, dict) or not isinstance(digests, dict):
            return None
        return cls(
            {str(k): v for k, v in files.items()}, {str(k): str(v) for k, v in digests.items()}
        )

    def check(self, name: str, size: int, digest: str | None) -> str | None:
        """What is wrong with file ``name`` of ``size`` bytes (and ``digest``, if computed)
        by this manifest; None when it matches."""
        if name not in self.sizes:
            return f"{name} is not in its manifest"
        if size != self.sizes[name]:
            return f"{name}: {size} bytes, its manifest says {self.sizes[name]}"
        expected = self.digests.get(name)
        if digest is not None and expected is not None and digest != expected:
            return f"{name}: its SHA-256 digest differs from its manifest's"
        return None


class _DigestingFile:
    """A binary file being written that counts its bytes and digests them as they pass.

    What a checkpoint's manifest records is computed from the bytes written, without
    reading the file back.
    """

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self.size += view.nbytes
        self._f.write(view)
        return view.nbytes

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self.size

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _write_digested(f: IO[bytes], write: FileWriter) -> tuple[int, str]:
    """Run ``write`` on ``f``; the size and SHA-256 digest of what it wrote."""
    digesting = _DigestingFile(f)
    write(digesting)  # type: ignore[arg-type]
    return digesting.size, digesting.hexdigest()


_CHUNK = 1 << 20


def _digest_stream(f: IO[bytes]) -> tuple[int, str]:
    """The size and SHA-256 digest of what is left to read in ``f``."""
    digest = hashlib.sha256()
    size = 0
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


#: What the object stores' libraries read their credentials and endpoints from in the
#: environment (S3's ``AWS_*``, GCS's ``GOOGLE_*``, Azure's ``AZURE_*``).
STORAGE_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_")


def storage_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that object stores read credentials and endpoints from.

    For an executor whose ranks do not start with the driver's environment (Ray's
    actors start with their node's): passed on, they make a bucket work there as it
    does locally and on Slurm.

    Example:
        >>> storage_environment({"AWS_ENDPOINT_URL": "http://s3:9000", "HOME": "/root"})
        {'AWS_ENDPOINT_URL': 'http://s3:9000'}
    """
    return {
        name: value for name, value in environ.items() if name.startswith(STORAGE_ENV_PREFIXES)
    }


def join(base: str, *parts: str) -> str:
    """``base`` with ``parts`` appended, as a URL or a path."""
    if is_url(base):
        return "/".join([base.rstrip("/"), *parts])
    return str(Path(base).joinpath(*parts))


def trial_checkpoint_dir(
    storage_path: str, model_dir: str, experiment_folder: str, trial_id: int
) -> Path | str:
    """The folder (or, for a URL, the prefix) holding one trial's checkpoints.

    Layout: ``<checkpoint_storage.path>/<experiment_folder>/<trial_id>/``, where
    ``experiment_folder`` is the experiment's own (``storage.Experiment.checkpoint_folder``:
    ``<experiment id>-<random key>``, or ``<experiment id>`` for an experiment created
    before the key existed); a relative ``storage_path`` is taken relative to the
    experiment's model directory. Every part that needs a trial's folder (the runtime's
    save, retention) computes it here.

    Example:
        >>> str(trial_checkpoint_dir("ckpt", "/exp", "3-5f0c2a9e41b7", 7))
        '/exp/ckpt/3-5f0c2a9e41b7/7'
        >>> trial_checkpoint_dir("s3://bucket/ckpt", "/exp", "3-5f0c2a9e41b7", 7)
        's3://bucket/ckpt/3-5f0c2a9e41b7/7'
    """
    if is_url(storage_path):
        return join(storage_path, experiment_folder, str(trial_id))
    base = Path(os.path.expanduser(storage_path))
    if not base.is_absolute():
        base = Path(model_dir) / base
    return base / experiment_folder / str(trial_id)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore(Protocol):
    """The operations on checkpoint files, the same for a folder and a bucket.

    A checkpoint is addressed by its location (a folder path or a URL prefix) and holds
    named files.
    """

    def write(self, directory: str, uuid: str, files: Mapping[str, FileWriter]) -> tuple[str, int]:
        """Write checkpoint ``uuid`` under ``directory`` atomically; ``(location, bytes)``.

        Raises :class:`CheckpointStorageError` (one line: the location and the storage's
        reason) when the storage refuses the write; the checkpoints written before stay.
        """
        ...

    def is_complete(self, location: str) -> bool:
        """Whether a whole checkpoint is at ``location`` (a reader may load it)."""
        ...

    def read(self, location: str, name: str) -> IO[bytes]:
        """File ``name`` of the complete checkpoint at ``location``, opened for reading.

        Raises :class:`FileNotFoundError` when no complete checkpoint is there.
        """
        ...

    def names(self, location: str) -> list[str]:
        """The files of the complete checkpoint at ``location``, sorted (its manifest,
        which is the store's bookkeeping, not among them)."""
        ...

    def open_verified(self, location: str, name: str) -> tuple[IO[bytes], bool]:
        """File ``name`` of the checkpoint at ``location``, opened for reading, once every
        file its manifest names matched its size and digest; and whether digests were
        compared (a checkpoint written before manifests had digests has none).

        Raises :class:`CheckpointCorruptedError` naming the first file that does not
        match (:class:`CheckpointMissingError` when nothing is at ``location``).
        """
        ...

    def verify(self, location: str) -> None:
        """Check every file of the checkpoint at ``location`` against its manifest.

        Raises :class:`CheckpointCorruptedError` as :meth:`open_verified` does.
        """
        ...

    def delete(self, location: str) -> None:
        """Remove the checkpoint at ``location``; one that is gone already is fine."""
        ...

    def incomplete(self, directory: str) -> list[str]:
        """Locations under ``directory`` of checkpoints a crash left half-written."""
        ...

    def whole(self, directory: str) -> list[str]:
        """Locations under ``directory`` of checkpoints whose write finished, sorted.

        Finished means renamed into place, or its manifest written: whether a row
        records it is the database's to say (a crash may come between the two).
        """
        ...


class LocalStore:
    """Checkpoints in a folder: written to ``.tmp-<uuid>``, fsynced, renamed into place."""

    def write(self, directory: str, uuid: str, files: Mapping[str, FileWriter]) -> tuple[str, int]:
        try:
            return self._write(Path(directory), uuid, files)
        except (OSError, RuntimeError) as error:
            cause = _os_error(error)
            if cause is None:
                raise
            reason = cause.strerror or str(cause)
            raise CheckpointStorageError(
                f"checkpoint_storage.path {directory}: {reason}"
            ) from error

    @staticmethod
    def _write(directory: Path, uuid: str, files: Mapping[str, FileWriter]) -> tuple[str, int]:
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / uuid
        tmp = directory / f"{TMP_PREFIX}{uuid}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            sizes: dict[str, int] = {}
            digests: dict[str, str] = {}
            for name, write in files.items():
                with open(tmp / name, "wb") as f:
                    sizes[name], digests[name] = _write_digested(f, write)
                    f.flush()
                    os.fsync(f.fileno())
            # Inside the temporary folder: the rename makes it part of the whole.
            with open(tmp / MANIFEST_FILE, "wb") as f:
                f.write(Manifest(sizes, digests).to_bytes())
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            os.rename(tmp, final)
            _fsync_dir(directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        size = sum(p.stat().st_size for p in final.iterdir() if p.is_file())
        return str(final), size

    def is_complete(self, location: str) -> bool:
        return Path(location).exists()

    def read(self, location: str, name: str) -> IO[bytes]:
        return open(Path(location) / name, "rb")

    def names(self, location: str) -> list[str]:
        root = Path(location)
        manifest = root / MANIFEST_FILE
        return sorted(
            str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p != manifest
        )

    def open_verified(self, location: str, name: str) -> tuple[IO[bytes], bool]:
        manifest = self._verified_manifest(location)
        root = Path(location)
        if manifest is None:
            # Written before folders had manifests: nothing to compare with.
            if not (root / name).is_file():
                raise CheckpointCorruptedError(location, f"{name} is missing")
            return open(root / name, "rb"), False
        if name not in manifest.sizes:
            raise CheckpointCorruptedError(location, f"{name} is not in its manifest")
        return open(root / name, "rb"), bool(manifest.digests)

    def verify(self, location: str) -> None:
        self._verified_manifest(location)

    @staticmethod
    def _verified_manifest(location: str) -> Manifest | None:
        """The manifest of the checkpoint at ``location`` once every file matched it;
        None for a folder written before manifests existed."""
        root = Path(location)
        if not root.is_dir():
            raise CheckpointMissingError(location)
        manifest_path = root / MANIFEST_FILE
        if not manifest_path.exists():
            return None
        manifest = Manifest.parse(manifest_path.read_bytes())
        if manifest is None:
            raise CheckpointCorruptedError(location, f"{MANIFEST_FILE} cannot be read")
        # Sizes first (one stat each), then the digests (a read of every byte).
        for file in sorted(manifest.sizes):
            try:
                size = (root / file).stat().st_size
            except FileNotFoundError:
                raise CheckpointCorruptedError(
                    location, f"{file} is missing (its manifest names it)"
                ) from None
            problem = manifest.check(file, size, None)
            if problem is not None:
                raise CheckpointCorruptedError(location, problem)
        for file in sorted(manifest.digests):
            with open(root / file, "rb") as f:
                size, digest = _digest_stream(f)
            problem = manifest.check(file, size, digest)
            if problem is not None:
                raise CheckpointCorruptedError(location, problem)
        return manifest

    def delete(self, location: str) -> None:
        shutil.rmtree(location, ignore_errors=True)

    def incomplete(self, directory: str) -> list[str]:
        folder = Path(directory)
        if not folder.is_dir():
            return []
        return sorted(str(p) for p in folder.iterdir() if p.name.startswith(TMP_PREFIX))

    def whole(self, directory: str) -> list[str]:
        folder = Path(directory)
        if not folder.is_dir():
            return []
        return sorted(
            str(p) for p in folder.iterdir() if p.is_dir() and not p.name.startswith(TMP_PREFIX)
        )


class ObjectStore:
    """Checkpoints behind an fsspec URL: the files under ``<uuid>/``, the manifest last.

    The file system object comes from fsspec (``url_to_fs``), configured only by the
    provider's own environment and config files.
    """

    def __init__(self, url: str) -> None:
        import fsspec.core

        self.protocol = url.split("://", 1)[0]
        self.fs: Any
        self.fs, _ = fsspec.core.url_to_fs(url)

    def _key(self, location: str) -> str:
        return str(self.fs._strip_protocol(location))

    def write(self, directory: str, uuid: str, files: Mapping[str, FileWriter]) -> tuple[str, int]:
        location = join(directory, uuid)
        try:
            if self.protocol not in _PREFIX_ONLY:
                self.fs.makedirs(self._key(location), exist_ok=True)
            sizes: dict[str, int] = {}
            digests: dict[str, str] = {}
            for name, write in files.items():
                with self.fs.open(self._key(join(location, name)), "wb") as f:
                    sizes[name], digests[name] = _write_digested(f, write)
            manifest = Manifest(sizes, digests).to_bytes()
            # Written last: until it exists, the prefix is a temporary nobody reads.
            self.fs.pipe_file(self._key(join(location, MANIFEST_FILE)), manifest)
        except Exception as error:
            self.delete(location)
            reason = " ".join(str(error).split()) or type(error).__name__
            raise CheckpointStorageError(
                f"checkpoint_storage.path {directory}: {reason}"
            ) from error
        return location, sum(sizes.values())

    def _manifest(self, location: str) -> dict[str, int] | None:
        manifest = self._read_manifest(location)
        return None if manifest is None else manifest.sizes

    def _read_manifest(self, location: str) -> Manifest | None:
        try:
            raw = self.fs.cat_file(self._key(join(location, MANIFEST_FILE)))
        except FileNotFoundError:
            return None
        return Manifest.parse(raw)

    def is_complete(self, location: str) -> bool:
        files = self._manifest(location)
        if files is None:
            return False
        try:
            listed = {
                entry["name"].rsplit("/", 1)[-1]: entry.get("size")
                for entry in self.fs.ls(self._key(location), detail=True, refresh=True)
            }
        except FileNotFoundError:
            return False
        return all(listed.get(name) == size for name, size in files.items())

    def read(self, location: str, name: str) -> IO[bytes]:
        files = self._manifest(location)
        if files is None or name not in files:
            raise FileNotFoundError(f"no complete checkpoint at {location}")
        return io.BytesIO(self.fs.cat_file(self._key(join(location, name))))

    def names(self, location: str) -> list[str]:
        return sorted(self._manifest(location) or {})

    def open_verified(self, location: str, name: str) -> tuple[IO[bytes], bool]:
        manifest, kept = self._verified(location, keep=name)
        if kept is None:
            raise CheckpointCorruptedError(location, f"{name} is not in its manifest")
        return io.BytesIO(kept), bool(manifest.digests)

    def verify(self, location: str) -> None:
        self._verified(location, keep=None)

    def _verified(self, location: str, *, keep: str | None) -> tuple[Manifest, bytes | None]:
        """The checkpoint's manifest once every file matched it, and file ``keep``'s bytes.

        One download per file: the file asked for is checked and kept, not read twice.
        """
        manifest = self._read_manifest(location)
        if manifest is None:
            try:
                anything = bool(self.fs.ls(self._key(location), detail=False, refresh=True))
            except FileNotFoundError:
                anything = False
            if not anything:
                raise CheckpointMissingError(location)
            # Never written whole (a killed upload), or its manifest was deleted since.
            raise CheckpointMissingError(location, f"{MANIFEST_FILE} is missing or unreadable")
        kept: bytes | None = None
        for file in sorted(manifest.sizes):
            try:
                data = self.fs.cat_file(self._key(join(location, file)))
            except FileNotFoundError:
                raise CheckpointCorruptedError(
                    location, f"{file} is missing (its manifest names it)"
                ) from None
            digest = hashlib.sha256(data).hexdigest() if file in manifest.digests else None
            problem = manifest.check(file, len(data), digest)
            if problem is not None:
                raise CheckpointCorruptedError(location, problem)
            if file == keep:
                kept = data
        return manifest, kept

    def delete(self, location: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._key(location), recursive=True)

    def incomplete(self, directory: str) -> list[str]:
        return sorted(p for p in self._prefixes(directory) if self._manifest(p) is None)

    def whole(self, directory: str) -> list[str]:
        return sorted(p for p in self._prefixes(directory) if self._manifest(p) is not None)

    def _prefixes(self, directory: str) -> list[str]:
        try:
            entries = self.fs.ls(self._key(directory), detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return [join(directory, str(e).rstrip("/").rsplit("/", 1)[-1]) for e in entries]


def _os_error(error: BaseException) -> OSError | None:
    # torch.save reports a failed write as a RuntimeError whose context is the OSError.
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


_LOCAL = LocalStore()


def store_for(location: str | Path) -> CheckpointStore:
    """The store holding ``location``: :class:`ObjectStore` for a URL, else the local one."""
    text = str(location)
    return ObjectStore(text) if is_url(text) else _LOCAL


def checkpoint_root(config: ExperimentConfig, model_dir: Path) -> Path | str:
    """Where the experiment's checkpoints go: the configured path, relative to ``model_dir``.

    A URL (``s3://bucket/prefix``) is taken as it is.

    Example:
        >>> checkpoint_root(config, Path("/models/digits"))
        PosixPath('/models/digits/checkpoints')
    """
    if is_url(config.checkpoint_storage.path):
        return config.checkpoint_storage.path
    path = Path(config.checkpoint_storage.path)
    return path if path.is_absolute() else (model_dir / path).resolve()
