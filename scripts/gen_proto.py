"""Generate the gRPC/protobuf modules in shardq_common/pb from proto/.

Usage: python scripts/gen_proto.py [--check]

protoc names sibling imports after the proto path (``from shardq.v1 import
shardq_pb2``); they are rewritten to the package the code lives in, so nothing
needs sys.path tricks. ``--check`` exits 1 when the committed code is stale.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "shardq_common" / "pb"
PACKAGE = "shardq_common.pb"


def generate() -> dict[str, str]:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    grpc_include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{grpc_include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        files: dict[str, str] = {}
        for path in Path(tmp).rglob("*.py*"):
            text = path.read_text()
            text = re.sub(r"^from shardq\.v1 import ", f"from {PACKAGE} import ", text, flags=re.M)
            files[path.name] = text
        return files


# The generator's own version, stamped into the code: any release of grpcio-tools the project allows
# writes the same code but for these, so the check leaves them out (the first run on a newer
# release would call the committed code stale while nothing in proto/ changed).
_VERSION_STAMPS = (
    re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.M),
    re.compile(r"^# Protobuf Python Version: .*$", re.M),
    re.compile(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)"),
)


def _unstamped(text: str) -> str:
    for stamp in _VERSION_STAMPS:
        text = stamp.sub("<version>", text)
    return text


def main() -> int:
    files = generate()
    if "--check" in sys.argv:
        stale = [
            n
            for n, t in files.items()
            if not (OUT / n).exists() or _unstamped((OUT / n).read_text()) != _unstamped(t)
        ]
        if stale:
            print(f"generated code is stale: {', '.join(sorted(stale))}; run python scripts/gen_proto.py")
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (OUT / name).write_text(text)
    (OUT / "__init__.py").write_text(
        '"""Generated protobuf and gRPC code: edit proto/, then run scripts/gen_proto.py."""\n'
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
