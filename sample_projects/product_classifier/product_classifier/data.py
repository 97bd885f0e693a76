"""Synthetic product photos: generated once into image folders, read back as a Dataset.

The images stand in for a shop's product photos: five classes, each with its own silhouette,
drawn with random colour, position, size, rotation, lighting and sensor noise. Nothing is
downloaded; the same seed gives the same bytes on every machine with the same torch version.

Layout on disk (an ImageFolder-style tree, so real photos could be dropped in instead)::

    data/manifest.json
    data/train/shoes/shoes_0000.png
    data/val/...
    data/test/...
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

CLASSES: tuple[str, ...] = ("shoes", "bags", "jackets", "watches", "accessories")
SPLITS: tuple[str, ...] = ("train", "val", "test")
DEFAULT_COUNTS: Mapping[str, int] = {"train": 1000, "val": 250, "test": 250}
DEFAULT_SEED = 0
DEFAULT_RESOLUTION = 64
ENV_VAR = "PRODUCT_CLASSIFIER_DATA"
MANIFEST = "manifest.json"
# Bump when the drawing code changes, so an old cache is reported instead of silently reused.
GENERATOR_VERSION = 1

Transform = Callable[[torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------------------------
# PNG: just enough of the format for 8-bit RGB images (what write_png produces)
# --------------------------------------------------------------------------------------------

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def encode_png(pixels: torch.Tensor) -> bytes:
    """Encode an HxWx3 uint8 tensor as a PNG (8-bit RGB, no interlace, filter 0 per row)."""
    if pixels.dtype != torch.uint8 or pixels.dim() != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected HxWx3 uint8, got {tuple(pixels.shape)} {pixels.dtype}")
    height, width, _ = pixels.shape
    rows = pixels.reshape(height, width * 3)
    # Each scanline starts with its filter byte; 0 ("None") keeps the writer trivial.
    raw = torch.cat([torch.zeros(height, 1, dtype=torch.uint8), rows], dim=1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"".join(
        [
            _PNG_SIGNATURE,
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", zlib.compress(bytes(raw.flatten().tolist()), 6)),
            _chunk(b"IEND", b""),
        ]
    )


def write_png(path: str | os.PathLike[str], pixels: torch.Tensor) -> None:
    Path(path).write_bytes(encode_png(pixels))


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(data: bytearray, height: int, stride: int, bpp: int) -> bytearray:
    """Undo PNG scanline filters 1-4 (slow pure Python; our own files only use filter 0)."""
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = data[start]
        line = bytearray(data[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = prev[i]
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                upleft = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + _paeth(left, up, upleft)) & 0xFF
            elif kind != 0:
                raise ValueError(f"bad PNG filter type {kind} in row {y}")
        out[y * stride : (y + 1) * stride] = line
        prev = line
    return out


def decode_png(blob: bytes) -> torch.Tensor:
    """Decode an 8-bit RGB, non-interlaced PNG into an HxWx3 uint8 tensor."""
    if not blob.startswith(_PNG_SIGNATURE):
        raise ValueError("not a PNG file")
    pos = len(_PNG_SIGNATURE)
    header: tuple[int, ...] | None = None
    idat: list[bytes] = []
    while pos + 8 <= len(blob):
        (length,) = struct.unpack(">I", blob[pos : pos + 4])
        kind = blob[pos + 4 : pos + 8]
        payload = blob[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", blob[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(kind + payload) & 0xFFFFFFFF != crc:
            raise ValueError(f"PNG chunk {kind!r} fails its CRC (truncated or corrupt file)")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", payload)
        elif kind == b"IDAT":
            idat.append(payload)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None or not idat:
        raise ValueError("PNG has no IHDR or IDAT chunk")
    width, height, depth, colour, _, _, interlace = header
    if (depth, colour, interlace) != (8, 2, 0):
        raise ValueError(
            f"unsupported PNG (bit depth {depth}, colour type {colour}, interlace {interlace}); "
            "this reader handles the 8-bit RGB files that write_png produces"
        )
    data = bytearray(zlib.decompress(b"".join(idat)))
    stride = width * 3
    if len(data) != height * (stride + 1):
        raise ValueError("PNG image data has the wrong length")
    rows = torch.frombuffer(data, dtype=torch.uint8).view(height, stride + 1)
    if bool((rows[:, 0] == 0).all()):
        pixels = rows[:, 1:].clone()  # fast path: every row unfiltered
    else:
        plain = _unfilter(data, height, stride, bpp=3)
        pixels = torch.frombuffer(plain, dtype=torch.uint8).view(height, stride).clone()
    return pixels.view(height, width, 3)


def read_png(path: str | os.PathLike[str]) -> torch.Tensor:
    return decode_png(Path(path).read_bytes())


# --------------------------------------------------------------------------------------------
# Drawing: one procedural silhouette per class
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _grid(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Coordinates in [-1, 1] so every shape is defined independently of the resolution.
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1
    y, x = torch.meshgrid(coords, coords, indexing="ij")
    return x, y


def _ellipse(
    u: torch.Tensor, v: torch.Tensor, cx: float, cy: float, rx: float, ry: float
) -> torch.Tensor:
    return ((u - cx) / rx) ** 2 + ((v - cy) / ry) ** 2 <= 1.0


def _rect(
    u: torch.Tensor, v: torch.Tensor, x0: float, x1: float, y0: float, y1: float
) -> torch.Tensor:
    return (u >= x0) & (u <= x1) & (v >= y0) & (v <= y1)


def _colour(rng: random.Random, avoid: torch.Tensor | None = None) -> torch.Tensor:
    """A random RGB colour; resampled until it stands out from `avoid` (object vs background)."""
    while True:
        c = torch.tensor([rng.random(), rng.random(), rng.random()])
        if avoid is None or float((c - avoid).abs().mean()) > 0.3:
            return c


Layer = tuple[torch.Tensor, torch.Tensor]  # (HxW bool mask, RGB colour)


def _shoe(u: torch.Tensor, v: torch.Tensor, rng: random.Random, c: torch.Tensor) -> list[Layer]:
    if rng.random() < 0.5:
        u = -u  # shoes are photographed facing either way
    length = rng.uniform(0.6, 0.8)
    ankle = rng.uniform(0.25, 0.4)
    foot = _ellipse(u, v, 0.1, 0.25, length, 0.22)
    body = foot | _ellipse(u, v, -0.35, 0.2 - ankle / 2, 0.27, ankle)
    sole = _rect(u, v, -0.62, 0.1 + length, 0.36, 0.48)
    return [(body, c), (sole, 1 - c)]


def _bag(u: torch.Tensor, v: torch.Tensor, rng: random.Random, c: torch.Tensor) -> list[Layer]:
    half = rng.uniform(0.42, 0.6)
    top = rng.uniform(-0.1, 0.05)
    radius = rng.uniform(0.2, 0.3)
    ring = ((u**2 + (v - top) ** 2).sqrt() - radius).abs() <= rng.uniform(0.04, 0.07)
    handle = ring & (v <= top)
    body = _rect(u, v, -half, half, top, 0.65)
    flap = _rect(u, v, -half, half, top, top + 0.18)
    return [(handle, c * 0.6), (body, c), (flap, c * 0.8)]


def _jacket(u: torch.Tensor, v: torch.Tensor, rng: random.Random, c: torch.Tensor) -> list[Layer]:
    span = rng.uniform(0.65, 0.85)
    half = rng.uniform(0.32, 0.42)
    sleeves = _rect(u, v, -span, span, -0.6, -0.3) | (
        _rect(u, v, -span, -span + 0.2, -0.6, 0.2) | _rect(u, v, span - 0.2, span, -0.6, 0.2)
    )
    body = _rect(u, v, -half, half, -0.62, 0.68)
    zip_line = _rect(u, v, -0.025, 0.025, -0.5, 0.68)
    return [(sleeves | body, c), (zip_line, 1 - c)]


def _watch(u: torch.Tensor, v: torch.Tensor, rng: random.Random, c: torch.Tensor) -> list[Layer]:
    band_half = rng.uniform(0.1, 0.17)
    radius = rng.uniform(0.26, 0.36)
    band = _rect(u, v, -band_half, band_half, -0.9, 0.9)
    case = _ellipse(u, v, 0, 0, radius, radius)
    face = _ellipse(u, v, 0, 0, radius * 0.75, radius * 0.75)
    angle = rng.uniform(0, 2 * math.pi)
    # Clock hand: a thin strip from the centre along a random direction.
    along = u * math.cos(angle) + v * math.sin(angle)
    across = -u * math.sin(angle) + v * math.cos(angle)
    hand = (along >= 0) & (along <= radius * 0.65) & (across.abs() <= 0.025)
    return [(band, c * 0.5), (case, c), (face, torch.full((3,), 0.92)), (hand, c * 0.3)]


def _accessories(
    u: torch.Tensor, v: torch.Tensor, rng: random.Random, c: torch.Tensor
) -> list[Layer]:
    layers: list[Layer] = []
    for _ in range(rng.randint(3, 6)):
        cx, cy, r = rng.uniform(-0.7, 0.7), rng.uniform(-0.7, 0.7), rng.uniform(0.07, 0.15)
        kind = rng.randrange(3)
        if kind == 0:
            mask = _ellipse(u, v, cx, cy, r, r)
        elif kind == 1:
            mask = _rect(u, v, cx - r, cx + r, cy - r, cy + r)
        else:
            mask = ((u - cx).abs() + (v - cy).abs()) <= r * 1.3  # diamond
        tint = (c + torch.tensor([rng.uniform(-0.3, 0.3) for _ in range(3)])).clamp(0, 1)
        layers.append((mask, tint))
    return layers


_DRAW = {
    "shoes": _shoe,
    "bags": _bag,
    "jackets": _jacket,
    "watches": _watch,
    "accessories": _accessories,
}


def _image_seed(seed: int, split: str, label: int, index: int) -> int:
    # Hash, not arithmetic, so neighbouring seeds/indices give unrelated images.
    digest = hashlib.sha256(f"{seed}/{split}/{label}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def render(label: int, image_seed: int, resolution: int = DEFAULT_RESOLUTION) -> torch.Tensor:
    """Draw one product photo of class `label`; returns an HxWx3 uint8 tensor."""
    rng = random.Random(image_seed)
    gen = torch.Generator().manual_seed(image_seed)
    x, y = _grid(resolution)

    background = _colour(rng)
    # Uneven studio lighting: a gentle linear gradient over the whole frame.
    light = 1 + rng.uniform(-0.15, 0.15) * x + rng.uniform(-0.15, 0.15) * y
    img = background.view(3, 1, 1) * light

    # Position, size and rotation jitter: the photographer never frames twice the same way.
    cx, cy = rng.uniform(-0.2, 0.2), rng.uniform(-0.15, 0.15)
    scale = rng.uniform(0.7, 1.05)
    theta = math.radians(rng.uniform(-20, 20))
    cos, sin = math.cos(theta), math.sin(theta)
    u = ((x - cx) * cos + (y - cy) * sin) / scale
    v = (-(x - cx) * sin + (y - cy) * cos) / scale

    colour = _colour(rng, avoid=background)
    for mask, rgb in _DRAW[CLASSES[label]](u, v, rng, colour):
        img = torch.where(mask, rgb.view(3, 1, 1) * light, img)

    if rng.random() < 0.25:
        # A faint stray blob (dust, a tag) that belongs to no class.
        bx, by, br = rng.uniform(-0.9, 0.9), rng.uniform(-0.9, 0.9), rng.uniform(0.04, 0.09)
        blob = _ellipse(x, y, bx, by, br, br)
        img = torch.where(blob, 0.5 * img + 0.5 * _colour(rng).view(3, 1, 1), img)

    sigma = rng.uniform(0.02, 0.08)
    img = img + sigma * torch.randn(img.shape, generator=gen)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()


# --------------------------------------------------------------------------------------------
# Generation on disk, safe when several processes (pytest-xdist workers) ask at once
# --------------------------------------------------------------------------------------------


def default_root() -> Path:
    """Where the images live: $PRODUCT_CLASSIFIER_DATA, else `data/` in the project folder."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    project = Path(__file__).resolve().parent.parent
    if (project / "pyproject.toml").exists():
        return project / "data"
    # Installed into site-packages: no project folder to write into.
    return Path.home() / ".cache" / "product_classifier" / "data"


def _manifest(seed: int, counts: Mapping[str, int], resolution: int) -> dict[str, object]:
    return {
        "generator_version": GENERATOR_VERSION,
        "torch_version": torch.__version__.split("+")[0],
        "seed": seed,
        "resolution": resolution,
        "classes": list(CLASSES),
        "counts": {split: int(counts[split]) for split in SPLITS},
    }


def read_manifest(root: str | os.PathLike[str]) -> dict[str, object] | None:
    path = Path(root) / MANIFEST
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


def _per_class(total: int) -> list[int]:
    base, extra = divmod(total, len(CLASSES))
    return [base + (1 if i < extra else 0) for i in range(len(CLASSES))]


def _generate_into(folder: Path, seed: int, counts: Mapping[str, int], resolution: int) -> None:
    for split in SPLITS:
        for label, n in enumerate(_per_class(counts[split])):
            name = CLASSES[label]
            class_dir = folder / split / name
            class_dir.mkdir(parents=True)
            for i in range(n):
                pixels = render(label, _image_seed(seed, split, label, i), resolution)
                write_png(class_dir / f"{name}_{i:04d}.png", pixels)


@contextlib.contextmanager
def _exclusive(root: Path) -> Iterator[None]:
    """Hold an advisory lock beside `root` so one process generates while the others wait."""
    try:
        import fcntl
    except ImportError:  # Windows: rely on the rename collision handling alone
        yield
        return
    with open(root.parent / f".{root.name}.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_manifest(found: Mapping[str, object], wanted: Mapping[str, object], root: Path) -> None:
    keys = ("generator_version", "seed", "resolution", "classes", "counts")
    diff = {k: (found.get(k), wanted[k]) for k in keys if found.get(k) != wanted[k]}
    if diff:
        detail = ", ".join(f"{k}: on disk {a!r}, asked {b!r}" for k, (a, b) in diff.items())
        raise ValueError(
            f"the dataset at {root} was generated with other settings ({detail}); delete the "
            f"folder to regenerate it, or point {ENV_VAR} at another folder"
        )


def ensure_dataset(
    root: str | os.PathLike[str] | None = None,
    *,
    seed: int = DEFAULT_SEED,
    counts: Mapping[str, int] = DEFAULT_COUNTS,
    resolution: int = DEFAULT_RESOLUTION,
) -> Path:
    """Generate the image folders under `root` unless they are already there; returns `root`.

    The tree is written to a temporary sibling folder and renamed into place, so `root` either
    does not exist or is complete (manifest.json is written last). A lock file serialises
    concurrent callers; where locks are unavailable, losing the rename race is harmless.
    """
    root_path = Path(root).expanduser().resolve() if root is not None else default_root()
    wanted = _manifest(seed, counts, resolution)
    found = read_manifest(root_path)
    if found is not None:
        _check_manifest(found, wanted, root_path)
        return root_path

    root_path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(root_path):
        found = read_manifest(root_path)  # another process may have finished while we waited
        if found is not None:
            _check_manifest(found, wanted, root_path)
            return root_path
        if root_path.exists() and any(root_path.iterdir()):
            raise RuntimeError(
                f"{root_path} exists but holds no {MANIFEST}: not a generated dataset (or an "
                "interrupted one from an old version); delete it to regenerate"
            )
        tmp = Path(tempfile.mkdtemp(prefix=f".{root_path.name}.tmp-", dir=root_path.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the renamed dataset should not be
        try:
            _generate_into(tmp, seed, counts, resolution)
            (tmp / MANIFEST).write_text(json.dumps(wanted, indent=2) + "\n")
            try:
                os.rename(tmp, root_path)  # atomic; fails if another process got there first
            except OSError:
                found = read_manifest(root_path)
                if found is None:
                    raise
                _check_manifest(found, wanted, root_path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root_path


# --------------------------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------------------------


class ProductImages(Dataset[tuple[torch.Tensor, int]]):
    """One split of the product photos as (float CHW tensor in [0, 1], class index) pairs.

    Files are decoded lazily and kept in memory (as uint8, already resized), so after the
    first epoch `__getitem__` is a cheap conversion; each DataLoader worker keeps its own cache.
    """

    classes = CLASSES

    def __init__(
        self,
        split: str,
        image_size: int = DEFAULT_RESOLUTION,
        transform: Transform | None = None,
        root: str | os.PathLike[str] | None = None,
        cache: bool = True,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        root_path = Path(root).expanduser().resolve() if root is not None else default_root()
        if read_manifest(root_path) is None:
            ensure_dataset(root_path)
        self.root = root_path
        self.split = split
        self.image_size = image_size
        self.transform = transform
        self.cache = cache
        self.samples: list[tuple[Path, int]] = []
        for label, name in enumerate(CLASSES):
            files = sorted((root_path / split / name).glob("*.png"))
            if not files:
                raise FileNotFoundError(f"no PNG files in {root_path / split / name}")
            self.samples.extend((path, label) for path in files)
        self.targets = [label for _, label in self.samples]
        self._cache: list[torch.Tensor | None] = [None] * len(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, index: int) -> torch.Tensor:
        chw = read_png(self.samples[index][0]).permute(2, 0, 1)
        if chw.shape[1:] != (self.image_size, self.image_size):
            resized = F.interpolate(
                chw[None].float(),
                size=(self.image_size, self.image_size),
                mode="bilinear",
                antialias=True,
                align_corners=False,
            )[0]
            chw = resized.round().clamp(0, 255).to(torch.uint8)
        return chw.contiguous()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self._cache[index]
        if image is None:
            image = self._load(index)
            if self.cache:
                self._cache[index] = image
        x = image.float().div_(255)
        if self.transform is not None:
            x = self.transform(x)
        return x, self.targets[index]
