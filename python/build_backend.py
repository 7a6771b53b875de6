"""The build backend of the causeway Python package (PEP 517), named by
pyproject.toml: builds the native module with this tree's CMake build and
packs the package as a wheel. It needs only Python's standard library, CMake
and the build's own dependencies (scripts/install-deps.sh), so

    pip install --no-build-isolation .

works with Debian's packages and no network. The build lies in build-pip/
(CAUSEWAY_PIP_BUILD_DIR moves it) and is reused by the next install."""

import base64
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAME = "causeway"


def _version():
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(Causeway VERSION ([0-9.]+)", text)
    if not match:
        raise RuntimeError("CMakeLists.txt names no project version")
    return match.group(1)


def _dist_info():
    return f"{NAME}-{_version()}.dist-info"


def _tag():
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{python}-{python}-{platform}"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\n"
            "Summary: Causeway: asynchronous distributed dataflow on Vulkan compute, from Python\n"
            "Requires-Python: >=3.9\nRequires-Dist: numpy\n")


def _write_metadata(directory):
    info = pathlib.Path(directory) / _dist_info()
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(_metadata())
    (info / "WHEEL").write_text(
        f"Wheel-Version: 1.0\nGenerator: causeway build_backend\nRoot-Is-Purelib: false\nTag: {_tag()}\n")
    return info


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory).name


def _build():
    build = pathlib.Path(os.environ.get("CAUSEWAY_PIP_BUILD_DIR", ROOT / "build-pip"))
    configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                 "-DCAUSEWAY_BUILD_TESTS=OFF", "-DCAUSEWAY_BUILD_BENCHMARKS=OFF",
                 f"-DPython3_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja") and not (build / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja"]
    if shutil.which("ccache"):
        configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    subprocess.run(configure, check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", str(build), "--target", "causeway_python", "-j", str(os.cpu_count() or 1)],
                   check=True, stdout=sys.stderr)
    return build / "python" / NAME


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    package = _build()
    wheel = pathlib.Path(wheel_directory) / f"{NAME}-{_version()}-{_tag()}.whl"
    records = []
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as z:
        def add(name, data):
            z.writestr(name, data)
            records.append(_record_line(name, data))

        for path in sorted(package.iterdir()):
            if path.is_file() and (path.suffix in (".py", ".so")):
                add(f"{NAME}/{path.name}", path.read_bytes())
        info = _dist_info()
        staging = _write_metadata(pathlib.Path(wheel_directory) / ".causeway-metadata")
        for name in ("METADATA", "WHEEL"):
            add(f"{info}/{name}", (staging / name).read_bytes())
        shutil.rmtree(staging.parent)
        record = "\n".join(records + [f"{info}/RECORD,,"]) + "\n"
        z.writestr(f"{info}/RECORD", record)
    return wheel.name
