"""Passwords of users that a Cachet subprocess checks: that process hashes as Cachet ships, not as the tests."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.hashers import PBKDF2PasswordHasher


def give_shipped_password(user: Any, password: str) -> None:
    """Set ``password`` on ``user`` hashed by Django's default hasher, which this process (MD5 first) would not use."""
    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(password, hasher.salt())
    user.save(update_fields=["password"])
