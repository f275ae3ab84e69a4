"""The image's HEALTHCHECK (`docker run`, podman): fits the process the container runs.

- The container runs ``shadow-proxy serve``: healthy when ``GET /healthz``
  answers 200 on the address its configuration listens on (``listen.host`` and
  ``listen.port`` of its ``--config`` file, else of ``$SHADOW_PROXY_CONFIG``;
  0.0.0.0 and :: are probed on loopback). ``$SHADOW_PROXY_HEALTH_URL``, when
  set in the container, is probed instead.
- It runs anything else (``shadow-consumer``, the consumer launcher, a shell):
  healthy. Such a container runs exactly as long as its command, and has no
  endpoint to probe.

Exit status 0 healthy, 1 unhealthy (Docker's contract); one line on stdout
says why (``docker inspect`` and ``podman healthcheck run`` show it).
Kubernetes ignores HEALTHCHECK: the pod's probes call /healthz and /readyz.

Usage: ``healthcheck.py [PID]``, PID the proxy's process (default: the first
``shadow-proxy serve`` found in /proc).
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

HEALTH_URL_ENV = "SHADOW_PROXY_HEALTH_URL"
CONFIG_ENV = "SHADOW_PROXY_CONFIG"
TIMEOUT_S = 3.0
PROC = Path("/proc")


def proxy_argv(argv: list[str]) -> list[str] | None:
    """The arguments after ``serve`` when ``argv`` runs ``shadow-proxy serve``, else None."""
    for i, arg in enumerate(argv):
        if Path(arg).name == "shadow-proxy":
            rest = argv[i + 1 :]
            return rest[rest.index("serve") + 1 :] if "serve" in rest else None
    return None


def read_argv(pid: int, proc: Path = PROC) -> list[str]:
    raw = (proc / str(pid) / "cmdline").read_bytes()
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def find_proxy(proc: Path = PROC) -> int | None:
    """The lowest pid running ``shadow-proxy serve`` (its worker processes do not)."""
    pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())
    for pid in pids:
        try:
            if proxy_argv(read_argv(pid, proc)) is not None:
                return pid
        except OSError:  # gone, or not ours
            continue
    return None


def config_path(pid: int) -> Path | None:
    """The proxy's configuration file, as ``cli.load_config`` chose it."""
    args = proxy_argv(read_argv(pid)) or []
    path = None
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            path = args[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
    if path is None:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        found = [e.split(b"=", 1)[1] for e in environ if e.startswith(CONFIG_ENV.encode() + b"=")]
        path = found[0].decode() if found else None
    if path is None:
        return None
    return Path(os.readlink(f"/proc/{pid}/cwd"), path)


def health_url(pid: int) -> str:
    """``/healthz`` on the address the proxy's configuration listens on."""
    from shadow_proxy.config import Config

    path = config_path(pid)
    if path is None:
        msg = f"no --config and no ${CONFIG_ENV} in the command line of pid {pid}"
        raise ValueError(msg)
    listen = Config.from_yaml(str(path)).listen
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(listen.host, listen.host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{listen.port}/healthz"


def check(pid: int | None, proc: Path = PROC) -> tuple[bool, str]:
    """(healthy, why) for the proxy ``pid``, else for what runs in ``proc``."""
    url = os.environ.get(HEALTH_URL_ENV)
    if not url:
        pid = pid if pid is not None else find_proxy(proc)
        if pid is None:
            return True, "no shadow-proxy serve in this container: healthy while it runs"
        try:
            url = health_url(pid)
        except (OSError, ValueError) as exc:
            return False, f"cannot tell where the proxy listens: {exc}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.status == 200, f"{url}: {response.status}"
    except OSError as exc:
        return False, f"{url}: {exc}"


def main(argv: list[str]) -> int:
    healthy, why = check(int(argv[0]) if argv else None)
    print(why)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
