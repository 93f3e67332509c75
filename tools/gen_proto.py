"""Generate the gRPC/protobuf Python code under src/api/ from proto/ with grpcio-tools.

`python tools/gen_proto.py` writes the code (skipped when it is current); `--check` fails when the
code in src/api/ is missing or differs from what the .proto files produce now (a stale check for
`make check`). Generated files are never edited by hand and are not committed.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "src" / "api"


def generate(into: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency, imported only here

    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    if not protos:
        return []
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={into}",
        f"--grpc_python_out={into}",
        f"--mypy_out={into}",
        f"--mypy_grpc_out={into}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # proto/spate/api/v1/x.proto -> <into>/spate/api/v1/x_pb2.py ; keep the part below spate/api
    return sorted((into / "spate" / "api").rglob("*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if src/api is stale")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        files = generate(out)
        base = out / "spate" / "api"
        stale = []
        for f in files:
            rel = f.relative_to(base)
            dest = OUT_ROOT / rel
            if not dest.exists() or not filecmp.cmp(f, dest, shallow=False):
                stale.append(rel)
        if opts.check:
            if stale:
                print(
                    "stale generated code in src/api (run `python tools/gen_proto.py`):",
                    ", ".join(map(str, stale)),
                    file=sys.stderr,
                )
                return 1
            return 0
        for f in files:
            rel = f.relative_to(base)
            dest = OUT_ROOT / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if rel in stale:
                shutil.copyfile(f, dest)
        for d in {(OUT_ROOT / f.relative_to(base)).parent for f in files}:
            (d / "__init__.py").touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
