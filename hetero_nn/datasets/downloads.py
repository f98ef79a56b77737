"""Downloads: the official sources, their MD5s, and a download that leaves nothing partial.

Every file is fetched from the first mirror that serves it with the published
MD5, written under a temporary name in the target folder and renamed only once
verified (mode 0644, world-readable like any other data file), so an interrupted
or corrupt download leaves nothing. CIFAR-10 comes as ``cifar-10-binary.tar.gz``,
of which only the ``.bin`` and ``.txt`` members are kept.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

from ..errors import ConfigError, HeteroNNError
from .layout import canonical_name, resolve_data_dir


class DownloadError(HeteroNNError, OSError):
    """A download failed: network error on every mirror, or a checksum that does not match."""


_MNIST_FILES = {"train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
                "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
                "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"}
_FASHION_FILES = {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                  "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
                  "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
                  "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"}

#: Per dataset: the folder under the data directory, the mirrors (base URLs, tried in
#: order), the files with their published MD5s, and for archives the members to keep.
SOURCES = {
    "mnist": dict(directory="mnist",
                  mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/",
                           "https://storage.googleapis.com/cvdf-datasets/mnist/"),
                  files=_MNIST_FILES),
    "fashion-mnist": dict(directory="fashion-mnist",
                          mirrors=("http://fashion-mnist.s3-website.eu-central-1"
                                   ".amazonaws.com/",),
                          files=_FASHION_FILES),
    "cifar10": dict(directory="cifar-10",
                    mirrors=("https://www.cs.toronto.edu/~kriz/",),
                    files={"cifar-10-binary.tar.gz": "c32a1d4ab5d03f1284b67883e8d87530"},
                    archive_members=tuple(f"data_batch_{i}.bin" for i in range(1, 6))
                    + ("test_batch.bin", "batches.meta.txt")),
}

#: Mode of every downloaded file: data, world-readable, as ``open`` would make it under umask 022.
FILE_MODE = 0o644
_USER_AGENT = "hetero-nn/0.1 (+python urllib)"
_CHUNK = 1 << 20


def md5sum(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _join(base: str, filename: str) -> str:
    return base + filename if base.endswith("/") else f"{base}/{filename}"


def _temporary(directory: Path, filename: str) -> Path:
    """An empty file beside ``filename``, readable by all (``mkstemp`` would make it 0600)."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=f".{filename}.", suffix=".part")
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return Path(name)


def _fetch(url: str, target: Path, md5: str, timeout: float, progress) -> None:
    """Stream ``url`` into ``target`` and check its MD5; raise ``DownloadError`` if it differs."""
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    digest = hashlib.md5(usedforsecurity=False)
    done = 0
    with urllib.request.urlopen(request, timeout=timeout) as response, open(target, "wb") as out:
        total = response.headers.get("Content-Length")
        total = int(total) if total and total.isdigit() else None
        for chunk in iter(lambda: response.read(_CHUNK), b""):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(url, done, total)
    got = digest.hexdigest()
    if got != md5:
        raise DownloadError(f"MD5 checksum mismatch for {url}: got {got}, expected {md5} "
                            f"({done} bytes received)")


def _download_file(filename, md5, directory, mirrors, timeout, progress) -> Path:
    """Fetch ``filename`` from the first mirror that serves it with the right MD5."""
    failures = []
    for base in mirrors:
        url = _join(base, filename)
        part = _temporary(directory, filename)
        try:
            _fetch(url, part, md5, timeout, progress)
            final = directory / filename
            os.replace(part, final)
            return final
        except DownloadError as exc:
            failures.append(str(exc))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            failures.append(f"{url}: {type(exc).__name__}: {reason}")
        finally:
            part.unlink(missing_ok=True)
    raise DownloadError(
        f"could not download {filename} (MD5 {md5}) into {directory}: "
        + "; ".join(failures)
        + ". Check the network, or fetch the file by hand, check its MD5 and put it there.")


def _extract_members(archive: Path, directory: Path, wanted: Sequence[str]) -> list[Path]:
    """Copy the archive's regular files named in ``wanted`` (by base name) into ``directory``.

    Only base names are used, so no member can write outside ``directory``; links,
    folders and every other member are skipped. Each file is written under a temporary
    name and renamed.
    """
    written = []
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            base = posixpath.basename(member.name)
            if not member.isfile() or base not in wanted:
                continue
            source = tar.extractfile(member)
            part = _temporary(directory, base)
            try:
                with source, open(part, "wb") as out:
                    for chunk in iter(lambda: source.read(_CHUNK), b""):
                        out.write(chunk)
                os.replace(part, directory / base)
            finally:
                part.unlink(missing_ok=True)
            written.append(directory / base)
    return written


def download(name: str, data_dir=None, force: bool = False, *,
             mirrors: Sequence[str] | None = None, timeout: float = 60.0,
             progress: Callable[[str, int, int | None], None] | None = None) -> Path:
    """Download a dataset from its official source into ``<data dir>/<folder>/``.

    Every file is checked against its published MD5, written under a temporary name in
    the target folder and renamed only once verified, so an interrupted or corrupt
    download leaves no partial file. CIFAR-10 comes as ``cifar-10-binary.tar.gz``, of
    which only the ``.bin`` and ``.txt`` members are kept (the archive is deleted).

    Parameters
    ----------
    name : {"mnist", "fashion-mnist", "cifar10"}
    data_dir : path-like, optional
        See :func:`resolve_data_dir`; created if needed.
    force : bool
        Download again even files that are there and verify.
    mirrors : sequence of str, optional
        Base URLs to use instead of the official ones (any scheme urllib opens,
        ``file://`` included), tried in order.
    timeout : float
        Seconds to wait on the network before trying the next mirror.
    progress : callable, optional
        Called as ``progress(url, bytes_done, bytes_total_or_None)`` while fetching.

    Returns
    -------
    pathlib.Path
        The dataset's folder.

    Raises
    ------
    DownloadError
        No mirror served a file with the expected MD5 (network failures and mismatches
        are listed per mirror), or the archive lacks the expected members.
    """
    name = canonical_name(name)
    if name not in SOURCES:
        raise ConfigError(f"{name} is generated, not downloaded; downloadable: "
                          f"{', '.join(SOURCES)}")
    source = SOURCES[name]
    directory = resolve_data_dir(data_dir) / source["directory"]
    directory.mkdir(parents=True, exist_ok=True)
    mirrors = tuple(mirrors) if mirrors else source["mirrors"]
    members = source.get("archive_members")
    if members is not None:
        if not force and all((directory / m).is_file() for m in members):
            return directory
        ((archive_name, md5),) = source["files"].items()
        archive = _download_file(archive_name, md5, directory, mirrors, timeout, progress)
        try:
            written = _extract_members(archive, directory, members)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DownloadError(f"{archive}: cannot extract ({exc})") from exc
        finally:
            archive.unlink(missing_ok=True)
        names = {p.name for p in written}
        if "test_batch.bin" not in names or not names & set(members[:5]):
            raise DownloadError(
                f"{archive_name} held {sorted(names) or 'no'} expected members; expected the "
                f"CIFAR-10 binary version's data_batch_N.bin and test_batch.bin")
        return directory
    for filename, md5 in source["files"].items():
        target = directory / filename
        if not force and target.is_file() and md5sum(target) == md5:
            continue
        _download_file(filename, md5, directory, mirrors, timeout, progress)
    return directory

