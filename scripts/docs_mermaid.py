"""Mermaid's one file for the docs site, from its npm tarball alone.

``npm pack mermaid@<version>`` fetches the package without its ~140 dependencies (the site needs
only ``dist/mermaid.min.js``); the tarball's integrity must equal the one
``docsassets/package-lock.json`` pins, or nothing is written. Standard library only: it runs
before any virtual environment exists.

Usage: python scripts/docs_mermaid.py OUTPUT
"""

import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "docsassets" / "package-lock.json"
MEMBER = "package/dist/mermaid.min.js"


def main(output: Path) -> None:
    pinned = json.loads(LOCK.read_text())["packages"]["node_modules/mermaid"]
    with tempfile.TemporaryDirectory() as folder:
        packed = subprocess.run(
            ["npm", "pack", f"mermaid@{pinned['version']}", "--json", "--silent"],
            cwd=folder,
            capture_output=True,
            text=True,
            check=True,
        )
        [tarball] = json.loads(packed.stdout)
        if tarball["integrity"] != pinned["integrity"]:
            sys.exit(
                f"mermaid {pinned['version']}: the registry's tarball has integrity "
                f"{tarball['integrity']}, the lock file pins {pinned['integrity']}"
            )
        with tarfile.open(Path(folder) / tarball["filename"]) as archive:
            content = archive.extractfile(MEMBER).read()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(content)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
