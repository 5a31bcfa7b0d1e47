"""Two ssh "hosts" on this machine for DeepSpeed's pdsh launcher (scripts/local_ssh.sh: an sshd of our own on a free
127.0.0.1 port, a throwaway key, aliases node-a and node-b); `env` puts its ssh (with that config) first on PATH."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "local_ssh.sh"
TOOLS = ("sshd", "ssh", "ssh-keygen", "pdsh")
HOSTS = ("node-a", "node-b")


def unavailable() -> Optional[str]:
    """Why the local ssh hosts cannot start here (None: they can)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"  # sshd lives in sbin
    missing = [t for t in TOOLS if not shutil.which(t, path=path)]
    if missing:
        return (f"no {', '.join(missing)}: `make test` as root on Debian installs openssh-server openssh-client pdsh "
                f"(apt-get)")
    if os.geteuid() != 0:
        return "runs its own sshd, tried as root only; `make test` as root on Debian sets it up"
    return None


class SshHosts:
    def __init__(self, state_dir: Path):
        self.dir = state_dir
        self.env = {**os.environ, "PATH": f"{state_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}

    def up(self) -> None:
        out = subprocess.run(["bash", str(SCRIPT), "up", str(self.dir)], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            self.down()
            raise RuntimeError(f"local ssh hosts did not start:\n{out.stdout}{out.stderr}")

    def down(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "down", str(self.dir)], capture_output=True, timeout=60)
