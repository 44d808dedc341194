"""Bandwidth-capped "cluster" of network namespaces on one host, for the fidelity harness.

Layout (needs root, ``ip`` and ``tc`` from iproute2)::

    root namespace:   bridge dprofid-br, 10.77.0.254/24 (reachable from every rank)
                        |-- dprofid-h0  <veth>  dprofid-n0  in netns dpro-fid-0, 10.77.0.1/24
                        |-- dprofid-h1  <veth>  dprofid-n1  in netns dpro-fid-1, 10.77.0.2/24
                        ...

Rank R runs in ``dpro-fid-R`` and talks to the others only through its veth
``dprofid-nR`` (set ``GLOO_SOCKET_IFNAME`` to it). Addresses exist only inside the
namespaces. With a cap, a ``tbf`` qdisc limits both directions of every rank's link: egress
of ``dprofid-nR`` (rank -> bridge) and egress of ``dprofid-hR`` (bridge -> rank). ``netem``
is not available on the VMs this was written on, so no latency/loss emulation.

Use as a context manager, which always tears everything down (exceptions, Ctrl-C, SIGTERM,
SIGHUP: while it is active these raise ``KeyboardInterrupt`` in the main thread)::

    with NetnsCluster(4, rate_mbit=500) as net:
        cmd = net.exec_prefix(rank) + ["env", *net.env_assignments(rank, port)] + argv

CLI::

    python benchmarks/fidelity/netns.py cleanup          # remove leftovers
    python benchmarks/fidelity/netns.py up 2 --rate-mbit 500   # create, wait for Enter, remove
    python benchmarks/fidelity/netns.py status
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Sequence

NS_PREFIX = "dpro-fid-"
LINK_PREFIX = "dprofid-"
BRIDGE = LINK_PREFIX + "br"
SUBNET = "10.77.0"  # /24; rank R gets SUBNET.(R+1)
ETC_NETNS = "/etc/netns"
BRIDGE_ADDR = SUBNET + ".254"  # the root namespace on the bridge (e.g. Horovod's rendezvous server)
MAX_RANKS = 200
TBF_LATENCY_MS = 50  # max time a packet may wait in the tbf queue
TBF_MIN_BURST_BYTES = 128 * 1024  # > one 64 KiB GSO super-packet, or tbf drops it
HZ_GUESS = 250  # burst must cover at least one timer tick of traffic

Logger = Callable[[str], None]


def _quiet(_: str) -> None:
    """Default logger: print nothing."""


def run_cmd(argv: Sequence[str], log: Logger = _quiet, check: bool = True) -> subprocess.CompletedProcess:
    """Run one ``ip``/``tc`` command, logging it; raise with its stderr when ``check`` fails."""
    log("+ " + " ".join(argv))
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr.strip()}")
    return proc


def ns_name(rank: int) -> str:
    """Namespace of rank ``rank``."""
    return f"{NS_PREFIX}{rank}"


def host_veth(rank: int) -> str:
    """Root-namespace (bridge-side) end of rank ``rank``'s veth pair."""
    return f"{LINK_PREFIX}h{rank}"


def ns_veth(rank: int) -> str:
    """Namespace-side end of rank ``rank``'s veth pair (use as GLOO_SOCKET_IFNAME)."""
    return f"{LINK_PREFIX}n{rank}"


def rank_addr(rank: int) -> str:
    """IPv4 address of rank ``rank`` (inside its namespace only)."""
    return f"{SUBNET}.{rank + 1}"


def tbf_args(rate_mbit: float) -> list[str]:
    """``tc`` arguments of a token bucket limiting to ``rate_mbit`` Mbit/s."""
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(TBF_MIN_BURST_BYTES, int(rate_bytes / HZ_GUESS))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", f"{TBF_LATENCY_MS}ms"]


def list_namespaces() -> list[str]:
    """Our namespaces that currently exist (leftovers included)."""
    out = run_cmd(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NS_PREFIX)]


def list_links() -> list[str]:
    """Our root-namespace links (bridge and host-side veths) that currently exist."""
    out = run_cmd(["ip", "-o", "link", "show"], check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n.startswith(LINK_PREFIX)]


def kill_namespace_pids(ns: str, log: Logger = _quiet) -> None:
    """SIGKILL processes still running inside namespace ``ns`` (ours: we created it)."""
    out = run_cmd(["ip", "netns", "pids", ns], log, check=False).stdout
    for pid in (int(p) for p in out.split() if p.isdigit()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cleanup(log: Logger = _quiet) -> int:
    """Remove every namespace and link this module may have created; return how many."""
    removed = 0
    for ns in list_namespaces():
        kill_namespace_pids(ns, log)
        run_cmd(["ip", "netns", "del", ns], log, check=False)
        removed += 1
    # Deleting a namespace destroys its veth end and (asynchronously) the peer; delete any
    # host-side end still there, then the bridge.
    for link in sorted(list_links(), key=lambda n: n == BRIDGE):
        run_cmd(["ip", "link", "del", link], log, check=False)
        removed += 1
    for d in Path(ETC_NETNS).glob(NS_PREFIX + "*"):
        shutil.rmtree(d, ignore_errors=True)
    return removed


TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    """Signal handler: unwind the stack (running ``finally`` blocks) like Ctrl-C does."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def install_teardown_signals() -> dict[int, Any]:
    """Make SIGINT/SIGTERM/SIGHUP raise KeyboardInterrupt; return the previous handlers.

    SIGINT is included because a process started in the background by a non-interactive
    shell inherits SIGINT as *ignored*, and would otherwise never tear down. No-op (empty
    dict) outside the main thread, where handlers cannot be set.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _interrupt) for sig in TEARDOWN_SIGNALS}


def restore_signals(previous: dict[int, Any]) -> None:
    """Undo :func:`install_teardown_signals`."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@dataclass
class NetnsCluster:
    """``n`` namespaces joined by a bridge, optionally capped at ``rate_mbit`` per direction."""

    n: int
    rate_mbit: float | None = None
    log: Logger = _quiet
    _up: bool = field(default=False, init=False)
    _old_handlers: dict[int, Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.n <= MAX_RANKS:
            raise ValueError(f"need 1..{MAX_RANKS} namespaces, got {self.n}")
        if self.rate_mbit is not None and self.rate_mbit <= 0:
            raise ValueError("rate_mbit must be positive")

    def __enter__(self) -> "NetnsCluster":
        self._old_handlers = install_teardown_signals()
        try:
            self.up()
        except BaseException:
            restore_signals(self._old_handlers)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.down()
        finally:
            restore_signals(self._old_handlers)

    def up(self) -> None:
        """Create bridge, namespaces, veths, addresses and qdiscs (removing leftovers first)."""
        if os.geteuid() != 0:
            raise PermissionError("network namespaces need root")
        cleanup(self.log)
        self._up = True
        try:
            run_cmd(["ip", "link", "add", BRIDGE, "type", "bridge"], self.log)
            run_cmd(["ip", "addr", "add", f"{BRIDGE_ADDR}/24", "dev", BRIDGE], self.log)
            run_cmd(["ip", "link", "set", BRIDGE, "up"], self.log)
            for rank in range(self.n):
                self._add_rank(rank)
        except BaseException:
            self.down()
            raise

    def _add_rank(self, rank: int) -> None:
        """Namespace + veth pair + address (+ tbf both ways) for one rank."""
        ns, h, v = ns_name(rank), host_veth(rank), ns_veth(rank)
        run_cmd(["ip", "netns", "add", ns], self.log)
        run_cmd(["ip", "link", "add", h, "type", "veth", "peer", "name", v], self.log)
        run_cmd(["ip", "link", "set", v, "netns", ns], self.log)
        run_cmd(["ip", "link", "set", h, "master", BRIDGE], self.log)
        run_cmd(["ip", "link", "set", h, "up"], self.log)
        run_cmd(["ip", "-n", ns, "addr", "add", f"{rank_addr(rank)}/24", "dev", v], self.log)
        run_cmd(["ip", "-n", ns, "link", "set", v, "up"], self.log)
        run_cmd(["ip", "-n", ns, "link", "set", "lo", "up"], self.log)
        # `ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts: inside the namespace
        # this host's name resolves to the rank's address (libraries that bind to the
        # hostname's address, e.g. Horovod's gloo process sets, then use the veth, not lo)
        etc = Path(ETC_NETNS, ns)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{rank_addr(rank)} {socket.gethostname()}\n")
        if self.rate_mbit is not None:
            tbf = tbf_args(self.rate_mbit)
            run_cmd(["tc", "qdisc", "add", "dev", h, "root", *tbf], self.log)  # bridge -> rank
            run_cmd(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", v, "root", *tbf], self.log)

    def down(self) -> None:
        """Tear everything down; safe to call twice and on a partial setup."""
        if self._up:
            self._up = False
            cleanup(self.log)

    def exec_prefix(self, rank: int) -> list[str]:
        """Command prefix that runs a program inside rank ``rank``'s namespace."""
        return ["ip", "netns", "exec", ns_name(rank)]

    def master_addr(self) -> str:
        """Address of rank 0 (MASTER_ADDR)."""
        return rank_addr(0)

    def rank_env(self, rank: int, master_port: int) -> dict[str, str]:
        """torch.distributed env vars for rank ``rank`` (what torchrun would set)."""
        return {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(self.n),
            "LOCAL_WORLD_SIZE": str(self.n),
            "MASTER_ADDR": self.master_addr(),
            "MASTER_PORT": str(master_port),
            "GLOO_SOCKET_IFNAME": ns_veth(rank),
            "OMP_NUM_THREADS": "1",
        }

    def env_assignments(self, rank: int, master_port: int) -> list[str]:
        """``rank_env`` as ``KEY=VALUE`` arguments for ``env``."""
        return [f"{k}={v}" for k, v in self.rank_env(rank, master_port).items()]

    def describe(self) -> str:
        """One line for logs."""
        cap = f"tbf {self.rate_mbit:g} Mbit/s per direction" if self.rate_mbit else "no cap"
        return f"{self.n} namespaces {NS_PREFIX}0..{self.n - 1} on bridge {BRIDGE}, {cap}"


def _print_status() -> None:
    """Show our namespaces, links and qdiscs."""
    print("namespaces:", " ".join(list_namespaces()) or "-")
    print("links:", " ".join(list_links()) or "-")
    for link in list_links():
        print(run_cmd(["tc", "qdisc", "show", "dev", link], check=False).stdout.strip())


def main(argv: list[str] | None = None) -> int:
    """CLI: ``cleanup``, ``status``, ``up N [--rate-mbit R]``."""
    p = argparse.ArgumentParser(description="dpro fidelity network namespaces")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("cleanup", help="remove leftover dpro-fid-* namespaces and dprofid-* links")
    sub.add_parser("status", help="list what exists")
    up = sub.add_parser("up", help="create N namespaces, wait for Enter, tear down")
    up.add_argument("n", type=int)
    up.add_argument("--rate-mbit", type=float, default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    log: Logger = (lambda s: print(s, file=sys.stderr)) if args.verbose else _quiet
    if args.cmd == "cleanup":
        print(f"removed {cleanup(log)} leftover namespaces/links")
    elif args.cmd == "status":
        _print_status()
    else:
        with NetnsCluster(args.n, args.rate_mbit, log) as net:
            print(net.describe())
            _print_status()
            try:
                input("press Enter to tear down ")
            except (EOFError, KeyboardInterrupt):
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
