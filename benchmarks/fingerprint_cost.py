"""The cost of an input fingerprint (results/input_digests.py): sampled (the default) vs every byte.

Writes a synthetic checkpoint folder of safetensors shards shaped like a large target's (many tensors
per shard), then times, side by side in one process, `fingerprint(folder)` (sampled: headers, sizes,
three 4 KiB blocks per tensor) and `fingerprint(folder, full=True)` (every byte), each on a fresh
cache of eagle-eval's own (the OS page cache stays warm: the full read is the faster for it, so the ratio
printed is a lower bound of the real one on a cold disk). Prints the bytes each reads and the ratio.

    python benchmarks/fingerprint_cost.py                 # 4 shards x 512 MiB, 256 tensors each
    python benchmarks/fingerprint_cost.py --shards 8 --shard-mib 1024 --tensors 1000
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def write_shard(path: Path, mib: int, tensors: int) -> None:
    """A safetensors file of `tensors` F32 tensors filling about `mib` MiB, written without torch."""
    per = (mib << 20) // tensors // 4 * 4
    header, offset = {}, 0
    for i in range(tensors):
        header[f"model.layers.{i}.weight"] = {"dtype": "F32", "shape": [per // 4], "data_offsets": [offset, offset + per]}
        offset += per
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    block = bytes(range(256)) * 4096                   # 1 MiB of data, repeated
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        left = offset
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=512)
    ap.add_argument("--tensors", type=int, default=256)
    args = ap.parse_args()

    from eagle_eval.results import input_digests as fingerprints

    with tempfile.TemporaryDirectory(prefix="eagle-eval-fp-") as tmp:
        folder = Path(tmp)
        for s in range(args.shards):
            write_shard(folder / f"model-{s:05d}.safetensors", args.shard_mib, args.tensors)
        total = sum(p.stat().st_size for p in folder.iterdir())
        times = {}
        for name, full in (("sampled", False), ("full", True)):
            fingerprints._cache.clear()
            t0 = time.perf_counter()
            fingerprints.fingerprint(folder, full=full, progress=False)
            times[name] = time.perf_counter() - t0
        sampled_bytes = args.shards * (args.tensors * 3 * fingerprints.BLOCK)
        print(f"{args.shards} shards, {total / 2**30:.2f} GiB, {args.shards * args.tensors} tensors")
        print(f"sampled  {times['sampled']:.3f} s  (reads about {sampled_bytes / 2**20:.1f} MiB + headers)")
        print(f"full     {times['full']:.3f} s  (reads {total / 2**30:.2f} GiB, {total / 2**30 / times['full']:.2f} GiB/s)")
        per_tensor = times["sampled"] / (args.shards * args.tensors)
        print(f"full / sampled = {times['full'] / times['sampled']:.1f}x")
        print(f"a 700 GB target (140 shards x 1000 tensors) at these rates: full {700e9 / total * times['full']:.0f} s, "
              f"sampled {per_tensor * 140_000:.1f} s ({per_tensor * 1e6:.0f} us per tensor)")

if __name__ == "__main__":
    main()
