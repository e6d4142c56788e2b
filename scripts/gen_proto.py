#!/usr/bin/env python3
"""Generate the committed gRPC/protobuf stubs package `fedmask_proto/`.

Usage (from the repository root, with the dev extras installed):

    .venv/bin/python scripts/gen_proto.py            # rewrite fedmask_proto/
    .venv/bin/python scripts/gen_proto.py --check    # exit 1 if it would change
    .venv/bin/python scripts/gen_proto.py --out DIR  # write the package into DIR

Layout: the sources `proto/fedmask/v1/X.proto` (protobuf package `fedmask.v1`)
become `fedmask_proto/v1/X_pb2.py` and `X_pb2.pyi` (mypy-protobuf), plus
`X_pb2_grpc.py` and `X_pb2_grpc.pyi` for files that define a service;
imported as `fedmask_proto.v1.X_pb2`.
protoc names modules after the source path (`fedmask.v1.X_pb2`), which would
collide with the `fedmask` CLI package, so the generated Python imports are
rewritten from `fedmask.v1` to `fedmask_proto.v1`. Proto-level names (message
full names, RPC paths such as `/fedmask.v1.CoordinatorService/Session`) are
untouched. The package `__init__.py` files and `py.typed` are generated too,
so the whole folder is machine-written and `tests/proto/test_stubs_drift.py`
can compare it byte for byte.

Contract: the output depends only on the .proto sources and the pinned
versions of grpcio-tools and mypy-protobuf (constraints.txt).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
PROTO_PACKAGE_DIR = Path("fedmask") / "v1"  # relative to PROTO_ROOT
PACKAGE = "fedmask_proto"
DEFAULT_OUT = ROOT / PACKAGE

_PACKAGE_INIT = '''"""Generated gRPC/protobuf stubs of the fedmask wire protocol.

Machine-written by scripts/gen_proto.py from proto/; never edit by hand.
Import the versioned modules, e.g. `from fedmask_proto.v1 import session_pb2`.
"""
'''
_VERSION_INIT = '''"""Stubs of protobuf package `fedmask.v1` (proto/fedmask/v1/*.proto).

Machine-written by scripts/gen_proto.py; never edit by hand.
"""
'''

# Rewrites applied to every generated file: (pattern, replacement).
_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^from fedmask\.v1 import ", re.MULTILINE), f"from {PACKAGE}.v1 import "),
    (re.compile(r"^import fedmask\.v1\.", re.MULTILINE), f"import {PACKAGE}.v1."),
    # The module name protobuf gives generated classes (`__module__`).
    (re.compile(r"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'fedmask\.v1\."), rf"\1'{PACKAGE}.v1."),
)
# After rewriting, nothing may still import the un-prefixed module path.
_LEFTOVER = re.compile(r"^\s*(from|import) fedmask\.v1\b", re.MULTILINE)


def _plugin(name: str) -> str:
    """Path of a protoc plugin executable installed next to this Python."""
    candidate = Path(sys.executable).parent / name
    found = candidate if candidate.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"gen_proto: {name} not found; install the dev extras (mypy-protobuf)")
    return str(found)


def _run_protoc(sources: list[Path], out: Path, *, grpc: bool) -> None:
    """Run the bundled protoc on `sources`: messages (+ .pyi) always, gRPC
    service modules (+ .pyi) only when `grpc`."""
    from grpc_tools import protoc  # dev dependency (grpcio-tools)

    include = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    args = ["grpc_tools.protoc", f"--proto_path={PROTO_ROOT}", f"--proto_path={include}"]
    if grpc:
        args += [
            f"--grpc_python_out={out}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--mypy_grpc_out=quiet:{out}",
        ]
    else:
        args += [
            f"--python_out={out}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--mypy_out=quiet:{out}",
        ]
    args += [str(s.relative_to(PROTO_ROOT)) for s in sources]
    if protoc.main(args) != 0:
        raise SystemExit("gen_proto: protoc failed (see messages above)")


_SERVICE = re.compile(r"^\s*service\s+\w+", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Write the complete stubs package into `out_dir` (created or emptied).

    Returns the written files, sorted. Raises SystemExit on protoc errors.
    """
    sources = sorted((PROTO_ROOT / PROTO_PACKAGE_DIR).glob("*.proto"))
    if not sources:
        raise SystemExit(f"gen_proto: no .proto files under {PROTO_ROOT / PROTO_PACKAGE_DIR}")
    with tempfile.TemporaryDirectory(prefix="fedmask-protoc-") as tmp:
        raw = Path(tmp)
        _run_protoc(sources, raw, grpc=False)
        services = [s for s in sources if _SERVICE.search(s.read_text(encoding="utf-8"))]
        if services:
            _run_protoc(services, raw, grpc=True)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        version_dir = out_dir / "v1"
        version_dir.mkdir(parents=True)
        for produced in sorted((raw / PROTO_PACKAGE_DIR).iterdir()):
            text = produced.read_text(encoding="utf-8")
            for pattern, replacement in _REWRITES:
                text = pattern.sub(replacement, text)
            if _LEFTOVER.search(text):
                raise SystemExit(f"gen_proto: unrewritten fedmask.v1 import in {produced.name}")
            (version_dir / produced.name).write_text(text, encoding="utf-8")
    (out_dir / "__init__.py").write_text(_PACKAGE_INIT, encoding="utf-8")
    (version_dir / "__init__.py").write_text(_VERSION_INIT, encoding="utf-8")
    (out_dir / "py.typed").write_text("", encoding="utf-8")
    return sorted(p for p in out_dir.rglob("*") if p.is_file())


def differences(expected_dir: Path, actual_dir: Path) -> list[str]:
    """Relative paths that differ between two package trees (missing, extra
    or different bytes), ignoring __pycache__."""

    def files(d: Path) -> set[str]:
        return {
            str(p.relative_to(d))
            for p in d.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    exp, act = files(expected_dir), files(actual_dir) if actual_dir.exists() else set()
    diff = sorted(exp ^ act)
    diff += sorted(
        f for f in exp & act if not filecmp.cmp(expected_dir / f, actual_dir / f, shallow=False)
    )
    return diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="package directory to write")
    parser.add_argument("--check", action="store_true", help="only report drift, exit 1 on any")
    args = parser.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory(prefix="fedmask-proto-check-") as tmp:
            fresh = Path(tmp) / PACKAGE
            generate(fresh)
            diff = differences(fresh, args.out)
        if diff:
            print("fedmask_proto is stale; run scripts/gen_proto.py:\n  " + "\n  ".join(diff))
            return 1
        print("fedmask_proto is up to date")
        return 0
    written = generate(args.out)
    print(f"wrote {len(written)} files under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
