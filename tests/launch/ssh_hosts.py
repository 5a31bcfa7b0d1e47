"""Two ssh "hosts" on this machine for DeepSpeed's pdsh launcher (local_ssh.sh beside this file: an sshd of our own on
a free 127.0.0.1 port, a throwaway key, aliases node-a and node-b); `env` puts its ssh (with that config) first on
PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from tests.launch.local_service import LocalService

SCRIPT = Path(__file__).with_name("local_ssh.sh")
TOOLS = ("sshd", "ssh", "ssh-keygen", "pdsh")
HOSTS = ("node-a", "node-b")


def unavailable() -> Optional[str]:
    """Why the local ssh hosts cannot start here (None: they can)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"  # sshd lives in sbin
    missing = [t for t in TOOLS if not shutil.which(t, path=path)]
    if missing:
        return (
            f"no {', '.join(missing)}: `make test` as root on Debian installs openssh-server openssh-client pdsh "
            f"(apt-get)"
        )
    if os.geteuid() != 0:
        return "runs its own sshd, tried as root only; `make test` as root on Debian sets it up"
    return None


class SshHosts(LocalService):
    script = SCRIPT
    what = "local ssh hosts"

    def __init__(self, state_dir: Path):
        super().__init__(state_dir)
        self.env = {**os.environ, "PATH": f"{state_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
