"""People who sign in through the company's directory (OIDC or LDAP): their Cachet account, made at their first
sign-in, and the Cachet groups (and staff status) the directory's groups give them, applied at every sign-in."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone

from sessions_app.models import DirectoryAccount

USERNAME_CHARACTERS = 150
NOT_IN_USERNAMES = re.compile(r"[^\w.@+-]")


@dataclass(frozen=True)
class DirectoryPerson:
    """Who the directory says signed in: ``subject`` is their id there (OIDC ``sub``, LDAP DN), ``username`` the
    name it gives them (``preferred_username``, the login typed), ``groups`` the names of its groups they are in."""

    source: str
    subject: str
    username: str
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupRules:
    """How the directory's groups decide in Cachet: ``mapping`` gives the Cachet group of a directory group;
    members of a ``staff_groups`` group are staff (where it names none, staff status is left as staff set it)."""

    mapping: Mapping[str, str] = field(default_factory=dict)
    staff_groups: frozenset[str] = frozenset()


def group_rules_parse(mapping: str, staff: str) -> GroupRules:
    """The rules as the environment states them: ``DIRECTORY=CACHET`` pairs separated by ``;`` or new lines, and
    staff groups separated by ``;``; a ``ValueError`` says what is wrong."""
    pairs: dict[str, str] = {}
    for item in re.split(r"[;\n]", mapping):
        if not item.strip():
            continue
        directory, equals, cachet = item.rpartition("=")
        if not equals or not directory.strip() or not cachet.strip():
            raise ValueError(f"{item.strip()!r} is not DIRECTORY_GROUP=CACHET_GROUP")
        pairs[directory.strip()] = cachet.strip()
    staff_groups = frozenset(name.strip() for name in staff.split(";") if name.strip())
    return GroupRules(mapping=pairs, staff_groups=staff_groups)


def _free_username(wanted: str) -> str:
    base = NOT_IN_USERNAMES.sub("-", wanted.strip())[: USERNAME_CHARACTERS - 8] or "person"
    name, number = base, 1
    while User.objects.filter(username__iexact=name).exists():
        number += 1
        name = f"{base}-{number}"
    return name


def directory_groups_apply(*, user: User, groups: tuple[str, ...], rules: GroupRules) -> None:
    """Put ``user`` in the Cachet groups their directory ``groups`` map to and out of the mapped ones they no
    longer map to (groups staff gave by hand, mapped from nothing, stay); staff status from ``staff_groups``."""
    targets = set(rules.mapping.values())
    wanted = {rules.mapping[name] for name in groups if name in rules.mapping}
    for name in sorted(wanted):
        group, _ = Group.objects.get_or_create(name=name)
        user.groups.add(group)
    user.groups.remove(*Group.objects.filter(name__in=targets - wanted))
    if rules.staff_groups:
        staff = bool(rules.staff_groups.intersection(groups))
        if user.is_staff != staff:
            user.is_staff = staff
            user.save(update_fields=["is_staff"])


@transaction.atomic
def directory_sign_in(*, person: DirectoryPerson, rules: GroupRules) -> User:
    """The Cachet account of ``person``: made at their first sign-in (named as the directory names them, with a
    number where that name is taken: an account made by hand is never taken over), their name, email and mapped
    groups brought up to date at every sign-in."""
    account = (
        DirectoryAccount.objects.select_for_update(no_key=True)
        .select_related("user")
        .filter(source=person.source, subject=person.subject)
        .first()
    )
    if account is None:
        user = User.objects.create_user(
            username=_free_username(person.username),
            email=person.email,
            first_name=person.first_name[:150],
            last_name=person.last_name[:150],
        )
        account = DirectoryAccount.objects.create(user=user, source=person.source, subject=person.subject)
    else:
        user = account.user
        fresh = {"email": person.email, "first_name": person.first_name[:150], "last_name": person.last_name[:150]}
        changed = [name for name, value in fresh.items() if value and getattr(user, name) != value]
        for name in changed:
            setattr(user, name, fresh[name])
        if changed:
            user.save(update_fields=changed)
    directory_groups_apply(user=user, groups=person.groups, rules=rules)
    account.directory_groups = sorted(person.groups)
    account.signed_in_at = timezone.now()
    account.save(update_fields=["directory_groups", "signed_in_at"])
    return user
