"""The committed gRPC stubs are what grpcio-tools generates from the committed .proto."""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc as grpc_tools  # a dev dependency: missing, the test must fail, not skip
from repo_paths import ROOT

PROTO = "luftpause/v1/scheduler.proto"
GENERATED = ("scheduler_pb2.py", "scheduler_pb2.pyi", "scheduler_pb2_grpc.py")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    code = grpc_tools.main(
        [
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / "proto" / PROTO),
        ]
    )
    assert code == 0
    stale = [
        name
        for name in GENERATED
        if (tmp_path / "luftpause" / "v1" / name).read_bytes()
        != (ROOT / "luftpause" / "v1" / name).read_bytes()
    ]
    regenerate = (
        f"{Path(sys.executable).name} -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. "
        f"--grpc_python_out=. proto/{PROTO}"
    )
    assert not stale, f"stubs out of date with proto/{PROTO}: {stale}; regenerate with: {regenerate}"
