from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from chat.tools import ToolContext, acl, call_tool
from sessions_app.hygiene.outcomes import ErrorOutcome

NOBODY = 65534
OTHER_UID = 4242
UNDEFINED = acl.UNDEFINED_ID


def entries_of(path: Path, name: str = acl.ACCESS) -> list[acl.Entry] | None:
    """What ``getfacl`` would show of ``path``, as the kernel keeps it."""
    return acl.read(str(path), name)


def effective(path: Path, uid: int, wanted: int) -> bool:
    return acl.may(str(path), uid, NOBODY, wanted)


def tree(tmp_path: Path) -> Path:
    top = tmp_path / "top"
    (top / "src" / "deep").mkdir(parents=True)
    (top / "README.md").write_text("read me\n")
    (top / "src" / "deep" / "code.py").write_text("print(1)\n")
    (top / "tool.sh").write_text("#!/bin/sh\n")
    for folder in (top, top / "src", top / "src" / "deep"):
        folder.chmod(0o755)
    for file in (top / "README.md", top / "src" / "deep" / "code.py"):
        file.chmod(0o644)
    (top / "tool.sh").chmod(0o755)
    return top


def grant(folder: Path, uid: int = OTHER_UID) -> int:
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return acl.grant(fd, uid)
    finally:
        os.close(fd)


def test_the_binary_form_is_the_kernels(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_text("x")
    file.chmod(0o640)
    assert entries_of(file) is None
    entries = [(acl.OTHER, 0, UNDEFINED), (acl.USER, 6, OTHER_UID), (acl.USER_OBJ, 6, UNDEFINED)]
    entries += [(acl.MASK, 6, UNDEFINED), (acl.GROUP_OBJ, 4, UNDEFINED)]
    acl.write(str(file), entries)
    data = os.getxattr(file, acl.ACCESS)
    assert data[:4] == b"\x02\x00\x00\x00"
    assert data[4:12] == b"\x01\x00\x06\x00\xff\xff\xff\xff"
    assert data[12:20] == b"\x02\x00\x06\x00" + OTHER_UID.to_bytes(4, "little")
    assert acl.decode(data) == sorted(entries, key=lambda entry: (entry[0], entry[2]))
    assert stat.S_IMODE(file.stat().st_mode) == 0o660, "the kernel shows the mask as the group's bits"


def test_a_tree_is_granted_rwx_and_rw_and_new_files_inherit(tmp_path: Path) -> None:
    top = tree(tmp_path)
    owners = {path: (path.stat().st_uid, path.stat().st_gid) for path in [top, *top.rglob("*")]}
    assert not effective(top, OTHER_UID, acl.WRITE)
    assert grant(top) == 6
    for folder in (top, top / "src", top / "src" / "deep"):
        assert (acl.USER, 7, OTHER_UID) in (entries_of(folder) or [])
        assert entries_of(folder, acl.DEFAULT) == [
            (acl.USER_OBJ, 7, UNDEFINED),
            (acl.USER, 7, OTHER_UID),
            (acl.GROUP_OBJ, 5, UNDEFINED),
            (acl.MASK, 7, UNDEFINED),
            (acl.OTHER, 5, UNDEFINED),
        ]
        assert effective(folder, OTHER_UID, acl.WRITE | acl.EXECUTE)
    assert entries_of(top / "README.md") == [
        (acl.USER_OBJ, 6, UNDEFINED),
        (acl.USER, 6, OTHER_UID),
        (acl.GROUP_OBJ, 4, UNDEFINED),
        (acl.MASK, 6, UNDEFINED),
        (acl.OTHER, 4, UNDEFINED),
    ]
    assert (acl.USER, 7, OTHER_UID) in (entries_of(top / "tool.sh") or []), "x where the owner has x"
    assert effective(top / "src" / "deep" / "code.py", OTHER_UID, acl.READ | acl.WRITE)
    assert not effective(top / "src" / "deep" / "code.py", NOBODY, acl.WRITE), "no one else gains anything"
    assert owners == {path: (path.stat().st_uid, path.stat().st_gid) for path in [top, *top.rglob("*")]}
    assert grant(top) == 0, "done once"
    made = os.open(top / "src" / "new.txt", os.O_WRONLY | os.O_CREAT, 0o666)
    os.close(made)
    assert effective(top / "src" / "new.txt", OTHER_UID, acl.WRITE), "inherited from the default ACL"


def test_someone_elses_entries_are_kept(tmp_path: Path) -> None:
    top = tree(tmp_path)
    theirs = [(acl.USER_OBJ, 6, UNDEFINED), (acl.USER, 4, NOBODY), (acl.GROUP_OBJ, 4, UNDEFINED)]
    theirs += [(acl.GROUP, 6, 777), (acl.MASK, 6, UNDEFINED), (acl.OTHER, 0, UNDEFINED)]
    acl.write(str(top / "README.md"), theirs)
    their_default = [(acl.USER_OBJ, 7, UNDEFINED), (acl.USER, 5, NOBODY), (acl.GROUP_OBJ, 5, UNDEFINED)]
    their_default += [(acl.MASK, 5, UNDEFINED), (acl.OTHER, 0, UNDEFINED)]
    acl.write(str(top / "src"), their_default, acl.DEFAULT)
    grant(top)
    assert entries_of(top / "README.md") == [
        (acl.USER_OBJ, 6, UNDEFINED),
        (acl.USER, 6, OTHER_UID),
        (acl.USER, 4, NOBODY),
        (acl.GROUP_OBJ, 4, UNDEFINED),
        (acl.GROUP, 6, 777),
        (acl.MASK, 6, UNDEFINED),
        (acl.OTHER, 0, UNDEFINED),
    ]
    assert entries_of(top / "src", acl.DEFAULT) == [
        (acl.USER_OBJ, 7, UNDEFINED),
        (acl.USER, 7, OTHER_UID),
        (acl.USER, 5, NOBODY),
        (acl.GROUP_OBJ, 5, UNDEFINED),
        (acl.MASK, 7, UNDEFINED),
        (acl.OTHER, 0, UNDEFINED),
    ]


def test_links_are_never_followed(tmp_path: Path) -> None:
    top = tree(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s\n")
    (top / "to_file").symlink_to(outside / "secret")
    (top / "to_folder").symlink_to(outside)
    (top / "src" / "up").symlink_to("../..")
    os.link(outside / "secret", top / "hard")
    grant(top)
    for path in (outside, outside / "secret", tmp_path):
        assert entries_of(path) is None and entries_of(path, acl.DEFAULT) is None
    assert (acl.USER, 6, OTHER_UID) in (entries_of(top / "README.md") or [])


def test_may_write_follows_the_kernels_rules(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    folder.chmod(0o775)
    fd = os.open(folder, os.O_PATH)
    try:
        mine = os.getuid()
        assert acl.may_write_folder(fd, mine, NOBODY)
        assert acl.may_write_folder(fd, OTHER_UID, folder.stat().st_gid), "by the group's bits"
        assert not acl.may_write_folder(fd, OTHER_UID, 4343)
        folder.chmod(0o577)
        assert not acl.may_write_folder(fd, mine, 4343), "the owner's bits, never the others'"
        folder.chmod(0o755)
        acl.write(str(folder), [*acl.from_mode(0o755), (acl.USER, 7, OTHER_UID), (acl.MASK, 5, UNDEFINED)])
        assert not acl.may_write_folder(fd, OTHER_UID, 4343), "the mask limits a named entry"
        acl.write(str(folder), [*acl.from_mode(0o755), (acl.USER, 7, OTHER_UID), (acl.MASK, 7, UNDEFINED)])
        assert acl.may_write_folder(fd, OTHER_UID, 4343)
        assert not acl.may_write_folder(fd, 4343, 4343)
    finally:
        os.close(fd)


def test_without_acls_the_error_is_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    top = tree(tmp_path)

    def unsupported(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "setxattr", unsupported)
    monkeypatch.setattr(os, "getxattr", unsupported)
    with pytest.raises(acl.NoAcls):
        grant(top)


def test_what_the_file_tools_write_keeps_its_acl(tmp_path: Path, make_ctx: Callable[..., ToolContext]) -> None:
    top = tree(tmp_path)
    grant(top)
    theirs = [*(entries_of(top / "README.md") or []), (acl.USER, 4, NOBODY)]
    acl.write(str(top / "README.md"), theirs)
    ctx = make_ctx(root=top)
    edited = call_tool("edit", '{"path": "README.md", "old_string": "read", "new_string": "READ"}', ctx)[1]
    assert not isinstance(edited, ErrorOutcome), edited
    assert (top / "README.md").read_text() == "READ me\n"
    assert entries_of(top / "README.md") == sorted(theirs, key=lambda entry: (entry[0], entry[2]))
    written = call_tool("write", '{"path": "src/new.txt", "content": "new\\n"}', ctx)[1]
    assert not isinstance(written, ErrorOutcome), written
    assert entries_of(top / "src" / "new.txt") == [
        (acl.USER_OBJ, 6, UNDEFINED),
        (acl.USER, 7, OTHER_UID),
        (acl.GROUP_OBJ, 5, UNDEFINED),
        (acl.MASK, 6, UNDEFINED),
        (acl.OTHER, 4, UNDEFINED),
    ]
    assert effective(top / "src" / "new.txt", OTHER_UID, acl.READ | acl.WRITE)
    assert stat.S_IMODE((top / "src" / "new.txt").stat().st_mode) == 0o664
    nested = call_tool("write", '{"path": "made/here/new.txt", "content": "n\\n"}', ctx)[1]
    assert not isinstance(nested, ErrorOutcome), nested
    assert effective(top / "made" / "here", OTHER_UID, acl.WRITE | acl.EXECUTE)
    assert effective(top / "made" / "here" / "new.txt", OTHER_UID, acl.WRITE)


def test_without_acls_the_file_tools_write_as_before(tmp_path: Path, make_ctx: Callable[..., ToolContext]) -> None:
    top = tree(tmp_path)
    ctx = make_ctx(root=top)
    call_tool("edit", '{"path": "README.md", "old_string": "read", "new_string": "READ"}', ctx)
    call_tool("write", '{"path": "src/new.txt", "content": "new\\n"}', ctx)
    call_tool("edit", '{"path": "tool.sh", "old_string": "sh", "new_string": "bash"}', ctx)
    umask = os.umask(0)
    os.umask(umask)
    for path, mode in (("README.md", 0o644), ("src/new.txt", 0o666 & ~umask), ("tool.sh", 0o755)):
        assert entries_of(top / path) is None
        assert stat.S_IMODE((top / path).stat().st_mode) == mode
