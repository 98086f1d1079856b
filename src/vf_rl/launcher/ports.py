"""Is the server's port free? The check ``vf-rl`` (and its pre-flight) makes before starting a
server, and who holds the port when it is not. Imports neither torch nor vLLM."""

from __future__ import annotations

from vf_rl.config.schema import ConfigError


def check_port_free(host: str, port: int) -> None:
    """Raise ConfigError if ``host:port`` is taken (another run, another server), naming the
    process that listens there when it can be found. Bound as the server will bind it
    (``SO_REUSEADDR``, as uvicorn does), so a port still in TIME_WAIT after the last run is free."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("localhost",) else "127.0.0.1", port))
        except OSError:
            owner = port_owner(port)
            raise ConfigError(f"port {port} on {host} is already in use{f' by {owner}' if owner else ''} (another "
                              "vf-rl run or server?); set trainer.args.vllm_server_port to a free port") from None


def port_owner(port: int) -> str:
    """``"pid N (command line)"`` of the process listening on ``port``, or ``""`` when it cannot be
    seen (another user's process without the rights to look)."""
    import psutil

    try:
        connections = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return ""
    for c in connections:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            try:
                command = " ".join(psutil.Process(c.pid).cmdline())[:80]
            except psutil.Error:
                command = ""
            return f"pid {c.pid}" + (f" ({command})" if command else "")
    return ""
