"""A real NAT between a player and a server, for the sessions' tests: three Linux network
namespaces joined by veth pairs, the router's outside address masquerading the player's
private network (Debian's nftables, the kernel's netfilter NAT), as a home router does.

    server  10.77.0.1 --- 10.77.0.2 router 192.168.77.1 --- 192.168.77.2  player

The server's namespace has no route to 192.168.77.0/24: the player's own address is
unreachable from it, and what reaches it from the player comes from the router's
address, on a port the NAT chose. Each namespace has its loopback up. `run(where, cmd)`
is `cmd` run inside one of them. Needs root, `ip` (iproute2) and `nft` (nftables):
testkit.preconditions.Missing otherwise (a test skips, or fails in CI)."""

from __future__ import annotations

import os
import shutil
import subprocess

from testkit.preconditions import require

SERVER, ROUTER_OUT, ROUTER_IN, PLAYER = "10.77.0.1", "10.77.0.2", "192.168.77.1", "192.168.77.2"


class Nat:
    def __init__(self) -> None:
        self.tag = f"hp{os.getpid()}"  # namespaces' names: this tag and a letter
        self.server, self.router, self.player = (f"{self.tag}{x}" for x in "srp")

    def start(self) -> Nat:
        ip, nft = shutil.which("ip"), shutil.which("nft")
        require(ip and nft, "ip or nft is missing (`just setup` installs iproute2 and nftables)")
        require(os.geteuid() == 0, "a NAT of network namespaces needs root")
        try:
            for ns in self._namespaces():
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            self._join()
        except BaseException:
            self.stop()
            raise
        return self

    def _namespaces(self) -> tuple[str, ...]:
        return (self.server, self.router, self.player)

    def _join(self) -> None:
        _link(self.server, "s0", SERVER, self.router, "r0", ROUTER_OUT)
        _link(self.player, "p0", PLAYER, self.router, "r1", ROUTER_IN)
        _ip("-n", self.player, "route", "add", "default", "via", ROUTER_IN)
        self._forwarding(self.router)
        self.run(self.router, ["nft", _masquerade("r0")])

    def _forwarding(self, ns: str) -> None:
        # (/proc/sys/net is the namespace's own; no sysctl binary needed)
        self.run(ns, ["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])

    def command(self, where: str, cmd: list[str]) -> list[str]:
        """`cmd` as run inside namespace `where`."""
        return ["ip", "netns", "exec", where, *cmd]

    def run(self, where: str, cmd: list[str]) -> None:
        _run(self.command(where, cmd))

    def stop(self) -> None:
        for ns in self._namespaces():  # their links go with them
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def __enter__(self) -> Nat:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# Both ends behind NATs: each behind a router of its own, the two routers' outside
# addresses joined by an "internet" namespace that routes between them and holds the
# STUN server.
#
#   server 10.77.0.1 -- 10.77.0.2 router 198.51.100.2 -- 198.51.100.1 net
#   player 192.168.77.2 -- 192.168.77.1 router 203.0.113.2 -- 203.0.113.1 net
#
# Neither private network has a route from outside. The server's router forwards one
# TCP port to the server (its HTTP API, as a load balancer would); nothing forwards UDP,
# so media passes only where each side's own packets opened its NAT's mapping.
NET_TO_SERVER, SERVER_OUTSIDE = "198.51.100.1", "198.51.100.2"
NET_TO_PLAYER, PLAYER_OUTSIDE = "203.0.113.1", "203.0.113.2"


class TwoNats(Nat):
    """The server behind a NAT too (above); `net` is the namespace between the two, where
    a STUN server goes, `port` the TCP port forwarded to the server."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port, self.server_router, self.net = port, f"{self.tag}q", f"{self.tag}n"

    def _namespaces(self) -> tuple[str, ...]:
        return (self.server, self.server_router, self.net, self.router, self.player)

    def _join(self) -> None:
        _link(self.server, "s0", SERVER, self.server_router, "r0", ROUTER_OUT)
        _link(self.server_router, "o0", SERVER_OUTSIDE, self.net, "n0", NET_TO_SERVER)
        _link(self.player, "p0", PLAYER, self.router, "r1", ROUTER_IN)
        _link(self.router, "o1", PLAYER_OUTSIDE, self.net, "n1", NET_TO_PLAYER)
        for ns, via in (
            (self.server, ROUTER_OUT),
            (self.server_router, NET_TO_SERVER),
            (self.player, ROUTER_IN),
            (self.router, NET_TO_PLAYER),
        ):
            _ip("-n", ns, "route", "add", "default", "via", via)
        for ns in (self.server_router, self.router, self.net):
            self._forwarding(ns)
        self.run(self.router, ["nft", _masquerade("o1")])
        forward = (
            "add chain ip nat pre { type nat hook prerouting priority -100 ; } ; "
            f'add rule ip nat pre iifname "o0" tcp dport {self.port} dnat to {SERVER}'
        )
        self.run(self.server_router, ["nft", f"{_masquerade('o0')}; {forward}"])


def _masquerade(out: str) -> str:
    """nft's rules for a home router: what leaves by `out` takes that link's address, and
    what comes in by it unasked, for the router itself, is dropped. The drop matters for
    two NATs: a peer's first check can reach the other's router before that side's own
    check has left, and the kernel would keep a connection for it that claims the port
    the other side's mapping is about to use; dropped before the kernel confirms it, it
    leaves no connection, the next check's mapping keeps its port, and the hole punches."""
    return (
        "add table ip nat; "
        "add chain ip nat post { type nat hook postrouting priority 100 ; } ; "
        f'add rule ip nat post oifname "{out}" masquerade; '
        "add table ip guard; "
        "add chain ip guard in { type filter hook input priority 0 ; } ; "
        f'add rule ip guard in iifname "{out}" ct state new drop'
    )


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _link(ns_a: str, a: str, addr_a: str, ns_b: str, b: str, addr_b: str) -> None:
    """A veth pair, end `a` in `ns_a` at addr_a/24 and end `b` in `ns_b` at addr_b/24."""
    _ip("link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b)
    for ns, end, addr in ((ns_a, a, addr_a), (ns_b, b, addr_b)):
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", end)
        _ip("-n", ns, "link", "set", end, "up")
