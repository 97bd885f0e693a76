"""Rung 0 of the ladder: the data is there, deterministic, balanced and decodes correctly."""

from __future__ import annotations

import contextlib
import multiprocessing
import struct
import zlib
from collections import Counter
from pathlib import Path

import pytest
import torch

from product_classifier import data

SMALL = {"train": 10, "val": 5, "test": 5}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.png"))}


@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (64, 64), (3, 40)])
def test_png_round_trip(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (*shape, 3), dtype=torch.uint8, generator=gen)
    assert torch.equal(data.decode_png(data.encode_png(pixels)), pixels)


def _filtered_png(pixels: torch.Tensor) -> bytes:
    """A PNG whose rows cycle through filters 0-4, as other encoders write them."""
    height, width, _ = pixels.shape
    rows = [list(r) for r in pixels.reshape(height, width * 3).tolist()]
    raw = bytearray()
    prev = [0] * (width * 3)
    for y, row in enumerate(rows):
        kind = y % 5
        out = []
        for i, value in enumerate(row):
            left = row[i - 3] if i >= 3 else 0
            upleft = prev[i - 3] if i >= 3 else 0
            predictor = [0, left, prev[i], (left + prev[i]) // 2,
                         data._paeth(left, prev[i], upleft)][kind]  # fmt: skip
            out.append((value - predictor) & 0xFF)
        raw += bytes([kind, *out])
        prev = row

    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(raw)))
        + chunk(b"IEND", b"")
    )


def test_png_reader_undoes_every_filter_type() -> None:
    gen = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (10, 6, 3), dtype=torch.uint8, generator=gen)
    assert torch.equal(data.decode_png(_filtered_png(pixels)), pixels)


def test_png_reader_rejects_corruption() -> None:
    blob = bytearray(data.encode_png(torch.zeros(4, 4, 3, dtype=torch.uint8)))
    blob[40] ^= 0xFF  # inside the IDAT payload
    with pytest.raises(ValueError, match="CRC"):
        data.decode_png(bytes(blob))
    with pytest.raises(ValueError, match="not a PNG"):
        data.decode_png(b"GIF89a")


def test_generation_is_deterministic(tmp_path: Path) -> None:
    a = data.ensure_dataset(tmp_path / "a", counts=SMALL, resolution=32)
    b = data.ensure_dataset(tmp_path / "b", counts=SMALL, resolution=32)
    other = data.ensure_dataset(tmp_path / "c", counts=SMALL, resolution=32, seed=1)
    files_a, files_b = _files(a), _files(b)
    assert len(files_a) == sum(SMALL.values())
    assert files_a == files_b
    assert _files(other).keys() == files_a.keys()
    assert _files(other) != files_a


def test_default_dataset_is_balanced() -> None:
    root = data.ensure_dataset()
    manifest = data.read_manifest(root)
    assert manifest is not None and manifest["counts"] == dict(data.DEFAULT_COUNTS)
    for split, total in data.DEFAULT_COUNTS.items():
        per_class = Counter(data.ProductImages(split, root=root).targets)
        assert per_class == {label: total // len(data.CLASSES) for label in range(5)}


def test_dataset_items(tmp_path: Path) -> None:
    root = data.ensure_dataset(tmp_path / "d", counts=SMALL, resolution=64)
    flips: list[int] = []

    def flip(x: torch.Tensor) -> torch.Tensor:
        flips.append(1)
        return x.flip(-1)

    ds = data.ProductImages("train", image_size=32, root=root, transform=flip)
    assert len(ds) == SMALL["train"]
    image, label = ds[3]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert float(image.min()) >= 0.0 and float(image.max()) <= 1.0
    assert isinstance(label, int) and 0 <= label < len(data.CLASSES)
    assert torch.equal(ds[3][0], image)  # second read comes from the cache, same pixels
    assert len(flips) == 2
    full = data.ProductImages("train", image_size=64, root=root)[3][0]
    assert full.shape == (3, 64, 64)
    with pytest.raises(ValueError, match="split"):
        data.ProductImages("holdout", root=root)


def test_env_var_moves_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "elsewhere"))
    assert data.default_root() == (tmp_path / "elsewhere").resolve()


def test_other_settings_are_reported_not_reused(tmp_path: Path) -> None:
    root = data.ensure_dataset(tmp_path / "d", counts=SMALL, resolution=16)
    with pytest.raises(ValueError, match="other settings"):
        data.ensure_dataset(root, counts=SMALL, resolution=16, seed=7)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a dataset")
    with pytest.raises(RuntimeError, match="no manifest"):
        data.ensure_dataset(foreign, counts=SMALL, resolution=16)


def test_concurrent_generation_yields_one_complete_tree(tmp_path: Path) -> None:
    # Separate processes, as pytest-xdist workers would be: all ask for the same folder at once.
    root = tmp_path / "shared"
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=data.ensure_dataset,
            args=(str(root),),
            kwargs={"counts": SMALL, "resolution": 16},
        )
        for _ in range(3)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0, 0, 0]
    assert len(_files(root)) == sum(SMALL.values())
    assert data.read_manifest(root) is not None
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["shared"]


def test_losing_the_rename_race_is_harmless(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a lock (Windows), a rival can finish first; our rename then fails and we reuse its.
    root = tmp_path / "data"
    real_generate = data._generate_into
    raced: list[bool] = []

    def generate_while_a_rival_wins(folder: Path, *args: object) -> None:
        real_generate(folder, *args)  # type: ignore[arg-type]
        if not raced:
            raced.append(True)
            data.ensure_dataset(root, counts=SMALL, resolution=16)

    monkeypatch.setattr(data, "_exclusive", lambda _root: contextlib.nullcontext())
    monkeypatch.setattr(data, "_generate_into", generate_while_a_rival_wins)
    assert data.ensure_dataset(root, counts=SMALL, resolution=16) == root.resolve()
    assert raced and data.read_manifest(root) is not None
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["data"]
