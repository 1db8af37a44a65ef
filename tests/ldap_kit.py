"""OpenLDAP's ``slapd`` from Debian's packages (``./test`` installs it), run for a test on a free loopback port:
a directory ``dc=example,dc=org`` with people under ``ou=people`` and ``groupOfNames`` groups under
``ou=groups``."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ldap
import ldap.modlist

SLAPD = "/usr/sbin/slapd"
BASE = "dc=example,dc=org"
ADMIN = f"cn=admin,{BASE}"
ADMIN_PASSWORD = "admin-secret"
PEOPLE = f"ou=people,{BASE}"
GROUPS = f"ou=groups,{BASE}"
CONFIG = """include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {folder}/slapd.pid
database mdb
maxsize 10485760
suffix "{base}"
rootdn "{admin}"
rootpw {password}
directory {folder}/db
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Directory:
    uri: str
    process: subprocess.Popen[bytes]

    def _bound(self) -> ldap.ldapobject.LDAPObject:
        connection = ldap.initialize(self.uri)
        connection.simple_bind_s(ADMIN, ADMIN_PASSWORD)
        return connection

    def add_person(self, uid: str, password: str, *, mail: str = "", given: str = "", surname: str = "") -> str:
        dn = f"uid={uid},{PEOPLE}"
        entry = {
            "objectClass": [b"inetOrgPerson"],
            "uid": [uid.encode()],
            "cn": [f"{given} {surname}".strip().encode() or uid.encode()],
            "sn": [(surname or uid).encode()],
            "userPassword": [password.encode()],
        }
        if mail:
            entry["mail"] = [mail.encode()]
        if given:
            entry["givenName"] = [given.encode()]
        self._bound().add_s(dn, ldap.modlist.addModlist(entry))
        return dn

    def add_group(self, name: str, *members: str) -> str:
        dn = f"cn={name},{GROUPS}"
        entry = {"objectClass": [b"groupOfNames"], "cn": [name.encode()], "member": [m.encode() for m in members]}
        self._bound().add_s(dn, ldap.modlist.addModlist(entry))
        return dn

    def remove_member(self, group: str, member: str) -> None:
        self._bound().modify_s(f"cn={group},{GROUPS}", [(ldap.MOD_DELETE, "member", [member.encode()])])

    def stop(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


@contextlib.contextmanager
def running_slapd() -> Iterator[Directory]:
    """A fresh directory until the block ends."""
    folder = Path(tempfile.mkdtemp(prefix="cachet-slapd-"))
    (folder / "db").mkdir()
    (folder / "slapd.conf").write_text(
        CONFIG.format(folder=folder, base=BASE, admin=ADMIN, password=ADMIN_PASSWORD), encoding="utf-8"
    )
    port = free_port()
    uri = f"ldap://127.0.0.1:{port}"
    process = subprocess.Popen(
        [SLAPD, "-f", str(folder / "slapd.conf"), "-h", f"{uri}/", "-d", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    directory = Directory(uri, process)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                connection = directory._bound()
                break
            except ldap.SERVER_DOWN:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"slapd did not start: {process.stderr and process.stderr.read()!r}") from None
                time.sleep(0.05)
        for dn, unit in ((BASE, None), (PEOPLE, "people"), (GROUPS, "groups")):
            if unit is None:
                entry = {"objectClass": [b"dcObject", b"organization"], "dc": [b"example"], "o": [b"Example"]}
            else:
                entry = {"objectClass": [b"organizationalUnit"], "ou": [unit.encode()]}
            connection.add_s(dn, ldap.modlist.addModlist(entry))
        yield directory
    finally:
        directory.stop()
        shutil.rmtree(folder, ignore_errors=True)
