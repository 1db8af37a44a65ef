"""Write the tiny random-weight llama GGUF that the benchmarks and the llama tests load.

python bench/make_model.py OUT.gguf [--layers 4 --dim 256 --heads 4 --ff 512 --ctx 4096 --seed 0]
                             [--projector OUT.mmproj.gguf]

With ``--projector``, also the vision projector for that model (llama-server's ``--mmproj``), so it reads images.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and write the model."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from testing.tiny_gguf import ModelShape, ProjectorShape, write_model, write_projector

    parser = argparse.ArgumentParser(description="Write a tiny random-weight llama model as GGUF.")
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ff", type=int, default=512)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--projector", type=Path, help="also write a vision projector (mmproj) for the model here")
    args = parser.parse_args(argv)
    shape = ModelShape(layers=args.layers, dim=args.dim, heads=args.heads, ff=args.ff, ctx=args.ctx, seed=args.seed)
    path = write_model(args.out, shape)
    print(f"{path} ({path.stat().st_size} bytes)")
    if args.projector is not None:
        projector = write_projector(args.projector, ProjectorShape(text_dim=args.dim, seed=args.seed))
        print(f"{projector} ({projector.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
