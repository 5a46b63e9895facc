"""Idempotency keys kept with their owner, and the move of the keys an older release kept.

Since schema version 2 a key is kept as ``owner:key`` whatever ``CORRAL_JOB_VISIBILITY`` says
(:meth:`control.access.Access.idempotency_key`). Releases before it kept a key as the client sent it
while clients were not kept apart, and as ``owner:key`` while they were, so a change of the visibility
made keys miss their jobs (a second job for a key sent again) or find another client's: a key
``alice:x`` that bob sent while everyone saw every job was alice's key ``x`` once clients were kept
apart, and her next submit with ``x`` got bob's job.

:func:`moved_keys` gives each old key the form it has now, once, as a store takes a database of an older
schema: the owner is the owner of the key's job (a key whose job is gone goes). A key that already starts
with its job's owner and ``:`` may have been kept either way, so it is kept under both readings; both are
that owner's, so no client can find another's job through either. A principal has no ``:``
(:mod:`control.auth`), so two owners' keys can never meet.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["OLD_KEYS", "moved_keys"]

OLD_KEYS = (
    "SELECT k.key, k.request_hash, k.job_id, k.expires_at, j.owner "
    "FROM idempotency_keys k JOIN jobs j ON j.id = k.job_id"
)
"""Every kept key with the owner of its job (keys whose job is gone are not among them)."""

KeyRow = tuple[str, str, str, float]
"""key, request_hash, job_id, expires_at: a row of ``idempotency_keys``."""


def moved_keys(rows: Iterable[tuple[str, str, str, float, str]]) -> list[KeyRow]:
    """The rows of ``idempotency_keys`` for the rows :data:`OLD_KEYS` read from an older schema's.

    Where two old keys of one owner come to the same key (the owner sent it once while clients were
    kept apart and once while they were not, and got two jobs), the one that expires last is kept."""
    out: dict[str, KeyRow] = {}
    for key, request_hash, job_id, expires_at, owner in rows:
        prefix = f"{owner}:"
        readings = (prefix + key, key) if key.startswith(prefix) else (prefix + key,)
        for new in readings:
            kept = out.get(new)
            if kept is None or expires_at > kept[3]:
                out[new] = (new, request_hash, job_id, expires_at)
    return list(out.values())
