"""The names and addresses by which others on the network reach this machine, for ``serve --host 0.0.0.0``: Django
answers 400 to a request addressed to a name that ``ALLOWED_HOSTS`` does not hold, so a server bound to every
address serves the machine's own names and addresses unless ``ALLOWED_HOSTS`` says otherwise."""

from __future__ import annotations

import ipaddress
import socket

WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", ""})  # what serving every address is written as
_ROUTE_PROBES = ((socket.AF_INET, ("192.0.2.1", 9)), (socket.AF_INET6, ("2001:db8::1", 9)))  # documentation ranges


def machine_names() -> list[str]:
    """This machine's host name (and its fully qualified one) and its addresses other than loopback (an IPv6 one
    in brackets, as a ``Host`` header writes it): the addresses its names resolve to, and the one it reaches the
    network from (a datagram socket connected, which sends nothing)."""
    names = {socket.gethostname(), socket.getfqdn()}
    addresses: set[str] = set()
    for name in sorted(names):
        try:
            addresses |= {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
        except OSError:
            continue
    for family, probe in _ROUTE_PROBES:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as route:
                route.connect(probe)
                addresses.add(str(route.getsockname()[0]))
        except OSError:
            continue
    reached = [name for name in names if name and name != "localhost"]
    for address in addresses:
        parsed = ipaddress.ip_address(address.split("%")[0])
        if parsed.is_loopback or parsed.is_unspecified or parsed.is_link_local:
            continue
        reached.append(f"[{parsed}]" if parsed.version == 6 else str(parsed))
    return sorted(set(reached), key=lambda name: (not name[0].isdigit(), name))
